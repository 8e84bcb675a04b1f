"""emulation.mininet.registry: a second run with a node name in common is refused in one line;
records of processes that are gone do not block anyone; each run removes its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulation.mininet.registry import EmulationBusy, existing_interfaces, live_runs, register


def _net(tmp_path: Path, *interfaces: str) -> Path:
    """A stand-in for /sys/class/net listing ``interfaces`` (the machine's may hold a
    Mininet network of another test)."""
    net = tmp_path / "net"
    net.mkdir(exist_ok=True)
    for name in interfaces:
        (net / name).touch()
    return net


def _foreign_record(directory: Path, names: list[str], run_dir: str) -> subprocess.Popen[bytes]:
    """A record held by another live process (a sleeping child), as a first run leaves it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stat = Path(f"/proc/{child.pid}/stat").read_text()
    start = int(stat.rsplit(")", 1)[1].split()[19])
    directory.mkdir(parents=True, exist_ok=True)
    doc = {"pid": child.pid, "start_time": start, "run_dir": run_dir,
           "topology": "topologies/star4.yaml", "names": sorted(names)}  # fmt: skip
    (directory / f"{child.pid}.json").write_text(json.dumps(doc))
    return child


def test_a_shared_name_is_refused_naming_the_first_runs_directory(tmp_path: Path) -> None:
    reg = tmp_path / "reg"
    first = _foreign_record(reg, ["h1", "h2", "s1"], "/tmp/first-run")
    try:
        with (
            pytest.raises(EmulationBusy) as info,
            register(["h9", "s1"], tmp_path / "b", "x", reg, _net(tmp_path)),
        ):
            pass
        text = str(info.value)
        assert "\n" not in text
        assert "/tmp/first-run" in text and f"kill {first.pid}" in text and "s1" in text
        assert "h9" not in text  # only the names in common
        assert [r.pid for r in live_runs(reg)] == [first.pid]  # the refused one left no record
    finally:
        first.kill()
        first.wait()


def test_disjoint_names_both_hold_and_each_removes_only_its_own(tmp_path: Path) -> None:
    reg = tmp_path / "reg"
    first = _foreign_record(reg, ["h1", "s1"], "/tmp/first-run")
    try:
        with register(["a1", "t1"], tmp_path / "b", "other.yaml", reg, _net(tmp_path)) as me:
            assert {r.pid for r in live_runs(reg)} == {first.pid, me.pid}
        assert [r.pid for r in live_runs(reg)] == [first.pid]
    finally:
        first.kill()
        first.wait()


def test_a_record_whose_process_is_gone_is_stale(tmp_path: Path) -> None:
    reg = tmp_path / "reg"
    first = _foreign_record(reg, ["h1", "s1"], "/tmp/first-run")
    first.kill()
    first.wait()
    assert live_runs(reg) == []
    with register(["h1", "s1"], tmp_path / "b", "star4.yaml", reg, _net(tmp_path)):
        assert not (reg / f"{first.pid}.json").exists()  # removed by the next run


def test_a_reused_pid_is_stale(tmp_path: Path) -> None:
    """Our own PID with another start time: the recorded process is not this one."""
    reg = tmp_path / "reg"
    reg.mkdir()
    doc = {"pid": os.getpid(), "start_time": 1, "run_dir": "/tmp/old", "topology": "t",
           "names": ["h1"]}  # fmt: skip
    (reg / "1.json").write_text(json.dumps(doc))
    assert live_runs(reg) == []
    with register(["h1"], tmp_path / "b", "t", reg, _net(tmp_path)):
        pass


def test_a_half_written_record_does_not_block(tmp_path: Path) -> None:
    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "123.json").write_text('{"pid": 12')
    with register(["h1"], tmp_path / "b", "t", reg, _net(tmp_path)):
        assert not (reg / "123.json").exists()


def test_interfaces_named_after_the_nodes_without_a_live_run_are_refused(tmp_path: Path) -> None:
    net = _net(tmp_path, "lo", "s1-eth1", "s1-eth2", "s10-eth1", "h1-eth0x", "s1-ethx")
    assert existing_interfaces(["s1", "h1"], net) == ["s1-eth1", "s1-eth2"]
    reg = tmp_path / "reg"
    with (
        pytest.raises(EmulationBusy) as info,
        register(["h1", "s1"], tmp_path / "b", "t", reg, net),
    ):
        pass
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("interfaces s1-eth1, s1-eth2 exist already")
    assert "ip link del s1-eth1" in text
    assert live_runs(reg) == []
    with register(["h2", "s2"], tmp_path / "b", "t", reg, net):  # other names: free
        pass
