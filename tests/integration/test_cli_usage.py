"""What a new user meets first: ``--help``, ``--version``, flags at the wrong level,
missing prerequisites and bad inputs caught before anything runs, progress on a
terminal (and none elsewhere), the switch saying where it listens, a closed pipe.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Terminal

from controller.switch import SwitchController
from emulation.cli import DESCRIPTION
from emulation.cli import main as inalab
from emulation.softswitch import SoftSwitchProcess

REPO = Path(__file__).resolve().parents[2]
INALAB = [sys.executable, "-m", "emulation.cli"]
TINY = ["-b", "4K", "-e", "16K", "-n", "1", "-w", "0", "--workers", "2"]


def test_help_opens_with_what_inalab_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        inalab(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: inalab ")
    assert DESCRIPTION.split("\n")[0] in out and "inalab bench" in out
    assert "subcommand module" not in out  # the developer's docstring stays in the code
    assert "exit status: 0 done; 1 a run failed" in out and "2 bad input" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        inalab(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"inalab {version('inalab')}"


@pytest.mark.parametrize(
    ("argv", "usage", "message"),
    [
        (["bench", "--wrokers", "4"], "usage: inalab bench ",
         "unrecognized arguments: --wrokers 4"),
        (["ctl", "jobs", "--nope"], "usage: inalab ctl jobs", "unrecognized arguments: --nope"),
        (["emulate", "topologies/star4.yaml", "bench", "--workers", "2"],
         "usage: inalab emulate TOPOLOGY bench", "the topology gives the ranks"),
        (["emulate", "topologies/star4.yaml", "bench", "--run-dir", "x"],
         "usage: inalab emulate TOPOLOGY bench", "give --run-dir to inalab emulate"),
    ],
)  # fmt: skip
def test_a_misplaced_flag_gets_the_usage_of_where_it_was_given(
    argv: list[str], usage: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        inalab(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert message in err


@pytest.mark.slow
def test_verbose_is_taken_after_the_subcommand_too(tmp_path: Path) -> None:
    proc = subprocess.run([*INALAB, "bench", "-v", "--algos", "ina", *TINY,
                           "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " INFO job 1: 2 workers" in proc.stderr  # -v: INFO, from the subcommand's place


def test_gloo_without_torch_is_refused_before_anything_runs(
    own_tmpdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what an install without torch sees
    assert inalab(["bench", "--algos", "ina,gloo", *TINY]) == 2
    out = capsys.readouterr()
    assert "gloo needs PyTorch" in out.err and "pip install" in out.err
    assert "# logs:" not in out.out and list(own_tmpdir.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algos", "ina", "--profile", "missing.json"], "--profile"),
        (["--algos", "ina", "--json", "no/such/dir/out.json"], "--json: directory"),
        (["--algos", "ina", "--plot", "no/such/dir/out.png"], "--plot: directory"),
    ],
)
def test_bad_inputs_are_refused_before_a_run_directory_is_made(
    argv: list[str], message: str, own_tmpdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A bad --profile is an error even when auto (its only user) is not asked for.
    assert inalab(["bench", *argv, *TINY]) == 2
    out = capsys.readouterr()
    assert message in out.err
    assert "# logs:" not in out.out and list(own_tmpdir.iterdir()) == []


@pytest.mark.slow
def test_progress_on_a_terminal_and_not_in_a_pipe(tmp_path: Path) -> None:
    argv = [*INALAB, "bench", "--algos", "ina,ring", *TINY]
    with Terminal([*argv, "--run-dir", str(tmp_path / "tty")], cwd=REPO) as term:
        assert term.wait(300) == 0, term.output
    lines = re.findall(r"^# \[(\d+)/4\] (\w+) (\w+) done, [\d.]+ s$", term.output, re.M)
    assert lines == [("1", "ina", "4K"), ("2", "ina", "16K"), ("3", "ring", "4K"),
                     ("4", "ring", "16K")]  # fmt: skip
    # The first table comes with the reason INA is slow here.
    assert "on loopback there is no wire" in term.output
    piped = subprocess.run([*argv, "--run-dir", str(tmp_path / "pipe")], capture_output=True,
                           text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert "] ina 4K done" not in piped.stdout + piped.stderr


def test_the_switch_says_where_it_listens_on_a_terminal(tmp_path: Path) -> None:
    with Terminal([*INALAB, "switch", "--listen", "127.0.0.1:0", "--p4runtime",
                   "127.0.0.1:0"], cwd=REPO) as term:  # fmt: skip
        m = term.expect(r"data on UDP 127\.0\.0\.1:(\d+); P4Runtime on 127\.0\.0\.1:(\d+)")
        assert int(m[1]) and int(m[2])  # port 0 became real ports, and they are these:
        with SwitchController.connect(f"127.0.0.1:{m[2]}") as ctl:
            assert ctl.installed_jobs() == []
        term.type(b"\x03")
        assert term.wait() == 0, term.output
    # Not on a terminal: the ready file says it, and the log holds no such line.
    sw = SoftSwitchProcess(tmp_path).start()
    assert sw.stop() == 0
    assert "data on" not in sw.log_path.read_text()


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    sw = SoftSwitchProcess(tmp_path).start()
    try:
        read, write = os.pipe()
        os.close(read)  # `inalab ctl jobs | head -0`: nobody reads
        proc = subprocess.run([*INALAB, "ctl", "--manifest", str(sw.ready_path), "jobs",
                               "--json"], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=60, cwd=REPO)  # fmt: skip
        os.close(write)
    finally:
        assert sw.stop() == 0
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports a tool killed by it
    assert proc.stderr == ""


@pytest.mark.slow
def test_calibrate_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    with Terminal([*INALAB, "calibrate", "--workers", "2", "-b", "4K", "-e", "64K", "-f", "4",
                   "-n", "1", "-w", "0", "-o", str(tmp_path / "p.json"),
                   "--run-dir", str(tmp_path / "run")], cwd=REPO) as term:  # fmt: skip
        assert term.wait(300) == 0, term.output
    steps = re.findall(r"^# \[(\d+)/9\] 2 workers, (\w+) (\w+) done", term.output, re.M)
    assert [int(n) for n, _, _ in steps] == list(range(1, 10))
    assert {a for _, a, _ in steps} == {"ina", "ring", "tree"}
