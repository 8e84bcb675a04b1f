"""``inalab compare`` on the JSON of real ``inalab bench`` runs (loopback, tiny sweeps).

Three runs, made once for the module: two of one configuration (the second at other
lanes, which a comparison may be about) and one of another data type, which compare must
refuse unless forced. The command runs as a subprocess, as typed; its numbers are held to
the files'.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three bench runs (about 20 s on 2 cores)

SWEEP = ["-b", "4K", "-e", "16K", "-f", "4", "-n", "1", "-w", "0", "--workers", "2"]


def _inalab(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """a.json, b.json (lanes 256), c.json (int32): ina and ring, 4K and 16K, 2 workers."""
    tmp = tmp_path_factory.mktemp("compare")
    out = {}
    for name, extra in (("a", []), ("b", ["--lanes", "256"]), ("c", ["-d", "int32"])):
        path = tmp / f"{name}.json"
        proc = _inalab("bench", *SWEEP, "--algos", "ina,ring", *extra, "--run-dir",
                       tmp / name, "--json", path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out[name] = path
    return out


def _times(path: Path) -> dict[tuple[str, int], float]:
    rows = json.loads(path.read_text())["rows"]
    return {(r["algo"], r["size_bytes"]): r["time_us"]["max"] for r in rows}


def _data(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if not line.startswith("#")]


def test_two_runs_side_by_side_with_a_plot(runs: dict[str, Path], tmp_path: Path) -> None:
    png = tmp_path / "compare.png"
    proc = _inalab("compare", runs["a"], runs["b"], "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# inalab compare: allreduce float32, 2 workers, loopback")
    assert "# differs: lanes: a 2048, b 256" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if "a:ina" in line).split()
    assert header == ["#", "size", "a:ina", "a:ring", "b:ina", "speedup", "b:ring", "speedup"]
    a, b = _times(runs["a"]), _times(runs["b"])
    data = _data(proc.stdout)
    assert [int(line[0]) for line in data] == [4096, 16384]
    for line in data:
        n = int(line[0])
        for cell, algo in ((line[4], "ina"), (line[6], "ring")):
            assert cell == f"{a[(algo, n)] / b[(algo, n)]:.2f}x"
    assert f"# plot: {png}" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_algorithm_as_the_baseline(runs: dict[str, Path]) -> None:
    proc = _inalab("compare", runs["a"], runs["b"], "--baseline", "ring")
    assert proc.returncode == 0, proc.stderr
    a = _times(runs["a"])
    first = _data(proc.stdout)[0]
    assert first[2] == f"{a[('ring', 4096)] / a[('ina', 4096)]:.2f}x"  # a:ina against a:ring


def test_another_data_type_is_refused_unless_forced(runs: dict[str, Path]) -> None:
    proc = _inalab("compare", runs["a"], runs["c"])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"inalab compare: error: {runs['c']} and {runs['a']} are different configurations:"
        " data type int32 vs float32 (--force compares them anyway)\n"
    )
    forced = _inalab("compare", runs["a"], runs["c"], "--force")
    assert forced.returncode == 0, forced.stderr
    assert "# differs: data type: a float32, c int32" in forced.stdout


def test_a_missing_file_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    proc = _inalab("compare", runs["a"], tmp_path / "nope.json")
    assert proc.returncode == 2
    assert proc.stderr == (
        f"inalab compare: error: cannot read bench JSON {tmp_path / 'nope.json'}:"
        " No such file or directory\n"
    )
