"""The eBPF data plane's shared layout: constants and the structs of its maps' keys and
values, defined once here and written into the C program as a generated header.

``ina.bpf.c`` includes ``ina_gen.h``, which :func:`render_header` writes from this
module at compile time (``build.py``): the wire constants come from
:mod:`hostlib.protocol` (the one source of truth the P4 program is checked against too),
and every struct the program and Python exchange through a map is a
:class:`ctypes.Structure` here, rendered field by field as C. Both sides then lay the
bytes out alike by construction (natural alignment, explicit padding fields, sizes
asserted in C with ``_Static_assert``).

Addresses and UDP ports in map keys and values are kept in network byte order, exactly
the bytes of the packet, so the program compares them with the header without a swap:
:func:`be32_ip` and :func:`be16` make such values.
"""

from __future__ import annotations

import ctypes
import socket
from collections.abc import Sequence
from typing import Any

from emulation.softswitch.ebpf.icrc import render_tables, shift_tables, slice_tables
from emulation.softswitch.ebpf.lanes import LANE_HELD, LANE_IN_ORDER
from emulation.softswitch.sharing import JOB_STATS, STATS_CELLS
from hostlib.protocol import (
    EXPONENT_MIN,
    FLAG_RESEND,
    HEADER_SIZE,
    INA_UDP_PORT,
    LANE_BYTES,
    MAX_LANES,
    MAX_WORKERS,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_PSN_SEQ_SHIFT,
    ROCE_QP_REGISTERS,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    SLOT_MASK,
    SWITCH_DROPS,
    SWITCH_STATS,
    PacketType,
    RoceOpcode,
)

__all__ = [
    "COUNTERS",
    "DIRECTIONS",
    "LINK_COUNTS",
    "MAX_PORTS",
    "MAX_REPLICAS",
    "ROCE_FIELD_MASK",
    "SHARE_BEHIND",
    "SHARE_FALLBACK",
    "SHARE_SHARED",
    "FwdKind",
    "InaCfg",
    "InaDest",
    "InaFwd",
    "InaGroup",
    "InaJob",
    "InaJobStats",
    "InaPort",
    "InaRankKey",
    "InaReplica",
    "InaReplicaKey",
    "InaRoceQp",
    "InaRoceReply",
    "InaRoceReplyKey",
    "InaRoceRequest",
    "InaSharing",
    "InaUpstream",
    "InaWorkerKey",
    "be16",
    "be32_ip",
    "from_be16",
    "from_be32_ip",
    "link_index",
    "probability_threshold",
    "render_header",
    "slot_struct",
]

MAX_PORTS = 512
"""Switch port numbers 0..511: v1model's ``bit<9>`` port, bmv2's ``-i`` range."""

MAX_REPLICAS = 64
"""Replicas a multicast group may hold: a job's 32 workers, or a flood group of up to
64 ports (the program loops over a group, and a loop needs a bound)."""

COUNTERS = (
    *SWITCH_STATS,
    *(f"drop_{reason}" for reason in SWITCH_DROPS),
    "frames_in",
    "frames_out",
    "forwarded",
    "not_forwarded",
    "passed_to_host",
    "no_route",
)
"""The per-CPU counters of the program, by index: the protocol's statistics and drop
reasons (the P4 program's ina_stats and drops order), then the port I/O's counts, as the
soft switch on ports (``frames.py``) reports them, then a one-armed server's: frames left
to its host's stack (not INA to its address), and results not sent because the kernel
had no route or neighbour out of its one port toward the worker."""

DIRECTIONS = ("egress", "ingress")
"""A port's two directions, index 0 and 1 (``links.DIRECTIONS``'s order)."""

LINK_COUNTS = ("offered", "lost", "delivered", "duplicated", "reordered")
"""Per port and direction, what the link emulation in the program counts: frames offered,
lost, delivered (``offered = lost + delivered``), and of those delivered, how many got an
extra copy and how many were put in the held-back lane (egress only; no delay line in
the kernel: ``queue_dropped`` and ``in_flight`` are always 0)."""


ROCE_FIELD_MASK = (1 << 24) - 1
"""The BTH's queue pair and PSN fields: 24 bits (a PSN wraps there)."""


SHARE_SHARED, SHARE_FALLBACK, SHARE_BEHIND = 1, 2, 4
"""An ``InaSharing`` value's flags: which of the job's three sharing entries exist."""


class FwdKind:
    """The forwarder action kinds, as the program and the map hold them."""

    DROP = 0
    PORT = 1
    FLOOD = 2


def link_index(port: int, direction: int, count: int) -> int:
    """Index of one link counter in the ``links`` map."""
    return (port * len(DIRECTIONS) + direction) * len(LINK_COUNTS) + count


