"""The bench's fabric in an emulated network (``inalab emulate T bench``, ``calibrate``,
``replay``): the ranks in the Mininet hosts of one topology job, INA through its
switches (:class:`EmulatedFabric`, the :class:`~emulation.bench.fabric.Fabric` the
sweep runs on), over UDP or, through :mod:`emulation.mininet.roce`, RoCEv2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulation.mininet.overrides import describe_links

if TYPE_CHECKING:
    from emulation.bench.config import BenchConfig
    from emulation.bench.fabric import Addr, InaSwitch
    from emulation.bench.workers import Placement
    from emulation.mininet.network import Emulation
    from emulation.topology import TopologyJob

__all__ = ["GLOO_PORT", "EmulatedFabric"]

GLOO_PORT = 29500
"""Gloo's rendezvous port at rank 0's host (a fresh namespace: nothing else holds it);
each algorithm run takes the next one, so a lingering socket never gets in the way."""


class EmulatedFabric:
    """Ranks in the Mininet hosts of one topology job; INA through its switches.

    Rank order: the job's hosts in order, each host's ``ranks`` ranks in turn; rank k
    of a host is its local rank k (0: the CollNet head).
    """

    def __init__(self, em: Emulation, job: TopologyJob, drop_probability: float = 0.0) -> None:
        from emulation.topology import aggregation_tree

        self.em, self.job, self.drop_probability = em, job, drop_probability
        topo = em.topology
        self.ranks = [(h, k) for h in job.workers for k in range(topo.host(h).ranks)]
        self.workers = len(self.ranks)
        self.hierarchical = aggregation_tree(topo, job).hierarchical
        self.description = f"{topo.name} (Mininet hosts)"
        self.links = describe_links(topo, None if em.plan is None else em.plan.netem)

    def check(self, cfg: BenchConfig) -> None:
        """The bench's lanes must be the switches' (``--lanes`` sets them at start).

        Raises:
            ValueError: they differ.
        """
        widths = {self.em.topology.switch(s).lanes for s in self.em.installed_switches(self.job)}
        if widths != {cfg.lanes}:
            raise ValueError(f"--lanes {cfg.lanes} but the job's switches have {sorted(widths)}")

    def placements(self, workers: int) -> list[Placement]:
        from emulation.bench.workers import Placement

        if workers != self.workers:
            raise ValueError(f"job {self.job.job_id} has {self.workers} ranks, not {workers}")
        out = []
        for host_name, k in self.ranks:
            node = self.em.host(host_name)
            out.append(
                Placement(
                    netns=f"/proc/{node.pid}/ns/net",
                    bind_ip=self.em.topology.host(host_name).address,
                    ifname=node.defaultIntf().name,
                    host=self.job.workers.index(host_name),
                    local_rank=k,
                )
            )
        return out

    def gloo_init(self, attempt: int) -> str:
        first = self.em.topology.host(self.job.workers[0]).address
        return f"tcp://{first}:{GLOO_PORT + attempt}"

    def switch_pids(self) -> dict[str, int]:
        """Every switch process of the network, by name: they forward every algorithm's
        packets (ring, tree and Gloo too), so the bench reports their CPU for all."""
        return _EmulatedSwitch.pids_of(self.em, [s.name for s in self.em.topology.switches])

    def link_drops(self) -> dict[str, int]:
        """Frames every interface of the network dropped on the way out so far
        (:meth:`Emulation.link_drops`)."""
        return self.em.link_drops()

    def set_link_rate(self, mbit: float) -> None:
        """Set every host link's HTB rate (both ends) to ``mbit`` Mbit/s, as ``inalab
        replay --scenario bandwidth-drop`` does at its change.

        Raises:
            EmulationError: a host link is unshaped, or tc failed.
        """
        self.em.set_link_rate(mbit, self.em.topology.host_links())

    @contextmanager
    def ina_switch(self, cfg: BenchConfig, run_dir: Path) -> Iterator[InaSwitch]:
        from emulation.bench.fabric import process_cpu_ms

        switches = self.em.installed_switches(self.job)
        for s in switches:
            self.em.controllers[s].set_drops(self.drop_probability, self.drop_probability)
        try:
            before = self.em.counters(switches)
            for name in switches:
                before[name]["cpu_ms"] = process_cpu_ms(self.em.net.get(name).process.pid)
            yield _EmulatedSwitch(self.em, self.job, switches, before)
        finally:
            for s in switches:
                self.em.controllers[s].set_drops(0.0, 0.0)


class _EmulatedSwitch:
    """The job's switches for one algorithm's run; they outlive it, so its statistics
    are the change since ``before``."""

    def __init__(
        self,
        em: Emulation,
        job: TopologyJob,
        switches: list[str],
        before: dict[str, dict[str, int]],
    ) -> None:
        self.em, self.job, self.switches, self.before = em, job, switches, before

    @property
    def log_path(self) -> Path | None:
        return None  # one log per switch, in the run directory

    def install(
        self, job_id: int, addrs: Sequence[Addr], hosts: Sequence[Placement]
    ) -> list[tuple[Addr, int]]:
        job = dataclasses.replace(self.job, job_id=job_id)
        names = [self.job.workers[p.host] for p in hosts]
        return self.em.install_job(job, list(zip(names, addrs, strict=True)))

    def install_roce(
        self, job_id: int, ips: Sequence[str], endpoints: Sequence[Sequence[Any]], m: int
    ) -> list[tuple[int, ...]]:
        from emulation.mininet.roce import install_roce

        return install_roce(self.em, self.switches, job_id, ips, endpoints, m)

    @property
    def roce_icrc(self) -> bool:
        from emulation.mininet.roce import icrc_computed

        return icrc_computed(self.em.topology, self.switches)

    def counters(self) -> dict[str, Any]:
        """Each switch's statistics over the run, and ``cpu_ms``, the CPU time its process
        used (near the run's wall time: the switch saturated a core)."""
        from emulation.bench.fabric import process_cpu_ms

        after = self.em.counters(self.switches)
        for name in self.switches:
            after[name]["cpu_ms"] = process_cpu_ms(self.em.net.get(name).process.pid)
        return {s: {k: v - self.before[s].get(k, 0) for k, v in after[s].items()} for s in after}

    def remove(self, job_id: int) -> None:
        self.em.remove_job(job_id)

    @property
    def pids(self) -> dict[str, int]:
        """The job's switches' processes, by name."""
        return self.pids_of(self.em, self.switches)

    @staticmethod
    def pids_of(em: Emulation, names: Sequence[str]) -> dict[str, int]:
        """The PIDs of the named switches' processes (one never started is left out)."""
        pids = {}
        for name in names:
            process = getattr(em.net.get(name), "process", None)
            try:
                if process is not None:
                    pids[name] = int(process.pid)
            except RuntimeError:  # RecordedProcess.pid: never started
                continue
        return pids
