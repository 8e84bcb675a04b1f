"""The TNA program's sources as data for its Python model: constants and const tables.

The model does not re-type what p4/tna/ holds: the constants (``const bit<N> NAME = V;``
in p4/configuration.p4 and p4/tna/configuration.p4), the key order of each const table
(its ``key = { ... @name("k"); }`` block) and the const entries gen_tna.py writes
(checks_entries.p4, next_step_entries.p4, masks_entries.p4) are read from the files, so
a change to the program changes the model or makes it refuse to load.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "P4_DIR",
    "TNA_DIR",
    "ConstTable",
    "Entry",
    "ProgramError",
    "Ternary",
    "load_constants",
    "load_table",
]

P4_DIR = Path(__file__).resolve().parents[2] / "p4"
"""The repository's p4/ directory (a source checkout or editable install, as
controller.p4info's default P4Info)."""
TNA_DIR = P4_DIR / "tna"

_CONST_RE = re.compile(r"^\s*const\s+bit<\d+>\s+(\w+)\s*=\s*([^;]+);", re.MULTILINE)
_ENTRY_RE = re.compile(
    r"^\s*\((?P<keys>[^()]*)\)\s*:\s*(?P<action>\w+)\s*(?:\((?P<args>.*)\))?\s*;"
)
# A key is a field, isValid() or a slice (``hdr.ina.flags[0:0]``), then its match kind.
_KEY_RE = re.compile(
    r"^\s*[\w.()]+(?:\[\d+:\d+\])?\s*:\s*(?:ternary|exact)\s*@name\(\"(\w+)\"\)\s*;"
)
_DEFAULT_RE = re.compile(r"const\s+default_action\s*=\s*(?P<action>\w+)\s*\((?P<args>.*)\)\s*;")
_CAST_RE = re.compile(r"\(bit<\d+>\)")


class ProgramError(ValueError):
    """The P4 sources do not hold what the model reads from them (a constant, a table's
    key block, an entry it cannot parse)."""


@dataclass(frozen=True)
class Ternary:
    """One ternary (or exact: mask all ones) key cell: matches ``x`` when
    ``x & mask == value``; a wildcard has mask 0."""

    value: int
    mask: int

    def matches(self, x: int) -> bool:
        return x & self.mask == self.value


@dataclass(frozen=True)
class Entry:
    """A const entry: its key cells in the table's key order, its action and arguments."""

    keys: tuple[Ternary, ...]
    action: str
    args: tuple[int, ...]


@dataclass(frozen=True)
class ConstTable:
    """A table with const entries, highest priority first (P4-16: their order)."""

    key_names: tuple[str, ...]
    entries: tuple[Entry, ...]
    default: Entry

    def lookup(self, keys: dict[str, int]) -> Entry | None:
        """The first entry whose every cell matches ``keys`` (by key name), or None.

        Raises:
            ProgramError: ``keys`` lacks one of the table's keys.
        """
        missing = set(self.key_names) - set(keys)
        if missing:
            raise ProgramError(f"no value for key(s) {sorted(missing)}")
        values = [keys[k] for k in self.key_names]
        for entry in self.entries:
            if all(c.matches(v) for c, v in zip(entry.keys, values, strict=True)):
                return entry
        return None

    def apply(self, keys: dict[str, int]) -> Entry:
        """The matching entry, or the const default action (an entry without keys)."""
        return self.lookup(keys) or self.default


def load_constants(*files: Path, given: dict[str, int] | None = None) -> dict[str, int]:
    """Every ``const bit<N> NAME = VALUE;`` of ``files``, later files seeing earlier names.

    Values may be numbers or expressions of numbers and earlier constants (``+ - *``).
    ``given`` fixes constants to other values, and what is computed from them follows
    (the model of the program generated for another ``TNA_LANES_PER_PACKET``).

    Raises:
        ProgramError: a value the model cannot evaluate.
    """
    given = given or {}
    constants: dict[str, int] = {}
    for path in files:
        for name, text in _CONST_RE.findall(path.read_text()):
            constants[name] = given[name] if name in given else _evaluate(text, constants, path)
    return constants


