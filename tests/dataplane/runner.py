"""Data-plane vectors: load and validate them, and run them against a switch target.

Test tooling, not part of a package. A vector file (``vectors/*.json``, format in
``README.md``) declares a switch configuration and a list of steps in ptf's send / verify /
verify-no-other style. :func:`run_vector` plays the steps against a :class:`Target`; the
targets are :class:`SoftSwitchTarget` (a real ``inalab switch`` process over UDP on
loopback, always available) and ``bmv2_target.Bmv2Target`` (simple_switch_grpc on veth
pairs). Both are held to the same vectors, so the P4 program and the soft switch's
reference semantics cannot drift apart unnoticed.

What a vector calls a packet is the INA datagram (UDP payload). A target wraps and unwraps
it for its own wire: the soft switch gives every port a UDP socket on 127.0.0.1, bmv2 an
Ethernet/IPv4/UDP frame on a veth interface built from the port's identity.
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import sharing_steps
from roce_steps import (
    OPCODES,
    RoceJob,
    frame_mismatches,
    reply_frame,
    request_frame,
    seal,
    switch_qpns,
)

from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch import SoftSwitchProcess
from hostlib import rocev2
from hostlib.protocol import (
    EXPONENT_MIN,
    HEADER,
    HEADER_SIZE,
    LANES_PER_PACKET,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    ROCE_UDP_PORT,
    SLOT_MASK,
    PacketType,
)

VECTOR_DIR = Path(__file__).parent / "vectors"
TARGETS = ("soft", "soft-ports", "ebpf", "one-armed", "bmv2", "tna-model")
"""Target names a vector's ``targets`` field may list."""

HEADER_FIELDS: dict[str, tuple[int, int]] = {
    "version": (0, 15),
    "ptype": (0, 15),
    "flags": (0, 0xFF),
    "job_id": (0, 0xFFFF),
    "rank": (0, 0xFF),
    "exponent": (-128, 127),
    "num_lanes": (0, 0xFFFF),
    "set": (0, 1),
    "slot": (0, SLOT_MASK),
    "reserved": (0, 0xFFFF),
    "seq": (0, 0xFFFFFFFF),
}
"""INA header fields by the names vectors use, with their ranges (docs/protocol.md)."""

MASKABLE = frozenset(HEADER_FIELDS) | {"lanes"}

DROP_REASONS = (
    "truncated", "malformed", "unknown_job", "bad_rank", "bad_source", "bad_slot",
    "bad_lanes", "bad_length", "stale", "sim_ingress", "sim_egress",
    "unknown_qp", "bad_psn", "bad_icrc",
)  # fmt: skip
STRICT_COUNTERS = frozenset(
    ["duplicates_ignored", "retransmits_answered", "upstream_resent", "results_from_upstream"]
    + [f"drop_{r}" for r in DROP_REASONS]
)
"""Counters an ``expect_counters`` step holds to zero unless it names them."""
COUNTERS = STRICT_COUNTERS | {
    "received",
    "aggregated",
    "completed",
    "results_sent",
    "sent_upstream",
}
"""Every counter a vector may name: the protocol's (docs/protocol.md), not a target's."""

SOFT_SLOTS = 64
"""Slot pool of the soft switch a vector runs on: jobs in vectors take a handful."""
DEFAULT_RECV_TIMEOUT = 10.0
"""Seconds an ``expect`` waits for each packet: a bound for a lost packet, not a latency
(an arriving packet ends the wait). bmv2's port, ingress and egress threads on a machine
busy with a compile or another emulation took longer than 2 s (issue #21)."""
INT32 = (-(2**31), 2**31 - 1)


class VectorError(ValueError):
    """A vector file does not follow the format; the message names the file and place."""


class VectorFailure(AssertionError):
    """A target did not do what a vector step expects; names the file and step."""


class TargetUnavailable(Exception):
    """The target cannot run here; the message is the reason a test skips with."""


# --------------------------------------------------------------------- vector model
@dataclass(frozen=True)
class PortIdentity:
    """What a worker port is on a wire with L2/L3: derived from the port number."""

    port: int
    mac: str
    ip: str
    udp_port: int


def port_identity(port: int) -> PortIdentity:
    """The identity of port ``port`` (1..250): 02:00:00:00:00:pp, 10.0.0.p, UDP 40000+p."""
    return PortIdentity(port, f"02:00:00:00:00:{port:02x}", f"10.0.0.{port}", 40000 + port)


