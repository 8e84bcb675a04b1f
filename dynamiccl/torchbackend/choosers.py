"""The ``"ina"`` torch backend's choosers (layer: dynamiccl; served by
:mod:`dynamiccl.torch_backend`).

Owns what runs each call: the :class:`Chooser` protocol and the built-in choosers
(:class:`AlwaysIna`, :class:`StaticChooser`), the asking of a chooser
(:func:`choose_for`), the mapping of its answer onto an action on hostlib or Gloo
(:func:`resolve_action`), and the DDP hook's questions (:func:`ina_action`,
:func:`uses_ina`). The chooser an environment names is
:func:`dynamiccl.torchbackend.options.chooser_from_env`'s, beside the variables it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, cast

import torch

from dynamiccl.actions import (
    FALLBACK_ACTION_ALGORITHM,
    Action,
    ActionError,
    algorithms_for,
)
from dynamiccl.torchbackend.tensors import _carried, _nbytes
from hostlib.ina import JobSpec

__all__ = [
    "AlwaysIna",
    "Chooser",
    "StaticChooser",
    "Warn",
    "choose_for",
    "ina_action",
    "resolve_action",
    "uses_ina",
]


class Chooser(Protocol):
    """Picks what runs one call from its size; the same on every rank.

    A chooser may also have ``choose_call(collective: str, size_bytes: int) -> str |
    Action``, then used instead of :meth:`choose` (``collective``: ``"allreduce"``,
    ``"reduce_scatter"`` or ``"all_gather"``; ``size_bytes``: the whole vector's, i.e. a
    reduce-scatter's input and an all-gather's output). See :func:`resolve_action` for
    what each answer runs.
    """

    def choose(self, size_bytes: int) -> str | Action:
        """``"ina"`` to aggregate in the switch; any other name (``"gloo"``, ``"ring"``)
        sends the call to the host-based fallback; an :class:`Action` runs as it says."""
        ...


class AlwaysIna:
    """The default chooser: every supported allreduce goes through the switch."""

    def choose(self, size_bytes: int) -> str:
        return "ina"


@dataclass(frozen=True)
class StaticChooser:
    """A static configuration: one action per collective for every call (as ``inalab
    replay``'s ``static`` strategies); a collective it does not name runs as
    :class:`AlwaysIna` would run it."""

    actions: Mapping[str, Action]

    def choose_call(self, collective: str, size_bytes: int) -> str | Action:
        return self.actions.get(collective, "ina")

    def choose(self, size_bytes: int) -> str | Action:
        return self.choose_call("allreduce", size_bytes)


def choose_for(chooser: Chooser, collective: str, size_bytes: int) -> str | Action:
    """The chooser's answer for one call: ``choose_call(collective, size_bytes)`` when it
    has that method, else ``choose(size_bytes)``."""
    choose_call = getattr(chooser, "choose_call", None)
    if choose_call is not None:
        return cast(str | Action, choose_call(collective, size_bytes))
    return chooser.choose(size_bytes)


Warn = Callable[[str, str], None]
"""``warn(key, message)``: an action could not run as chosen (``key`` names the kind)."""


def resolve_action(
    choice: str | Action,
    collective: str,
    *,
    switch_lanes: int,
    slots: int,
    lanes: int,
    window: int,
    warn: Warn | None = None,
    collnet: bool = False,
) -> Action | None:
    """What runs a call of ``collective`` that the chooser answered ``choice`` for.

    Args:
        choice: a name (``"ina"``: through the switch; another name: Gloo for an
            allreduce, hostlib's ring for the others) or an :class:`Action`.
        collective: ``"allreduce"``, ``"reduce_scatter"`` or ``"all_gather"``.
        switch_lanes: the switch's lanes per packet (INA's only width).
        slots: the job's slots on the switch (an INA window is clamped to them); 0: no
            switch to use.
        lanes: the ring's packet width for a name.
        window: the ring's window for a name.
        warn: told when an action cannot run as chosen: CollNet without a host-local
            group, INA without slots, an algorithm that does not run ``collective``;
            the ring runs it then, with the action's lanes and window.
        collnet: whether the group has CollNet's host-local groups (then a CollNet
            action runs with the switch's lanes and a window within its slots).

    Returns:
        The action to run on hostlib, or ``None``: Gloo.

    Raises:
        ActionError: an unknown collective, or a choice that is neither a name nor an
            :class:`Action`.
    """
    supported = algorithms_for(collective)
    if isinstance(choice, str):
        return _resolve_name(choice, collective, switch_lanes, slots, lanes, window, warn)
    if not isinstance(choice, Action):
        raise ActionError(f"a chooser returned {choice!r}, not an algorithm name or Action")
    fallback = Action(FALLBACK_ACTION_ALGORITHM, choice.lanes, choice.window)
    why = ""
    if choice.algorithm not in supported:
        why = f"{choice.algorithm} does not run {collective}"
    elif choice.algorithm == "collnet" and not collnet:
        why = "no machine has several ranks (or INALAB_COLLNET=0): no host-local group"
    elif choice.algorithm in ("ina", "collnet") and slots < 1:
        why = f"no switch slots for {choice.algorithm}"
    if why:
        if warn is not None:
            warn(f"{choice.algorithm}/{collective}", f"{why}: {fallback} runs {choice} instead")
        return fallback
    if choice.algorithm in ("ina", "collnet"):
        return Action(choice.algorithm, switch_lanes, min(choice.window, slots))
    return choice


def _resolve_name(
    name: str,
    collective: str,
    switch_lanes: int,
    slots: int,
    lanes: int,
    window: int,
    warn: Warn | None,
) -> Action | None:
    """:func:`resolve_action` of a chooser's name."""
    ring = Action(FALLBACK_ACTION_ALGORITHM, lanes, window)
    if name != "ina":
        return None if collective == "allreduce" else ring
    if "ina" not in algorithms_for(collective):  # a chooser that does not know it
        return ring
    if slots < 1:
        if warn is not None:
            warn(f"ina/{collective}", f"no switch slots for ina: {ring} runs it instead")
        return ring
    return Action("ina", switch_lanes, slots)


def ina_action(tensor: torch.Tensor, chooser: Chooser, spec: JobSpec) -> Action | None:
    """The INA action (the switch's lanes, a window within the job's slots) of a SUM
    allreduce of ``tensor`` if it goes through the switch, else ``None``."""
    if not _carried(tensor) or tensor.numel() == 0:
        return None
    choice = choose_for(chooser, "allreduce", _nbytes(tensor))
    action = resolve_action(
        choice,
        "allreduce",
        switch_lanes=spec.lanes,
        slots=spec.slots,
        lanes=spec.lanes,
        window=spec.slots,
    )
    return action if action is not None and action.algorithm == "ina" else None


def uses_ina(tensor: torch.Tensor, chooser: Chooser) -> bool:
    """Whether a SUM allreduce of ``tensor`` goes through the switch: a non-empty int32
    or float32 tensor on the CPU or a CUDA device, and the chooser says ``"ina"`` (or an
    INA :class:`Action`)."""
    if not _carried(tensor) or tensor.numel() == 0:
        return False
    choice = choose_for(chooser, "allreduce", _nbytes(tensor))
    return choice == "ina" or (isinstance(choice, Action) and choice.algorithm == "ina")
