"""A topology's network as dynamiccl sees it: the emulation layer reads, dynamiccl decides.

:func:`summarize_topology` turns one job of a topology (``emulation.topology``: pure data)
into the :class:`~dynamiccl.model.TopologySummary` the cost model takes (slowest worker
link, worst delay and loss, contention on switch-to-switch links, fan-in of the
aggregating switches); :func:`measured_links` records the links a calibration ran across
(:class:`~dynamiccl.model.MeasuredLinks`). dynamiccl never imports this module: the
bench, ``inalab emulate`` and the ``inalab`` command hand it these summaries as data
(:func:`decide_summary` is ``inalab decide --topology``'s reader; :func:`summary_json` is
the file ``inalab decide --summary`` reads). Pure functions of the topology: no root, no
network.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path

from dynamiccl.cli import JobRanks
from dynamiccl.model import MeasuredLinks, TopologySummary
from emulation.topology import Topology, TopologyJob, aggregation_tree, load_topology

__all__ = ["decide_summary", "measured_links", "summarize_topology", "summary_json"]


def summarize_topology(
    topology: Topology, job_id: int | None = None, *, slots: int | None = None
) -> TopologySummary:
    """The model's view of one job's network.

    The job is ``job_id``, or the topology's first job; a topology without jobs is read
    as one job of all its hosts on its first aggregating switch (none: INA unreachable).

    Raises:
        KeyError: no job ``job_id`` in the topology.
    """
    job, workers, root = _job_network(topology, job_id)
    reachable = job is not None
    graph = _Graph(topology)
    paths = {w: graph.path(w, root) for w in workers}
    access = [topology.attachment(w)[2].bw for w in workers]
    slowest = None if None in access else min(a for a in access if a is not None)
    rate = None if slowest is None else slowest * 1e6 / 8  # Mbit/s -> bytes/s
    contention = {"ring": graph.single_stream_factor(paths, slowest)}
    contention["tree"] = contention["ring"]
    fan_in = None
    if job is not None:
        tree = aggregation_tree(topology, job)
        streams = [graph.path(m, s) for s, members in tree.members.items() for m in members]
        contention["ina"] = graph.stream_factor(streams, slowest)
        fan_in = max(len(m) for m in tree.members.values())
    return TopologySummary(
        link_bandwidth=rate,
        delay=max((graph.delay(p) for p in paths.values()), default=0.0) / 1e3,
        hops=max((sum(n in graph.switches for n in p) for p in paths.values()), default=1),
        oversubscription=graph.oversubscription(workers, root),
        contention=contention,
        loss=max((graph.loss(p) for p in paths.values()), default=0.0),
        switch_reachable=reachable,
        fan_in=fan_in,
        slots=slots,
    )


def _job_network(
    topology: Topology, job_id: int | None
) -> tuple[TopologyJob | None, tuple[str, ...], str]:
    """(the job, its worker hosts, the switch they reduce at) as :func:`summarize_topology`
    reads them; the job is None when no switch can aggregate for the hosts.

    Raises:
        KeyError: no job ``job_id`` in the topology.
    """
    if job_id is not None:
        matching = [j for j in topology.jobs if j.job_id == job_id]
        if not matching:
            known = ", ".join(str(j.job_id) for j in topology.jobs) or "none"
            raise KeyError(f"topology {topology.name} has no job {job_id} (jobs: {known})")
        job: TopologyJob | None = matching[0]
    elif topology.jobs:
        job = topology.jobs[0]
    else:
        aggregators = [s.name for s in topology.switches if s.role == "aggregate"]
        hosts = tuple(h.name for h in topology.hosts)
        job = TopologyJob(0, hosts, aggregators[0]) if aggregators else None
    if job is None:
        return None, tuple(h.name for h in topology.hosts), topology.switches[0].name
    return job, job.workers, job.switch


def measured_links(topology: Topology, job_id: int | None = None) -> MeasuredLinks:
    """What the links of one job's network are, for a profile measured across them.

    The job is chosen as :func:`summarize_topology` does; its links are those on each
    worker's path to the job's switch, with the values ``topology`` holds (pass the
    topology as emulated, overrides applied).

    Raises:
        KeyError: no job ``job_id`` in the topology.
    """
    summary = summarize_topology(topology, job_id)
    job, workers, root = _job_network(topology, job_id)
    graph = _Graph(topology)
    links = [graph.links[h] for w in workers for h in graph.hops(graph.path(w, root))]
    shaped = [link.bw for link in links if link.bw is not None]
    return MeasuredLinks(
        topology=topology.name,
        job=None if job is None or not topology.jobs else job.job_id,
        bw_mbit=min(shaped) if shaped else None,
        delay_ms=summary.delay * 1e3,
        loss=summary.loss,
        jitter_ms=max((link.jitter for link in links), default=0.0),
    )


def summary_json(topology: Topology, job_id: int | None = None) -> str:
    """:func:`summarize_topology` as the JSON ``inalab decide --summary FILE`` reads
    (:meth:`~dynamiccl.model.TopologySummary.to_dict`): a network for dynamiccl alone.

    Raises:
        KeyError: no job ``job_id`` in the topology.
    """
    return json.dumps(summarize_topology(topology, job_id).to_dict(), indent=2) + "\n"


def decide_summary(
    path: Path, job_id: int | None, slots: int | None
) -> tuple[TopologySummary, JobRanks]:
    """``inalab decide --topology PATH [--job ID] [--slots N]``: the job's summary and its
    ranks (the job as :func:`summarize_topology` picks it), injected by the ``inalab``
    command into :func:`dynamiccl.cli.run`.

    Raises:
        TopologyError: the file cannot be read or is not a valid topology.
        KeyError: no job ``job_id`` in the topology.
    """
    topo = load_topology(path)
    summary = summarize_topology(topo, job_id, slots=slots)
    job = next((j for j in topo.jobs if job_id in (None, j.job_id)), None)
    names = job.workers if job is not None else tuple(h.name for h in topo.hosts)
    ranks = JobRanks(
        ranks=sum(topo.host(n).ranks for n in names),
        hosts=len(names),
        job=None if job is None else job.job_id,
        per_job={j.job_id: sum(topo.host(n).ranks for n in j.workers) for j in topo.jobs},
    )
    return summary, ranks


class _Graph:
    """Shortest paths and per-link sums over a topology's links (breadth-first, in link
    order, so the result is a pure function of the file)."""

    def __init__(self, topology: Topology) -> None:
        self.switches = {s.name for s in topology.switches}
        self.hosts = {h.name for h in topology.hosts}
        self.links = {frozenset((link.a, link.b)): link for link in topology.links}
        self.neighbours: dict[str, list[str]] = {}
        for link in topology.links:
            self.neighbours.setdefault(link.a, []).append(link.b)
            self.neighbours.setdefault(link.b, []).append(link.a)

    def path(self, src: str, dst: str) -> list[str]:
        back: dict[str, str] = {}
        frontier, seen = [src], {src}
        while frontier and dst not in seen:
            nxt = []
            for node in frontier:
                for other in self.neighbours.get(node, []):
                    if other not in seen:
                        seen.add(other)
                        back[other] = node
                        nxt.append(other)
            frontier = nxt
        if dst not in seen:
            return [src]  # disconnected: parse_topology allows it, the model ignores it
        out = [dst]
        while out[-1] != src:
            out.append(back[out[-1]])
        return out[::-1]

    def hops(self, path: list[str]) -> list[frozenset[str]]:
        return [frozenset(pair) for pair in itertools.pairwise(path)]

    def delay(self, path: list[str]) -> float:
        return sum(self.links[h].delay for h in self.hops(path))

    def loss(self, path: list[str]) -> float:
        keep = 1.0
        for h in self.hops(path):
            keep *= 1.0 - self.links[h].loss
        return 1.0 - keep

    def stream_factor(self, streams: list[list[str]], rate: float | None) -> float:
        """Worst link's (streams on it x ``rate``) / its capacity, for streams toward
        the switch (each also comes back: the same count the other way)."""
        if rate is None:
            return 1.0
        count: dict[frozenset[str], int] = {}
        for path in streams:
            for h in self.hops(path):
                count[h] = count.get(h, 0) + 1
        worst = 1.0
        for h, n in count.items():
            bw = self.links[h].bw
            if bw is not None:
                worst = max(worst, n * rate / bw)
        return worst

    def single_stream_factor(self, paths: Mapping[str, list[str]], rate: float | None) -> float:
        """One stream per link each way: only a link slower than the workers' matters."""
        if rate is None:
            return 1.0
        slower = [
            rate / bw
            for path in paths.values()
            for h in self.hops(path)
            if (bw := self.links[h].bw) is not None
        ]
        return max([1.0, *slower])

    def oversubscription(self, workers: tuple[str, ...], root: str) -> float:
        """Per switch-to-switch link on the workers' paths to ``root``: the access
        bandwidth of the worker hosts whose path crosses it over its capacity."""
        demand: dict[frozenset[str], float] = {}
        for w in workers:
            path = self.path(w, root)
            bw = self.links[self.hops(path)[0]].bw if len(path) > 1 else None
            for h in self.hops(path)[1:]:
                if bw is not None and h <= self.switches:
                    demand[h] = demand.get(h, 0.0) + bw
        worst = 1.0
        for h, d in demand.items():
            cap = self.links[h].bw
            if cap is not None:
                worst = max(worst, d / cap)
        return worst
