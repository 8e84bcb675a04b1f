"""The P4Runtime server's vocabulary: the P4Info it serves and how values are checked.

Switch-target layer, part of :mod:`emulation.softswitch.p4runtime`. It owns the soft
switch's P4Info (:func:`softswitch_p4info`, sized to the switch's lanes and slots;
:func:`is_tofino`), the refusal every part of the server raises (:class:`_Failure`: one
request or update refused with a gRPC status code), and the codecs of P4Runtime values:
bytestrings to integers and back in canonical form (:func:`_uint`, :func:`_canonical`),
a table key's match fields or an action's parameters against their P4Info
(:func:`_decode_fields`), array indices (:func:`_check_index`). It knows no pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
from p4.config.v1 import p4info_pb2

from controller.p4info import P4Info, P4InfoError
from controller.slots import MISSING
from emulation.softswitch.roce_tables import qp_registers

__all__ = [
    "_LANE_PREFIX",
    "_Failure",
    "_canonical",
    "_check_index",
    "_decode_fields",
    "_fail",
    "_ipv4",
    "_uint",
    "is_tofino",
    "softswitch_p4info",
]

_LANE_PREFIX = "Ingress.values.lane_"
_LANE_ID_BASE = 0x16070000


# --------------------------------------------------------------------- the P4Info


_SLOT_REGISTERS = (
    "Ingress.seq",
    "Ingress.remaining",
    "Ingress.final",
    "Ingress.exponents.exponent",
    MISSING,
)
"""Per-(set, slot) registers of either program: 2 * slots cells (``MISSING``: the Tofino
program's workers a use still waits for, which the pipeline keeps as a bitmap per set and
a count)."""

def is_tofino(p4info: P4Info) -> bool:
    """Whether ``p4info`` is the Tofino program's (p4/tna/, ``arch: "tna"``)."""
    return str(p4info.message.pkg_info.arch) == "tna"


def softswitch_p4info(base: P4Info, lanes: int, slots: int) -> P4Info:
    """``base`` (``p4/ina.p4info.txtpb``) as p4c would emit it for this switch's sizes.

    The P4 program's LANES_PER_PACKET and SWITCH_SLOTS are compile-time constants; the
    soft switch takes them as start-up options, so its P4Info has one lane register per
    lane (``Ingress.values.lane_NN``, id 0x1607NNNN) and per-(set, slot) registers of
    2 * ``slots`` cells (the bitmaps, one per set, and the owner register of sharing:
    ``slots``). Indices keep the P4
    layout: set * slots + slot, where ``slots`` is a bitmap register's size.

    The Tofino program's P4Info (p4/tna/ina_tna.p4info.txtpb, :func:`is_tofino`) keeps its
    lane registers and their p4c-barefoot ids: ``lanes`` must be its lane count.

    Raises:
        P4InfoError: no lane registers, or a Tofino P4Info of another lane count.
    """
    message = p4info_pb2.P4Info()
    message.CopyFrom(base.message)
    lane_template = None
    kept = []
    for reg in message.registers:
        if reg.preamble.name.startswith(_LANE_PREFIX):
            lane_template = lane_template or reg
            continue
        kept.append(reg)
    if lane_template is None:
        raise P4InfoError("the base P4Info has no lane registers")
    if is_tofino(base):
        have = len(message.registers) - len(kept)
        if lanes != have:
            raise P4InfoError(f"the Tofino program has {have} lanes, not {lanes}")
        for reg in message.registers:
            if reg.preamble.name in _SLOT_REGISTERS or reg.preamble.name.startswith(
                _LANE_PREFIX
            ):
                reg.size = 2 * slots
        return P4Info(message)
    template = p4info_pb2.Register()
    template.CopyFrom(lane_template)
    del message.registers[:]
    for reg in kept:
        name = reg.preamble.name
        if name.startswith("Ingress.bitmap.") or name == "Ingress.sharing.owner":
            reg.size = slots
        elif name in _SLOT_REGISTERS:
            reg.size = 2 * slots
        elif name.startswith(("Ingress.roce.", "Egress.roce.")):
            reg.size = qp_registers(slots)  # the queue pairs this pool can use
        message.registers.append(reg)
    for lane in range(lanes):
        reg = message.registers.add()
        reg.CopyFrom(template)
        reg.preamble.id = _LANE_ID_BASE + lane
        reg.preamble.name = f"{_LANE_PREFIX}{lane:02d}"
        reg.preamble.alias = f"lane_{lane:02d}"
        reg.size = 2 * slots
    return P4Info(message)


# --------------------------------------------------------------------- failures


class _Failure(Exception):
    """One request or update refused with a gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _fail(code: grpc.StatusCode, message: str) -> _Failure:
    return _Failure(code, message)


# --------------------------------------------------------------------- values


def _uint(data: bytes, bitwidth: int, what: str) -> tuple[int, bytes]:
    """A bytestring's value and canonical form (shortest big-endian, at least 1 byte).

    Raises:
        _Failure: INVALID_ARGUMENT, empty or wider than ``bitwidth``. The spec's sections
            disagree on the code: Bytestrings says OUT_OF_RANGE, while Match Format,
            Action Specification and RegisterEntry make any value that breaks those
            rules INVALID_ARGUMENT. bmv2's PI server, the reference target, answers
            INVALID_ARGUMENT ("does not fit within N bits"), so this switch does too.
    """
    if not data:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: empty bytestring")
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise _fail(
            grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {value:#x} does not fit {bitwidth} bits"
        )
    return value, _canonical(value)


def _decode_fields(
    owner: str,
    given: Sequence[tuple[int, Any]],
    lookup: Callable[[int], Any],
    specs: Sequence[Any],
    value_of: Callable[[Any, Any], bytes],
    kind: str,
    missing_kind: str,
) -> dict[int, tuple[int, bytes]]:
    """Decode a table key's match fields or an action's parameters against their P4Info:
    id -> (value, canonical bytes). Each id must be known and given once, each value fit
    its bitwidth (``value_of`` extracts it, checking the item's form), none be missing.

    Raises:
        _Failure: INVALID_ARGUMENT for an unknown, repeated or missing id or a value
            that does not fit (see :func:`_uint`); whatever ``value_of`` raises.
    """
    values: dict[int, tuple[int, bytes]] = {}
    for fid, item in given:
        try:
            spec = lookup(fid)
        except P4InfoError:
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT, f"{owner}: no {kind} with id {fid}"
            ) from None
        if fid in values:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{owner}: {spec.name} twice")
        values[fid] = _uint(value_of(item, spec), spec.bitwidth, f"{owner}.{spec.name}")
    missing = [spec.name for spec in specs if spec.id not in values]
    if missing:
        raise _fail(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{owner}: {missing_kind} {', '.join(missing)} missing",
        )
    return values


def _check_index(name: str, index: int, size: int) -> None:
    """Raises _Failure for an index outside an array: negative (INVALID_ARGUMENT) or past
    its end (OUT_OF_RANGE), the codes the spec gives for counter and meter arrays."""
    if index < 0:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: negative index {index}")
    if index >= size:
        raise _fail(grpc.StatusCode.OUT_OF_RANGE, f"{name}: index {index} outside 0..{size - 1}")


def _canonical(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _ipv4(value: int) -> str:
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))
