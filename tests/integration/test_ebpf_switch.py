"""The eBPF data plane on real ports: faults, forged and fuzzed frames, two CPUs.

Every test runs the program in the kernel on veth pairs (``ports.veth_ports``), hosts
being raw sockets on the other ends (``ports.RawPortTransport``), so hostlib's own
session runs against the switch. Marked ``ebpf`` (root, clang, libbpf).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import expected, random_inputs
from ports import (
    SWITCH_IP,
    SWITCH_MAC,
    FaultyTransport,
    Identity,
    RawPortTransport,
    udp_frame,
    veth_ports,
)

from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch import SoftSwitchProcess
from hostlib.ina import JobSpec, RetryPolicy
from hostlib.protocol import (
    HEADER,
    HEADER_SIZE,
    INA_UDP_PORT,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    PacketType,
)
from hostlib.session import InaSession

pytestmark = [pytest.mark.ebpf, pytest.mark.root, pytest.mark.slow]

LANES = 64
SLOTS = 8
SWITCH = (SWITCH_IP, INA_UDP_PORT)
POLICY = RetryPolicy(timeout=0.02, min_timeout=0.01, max_timeout=0.2, deadline=30.0)


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[tuple[SwitchController, dict[int, tuple[str, str]]]]:
    """An ``inalab switch --datapath ebpf`` on five ports, and its controller."""
    with veth_ports(5, "eb") as ports:
        interfaces = {p: pair[1] for p, pair in ports.items()}
        process = SoftSwitchProcess(tmp_path, lanes=LANES, slots=64, interfaces=interfaces,
                                    extra_args=("--datapath", "ebpf"))  # fmt: skip
        with process, process.controller() as ctl:
            yield ctl, ports
        assert process.returncode == 0, (tmp_path / "switch.log").read_text()


def _worker(port: int) -> WorkerAddress:
    me = Identity(port)
    return WorkerAddress(me.ip, me.udp_port, me.mac, port)


def _allreduce(
    ports: dict[int, tuple[str, str]],
    job_id: int,
    members: list[int],
    calls: list[np.ndarray],
    faults: dict[str, float] | None = None,
) -> list[list[np.ndarray]]:
    """Each call's inputs (one row per rank) through job ``job_id`` of the hosts on
    ``members``, one thread per rank; every rank's results, call by call."""
    results: list[list[np.ndarray]] = [[] for _ in members]
    errors: list[BaseException] = []

    def rank_main(rank: int, port: int) -> None:
        transport: Any = RawPortTransport(ports[port][0], Identity(port))
        if faults:
            transport = FaultyTransport(transport, seed=rank, **faults)
        spec = JobSpec(job_id, rank, len(members), SWITCH, lanes=LANES, slots=SLOTS)
        try:
            with InaSession(spec, transport, POLICY) as session:
                for inputs in calls:
                    results[rank].append(session.allreduce(inputs[rank]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r, p)) for r, p in enumerate(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


def _snapshot(ctl: SwitchController, jobs: dict[int, int]) -> list[Any]:
    """Every register of every slot of ``jobs`` (id -> slot count), both sets."""
    out = []
    for job_id, slots in jobs.items():
        for slot in range(slots):
            for pool_set in (0, 1):
                s = ctl.read_slot(job_id, slot, pool_set)
                out.append((job_id, slot, pool_set, s.bitmap, s.other_bitmap, s.remaining,
                            s.seq, s.final, s.exponent, tuple(s.values)))  # fmt: skip
    return out


def _ina(job: int, rank: int, seq: int, *, slot: int = 0, vt: int | None = None,
         lanes: int = LANES, count: int = LANES, value: int = 1) -> bytes:  # fmt: skip
    vt = (PROTOCOL_VERSION << 4) | PacketType.DATA if vt is None else vt
    header = HEADER.pack(vt, 0, job, rank, -128, lanes, slot, 0, seq)
    return header + struct.pack(f"!{count}i", *([value] * count))


# ---------------------------------------------------------------------------- faults
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_loss_duplication_and_reordering_give_the_lossless_results(
    switch: tuple[SwitchController, dict[int, tuple[str, str]]], dtype: type
) -> None:
    ctl, ports = switch
    rng = np.random.default_rng(5)
    calls = [random_inputs(rng, dtype, 4, size) for size in (3000, 1, 4096)]
    members = [1, 2, 3, 4]
    ctl.add_job(1, [_worker(p) for p in members], SLOTS)
    clean = _allreduce(ports, 1, members, calls)
    ctl.remove_job(1)
    ctl.add_job(1, [_worker(p) for p in members], SLOTS)
    ctl.set_drops(0.05, 0.05)  # the switch's drop simulator too, both ways
    faulty = _allreduce(ports, 1, members, calls, {"loss": 0.05, "dup": 0.05, "reorder": 0.1})
    counters = ctl.counters()
    for k, inputs in enumerate(calls):
        want = expected(inputs, LANES)
        for rank in range(4):
            assert clean[rank][k].tobytes() == want.tobytes()
            assert faulty[rank][k].tobytes() == want.tobytes()  # bit-identical
    assert counters["drop_sim_ingress"] > 0 and counters["drop_sim_egress"] > 0
    assert counters["duplicates_ignored"] > 0 and counters["retransmits_answered"] > 0


# ---------------------------------------------------------------------------- forged
def test_forged_packets_change_nothing_but_the_drop_counters(
    switch: tuple[SwitchController, dict[int, tuple[str, str]]],
) -> None:
    ctl, ports = switch
    ctl.add_job(1, [_worker(1), _worker(2)], SLOTS)
    ctl.add_job(2, [_worker(3), _worker(4)], SLOTS)
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, np.int32, 2, 2000)
    for job, members in ((1, [1, 2]), (2, [3, 4])):
        _allreduce(ports, job, members, [inputs])
    before, counts = _snapshot(ctl, {1: SLOTS, 2: SLOTS}), ctl.counters()
    forged = [
        (3, _ina(1, 0, 9)),  # job 1 rank 0 from job 2's host: bad_source
        (1, _ina(2, 1, 9)),  # job 2 rank 1 from job 1's host: bad_source
        (5, _ina(1, 1, 9)),  # from a host in no job: bad_source
        (1, _ina(1, 2, 9)),  # rank 2 of a 2-worker job: bad_rank
        (1, _ina(7, 0, 9)),  # unknown_job
        (1, _ina(1, 0, 9, slot=SLOTS)),  # bad_slot
        (1, _ina(1, 0, 9, lanes=32, count=32)),  # bad_lanes
        (1, _ina(1, 0, 9, count=LANES - 1)),  # bad_length
        (1, _ina(1, 0, 1)),  # older than the slot's finished use: stale
        (1, _ina(1, 0, 9, vt=(PROTOCOL_VERSION << 4) | PacketType.RESULT)),  # malformed
        (3, _ina(2, 0, 9, vt=0x21)),  # version 2: malformed
    ]
    with _raw_sockets(ports, list(ports)) as socks:
        for port, payload in forged * 50:
            me = Identity(port)
            socks[port].send(udp_frame(me, SWITCH_MAC, SWITCH_IP, INA_UDP_PORT, payload))
    delta = _settle(ctl, counts)
    assert _snapshot(ctl, {1: SLOTS, 2: SLOTS}) == before
    moved = {k for k, v in delta.items() if v}
    assert moved == {"received", "drop_bad_source", "drop_bad_rank",
                     "drop_unknown_job", "drop_bad_slot", "drop_bad_lanes",
                     "drop_bad_length", "drop_stale", "drop_malformed"}  # fmt: skip
    assert delta["drop_bad_source"] == 150 and delta["drop_malformed"] == 100
    # And both jobs still aggregate exactly (new sessions: the jobs again, slots cleared).
    for job, members in ((1, [1, 2]), (2, [3, 4])):
        ctl.remove_job(job)
        ctl.add_job(job, [_worker(p) for p in members], SLOTS)
        got = _allreduce(ports, job, members, [inputs])
        assert got[0][0].tobytes() == expected(inputs, LANES).tobytes()


