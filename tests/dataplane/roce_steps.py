"""RoCEv2 in data-plane vectors: ``"roce"`` jobs, sends and expectations (README.md,
"RoCEv2"), built with :mod:`hostlib.rocev2` and checked field by field.

A RoCEv2 job's rank on port ``p`` has, for window position ``u``, the reply endpoint
:func:`endpoint` (queue pair, R_Key, address, first PSN), and the switch's queue pair
for it is the one the controller installs: ``ROCE_QPN_BASE`` plus its register index,
given rank by rank and position by position, job after job, from 0 (:func:`switch_qpns`).
A frame is built with an ICRC of 0, and sealed by the runner when it is sent, over the
addresses the target puts on it (:func:`seal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.roce import ROCE_QPN_BASE
from hostlib import rocev2
from hostlib.protocol import LANE_BYTES, ROCE_ICRC_SIZE, ROCE_UDP_PORT, RoceOpcode
from hostlib.transport.rdma import RdmaEndpoint

__all__ = [
    "OPCODES",
    "RoceJob",
    "endpoint",
    "frame_mismatches",
    "reply_frame",
    "request_frame",
    "seal",
    "switch_qpns",
]

OPCODES = {op.name[len("UC_WRITE_") :]: op for op in RoceOpcode}
"""Opcode names vectors use: FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM."""


@dataclass(frozen=True)
class RoceJob:
    """A job's RoCEv2 side: its id, worker ports (index = rank), packets per message and
    window positions (slot_count / msg_packets)."""

    job_id: int
    workers: tuple[int, ...]
    msg_packets: int
    window: int


def endpoint(port: int, position: int, msg_bytes: int) -> RdmaEndpoint:
    """Where the switch writes replies for port ``port``'s window ``position``."""
    return RdmaEndpoint(
        0x1000 + 0x10 * port + position, 0xA000 + port, (port << 32) + position * msg_bytes,
        0x100 * port + 0x10 * position,
    )  # fmt: skip


def switch_qpns(jobs: Sequence[RoceJob]) -> dict[tuple[int, int, int], int]:
    """(job id, rank, position) -> the switch's queue pair, in the controller's order."""
    out, reg = {}, 0
    for job in jobs:
        for rank in range(len(job.workers)):
            for position in range(job.window):
                out[(job.job_id, rank, position)] = ROCE_QPN_BASE + reg
                reg += 1
    return out


def request_frame(r: dict[str, Any], job: RoceJob, qpns: dict[Any, int], lanes: bytes) -> bytes:
    """A worker's packet (ICRC 0) from a vector's ``roce`` send object, whose defaults
    are the mapping of docs/protocol.md: dest QP of (job, rank, position), R_Key the
    pool index of the message's first slot (``set``, ``slot``), VA and immediate from
    ``seq`` and ``exponent``, DMA length ``msg_packets`` x the lanes."""
    op = OPCODES[r["opcode"]]
    seq, exponent = r["seq"], r.get("exponent", 0)
    if "qpn" in r:
        qpn = r["qpn"]
    else:
        qpn = qpns[(job.job_id, job.workers.index(r["port"]), r.get("position", 0))]
    frame = rocev2.RoceFrame(
        op,
        qpn,
        r["psn"],
        lanes,
        rocev2.pack_request_va(seq, exponent),
        r.get("rkey", (0x8000 if r.get("set", 0) else 0) | r.get("slot", 0)),
        r.get("dma_length", job.msg_packets * len(lanes)),
        rocev2.pack_imm(seq, exponent),
    )
    return _unsealed(frame)


def reply_frame(r: dict[str, Any], job: RoceJob, lanes: bytes) -> bytes:
    """The switch's reply (ICRC 0) a vector's ``roce`` expectation describes: to the
    port's endpoint of ``position``, the PSN of ``place`` (from 0) in message ``seq``
    (:func:`hostlib.rocev2.reply_psn` of the endpoint's first), ``opcode``, the immediate
    of ``seq`` and ``exponent``."""
    ep = endpoint(r["port"], r.get("position", 0), job.msg_packets * len(lanes))
    psn = rocev2.reply_psn(ep.psn, r["seq"], r.get("place", 0))
    frame = rocev2.RoceFrame(
        OPCODES[r["opcode"]], ep.qpn, psn, lanes, ep.va, ep.rkey,
        job.msg_packets * len(lanes), rocev2.pack_imm(r["seq"], r.get("exponent", 0)),
    )  # fmt: skip
    return _unsealed(frame)


def _unsealed(frame: rocev2.RoceFrame) -> bytes:
    return rocev2.build_frame(frame, "0.0.0.0", "0.0.0.0")[:-ROCE_ICRC_SIZE] + bytes(4)


def seal(payload: bytes, src_ip: str, dst_ip: str, mode: str) -> bytes:
    """``payload`` with the ICRC its addresses give (``"good"``) or that one with a bit
    flipped (``"bad"``); UDP source port 4791."""
    crc = rocev2.icrc(src_ip, dst_ip, ROCE_UDP_PORT, payload[:-ROCE_ICRC_SIZE])
    if mode == "bad":
        crc ^= 1
    return payload[:-ROCE_ICRC_SIZE] + crc.to_bytes(4, "little")


def frame_mismatches(
    want: bytes, got: bytes, mask: frozenset[str], icrc_ok: bool | None
) -> list[str]:
    """How the reply ``got`` differs from ``want`` outside ``mask``; ``icrc_ok``: whether
    the target computed a correct ICRC (None: a P4 target, whose ICRC must be 0)."""
    try:
        have = rocev2.parse_frame(got)
    except rocev2.RoceError as exc:
        return [f"not a RoCEv2 WRITE: {exc}"]
    expected = rocev2.parse_frame(want)
    fields = ("opcode", "dest_qp", "psn", "va", "rkey", "dma_length", "imm")
    out = [
        f"{f}: expected {getattr(expected, f)!r}, got {getattr(have, f)!r}"
        for f in fields
        if f not in mask and getattr(expected, f) != getattr(have, f)
    ]
    if "lanes" not in mask and have.payload != expected.payload:
        w, g = expected.payload, have.payload
        diff = [i // LANE_BYTES for i in range(0, min(len(w), len(g)), LANE_BYTES)
                if w[i : i + LANE_BYTES] != g[i : i + LANE_BYTES]]  # fmt: skip
        out.append(f"payload: {len(g)} bytes for {len(w)}, lanes differ at {diff[:4]}")
    if icrc_ok is None and have.icrc != 0:
        out.append(f"ICRC {have.icrc:#010x}: a P4 target leaves it 0")
    elif icrc_ok is False:
        out.append("the ICRC is wrong")
    return out
