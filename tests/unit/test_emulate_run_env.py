"""``inalab emulate ... run`` without a network: its command line, the ranks' environment
(read back by the "ina" backend as a job installed already), exit statuses, output."""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path

import pytest

from emulation.cli import build_parser, main
from emulation.mininet.run import RankSpec, exit_status, rank_environment, stream_lines

STAR4 = str(Path(__file__).resolve().parents[2] / "topologies" / "star4.yaml")

SPEC = RankSpec(
    rank=5, host="h6", local_rank=0, local_world_size=1, ip="10.0.0.6", ifname="h6-eth0",
    port=47000, switch=("10.255.255.3", 20033), switch_rank=1, lanes=64,
)  # fmt: skip


def test_the_command_follows_run_and_keeps_its_own_options() -> None:
    parse = build_parser().parse_args
    args = parse(["emulate", STAR4, "run", "--", "python", "x.py", "--job", "9", "--"])
    assert args.program == ["python", "x.py", "--job", "9", "--"] and args.job is None
    assert args.command == "emulate" and args.action == "run" and args.grace == 5.0
    args = parse(["emulate", STAR4, "--job", "2", "run", "python", "-c", "pass"])
    assert (args.job, args.program) == (2, ["python", "-c", "pass"])
    args = parse(["emulate", STAR4, "run", "--job", "3", "--grace", "0.5", "--", "true"])
    assert (args.job, args.grace, args.program) == (3, 0.5, ["true"])


@pytest.mark.parametrize("tail", [[], ["--"], ["--job", "1"]])
def test_no_command_is_a_usage_error(tail: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["emulate", STAR4, "run", *tail])
    assert exc.value.code == 2
    assert "error: no COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("topology", "extra", "message"),
    [(STAR4, ["--job", "7"], "topology star4 has no job 7"), (None, [], "has no jobs section")],
)
def test_an_unknown_job_or_none_is_one_line_before_any_network(
    topology: str | None,
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if topology is None:
        topology = str(tmp_path / "nojobs.yaml")
        Path(topology).write_text("switches: {s1: {}}\nhosts: {h1: {}}\nlinks: [[h1, s1]]\n")
    run_dir = tmp_path / "run"
    argv = ["emulate", topology, "--run-dir", str(run_dir), "run", *extra, "--", "true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not run_dir.exists()  # refused before anything was built


def test_the_environment_is_torchruns_and_the_ina_backends() -> None:
    base = {"PATH": "/bin", "INALAB_P4RUNTIME": "127.0.0.1:9559", "MASTER_PORT": "1"}
    env = rank_environment(base, SPEC, 8, ("10.0.0.1", 29400), 1, 256, Path("/tmp/r"))
    # The Python running inalab leads PATH (sudo .venv/bin/inalab: the venv's python).
    assert env["PATH"] == f"{os.path.dirname(sys.executable)}:/bin"
    assert "INALAB_P4RUNTIME" not in env
    torchrun = {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    assert {k: env[k] for k in torchrun} == torchrun
    assert env["GLOO_SOCKET_IFNAME"] == "h6-eth0" and env["INALAB_RUN_DIR"] == "/tmp/r"
    assert env["PYTHONUNBUFFERED"] == "1"
    kept = rank_environment({"PYTHONUNBUFFERED": ""}, SPEC, 8, ("a", 1), 1, 8, Path())
    assert kept["PYTHONUNBUFFERED"] == ""  # the user's choice stays


def test_the_ina_backend_reads_the_environment_as_a_job_installed_already() -> None:
    pytest.importorskip("torch")
    from dynamiccl import torch_backend as tb

    env = rank_environment({}, SPEC, 8, ("10.0.0.1", 29400), 4, 128, Path("/tmp/r"))
    opts = tb.InaOptions.from_env(env)
    assert opts.installed and opts.job_id == 4 and opts.slots == 128
    assert (opts.switch, opts.bind_ip, opts.bind_port) == (SPEC.switch, "10.0.0.6", 47000)
    assert (opts.switch_rank, opts.num_workers, opts.lanes) == (1, 8, 64)
    named = {tb.ENV_SWITCH, tb.ENV_JOB, tb.ENV_BIND, tb.ENV_PORT, tb.ENV_SWITCH_RANK,
             tb.ENV_WORKERS, tb.ENV_LANES, tb.ENV_SLOTS}  # fmt: skip
    assert named <= set(env) and tb.ENV_P4RUNTIME not in env


def test_exit_status_is_the_shells() -> None:
    assert [exit_status(c) for c in (0, 3, -15, -9)] == [0, 3, 143, 137]


def test_stream_lines_prefixes_and_logs_every_line() -> None:
    read, write = os.pipe()
    os.write(write, b"one\n\xfftwo\nlast without newline")
    os.close(write)
    out, log = io.StringIO(), io.StringIO()
    stream_lines(os.fdopen(read, "rb"), "[rank 1] ", out, log, threading.Lock())
    assert out.getvalue() == "[rank 1] one\n[rank 1] \ufffdtwo\n[rank 1] last without newline\n"
    assert log.getvalue() == "one\n\ufffdtwo\nlast without newline\n"
