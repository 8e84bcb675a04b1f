"""A :class:`Topology` brought up as a Mininet network, with inalab's switches.

Mininet builds the hosts (network namespaces) and links (veth pairs, HTB-shaped with
``bw``); the switches are ours, never Open vSwitch: :class:`SoftMininetSwitch` runs
``inalab switch --interface`` on the switch's interfaces (each a port numbered as the
topology says), in the root namespace, and is ready when its P4Runtime server answers.
Once started, :meth:`Emulation.configure` drives every switch through the controller:

- forwarding: each switch gets an entry per host MAC toward the port on a shortest
  path; there is no flooding (a fat tree has loops), so every host gets static ARP
  entries for every other host and for the switches' INA address;
- jobs: each job of the topology is installed on its aggregating switch, rank r being
  the job's r-th worker host at its IP and :data:`WORKER_UDP_PORT`.

Switch kinds are injected by name (:data:`SWITCH_CLASSES`); ``bmv2`` needs
``simple_switch_grpc`` and p4c, and is refused here with that reason when missing.
Delay and loss cannot come from netem on this kernel: a topology asking for them is
refused (inalab's own per-port emulation is not there yet) rather than silently run
without them. Cleanup is Mininet's ``stop`` for what it built and each switch
process's recorded PID: never ``mn -c``, never a name pattern.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.forwarder import HostRoute
from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch.process import SoftSwitchProcess
from emulation.topology import Topology

__all__ = [
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
"""The UDP port each worker binds on its host (hosts have their own addresses)."""


class EmulationError(RuntimeError):
    """The topology cannot be emulated here (a missing tool, an unsupported link)."""


def _soft_switch_class() -> type:
    from mininet.node import Switch

    class SoftMininetSwitch(Switch):
        """Mininet switch running inalab's soft switch on its interfaces."""

        def __init__(
            self,
            name: str,
            run_dir: Path,
            lanes: int = 64,
            slots: int = 1024,
            forward_only: bool = False,
            **params: Any,
        ) -> None:
            super().__init__(name, **params)
            self.run_dir, self.lanes, self.slots = Path(run_dir), lanes, slots
            self.forward_only = forward_only
            self.process: SoftSwitchProcess | None = None

        def start(self, controllers: list[Any]) -> None:
            interfaces = {
                self.ports[intf]: intf.name for intf in self.intfList() if intf.name != "lo"
            }
            self.process = SoftSwitchProcess(
                self.run_dir, name=self.name, lanes=self.lanes, slots=self.slots,
                interfaces=interfaces,
                extra_args=("--forward-only",) if self.forward_only else (),
            ).start()  # fmt: skip

        def stop(self, deleteIntfs: bool = True) -> None:
            if self.process is not None:
                code = self.process.stop()
                if code not in (0, None):
                    log.warning("switch %s exited %s; log %s", self.name, code,
                                self.process.log_path)  # fmt: skip
            super().stop(deleteIntfs)

    return SoftMininetSwitch


SWITCH_CLASSES = {"soft": _soft_switch_class}
"""Switch kind -> a function returning its Mininet class (imports Mininet lazily)."""


@dataclass
class Emulation:
    """A started network: the Mininet object, its topology, and a controller per switch."""

    topology: Topology
    net: Any
    run_dir: Path
    controllers: dict[str, SwitchController]

    def host(self, name: str) -> Any:
        return self.net.get(name)

    def ina_address(self, switch: str) -> tuple[str, str]:
        """(IPv4, MAC) hosts send INA packets to for jobs aggregated at ``switch``."""
        names = [s.name for s in self.topology.switches]
        return ina_address(names.index(switch) + 1)

    def configure(self) -> None:
        """Forwarding entries, static ARP, and every job on its aggregating switch."""
        topo = self.topology
        aggregators = [s for s in topo.switches if s.role == "aggregate"]
        hops = {s.name: _first_hops(topo, s.name) for s in topo.switches}
        for s in topo.switches:
            ctl = self.controllers[s.name]
            for h in topo.hosts:
                port = _port_toward(hops[s.name], s.name, h.name)
                ctl.forwarder.add_host(HostRoute(h.mac, port))
            for agg in aggregators:
                if agg.name != s.name:
                    port = _port_toward(hops[s.name], s.name, agg.name)
                    ctl.forwarder.add_host(HostRoute(self.ina_address(agg.name)[1], port))
        for h in topo.hosts:
            node = self.host(h.name)
            intf = node.defaultIntf().name
            # A veth hands a raw socket TCP/UDP packets whose checksum the NIC was to
            # fill in; the switch forwards frames as read, so hosts compute checksums.
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
        for job in topo.jobs:
            ctl = self.controllers[job.switch]
            workers = []
            for name in job.workers:
                h = topo.host(name)
                port = _port_toward(hops[job.switch], job.switch, name)
                workers.append(WorkerAddress(h.address, WORKER_UDP_PORT, h.mac, port))
            ctl.add_job(job.job_id, workers, slot_count=min(256, ctl.slots_per_set))

    def close(self) -> None:
        for ctl in self.controllers.values():
            ctl.close()
        self.controllers.clear()
        self.net.stop()