def probability_threshold(p: float) -> int:
    """The u64 the program compares a 32-bit random number with: it drops when the number
    is below it, so 0 never and ``2**32`` always.

    Raises:
        ValueError: ``p`` outside 0..1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"probability {p} outside 0..1")
    return round(p * (1 << 32))


def be32_ip(ip: str) -> int:
    """IPv4 ``ip`` as the u32 whose little-endian bytes are its network-order bytes."""
    return int.from_bytes(socket.inet_aton(ip), "little")


def from_be32_ip(value: int) -> str:
    return socket.inet_ntoa(value.to_bytes(4, "little"))


def be16(port: int) -> int:
    """UDP ``port`` as the u16 whose little-endian bytes are its network-order bytes."""
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def from_be16(value: int) -> int:
    return int.from_bytes(value.to_bytes(2, "little"), "big")


u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
s32 = ctypes.c_int32


class InaCfg(ctypes.Structure):
    """``cfg[0]``: the drop simulator, the forwarder's default action, one-armed mode."""

    _fields_ = [
        ("drop_in", u64),  # probability_threshold at ingress
        ("drop_eg", u64),  # per result replica at egress
        ("forward_only", u32),  # 1: INA packets are forwarded like any frame
        ("fwd_kind", u32),  # the forwarder's default action (FwdKind) on a miss
        ("fwd_value", u32),
        ("slots", u32),  # slots per set in the pool (the slots map's size)
        ("one_armed", u32),  # 1: a reduction server on one NIC (see ina.bpf.c)
        ("own_ip", u32),  # be32_ip: its address; INA packets to others pass to the host
        ("sharing", u32),  # 1: some job has a sharing entry (packets look theirs up)
        ("pad", u32),
    ]


class InaJob(ctypes.Structure):
    """``jobs[job_id]``: the jobs table's ``set_job`` action data."""

    _fields_ = [("num_workers", u32), ("slot_base", u32), ("slot_count", u32), ("mgid", u32)]


class InaWorkerKey(ctypes.Structure):
    """A workers-table key; its value is a u32 1."""

    _fields_ = [
        ("ip", u32),  # be32_ip
        ("udp_port", u16),  # be16
        ("job", u16),
        ("rank", u8),
        ("pad", u8 * 3),
    ]


class InaReplica(ctypes.Structure):
    """One replica of a multicast group: (egress port, rid)."""

    _fields_ = [("port", u16), ("rid", u16)]


class InaGroup(ctypes.Structure):
    """``groups[mgid]``: a multicast group's replicas."""

    _fields_ = [("count", u32), ("replicas", InaReplica * MAX_REPLICAS)]


class InaReplicaKey(ctypes.Structure):
    """A replicas-table key: (job, rid, egress port)."""

    _fields_ = [("job", u16), ("rid", u16), ("port", u16), ("pad", u16)]


class InaDest(ctypes.Structure):
    """A replicas-table value: where the replica goes."""

    _fields_ = [("ip", u32), ("udp_port", u16), ("mac", u8 * 6)]


class InaUpstream(ctypes.Structure):
    """``upstream[job_id]``: the upstream table's ``set_upstream`` action data."""

    _fields_ = [
        ("ip", u32),  # be32_ip
        ("udp_port", u16),  # be16
        ("mac", u8 * 6),
        ("rank", u32),
        ("egress_port", u32),
    ]


class InaSharing(ctypes.Structure):
    """``sharing[job_id]``: the job's entries of the shared, fallback and behind tables
    (``sharing.py``; ``sharing.bpf.h`` says why one value holds the three)."""

    _fields_ = [
        ("flags", u32),  # SHARE_*: which entries exist
        ("count", u32),  # shared: job slots in the region
        ("base", u32),  # shared: the region's first pool slot
        ("mask", u32),  # shared: the region's size - 1 (a power of two)
        ("offset", u32),  # shared: the job's first slot in the region
        ("stats", u32),  # shared: its cell of share_stats (shared uses, collisions)
        ("ip", u32),  # fallback: be32_ip
        ("udp_port", u16),  # fallback: be16
        ("mac", u8 * 6),  # fallback
        ("egress_port", u32),  # fallback
        ("fb_stats", u32),  # fallback: its cell of share_stats (to and from the fallback)
    ]


class InaJobStats(ctypes.Structure):
    """A ``share_stats`` cell (per CPU): the sharing counters (``JOB_STATS``) of the job
    whose entries name the cell."""

    _fields_ = [(name, u64) for name in JOB_STATS]


