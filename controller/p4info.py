"""Controller layer: the P4Info of a pipeline, indexed by name and by id.

This module owns the translation between the names a person writes (``Ingress.jobs.jobs``,
``num_workers``) and what P4Runtime carries (numeric ids, canonical bytestrings of a
field's bitwidth). It knows nothing of gRPC; ``controller.client`` does the transport.

The default P4Info is the repository's ``p4/ina.p4info.txtpb``, resolved relative to this
package (``<repo>/p4/`` beside ``<repo>/controller/``). It is deliberately not copied into
the package: the file under ``p4/`` stays the one source of truth, which means the default
path works from a source checkout or an editable install only; from anywhere else pass
a path or a message explicitly.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from google.protobuf import text_format
from google.protobuf.message import DecodeError
from p4.config.v1 import p4info_pb2

__all__ = [
    "DEFAULT_P4INFO_PATH",
    "TNA_P4INFO_PATH",
    "Action",
    "ActionRef",
    "Counter",
    "EncodingError",
    "MatchField",
    "P4Info",
    "P4InfoError",
    "Param",
    "Register",
    "Table",
    "Value",
    "decode_value",
    "encode_value",
    "mac_text",
]

DEFAULT_P4INFO_PATH = Path(__file__).resolve().parents[1] / "p4" / "ina.p4info.txtpb"
"""``p4/ina.p4info.txtpb`` of the checkout this package was imported from."""

TNA_P4INFO_PATH = DEFAULT_P4INFO_PATH.parent / "tna" / "ina_tna.p4info.txtpb"
"""``p4/tna/ina_tna.p4info.txtpb``: the Tofino program's P4Info (p4c-barefoot's, standard
registers and counters), beside the default."""

Value = int | str | bytes
"""What a match field, action parameter or register cell accepts: an unsigned integer, an
IPv4/IPv6 address or MAC address as text, or a big-endian bytestring."""

_MAC = re.compile(r"^[0-9A-Fa-f]{2}([:-])(?:[0-9A-Fa-f]{2}\1){4}[0-9A-Fa-f]{2}$")


class P4InfoError(ValueError):
    """A name or id the P4Info does not hold, or a P4Info that cannot be loaded."""


class EncodingError(ValueError):
    """A value that does not fit the bitwidth of its field, or is not a value at all."""


@dataclass(frozen=True)
class MatchField:
    """One key field of a table."""

    id: int
    name: str
    bitwidth: int
    match_type: str
    """``EXACT``, ``LPM``, ``TERNARY``, ``RANGE`` or ``OPTIONAL``."""


@dataclass(frozen=True)
class Param:
    """One parameter of an action."""

    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True)
class ActionRef:
    """An action a table may use, and where: ``TABLE_AND_DEFAULT``, ``TABLE_ONLY`` or
    ``DEFAULT_ONLY``."""

    id: int
    scope: str


K = TypeVar("K", MatchField, Param)


class _Fields(Generic[K]):
    """Match fields of a table or params of an action, by name and by id."""

    def __init__(self, owner: str, kind: str, fields: Iterable[K]) -> None:
        self._owner, self._kind = owner, kind
        self.all: tuple[K, ...] = tuple(fields)
        self._by_name: dict[str, K] = {f.name: f for f in self.all}
        self._by_id: dict[int, K] = {f.id: f for f in self.all}

    def get(self, key: str | int) -> K:
        found = self._by_id.get(key) if isinstance(key, int) else self._by_name.get(key)
        if found is None:
            known = ", ".join(self._by_name) or "none"
            raise P4InfoError(f"{self._owner} has no {self._kind} {key!r} (it has: {known})")
        return found


@dataclass(frozen=True)
class Table:
    """A table: its key and the actions its entries may name."""

    id: int
    name: str
    alias: str
    size: int
    match_fields: tuple[MatchField, ...]
    action_refs: tuple[ActionRef, ...]
    const_default_action_id: int

    def match_field(self, key: str | int) -> MatchField:
        """The match field named or numbered ``key``.

        Raises:
            P4InfoError: the table has no such field.
        """
        return _Fields(self.name, "match field", self.match_fields).get(key)

    def action_scope(self, action_id: int) -> str | None:
        """Where this table may use action ``action_id``, or None if it may not at all."""
        return next((r.scope for r in self.action_refs if r.id == action_id), None)


@dataclass(frozen=True)
class Action:
    """An action and its parameters."""

    id: int
    name: str
    alias: str
    params: tuple[Param, ...]

    def param(self, key: str | int) -> Param:
        """The parameter named or numbered ``key``.

        Raises:
            P4InfoError: the action has no such parameter.
        """
        return _Fields(self.name, "parameter", self.params).get(key)


@dataclass(frozen=True)
class Counter:
    """An indexed counter array."""

    id: int
    name: str
    alias: str
    size: int
    unit: str
    """``BYTES``, ``PACKETS`` or ``BOTH``."""


@dataclass(frozen=True)
class Register:
    """A register array of bitstrings."""

    id: int
    name: str
    alias: str
    size: int
    bitwidth: int


T = TypeVar("T", Table, Action, Counter, Register)


class _Index(Generic[T]):
    """Objects of one kind by id, by full name and by alias."""

    def __init__(self, kind: str, objects: Iterable[T]) -> None:
        self.kind = kind
        self.by_id: dict[int, T] = {}
        self.by_name: dict[str, T] = {}
        for obj in objects:
            self._add(obj)

    def _add(self, obj: T) -> None:
        if obj.id in self.by_id:
            raise P4InfoError(f"P4Info has two {self.kind}s with id {obj.id:#010x}")
        self.by_id[obj.id] = obj
        for name in {obj.name, obj.alias} - {""}:
            other = self.by_name.setdefault(name, obj)
            if other.id != obj.id:
                raise P4InfoError(f"P4Info {self.kind} name {name!r} is ambiguous")

    def get(self, key: str | int) -> T:
        found = self.by_id.get(key) if isinstance(key, int) else self.by_name.get(key)
        if found is None:
            shown = f"{key:#010x}" if isinstance(key, int) else repr(key)
            raise P4InfoError(f"P4Info has no {self.kind} {shown}")
        return found


class P4Info:
    """A P4Info message indexed for lookups by name (or alias) and by id.

    Args:
        message: a ``p4.config.v1.P4Info``.

    Raises:
        P4InfoError: the message is not a P4Info, or two objects of one kind share an id
            or a name.
    """

    def __init__(self, message: Any) -> None:
        if not isinstance(message, p4info_pb2.P4Info):
            raise P4InfoError(f"expected a p4.config.v1.P4Info, got {type(message).__name__}")
        self.message = message
        self._tables = _Index("table", map(_table, message.tables))
        self._actions = _Index("action", map(_action, message.actions))
        self._counters = _Index("counter", map(_counter, message.counters))
        self._registers = _Index("register", map(_register, message.registers))

    @classmethod
    def from_text(cls, text: str) -> P4Info:
        """Parse a P4Info in protobuf text format.

        Raises:
            P4InfoError: the text is not a valid text-format P4Info.
        """
        try:
            return cls(text_format.Parse(text, p4info_pb2.P4Info()))
        except text_format.ParseError as exc:
            raise P4InfoError(f"not a text-format P4Info: {exc}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> P4Info:
        """Parse a binary-serialised P4Info.

        Raises:
            P4InfoError: the bytes are not a serialised P4Info.
        """
        message = p4info_pb2.P4Info()
        try:
            message.ParseFromString(data)
        except DecodeError as exc:
            raise P4InfoError(f"not a serialised P4Info: {exc}") from None
        return cls(message)

    @classmethod
    def load(cls, path: str | Path | None = None) -> P4Info:
        """Read a text-format P4Info file, by default :data:`DEFAULT_P4INFO_PATH`.

        Raises:
            P4InfoError: the file is missing (for the default: this package is not used
                from a checkout of the repository) or does not hold a P4Info.
        """
        file = Path(path) if path is not None else DEFAULT_P4INFO_PATH
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            hint = (
                " (the default needs a source checkout or editable install)" if path is None else ""
            )
            raise P4InfoError(f"cannot read P4Info {file}: {exc.strerror}{hint}") from None
        return cls.from_text(text)

    def table(self, key: str | int) -> Table:
        """The table with this full name, alias or id.

        Raises:
            P4InfoError: no such table.
        """
        return self._tables.get(key)

    def action(self, key: str | int) -> Action:
        """The action with this full name, alias or id.

        Raises:
            P4InfoError: no such action.
        """
        return self._actions.get(key)

    def counter(self, key: str | int) -> Counter:
        """The counter with this full name, alias or id.

        Raises:
            P4InfoError: no such counter.
        """
        return self._counters.get(key)

    def register(self, key: str | int) -> Register:
        """The register with this full name, alias or id.

        Raises:
            P4InfoError: no such register.
        """
        return self._registers.get(key)

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table, in P4Info order."""
        return tuple(self._tables.by_id.values())

    @property
    def actions(self) -> tuple[Action, ...]:
        """Every action, in P4Info order."""
        return tuple(self._actions.by_id.values())

    @property
    def counters(self) -> tuple[Counter, ...]:
        """Every counter, in P4Info order."""
        return tuple(self._counters.by_id.values())

    @property
    def registers(self) -> tuple[Register, ...]:
        """Every register, in P4Info order."""
        return tuple(self._registers.by_id.values())


