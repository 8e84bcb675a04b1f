"""The capability probes in conftest.py: a marked test runs only where its probe holds.

Each test here asserts the capability itself, so a probe that says yes wrongly fails it,
and one that says no wrongly shows up as a skip with its reason in ``pytest -ra``.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest
from conftest import PROBES, capability, required_missing


@pytest.mark.root
def test_root_probe_means_root() -> None:
    assert os.geteuid() == 0


@pytest.mark.mininet
def test_mininet_probe_means_mnexec() -> None:
    assert os.geteuid() == 0 and shutil.which("mnexec")


@pytest.mark.bmv2
def test_bmv2_probe_means_simple_switch_grpc_and_p4c() -> None:
    assert shutil.which("simple_switch_grpc") and shutil.which("p4c-bm2-ss")


@pytest.mark.tofino
def test_tofino_probe_means_p4c_barefoot() -> None:
    assert shutil.which("p4c-barefoot")


def test_every_marker_of_pyproject_has_a_probe() -> None:
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    markers = tomllib.loads(pyproject.read_text())["tool"]["pytest"]["ini_options"]["markers"]
    declared = {line.split(":")[0] for line in markers}
    # slow, hostlib and engine_neutral select tests (conftest sets hostlib unless a module
    # is engine_neutral); the rest name capabilities.
    assert declared - {"slow", "hostlib", "engine_neutral"} == set(PROBES)


def test_root_probe_agrees_with_the_process() -> None:
    assert capability("root") == (os.geteuid() == 0)


def test_required_capabilities_are_checked_by_name() -> None:
    assert required_missing("") == []
    missing = required_missing("root, gpu")
    assert ("gpu: needs a CUDA GPU" in missing) != capability("gpu")
    assert ("root: needs root" in missing) != capability("root")
    with pytest.raises(pytest.UsageError, match="'fpga' is not one of"):
        required_missing("fpga")


def test_temporary_files_land_under_pytests_base_directory(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import subprocess
    import sys
    import tempfile

    base = tmp_path_factory.getbasetemp()
    assert Path(tempfile.gettempdir()).is_relative_to(base)
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(child.stdout.strip()).is_relative_to(base)  # subprocesses' too