@dataclass(frozen=True)
class UpstreamPort:
    """A job's upstream switch, played by a port: the switch sends the job's partial
    sums there as ``rank`` and takes RESULTs from there (hierarchical aggregation)."""

    port: int
    rank: int


@dataclass(frozen=True)
class Job:
    job_id: int
    slot_count: int
    workers: tuple[int, ...]  # ports, index = rank
    upstream: UpstreamPort | None = None
    msg_packets: int | None = None  # a RoCEv2 job's packets per message (roce_steps.py)
    sharing: sharing_steps.SharingSpec | None = None  # shared slots, fallback, behind


@dataclass(frozen=True)
class Forward:
    """A plain (non-INA) UDP datagram's other end: a port's identity and a UDP dport."""

    port: int
    udp_dport: int


ROCE = Forward(0, ROCE_UDP_PORT)
"""A send to, or a reply from, the switch's RoCEv2 endpoint (its address, UDP 4791 from
UDP 4791), where ``None`` is its INA endpoint."""


@dataclass(frozen=True)
class Send:
    port: int
    payload: bytes
    to: Forward | None = None
    icrc: str | None = None  # a RoCEv2 frame's ICRC when sent: "good" or "bad"
    truncate: int | None = None  # a RoCEv2 frame cut to this many bytes once sealed


@dataclass(frozen=True)
class Expected:
    port: int
    payload: bytes
    mask: frozenset[str]
    raw: bool  # compare bytes as a whole (no INA header to compare field by field)
    origin: Forward | None = None  # None: the switch's INA endpoint
    roce: bool = False  # a RoCEv2 WRITE from the switch's RoCEv2 endpoint (roce_steps.py)


@dataclass(frozen=True)
class Step:
    index: int
    kind: str  # send | expect | expect_none | expect_counters | set_drops
    sends: tuple[Send, ...] = ()
    expected: tuple[Expected, ...] = ()
    ports: tuple[int, ...] = ()
    timeout: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    drops: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class Vector:
    path: Path
    description: str
    targets: tuple[str, ...]
    lanes: int
    ports: tuple[int, ...]
    jobs: tuple[Job, ...]
    drops: tuple[float, float]
    steps: tuple[Step, ...]

    @property
    def roce(self) -> bool:
        """Whether a job of the vector runs INA over RoCEv2."""
        return any(job.msg_packets is not None for job in self.jobs)

    @property
    def name(self) -> str:
        return self.path.stem


# --------------------------------------------------------------------- loading
class _Where:
    """The place being validated, for error messages: ``file: steps[3].send.ina.rank``."""

    def __init__(self, path: Path, where: str = "") -> None:
        self.path, self.where = path, where

    def __truediv__(self, part: str | int) -> _Where:
        part = f"[{part}]" if isinstance(part, int) else (f".{part}" if self.where else part)
        return _Where(self.path, self.where + part)

    def error(self, message: str) -> VectorError:
        return VectorError(f"{self.path.name}: {self.where or '(top)'}: {message}")