def _evaluate(text: str, constants: dict[str, int], where: Path) -> int:
    tokens = re.findall(r"0x[0-9A-Fa-f]+|\d+|\w+|[-+*()]", _CAST_RE.sub("", text))
    expr = []
    for tok in tokens:
        if tok[0].isdigit():
            expr.append(str(int(tok, 0)))
        elif tok.isidentifier():
            if tok not in constants:
                raise ProgramError(f"{where.name}: {text.strip()!r} names unknown {tok}")
            expr.append(str(constants[tok]))
        else:
            expr.append(tok)
    try:
        return _arithmetic(ast.parse(" ".join(expr), mode="eval").body)
    except (SyntaxError, ProgramError):
        raise ProgramError(f"{where.name}: cannot evaluate {text.strip()!r}") from None


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arithmetic(node: ast.expr) -> int:
    """Integer + - * of numbers: all a P4 constant here needs (no eval)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right)))
    raise ProgramError(f"not integer arithmetic: {ast.dump(node)}")


def load_table(control: Path, table: str, entries: Path, constants: dict[str, int]) -> ConstTable:
    """The const table ``table`` of the control file ``control`` with its entries from the
    generated file ``entries`` (cells ``_``, ``true``/``false``, ``V &&& M``, a number or
    a constant; arguments numbers or constants, casts ignored).

    Raises:
        ProgramError: the key block or an entry cannot be read.
    """
    text = control.read_text()
    key_names = _key_names(text, table, control)
    rows = []
    for line in entries.read_text().splitlines():
        match = _ENTRY_RE.match(line)
        if match is None:
            continue
        cells = [c.strip() for c in match["keys"].split(",")]
        if len(cells) != len(key_names):
            raise ProgramError(f"{entries.name}: {len(cells)} cells, {table} has {len(key_names)}")
        args = match["args"] or ""
        rows.append(
            Entry(
                tuple(_cell(c, constants, entries) for c in cells),
                match["action"],
                tuple(_value(a, constants, entries) for a in args.split(",") if a.strip()),
            )
        )
    if not rows:
        raise ProgramError(f"{entries.name}: no entries")
    return ConstTable(key_names, tuple(rows), _default(text, table, control, constants))


def _key_names(text: str, table: str, where: Path) -> tuple[str, ...]:
    block = re.search(r"\btable\s+" + table + r"\s*\{\s*key\s*=\s*\{(?P<keys>[^}]*)\}", text)
    if block is None:
        raise ProgramError(f"{where.name}: no key block of table {table}")
    names = [m[1] for line in block["keys"].splitlines() if (m := _KEY_RE.match(line))]
    if not names:
        raise ProgramError(f"{where.name}: table {table} has no keys the model can read")
    return tuple(names)


def _default(text: str, table: str, where: Path, constants: dict[str, int]) -> Entry:
    start = re.search(r"\btable\s+" + table + r"\s*\{", text)
    found = None if start is None else _DEFAULT_RE.search(text, start.end())
    if found is None:
        raise ProgramError(f"{where.name}: table {table} has no const default_action")
    args = found["args"] or ""
    values = tuple(_value(a, constants, where) for a in args.split(",") if a.strip())
    return Entry((), found["action"], values)


def _cell(text: str, constants: dict[str, int], where: Path) -> Ternary:
    if text == "_":
        return Ternary(0, 0)
    if text in ("true", "false"):
        return Ternary(int(text == "true"), 1)
    if "&&&" in text:
        value, mask = (_value(t, constants, where) for t in text.split("&&&"))
        return Ternary(value, mask)
    return Ternary(_value(text, constants, where), -1)


def _value(text: str, constants: dict[str, int], where: Path) -> int:
    text = _CAST_RE.sub("", text).strip()
    if text in constants:
        return constants[text]
    try:
        return int(text, 0)
    except ValueError:
        raise ProgramError(f"{where.name}: cannot read {text!r}") from None
