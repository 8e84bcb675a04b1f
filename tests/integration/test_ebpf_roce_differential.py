"""The eBPF program's RoCEv2 path against the soft switch's reference, frame by frame.

The same job is installed on a :class:`~emulation.softswitch.pipeline.Pipeline` with its
:class:`~emulation.softswitch.roce.RoceFront` and on an ``EbpfDataplane(roce=True)``;
the same frames go to both (the program through the kernel's test runner): clean
messages and retransmissions, and the cases the vectors lack: truncated frames, opcodes
that are not a UC WRITE, a transport version, bad ICRCs, foreign queue pairs and PSNs,
too many packets in a message, short and long payloads, slots outside the job. After
every frame the counters must agree, and where the reference replies, the program's last
reply (left in the frame: its port has no interface) must be the reference's last,
byte for byte, ICRC included. Marked ``ebpf`` (root, clang, libbpf).
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Callable, Iterator

import pytest

from emulation.softswitch.ebpf.dataplane import EbpfDataplane
from emulation.softswitch.pipeline import Pipeline
from emulation.softswitch.roce import RoceFront
from emulation.softswitch.roce_tables import RoceReply, RoceRequest
from hostlib import rocev2
from hostlib.protocol import ROCE_UDP_PORT, SWITCH_DROPS, SWITCH_STATS, RoceOpcode

pytestmark = [pytest.mark.ebpf, pytest.mark.root]

LANES, SLOTS, JOB, WORKERS, M = 64, 8, 9, 3, 2
WINDOW = SLOTS // M
SWITCH_IP = "10.0.0.254"
QPN_BASE = 0x800000
COMPARED = (*SWITCH_STATS, *(f"drop_{r}" for r in SWITCH_DROPS))


def _ip(rank: int) -> str:
    return f"10.0.0.{rank + 1}"


def _install(p: Pipeline) -> None:
    """The job, its workers at (IPv4, 4791), and per rank and window position both queue
    pairs, as controller/roce.py installs them."""
    p.set_group(1, [(2, rank) for rank in range(WORKERS)])
    p.insert_job(JOB, WORKERS, 0, SLOTS, 1)
    p.roce.set_job(JOB, M)
    for rank in range(WORKERS):
        p.insert_worker(JOB, rank, (_ip(rank), ROCE_UDP_PORT))
        p.set_replica(JOB, rank, 2, (_ip(rank), ROCE_UDP_PORT))
        for pos in range(WINDOW):
            reg = rank * WINDOW + pos
            p.roce.set_request(QPN_BASE + reg, RoceRequest(JOB, rank, reg, _ip(rank)))
            reply = RoceReply(0x100 + reg, 0xA000 + rank, (rank << 32) + pos * 512, reg)
            p.roce.set_reply(JOB, rank, pos, reply)
            p.roce.set_reply_psn(reg, 0xFFFFF0 + reg)  # near the wrap: it must wrap alike


@pytest.fixture
def planes() -> Iterator[tuple[RoceFront, EbpfDataplane]]:
    ref = Pipeline(LANES, SLOTS)
    _install(ref)
    dp = EbpfDataplane(LANES, SLOTS, roce=True)
    try:
        dp.set_port(1, 1)  # the test runner's frames arrive on loopback: port 1
        _install(dp)
        yield RoceFront(ref, SWITCH_IP), dp
    finally:
        dp.close()


def _frame(rank: int, sport: int, payload: bytes) -> bytes:
    """Ethernet/IPv4/UDP around ``payload`` (the UDP length is the payload's)."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(_ip(rank)), socket.inet_aton(SWITCH_IP))  # fmt: skip
    udp = struct.pack("!HHHH", sport, ROCE_UDP_PORT, 8 + len(payload), 0)
    return bytes.fromhex("0200000000fe02000000010" + f"{rank}") + b"\x08\x00" + ip + udp + payload


class Worker:
    """Rank ``rank``'s queue pairs: the next PSN of each, and the frames of a message."""

    def __init__(self, rank: int, rng: random.Random) -> None:
        self.rank, self.rng = rank, rng
        self.psn = [rng.randrange(1 << 24) for _ in range(WINDOW)]

    def message(self, pos: int, seq: int, pool_set: int) -> list[rocev2.RoceFrame]:
        lanes = [self.rng.randbytes(4 * LANES) for _ in range(M)]
        exponent = self.rng.randrange(-128, 128)
        va = rocev2.pack_request_va(seq, exponent)
        rkey = (0x8000 if pool_set else 0) | pos * M
        frames = []
        for place in range(M):
            op, qpn = rocev2.message_opcode(place, M), QPN_BASE + self.rank * WINDOW + pos
            imm = rocev2.pack_imm(seq, exponent)
            frames.append(rocev2.RoceFrame(op, qpn, self.psn[pos], lanes[place], va, rkey,
                                           M * 4 * LANES, imm))  # fmt: skip
            self.psn[pos] = rocev2.psn_add(self.psn[pos], 1)
        return frames


def _sealed(frame: rocev2.RoceFrame, rank: int, sport: int) -> bytes:
    return rocev2.build_frame(frame, _ip(rank), SWITCH_IP, sport)


def _reseal(body: bytes, rank: int, sport: int) -> bytes:
    """``body`` (ICRC included) with the ICRC its content gives."""
    crc = rocev2.icrc(_ip(rank), SWITCH_IP, sport, body[:-4])
    return body[:-4] + crc.to_bytes(4, "little")


def _mutations(rng: random.Random) -> list[Callable[[bytes, int, int], bytes]]:
    """Ways to spoil a sealed UDP payload (body, rank, sport) -> body."""

    def truncate(b: bytes, rank: int, sport: int) -> bytes:
        return b[: rng.randrange(0, 40)]

    def opcode(b: bytes, rank: int, sport: int) -> bytes:
        op = rng.choice([0x04, 0x0A, 0x25, 0x2C, 0x64, rng.randrange(256)])
        return _reseal(bytes([op]) + b[1:], rank, sport)

    def version(b: bytes, rank: int, sport: int) -> bytes:
        return _reseal(b[:1] + bytes([rng.choice([0x01, 0x10, 0x30, 0x0F])]) + b[2:], rank, sport)

    def icrc(b: bytes, rank: int, sport: int) -> bytes:
        return b[:-1] + bytes([b[-1] ^ 0x40])

    def qpn(b: bytes, rank: int, sport: int) -> bytes:
        q = rng.choice([QPN_BASE + WORKERS * WINDOW, 5, QPN_BASE + rng.randrange(WORKERS * WINDOW)])
        return _reseal(b[:5] + q.to_bytes(3, "big") + b[8:], rank, sport)

    def psn(b: bytes, rank: int, sport: int) -> bytes:
        return _reseal(b[:9] + rng.randbytes(3) + b[12:], rank, sport)

    def short(b: bytes, rank: int, sport: int) -> bytes:
        return _reseal(b[:-8] + b[-4:], rank, sport)

    def long(b: bytes, rank: int, sport: int) -> bytes:
        return _reseal(b[:-4] + rng.randbytes(4) + b[-4:], rank, sport)

    def rkey(b: bytes, rank: int, sport: int) -> bytes:
        if b[0] not in (RoceOpcode.UC_WRITE_FIRST, RoceOpcode.UC_WRITE_ONLY_IMM):
            return b
        key = rng.choice([1, 2 * SLOTS, 0x10000, 0x8000 | rng.randrange(SLOTS + 4)])
        return _reseal(b[:20] + key.to_bytes(4, "big") + b[24:], rank, sport)

    return [truncate, opcode, version, icrc, qpn, psn, short, long, rkey]


def _check(front: RoceFront, dp: EbpfDataplane, frame: bytes, rank: int, sport: int,
           step: int) -> None:  # fmt: skip
    payload = frame[42:]
    sends = front.process(memoryview(payload), (_ip(rank), sport), SWITCH_IP)
    run = dp.run(frame)
    want = {k: v for k, v in front.pipeline.counters().items() if k in COMPARED}
    got = {k: v for k, v in dp.counters().items() if k in COMPARED}
    assert got == want, f"step {step}: counters differ: {set(want.items()) ^ set(got.items())}"
    if sends:
        out = run.data_out
        udp_len = struct.unpack_from("!H", out, 38)[0]
        assert out[42 : 34 + udp_len] == sends[-1].payload, f"step {step}: the last reply"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_program_counts_and_answers_as_the_reference(
    planes: tuple[RoceFront, EbpfDataplane], seed: int
) -> None:
    front, dp = planes
    rng = random.Random(seed)
    workers = [Worker(rank, rng) for rank in range(WORKERS)]
    mutations = _mutations(rng)
    step = 0
    for use in range(24):
        pos, pool_set = use % WINDOW, (use // WINDOW) % 2
        seq = use + 1
        messages = {w.rank: w.message(pos, seq, pool_set) for w in workers}
        sends = [(r, f) for r, frames in messages.items() for f in frames]
        sends += rng.sample(sends, k=rng.randrange(3))  # duplicates, late
        for rank, frame in sends:
            sport = rng.choice([ROCE_UDP_PORT, 49152 + rng.randrange(1000)])
            body = _sealed(frame, rank, sport)
            if rng.random() < 0.3:
                spoilt = rng.choice(mutations)(body, rank, sport)
                _check(front, dp, _frame(rank, sport, spoilt), rank, sport, step)
                step += 1
            _check(front, dp, _frame(rank, sport, body), rank, sport, step)
            step += 1
    counters = dp.counters()
    assert counters["completed"] > 0 and counters["drop_bad_icrc"] > 0, counters


def test_replies_dropped_at_egress_leave_the_same_psn_gap(
    planes: tuple[RoceFront, EbpfDataplane],
) -> None:
    front, dp = planes
    rng = random.Random(7)
    workers = [Worker(rank, rng) for rank in range(WORKERS)]
    step = 0
    for use, egress in enumerate((1.0, 0.0, 1.0, 0.0)):  # PSNs taken, then the gap seen
        for plane in (front.pipeline, dp):
            plane.set_drop_rates(egress=egress)
        for w in workers:
            for frame in w.message(0, use + 1, use % 2):  # one position: one PSN register
                _check(front, dp, _frame(w.rank, ROCE_UDP_PORT, _sealed(frame, w.rank,
                       ROCE_UDP_PORT)), w.rank, ROCE_UDP_PORT, step)  # fmt: skip
                step += 1
    counters = dp.counters()
    assert counters["drop_sim_egress"] == 2 * M * WORKERS and counters["results_sent"] > 0
