"""``inalab emulate`` and bmv2's tools without a network: where it looks (``--p4-tools``,
else PATH, which sudo resets), the one-line refusal before a run directory exists, and
the start lines naming each switch's kind and data plane."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from emulation.bmv2 import INSTALL_HINT, Bmv2Tools, find_bmv2
from emulation.cli import main
from emulation.mininet.datapaths import plan_links
from emulation.mininet.emulate import describe_plan
from emulation.topology import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
STAR4_BMV2 = str(TOPOLOGIES / "star4_bmv2.yaml")


def _tool(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_tools(tmp_path: Path) -> Path:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    return empty


def test_tools_missing_from_p4_tools_stop_the_run_before_its_directory(
    tmp_path: Path, no_tools: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    argv = ["emulate", STAR4_BMV2, "--p4-tools", str(no_tools), "--run-dir", str(run_dir)]
    assert main([*argv, "bench", "-e", "4K"]) == 2
    out, err = capsys.readouterr()
    assert err == (
        "inalab emulate: error: switch s1: simple_switch_grpc (it runs the bmv2 switch) is "
        f"not in --p4-tools {no_tools}; {INSTALL_HINT}\n"
    )
    assert not run_dir.exists()
    assert "# run dir" not in out


def test_no_temporary_run_directory_is_left_behind(
    tmp_path: Path, no_tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp would make it
    assert main(["emulate", STAR4_BMV2, "--p4-tools", str(no_tools), "up"]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["no-tools"]


def test_under_sudo_the_refusal_says_sudo_set_path(
    no_tools: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SUDO_USER", "alice")
    monkeypatch.setenv("PATH", str(no_tools))
    assert main(["emulate", STAR4_BMV2, "switch-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "inalab emulate: error: switch s1: simple_switch_grpc (it runs the bmv2 switch) is "
        f"not on PATH ({no_tools}), which sudo (run by alice) sets to its own unless told "
        "otherwise: if alice's PATH has it, hand that on with `sudo .venv/bin/inalab "
        'emulate --p4-tools "$PATH" ...`'
    )
    assert err.count("\n") == 1


def test_several_bmv2_switches_are_named_together(
    no_tools: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = str(TOPOLOGIES / "leaf_spine_hier_bmv2.yaml")
    assert main(["emulate", topology, "--p4-tools", str(no_tools), "up"]) == 2
    names = ", ".join(s.name for s in load_topology(topology).switches)
    assert capsys.readouterr().err.startswith(f"inalab emulate: error: switches {names}: ")


def test_the_start_lines_name_each_switchs_kind_and_data_plane(tmp_path: Path) -> None:
    switch, compiler = _tool(tmp_path, "simple_switch_grpc"), _tool(tmp_path, "p4c-bm2-ss")
    tools = find_bmv2(path=str(tmp_path), origin="--p4-tools")
    assert tools == Bmv2Tools(switch, compiler)
    star = load_topology(STAR4_BMV2)
    mixed = dataclasses.replace(  # s1 soft, s2 bmv2
        star, switches=(dataclasses.replace(star.switches[0], kind="soft"),
                        dataclasses.replace(star.switches[0], name="s2")),
        _index={},
    )  # fmt: skip
    plan = plan_links(mixed, netem=True, ebpf_reason="no clang here")
    lines = describe_plan(mixed, plan, tools)
    assert lines[0].startswith("# star4_bmv2's links: every link 1000 Mbit/s")
    assert lines[1:] == [
        f"# s1: soft switch, Python data plane: {plan.datapaths['s1'].reason}",
        f"# s2: bmv2 switch, p4/ina.p4 data plane (64 lanes): {switch}, compiled by {compiler}",
    ]
    assert "no clang here" in lines[1]
    precompiled = Bmv2Tools(switch)  # a JSON at hand: no compiler
    lines = describe_plan(star, plan_links(star, netem=True, ebpf_reason=None), precompiled)
    assert lines[1:] == [f"# s1: bmv2 switch, p4/ina.p4 data plane (64 lanes): {switch}"]
