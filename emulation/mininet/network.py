"""A :class:`Topology` brought up as a Mininet network, with inalab's switches.

Mininet builds the hosts (network namespaces) and links (veth pairs, HTB-shaped with
``bw``); the switches are ours, never Open vSwitch: :class:`SoftMininetSwitch` runs
``inalab switch --interface`` on the switch's interfaces (each a port numbered as the
topology says), in the root namespace, and is ready when its P4Runtime server answers.
Once started, :meth:`Emulation.configure` drives every switch through the controller:

- forwarding: each switch gets an entry per host MAC toward the port on a shortest
  path; there is no flooding (a fat tree has loops), so every host gets static ARP
  entries for every other host and for the switches' INA address;
- jobs: each job of the topology is installed on the switches of its aggregation tree
  (:func:`~emulation.topology.aggregation_tree`): flat on one switch, or hierarchical,
  leaves sending partial sums upward; rank k of a host binds
  :data:`WORKER_UDP_PORT` + k. How a job takes its switch's memory is the
  :class:`~emulation.mininet.sharing.SharingPlan`'s: a reservation of its window, or
  (``shared``) its window in the switch's shared region, with the topology's
  ``role: fallback`` node linked to the switch as its fallback aggregator, where the job
  is installed behind the switch.

Links: ``bw`` is HTB (Mininet's TCLink) and ``queue`` a pfifo under HTB's class;
``delay``, ``jitter`` and ``loss`` are netem's where the kernel has it, else the soft
switches' ports apply delay and loss (:mod:`emulation.mininet.datapaths` decides, and picks
each soft switch's data plane: the eBPF program on its ports or the Python pipeline);
``dup`` and ``reorder`` are the eBPF program's, the latter in two lanes of the switch
end's HTB class made here.
The MTU is raised to :data:`JUMBO_MTU` when the widest INA packet needs it. After
start, ``run_dir/manifest.json`` names every switch's P4Runtime endpoint, INA address,
data plane, log and pcap, and every host's address and namespace.

Switch kinds are injected by name (:data:`SWITCH_CLASSES`). Cleanup is Mininet's
``stop`` for what it built and each switch process's recorded PID: never ``mn -c``,
never a name pattern.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from controller.forwarder import HostRoute
from controller.switch import SwitchController, WorkerAddress
from emulation.bmv2 import Bmv2Tools, Bmv2Unavailable, check_bmv2_switch, find_bmv2
from emulation.mininet.datapaths import LinkPlan, netem_available, plan_links
from emulation.mininet.nodes import SWITCH_CLASSES, bmv2_switch_class
from emulation.mininet.sharing import COUNTERS, SharingPlan
from emulation.topology import (
    AggregationTree,
    Link,
    Topology,
    TopologyJob,
    aggregation_tree,
    shortest_path_tree,
)
from hostlib.protocol import INA_UDP_PORT, packet_size

__all__ = [
    "JUMBO_MTU",
    "MANIFEST_SCHEMA",
    "SWITCH_CLASSES",
    "WORKER_UDP_PORT",
    "Emulation",
    "EmulationError",
    "emulate",
    "ina_address",
]

log = logging.getLogger(__name__)


def ina_address(index: int) -> tuple[str, str]:
    """(IPv4, MAC) where hosts send INA packets for the ``index``-th switch (from 1): an
    address no host has, resolved by static ARP; switches on the way forward frames to
    that MAC toward it, and it answers from the address, as ``p4/`` does."""
    return f"10.255.255.{index}", f"02:00:00:00:ff:{index:02x}"


WORKER_UDP_PORT = 47000
"""The UDP port rank 0 of a host binds (rank k: + k) for the topology's own jobs."""

JUMBO_MTU = 9000
"""Interface MTU when an INA packet does not fit 1500 bytes (lanes above 363)."""

MANIFEST_SCHEMA = "inalab.emulation/1"
"""The ``schema`` value of ``manifest.json``; bumped on incompatible change."""

Addr = tuple[str, int]


class EmulationError(RuntimeError):
    """The topology cannot be emulated here (a missing tool, an unsupported link)."""


