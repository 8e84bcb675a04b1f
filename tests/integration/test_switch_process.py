"""The soft switch as a process: real UDP data plane, JSON-lines control, lifecycle."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import bound_udp_sockets

from emulation.softswitch import (
    ErrorKind,
    JobConfig,
    SoftSwitchProcess,
    SwitchControl,
    SwitchControlError,
    SwitchStartError,
)
from emulation.softswitch.loadgen import run_switch_only
from hostlib.protocol import HEADER_SIZE, Header, PacketType, pack_header, unpack_header

LANES = 4
JOB = 11


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path, lanes=LANES, slots=64) as sw:
        yield sw
    assert sw.returncode == 0, (tmp_path / "switch.log").read_text()


@pytest.fixture
def ctl(switch: SoftSwitchProcess) -> Iterator[SwitchControl]:
    with switch.control() as c:
        yield c


@pytest.fixture
def workers() -> Iterator[list[socket.socket]]:
    with bound_udp_sockets(3) as socks:
        yield socks


def job_of(socks: list[socket.socket], slot_count: int = 8) -> JobConfig:
    return JobConfig(JOB, tuple(s.getsockname() for s in socks), slot_count)


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
    switch: SoftSwitchProcess, ctl: SwitchControl, workers: list[socket.socket]
) -> None:
    assert ctl.add_job(job_of(workers)) == 0
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
    assert c["send_errors"] == 0
    st = ctl.read_slot(JOB, 3, 0)
    assert (st.bitmap, st.other_bitmap, st.counter, st.exponent) == (0b111, 0, 0, 2)
    assert st.values.tolist() == [3, 30, -3, 2**31 - 3]


def test_retransmit_after_completion_is_unicast(
    switch: SoftSwitchProcess, ctl: SwitchControl, workers: list[socket.socket]
) -> None:
    ctl.add_job(job_of(workers))
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
    switch: SoftSwitchProcess, ctl: SwitchControl, workers: list[socket.socket]
) -> None:
    ctl.add_job(job_of(workers[:2]))
    send(switch, workers[2], 0, 0, [1, 2, 3, 4])  # claims rank 0 from a foreign port
    send(switch, workers[0], 0, 0, [1, 2, 3, 4])
    send(switch, workers[1], 1, 0, [1, 1, 1, 1])
    assert receive(workers[0])[1] == [2, 3, 4, 5]
    assert_nothing_arrives(workers[2])
    c = ctl.counters()
    assert (c["drop_bad_source"], c["aggregated"]) == (1, 2)


def test_set_drops_applies_to_the_data_plane(
    switch: SoftSwitchProcess, ctl: SwitchControl, workers: list[socket.socket]
) -> None:
    ctl.add_job(job_of(workers[:1]))
    ctl.set_drops(1.0, 0.0, seed=1)
    send(switch, workers[0], 0, 0, [1, 2, 3, 4])
    assert_nothing_arrives(workers[0])
    ctl.set_drops(0.0, 0.0)
    send(switch, workers[0], 0, 0, [1, 2, 3, 4])
    assert receive(workers[0])[1] == [1, 2, 3, 4]
    assert ctl.counters()["drop_sim_ingress"] == 1


# ----------------------------------------------------------------- control channel
def test_job_table_over_control(ctl: SwitchControl, workers: list[socket.socket]) -> None:
    job = job_of(workers, slot_count=5)
    base = ctl.add_job(job)
    assert ctl.jobs() == [JobConfig(JOB, job.workers, 5, base)]
    assert ctl.add_job(JobConfig(JOB + 1, job.workers[:1], 3)) == 5
    ctl.remove_job(JOB)
    assert [j.job_id for j in ctl.jobs()] == [JOB + 1]


def test_control_errors_are_typed(ctl: SwitchControl, workers: list[socket.socket]) -> None:
    ctl.add_job(job_of(workers))
    cases = [
        (lambda: ctl.add_job(job_of(workers)), ErrorKind.JOB_TABLE, "already exists"),
        (lambda: ctl.remove_job(99), ErrorKind.JOB_TABLE, "no job"),
        (lambda: ctl.read_slot(JOB, 8, 0), ErrorKind.JOB_TABLE, "outside job"),
        (lambda: ctl.set_drops(2.0, 0.0), ErrorKind.BAD_VALUE, "outside 0..1"),
        (lambda: ctl.call("nope"), ErrorKind.UNKNOWN_OP, "unknown op"),
        (lambda: ctl.call("remove_job", job_id="x"), ErrorKind.BAD_REQUEST, "job_id"),
        (
            lambda: ctl.call("add_job", job_id=2, workers=[["localhost", 1]], slot_count=1),
            ErrorKind.BAD_REQUEST,
            "not IPv4",
        ),
    ]
    for call, kind, match in cases:
        with pytest.raises(SwitchControlError, match=match) as info:
            call()
        assert info.value.kind == kind
    assert len(ctl.jobs()) == 1  # the connection survives every error


def test_control_framing_over_a_raw_socket(switch: SoftSwitchProcess) -> None:
    with socket.create_connection(switch.control_addr, timeout=5.0) as sock:
        # Two requests in one segment, the second split across two sends.
        sock.sendall(b'not json\n{"op": "jo')
        sock.sendall(b'bs"}\n[1]\n')
        stream = sock.makefile("rb")
        replies = [json.loads(stream.readline()) for _ in range(3)]
    assert [r["ok"] for r in replies] == [False, True, False]
    assert replies[0]["kind"] == replies[2]["kind"] == "bad_json"
    assert replies[1]["jobs"] == []


def test_unreachable_control_port_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = s.getsockname()  # bound, never listening: connection refused
        with pytest.raises(SwitchControlError) as info:
            SwitchControl(addr, timeout=1.0)
    assert info.value.kind == ErrorKind.TRANSPORT


# ----------------------------------------------------------------- lifecycle
def test_ready_file_describes_the_running_switch(switch: SoftSwitchProcess) -> None:
    info = json.loads(switch.ready_path.read_text())
    assert info == switch.ready_info
    assert info["pid"] == switch.pid
    assert (info["lanes"], info["slots"]) == (LANES, 64)
    assert tuple(info["data"]) == switch.data_addr
    assert switch.data_addr[0] == "127.0.0.1"


def test_shutdown_op_stops_the_process(tmp_path: Path) -> None:
    sw = SoftSwitchProcess(tmp_path).start()
    try:
        with sw.control() as c:
            c.shutdown()
        assert sw.wait(10.0) == 0
    finally:
        sw.stop()
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


def test_start_failure_names_the_log(tmp_path: Path) -> None:
    sw = SoftSwitchProcess(tmp_path, lanes=0)
    with pytest.raises(SwitchStartError, match="exited with status 2") as info:
        sw.start()
    assert str(sw.log_path) in str(info.value)
    assert "outside 1..2048" in str(info.value)  # the log's tail is quoted
    assert not sw.is_running()


@pytest.mark.parametrize(
    "argv",
    [
        ["--listen", "nonsense"],
        ["--lanes", "0"],
        ["--drop-ingress", "1.5"],
        ["--job", "1:4:localhost:80"],
        ["--job", "1:4:127.0.0.1:80,127.0.0.1:80"],
    ],
)
def test_cli_rejects_bad_input_without_a_traceback(argv: list[str]) -> None:
    cmd = [sys.executable, "-m", "emulation.softswitch.cli", "--listen", "127.0.0.1:0"]
    proc = subprocess.run(
        [*cmd, "--control", "127.0.0.1:0", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert "inalab switch: error:" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------- benchmark
def test_switch_only_loadgen_runs_and_aggregates_correctly(tmp_path: Path) -> None:
    r = run_switch_only(workers=2, lanes=8, packets=20_000, window=8, seconds=0.5, run_dir=tmp_path)
    assert r["inproc_pps"] > 0
    assert r["switch_pps"] > 0
    assert r["worker_goodput_elements_per_s"] > 0
    assert r["worker_bad_results"] == 0
    assert r["switch_send_errors"] == 0