def _obj(value: Any, at: _Where, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise at.error(f"must be an object, not {type(value).__name__}")
    if missing := sorted(required - value.keys()):
        raise at.error(f"missing {', '.join(missing)}")
    if unknown := sorted(value.keys() - required - optional):
        raise at.error(f"unknown field(s) {', '.join(unknown)}")
    return value


def _int(value: Any, at: _Where, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise at.error(f"must be an integer in {lo}..{hi}, not {value!r}")
    return value


def _list(value: Any, at: _Where, min_len: int = 0) -> list[Any]:
    if not isinstance(value, list) or len(value) < min_len:
        raise at.error(f"must be a list of at least {min_len} item(s)")
    return value


def load_vector(path: Path) -> Vector:
    """Read and validate one vector file.

    Raises:
        VectorError: unreadable JSON or anything outside the format; the message names the
            file and the place (``steps[4].expect[1].ina.seq``).
    """
    at = _Where(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise at.error(f"not readable JSON: {exc}") from None
    return parse_vector(doc, path)


def parse_vector(doc: Any, path: Path) -> Vector:
    """Validate a decoded vector document (``path`` only names it in errors).

    Raises:
        VectorError: as :func:`load_vector`.
    """
    at = _Where(path)
    top = _obj(doc, at, {"description", "ports", "jobs", "steps"}, {"targets", "switch", "drops"})
    if not isinstance(top["description"], str) or not top["description"]:
        raise (at / "description").error("must be a non-empty string")
    targets = tuple(top.get("targets", list(TARGETS)))
    if not targets or any(t not in TARGETS for t in targets):
        raise (at / "targets").error(f"must list some of {', '.join(TARGETS)}")
    switch = _obj(top.get("switch", {}), at / "switch", set(), {"lanes"})
    lanes = switch.get("lanes", LANES_PER_PACKET)
    if lanes != LANES_PER_PACKET:
        raise (at / "switch" / "lanes").error(
            f"must be {LANES_PER_PACKET}: the P4 target's lane count is fixed"
        )
    nports = _int(top["ports"], at / "ports", 1, 32)
    ports = tuple(range(1, nports + 1))
    jobs = tuple(_job(j, at / "jobs" / i, ports) for i, j in enumerate(_list(top["jobs"], at)))
    if len({j.job_id for j in jobs}) != len(jobs):
        raise (at / "jobs").error("two jobs with one job_id")
    drops = _drops(top.get("drops", {"ingress": 0, "egress": 0}), at / "drops")
    roce = {
        j.job_id: RoceJob(j.job_id, j.workers, j.msg_packets, j.slot_count // j.msg_packets)
        for j in jobs
        if j.msg_packets is not None
    }
    ctx = _Ctx(lanes, ports, targets, roce, switch_qpns(list(roce.values())),
               sharing_steps.counter_keys(jobs))  # fmt: skip
    raw_steps = _list(top["steps"], at / "steps", 1)
    steps = tuple(_step(s, at / "steps" / i, i, ctx) for i, s in enumerate(raw_steps))
    return Vector(path, top["description"], targets, lanes, ports, jobs, drops, steps)


def load_vectors(directory: Path = VECTOR_DIR) -> list[Vector]:
    """Every ``*.json`` vector in ``directory``, sorted by name.

    Raises:
        VectorError: a file is invalid, or there is none.
    """
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise VectorError(f"no vector files in {directory}")
    return [load_vector(p) for p in paths]


@dataclass(frozen=True)
class _Ctx:
    lanes: int
    ports: tuple[int, ...]
    targets: tuple[str, ...]
    roce: dict[int, RoceJob] = field(default_factory=dict)  # RoCEv2 jobs by id
    qpns: dict[tuple[int, int, int], int] = field(default_factory=dict)
    job_counters: frozenset[str] = frozenset()  # sharing_steps' job<J>.<counter>


def _job(value: Any, at: _Where, ports: tuple[int, ...]) -> Job:
    job = _obj(value, at, {"job_id", "slot_count"},
               {"workers", "upstream", "roce", "shared", "fallback", "behind"})  # fmt: skip
    sharing = sharing_steps.parse(job, at, lambda p, here: _int(p, here, 1, len(ports)))
    if "workers" not in job and (sharing is None or sharing.behind is None):
        raise at.error("missing workers")
    workers = tuple(
        _int(p, at / "workers" / i, 1, len(ports))
        for i, p in enumerate(_list(job.get("workers", []), at / "workers"))
    )
    if len(set(workers)) != len(workers):
        raise (at / "workers").error("a port is bound to two ranks")
    if len(workers) > 32:
        raise (at / "workers").error("more than 32 workers")
    upstream = None
    if "upstream" in job:
        here = at / "upstream"
        up = _obj(job["upstream"], here, {"port", "rank"}, set())
        upstream = UpstreamPort(
            _int(up["port"], here / "port", 1, len(ports)), _int(up["rank"], here / "rank", 0, 31)
        )
        if upstream.port in workers:
            raise (here / "port").error("is a worker of the job")
    least = 0 if sharing is not None and sharing.behind is None else 1
    slot_count = _int(job["slot_count"], at / "slot_count", least, SOFT_SLOTS)
    msg_packets = None
    if "roce" in job:
        r = _obj(job["roce"], at / "roce", {"msg_packets"}, set())
        msg_packets = _int(r["msg_packets"], at / "roce" / "msg_packets", 1, 32)
        if msg_packets & (msg_packets - 1) or slot_count % msg_packets or upstream:
            raise (at / "roce").error("msg_packets: a power of two dividing slot_count, "
                                      "and no upstream")  # fmt: skip
    return Job(_int(job["job_id"], at / "job_id", 0, 0xFFFF), slot_count, workers, upstream,
               msg_packets, sharing)  # fmt: skip


def _drops(value: Any, at: _Where) -> tuple[float, float]:
    d = _obj(value, at, {"ingress", "egress"}, set())
    # Only 0 and 1: at other probabilities each target draws from its own random stream.
    for name in ("ingress", "egress"):
        if d[name] not in (0, 1) or isinstance(d[name], bool):
            raise (at / name).error("must be 0 or 1 (other rates are target-specific)")
    return float(d["ingress"]), float(d["egress"])


def _step(value: Any, at: _Where, index: int, ctx: _Ctx) -> Step:
    kinds = {"send", "send_raw", "expect", "expect_none", "expect_counters", "set_drops"}
    s = _obj(value, at, set(), kinds | {"comment"})
    keys = sorted(s.keys() & kinds)
    if len(keys) != 1:
        raise at.error(f"needs exactly one of {', '.join(sorted(kinds))}")
    kind = keys[0]
    body, here = s[kind], at / kind
    if kind == "send":
        return Step(index, "send", sends=(_send(body, here, ctx, raw=False),))
    if kind == "send_raw":
        return Step(index, "send", sends=(_send(body, here, ctx, raw=True),))
    if kind == "expect":
        items = _list(body, here, 1)
        return Step(
            index, kind, expected=tuple(_expect(e, here / i, ctx) for i, e in enumerate(items))
        )
    if kind == "expect_none":
        e = _obj(body, here, set(), {"ports", "timeout"})
        ports = tuple(
            _port(p, here / "ports" / i, ctx) for i, p in enumerate(e.get("ports", ctx.ports))
        )
        timeout = e.get("timeout", 0.2)
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 5:
            raise (here / "timeout").error("must be a number of seconds in (0, 5]")
        return Step(index, kind, ports=ports, timeout=float(timeout))
    if kind == "expect_counters":
        c = _obj(body, here, set(), set(COUNTERS) | ctx.job_counters)
        return Step(index, kind, counters={k: _int(v, here / k, 0, 2**31) for k, v in c.items()})
    return Step(index, kind, drops=_drops(body, here))


def _port(value: Any, at: _Where, ctx: _Ctx) -> int:
    return _int(value, at, 1, len(ctx.ports))


def _forward(value: Any, at: _Where, ctx: _Ctx) -> Forward:
    # Plain UDP between ports is L2/L3 forwarding: the soft switch has no such path.
    if "soft" in ctx.targets:
        raise at.error('needs the vector to declare "targets" without "soft"')
    f = _obj(value, at, {"port", "udp_dport"}, set())
    return Forward(
        _port(f["port"], at / "port", ctx), _int(f["udp_dport"], at / "udp_dport", 1, 0xFFFF)
    )


def _send(value: Any, at: _Where, ctx: _Ctx, raw: bool) -> Send:
    if not raw and isinstance(value, dict) and "roce" in value:
        return _roce_send(value, at, ctx)
    if raw:
        s = _obj(value, at, {"port", "hex"}, {"to"})
        payload = _hex(s["hex"], at / "hex")
    else:
        s = _obj(value, at, {"port", "ina"}, {"lanes"})
        fields = _header(s["ina"], at / "ina", ctx, PacketType.DATA, {"job_id", "rank", "seq"})
        payload = pack(fields) + _lanes(s.get("lanes", []), at / "lanes", ctx)
    to = _forward(s["to"], at / "to", ctx) if "to" in s else None
    return Send(_port(s["port"], at / "port", ctx), payload, to)


def _expect(value: Any, at: _Where, ctx: _Ctx) -> Expected:
    if isinstance(value, dict) and "hex" in value:
        e = _obj(value, at, {"port", "hex"}, {"from"})
        origin = _forward(e["from"], at / "from", ctx) if "from" in e else None
        return Expected(
            _port(e["port"], at / "port", ctx),
            _hex(e["hex"], at / "hex"),
            frozenset(),
            True,
            origin,
        )
    if isinstance(value, dict) and "roce" in value:
        return _roce_expect(value, at, ctx)
    e = _obj(value, at, {"port", "ina"}, {"lanes", "mask"})
    mask = _list(e.get("mask", []), at / "mask")
    if bad := sorted(set(mask) - MASKABLE):
        raise (at / "mask").error(
            f"unknown field(s) {', '.join(bad)}; maskable: {sorted(MASKABLE)}"
        )
    fields = _header(e["ina"], at / "ina", ctx, PacketType.RESULT, {"job_id", "seq"})
    payload = pack(fields) + _lanes(e.get("lanes", []), at / "lanes", ctx)
    return Expected(_port(e["port"], at / "port", ctx), payload, frozenset(mask), False)


_ROCE_SEND = ({"job_id", "opcode", "psn", "seq"},
              {"position", "exponent", "set", "slot", "qpn", "rkey", "dma_length", "icrc",
               "truncate"})
_ROCE_EXPECT = ({"job_id", "opcode", "seq"}, {"position", "exponent", "place"})


def _roce_fields(value: Any, at: _Where, ctx: _Ctx, keys: tuple[set[str], set[str]]) -> tuple[
    dict[str, Any], dict[str, Any], RoceJob
]:  # fmt: skip
    s = _obj(value, at, {"port", "roce"}, {"lanes", "mask"})
    r = _obj(s["roce"], at / "roce", *keys)
    job = ctx.roce.get(r["job_id"])
    if job is None:
        raise (at / "roce" / "job_id").error("names no job with a \"roce\" entry")
    port = _port(s["port"], at / "port", ctx)
    if port not in job.workers and "qpn" not in r:
        raise (at / "port").error('is not a worker of the job (give "qpn" to send as one)')
    if r["opcode"] not in OPCODES:
        raise (at / "roce" / "opcode").error(f"must be one of {', '.join(OPCODES)}")
    for name in ("psn", "seq", "exponent", "position", "place", "qpn", "rkey", "slot"):
        if name in r:
            lo = -128 if name == "exponent" else 0
            r[name] = _int(r[name], at / "roce" / name, lo, 0xFFFFFFFF)
    if r.get("icrc", "good") not in ("good", "bad"):
        raise (at / "roce" / "icrc").error('must be "good" or "bad"')
    return s, {**r, "port": port}, job


def _roce_send(value: Any, at: _Where, ctx: _Ctx) -> Send:
    s, r, job = _roce_fields(value, at, ctx, _ROCE_SEND)
    lanes = _lanes(s.get("lanes", []), at / "lanes", ctx)
    payload = request_frame(r, job, ctx.qpns, lanes)
    cut = None
    if "truncate" in r:
        cut = _int(r["truncate"], at / "roce" / "truncate", 0, len(payload) - 1)
    return Send(r["port"], payload, ROCE, r.get("icrc", "good"), cut)


def _roce_expect(value: Any, at: _Where, ctx: _Ctx) -> Expected:
    s, r, job = _roce_fields(value, at, ctx, _ROCE_EXPECT)
    mask = frozenset(_list(s.get("mask", []), at / "mask"))
    payload = reply_frame(r, job, _lanes(s.get("lanes", []), at / "lanes", ctx))
    return Expected(r["port"], payload, mask, False, ROCE, roce=True)


def _header(
    value: Any, at: _Where, ctx: _Ctx, ptype: PacketType, required: set[str]
) -> dict[str, int]:
    h = _obj(value, at, required, set(HEADER_FIELDS))
    fields = {
        "version": PROTOCOL_VERSION, "ptype": int(ptype), "flags": 0, "rank": 0,
        "exponent": EXPONENT_MIN, "num_lanes": ctx.lanes, "set": 0, "slot": 0, "reserved": 0,
    }  # fmt: skip
    for name, v in h.items():
        if name == "ptype" and isinstance(v, str):
            if v not in PacketType.__members__:
                raise (at / name).error(
                    f"must be one of {', '.join(PacketType.__members__)} or 0..15"
                )
            v = int(PacketType[v])
        fields[name] = _int(v, at / name, *HEADER_FIELDS[name])
    return fields


def _lanes(value: Any, at: _Where, ctx: _Ctx) -> bytes:
    """Lanes as big-endian int32: a list zero-padded to the switch's lanes, or
    ``{"fill": v}`` / ``{"range": [a, b]}`` (a, a+1, ..., b-1, zero-padded); the object
    forms take ``"count"`` for a payload of another number of lanes (bad_lanes/length)."""
    count = ctx.lanes
    if isinstance(value, list):
        values = value
    else:
        spec = _obj(value, at, set(), {"fill", "range", "count"})
        if len(spec.keys() & {"fill", "range"}) != 1:
            raise at.error('needs exactly one of "fill", "range"')
        count = _int(spec.get("count", count), at / "count", 0, 4096)
        if "fill" in spec:
            values = [spec["fill"]] * count
        else:
            lo, hi = _list(spec["range"], at / "range", 2)[:2]
            values = list(
                range(_int(lo, at / "range" / 0, *INT32), _int(hi, at / "range" / 1, *INT32))
            )
    if len(values) > count:
        raise at.error(f"{len(values)} lanes, more than {count}")
    ints = [_int(v, at / i, *INT32) for i, v in enumerate(values)]
    ints += [0] * (count - len(ints))
    return b"".join(v.to_bytes(4, "big", signed=True) for v in ints)


def _hex(value: Any, at: _Where) -> bytes:
    try:
        return bytes.fromhex(value)
    except (TypeError, ValueError):
        raise at.error("must be a string of hex digits (spaces allowed)") from None


# --------------------------------------------------------------------- INA header bytes
def pack(f: dict[str, int]) -> bytes:
    """The 16 header bytes of ``f`` (vector field names), without validity checks: vectors
    need invalid versions, types and reserved bits on the wire."""
    pool_index = f["slot"] | (POOL_SET_BIT if f["set"] else 0)
    return HEADER.pack(
        (f["version"] << 4) | f["ptype"], f["flags"], f["job_id"], f["rank"], f["exponent"],
        f["num_lanes"], pool_index, f["reserved"], f["seq"],
    )  # fmt: skip


def unpack(data: bytes) -> dict[str, int]:
    """Header fields of ``data`` by vector names (``data`` holds at least 16 bytes)."""
    vt, flags, job_id, rank, exponent, lanes, pidx, reserved, seq = HEADER.unpack_from(data)
    return {
        "version": vt >> 4, "ptype": vt & 0x0F, "flags": flags, "job_id": job_id, "rank": rank,
        "exponent": exponent, "num_lanes": lanes, "set": 1 if pidx & POOL_SET_BIT else 0,
        "slot": pidx & SLOT_MASK, "reserved": reserved, "seq": seq,
    }  # fmt: skip


def mismatches(expected: Expected, got: bytes) -> list[str]:
    """How ``got`` differs from ``expected`` outside its mask (empty: it matches)."""
    if expected.raw:
        return [] if got == expected.payload else [f"bytes {got.hex()} != {expected.payload.hex()}"]
    if len(got) < HEADER_SIZE:
        return [f"{len(got)} bytes, shorter than the INA header"]
    want, have = unpack(expected.payload), unpack(got)
    out = [
        f"{k}: expected {want[k]}, got {have[k]}"
        for k in want
        if k not in expected.mask and want[k] != have[k]
    ]
    if "lanes" not in expected.mask:
        w, g = expected.payload[HEADER_SIZE:], got[HEADER_SIZE:]
        if len(w) != len(g):
            out.append(f"payload: expected {len(w)} bytes, got {len(g)}")
        elif diff := [i for i in range(0, len(w), 4) if w[i : i + 4] != g[i : i + 4]]:
            lane = [(i // 4, _i32(w, i), _i32(g, i)) for i in diff[:4]]
            out.append(f"{len(diff)} lane(s) differ (lane, expected, got): {lane}")
    return out


def _i32(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 4], "big", signed=True)


# --------------------------------------------------------------------- targets
class Received(NamedTuple):
    payload: bytes
    origin: Forward | None  # None: from the switch's INA endpoint


class Target(Protocol):
    """A switch under test with its ports; one vector at a time.

    Targets raise :class:`TargetUnavailable` from :meth:`configure` when they cannot run on
    this machine, and :class:`VectorFailure` when the switch misbehaves in a way only they
    can see (a packet from the wrong source, a counter that never settles).
    """

    name: str
    roce_icrc: bool
    """Whether the switch computes the ICRC of its RoCEv2 replies (a P4 target's is 0)."""

    def configure(self, vector: Vector, run_dir: Path) -> None:
        """Start a fresh switch with the vector's ports, jobs and drop settings."""

    def roce_ips(self, port: int) -> tuple[str, str]:
        """(the port's IPv4, the switch's) on RoCEv2 frames between them."""

    def send(self, port: int, payload: bytes, to: Forward | None) -> None:
        """Send ``payload`` from ``port``: INA to the switch, or plain UDP ``to`` a port."""

    def recv(self, port: int, timeout: float) -> Received | None:
        """The next datagram ``port`` received within ``timeout`` seconds, or None."""

    def set_drops(self, ingress: float, egress: float) -> None:
        """Set the drop simulator's probabilities (0 or 1)."""

    def counters(self) -> dict[str, int]:
        """The switch's counters by protocol name, once it processed all that was sent."""

    def close(self) -> None:
        """Stop the switch and release the ports; idempotent."""


class SoftSwitchTarget:
    """The soft switch as a real process; each port is a UDP socket on 127.0.0.1.

    The port's identity on this target is its socket's address, which is what the job
    table binds ranks to; results must come from the switch's data address.
    """

    name = "soft"
    roce_icrc = True
    _SETTLE_SECONDS = 5.0

    def __init__(self) -> None:
        self._switch: SoftSwitchProcess | None = None
        self._ctl: SwitchController | None = None
        self._socks: dict[int, socket.socket] = {}
        self._sent = 0
        self._jobs: tuple[Job, ...] = ()

    def configure(self, vector: Vector, run_dir: Path) -> None:
        if vector.roce:
            raise TargetUnavailable(
                "RoCEv2 binds a rank to an address at UDP 4791: the ports here share "
                "127.0.0.1 (the port targets run RoCEv2 vectors)"
            )
        self._switch = SoftSwitchProcess(
            run_dir, name=f"switch-{vector.name}", lanes=vector.lanes, slots=SOFT_SLOTS
        ).start()
        for port in vector.ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            self._socks[port] = sock
        # Configured as bmv2 is: P4Runtime writes from the controller.
        self._ctl = ctl = self._switch.controller()
        ctl.set_drops(*vector.drops)
        self._jobs = vector.jobs
        for job in vector.jobs:
            if sharing_steps.install(ctl, job, self._address):
                continue
            addrs = [WorkerAddress(*self._socks[p].getsockname()) for p in job.workers]
            upstream = None
            if job.upstream is not None:  # the port's socket plays the upstream switch
                up = WorkerAddress(*self._socks[job.upstream.port].getsockname())
                upstream = (job.upstream.rank, up)
            ctl.add_job(job.job_id, addrs, job.slot_count, upstream=upstream)

    def _address(self, port: int) -> WorkerAddress:
        return WorkerAddress(*self._socks[port].getsockname())

    def roce_ips(self, port: int) -> tuple[str, str]:
        raise TargetUnavailable("no RoCEv2 on this target (configure says why)")

    def send(self, port: int, payload: bytes, to: Forward | None) -> None:
        if to is not None:
            raise TargetUnavailable("the soft switch forwards no plain UDP between ports")
        self._socks[port].sendto(payload, self._require_switch().data_addr)
        self._sent += 1

    def recv(self, port: int, timeout: float) -> Received | None:
        sock = self._socks[port]
        sock.settimeout(timeout) if timeout > 0 else sock.setblocking(False)
        try:
            data, src = sock.recvfrom(65536)
        except (TimeoutError, BlockingIOError):
            return None
        if src != self._require_switch().data_addr:
            raise VectorFailure(f"port {port} received a datagram from {src}, not the switch")
        return Received(data, None)

    def set_drops(self, ingress: float, egress: float) -> None:
        self.counters()  # settle: the new rates must not reach datagrams sent before
        self._require_ctl().set_drops(ingress, egress)

    def counters(self) -> dict[str, int]:
        # Settle first: a control request may overtake datagrams still queued at the switch.
        deadline = time.monotonic() + self._SETTLE_SECONDS
        ctl = self._require_ctl()
        while (c := ctl.counters())["received"] < self._sent:
            if time.monotonic() > deadline:
                raise VectorFailure(f"switch received {c['received']} of {self._sent} datagrams")
            time.sleep(0.005)
        return {k: v for k, v in c.items() if k in COUNTERS} | sharing_steps.job_counters(
            ctl, self._jobs
        )

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._switch is not None:
            code = self._switch.stop()
            log_path, self._switch = self._switch.log_path, None
            if code != 0:
                raise VectorFailure(f"soft switch exited with status {code}; log {log_path}")

    def _require_ctl(self) -> SwitchController:
        if self._ctl is None:
            raise RuntimeError("target not configured")
        return self._ctl

    def _require_switch(self) -> SoftSwitchProcess:
        if self._switch is None:
            raise RuntimeError("target not configured")
        return self._switch


# --------------------------------------------------------------------- running
def run_vector(vector: Vector, target: Target, run_dir: Path | None = None) -> None:
    """Play ``vector`` against ``target``: configure, run every step, close.

    Raises:
        TargetUnavailable: the target cannot run this vector here (a skip, not a failure).
        VectorFailure: a step's expectation does not hold; names the file and step.
    """
    if target.name not in vector.targets:
        raise TargetUnavailable(f"{vector.path.name} runs only on {', '.join(vector.targets)}")
    with tempfile.TemporaryDirectory(prefix="inalab-vectors-") as tmp:
        try:
            target.configure(vector, run_dir or Path(tmp))
            baseline = target.counters()
            for step in vector.steps:
                baseline = _STEPS[step.kind](step, target, baseline, vector)
        finally:
            target.close()


def _fail(vector: Vector, step: Step, message: str) -> VectorFailure:
    return VectorFailure(f"{vector.path.name}: steps[{step.index}] ({step.kind}): {message}")


_Counters = dict[str, int]


def _do_send(step: Step, target: Target, baseline: _Counters, vector: Vector) -> _Counters:
    for s in step.sends:
        payload = s.payload
        if s.icrc is not None:
            payload = seal(payload, *target.roce_ips(s.port), s.icrc)
        if s.truncate is not None:
            payload = payload[: s.truncate]
        target.send(s.port, payload, s.to)
    return baseline


def _do_expect(step: Step, target: Target, baseline: _Counters, vector: Vector) -> _Counters:
    by_port: dict[int, list[Expected]] = {}
    for e in step.expected:
        by_port.setdefault(e.port, []).append(e)
    for port, wanted in sorted(by_port.items()):
        for n, e in enumerate(wanted):
            got = target.recv(port, DEFAULT_RECV_TIMEOUT)
            if got is None:
                raise _fail(vector, step, f"port {port}: packet {n} did not arrive")
            if e.roce:
                ok = None
                if target.roce_icrc:
                    here, switch = target.roce_ips(port)
                    ok = rocev2.icrc_ok(switch, here, ROCE_UDP_PORT, got.payload)
                problems = frame_mismatches(e.payload, got.payload, e.mask, ok)
            else:
                problems = mismatches(e, got.payload)
            if got.origin != e.origin:
                problems.append(f"from {got.origin}, expected from {e.origin or 'the switch'}")
            if problems:
                raise _fail(vector, step, f"port {port} packet {n}: " + "; ".join(problems))
    # verify-no-other, for what has already arrived: expect_none waits longer.
    _none_arrived(step, target, vector, vector.ports, 0.0)
    return baseline


def _do_expect_none(step: Step, target: Target, baseline: _Counters, vector: Vector) -> _Counters:
    _none_arrived(step, target, vector, step.ports, step.timeout)
    return baseline


def _none_arrived(
    step: Step, target: Target, vector: Vector, ports: tuple[int, ...], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    for port in ports:
        got = target.recv(port, max(0.0, deadline - time.monotonic()))
        if got is not None:
            head: object = unpack(got.payload) if len(got.payload) >= HEADER_SIZE else {}
            if got.origin == ROCE:
                head = rocev2.parse_frame(got.payload)
            raise _fail(
                vector,
                step,
                f"port {port} received an unexpected packet {head or got.payload.hex()}",
            )


def _do_counters(step: Step, target: Target, baseline: _Counters, vector: Vector) -> _Counters:
    now = target.counters()
    delta = {k: now.get(k, 0) - baseline.get(k, 0) for k in COUNTERS | step.counters.keys()}
    want = {k: 0 for k in STRICT_COUNTERS} | step.counters
    if wrong := {k: (v, delta[k]) for k, v in sorted(want.items()) if delta[k] != v}:
        detail = ", ".join(f"{k}: expected +{v}, got +{d}" for k, (v, d) in wrong.items())
        raise _fail(vector, step, detail)
    return now


def _do_set_drops(step: Step, target: Target, baseline: _Counters, vector: Vector) -> _Counters:
    target.set_drops(*step.drops)
    return baseline


_STEPS: dict[str, Callable[[Step, Target, _Counters, Vector], _Counters]] = {
    "send": _do_send,
    "expect": _do_expect,
    "expect_none": _do_expect_none,
    "expect_counters": _do_counters,
    "set_drops": _do_set_drops,
}
