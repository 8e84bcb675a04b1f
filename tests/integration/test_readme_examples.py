"""The marked examples of README.md and docs/*.md run as written (each in a fresh
directory)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hostlib.protocol import TNA_LANES_PER_PACKET

REPO = Path(__file__).parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_EXAMPLE = re.compile(r"<!-- example: (\S+).*?-->\n```bash\n(.*?)```", re.DOTALL)


def _found() -> list[tuple[str, str]]:
    """Every marked example's (name, script), from README.md and each docs page."""
    return [found for doc in DOCS for found in _EXAMPLE.findall(doc.read_text())]


def examples() -> dict[str, str]:
    """The marked examples by name, wherever in README.md and docs/*.md they are."""
    return dict(_found())


def test_the_docs_have_examples() -> None:
    assert {"pcap", "ctl", "tls", "tofino", "emulate-run"} <= set(examples())


def test_no_two_examples_share_a_name() -> None:
    names = [name for name, _ in _found()]
    assert len(names) == len(set(names)), names


def run_example(name: str, cwd: Path, timeout: float) -> str:
    """Run the docs' example ``name`` as bash (-euo pipefail) in ``cwd``; its stdout."""
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", examples()[name]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_pcap_example_dissects_the_switch_capture(tmp_path: Path) -> None:
    stdout = run_example("pcap", tmp_path, 280)
    lines = [line for line in stdout.splitlines() if " / INA " in line]
    assert len(lines) == 8, stdout
    assert "INA DATA job=1" in lines[0], lines[0]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_ctl_example_installs_reads_and_removes_a_job(tmp_path: Path) -> None:
    out = run_example("ctl", tmp_path, 100)
    assert "job 1: 2 workers, slots 0+16" in out
    assert "0=127.0.0.1:40001, 1=127.0.0.1:40002" in out
    assert "set 0: bitmap 00 ranks [] remaining 0 seq 0" in out
    assert "ingress 0.01 egress 0" in out
    assert "job 1 removed" in out


@pytest.mark.timeout(200)
def test_tofino_example_configures_the_tofino_programs_names(tmp_path: Path) -> None:
    out = run_example("tofino", tmp_path, 180)
    assert "job 1: 2 workers, slots 0+16" in out
    assert "set 0: bitmap 00 ranks [] remaining 0 seq 0" in out
    assert "job 1 removed" in out
    assert f"lanes={TNA_LANES_PER_PACKET}" in out and "Out of bounds values : 0 OK" in out


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_example_installs_a_job_and_refuses_plain_text(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")  # run as from the repo
    out = run_example("tls", tmp_path, 100)
    assert "job 1: 2 workers, slots 0+16" in out
    assert re.search(r"P4Runtime: 127\.0\.0\.1:\d+ connected as ctl", out), out
    assert re.search(r"P4Runtime: refused 127\.0\.0\.1:\d+: plain text, not TLS", out), out