def _enum_name(enum_type: Any, number: int) -> str:
    return str(enum_type.Name(number))


def _table(msg: Any) -> Table:
    match_type = p4info_pb2.MatchField.MatchType
    fields = (
        MatchField(f.id, f.name, f.bitwidth, _enum_name(match_type, f.match_type))
        for f in msg.match_fields
    )
    refs = (
        ActionRef(r.id, _enum_name(p4info_pb2.ActionRef.Scope, r.scope)) for r in msg.action_refs
    )
    pre = msg.preamble
    return Table(
        pre.id,
        pre.name,
        pre.alias,
        msg.size,
        tuple(fields),
        tuple(refs),
        msg.const_default_action_id,
    )


def _action(msg: Any) -> Action:
    params = tuple(Param(p.id, p.name, p.bitwidth) for p in msg.params)
    return Action(msg.preamble.id, msg.preamble.name, msg.preamble.alias, params)


def _counter(msg: Any) -> Counter:
    unit = _enum_name(p4info_pb2.CounterSpec.Unit, msg.spec.unit)
    return Counter(msg.preamble.id, msg.preamble.name, msg.preamble.alias, msg.size, unit)


def _register(msg: Any) -> Register:
    pre = msg.preamble
    if msg.type_spec.WhichOneof("type_spec") != "bitstring":
        raise P4InfoError(f"register {pre.name!r}: only bitstring registers are supported")
    bitstring = msg.type_spec.bitstring
    kind = bitstring.WhichOneof("type_spec")
    if kind not in ("bit", "int"):
        raise P4InfoError(f"register {pre.name!r}: only bit<W> and int<W> cells are supported")
    width = getattr(bitstring, kind).bitwidth
    return Register(pre.id, pre.name, pre.alias, msg.size, width)


