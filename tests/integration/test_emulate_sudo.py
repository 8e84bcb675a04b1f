"""``sudo .venv/bin/inalab emulate`` of a bmv2 topology under real sudo: sudo's own PATH
loses the user's P4 tools, and the run stops before its run directory with a line that
says so and how to pass them (``--p4-tools "$PATH"``). Root (sudo without a password);
no network is built: every case stops at the tools check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
INALAB = Path(sys.executable).parent / "inalab"
STAR4_BMV2 = str(REPO / "topologies" / "star4_bmv2.yaml")


def _sudo(argv: list[str], path: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("sudo") is None:
        pytest.skip("sudo is not installed")
    return subprocess.run(
        ["sudo", "-n", str(INALAB), "emulate", *argv],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


@pytest.fixture
def user_tools(tmp_path: Path) -> Path:
    """The P4 tools in a directory of the user's PATH that sudo's secure_path lacks."""
    bin_dir = tmp_path / "p4bin"
    bin_dir.mkdir()
    for tool in ("simple_switch_grpc", "p4c-bm2-ss"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def test_under_sudo_the_users_tools_are_not_found_and_the_line_says_why(
    tmp_path: Path, user_tools: Path
) -> None:
    probe = subprocess.run(["sudo", "-n", "sh", "-c", "command -v simple_switch_grpc"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if probe.stdout.strip():
        pytest.skip(f"sudo's own PATH has simple_switch_grpc ({probe.stdout.strip()})")
    run_dir = tmp_path / "run"
    proc = _sudo([STAR4_BMV2, "--run-dir", str(run_dir), "up", "--seconds", "1"],
                 f"{user_tools}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(
        "inalab emulate: error: switch s1: simple_switch_grpc (it runs the bmv2 switch) is "
        "not on PATH ("
    )
    # root runs sudo here (the root marker), so SUDO_USER is root
    assert "), which sudo (run by root) sets to its own unless told otherwise" in proc.stderr
    assert str(user_tools) not in proc.stderr.split("), which sudo")[0]  # sudo dropped it
    assert '--p4-tools "$PATH"' in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert "# run dir" not in proc.stdout and not run_dir.exists()


def test_under_sudo_p4_tools_names_where_it_looked(tmp_path: Path, user_tools: Path) -> None:
    (user_tools / "p4c-bm2-ss").unlink()
    run_dir = tmp_path / "run"
    proc = _sudo([STAR4_BMV2, "--p4-tools", str(user_tools), "--run-dir", str(run_dir), "up"],
                 os.environ["PATH"])  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(
        "inalab emulate: error: switch s1: p4c-bm2-ss (it compiles p4/ina.p4) is not in "
        f"--p4-tools {user_tools}; install bmv2 and p4c"
    )
    assert not run_dir.exists()
