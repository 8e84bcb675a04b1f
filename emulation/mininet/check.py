"""``inalab emulate TOPOLOGY check``: what a run would build, said without building it.

Emulation layer, the part of ``inalab emulate`` that needs neither root nor Mininet. It
reads the topology as a run does (:func:`~emulation.topology.load_topology`, then the
``--bw``/``--delay``/``--jitter``/``--link-loss`` overrides of
:func:`~emulation.mininet.overrides.apply_overrides`) and makes the decisions a run makes before it
touches the kernel: who emulates the links' delay and loss and each soft switch's data
plane (:func:`~emulation.mininet.datapaths.plan_links`), what bmv2 refuses
(:func:`~emulation.bmv2.check_bmv2_switch`), each job's ranks and aggregation tree
(:func:`~emulation.topology.aggregation_tree`) and what dynamiccl is told of its network
(:func:`~emulation.topology.summary.summarize_topology`), and warns of links where a job's
INA traffic converges before a switch sums it (:mod:`emulation.topology.convergence`).

What only root can find out, whether the eBPF data plane loads here, is reported as
decided at run time, with what it depends on. The machine's tools (Mininet's ``mnexec``,
bmv2's) are reported as found or not: a check is made where they may be missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emulation.mininet.datapaths import DatapathChoice, LinkPlan, netem_available, plan_links
from emulation.topology import Link, Topology, TopologyError, TopologyJob, aggregation_tree

if TYPE_CHECKING:
    from dynamiccl.model import TopologySummary

__all__ = ["CheckError", "Machine", "check_report", "run_check"]

PROG = "inalab emulate"

AT_RUN_TIME = "auto: decided at run time: ebpf where it runs (root, clang and libbpf), else python"
"""A soft switch's data plane when the choice hangs on the eBPF program loading, which
only root can try."""


class CheckError(ValueError):
    """The topology, with the options given, cannot be emulated; the message says why."""


@dataclass(frozen=True)
class Machine:
    """What the run's decisions depend on that is not in the topology.

    Attributes:
        root: the check runs as root (then the eBPF data plane's fate is known here).
        netem: the kernel has netem (:func:`~emulation.mininet.datapaths.netem_available`).
        ebpf_reason: as root, why the eBPF data plane cannot run here (None: it can).
    """

    root: bool
    netem: bool
    ebpf_reason: str | None = None

    @classmethod
    def here(cls) -> Machine:
        """This machine, probed (as root, the eBPF data plane's requirements too)."""
        root = os.geteuid() == 0
        reason = None
        if root:
            from emulation.softswitch.ebpf import ebpf_unavailable

            reason = ebpf_unavailable()
        return cls(root=root, netem=netem_available(), ebpf_reason=reason)


def run_check(args: argparse.Namespace) -> int:
    """``inalab emulate TOPOLOGY [options] check``: print what would be built; 0 if the
    topology can be emulated with these options, 2 (one line on stderr) if not: bad input,
    as every ``inalab`` command reports it (:mod:`emulation.cli`)."""
    try:
        print(check_report(args, Machine.here()))
    except (TopologyError, CheckError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def check_report(args: argparse.Namespace, machine: Machine) -> str:
    """The report of ``inalab emulate ... check`` for ``args`` (its parsed options) on
    ``machine``.

    Raises:
        TopologyError: the file cannot be read or is not a valid topology.
        CheckError: what the options or this machine's kernel make impossible: an unknown
            ``--job``, a link that cannot be emulated here, a data plane that cannot be,
            a bmv2 switch that ``p4/`` cannot be.
    """
    from emulation.mininet.overrides import apply_overrides, default_lanes
    from emulation.topology import load_topology

    topo = load_topology(args.topology)
    topo = apply_overrides(topo, args.bw, args.delay, args.link_loss, None, args.jitter,
                           args.link_dup, args.link_reorder)  # fmt: skip
    jobs = _chosen_jobs(topo, args.job)
    _check_bmv2(topo, args.switch_slots)  # in the run's order: bmv2, then the links
    plan = _plan(topo, args.datapath, args.pcap, machine)
    lines = [
        f"# {PROG} {args.topology} check: {topo.name} is valid: {_count(topo.hosts, 'host')},"
        f" {_count(topo.switches, 'switch')}, {_count(topo.links, 'link')},"
        f" {_count(topo.jobs, 'job')}; nothing is built now",
        *_hosts(topo),
        *_switches(topo, plan, args, machine, default_lanes(topo)),
        *_links(topo, plan),
        *_jobs(topo, jobs, args.job),
        *_sharing(topo, args),
        *_convergence(topo, args.topology),
        *_tools(topo, getattr(args, "p4_tools", None)),
    ]
    return "\n".join(lines)


def _count(items: tuple[object, ...], noun: str) -> str:
    plural = noun + ("es" if noun.endswith("h") else "s")
    return f"{len(items)} {noun if len(items) == 1 else plural}"


def _chosen_jobs(topo: Topology, job_id: int | None) -> tuple[TopologyJob, ...]:
    """The topology's jobs; ``--job`` must name one of them.

    Raises:
        CheckError: no job ``job_id``.
    """
    if job_id is not None and all(j.job_id != job_id for j in topo.jobs):
        known = ", ".join(str(j.job_id) for j in topo.jobs) or "none"
        raise CheckError(f"--job {job_id}: topology {topo.name} has no such job (jobs: {known})")
    return topo.jobs


def _plan(topo: Topology, datapath: str | None, pcap: bool, machine: Machine) -> LinkPlan:
    """The run's link plan, as far as it is known without root: the plan as if the eBPF
    data plane could run (what it cannot depend on is then an error of the options);
    as root, the plan of this machine.

    Raises:
        CheckError: the plan is impossible.
    """
    reason = machine.ebpf_reason if machine.root else None
    try:
        return plan_links(
            topo, netem=machine.netem, ebpf_reason=reason, override=datapath, pcap=pcap
        )
    except ValueError as exc:
        raise CheckError(str(exc)) from None


def _check_bmv2(topo: Topology, slots: int) -> None:
    """What bmv2 refuses, as the run refuses it before it starts.

    Raises:
        CheckError: a bmv2 switch ``p4/ina.p4`` cannot be.
    """
    bmv2 = [s for s in topo.switches if s.kind == "bmv2"]
    if not bmv2:
        return
    from emulation.bmv2 import check_bmv2_switch  # imports gRPC: only when needed

    for s in bmv2:
        try:
            check_bmv2_switch(s.lanes, slots, s.role == "forward")
        except ValueError as exc:
            raise CheckError(f"switch {s.name}: {exc}") from None


def _hosts(topo: Topology) -> list[str]:
    lines = [f"hosts ({len(topo.hosts)}): name, address, MAC, ranks, attached to"]
    for h in topo.hosts:
        switch, port, _ = topo.attachment(h.name)
        ranks = _count((None,) * h.ranks, "rank")
        lines.append(f"  {h.name:<10} {h.ip:<18} {h.mac}  {ranks:<8}  {switch} port {port}")
    return lines


def _switches(
    topo: Topology, plan: LinkPlan, args: argparse.Namespace, machine: Machine, lanes: int
) -> list[str]:
    lines = [
        f"switches ({len(topo.switches)}): kind, role, int32 lanes per INA packet, slots per"
        f" set; a soft switch's data plane and why (bench, calibrate and replay set every"
        f" soft switch's lanes to their --lanes, default {lanes} here)"
    ]
    for s in topo.switches:
        if s.kind == "bmv2":
            what = "bmv2 (p4/ina.p4 on simple_switch_grpc)"
            plane = "data plane: p4/ina.p4"
        else:
            what = "soft"
            wanted = args.datapath or s.datapath
            plane = "data plane: " + _datapath(plan.datapaths[s.name], wanted, machine)
        ports = ", ".join(f"{p}: {n}" for p, n in topo.ports(s.name).items())
        role = s.role
        if s.fallback is not None:
            role += f" (fallback {s.fallback})"
        elif s.role == "fallback":
            front = [o.name for o in topo.switches if o.fallback == s.name]
            role += f" (of {', '.join(front)}: finishes what its shared region cannot hold)"
        lines.append(
            f"  {s.name:<10} {what}, {role}, {s.lanes} lanes, {args.switch_slots} slots; {plane}"
        )
        lines.append(f"  {'':<10} ports {ports}")
    return lines


def _datapath(choice: DatapathChoice, wanted: str, machine: Machine) -> str:
    """A soft switch's data plane as the run would choose it, and why; without root, an
    ``auto`` switch the eBPF program could serve is decided at run time."""
    if choice.datapath == "ebpf" and not machine.root:
        if wanted == "ebpf":
            return "ebpf (asked for; it needs root, clang and libbpf at run time)"
        return AT_RUN_TIME
    return f"{choice.datapath} ({choice.reason})"


def _links(topo: Topology, plan: LinkPlan) -> list[str]:
    """Every link as it would be applied (overrides included), and who applies what."""
    from emulation.mininet.overrides import describe_links

    lines = [f"links ({len(topo.links)}): {describe_links(topo, plan.netem)}"]
    for link in topo.links:
        lines.append(
            f"  {_end(link.a, link.a_port)} - {_end(link.b, link.b_port)}: {_values(link)}"
        )
    if not any(link.delay or link.loss or link.jitter for link in topo.links):
        return lines
    if plan.netem:
        lines.append(
            "  delay, jitter and loss: netem on the links' interfaces (this kernel has it)"
        )
        return lines
    lines.append("  delay and loss: the soft switches' ports (this kernel has no netem):")
    for name, ports in plan.specs.items():
        for port, spec in sorted(ports.items()):
            lines.append(f"    {name} --link {port}:{spec}")
    return lines


def _end(node: str, port: int | None) -> str:
    return node if port is None else f"{node}:{port}"


def _values(link: Link) -> str:
    rate = "unshaped" if link.bw is None else f"{link.bw:g} Mbit/s"
    jitter = f" +/- {link.jitter:g} ms" if link.jitter else ""
    queue = "" if link.queue is None else f", queue {link.queue} packets"
    faults = f"loss {link.loss:g}" + (f", dup {link.dup:g}" if link.dup else "")
    faults += f", reorder {link.reorder:g}" if link.reorder else ""
    return f"{rate}, {link.delay:g} ms{jitter} one way, {faults} each way{queue}"


def _jobs(topo: Topology, jobs: tuple[TopologyJob, ...], job_id: int | None) -> list[str]:
    from emulation.topology.summary import summarize_topology

    if not jobs:
        return [
            "jobs: none: only `up` (the default action) and --cli can run; bench, calibrate,"
            " switch-only, run and replay need a job"
        ]
    used = job_id if job_id is not None else jobs[0].job_id
    lines = [
        f"jobs ({len(jobs)}): bench, calibrate, switch-only, run and replay use job {used}"
        + ("" if job_id is not None else " (the first; --job picks another)")
    ]
    for job in jobs:
        tree = aggregation_tree(topo, job)
        ranks = [(h, k) for h in job.workers for k in range(topo.host(h).ranks)]
        shape = "hierarchical" if tree.hierarchical else "flat"
        lines.append(
            f"  job {job.job_id}: {_count(tuple(ranks), 'rank')} on"
            f" {_count(job.workers, 'host')},"
            f" aggregated at {job.switch} ({shape})"
        )
        for r, (h, k) in enumerate(ranks):
            lines.append(
                f"    rank {r:<3} {h} ({topo.host(h).address}, local rank {k}),"
                f" sends to {tree.host_switch[h]}"
            )
        for s, members in sorted(tree.members.items(), key=lambda sm: (sm[0] != tree.root, sm[0])):
            up = f", sends its partial sums to {tree.parent[s]}" if s in tree.parent else ""
            lines.append(f"    {s} sums {', '.join(members)}{up}")
        lines.append(f"    dynamiccl is told: {_summary(summarize_topology(topo, job.job_id))}")
    return lines


def _sharing(topo: Topology, args: argparse.Namespace) -> list[str]:
    """``--sharing`` other than ``reserve``: whether the bench's jobs (``--jobs``, else
    ``--job`` or the first) can have it, and what each job takes
    (:func:`~emulation.mininet.sharing.plan_sharing`; the window of ``shared`` is the
    bench's ``--slots``, given after ``bench``, so only the pool is checked here).

    Raises:
        CheckError: a ``--jobs`` id the topology has not, or a policy the jobs cannot have.
    """
    from emulation.mininet.sharing import plan_sharing

    policy = getattr(args, "sharing", "reserve")
    if policy == "reserve":
        return []
    ids = args.jobs or [args.job if args.job is not None else None]
    by_id = {j.job_id: j for j in topo.jobs}
    if not topo.jobs:
        raise CheckError(f"--sharing {policy}: topology {topo.name} has no jobs")
    chosen = []
    for job_id in ids:
        if job_id is not None and job_id not in by_id:
            raise CheckError(f"--jobs: topology {topo.name} has no job {job_id}")
        chosen.append(by_id[job_id] if job_id is not None else topo.jobs[0])
    try:
        plan = plan_sharing(topo, chosen, policy, 1, args.switch_slots)
    except ValueError as exc:
        raise CheckError(str(exc)) from None
    names = ", ".join(str(j.job_id) for j in chosen)
    if plan.policy == "partition":
        what = f"each reserves {plan.window} of {plan.pool} slots, its window"
    elif plan.policy == "dynamic":
        what = plan.describe().removeprefix("sharing: dynamic: ")
    else:
        fallbacks = ", ".join(f"{f} behind {s}" for s, f in plan.fallbacks.items())
        what = (f"each reserves none and shares its window (the bench's --slots, at most"
                f" {plan.pool}) in a region of the whole pool ({plan.pool} slots); fallback"
                f" {fallbacks}")  # fmt: skip
    return [f"sharing: {policy} for the bench of job(s) {names}: {what}"]


def _convergence(topo: Topology, path: str) -> list[str]:
    """A warning per link where a job's INA streams converge before a switch sums them
    (:func:`~emulation.topology.convergence.convergence_notes`): the run goes ahead, slower."""
    from emulation.topology.convergence import convergence_notes

    notes = convergence_notes(topo, path)
    if not notes:
        return []
    links = sum(n.startswith("warning: job ") for n in notes)
    return [
        f"convergence ({_count((None,) * links, 'link')}): several streams of a job's INA"
        " traffic share these links before a switch sums them (a warning: the run goes ahead)",
        *(f"  {n}" for n in notes),
    ]


def _summary(summary: TopologySummary) -> str:
    rate = (
        "unshaped"
        if summary.link_bandwidth is None
        else f"{summary.link_bandwidth * 8 / 1e6:g} Mbit/s"
    )
    return (
        f"slowest worker link {rate}, one-way delay {summary.delay * 1e3:g} ms, loss"
        f" {summary.loss:g}, {summary.hops} switch hop(s), oversubscription"
        f" {summary.oversubscription:g}, INA fan-in {summary.fan_in}"
    )


def _tools(topo: Topology, p4_tools: str | None) -> list[str]:
    """The machine's tools the run needs, found or not (never an error: a check may run
    on another machine than the emulation, or without the sudo that finds them)."""
    found = shutil.which("mnexec")
    lines = [
        "# here: Mininet's mnexec "
        + (f"at {found}" if found else "not found (apt-get install -y mininet)")
        + "; a run needs root: sudo .venv/bin/inalab emulate ..."
    ]
    if any(s.kind == "bmv2" for s in topo.switches):
        from emulation.bmv2 import Bmv2Unavailable, find_bmv2

        try:
            tools = find_bmv2(path=p4_tools)  # --p4-tools, where given, else PATH
            lines.append(f"# here: bmv2's {tools.switch} and {tools.compiler}")
        except Bmv2Unavailable as exc:
            lines.append(f"# here: {exc}")
    return lines
