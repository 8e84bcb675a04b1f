"""The eBPF program's sharing (``sharing.bpf.h``) against the soft switch's reference,
packet by packet.

The same jobs are installed on a :class:`~emulation.softswitch.pipeline.Pipeline` and on
an :class:`~emulation.softswitch.ebpf.dataplane.EbpfDataplane`, and the same frames go
to both (the program through the kernel's test runner): two jobs over one shared region
(collisions, slots past it, a job without a fallback for a while), a job of reserved
slots served behind a switch, and on a one-armed server the jobs of a fallback
aggregator; uses that start, finish, are taken over and go stale; retransmissions that
would start a use or were counted already; the fallback's RESULTs and forged ones; a job
removed (its owner cells freed) and installed again, counters reset. After every frame
the statistics and the per-job counters must agree; where the reference emits, the
program's frame (left in the test run's output) must carry the same INA packet, and a
packet passed on to the fallback the fallback's addresses; every few frames the owner
cells and the slots' registers must agree. Marked ``ebpf`` (root, clang, libbpf).
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from emulation.softswitch.ebpf.dataplane import EbpfDataplane
from emulation.softswitch.fallback import install_behind
from emulation.softswitch.pipeline import Addr, JobConfig, Pipeline, RegisterCell
from emulation.softswitch.sharing import Fallback, SharedEntry
from hostlib.protocol import (
    FLAG_RESEND,
    HEADER,
    INA_UDP_PORT,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    SWITCH_DROPS,
    SWITCH_STATS,
    PacketType,
)

pytestmark = [pytest.mark.ebpf, pytest.mark.root]

LANES, SLOTS = 64, 64
SWITCH: Addr = ("10.0.0.254", INA_UDP_PORT)
SWITCH_MAC = bytes.fromhex("0200000000fe")
FALLBACK: Addr = ("10.0.9.9", INA_UDP_PORT)
FALLBACK_MAC = 0x020000000909
PORT = 1
"""The switch port the test runner's frames arrive on (loopback): the fallback's egress
port too, so a packet passed on there is rewritten and left in the run's output."""
REGION = (32, 4)  # base, size
COMPARED = (*SWITCH_STATS, *(f"drop_{r}" for r in SWITCH_DROPS))
DATA = (PROTOCOL_VERSION << 4) | PacketType.DATA
RESULT = (PROTOCOL_VERSION << 4) | PacketType.RESULT
TC_ACT_REDIRECT = 7


@dataclass
class JobPlan:
    """A job of the sequence: its workers, reservation, shared slots and window."""

    job_id: int
    workers: tuple[Addr, ...]
    reserved: int
    shared: int = 0
    offset: int = 0
    fallback: bool = False
    behind: bool = False
    stats: int = 0
    seq: dict[int, int] = field(default_factory=dict)  # job slot -> its current seq

    @property
    def window(self) -> int:
        return self.reserved + self.shared + 2  # two slots past the region


def _install(p: Pipeline, job: JobPlan) -> None:
    """The job as the controller installs it: jobs, workers, replicas, group, then its
    sharing entries."""
    p.add_job(JobConfig(job.job_id, job.workers, job.reserved))
    if job.shared:
        p.set_shared(job.job_id, SharedEntry(job.shared, *REGION, job.offset, job.stats))
    if job.fallback:
        p.set_fallback(job.job_id, Fallback(FALLBACK, FALLBACK_MAC, PORT, job.stats + 1))
    if job.behind:
        p.set_behind(job.job_id)