@dataclass
class Emulation:
    """A started network: the Mininet object, its topology, and a controller per switch."""

    topology: Topology
    net: Any
    run_dir: Path
    controllers: dict[str, SwitchController]
    slot_count: int = 256
    plan: LinkPlan | None = None
    """Who emulates the links, and each soft switch's data plane (with the reason)."""
    installed: dict[int, list[str]] = field(default_factory=dict)
    """Job id -> the switches it is installed on (what :meth:`remove_job` undoes)."""
    in_order_links: bool = False
    """Every veth runs with :data:`IN_ORDER_FEATURES` (eBPF switches only)."""
    sharing: SharingPlan | None = None
    """How each job takes its switch's memory (None: a reservation of ``slot_count``)."""
    sharing_counters: dict[int, dict[str, int]] = field(default_factory=dict)
    """Job id -> its sharing counters on its switch (``shared`` policy), summed over
    every install, read as each install is removed (:meth:`remove_job`)."""

    def host(self, name: str) -> Any:
        return self.net.get(name)

    @property
    def frames_leave_the_kernel(self) -> bool:
        """Whether some switch handles frames in a process (the Python data plane, bmv2),
        rather than all in the kernel (eBPF)."""
        kernel = self.plan.datapaths if self.plan is not None else {}
        return any(
            s.kind != "soft" or kernel.get(s.name) is None or kernel[s.name].datapath != "ebpf"
            for s in self.topology.switches
        )

    @cached_property
    def hops(self) -> dict[str, dict[str, int]]:
        """Switch -> node -> the switch's port on a shortest path to the node."""
        return {s.name: _first_hops(self.topology, s.name) for s in self.topology.switches}

    def ina_address(self, switch: str) -> tuple[str, str]:
        """(IPv4, MAC) hosts send INA packets to for jobs aggregated at ``switch``."""
        names = [s.name for s in self.topology.switches]
        return ina_address(names.index(switch) + 1)

    def configure(self, install_jobs: bool = True) -> None:
        """Forwarding entries, static ARP and, with ``install_jobs``, every job of the
        topology (rank r of a host with k ranks at UDP port WORKER_UDP_PORT + r)."""
        topo = self.topology
        aggregators = [s for s in topo.switches if s.role == "aggregate"]
        hops = self.hops
        for s in topo.switches:
            ctl = self.controllers[s.name]
            for h in topo.hosts:
                port = _port_toward(hops[s.name], s.name, h.name)
                ctl.forwarder.add_host(HostRoute(h.mac, port))
            for agg in aggregators:
                if agg.name != s.name:
                    port = _port_toward(hops[s.name], s.name, agg.name)
                    ctl.forwarder.add_host(HostRoute(self.ina_address(agg.name)[1], port))
        if self.in_order_links:
            self._keep_flows_in_order()
        for h in topo.hosts:
            node = self.host(h.name)
            intf = node.defaultIntf().name
            if self.frames_leave_the_kernel:
                # A veth hands a raw socket TCP/UDP packets whose checksum the NIC was to
                # fill in; a switch that reads frames into a process and writes them out
                # again (the Python data plane, bmv2) loses that, so hosts compute
                # checksums. eBPF switches pass the kernel's checksum state along, and
                # hosts keep their offloads (checksums, TCP segmentation), as on a NIC
                # (TCP segmentation is off with in_order_links: IN_ORDER_FEATURES).
                out = node.cmd(f"ethtool -K {intf} tx off rx off")
                if "not found" in out:
                    raise EmulationError("ethtool is missing (apt-get install -y ethtool)")
            for agg in aggregators:
                ip, mac = self.ina_address(agg.name)
                node.cmd(f"ip neigh replace {ip} lladdr {mac} dev {intf}")
                node.cmd(f"ip route replace {ip}/32 dev {intf}")
            for other in topo.hosts:
                if other.name != h.name:
                    node.cmd(f"ip neigh replace {other.address} lladdr {other.mac} dev {intf}")
        if install_jobs:
            for job in topo.jobs:
                ranks = [
                    (name, (topo.host(name).address, WORKER_UDP_PORT + k))
                    for name in job.workers
                    for k in range(topo.host(name).ranks)
                ]
                self.install_job(job, ranks)

    def interfaces(self) -> Iterator[Any]:
        """Both ends of every link of the running network (Mininet interfaces)."""
        for link in self.net.links:
            yield link.intf1
            yield link.intf2

    def _keep_flows_in_order(self) -> None:
        """Have every veth of the network deliver its frames in the order it sent them
        (:data:`IN_ORDER_FEATURES` on both ends of every link).

        Raises:
            EmulationError: ethtool is missing or refused a feature.
        """
        for intf in self.interfaces():
            out = intf.cmd(f"ethtool -K {intf.name} {IN_ORDER_FEATURES} 2>&1 >/dev/null")
            _check(out, f"{intf.name}: ethtool -K {IN_ORDER_FEATURES}")

    def install_job(
        self, job: TopologyJob, workers: Sequence[tuple[str, Addr]]
    ) -> list[tuple[Addr, int]]:
        """Install ``job`` for ``workers`` (host name, UDP address), in rank order; return
        each worker's destination (its aggregating switch's INA address) and the rank
        its packets carry there.

        With hierarchical aggregation (:func:`~emulation.topology.aggregation_tree`)
        each aggregating switch gets the job for its members (hosts' workers, then child
        switches), and every switch below the root an upstream entry toward its parent,
        as that parent's worker at its own INA address and port 20033.

        Raises:
            EmulationError: a worker is not on one of the job's hosts, or an install
                failed (what was installed is removed again).
        """
        tree = aggregation_tree(self.topology, job)
        shared = self.sharing is not None and self.sharing.fallback
        if shared and tree.hierarchical:
            raise EmulationError(f"job {job.job_id}: shared switch memory is for a job on one"
                                 " switch, not hierarchical aggregation")  # fmt: skip
        hops = self.hops
        per_switch: dict[str, list[WorkerAddress]] = {s: [] for s in tree.members}
        answers: list[tuple[Addr, int]] = []
        for host_name, (ip, port) in workers:
            if host_name not in tree.host_switch:
                raise EmulationError(f"job {job.job_id}: {host_name} is not one of its hosts")
            s = tree.host_switch[host_name]
            mac = self.topology.host(host_name).mac
            answers.append(((self.ina_address(s)[0], INA_UDP_PORT), len(per_switch[s])))
            per_switch[s].append(WorkerAddress(ip, port, mac, _port_toward(hops[s], s, host_name)))
        order = [s.name for s in self.topology.switches]
        for s, members in tree.members.items():
            for child in members:
                if child in tree.parent:
                    ip, mac = self.ina_address(child)
                    port = _port_toward(hops[s], s, child)
                    per_switch[s].append(WorkerAddress(ip, INA_UDP_PORT, mac, port))
        done: list[str] = []
        try:
            # The root first, then down: a child's partial sums find their job ready.
            for s in sorted(per_switch, key=lambda n: (_depth(tree, n), order.index(n))):
                ctl = self.controllers[s]
                if shared:
                    self._add_shared(job.job_id, s, per_switch[s], done)
                else:
                    ctl.add_job(job.job_id, per_switch[s], slot_count=self.slot_count)
                done.append(s)
                if s in tree.parent:
                    up = tree.parent[s]
                    ip, mac = self.ina_address(up)
                    rank = tree.members[up].index(s)
                    port = _port_toward(hops[s], s, up)
                    ctl.set_upstream(job.job_id, rank, WorkerAddress(ip, INA_UDP_PORT, mac, port))
                    ctl.check_upstream(job.job_id, self.controllers[up])
        except Exception as exc:
            for s in reversed(done):
                self.controllers[s].remove_job(job.job_id)
            raise EmulationError(f"job {job.job_id}: install on {s} failed: {exc}") from exc
        self.installed[job.job_id] = done
        return answers

    def fallback_of(self, switch: str) -> str:
        """The fallback node the topology gives ``switch`` (``fallback: NAME``).

        Raises:
            EmulationError: ``switch`` has none.
        """
        fallback = self.topology.switch(switch).fallback
        if fallback is None:
            raise EmulationError(f"switch {switch} has no fallback (give it fallback: NAME, a"
                                 " switch of role fallback linked to it)")  # fmt: skip
        return fallback

    def _add_shared(
        self, job_id: int, switch: str, workers: Sequence[WorkerAddress], done: list[str]
    ) -> None:
        """Install a job of the ``shared`` or ``dynamic`` policy: behind ``switch`` on its
        fallback node first (what the switch passes on finds the job there), its whole
        window a reservation there; then on ``switch`` with the plan's reservation and the
        rest of its window in the shared region, the fallback as where collisions go. The
        fallback node, once the job is on it, is appended to ``done`` (what a failure
        removes)."""
        assert self.sharing is not None
        window = self.slot_count
        fallback = self.fallback_of(switch)
        hops = self.hops
        ip, mac = self.ina_address(switch)
        front = WorkerAddress(ip, INA_UDP_PORT, mac, _port_toward(hops[fallback], fallback, switch))
        try:
            self.controllers[fallback].add_behind(job_id, len(workers), window, front)
        except Exception as exc:  # named: the switch's own install is not the one failing
            raise EmulationError(f"behind it, on its fallback {fallback}: {exc}") from exc
        done.append(fallback)
        ip, mac = self.ina_address(fallback)
        back = WorkerAddress(ip, INA_UDP_PORT, mac, _port_toward(hops[switch], switch, fallback))
        plan = self.sharing
        reserved = plan.reserved
        self.controllers[switch].add_job(job_id, workers, reserved, shared=window - reserved,
                                         region=plan.region, fallback=back)  # fmt: skip

    def installed_switches(self, job: TopologyJob) -> list[str]:
        """The switches of ``job``'s aggregation tree, in topology order."""
        members = aggregation_tree(self.topology, job).members
        return [s.name for s in self.topology.switches if s.name in members]

    def remove_job(self, job_id: int) -> None:
        """Remove a job :meth:`install_job` installed, from every switch it is on (a
        fallback node last); a job sharing its switch's memory has its sharing counters
        added to :attr:`sharing_counters` first."""
        shared = self.sharing is not None and self.sharing.fallback
        for s in reversed(self.installed.pop(job_id, [])):
            ctl = self.controllers[s]
            if shared and self.topology.switch(s).fallback is not None:
                self._add_counters(job_id, s)
            ctl.remove_job(job_id)

    def _add_counters(self, job_id: int, switch: str) -> None:
        """Add ``job_id``'s sharing counters on ``switch`` to :attr:`sharing_counters`
        (one that cannot be read is logged: the job is removed all the same)."""
        try:
            counts = self.controllers[switch].job_counters(job_id)
        except Exception as exc:  # the removal matters more than the numbers
            log.warning("job %d: sharing counters on %s unreadable: %s", job_id, switch, exc)
            return
        total = self.sharing_counters.setdefault(job_id, dict.fromkeys(COUNTERS, 0))
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value

    def region_owners(self, switch: str) -> list[int]:
        """The owner register over ``switch``'s shared region
        (``SwitchController.region_owners``): 0 for a free cell, else its holder's ``job
        << 16 | slot + 1``; all free while no job shares it (no region yet).

        Raises:
            EmulationError: no shared region in the plan.
        """
        plan = self.sharing
        if plan is None or plan.region is None:
            raise EmulationError("no shared region: --sharing shared or dynamic")
        owners = self.controllers[switch].region_owners()
        return [0] * plan.region if owners is None else owners

    def set_link_rate(self, mbit: float, links: Sequence[Link] | None = None) -> None:
        """Change the HTB rate of ``links`` (default: every link), both ends, to ``mbit``
        Mbit/s while the network runs (``tc class change`` of the class Mininet's TCLink
        made; a queue or netem below it stays). ``self.topology`` keeps the built rates.

        Raises:
            EmulationError: a link was built unshaped (it has no HTB class: nothing is
                changed then), or tc failed.
        """
        burst = _shaper_burst(mbit)
        chosen = self.topology.links if links is None else links
        unshaped = [f"{link.a}-{link.b}" for link in chosen if link.bw is None]
        if unshaped:
            raise EmulationError(f"link {', '.join(unshaped)} unshaped: no rate to change (give"
                                 " the emulation --bw)")  # fmt: skip
        for link in chosen:
            pair = self.net.linksBetween(self.net.get(link.a), self.net.get(link.b))[0]
            for intf in (pair.intf1, pair.intf2):
                out = intf.cmd(
                    f"tc class change dev {intf.name} parent 5:0 classid 5:1 htb quantum"
                    f" {HTB_QUANTUM} rate {mbit:g}Mbit burst {burst} cburst {burst}"
                )
                _check(out, intf.name)

    def link_drops(self) -> dict[str, int]:
        """Frames each interface of the network dropped on their way out so far, by name:
        its root qdisc's drops (a shaper's queue was full) and the device's own (a veth
        whose peer's receive ring was full). A link's ``loss`` is decided by the switches
        and is not counted here.

        Raises:
            EmulationError: ``ip`` or ``tc`` failed, or printed what this cannot read.
        """
        return {intf.name: _interface_drops(intf) for intf in self.interfaces()}

    def counters(self, switches: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """Each switch's INA statistics (default: every switch)."""
        names = switches if switches is not None else list(self.controllers)
        return {s: dict(self.controllers[s].counters()) for s in names}

    def manifest(self) -> dict[str, Any]:
        """What a controller or a worker needs to reach this network (``manifest.json``)."""
        topo = self.topology
        switches: dict[str, Any] = {}
        for s in topo.switches:
            node = self.net.get(s.name)
            info = dict(node.process.ready_info)
            ip, mac = self.ina_address(s.name)
            info.update(
                kind=s.kind, role=s.role, lanes=s.lanes,
                log=str(node.process.log_path),
                ina_address={"ip": ip, "mac": mac, "udp_port": INA_UDP_PORT},
            )  # fmt: skip
            if s.fallback is not None:
                info["fallback"] = s.fallback
            if self.plan is not None and s.name in self.plan.datapaths:
                choice = self.plan.datapaths[s.name]
                info.update(datapath=choice.datapath, datapath_reason=choice.reason)
            argv = node.process.argv
            for key, suffix in (("pcap", ".pcap"), ("link_stats", ".links.json")):
                if f"--{key.replace('_', '-')}" in argv:  # the soft switch's files
                    info[key] = str(self.run_dir / f"{s.name}{suffix}")
            switches[s.name] = info
        hosts = {}
        for h in topo.hosts:
            node = self.host(h.name)
            hosts[h.name] = {
                "ip": h.address, "mac": h.mac, "interface": node.defaultIntf().name,
                "pid": node.pid, "netns": f"/proc/{node.pid}/ns/net", "ranks": h.ranks,
                "worker_udp_ports": [WORKER_UDP_PORT + k for k in range(h.ranks)],
            }  # fmt: skip
        jobs = []
        for job in topo.jobs:
            tree = aggregation_tree(topo, job)
            jobs.append({
                "id": job.job_id, "switch": job.switch, "workers": list(job.workers),
                "installed_on": self.installed.get(job.job_id, []),
                "host_switch": tree.host_switch, "parent": tree.parent,
            })  # fmt: skip
        return {
            "schema": MANIFEST_SCHEMA,
            "topology": topo.name,
            "run_dir": str(self.run_dir),
            "slot_count": self.slot_count,
            "sharing": None if self.sharing is None else self.sharing.to_json(),
            "links_emulated_by": "netem" if self.plan and self.plan.netem else "switches",
            "switches": switches,
            "hosts": hosts,
            "jobs": jobs,
        }

    def write_manifest(self) -> Path:
        """Write :meth:`manifest` to ``run_dir/manifest.json`` atomically; return its path."""
        path = self.run_dir / "manifest.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        tmp.replace(path)
        return path

    def close(self) -> None:
        for ctl in self.controllers.values():
            ctl.close()
        self.controllers.clear()
        self.net.stop()


def _depth(tree: AggregationTree, switch: str) -> int:
    depth = 0
    while switch in tree.parent:
        switch, depth = tree.parent[switch], depth + 1
    return depth


def _first_hops(topo: Topology, switch: str) -> dict[str, int]:
    """For every node ``switch`` reaches: the port of ``switch`` on a shortest path to
    it (read from :func:`~emulation.topology.shortest_path_tree`)."""
    port_of = {node: port for port, node in topo.ports(switch).items()}
    first: dict[str, int] = {}
    for node, toward in shortest_path_tree(topo, switch).items():  # parents come first
        first[node] = port_of[node] if toward == switch else first[toward]
    return first


def _port_toward(hops: dict[str, int], switch: str, node: str) -> int:
    """``hops[node]`` (from :func:`_first_hops` of ``switch``).

    Raises:
        EmulationError: ``switch`` does not reach ``node``.
    """
    if node not in hops:
        raise EmulationError(f"no path from {switch} to {node}")
    return hops[node]


def _check_supported(topo: Topology, slots: int, bmv2: Bmv2Tools | None) -> Bmv2Tools | None:
    """Refuse what cannot be emulated here; return bmv2's tools (``bmv2``, else found on
    PATH) when a switch is bmv2."""
    for s in topo.switches:
        if s.kind not in SWITCH_CLASSES:
            raise EmulationError(
                f"switch {s.name}: kind {s.kind!r} is not available here "
                f"(have: {', '.join(SWITCH_CLASSES)})"
            )
        if s.kind == "bmv2":
            try:
                bmv2 = bmv2 or find_bmv2()
                check_bmv2_switch(s.lanes, slots, s.role == "forward")
            except (Bmv2Unavailable, ValueError) as exc:
                raise EmulationError(f"switch {s.name}: {exc}") from None
    return bmv2


def _plan(topo: Topology, datapath: str | None, pcap: bool, netem: bool | None) -> LinkPlan:
    """The link plan of ``topo`` on this machine (:func:`emulation.mininet.datapaths.plan_links`).

    Raises:
        EmulationError: the topology or ``datapath`` asks for what cannot be here.
    """
    from emulation.softswitch.ebpf import ebpf_unavailable

    try:
        return plan_links(
            topo, netem=netem_available() if netem is None else netem,
            ebpf_reason=ebpf_unavailable(), override=datapath, pcap=pcap,
        )  # fmt: skip
    except ValueError as exc:
        raise EmulationError(str(exc)) from None


def _link_params(link: Any, plan: LinkPlan) -> dict[str, Any]:
    """Mininet TCLink parameters of a topology link: HTB's bw, and netem's delay, jitter
    and loss (a percentage in Mininet) where netem emulates the links."""
    params: dict[str, Any] = {"port1": link.a_port, "port2": link.b_port}
    if link.bw is not None:
        params["bw"] = link.bw
    if plan.netem:
        if link.delay:
            params["delay"] = f"{link.delay:g}ms"
        if link.jitter:
            params["jitter"] = f"{link.jitter:g}ms"
        if link.loss:
            params["loss"] = link.loss * 100
    return params


def _mtu_for(topo: Topology) -> int | None:
    """An MTU that carries the widest INA packet (``None``: the default 1500 does)."""
    widest = max((s.lanes for s in topo.switches), default=0)
    need = 20 + 8 + packet_size(widest)
    return JUMBO_MTU if need > 1500 else None


def _shape_extras(net: Any, topo: Topology, mtu: int | None) -> None:
    """What Mininet's TCLink cannot do here: a jumbo MTU and the shaper's queue length
    (Mininet sets ``max_queue_size`` through netem; a pfifo under HTB's class does it)."""
    for link in topo.links:
        pair = net.linksBetween(net.get(link.a), net.get(link.b))[0]
        for intf in (pair.intf1, pair.intf2):
            if mtu is not None:
                _check(intf.cmd(f"ip link set dev {intf.name} mtu {mtu}"), intf.name)
            if link.queue is not None:
                parent = "parent 5:1 handle 10:" if link.bw is not None else "root"
                out = intf.cmd(
                    f"tc qdisc replace dev {intf.name} {parent} pfifo limit {link.queue}"
                )
                _check(out, intf.name)


def _reorder_lanes(net: Any, topo: Topology, plan: LinkPlan) -> None:
    """On each soft switch's end of a link that reorders frames, the lanes of its shaper
    that the eBPF program holds frames back in (:mod:`emulation.softswitch.ebpf.lanes`);
    they go with the interface."""
    from emulation.softswitch.ebpf.lanes import lane_commands

    for link in topo.links:
        if not link.reorder:
            continue
        pair = net.linksBetween(net.get(link.a), net.get(link.b))[0]
        for intf in (pair.intf1, pair.intf2):
            if intf.node.name in plan.datapaths:  # a soft switch's end
                for argv in lane_commands(intf.name, link.queue):
                    _check(intf.cmd(shlex.join(argv)), intf.name)


HTB_QUANTUM = 60000
"""Bytes a shaped link's HTB class sends per round: above a jumbo frame (9014 B), below
the 200000 past which tc warns that the quantum (by default rate / 10) is too big."""

IN_ORDER_FEATURES = "tso off gro on"
"""The offloads of every veth with ``in_order_links`` (eBPF switches only), so that a
link keeps each flow's order, as a cable does. A veth hands a frame to its peer in the
sender's context: by default onto the backlog of the CPU that sent it, where each CPU
works through its own. A link's HTB is dequeued on both CPUs (by the sending rank, and
by its timer on the core that armed it), so frames sent one after another can be
received on the two cores at once, the later one first: at 1 Gbit/s, star4 INA, 10-38
of each rank's 499,717 packets reached the switch out of order (captures on both ends),
and hostlib took it for loss (fast retransmissions at zero loss). With GRO on, the
receiving veth queues frames in one ring that one NAPI poll empties, in order; the
kernel takes that path only for frames from a device without TCP segmentation offload
(or with UDP GRO forwarding, which would merge INA datagrams). TCP then leaves a host
in 64 KB sends cut by the kernel's GSO before the veth, merged again by GRO at the next
hop, which costs CPU: why it is not the default.

Measured (1 Gbit/s, 64 MiB int32 and float32, runs on this 2-core VM, 2026-11-27): INA
and hostlib ring rows had 1-24 fast retransmissions in 8 of 17 rows without these
features and none in 19 rows with them; on star4 Gloo's time was unchanged (0.83-0.84 s);
but on star8, where the machine is short of CPU, Gloo took 1.11 s instead of 1.00 s and
0.29 instead of 0.24 CPU-s per Gbit."""

SHAPER_BURST_SECONDS = 0.001
"""A shaped link's HTB burst: what it may send at once, one millisecond of its rate (at
least Mininet's 15 kB). Mininet's fixed 15 kB at 1 Gbit/s holds under two jumbo frames,
so the shaper throttles after nearly every frame and its timer, not the rate, costs the
emulation's CPU (measured: star4 at 1 Gbit/s, 64 MiB INA 1.5-2.0 s with 15 kB, 0.9 s
unshaped); 1 ms is the kernel's own default for a rate at HZ=1000."""


def _shaper_burst(bw: float) -> int:
    """A shaped link's HTB burst and cburst in bytes at ``bw`` Mbit/s
    (:data:`SHAPER_BURST_SECONDS` of its rate, at least Mininet's 15 kB)."""
    return max(15_000, int(bw * 1e6 / 8 * SHAPER_BURST_SECONDS))


def _link_class() -> type:
    """Mininet's TCLink whose interfaces shape with :data:`HTB_QUANTUM` and a burst of
    :data:`SHAPER_BURST_SECONDS` (imports Mininet lazily)."""
    from mininet.link import TCIntf, TCLink

    class ShapedIntf(TCIntf):
        def bwCmds(self, bw: float | None = None, **params: Any) -> tuple[list[str], str]:
            cmds, parent = super().bwCmds(bw=bw, **params)
            if bw is None or params.get("use_hfsc") or params.get("use_tbf"):
                return cmds, parent
            burst = _shaper_burst(bw)
            return [
                cmd.replace("htb rate", f"htb quantum {HTB_QUANTUM} rate").replace(
                    "burst 15k", f"burst {burst} cburst {burst}"
                )
                for cmd in cmds
            ], parent

    class ShapedLink(TCLink):
        def __init__(self, *args: Any, **params: Any) -> None:
            params.setdefault("cls1", ShapedIntf)
            params.setdefault("cls2", ShapedIntf)
            super().__init__(*args, **params)

    return ShapedLink


def _interface_drops(intf: Any) -> int:
    """An interface's outgoing frames dropped so far: root qdisc plus device (in its
    node's network namespace; see :meth:`Emulation.link_drops`)."""
    link = intf.cmd(f"ip -s -j link show dev {intf.name}")
    qdisc = intf.cmd(f"tc -s -j qdisc show dev {intf.name} root")
    try:
        device = int(json.loads(link)[0]["stats64"]["tx"]["dropped"])
        queued = sum(int(q.get("drops", 0)) for q in json.loads(qdisc) if q.get("root"))
    except (ValueError, LookupError, TypeError) as exc:
        raise EmulationError(f"{intf.name}: unreadable drop counters: {link!r} {qdisc!r}") from exc
    return device + queued


def _check(output: str, where: str) -> None:
    if output.strip():
        raise EmulationError(f"{where}: {output.strip()}")


@contextmanager
def emulate(
    topo: Topology,
    run_dir: Path,
    slots: int = 1024,
    install_jobs: bool = True,
    pcap: bool = False,
    seed: int = 0,
    slot_count: int = 256,
    datapath: str | None = None,
    netem: bool | None = None,
    bmv2_tools: Bmv2Tools | None = None,
    in_order_links: bool = False,
    roce: bool = False,
    sharing: SharingPlan | None = None,
) -> Iterator[Emulation]:
    """Build, start and configure ``topo`` in Mininet; stop and remove it on exit.

    Args:
        topo: the network.
        run_dir: where switch logs, pcaps, link statistics and ``manifest.json`` go.
        slots: each switch's slot pool (per set).
        install_jobs: install the topology's jobs for workers at the fixed ports
            (``inalab emulate ... bench`` installs its own, per algorithm).
        pcap: each soft switch records its ports' frames into ``run_dir/NAME.pcap``.
        seed: seeds the switches' loss emulation (switch i uses ``seed + i``).
        slot_count: slots each job takes on each switch (its window).
        datapath: every soft switch's data plane (``auto``/``python``/``ebpf``); None
            keeps each switch's own (:mod:`emulation.mininet.datapaths`).
        netem: whether links use netem; None probes the kernel.
        bmv2_tools: what ``kind: bmv2`` switches run; None finds them on PATH.
        in_order_links: every veth keeps each flow's order (:data:`IN_ORDER_FEATURES`;
            eBPF switches only), at the cost of TCP's segmentation offload.
        roce: switches aggregate INA over RoCEv2 too (soft switches: ``--roce``; p4/'s
            program always does).
        sharing: how jobs take their switch's memory (None: each reserves
            ``slot_count``); a ``role: fallback`` node's pool is the plan's
            :attr:`~emulation.mininet.sharing.SharingPlan.fallback_pool`.

    Raises:
        EmulationError: the topology asks for what cannot be emulated here.
    """
    from mininet.net import Mininet
    from mininet.node import Host

    bmv2_tools = _check_supported(topo, slots, bmv2_tools)
    plan = _plan(topo, datapath, pcap, netem)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    net = Mininet(
        topo=None, switch=None, host=Host, controller=None, link=_link_class(), build=False
    )
    started = False
    emulation = Emulation(
        topo, net, run_dir, {}, min(slot_count, slots), plan=plan,
        in_order_links=in_order_links, sharing=sharing,
    )  # fmt: skip
    if in_order_links and emulation.frames_leave_the_kernel:
        raise EmulationError(
            "in-order links need every switch on the eBPF data plane (a switch that reads"
            " frames into a process sets their order itself)"
        )
    try:
        for h in topo.hosts:
            net.addHost(h.name, ip=h.ip, mac=h.mac)
        for i, s in enumerate(topo.switches, 1):
            cls = bmv2_switch_class(bmv2_tools) if s.kind == "bmv2" else SWITCH_CLASSES[s.kind]()
            extra = {"datapath": plan.datapaths[s.name].datapath} if s.kind == "soft" else {}
            pool = sharing.fallback_pool if sharing and s.role == "fallback" else slots
            net.addSwitch(s.name, cls=cls, dpid=f"{i:016x}", run_dir=run_dir,
                          lanes=s.lanes, slots=pool, forward_only=s.role == "forward",
                          links=plan.specs.get(s.name), pcap=pcap, seed=seed + i,
                          roce=roce, **extra)  # fmt: skip
        for link in topo.links:
            params = _link_params(link, plan)
            try:
                net.addLink(link.a, link.b, **params)
            except Exception as exc:  # Mininet raises bare Exception for ip link errors
                raise EmulationError(
                    f"link {link.a}-{link.b}: {exc} (is another emulation of a topology with "
                    "these node names running?)"
                ) from exc
        net.build()
        _shape_extras(net, topo, _mtu_for(topo))
        _reorder_lanes(net, topo, plan)
        net.start()
        started = True
        for s in topo.switches:
            node = net.get(s.name)
            emulation.controllers[s.name] = node.process.controller()
        emulation.configure(install_jobs)
        emulation.write_manifest()
        yield emulation
    finally:
        if started:
            emulation.close()
        else:
            for ctl in emulation.controllers.values():
                ctl.close()
            net.stop()
