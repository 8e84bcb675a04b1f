"""The online agent learning inside a training job, with every rank choosing alike.

Layer: dynamiccl, used by the ``"ina"`` torch backend (``dynamiccl.torch_backend``) as its
chooser when ``INALAB_CHOOSER=agent``; it knows nothing of torch (the backend gives it a
function that agrees on numbers across ranks).

The problem: every rank must run the same action for every call (a rank on the switch
and another on the ring would wait for each other forever), but each rank measures its
own time for a call, and an agent fed different times learns different things.

The agreement: a **deterministic agent fed agreed times**. Every rank holds an
:class:`~dynamiccl.agent.Agent` built the same way (same profile, action space, seed and
saved state) and asks it for every call in the same order, so as long as the agents
record the same times they are the same state and decide the same. A rank does not
record its own times: it keeps them, and every ``sync_every`` calls the ranks agree on
them, the maximum over ranks of each call's time (a collective ends for the job when its
slowest rank has it), and every rank records those agreed times, in call order. The
decisions between two agreements depend only on what was recorded before the first, so
they are the same on every rank whatever each rank measured.

Cost per call: the agent's decision (tens of microseconds of Python) and a clock read;
every ``sync_every`` calls, one small Gloo allreduce of ``sync_every`` doubles (a few
hundred microseconds on loopback), i.e. a few tens of microseconds per call at the
default of 16. The price is a delay: a time is learnt up to ``sync_every`` calls after
it was measured.

``INALAB_CHOOSER=agent`` learns from scratch, or continues from ``INALAB_AGENT_STATE``;
``INALAB_AGENT_FROZEN=1`` uses a saved state frozen instead (no learning, no agreement:
every rank decides by the same saved means); ``INALAB_AGENT_SAVE`` names where rank 0
saves the state when the group shuts down.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynamiccl.actions import ALL_COLLECTIVES, Action, action_space
from dynamiccl.agent import Agent
from dynamiccl.model import Profile

__all__ = ["DEFAULT_SYNC_EVERY", "LEARNED_ALGORITHMS", "AgreedLearner", "Pending"]

log = logging.getLogger(__name__)

DEFAULT_SYNC_EVERY = 16
"""Calls between agreements: one small allreduce per 16 calls costs a few percent of a
4-byte call's time and delays learning by at most 16 calls (a training step of a
layered model makes tens of calls)."""

LEARNED_ALGORITHMS = ("ina", "ring", "tree")
"""What the backend runs on hostlib (CollNet needs a host-local group it has not)."""

Agree = Callable[[Sequence[float]], Sequence[float]]
"""``agree(times)``: the elementwise maximum of ``times`` over every rank (a collective:
every rank calls it at the same point with as many values)."""


@dataclass(frozen=True)
class Pending:
    """One call run and timed here, not yet agreed on."""

    collective: str
    size_bytes: int
    action: Action
    seconds: float


class AgreedLearner:
    """A chooser (``dynamiccl.torch_backend.Chooser``) whose agent learns from the times
    the ranks agree on (see the module docstring).

    Args:
        profile: the cost model's constants (the agent's prior).
        workers: the group's ranks.
        state: a saved agent to continue from (``None``: learn from scratch).
        sync_every: calls between agreements (>= 1).
        save_to: where :meth:`save` writes the state at shutdown (``None``: nowhere).
        seed: the agent's seed (every rank must use the same).

    Raises:
        ValueError: ``sync_every`` below 1.
    """

    def __init__(
        self,
        profile: Profile,
        workers: int,
        *,
        state: str | Path | None = None,
        sync_every: int = DEFAULT_SYNC_EVERY,
        save_to: str | Path | None = None,
        seed: int = 0,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.profile, self.workers, self.seed = profile, workers, seed
        self.state_path = None if state is None else Path(state)
        self.sync_every = sync_every
        self.save_to = None if save_to is None else Path(save_to)
        self.agent: Agent | None = None
        self.pending: list[Pending] = []
        self.agreements = 0
        """Agreements made so far."""
        self.recorded = 0
        """Calls the agent learnt from (agreed times)."""

    # ------------------------------------------------------------------ set-up
    def bind(self, switch_lanes: int, slots: int) -> None:
        """Build the agent for the job's switch (its lanes per packet and the job's
        slots bound the action space), from the saved state if one was given.

        Raises:
            dynamiccl.agent.AgentError: a saved state that cannot be read, or saved for
                another worker count.
        """
        if self.state_path is not None:
            agent = Agent.load(self.state_path, self.profile, workers=self.workers)
            agent.learn = True  # a state saved frozen learns again here
            self.agent = agent
            return
        offered = LEARNED_ALGORITHMS
        actions = {
            c: action_space(c, switch_lanes=switch_lanes, slots=slots, algorithms=offered)
            for c in ALL_COLLECTIVES
        }
        self.agent = Agent(self.profile, self.workers, None, actions, seed=self.seed)

    def _bound(self) -> Agent:
        if self.agent is None:
            raise RuntimeError("AgreedLearner.bind() was not called (the backend does it)")
        return self.agent

    # ------------------------------------------------------------------ choosing
    def choose_call(self, collective: str, size_bytes: int) -> Action:
        """The agent's action for this call (the same on every rank)."""
        return self._bound().decide(collective, size_bytes).action

    def choose(self, size_bytes: int) -> Action:
        return self.choose_call("allreduce", size_bytes)

    # ------------------------------------------------------------------ learning
    def observe(self, collective: str, size_bytes: int, action: Action, seconds: float) -> None:
        """This rank's time for a call it ran as the agent chose (kept until the next
        agreement). A call that ran otherwise (a fallback) is not observed."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
        self.pending.append(Pending(collective, size_bytes, action, seconds))

    @property
    def due(self) -> bool:
        """Whether an agreement is due (every rank reaches it at the same call)."""
        return len(self.pending) >= self.sync_every

    def agree(self, agree: Agree) -> None:
        """Agree on the pending times (their maximum over ranks) and learn from them, in
        call order; the same on every rank.

        Raises:
            ValueError: ``agree`` returned another number of times.
        """
        if not self.pending:
            return
        agreed = list(agree([p.seconds for p in self.pending]))
        if len(agreed) != len(self.pending):
            raise ValueError(f"agreed on {len(agreed)} times for {len(self.pending)} calls")
        agent = self._bound()
        for p, seconds in zip(self.pending, agreed, strict=True):
            agent.record(p.collective, p.size_bytes, p.action, seconds)
        self.recorded += len(self.pending)
        self.agreements += 1
        self.pending.clear()

    def save(self) -> Path | None:
        """Write the agent's state to ``save_to`` (what it learnt from agreed times; the
        pending ones are not in it). Returns the path, or ``None`` when not asked.

        Raises:
            OSError: the file cannot be written.
        """
        if self.save_to is None or self.agent is None:
            return None
        self.agent.save(self.save_to)
        log.info("agent state saved to %s (%d calls learnt)", self.save_to, self.recorded)
        return self.save_to
