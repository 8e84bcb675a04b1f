"""Stopping a run however it is stopped: Ctrl-C on a terminal, SIGTERM (``timeout``,
``kill``, a scheduler), SIGHUP (a closed terminal).

The command must print one line (no traceback), keep what it measured (the partial
table and JSON), exit with 128 + the signal, and leave nothing it started: no switch, no
worker, no Mininet host or interface, no CollNet shared memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Terminal, descendants, still_running

from emulation.cli import main as inalab

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
INALAB = [sys.executable, "-m", "emulation.cli"]
# Long enough that the signal arrives mid-sweep, whatever this machine's speed.
LONG = ("-b", "64K", "-e", "64M", "-f", "4", "-n", "20", "-w", "1")


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("inalab-")}


def _interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _wait_for(what: str, check: object, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"ended before {what}:\n{out[-2000:]}\n{err[-2000:]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def _stop_mid_run(argv: list[str], signum: int, started: object) -> tuple[int, str, str, set[int]]:
    """Run ``argv``, wait until ``started()`` holds, send ``signum`` to the command alone
    (as ``kill`` and ``timeout`` do) and return its status, output and the processes it
    had started."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)  # fmt: skip
    try:
        _wait_for("the run's processes", started, proc)
        time.sleep(1.0)  # into the timed calls
        children = descendants(proc.pid)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err, children


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_to_bench_removes_everything_it_started(
    tmp_path: Path, signum: signal.Signals
) -> None:
    shm_before = _shm()
    run_dir, out_json = tmp_path / "run", tmp_path / "out.json"
    argv = [*INALAB, "bench", "--algos", "collnet", "--ranks-per-host", "2", *LONG,
            "--run-dir", str(run_dir), "--json", str(out_json)]  # fmt: skip
    code, out, err, children = _stop_mid_run(
        argv, signum, lambda: (run_dir / "switch.ready.json").exists() and _shm() - shm_before
    )
    assert code == 128 + signum, err
    assert "Traceback" not in err and "Traceback" not in out
    assert f"inalab bench: stopped by {signum.name}" in err
    assert len(children) >= 5  # the switch and four ranks at least
    assert still_running(children) == set()
    assert _shm() - shm_before == set()
    doc = json.loads(out_json.read_text())
    assert doc["metadata"]["stopped_by"] == signum.name
    assert all(r["wrong"] == 0 and r["algo"] == "collnet" for r in doc["rows"])


def test_ctrl_c_keeps_the_sizes_that_finished(tmp_path: Path) -> None:
    out_json = tmp_path / "out.json"
    with Terminal([*INALAB, "bench", "--algos", "ina,ring", "-b", "64K", "-e", "16M",
                   "-n", "5", "-w", "1", "--run-dir", str(tmp_path / "run"),
                   "--json", str(out_json)], cwd=REPO) as term:  # fmt: skip
        term.expect(r"# \[2/\d+\] ina 256K done")
        children = descendants(term.pid)
        term.type(b"\x03")
        code = term.wait()
    assert code == 130, term.output[-3000:]
    assert "Traceback" not in term.output
    assert term.output.count("stopped by SIGINT") == 2  # the table's note, the last line
    assert "inalab bench: stopped by SIGINT; what this run started is gone" in term.output
    assert "WARNING" not in term.output  # ranks stopped because asked, not a surprise
    doc = json.loads(out_json.read_text())
    assert doc["metadata"]["stopped_by"] == "SIGINT"
    sizes = [r["size_bytes"] for r in doc["rows"]]
    assert sizes[:2] == [64 << 10, 256 << 10] and {r["algo"] for r in doc["rows"]} == {"ina"}
    assert all(r["wrong"] == 0 for r in doc["rows"])
    assert "       65536 " in term.output  # the partial table is printed too
    assert still_running(children) == set()


def test_ctrl_c_before_any_size_finished_still_exits_cleanly(tmp_path: Path) -> None:
    with Terminal([*INALAB, "bench", "--algos", "ina", *LONG,
                   "--run-dir", str(tmp_path / "run")], cwd=REPO) as term:  # fmt: skip
        term.expect(r"# links: ")
        while not (tmp_path / "run" / "switch.ready.json").exists():
            time.sleep(0.05)
        children = descendants(term.pid)
        term.type(b"\x03")
        code = term.wait()
    assert code == 130, term.output[-3000:]
    assert "Traceback" not in term.output
    assert still_running(children) == set()


def test_the_stop_handler_restores_the_previous_handlers() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(SystemExit):
        inalab(["--version"])
    assert inalab(["bench", "--json", "/nonexistent-dir/x.json"]) == 2
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.root
@pytest.mark.mininet
def test_sigterm_to_emulate_bench_removes_the_network(tmp_path: Path) -> None:
    shm_before, interfaces_before = _shm(), _interfaces()
    run_dir = tmp_path / "run"
    argv = [*INALAB, "emulate", str(REPO / "topologies" / "collnet2x2.yaml"),
            "--run-dir", str(run_dir), "bench", "--algos", "collnet", *LONG,
            "--json", str(tmp_path / "out.json")]  # fmt: skip
    code, _, err, children = _stop_mid_run(
        argv, signal.SIGTERM, lambda: (run_dir / "manifest.json").exists() and _shm() - shm_before
    )
    assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert "stopped by SIGTERM" in err
    assert still_running(children) == set()
    assert _interfaces() - interfaces_before == set()
    assert _shm() - shm_before == set()
    assert json.loads((tmp_path / "out.json").read_text())["metadata"]["stopped_by"] == "SIGTERM"
