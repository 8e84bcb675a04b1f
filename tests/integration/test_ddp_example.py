"""examples/ddp_digits.py trains to the same accuracy over INA as over Gloo, on its own
(spawned ranks, its own switch) and as one rank of a launcher (torchrun)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emulation.softswitch.process import SoftSwitchProcess

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_digits.py"
ACCURACY_FLOOR = 0.85


def test_ina_trains_as_well_as_gloo() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    ina, gloo = report["ina"]["accuracy"], report["gloo"]["accuracy"]
    assert ina >= ACCURACY_FLOOR and gloo >= ACCURACY_FLOOR, report
    assert abs(ina - gloo) <= 0.01, report
    assert report["switch_aggregated_packets"] > 0, report  # the ina run used the switch


def test_each_process_is_one_rank_under_torchrun(tmp_path: Path) -> None:
    # torchrun gives every rank the same INALAB_*: rank 0 installs the job, as with
    # pg_options. Two epochs, two ranks: the accuracy only shows that training ran.
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    with SoftSwitchProcess(tmp_path, lanes=256) as switch:
        host, port = switch.data_addr
        env = os.environ | {
            "INALAB_SWITCH": f"{host}:{port}",
            "INALAB_P4RUNTIME": switch.p4runtime_address,
            "INALAB_JOB": "1",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        done = subprocess.run(
            [torchrun, "--standalone", "--nproc-per-node", "2", str(EXAMPLE), "--epochs", "2"],
            capture_output=True, text=True, timeout=240, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        with switch.controller() as ctl:
            aggregated = ctl.counters()["aggregated"]
            assert ctl.installed_jobs() == []  # rank 0 removed its job
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1], done.stdout
    for backend in ("ina", "gloo"):
        assert len({r[backend]["accuracy"] for r in reports}) == 1, reports  # DDP: one model
        assert reports[0][backend]["accuracy"] >= 0.7, reports
    packets = {r["ina_packets"] for r in reports}
    assert len(packets) == 1 and aggregated == 2 * packets.pop() > 0, (reports, aggregated)