def _first_hops(topo: Topology, switch: str) -> dict[str, int]:
    """For every node ``switch`` reaches: the port of ``switch`` on a shortest path to
    it (one breadth-first search; ties by link order)."""
    neighbours: dict[str, list[tuple[str, int | None]]] = {}
    for link in topo.links:
        neighbours.setdefault(link.a, []).append((link.b, link.a_port))
        neighbours.setdefault(link.b, []).append((link.a, link.b_port))
    first: dict[str, int] = {}
    queue: deque[str] = deque()
    for node, port in neighbours.get(switch, []):
        if node not in first and port is not None:
            first[node] = port
            queue.append(node)
    while queue:
        node = queue.popleft()
        for nxt, _ in neighbours.get(node, []):
            if nxt not in first and nxt != switch:
                first[nxt] = first[node]
                queue.append(nxt)
    return first


def _port_toward(hops: dict[str, int], switch: str, node: str) -> int:
    """``hops[node]`` (from :func:`_first_hops` of ``switch``).

    Raises:
        EmulationError: ``switch`` does not reach ``node``.
    """
    if node not in hops:
        raise EmulationError(f"no path from {switch} to {node}")
    return hops[node]


def _check_supported(topo: Topology) -> None:
    for link in topo.links:
        if link.queue is not None:
            raise EmulationError(
                f"link {link.a}-{link.b} sets a queue: Mininet applies it with netem, which "
                "this kernel does not have; remove it (HTB's default queue applies)"
            )
        if link.delay or link.loss:
            raise EmulationError(
                f"link {link.a}-{link.b} asks for delay {link.delay} ms / loss {link.loss}: "
                "this kernel has no netem and inalab's own per-port delay and loss are not "
                "implemented yet; remove them from the topology"
            )
    for s in topo.switches:
        if s.kind not in SWITCH_CLASSES:
            raise EmulationError(
                f"switch {s.name}: kind {s.kind!r} is not available here "
                f"(have: {', '.join(SWITCH_CLASSES)})"
            )


@contextmanager
def emulate(topo: Topology, run_dir: Path, slots: int = 1024) -> Iterator[Emulation]:
    """Build, start and configure ``topo`` in Mininet; stop and remove it on exit.

    Raises:
        EmulationError: the topology asks for what cannot be emulated here.
    """
    from mininet.link import TCLink
    from mininet.net import Mininet
    from mininet.node import Host

    _check_supported(topo)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    net = Mininet(topo=None, switch=None, host=Host, controller=None, link=TCLink, build=False)
    started = False
    emulation = Emulation(topo, net, run_dir, {})
    try:
        for h in topo.hosts:
            net.addHost(h.name, ip=h.ip, mac=h.mac)
        for i, s in enumerate(topo.switches, 1):
            cls = SWITCH_CLASSES[s.kind]()
            net.addSwitch(s.name, cls=cls, dpid=f"{i:016x}", run_dir=run_dir,
                          lanes=s.lanes, slots=slots,
                          forward_only=s.role == "forward")  # fmt: skip
        for link in topo.links:
            params: dict[str, Any] = {"port1": link.a_port, "port2": link.b_port}
            if link.bw is not None:
                params["bw"] = link.bw
            net.addLink(link.a, link.b, **params)
        net.build()
        net.start()
        started = True
        for s in topo.switches:
            node = net.get(s.name)
            emulation.controllers[s.name] = node.process.controller()
        emulation.configure()
        yield emulation
    finally:
        if started:
            emulation.close()
        else:
            for ctl in emulation.controllers.values():
                ctl.close()
            net.stop()