def _frame(src: Addr, dst: Addr, payload: bytes) -> bytes:
    """Ethernet/IPv4/UDP from ``src`` to ``dst`` (the switch's MAC) around ``payload``."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))  # fmt: skip
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0)
    return SWITCH_MAC + bytes.fromhex("020000000101") + b"\x08\x00" + ip + udp + payload


def _packet(vt: int, job: int, rank: int, slot: int, seq: int, flags: int,
            values: list[int], lanes: int = LANES, exponent: int = 0) -> bytes:  # fmt: skip
    pidx = (POOL_SET_BIT if seq & 1 else 0) | slot
    header = HEADER.pack(vt, flags, job, rank, exponent, lanes, pidx, 0, seq)
    return header + struct.pack(f"!{len(values)}i", *values)


class Planes:
    """The reference and the program, fed alike and compared."""

    def __init__(self, ref: Pipeline, dp: EbpfDataplane, dst: Addr) -> None:
        self.ref, self.dp, self.dst = ref, dp, dst
        self.step = 0
        self.jobs: list[JobPlan] = []

    @property
    def both(self) -> tuple[Pipeline, EbpfDataplane]:
        """The two, for the same control-plane call on each."""
        return self.ref, self.dp

    def send(self, src: Addr, payload: bytes) -> None:
        self.step += 1
        emit = self.ref.process(memoryview(payload), src)
        want = None if emit is None else (bytes(emit.payload), tuple(emit.dests), emit.links)
        run = self.dp.run(_frame(src, self.dst, payload))
        at = f"step {self.step}"
        ref_counts = {k: v for k, v in self.ref.counters().items() if k in COMPARED}
        got_counts = {k: v for k, v in self.dp.counters().items() if k in COMPARED}
        assert got_counts == ref_counts, (
            f"{at}: {set(ref_counts.items()) ^ set(got_counts.items())}"
        )
        for job in self.jobs:
            assert self.dp.job_counters(job.job_id) == self.ref.job_counters(job.job_id), (
                f"{at}: job {job.job_id}"
            )
        if want is None:
            return
        out = run.data_out
        udp_len = struct.unpack_from("!H", out, 38)[0]
        assert out[42 : 34 + udp_len] == want[0], f"{at}: the emitted packet"
        if want[1] == (FALLBACK,) and want[2] == ((PORT, FALLBACK_MAC),):
            assert run.retval == TC_ACT_REDIRECT, at
            assert out[:6] == FALLBACK_MAC.to_bytes(6, "big") and out[6:12] == SWITCH_MAC, at
            src_ip, dst_ip = socket.inet_ntoa(out[26:30]), socket.inet_ntoa(out[30:34])
            ports = struct.unpack_from("!HH", out, 34)
            assert (src_ip, ports[0]) == (self.dst[0], INA_UDP_PORT), at
            assert (dst_ip, ports[1]) == FALLBACK, at

    def check_registers(self) -> None:
        """Every owner cell of the region, and every register of the slots in use."""
        base, size = REGION
        owners = [RegisterCell("owner", x) for x in range(SLOTS)]
        assert self.dp.register_read(owners) == self.ref.register_read(owners), self.step
        used = sorted({*range(base, base + size), *range(8)})
        cells = [
            RegisterCell(array, pool_set * SLOTS + s)
            for s in used
            for pool_set in (0, 1)
            for array in ("seq", "remaining", "final", "exponent")
        ]
        cells += [RegisterCell(f"bitmap_set{k}", s) for s in used for k in (0, 1)]
        cells += [
            RegisterCell("values", pool_set * SLOTS + s, lane)
            for s in used
            for pool_set in (0, 1)
            for lane in (0, LANES - 1)
        ]
        assert self.dp.register_read(cells) == self.ref.register_read(cells), self.step


@pytest.fixture
def planes() -> Iterator[Planes]:
    ref = Pipeline(LANES, SLOTS)
    dp = EbpfDataplane(LANES, SLOTS)
    try:
        dp.set_port(PORT, 1)  # the test runner's frames arrive on loopback
        yield Planes(ref, dp, SWITCH)
    finally:
        dp.close()


def _values(rng: random.Random) -> list[int]:
    return [rng.randrange(-(1 << 31), 1 << 31) for _ in range(LANES)]


def _data(planes: Planes, rng: random.Random, job: JobPlan) -> None:
    """A DATA packet of ``job``: mostly the slot's current use; sometimes its next one
    (a use that starts, or takes a running one over), an older one (stale), a
    retransmission; the slot moves on now and then."""
    slot = rng.randrange(job.window)
    current = job.seq.setdefault(slot, 2 + slot)
    seq = current + rng.choice([0, 0, 0, 0, 0, 0, 2, 2, -2, 4])
    if seq <= 0:
        seq = current
    flags = FLAG_RESEND if rng.random() < 0.3 else 0
    rank = rng.randrange(len(job.workers))
    exponent = rng.randrange(-128, 128)
    packet = _packet(DATA, job.job_id, rank, slot, seq, flags, _values(rng), exponent=exponent)
    planes.send(job.workers[rank], packet)
    if rng.random() < 0.15:
        job.seq[slot] = current + 2  # the slot's set again: every worker had the last result


def _odd(planes: Planes, rng: random.Random, jobs: list[JobPlan]) -> None:
    """A RESULT (from the fallback or elsewhere) or a packet a check drops."""
    job = rng.choice(jobs)
    w = rng.randrange(len(job.workers))
    slot, seq = rng.randrange(job.window), rng.randrange(1, 40)
    kind = rng.randrange(8)
    if kind <= 2:  # the fallback's result, for a job with or without a fallback entry
        planes.send(FALLBACK, _packet(RESULT, job.job_id, 0, slot, seq, 0, _values(rng)))
    elif kind == 3:  # a result from a worker: bad_source where the job has a fallback
        planes.send(job.workers[w], _packet(RESULT, job.job_id, 0, slot, seq, 0, _values(rng)))
    elif kind == 4:  # the fallback's result with a wrong lane count or length
        lanes = rng.choice([LANES - 1, LANES])
        values = _values(rng)[: LANES - 1]
        planes.send(FALLBACK, _packet(RESULT, job.job_id, 0, slot, seq, 0, values, lanes))
    elif kind == 5:  # a DATA packet of one job from another job's worker
        other = rng.choice(jobs)
        planes.send(other.workers[0], _packet(DATA, job.job_id, 0, slot, seq, 0, _values(rng)))
    elif kind == 6:  # a DATA packet of a slot past the window, or with the wrong length
        big = rng.choice([job.window + rng.randrange(5), slot])
        values = _values(rng)[: LANES - (big == slot)]
        planes.send(job.workers[w], _packet(DATA, job.job_id, w, big, seq, 0, values))
    else:  # an unknown job, a rank out of range, the wrong lane count
        bad = rng.randrange(3)
        job_id, rank = (99, w) if bad == 0 else (job.job_id, len(job.workers) if bad == 1 else w)
        lanes = LANES - 1 if bad == 2 else LANES
        planes.send(job.workers[w], _packet(DATA, job_id, rank, slot, seq, 0, _values(rng), lanes))


def test_two_jobs_over_one_region_and_a_fallback_as_the_reference(planes: Planes) -> None:
    rng = random.Random(41)
    a = JobPlan(7, (("10.0.1.1", 5001), ("10.0.1.2", 5001), ("10.0.1.3", 5001)), 1, 4,
                offset=0, fallback=True, stats=1)  # fmt: skip
    b = JobPlan(8, (("10.0.2.1", 5002), ("10.0.2.2", 5002)), 0, 3, offset=2, fallback=True,
                stats=3)  # fmt: skip
    c = JobPlan(9, (("10.0.3.1", 5003), ("10.0.3.2", 5003)), 2, behind=True)
    jobs = [a, b, c]
    planes.jobs = jobs
    for p in planes.both:
        for job in jobs:
            _install(p, job)
    for step in range(1500):
        if rng.random() < 0.12:
            _odd(planes, rng, jobs)
        else:
            _data(planes, rng, rng.choice(jobs))
        if step % 25 == 0:
            planes.check_registers()
        for p in planes.both if step in (400, 550, 700, 900, 1100) else ():
            if step == 400:  # B without its fallback: its collisions, slots past it drop
                p.delete_sharing("fallback", b.job_id)
            elif step == 700:  # and with it again
                p.set_fallback(b.job_id, Fallback(FALLBACK, FALLBACK_MAC, PORT, b.stats + 1))
            elif step == 900:  # a controller's counter reset, and a cell it frees by hand
                p.set_stats_cell("collisions", range(8), 0)
                p.register_write(RegisterCell("owner", REGION[0] + 1), 0)
            else:  # A leaves (its cells cleared, then freed) and comes back
                p.remove_job(a.job_id)
                _install(p, a)
                a.seq.clear()
        if step in (550, 1100):
            planes.check_registers()
    planes.check_registers()
    counters = planes.dp.counters()
    moved = {k for k in COMPARED if counters[k]}
    assert {"completed", "retransmits_answered", "drop_stale", "drop_bad_slot",
            "drop_bad_source", "duplicates_ignored"} <= moved, moved  # fmt: skip
    for job in (a, b):
        got = planes.dp.job_counters(job.job_id)
        assert got["to_fallback"] and got["from_fallback"] and got["shared_uses"], (job, got)
    assert planes.dp.job_counters(b.job_id)["collisions"], planes.dp.job_counters(b.job_id)


@pytest.fixture
def one_armed() -> Iterator[Planes]:
    """A one-armed server at 10.0.0.9 (the fallback aggregator) and its reference."""
    ref = Pipeline(LANES, SLOTS)
    dp = EbpfDataplane(LANES, SLOTS, one_armed=FALLBACK[0])
    try:
        dp.set_port(0, 1)  # its NIC: the test runner's loopback
        yield Planes(ref, dp, FALLBACK)
    finally:
        dp.close()


def test_a_one_armed_fallback_aggregates_behind_a_switch_as_the_reference(
    one_armed: Planes,
) -> None:
    """Jobs installed behind the switch (fallback.install_behind): every rank's packets
    come from the switch's address, uses may be taken over, bitmaps start clear."""
    planes, rng = one_armed, random.Random(7)
    front = (SWITCH,) * 3
    jobs = [JobPlan(7, front, 7, behind=True), JobPlan(8, front[:2], 5, behind=True)]
    planes.jobs = jobs
    for p in planes.both:
        for job in jobs:
            install_behind(p, job.job_id, len(job.workers), job.reserved, SWITCH)
    for _ in range(800):
        job = rng.choice(jobs)
        slot = rng.randrange(job.reserved)
        current = job.seq.setdefault(slot, 2 + slot)
        seq = current + rng.choice([0, 0, 0, 0, 2, -2])
        rank = rng.randrange(len(job.workers))
        flags = FLAG_RESEND if rng.random() < 0.3 else 0
        planes.send(SWITCH, _packet(DATA, job.job_id, rank, slot, max(seq, 1), flags,
                                    _values(rng)))  # fmt: skip
        if rng.random() < 0.15:
            job.seq[slot] = current + 2
    planes.check_registers()
    counters = planes.dp.counters()
    assert counters["completed"] and counters["drop_stale"] and counters["no_route"] == 0
