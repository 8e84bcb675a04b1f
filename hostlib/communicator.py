"""One communicator per rank: every transport a rank holds, and any action on them.

Layer: hostlib, above the sessions (``hostlib.session``, ``hostlib.peers``,
``hostlib.collnet``) and below whatever chooses the actions (the bench, the replay, the
``"ina"`` torch backend, dynamiccl). Like Gloo's ``gloo::Context`` or NCCL's
``ncclComm_t``, a :class:`Communicator` owns the rank's INA session, its point-to-point
sessions (ring, and tree on the ring's socket or its own) and its CollNet host group,
and runs ``allreduce``, ``reduce_scatter`` and ``all_gather`` for any
:class:`~hostlib.actions.Action` (algorithm, lanes, window): the one place where an
action becomes hostlib calls.

Every rank of a job must make the same sequence of calls with the same actions (the
sessions' slot sets and message plans follow it).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from hostlib.actions import ActionError, algorithms_for
from hostlib.collnet import CollNetAllreduce
from hostlib.peers import PeerCollective, RingAllreduce
from hostlib.session import (
    InaSession,
    StripedInaSession,
    as_numpy,
    close_all,
    part_bounds,
    reduce_flat,
)
from hostlib.tree import TreeCall

__all__ = ["ActionLike", "Communicator"]


class ActionLike(Protocol):
    """What a communicator reads of an action (``hostlib.actions.Action`` has it)."""

    @property
    def algorithm(self) -> str: ...

    @property
    def lanes(self) -> int: ...

    @property
    def window(self) -> int: ...


class Communicator:
    """One rank's collectives.

    Args:
        rank: this rank among the ``world_size`` ranks of the job (the numbering of
            reduce-scatter parts; under hierarchical aggregation a leaf numbers its INA
            workers itself, and the communicator cuts this rank's part of the sum).
        world_size: ranks in the job.
        ina: the rank's INA session (``None``: no switch).
        ring: the rank's ring session; it also runs tree calls when ``tree`` is ``None``.
        tree: a tree session on a socket of its own (``None``: on the ring's).
        collnet: the rank's CollNet host group member (``None``: one rank per host).

    Raises:
        ValueError: a rank outside ``0..world_size-1``.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        ina: InaSession | StripedInaSession | None = None,
        ring: RingAllreduce | None = None,
        tree: PeerCollective | None = None,
        collnet: CollNetAllreduce | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        self.rank, self.world_size = rank, world_size
        self.ina, self.ring, self.tree, self.collnet = ina, ring, tree, collnet

    # ------------------------------------------------------------------ collectives
    def run(self, collective: str, x: Any, action: ActionLike) -> Any:
        """``allreduce``, ``reduce_scatter`` or ``all_gather`` of ``x`` with ``action``.

        Raises:
            ActionError: an algorithm that does not run the collective, or whose
                session this rank does not have.
            The errors of the collective's method.
        """
        algorithms_for(collective)  # an unknown collective: ActionError naming the known
        method = {
            "allreduce": self.allreduce,
            "reduce_scatter": self.reduce_scatter,
            "all_gather": self.all_gather,
        }[collective]
        return method(x, action)

    def allreduce(self, x: Any, action: ActionLike, inplace: bool = False, out: Any = None) -> Any:
        """The sum of ``x`` over all ranks (``x``'s type, dtype and shape), by
        ``action``'s algorithm with its lanes and window; ``inplace`` writes it into x,
        ``out`` into that array or tensor (x's dtype and size: a buffer kept across calls
        spares a new array per call).

        Raises:
            ActionError: no session for the action's algorithm.
            The errors of that session's ``allreduce``.
        """
        algo, lanes, window = action.algorithm, action.lanes, action.window
        self._check("allreduce", algo)
        if algo == "ina":
            return self._need(self.ina, algo).allreduce(x, inplace, window=window, out=out)
        if algo == "collnet":
            group = self._need(self.collnet, algo)
            return reduce_flat(
                x, inplace, lambda flat, _: group.allreduce_pieces(flat, window=window), out=out
            )
        if algo == "tree" and self.tree is not None:
            return self.tree.allreduce(x, inplace, lanes=lanes, window=window, out=out)
        ring = self._need(self.ring, "ring" if algo == "ring" else "ring or tree")
        if algo == "tree":
            return ring.run(TreeCall, x, inplace, lanes=lanes, window=window, out=out)
        return ring.allreduce(x, inplace, lanes=lanes, window=window, out=out)

    def reduce_scatter(self, x: Any, action: ActionLike) -> Any:
        """This rank's part of the sum of ``x`` (1-D, ``x``'s type and dtype): rank ``r``
        of ``n`` gets ``sum[r * size // n : (r + 1) * size // n]``.

        Raises:
            ActionError: an algorithm other than ``ina`` and ``ring``, or no session.
        """
        algo = action.algorithm
        self._check("reduce_scatter", algo)
        if algo == "ring":
            ring = self._need(self.ring, algo)
            return ring.reduce_scatter(x, lanes=action.lanes, window=action.window)
        session = self._need(self.ina, algo)
        if session.spec.rank == self.rank and session.spec.num_workers == self.world_size:
            return session.reduce_scatter(x, window=action.window)
        # The switch numbers this rank otherwise (a leaf's workers): the same packets, this
        # rank's part cut here.
        array, wrap = as_numpy(x)
        total = session.allreduce(np.ascontiguousarray(array).reshape(-1), window=action.window)
        lo, hi = part_bounds(total.size, self.world_size, self.rank)
        return wrap(total[lo:hi].copy())

    def all_gather(self, x: Any, action: ActionLike) -> Any:
        """Every rank's ``x`` concatenated in rank order (on the ring).

        Raises:
            ActionError: an algorithm other than ``ring``, or no ring session.
        """
        self._check("all_gather", action.algorithm)
        ring = self._need(self.ring, action.algorithm)
        return ring.all_gather(x, lanes=action.lanes, window=action.window)

    def _check(self, collective: str, algorithm: str) -> None:
        if algorithm not in algorithms_for(collective):
            raise ActionError(
                f"{algorithm} does not run {collective} "
                f"(what does: {', '.join(algorithms_for(collective))})"
            )

    def _need(self, session: Any, algorithm: str) -> Any:
        if session is None:
            raise ActionError(f"this rank has no {algorithm} session (have: {self.has()})")
        return session

    def has(self) -> str:
        """The algorithms this rank can run, comma-separated."""
        have = [
            name
            for name, s in (("ina", self.ina), ("collnet", self.collnet), ("ring", self.ring))
            if s is not None
        ]
        if self.ring is not None or self.tree is not None:
            have.append("tree")
        return ", ".join(have) or "none"

    # ------------------------------------------------------------------ counters
    def _sessions(self) -> list[Any]:
        return [s for s in (self.ina, self.ring, self.tree) if s is not None]

    @property
    def retransmissions(self) -> int:
        """Packets this rank sent again, over every session."""
        return sum(s.retransmissions for s in self._sessions())

    @property
    def fast_retransmissions(self) -> int:
        """Of :attr:`retransmissions`, those sent because later packets were answered."""
        return sum(s.fast_retransmissions for s in self._sessions())

    @property
    def late_answers(self) -> int:
        """Packets that reached this rank a second time (INA: results of answered
        packets; ring and tree: DATA it had): summed over ranks, the retransmissions whose
        first copy was late, not lost, and duplicates made on the way."""
        return sum(s.late_answers for s in self._sessions())

    @property
    def late_timers(self) -> int:
        """Timers served late, when this rank had not been running (the machine
        stalled), and re-armed instead of fired (``RetryPolicy.late_timer``)."""
        return sum(s.late_timers for s in self._sessions())

    @property
    def late_samples(self) -> int:
        """Round trips the INA sessions' estimators took from late answers (timeouts
        proved spurious; the point-to-point sessions keep no such count)."""
        return sum(getattr(s, "late_samples", 0) for s in self._sessions())

    @property
    def host_drops(self) -> int:
        """Datagrams the kernel dropped for this rank's sockets (receive buffer full)."""
        total = 0
        for s in self._sessions():
            for transport in getattr(s, "transports", None) or [s.transport]:
                drops = getattr(transport, "drops", None)
                total += (drops() or 0) if drops is not None else 0
        return total

    def close(self) -> None:
        """Close every session (the p2p ones answer their peers a moment first); the first
        error is raised after all were closed. The CollNet group is its owner's."""
        close_all(s for s in (self.tree, self.ring, self.ina) if s is not None)