@contextmanager
def _raw_sockets(ports: dict[int, tuple[str, str]], which: list[int]) -> Iterator[dict[int, Any]]:
    """A raw socket on the host end of each port in ``which``, closed on exit."""
    socks: dict[int, socket.socket] = {}
    try:
        for port in which:
            socks[port] = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            socks[port].bind((ports[port][0], 0))
        yield socks
    finally:
        for sock in socks.values():
            sock.close()


def _settle(ctl: SwitchController, before: dict[str, int]) -> dict[str, int]:
    """Counter deltas once they stop moving (a veth runs the program in the sender's
    softirq, so the frames are processed by the time their sends return; this waits for
    stragglers): unchanged for 0.3 s, at most 10 s."""
    deadline = time.monotonic() + 10
    last, still = ctl.counters(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = ctl.counters()
        if now != last:
            last, still = now, time.monotonic()
        elif time.monotonic() - still >= 0.3:
            break
    return {k: v - before[k] for k, v in last.items() if k in before}


# ---------------------------------------------------------------------------- fuzz
def _mutants(rng: random.Random, count: int) -> Iterator[tuple[int, bytes]]:
    """(port, frame): malformed frames from the host in no job (port 5), and from a
    worker's host frames whose INA header or length no switch may accept."""
    me, worker = Identity(5), Identity(1)
    valid = udp_frame(me, SWITCH_MAC, SWITCH_IP, INA_UDP_PORT, _ina(1, 0, 100))
    for _ in range(count):
        kind = rng.random()
        if kind < 0.3:  # garbage of any length
            yield 5, bytes(rng.getrandbits(8) for _ in range(rng.randint(14, 400)))
        elif kind < 0.7:  # a valid frame, bytes flipped anywhere, maybe cut short
            frame = bytearray(valid)
            for _ in range(rng.randint(1, 6)):
                frame[rng.randrange(len(frame))] = rng.getrandbits(8)
            yield 5, bytes(frame[: rng.randint(14, len(frame))] if rng.random() < 0.3 else frame)
        else:  # the worker's own address, an INA header that cannot be taken
            bad = rng.choice([
                _ina(1, 0, 100, vt=rng.choice([0x00, 0x12, 0x2F, 0xFF])),
                _ina(1, 0, 100, lanes=rng.randint(65, 999)),
                _ina(1, 0, 100, count=rng.randint(0, LANES - 1)),
                _ina(1, 0, 100)[: rng.randint(0, HEADER_SIZE - 1)],
                _ina(1, 0, 100, slot=rng.randint(SLOTS, 0x7FFF) | rng.choice([0, POOL_SET_BIT])),
            ])  # fmt: skip
            yield 1, udp_frame(worker, SWITCH_MAC, SWITCH_IP, INA_UDP_PORT, bad)


def test_a_fuzz_of_malformed_frames_leaves_every_job_unchanged(
    switch: tuple[SwitchController, dict[int, tuple[str, str]]],
) -> None:
    ctl, ports = switch
    ctl.add_job(1, [_worker(1), _worker(2)], SLOTS)
    ctl.add_job(2, [_worker(3), _worker(4)], SLOTS)
    inputs = random_inputs(np.random.default_rng(2), np.int32, 2, 1500)
    for job, members in ((1, [1, 2]), (2, [3, 4])):
        _allreduce(ports, job, members, [inputs])
    before, counts = _snapshot(ctl, {1: SLOTS, 2: SLOTS}), ctl.counters()
    sent = 0
    with _raw_sockets(ports, [1, 5]) as socks:
        for port, frame in _mutants(random.Random(7), 12_000):
            socks[port].send(frame)
            sent += 1
    assert sent >= 10_000
    delta = _settle(ctl, counts)
    assert _snapshot(ctl, {1: SLOTS, 2: SLOTS}) == before
    # Whatever the program took for INA it dropped, with a reason; nothing aggregated.
    drops = sum(v for k, v in delta.items() if k.startswith("drop_"))
    assert delta["received"] == drops > 0
    for name in ("aggregated", "completed", "results_sent", "retransmits_answered"):
        assert delta[name] == 0, name
    for job, members in ((1, [1, 2]), (2, [3, 4])):
        ctl.remove_job(job)
        ctl.add_job(job, [_worker(p) for p in members], SLOTS)
        got = _allreduce(ports, job, members, [inputs])
        assert got[1][0].tobytes() == expected(inputs, LANES).tobytes()


# ---------------------------------------------------------------------------- two CPUs
HAMMER_LANES = 2048  # a long critical section: two CPUs meet in it often
HAMMER_SLOTS = 2  # few slots: the two CPUs are on the same one most of the time


def _hammer(defines: tuple[str, ...], rounds: int) -> list[dict[str, int]]:
    """16 ranks of one job, 8 sending from each of two ports, one sender process pinned
    to each CPU, every round hitting the same slots from both CPUs at once; the program
    (built with ``defines``) drives the switch in this process, its tables written
    through the data plane's table API."""
    from ports import Hammer, hammer, rank_identity

    from emulation.softswitch.ebpf.build import build_program
    from emulation.softswitch.ebpf.dataplane import EbpfDataplane

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    lanes = HAMMER_LANES
    with veth_ports(2, "hm", mtu=9000) as ports:
        dp = EbpfDataplane(lanes, 16, program=build_program(lanes, defines=defines))
        try:
            dp.attach({p: pair[1] for p, pair in ports.items()}, {})
            placement = {rank: 1 if rank < 8 else 2 for rank in range(16)}
            for rank, port in placement.items():
                mac, ip, udp_port = rank_identity(port, rank)
                dp.insert_worker(1, rank, (ip, udp_port))
                dp.set_replica(1, rank, port, (ip, udp_port), int(mac.replace(":", ""), 16))
            dp.set_group(1, [(port, rank) for rank, port in placement.items()])
            dp.insert_job(1, 16, 0, HAMMER_SLOTS, 1)
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            plans = [
                Hammer(ports[port][0], port, tuple(r for r, p in placement.items() if p == port),
                       16, 1, HAMMER_SLOTS, rounds, lanes, cpu)
                for port, cpu in ((1, cpus[0]), (2, cpus[1]))
            ]  # fmt: skip
            procs = [ctx.Process(target=hammer, args=(plan, out)) for plan in plans]
            for p in procs:
                p.start()
            stats = [out.get(timeout=300) for _ in procs]
            for p in procs:
                p.join(timeout=30)
            return stats
        finally:
            dp.close()


def test_two_cpus_hammering_the_same_slots_get_exact_sums() -> None:
    stats = _hammer((), rounds=300)
    assert [s["rounds"] for s in stats] == [300, 300], stats
    assert [s["bad"] for s in stats] == [0, 0], stats


def test_without_the_slot_lock_the_same_load_goes_wrong() -> None:
    # The control: the program built without its spin lock loses updates under the same
    # load (a slot that never completes, or a wrong sum), so the test above can fail. A
    # lost update is a race, which one run of 300 rounds on two CPUs shows most times but
    # not always (CI saw one clean run): up to five runs, and one that goes wrong is
    # enough. Five clean runs mean the lock is not what the test above depends on.
    seen = []
    for _ in range(5):
        stats = _hammer(("INA_NO_LOCK",), rounds=300)
        if any(s["rounds"] < 300 or s["bad"] for s in stats):
            return
        seen.append(stats)
    raise AssertionError(f"five lock-free runs all gave exact sums: {seen}")


# ---------------------------------------------------------------------------- inalab ctl
def test_inalab_ctl_drives_an_ebpf_switch(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    ready = tmp_path / "sw.json"
    with veth_ports(2, "ct") as ports:
        argv = [sys.executable, "-m", "emulation.cli", "switch", "--datapath", "ebpf",
                "--p4runtime", "127.0.0.1:0", "--lanes", "8", "--slots", "64",
                "--ready-file", str(ready)]  # fmt: skip
        for port, (_, switch_end) in ports.items():
            argv += ["-i", f"{port}@{switch_end}"]
        switch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert switch.poll() is None, switch.communicate()
                assert time.monotonic() < deadline, "the switch never became ready"
                time.sleep(0.1)
            assert json.loads(ready.read_text())["interfaces"] == {
                "1": ports[1][1], "2": ports[2][1]
            }

            def ctl(*args: str) -> str:
                done = subprocess.run(
                    [sys.executable, "-m", "emulation.cli", "ctl", "--manifest", str(ready), *args],
                    capture_output=True, text=True, timeout=60, check=False,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
                return done.stdout

            added = ctl("add-job", "--job", "1", "--slots", "16", "10.0.0.1:40001",
                        "10.0.0.2:40002")  # fmt: skip
            assert "job 1: 2 workers, slots 0+16" in added
            assert "0=10.0.0.1:40001, 1=10.0.0.2:40002" in ctl("jobs")
            assert "set 0: bitmap 00 ranks [] remaining 0 seq 0" in ctl(
                "show-bitmap", "--job", "1", "--slot", "0"
            )
            ctl("drops", "--ingress", "0.01")
            assert "ingress 0.01 egress 0" in ctl("drops")
            assert "received" in ctl("stats")
            assert "job 1 removed" in ctl("remove-job", "--job", "1")
        finally:
            switch.terminate()
            _, err = switch.communicate(timeout=30)
        assert switch.returncode == 0, err
