"""``inalab emulate TOPOLOGY check``: what a run would build, without root or Mininet.

The report is checked against the same decisions a run makes (the link plan, the
aggregation tree, the summary dynamiccl is given) on a machine described explicitly
(:class:`Machine`), so the tests mean the same as root and as a user; the command itself
runs as a subprocess, as typed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emulation.cli import build_parser
from emulation.mininet.check import AT_RUN_TIME, CheckError, Machine, check_report
from emulation.topology import TopologyError

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"

USER = Machine(root=False, netem=False)
"""A user on a kernel without netem (this project's CI kernel): eBPF cannot be tried."""


def _args(topology: Path | str, *options: str) -> argparse.Namespace:
    return build_parser().parse_args(["emulate", str(topology), *options, "check"])


def _report(topology: str, *options: str, machine: Machine = USER) -> str:
    return check_report(_args(TOPOLOGIES / topology, *options), machine)


def test_star4_with_overrides_as_a_user() -> None:
    report = _report("star4.yaml", "--bw", "100", "--link-loss", "0.01")
    lines = report.splitlines()
    assert lines[0].endswith(
        "star4 is valid: 4 hosts, 1 switch, 4 links, 1 job; nothing is built now"
    )
    assert "  h3         10.0.0.3/24        00:00:00:00:00:03  1 rank    s1 port 3" in lines
    # auto: eBPF would serve s1 (no delay), but only root can load it.
    assert f"1024 slots; data plane: {AT_RUN_TIME}" in report
    assert "links (4): every link 100 Mbit/s, 0 ms one way, loss 0.01 each way" in report
    assert "  h1 - s1:1: 100 Mbit/s, 0 ms one way, loss 0.01 each way" in lines
    # No netem: the switch's ports apply the loss, each direction of a host link once.
    assert "    s1 --link 4:delay=0ms,loss=0.01,ingress" in lines
    assert "  job 1: 4 ranks on 4 hosts, aggregated at s1 (flat)" in lines
    assert "    rank 3   h4 (10.0.0.4, local rank 0), sends to s1" in lines
    assert "    s1 sums h1, h2, h3, h4" in lines
    assert "dynamiccl is told: slowest worker link 100 Mbit/s, one-way delay 0 ms, loss 0.01," in (
        report
    )


def test_hierarchical_job_ranks_and_tree() -> None:
    report = _report("leaf_spine_hier.yaml", "--delay", "1ms")
    assert "aggregated at spine (hierarchical)" in report
    assert "    leaf2 sums h5, h6, h7, h8, sends its partial sums to spine" in report
    assert "    spine sums leaf1, leaf2" in report
    assert "one-way delay 2 ms" in report  # two 1 ms hops from a host to the spine
    # A delay without netem needs the Python delay line: decided here, root or not.
    assert "data plane: python (port 1's link has a delay and this kernel has no netem" in (report)
    assert AT_RUN_TIME not in report


def test_a_flat_fat_tree_warns_where_its_ina_traffic_converges() -> None:
    lines = _report("fat_tree_k4.yaml", "--bw", "100").splitlines()
    start = lines.index(
        "convergence (12 links): several streams of a job's INA traffic share these links"
        " before a switch sums them (a warning: the run goes ahead)"
    )
    warnings = lines[start + 1 : start + 14]
    assert warnings[0] == (
        "  warning: job 1: link p1e1 - p1a1: fan-in 2 (h1, h2) unsummed toward c1, each way:"
        " INA needs at least 2x a host link's time (2 x S at 100 Mbit/s vs S at 100 Mbit/s);"
        " set `role: aggregate` on switch p1e1 to sum them there"
    )
    assert "  warning: job 1: link p4a1 - c1: fan-in 4 (h13, h14, h15, h16)" in warnings[11]
    assert warnings[12] == (
        f"  warning: or use {TOPOLOGIES / 'fat_tree_k4_hier.yaml'}, the same network"
        " aggregating lower in the tree"
    )
    assert lines[start + 14].startswith("# here: ")


@pytest.mark.parametrize(
    "topology", ["fat_tree_k4_hier.yaml", "star4.yaml", "leaf_spine_hier.yaml"]
)
def test_no_warning_where_switches_sum_before_streams_meet(topology: str) -> None:
    report = _report(topology)
    assert "warning" not in report and "convergence" not in report


def test_collnet_host_ranks_are_consecutive() -> None:
    report = _report("collnet2x2.yaml")
    assert "  job 1: 4 ranks on 2 hosts" in report
    assert "    rank 1   h1 (10.0.0.1, local rank 1), sends to s1" in report
    assert "    rank 2   h2 (10.0.0.2, local rank 0), sends to s1" in report


@pytest.mark.parametrize(
    ("machine", "datapath", "plane"),
    [
        (Machine(root=True, netem=False), None, "ebpf (the kernel data plane runs here)"),
        (
            Machine(root=True, netem=False, ebpf_reason="the eBPF data plane needs clang"),
            None,
            "python (the eBPF data plane needs clang)",
        ),
        (USER, "python", "python (asked for)"),
        (USER, "ebpf", "ebpf (asked for; it needs root, clang and libbpf at run time)"),
    ],
)
def test_a_soft_switchs_data_plane(machine: Machine, datapath: str | None, plane: str) -> None:
    options = ("--datapath", datapath) if datapath else ()
    assert f"data plane: {plane}" in _report("star4.yaml", *options, machine=machine)


def test_netem_applies_delay_and_loss_where_the_kernel_has_it() -> None:
    report = _report(
        "star4.yaml", "--delay", "2ms", "--jitter", "0.5", machine=Machine(root=False, netem=True)
    )
    assert "  h2 - s1:2: 1000 Mbit/s, 2 ms +/- 0.5 ms one way, loss 0 each way" in report
    assert "delay, jitter and loss: netem on the links' interfaces" in report
    assert "--link" not in report
    assert f"data plane: {AT_RUN_TIME}" in report  # netem delays: the switch may be eBPF


def test_a_topology_without_jobs_can_only_stay_up(tmp_path: Path) -> None:
    text = (TOPOLOGIES / "star4.yaml").read_text()
    no_jobs = tmp_path / "nojobs.yaml"
    no_jobs.write_text(text[: text.index("jobs:")])
    report = check_report(_args(no_jobs), USER)
    assert "star4 is valid: 4 hosts, 1 switch, 4 links, 0 jobs" in report
    assert "jobs: none: only `up` (the default action) and --cli can run" in report


@pytest.mark.parametrize(
    ("topology", "options", "machine", "message"),
    [
        ("star4.yaml", ("--job", "7"), USER, "--job 7: topology star4 has no such job (jobs: 1)"),
        ("star4.yaml", ("--jitter", "1"), USER, "link h1-s1 asks for jitter, which needs netem"),
        (
            "star4.yaml",
            ("--datapath", "ebpf"),
            Machine(root=True, netem=False, ebpf_reason="the eBPF data plane needs libbpf"),
            "switch s1: datapath ebpf: the eBPF data plane needs libbpf",
        ),
        ("star4_bmv2.yaml", ("--link-loss", "0.01"), USER, "link h1-s1 asks for delay or loss"),
        ("tutorials_triangle.json", (), USER, "switch s1: bmv2 cannot be a forward-only switch"),
    ],
)
def test_what_cannot_be_emulated_is_an_error(
    topology: str, options: tuple[str, ...], machine: Machine, message: str
) -> None:
    with pytest.raises(CheckError) as caught:
        _report(topology, *options, machine=machine)
    assert str(caught.value).startswith(message)


def test_an_invalid_file_is_a_topology_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((TOPOLOGIES / "star4.yaml").read_text().replace("[h4, s1]", "[h4, s9]"))
    with pytest.raises(TopologyError, match=r"bad\.yaml:17:\d+: links\[3\]\.b: unknown node"):
        check_report(_args(bad), USER)


def _inalab(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def test_the_command_exits_0_with_the_report() -> None:
    proc = _inalab("emulate", "topologies/star8.yaml", "--bw", "200", "check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "star8 is valid: 8 hosts, 1 switch, 8 links, 4 jobs" in proc.stdout
    assert "every link 200 Mbit/s" in proc.stdout
    assert "# run dir" not in proc.stdout  # nothing was made


def test_a_convergence_warning_keeps_exit_status_0() -> None:
    proc = _inalab("emulate", "topologies/leaf_spine.yaml", "check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "  warning: job 1: link leaf2 - spine: fan-in 4 (h5, h6, h7, h8)" in proc.stdout
    assert "  warning: or use topologies/leaf_spine_hier.yaml," in proc.stdout


def test_the_command_needs_no_mininet() -> None:
    code = (
        "import sys; from emulation.cli import main; "
        "status = main(['emulate', 'topologies/leaf_spine_hier.yaml', 'check']); "
        "print(status, *sorted(sys.modules), file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    status, *modules = proc.stderr.split()
    assert status == "0"
    assert "emulation.mininet.check" in modules
    assert not [
        m for m in modules if m.split(".")[0] == "mininet" or m == "emulation.mininet.network"
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("links: [h1, {", r"bad\.yaml:1:14: not YAML: expected the node content"),
        ("hosts: {h1: {}}\nswitches: {s1: {}}\nlinks: [[h1, s2]]\n", r"bad\.yaml:3:\d+: links"),
    ],
)
def test_the_command_exits_2_with_one_line(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    proc = _inalab("emulate", str(bad), "check")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"inalab emulate: error: {bad}:")
    assert re.search(message, proc.stderr), proc.stderr


@pytest.mark.parametrize("action", ["check", "bench", "up", "switch-only", "wire-floor"])
def test_a_missing_topology_is_a_usage_error_whatever_the_action(
    tmp_path: Path, action: str
) -> None:
    """Issue #38: one error, one exit code (2, as argparse's own) under every action."""
    proc = _inalab("emulate", str(tmp_path / "none.yaml"), action)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot read topology" in proc.stderr
