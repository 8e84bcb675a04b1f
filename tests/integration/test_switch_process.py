"""The soft switch as a process: real UDP data plane, P4Runtime control, lifecycle."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_child_dies_with_its_parent, bound_udp_sockets, worker_addresses
from p4.v1 import p4runtime_pb2

from controller.client import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    NotPrimaryError,
    SwitchUnreachableError,
)
from controller.entries import insert, table_entry
from controller.switch import (
    InstalledJob,
    JobExistsError,
    JobNotFoundError,
    NoFreeSlotsError,
    SwitchController,
    WorkerAddress,
)
from emulation.bench.switch_only import run_switch_only
from emulation.softswitch import SoftSwitchProcess, SwitchStartError
from hostlib.protocol import HEADER_SIZE, Header, PacketType, pack_header, unpack_header

LANES = 4
JOB = 11


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path, lanes=LANES, slots=64) as sw:
        yield sw
    assert sw.returncode == 0, (tmp_path / "switch.log").read_text()


@pytest.fixture
def ctl(switch: SoftSwitchProcess) -> Iterator[SwitchController]:
    with switch.controller() as c:
        yield c


@pytest.fixture
def workers() -> Iterator[list[socket.socket]]:
    with bound_udp_sockets(3) as socks:
        yield socks


def addrs_of(socks: list[socket.socket]) -> list[WorkerAddress]:
    return worker_addresses(s.getsockname() for s in socks)


def add_job(ctl: SwitchController, socks: list[socket.socket], slot_count: int = 8) -> InstalledJob:
    return ctl.add_job(JOB, addrs_of(socks), slot_count)


def send(
    sw: SoftSwitchProcess, sock: socket.socket, rank: int, slot: int, values: list[int]
) -> None:
    header = Header(PacketType.DATA, JOB, rank, slot, 0, 1000 + slot, LANES, rank)
    sock.sendto(pack_header(header) + np.asarray(values, ">i4").tobytes(), sw.data_addr)


def receive(sock: socket.socket) -> tuple[Header, list[int]]:
    data = sock.recv(2048)
    return unpack_header(data), np.frombuffer(data, ">i4", offset=HEADER_SIZE).tolist()


def assert_nothing_arrives(sock: socket.socket) -> None:
    sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        sock.recv(2048)


# ----------------------------------------------------------------- data plane
def test_aggregates_real_udp_packets(
    switch: SoftSwitchProcess, ctl: SwitchController, workers: list[socket.socket]
) -> None:
    assert add_job(ctl, workers).entry.slot_base == 0
    for rank, sock in enumerate(workers):
        send(switch, sock, rank, 3, [rank, 10 * rank, -1, 2**31 - 1])
    for sock in workers:
        header, values = receive(sock)
        assert (header.ptype, header.job_id, header.slot, header.seq) == (
            PacketType.RESULT,
            JOB,
            3,
            1003,
        )
        assert header.exponent == 2
        assert values == [3, 30, -3, 2**31 - 3]  # int32 wrap: 3 x (2^31 - 1)
    c = ctl.counters()
    assert (c["received"], c["aggregated"], c["completed"], c["results_sent"]) == (3, 3, 1, 3)
    assert sum(v for k, v in c.items() if k.startswith("drop_")) == 0
    st = ctl.read_slot(JOB, 3, 0)
    assert (st.bitmap, st.other_bitmap, st.remaining, st.seq, st.exponent) == (0b111, 0, 0, 1003, 2)
    assert st.values == (3, 30, -3, 2**31 - 3)


def test_retransmit_after_completion_is_unicast(
    switch: SoftSwitchProcess, ctl: SwitchController, workers: list[socket.socket]
) -> None:
    add_job(ctl, workers)
    for rank, sock in enumerate(workers):
        send(switch, sock, rank, 0, [1, 1, 1, 1])
    for sock in workers:
        receive(sock)
    send(switch, workers[1], 1, 0, [1, 1, 1, 1])
    assert receive(workers[1])[1] == [3, 3, 3, 3]
    assert_nothing_arrives(workers[0])
    assert_nothing_arrives(workers[2])
    assert ctl.counters()["retransmits_answered"] == 1


def test_packets_from_an_unbound_socket_are_dropped(
    switch: SoftSwitchProcess, ctl: SwitchController, workers: list[socket.socket]
) -> None:
    add_job(ctl, workers[:2])
    send(switch, workers[2], 0, 0, [1, 2, 3, 4])  # claims rank 0 from a foreign port
    send(switch, workers[0], 0, 0, [1, 2, 3, 4])
    send(switch, workers[1], 1, 0, [1, 1, 1, 1])
    assert receive(workers[0])[1] == [2, 3, 4, 5]
    assert_nothing_arrives(workers[2])
    c = ctl.counters()
    assert (c["drop_bad_source"], c["aggregated"]) == (1, 2)


def test_set_drops_applies_to_the_data_plane(
    switch: SoftSwitchProcess, ctl: SwitchController, workers: list[socket.socket]
) -> None:
    add_job(ctl, workers[:1])
    ctl.set_drops(1.0, 0.0)
    assert ctl.drop_simulator.get() == (1.0, 0.0)
    send(switch, workers[0], 0, 0, [1, 2, 3, 4])
    assert_nothing_arrives(workers[0])
    ctl.set_drops(0.0, 0.0)
    send(switch, workers[0], 0, 0, [1, 2, 3, 4])
    assert receive(workers[0])[1] == [1, 2, 3, 4]
    c = ctl.counters()
    assert (c["drop_sim_ingress"], c["received"], c["completed"]) == (1, 2, 1)


# ----------------------------------------------------------------- control over P4Runtime
def test_job_table_over_p4runtime(ctl: SwitchController, workers: list[socket.socket]) -> None:
    addrs = addrs_of(workers)
    installed = ctl.add_job(JOB, addrs, 5)
    entry = installed.entry
    assert (entry.job_id, entry.num_workers, entry.slot_base, entry.slot_count) == (JOB, 3, 0, 5)
    assert [(w.rank, w.ip, w.udp_port) for w in installed.workers] == [
        (r, a.ip, a.udp_port) for r, a in enumerate(addrs)
    ]
    assert ctl.installed_jobs() == [installed]  # read back from the switch's tables
    assert ctl.job(JOB) == installed
    second = ctl.add_job(JOB + 1, addrs[:1], 3)
    assert second.entry.slot_base == 5
    assert second.entry.mgid != entry.mgid
    assert ctl.remove_job(JOB) == installed
    assert [j.job_id for j in ctl.installed_jobs()] == [JOB + 1]
    with pytest.raises(JobNotFoundError):
        ctl.job(JOB)
    # The freed range is reused: the lowest free one.
    assert ctl.add_job(JOB + 2, addrs[1:], 4).entry.slot_base == 0


def test_controller_errors_are_typed(ctl: SwitchController, workers: list[socket.socket]) -> None:
    ctl.add_job(JOB, addrs_of(workers), 8)
    other = addrs_of(workers[:1])
    cases: list[tuple[Callable[[], object], type[Exception], str]] = [
        (lambda: ctl.add_job(JOB, other, 4), JobExistsError, "is installed"),
        (lambda: ctl.remove_job(99), JobNotFoundError, "no job 99"),
        (lambda: ctl.read_slot(99, 0, 0), JobNotFoundError, "no job 99"),
        (lambda: ctl.read_slot(JOB, 8, 0), ValueError, "outside job"),
        (lambda: ctl.read_slot(JOB, 0, 2), ValueError, "not 0 or 1"),
        (lambda: ctl.set_drops(2.0, 0.0), ValueError, "outside 0..1"),
        (lambda: ctl.add_job(2, other, 4, slot_base=6), NoFreeSlotsError, "not free"),
        (lambda: ctl.add_job(2, other, 64 - 7), NoFreeSlotsError, "no free range"),
        (lambda: ctl.add_job(2, other, 0), ValueError, "slot count"),
        (lambda: ctl.add_job(2, other, 65), ValueError, "slot count"),
        (lambda: ctl.add_job(2, [], 4), ValueError, "workers"),
        (lambda: ctl.add_job(2, other * 2, 4), ValueError, "share one address"),
        (
            lambda: ctl.add_job(2, [WorkerAddress("localhost", 1)], 1),
            ValueError,
            "neither an IP address",
        ),
    ]
    for call, kind, match in cases:
        with pytest.raises(kind, match=match):
            call()
    # The connection survives every error, and no refused job left anything behind.
    assert [j.job_id for j in ctl.installed_jobs()] == [JOB]
    assert list(ctl.multicast.read()) == [ctl.job(JOB).entry.mgid]
    assert ctl.drop_simulator.get() == (0.0, 0.0)


def test_refused_writes_are_typed_by_status_code(ctl: SwitchController) -> None:
    ctl.add_job(JOB, [WorkerAddress("127.0.0.1", 5000)], 4)
    with pytest.raises(AlreadyExistsError, match="exists") as exists:
        ctl.jobs.insert(ctl.job(JOB).entry)  # the raw table write under add_job's check
    assert exists.value.details[0].index == 0
    with pytest.raises(NotFoundError, match="no table"):
        ctl.client.write([insert(p4runtime_pb2.TableEntry(table_id=0xDEAD))])
    entry = table_entry(
        ctl.p4info,
        ctl.jobs.table.id,
        {"job_id": JOB + 1},
        "Ingress.jobs.set_job",
        {"num_workers": 1, "slot_base": 10, "slot_count": 1, "mgid": 9},
    )
    del entry.match[:]
    with pytest.raises(InvalidArgumentError, match="job_id missing"):
        ctl.client.write([insert(entry)])
    assert [j.job_id for j in ctl.installed_jobs()] == [JOB]  # and the connection survives


def test_a_backup_controller_reads_but_cannot_write(switch: SoftSwitchProcess) -> None:
    with switch.controller(election_id=(0, 2)) as primary:
        with switch.controller(election_id=(0, 1)) as backup:
            assert primary.is_primary and not backup.is_primary
            with pytest.raises(NotPrimaryError):
                backup.add_job(JOB, [WorkerAddress("127.0.0.1", 5000)], 4)
            with pytest.raises(NotPrimaryError):
                backup.set_drops(0.5, 0.0)
            assert backup.installed_jobs() == []  # reads are allowed
            primary.add_job(JOB, [WorkerAddress("127.0.0.1", 5000)], 4)
            assert [j.job_id for j in backup.installed_jobs()] == [JOB]
        assert primary.drop_simulator.get() == (0.0, 0.0)


def test_two_controllers_may_not_share_an_election_id(
    switch: SoftSwitchProcess, ctl: SwitchController
) -> None:
    with pytest.raises(InvalidArgumentError, match="held by another controller"):
        switch.controller(election_id=(0, 1), timeout=5.0)
    assert ctl.is_primary
    ctl.set_drops(0.25, 0.0)  # the first one is still the primary
    assert ctl.drop_simulator.get() == (0.25, 0.0)


def test_wrong_device_id_is_refused(tmp_path: Path) -> None:
    with SoftSwitchProcess(tmp_path, extra_args=("--device-id", "7")) as sw:
        assert sw.device_id == sw.ready_info["device_id"] == 7
        with sw.controller() as c:
            assert c.is_primary
        with pytest.raises(NotFoundError, match="no device 0"):
            SwitchController.connect(sw.p4runtime_address, device_id=0, timeout=5.0)
    assert sw.returncode == 0


def test_unreachable_p4runtime_port_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        host, port = s.getsockname()  # bound, never listening: connection refused
        with pytest.raises(SwitchUnreachableError):
            SwitchController.connect(f"{host}:{port}", timeout=1.0)


# ----------------------------------------------------------------- lifecycle
def test_ready_file_describes_the_running_switch(switch: SoftSwitchProcess) -> None:
    info = json.loads(switch.ready_path.read_text())
    assert info == switch.ready_info
    assert set(info) == {"data", "interfaces", "p4runtime", "p4runtime_tls", "device_id", "pid",
                         "lanes", "slots"}  # fmt: skip
    assert info["p4runtime_tls"] is False
    assert info["interfaces"] == {}  # UDP on --listen, no Ethernet ports
    assert info["pid"] == switch.pid
    assert (info["lanes"], info["slots"]) == (LANES, 64)
    assert info["device_id"] == switch.device_id == 0
    assert tuple(info["data"]) == switch.data_addr
    assert switch.data_addr[0] == "127.0.0.1"
    host, _, port = info["p4runtime"].rpartition(":")
    assert info["p4runtime"] == switch.p4runtime_address
    assert host == "127.0.0.1" and int(port) > 0  # the kernel's choice, not port 0
    with switch.controller() as c:  # the switch's program has the ready file's sizes
        assert (c.lanes, c.slots_per_set) == (LANES, 64)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_stopped_switch_refuses_controllers(tmp_path: Path) -> None:
    sw = SoftSwitchProcess(tmp_path).start()
    address, device_id = sw.p4runtime_address, sw.device_id
    try:
        with sw.controller() as c:
            c.counters()
            assert sw.stop() == 0
            with pytest.raises(SwitchUnreachableError):
                c.counters()  # the connection it held is gone
    finally:
        sw.stop()
    with pytest.raises(SwitchUnreachableError):  # nothing listens: fails in the timeout
        SwitchController.connect(address, device_id=device_id, timeout=1.0)
    assert "switch stopped; counters" in sw.log_path.read_text()


def test_stop_leaves_no_process_and_is_idempotent(tmp_path: Path) -> None:
    sw = SoftSwitchProcess(tmp_path).start()
    pid = sw.pid
    assert sw.is_running()
    assert sw.stop() == 0  # SIGTERM is a clean stop, not a crash
    assert not sw.is_running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert sw.stop() == 0
    assert "switch stopped; counters" in sw.log_path.read_text()
    # Whatever the log level: the counters a one-armed server's operator reads on stop.
    assert "inalab switch: stopped; counters: " in sw.log_path.read_text()


def test_the_switch_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # SIGKILL leaves no chance to clean up: the kernel's parent-death signal must do it.
    assert_child_dies_with_its_parent(
        "from pathlib import Path\n"
        "from emulation.softswitch import SoftSwitchProcess\n"
        f"pid = SoftSwitchProcess(Path({str(tmp_path)!r})).start().pid"
    )


def test_start_failure_names_the_log(tmp_path: Path) -> None:
    sw = SoftSwitchProcess(tmp_path, lanes=0)
    with pytest.raises(SwitchStartError, match="exited with status 2") as info:
        sw.start()
    assert str(sw.log_path) in str(info.value)
    assert "outside 1..2048" in str(info.value)  # the log's tail is quoted
    assert not sw.is_running()


CLI = [
    sys.executable, "-m", "emulation.softswitch.cli",
    "--listen", "127.0.0.1:0", "--p4runtime", "127.0.0.1:0",
]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--listen", "nonsense"],
        ["--listen", "127.0.0.1:65536"],
        ["--p4runtime", "nonsense"],
        ["--p4runtime", ":9559"],
        ["--device-id", "-1"],
        ["--lanes", "0"],
        ["--lanes", "2049"],
        ["--slots", "0"],
        ["--drop-ingress", "1.5"],
        ["--drop-egress", "-0.5"],
        ["--seed", "x"],
        ["--pcap-count", "-1"],
        ["--control", "127.0.0.1:0"],  # the JSON control channel is gone
        ["--job", "1:4:127.0.0.1:80"],  # jobs are installed over P4Runtime only
    ],
)
def test_cli_rejects_bad_input_without_a_traceback(argv: list[str]) -> None:
    proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2
    assert "inalab switch: error:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_second_switch_on_the_same_p4runtime_port_fails_clearly(
    switch: SoftSwitchProcess,
) -> None:
    # gRPC's default SO_REUSEPORT let a second switch listen on the first one's port, and
    # controllers reached one or the other at random: the second must refuse to start.
    taken = switch.p4runtime_address
    proc = subprocess.run(
        [*CLI, "--p4runtime", taken], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()  # one line: no traceback, no gRPC log
    assert line.startswith("inalab switch: error: cannot bind"), line
    assert taken in line and "in use" in line, line
    with switch.controller() as ctl:  # the first one still serves
        assert ctl.installed_jobs() == []


def test_cli_reports_an_unwritable_capture_without_a_traceback(tmp_path: Path) -> None:
    pcap = tmp_path / "missing" / "switch.pcap"
    proc = subprocess.run(
        [*CLI, "--pcap", str(pcap)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 1
    assert "inalab switch: error: --pcap:" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------- benchmark
@pytest.mark.slow
def test_switch_only_loadgen_runs_and_aggregates_correctly(tmp_path: Path) -> None:
    r = run_switch_only(tmp_path, workers=2, lanes=8, packets=20_000, window=8, seconds=0.5)
    assert r["inproc_packets"] > 0 and r["inproc_pps"] > 0
    # Every result the senders took had the right sum, and the switch aggregated.
    assert r["worker_bad_results"] == 0 and r["switch_drops"] == 0
    assert r["switch_elements_per_s"] > 0 and r["worker_goodput_elements_per_s"] > 0
    assert 0 < r["switch_cpu_fraction"] < 2
    assert r["switch_pps"] > 0
    assert r["worker_goodput_elements_per_s"] > 0
    assert r["worker_bad_results"] == 0
