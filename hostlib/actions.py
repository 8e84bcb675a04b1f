"""What one collective call runs: an algorithm, its packet width and its window.

Layer: hostlib (dynamiccl's action space is built on it; hostlib imports no dynamiccl).
An :class:`Action` is mapped onto the wire in one place, :class:`hostlib.communicator.
Communicator`; the choice of actions (the space, the defaults, the agent) is
``dynamiccl.actions``'. The meaning of each field:

- ``algorithm``: ``ina`` (every rank to the switch), ``collnet`` (CollNet: ranks of a
  host reduce locally, heads through the switch), ``ring``, ``tree``;
- ``lanes``: int32 elements per packet. INA and CollNet packets are as wide as the switch
  aggregates (a compile-time constant of the P4 program, as in SwitchML), so for them
  ``lanes`` is the switch's; ring and tree take any width up to ``MAX_LANES``;
- ``window``: packets in flight: INA's slots in use (at most the job's slots on the
  switch), ring's and tree's unacknowledged packets per peer.

Not every algorithm runs every collective (:func:`algorithms_for`): ``reduce_scatter``
runs on the ring, or as an INA allreduce of which each rank keeps its part;
``all_gather`` has nothing to sum and runs on the ring only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hostlib.protocol import MAX_LANES

__all__ = [
    "ACTION_ALGORITHMS",
    "ALL_COLLECTIVES",
    "FALLBACK_ACTION_ALGORITHM",
    "SWITCH_ACTION_ALGORITHMS",
    "Action",
    "ActionError",
    "algorithms_for",
    "parse_action",
]

ACTION_ALGORITHMS = ("ina", "collnet", "ring", "tree")
"""Every algorithm an action may name."""

SWITCH_ACTION_ALGORITHMS = ("ina", "collnet")
"""The algorithms that need a reachable switch and free slots."""

FALLBACK_ACTION_ALGORITHM = "ring"
"""What runs when nothing else can: no switch state, no size limit, every collective."""

ALL_COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
"""The collectives hostlib runs (NCCL's names, lower case)."""

_SUPPORT = {
    "allreduce": ACTION_ALGORITHMS,
    "reduce_scatter": ("ina", "ring"),
    "all_gather": ("ring",),
}


class ActionError(ValueError):
    """An action that is malformed or cannot run a collective."""


@dataclass(frozen=True, order=True)
class Action:
    """One configuration of one collective call.

    Attributes:
        algorithm: one of :data:`ACTION_ALGORITHMS`.
        lanes: int32 elements per packet (1..MAX_LANES).
        window: packets in flight (>= 1).

    Raises:
        ActionError: a field out of range.
    """

    algorithm: str
    lanes: int
    window: int

    def __post_init__(self) -> None:
        if self.algorithm not in ACTION_ALGORITHMS:
            raise ActionError(
                f"unknown algorithm {self.algorithm!r} (known: {', '.join(ACTION_ALGORITHMS)})"
            )
        for name, value, hi in (("lanes", self.lanes, MAX_LANES), ("window", self.window, 1 << 20)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ActionError(f"{name} must be an integer in 1..{hi}, got {value!r}")

    @property
    def label(self) -> str:
        """``ring/l2048/w32``: how tables, logs and JSON name it (:func:`parse_action`)."""
        return f"{self.algorithm}/l{self.lanes}/w{self.window}"

    @property
    def packet_bytes(self) -> int:
        return 4 * self.lanes

    @property
    def needs_switch(self) -> bool:
        return self.algorithm in SWITCH_ACTION_ALGORITHMS

    def to_dict(self) -> dict[str, object]:
        return {"algorithm": self.algorithm, "lanes": self.lanes, "window": self.window}

    def __str__(self) -> str:
        return self.label


_LABEL = re.compile(r"^(?P<algo>[a-z]+)/l(?P<lanes>\d+)/w(?P<window>\d+)$")


def parse_action(text: str) -> Action:
    """The inverse of :attr:`Action.label`.

    Raises:
        ActionError: not ``ALGORITHM/lLANES/wWINDOW`` or a field out of range.
    """
    m = _LABEL.match(text.strip())
    if m is None:
        raise ActionError(
            f"invalid action {text!r}: expected ALGORITHM/lLANES/wWINDOW, e.g. ring/l2048/w32"
        )
    return Action(m["algo"], int(m["lanes"]), int(m["window"]))


def algorithms_for(collective: str) -> tuple[str, ...]:
    """The algorithms that run ``collective``.

    Raises:
        ActionError: unknown collective.
    """
    try:
        return _SUPPORT[collective]
    except KeyError:
        raise ActionError(
            f"unknown collective {collective!r} (known: {', '.join(ALL_COLLECTIVES)})"
        ) from None