class InaFwd(ctypes.Structure):
    """``forward[MAC as u64]``: a forwarder entry (FwdKind and its port or mgid)."""

    _fields_ = [("kind", u32), ("value", u32)]


class InaPort(ctypes.Structure):
    """``ports[port]``: the port's interface (0: no such port) and its link's loss and
    duplication, each way, and reordering on egress (``lanes.py``)."""

    _fields_ = [
        ("ifindex", u32),
        ("link", u32),  # bit 0: count egress, 1: emulate and count ingress, 2: lanes
        ("loss_eg", u64),  # probability_threshold
        ("loss_in", u64),
        ("dup_eg", u64),
        ("dup_in", u64),
        ("reorder_eg", u64),
    ]


class InaRankKey(ctypes.Structure):
    """A ``worker_ranks`` key (value: the rank, u32): the workers table read the other
    way, as ``Pipeline.worker_rank`` does, for the replies of RoCEv2 (``roce.bpf.h``)."""

    _fields_ = [("ip", u32), ("udp_port", u16), ("job", u16)]  # ip, udp_port: be32_ip, be16


class InaRoceRequest(ctypes.Structure):
    """``roce_requests[dest QPN]``: ``roce_tables.RoceRequest`` (ip: be32_ip)."""

    _fields_ = [("job", u32), ("rank", u32), ("qp_reg", u32), ("ip", u32)]


class InaRoceReplyKey(ctypes.Structure):
    """A ``roce_replies`` key: (job, rank, window position)."""

    _fields_ = [("job", u16), ("rank", u8), ("pad", u8), ("position", u32)]


class InaRoceReply(ctypes.Structure):
    """A ``roce_replies`` value: ``roce_tables.RoceReply``."""

    _fields_ = [("va", u64), ("qpn", u32), ("rkey", u32), ("psn_reg", u32), ("pad", u32)]


class InaRoceQp(ctypes.Structure):
    """``roce_qps[register index]``: one queue pair register cell of every array of
    ``roce_tables.ROCE_ARRAYS`` (the UC responder's state, then the reply PSN), under a
    lock for the responder's step (the reply PSN is taken by an atomic add)."""

    _fields_ = [
        ("lock", u32),  # struct bpf_spin_lock
        ("open", u32),
        ("expect_psn", u32),
        ("base", u32),
        ("seq", u32),
        ("exponent", s32),
        ("place", u32),
        ("reply_psn", u32),
    ]


def slot_struct(lanes: int) -> type[ctypes.Structure]:
    """The ``slots`` map's value for ``lanes`` lanes: both sets of one slot under one
    lock (a packet of set k also clears its bit in set 1-k's bitmap, so one lock per slot
    makes each packet's update one serial step, as in the pipeline).

    The lock is ``struct bpf_spin_lock`` (4 bytes); user space never reads or writes it
    (the kernel skips it with ``BPF_F_LOCK``).

    Raises:
        ValueError: lanes outside 1..MAX_LANES.
    """
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes {lanes} outside 1..{MAX_LANES}")

    class InaSet(ctypes.Structure):
        _fields_ = [("remaining", u32), ("seq", u32), ("exponent", s32), ("final", u32)]

    class InaSlot(ctypes.Structure):
        _fields_ = [
            ("lock", u32),  # struct bpf_spin_lock
            ("bitmap", u32 * 2),
            ("pad", u32),
            ("sets", InaSet * 2),
            ("values", (s32 * lanes) * 2),
        ]

    return InaSlot


_STRUCTS: Sequence[type[ctypes.Structure]] = (
    InaCfg,
    InaJob,
    InaWorkerKey,
    InaReplica,
    InaGroup,
    InaReplicaKey,
    InaDest,
    InaUpstream,
    InaSharing,
    InaJobStats,
    InaFwd,
    InaPort,
    InaRankKey,
    InaRoceRequest,
    InaRoceReplyKey,
    InaRoceReply,
    InaRoceQp,
)

_C_TYPES: dict[Any, str] = {
    ctypes.c_uint8: "__u8",
    ctypes.c_uint16: "__u16",
    ctypes.c_uint32: "__u32",
    ctypes.c_uint64: "__u64",
    ctypes.c_int32: "__s32",
}


def _c_name(cls: type[ctypes.Structure]) -> str:
    """``InaWorkerKey`` -> ``ina_worker_key``."""
    out = "".join("_" + c.lower() if c.isupper() else c for c in cls.__name__)
    return out.lstrip("_")


def _c_field(name: str, ctype: Any) -> str:
    dims = ""
    while issubclass(ctype, ctypes.Array):
        dims += f"[{ctype._length_}]"
        ctype = ctype._type_
    if name == "lock":
        return "struct bpf_spin_lock lock;"
    if issubclass(ctype, ctypes.Structure):
        return f"struct {_c_name(ctype)} {name}{dims};"
    return f"{_C_TYPES[ctype]} {name}{dims};"


