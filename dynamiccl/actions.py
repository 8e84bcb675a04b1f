"""The action space of one collective call: algorithm, packet size and window.

DynamICCL tunes, per NCCL call, the algorithm, the protocol, the channels and the chunk
size. hostlib's analogues, and what an :class:`Action` fixes:

- ``algorithm``: ``ina`` (every rank to the switch), ``collnet`` (CollNet: ranks of a
  host reduce locally, heads through the switch), ``ring``, ``tree``;
- ``lanes``: int32 elements per packet, the analogue of NCCL's protocol (small packets
  for latency, large for bandwidth). INA and CollNet packets are as wide as the switch
  aggregates (a compile-time constant of the P4 program, as in SwitchML), so for them
  ``lanes`` is the switch's; ring and tree take any width up to ``MAX_LANES``;
- ``window``: packets in flight, the analogue of channels: INA's slots in use (at most
  the job's slots on the switch), ring's and tree's unacknowledged packets per peer.

The pipelining chunk of hostlib's ring and tree is the packet: a chunk moves on as soon
as it arrives, so ``lanes`` is also the ring's and tree's chunk (NCCL's chunk trades a
step's fixed cost against pipelining depth; hostlib's step has no cost beyond a packet's).

Not every algorithm runs every collective: ``reduce_scatter`` runs on the ring, or as an
INA allreduce of which each rank keeps its part (the same bytes through the switch as an
allreduce: worth it when the ring's ``n - 1`` steps cost more); ``all_gather`` has
nothing to sum and runs on the ring only.

The action itself (:class:`~hostlib.actions.Action`, :func:`algorithms_for`,
:func:`parse_action`) lives in ``hostlib.actions``, where the communicator maps it onto
the wire; it is re-exported here. This module adds the choice: the action space and its
default choices. Nothing here imports numpy, torch or any inalab package but hostlib's
actions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hostlib.actions import (
    ACTION_ALGORITHMS,
    ALL_COLLECTIVES,
    FALLBACK_ACTION_ALGORITHM,
    SWITCH_ACTION_ALGORITHMS,
    Action,
    ActionError,
    algorithms_for,
    parse_action,
)

__all__ = [
    "ACTION_ALGORITHMS",
    "ALL_COLLECTIVES",
    "DEFAULT_LANE_CHOICES",
    "DEFAULT_WINDOW_CHOICES",
    "FALLBACK_ACTION_ALGORITHM",
    "SWITCH_ACTION_ALGORITHMS",
    "Action",
    "ActionError",
    "action_space",
    "algorithms_for",
    "fallback_action",
    "parse_action",
]

DEFAULT_LANE_CHOICES = (256, 2048)
"""Ring and tree packet widths tried by default: 1 KiB (a standard-MTU frame's worth of
gradient) and 8 KiB (one jumbo frame, the bench's default)."""

DEFAULT_WINDOW_CHOICES = (8, 32)
"""Windows tried by default: 8 packets (a 100 Mbit/s link's few-ms queue, the emulate
bench's INA default) and 32 (a loopback or 1 Gbit/s bandwidth-delay product)."""


def action_space(
    collective: str,
    *,
    switch_lanes: int,
    slots: int,
    algorithms: Iterable[str] = ACTION_ALGORITHMS,
    lane_choices: Sequence[int] = DEFAULT_LANE_CHOICES,
    window_choices: Sequence[int] = DEFAULT_WINDOW_CHOICES,
) -> tuple[Action, ...]:
    """Every action that can run ``collective``, in a fixed order.

    Args:
        collective: one of :data:`ALL_COLLECTIVES`.
        switch_lanes: the switch's lanes per packet (INA's and CollNet's only width).
        slots: the job's slots on the switch: INA windows above it are left out (a
            window of all the slots is always in).
        algorithms: the algorithms the set-up offers (e.g. no ``collnet`` with one rank
            per host); others are left out.
        lane_choices: ring and tree packet widths.
        window_choices: windows.

    Raises:
        ActionError: unknown collective or algorithm, no choices, a value out of range.
    """
    offered = tuple(algorithms)
    for algo in offered:
        if algo not in ACTION_ALGORITHMS:
            raise ActionError(f"unknown algorithm {algo!r} (known: {', '.join(ACTION_ALGORITHMS)})")
    if not lane_choices or not window_choices:
        raise ActionError("lane_choices and window_choices must not be empty")
    if slots < 1:
        raise ActionError(f"slots must be positive, got {slots}")
    actions: list[Action] = []
    for algo in algorithms_for(collective):
        if algo not in offered:
            continue
        if algo in SWITCH_ACTION_ALGORITHMS:
            windows = sorted({min(w, slots) for w in window_choices})
            actions += [Action(algo, switch_lanes, w) for w in windows]
        else:
            actions += [Action(algo, ln, w) for ln in lane_choices for w in window_choices]
    return tuple(actions)


def fallback_action(lanes: int, window: int) -> Action:
    """The ring with the given width and window: what runs when INA cannot."""
    return Action(FALLBACK_ACTION_ALGORITHM, lanes, window)
