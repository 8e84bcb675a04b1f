"""Registers and RegisterActions as a Tofino stateful ALU runs them, with its limits.

A Tofino register is read and written by its stage's stateful ALU, and only through a
RegisterAction: one per execution, at most once per packet pass (the register lives in
one stage, which a packet crosses once), with at most two comparisons, producing the
cell's new value and one output, each of a fixed width. A P4 compiler refuses programs
that break these rules; this model refuses them at run time (:class:`TofinoLimitError`),
so a Python transcription of the program that would not fit the hardware fails its
tests instead of passing them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "MAX_CONDITIONS",
    "PassState",
    "Register",
    "RegisterAction",
    "Salu",
    "SaluOut",
    "TofinoLimitError",
]

MAX_CONDITIONS = 2
"""Comparisons a Tofino 1 stateful ALU evaluates per execution (its two condition ALUs)."""


class TofinoLimitError(RuntimeError):
    """The program asked the model for something Tofino cannot do: a register executed
    twice in one pass, a RegisterAction with more comparisons or results than a stateful
    ALU has, a value wider than its register, a second resubmit."""


class SaluOut(NamedTuple):
    """What one RegisterAction execution computes: the cell's new value and the output
    (a stateful ALU writes one and returns one; nothing else leaves it)."""

    value: int
    output: int


class Salu:
    """One execution of a RegisterAction: counts the comparisons it makes.

    A RegisterAction tests through :meth:`cond`, so an action whose conditions the
    hardware could not evaluate in one pass raises instead of computing.
    """

    def __init__(self) -> None:
        self.conditions = 0

    def cond(self, test: bool) -> bool:
        """Return ``test``, counted as one of the ALU's comparisons.

        Raises:
            TofinoLimitError: more than :data:`MAX_CONDITIONS` in one execution.
        """
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise TofinoLimitError(f"a stateful ALU evaluates at most {MAX_CONDITIONS} comparisons")
        return test


RegisterActionFn = Callable[[Salu, int, Any], SaluOut]
"""A RegisterAction's body: (the ALU, the stored value, the packet's PHV) -> what it
computes. The PHV is the model's (``phv.Phv``); typed loosely to keep this module
free of the packet's layout."""


@dataclass(frozen=True)
class RegisterAction:
    """A named RegisterAction of one register: its body and its output's width."""

    name: str
    body: RegisterActionFn
    out_width: int


@dataclass
class PassState:
    """What one packet pass (ingress pass 1, pass 2, an egress replica) has executed."""

    name: str
    executed: set[str] = field(default_factory=set)

    def claim(self, register: str) -> None:
        """Record that ``register`` runs in this pass.

        Raises:
            TofinoLimitError: it ran already in this pass.
        """
        if register in self.executed:
            raise TofinoLimitError(f"{register} executed twice in {self.name}")
        self.executed.add(register)


class Register:
    """A register array of ``size`` cells of ``width`` bits (all 0 at load, as
    ``Register<...>(size, 0)``) and the RegisterActions declared on it.

    Args:
        name: the P4 @name, e.g. ``Ingress.seq``.
        width: the cell width in bits (32 or 8 here).
        size: the number of cells.
        actions: the RegisterActions that may run on it.

    Raises:
        ValueError: two actions of one name, or a width that is not 8, 16 or 32.
    """

    def __init__(self, name: str, width: int, size: int, actions: list[RegisterAction]) -> None:
        if width not in (8, 16, 32):
            raise ValueError(f"{name}: a register cell is 8, 16 or 32 bits, not {width}")
        if len({a.name for a in actions}) != len(actions):
            raise ValueError(f"{name}: two RegisterActions of one name")
        self.name = name
        self.width = width
        self.cells = [0] * size
        self.actions = {a.name: a for a in actions}

    def execute(self, action: str, index: int, phv: Any, state: PassState) -> int:
        """Run RegisterAction ``action`` on cell ``index`` for ``phv``; return its output.

        Raises:
            TofinoLimitError: the register ran already in this pass, or the action
                computed something a stateful ALU cannot (not a :class:`SaluOut`, more
                comparisons than it has, a value or output wider than its width).
            KeyError: no such action on this register, or the index is outside it.
        """
        if not 0 <= index < len(self.cells):
            raise KeyError(f"{self.name}[{index}] outside 0..{len(self.cells) - 1}")
        declared = self.actions[action]
        state.claim(self.name)
        out = declared.body(Salu(), self.cells[index], phv)
        if not isinstance(out, SaluOut):
            raise TofinoLimitError(
                f"{self.name}.{action}: a stateful ALU computes a new value and one output"
            )
        _fits(f"{self.name}.{action}: new value", out.value, self.width)
        _fits(f"{self.name}.{action}: output", out.output, declared.out_width)
        self.cells[index] = out.value
        return out.output


def _fits(what: str, value: int, width: int) -> None:
    if not 0 <= value < 1 << width:
        raise TofinoLimitError(f"{what} {value:#x} does not fit {width} bits")