def _c_struct(cls: Any) -> str:
    fields = "\n".join(f"    {_c_field(field[0], field[1])}" for field in cls._fields_)
    return (
        f"struct {_c_name(cls)} {{\n{fields}\n}};\n"
        f"_Static_assert(sizeof(struct {_c_name(cls)}) == {ctypes.sizeof(cls)}, "
        f'"{_c_name(cls)} size");\n'
    )


def render_header(lanes: int) -> str:
    """``ina_gen.h`` for a program of ``lanes`` lanes: every constant and map struct.

    Raises:
        ValueError: lanes outside 1..MAX_LANES.
    """
    slot = slot_struct(lanes)
    consts = {
        "INA_LANES": lanes,
        "INA_HEADER_SIZE": HEADER_SIZE,
        "INA_PAYLOAD_BYTES": lanes * LANE_BYTES,
        "INA_UDP_PORT": INA_UDP_PORT,
        "INA_VT_DATA": (PROTOCOL_VERSION << 4) | PacketType.DATA,
        "INA_VT_RESULT": (PROTOCOL_VERSION << 4) | PacketType.RESULT,
        "INA_POOL_SET_BIT": POOL_SET_BIT,
        "INA_SLOT_MASK": SLOT_MASK,
        "INA_EXPONENT_MIN": EXPONENT_MIN,
        "INA_FLAG_RESEND": FLAG_RESEND,
        "INA_MAX_WORKERS": MAX_WORKERS,
        "INA_MAX_PORTS": MAX_PORTS,
        "INA_MAX_REPLICAS": MAX_REPLICAS,
        "INA_NUM_COUNTERS": len(COUNTERS),
        "INA_NUM_LINK_COUNTERS": MAX_PORTS * len(DIRECTIONS) * len(LINK_COUNTS),
        "LINK_NUM_COUNTS": len(LINK_COUNTS),
        "INA_LANE_IN_ORDER": LANE_IN_ORDER,
        "INA_LANE_HELD": LANE_HELD,
        "FWD_DROP": FwdKind.DROP,
        "FWD_PORT": FwdKind.PORT,
        "FWD_FLOOD": FwdKind.FLOOD,
        "SHARE_SHARED": SHARE_SHARED,
        "SHARE_FALLBACK": SHARE_FALLBACK,
        "SHARE_BEHIND": SHARE_BEHIND,
        "INA_STATS_CELLS": STATS_CELLS,
    }
    consts |= {
        "ROCE_UDP_PORT": ROCE_UDP_PORT,
        "ROCE_BTH_SIZE": ROCE_BTH_SIZE,
        "ROCE_RETH_SIZE": ROCE_RETH_SIZE,
        "ROCE_IMMDT_SIZE": ROCE_IMMDT_SIZE,
        "ROCE_ICRC_SIZE": ROCE_ICRC_SIZE,
        "ROCE_FIELD_MASK": ROCE_FIELD_MASK,
        "ROCE_QP_REGISTERS": ROCE_QP_REGISTERS,
        "ROCE_PSN_SEQ_SHIFT": ROCE_PSN_SEQ_SHIFT,
        **{f"ROCE_{op.name}": int(op) for op in RoceOpcode},
    }
    consts |= {f"C_{name.upper()}": i for i, name in enumerate(COUNTERS)}
    consts |= {f"DIR_{name.upper()}": i for i, name in enumerate(DIRECTIONS)}
    consts |= {f"JS_{name.upper()}": i for i, name in enumerate(JOB_STATS)}
    consts |= {f"LINK_{name.upper()}": i for i, name in enumerate(LINK_COUNTS)}
    lines = [
        "/* ina_gen.h: GENERATED by emulation/softswitch/ebpf/layout.py from",
        " * hostlib/protocol.py at compile time; do not edit, do not commit. */",
        "#ifndef INA_GEN_H",
        "#define INA_GEN_H",
        "",
        *(f"#define {name} {value}" for name, value in consts.items()),
        "",
    ]
    lines += [_c_struct(cls) for cls in _STRUCTS]
    inner: Any = slot._fields_[3][1]
    inner = inner._type_  # InaSet, inside InaSlot
    lines += [_c_struct(inner), _c_struct(slot)]
    lines.append(render_tables("ina_crc32", slice_tables()))
    lines.append(render_tables("ina_crc_shift", shift_tables(lanes * LANE_BYTES)))
    lines.append("#endif  /* INA_GEN_H */\n")
    return "\n".join(lines)
