"""``inalab emulate T --jobs ...``: what is refused before any network exists (no root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _emulate(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", "topologies/star8.yaml", *argv],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (("--jobs", "4,1", "bench"), "host h1 is in jobs 4 and 1: give jobs on hosts of their own"),
        (("--jobs", "4", "bench"), "--jobs needs two jobs or more (one job: --job)"),
        (("--jobs", "4,4", "bench"), "--jobs 4,4: a job given twice"),
        (("--jobs", "4,9", "bench"), "topology star8 has no job 9"),
        (("--jobs", "4,5", "switch-only"), "--jobs runs the bench"),
        (("--jobs", "4,5", "--job", "4", "bench"), "--jobs goes without --job"),
        (("--jobs", "4,x", "bench"), "invalid job ids '4,x'"),
    ],
)
def test_jobs_that_cannot_run_together_are_refused_in_one_line(
    argv: tuple[str, ...], why: str
) -> None:
    proc = _emulate(*argv)
    assert proc.returncode == 2, proc.stderr
    assert why in proc.stderr
    assert "Traceback" not in proc.stderr and "manifest" not in proc.stdout