def _text_to_int(text: str) -> int:
    if _MAC.match(text):
        return int(re.sub("[:-]", "", text), 16)
    try:
        return int(ipaddress.ip_address(text))
    except ValueError:
        raise EncodingError(
            f"{text!r} is neither an IP address nor a MAC address (pass an int)"
        ) from None


def encode_value(value: Value, bitwidth: int) -> bytes:
    """The canonical P4Runtime bytestring of ``value`` in a field of ``bitwidth`` bits.

    Canonical (P4Runtime 1.3+): big-endian with no leading zero bytes, zero as one zero
    byte. Strings are IPv4/IPv6 addresses (``"10.0.0.1"``) or MAC addresses
    (``"02:00:00:00:00:01"``); bytes are a big-endian number of any length.

    Raises:
        EncodingError: the value is negative, wider than ``bitwidth`` bits, a string that
            is no address, of another type (``bool`` included), or ``bitwidth`` < 1.
    """
    if bitwidth < 1:
        raise EncodingError(f"bitwidth must be positive, got {bitwidth}")
    if isinstance(value, bool) or not isinstance(value, int | str | bytes):
        raise EncodingError(f"cannot encode {type(value).__name__} {value!r}")
    if isinstance(value, str):
        number = _text_to_int(value)
    elif isinstance(value, bytes):
        number = int.from_bytes(value, "big")
    else:
        number = value
    if number < 0 or number.bit_length() > bitwidth:
        raise EncodingError(f"{value!r} does not fit an unsigned {bitwidth}-bit field")
    return number.to_bytes(max(1, (number.bit_length() + 7) // 8), "big")


def mac_text(value: int) -> str:
    """A 48-bit field's value as a MAC address, ``02:00:00:00:00:01`` (what
    :func:`encode_value` accepts back)."""
    return ":".join(f"{(value >> shift) & 0xFF:02x}" for shift in range(40, -8, -8))


def decode_value(data: bytes, bitwidth: int) -> int:
    """The unsigned integer a P4Runtime bytestring carries (canonical or zero-padded).

    Raises:
        EncodingError: ``data`` is empty or its value is wider than ``bitwidth`` bits.
    """
    if not data:
        raise EncodingError("an empty bytestring carries no value")
    number = int.from_bytes(data, "big")
    if number.bit_length() > bitwidth:
        raise EncodingError(f"{data.hex()} does not fit an unsigned {bitwidth}-bit field")
    return number
