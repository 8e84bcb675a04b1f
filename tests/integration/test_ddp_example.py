"""examples/ddp_digits.py trains to the same accuracy over INA as over Gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
