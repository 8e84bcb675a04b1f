"""Where a job's INA traffic converges before it is summed: links that several streams share.

Emulation layer, pure data like :mod:`emulation.topology` (no Mininet, no root). INA's
gain is that a switch turns N contributions into one; a ``forward`` switch between the
workers and the switch that sums them does not, so every worker's stream crosses the
links above it. A link that carries k > 1 such streams toward their aggregating switch
(and k results back) takes at least k times as long per byte as a host link of the same
rate, and the queue in front of it drops what the workers' windows send together: a
user's 16 MiB int32 allreduce on ``topologies/fat_tree_k4.yaml`` at 100 Mbit/s, summed
at core ``c1`` alone, took 6.8x as long as with its edge and pod switches aggregating
(``fat_tree_k4_hier.yaml``).

:func:`converging_links` finds those links from a job's aggregation tree
(:func:`~emulation.topology.aggregation_tree`) and the same breadth-first routes toward
the job's switch; :func:`convergence_notes` words them for ``inalab emulate ... check``
and the emulated bench's footnote. Setting ``role: aggregate`` on the switch below such
a link makes it carry one partial sum: every ``aggregate`` switch on a worker's path to
the job's switch takes part in the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulation.topology import (
    Topology,
    TopologyJob,
    aggregation_tree,
    shortest_path_tree,
)

__all__ = ["Convergence", "convergence_notes", "converging_links", "hierarchical_sibling"]


@dataclass(frozen=True)
class Convergence:
    """A link that several streams of one job's INA traffic share before they are summed.

    Attributes:
        job: the job's id.
        below: the link's end away from the aggregating switch: a switch (a host link
            carries one host's stream), the one that could sum the streams instead.
        above: the link's end toward the aggregating switch.
        aggregator: the switch that sums the streams crossing the link.
        sources: the streams' senders, in the aggregator's rank order: worker hosts, or
            aggregating switches below sending partial sums.
        link_mbit: the link's rate, Mbit/s each way (None: unshaped).
        host_mbit: the slowest host link of the workers whose traffic crosses the link
            (None: one of them is unshaped).
    """

    job: int
    below: str
    above: str
    aggregator: str
    sources: tuple[str, ...]
    link_mbit: float | None
    host_mbit: float | None

    @property
    def fan_in(self) -> int:
        """How many streams share the link toward the aggregator (and come back on it)."""
        return len(self.sources)

    @property
    def floor_ratio(self) -> float | None:
        """The time floor this link sets for INA against a host link's: ``fan_in`` x S
        bytes at ``link_mbit`` over S bytes at ``host_mbit`` (None: a rate is unshaped)."""
        if self.link_mbit is None or self.host_mbit is None:
            return None
        return self.fan_in * self.host_mbit / self.link_mbit

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as a bench's metadata records it (``fan_in`` and
        ``floor_ratio`` included)."""
        return {
            "job": self.job,
            "link": [self.below, self.above],
            "aggregator": self.aggregator,
            "fan_in": self.fan_in,
            "sources": list(self.sources),
            "link_mbit": self.link_mbit,
            "host_mbit": self.host_mbit,
            "floor_ratio": self.floor_ratio,
        }


def converging_links(topo: Topology, job: TopologyJob) -> list[Convergence]:
    """The links on which two or more streams of ``job``'s INA traffic converge on their
    way to the switch that sums them, in the topology's link order.

    A stream is one member of an aggregating switch (a worker host, or an aggregating
    switch below sending its partial sum) on its route to that switch: the route every
    packet of the job takes, read from the same breadth-first tree as
    :func:`~emulation.topology.aggregation_tree`. A host counts once whatever its ranks
    (they share its one link, and no switch can sum them sooner).

    Raises:
        KeyError: a worker cannot reach the job's switch, or names no host (as
            :func:`~emulation.topology.aggregation_tree` raises).
    """
    tree = aggregation_tree(topo, job)
    toward_root = shortest_path_tree(topo, job.switch)
    crossing: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for aggregator, members in tree.members.items():
        for member in members:
            node = member
            while node != aggregator:
                up = toward_root[node]
                crossing.setdefault((node, up), (aggregator, []))[1].append(member)
                node = up
    hosts_below = _hosts_below(tree.members, set(job.workers))
    out = []
    for link in topo.links:
        for below, above in ((link.a, link.b), (link.b, link.a)):
            aggregator, sources = crossing.get((below, above), ("", []))
            if len(sources) > 1:
                workers = {h for s in sources for h in hosts_below[s]}
                out.append(
                    Convergence(job.job_id, below, above, aggregator, tuple(sources),
                                link.bw, _slowest_host_link(topo, workers))
                )  # fmt: skip
    return out


def _hosts_below(members: dict[str, tuple[str, ...]], workers: set[str]) -> dict[str, set[str]]:
    """Every stream's sender -> the worker hosts whose contributions it carries."""
    out: dict[str, set[str]] = {h: {h} for h in workers}

    def collect(switch: str) -> set[str]:
        if switch not in out:
            out[switch] = {h for m in members[switch] for h in collect(m)}
        return out[switch]

    for switch in members:
        collect(switch)
    return out


def _slowest_host_link(topo: Topology, hosts: set[str]) -> float | None:
    rates = [topo.attachment(h)[2].bw for h in sorted(hosts)]
    return None if None in rates else min(r for r in rates if r is not None)


def hierarchical_sibling(path: str | Path) -> Path | None:
    """The hierarchical variant shipped beside a topology file (``NAME_hier.yaml`` for
    ``NAME.yaml``), if there is one: ``topologies/`` names them so."""
    file = Path(path)
    sibling = file.with_name(f"{file.stem}_hier{file.suffix}")
    return sibling if not file.stem.endswith("_hier") and sibling.is_file() else None


def convergence_notes(
    topo: Topology, path: str | Path | None = None, jobs: Sequence[TopologyJob] | None = None
) -> list[str]:
    """One ``warning:`` line per converging link of each job (``jobs``, default all of
    ``topo``'s; see :func:`converging_links`), saying how to sum lower in the tree; then,
    where a hierarchical variant of the file at ``path`` exists, a line pointing at it.
    Empty: every job's streams are summed before they share a link.

    Raises:
        KeyError: a job's worker cannot reach its switch.
    """
    chosen = topo.jobs if jobs is None else jobs
    found = [c for job in chosen for c in converging_links(topo, job)]
    lines = [_note(c) for c in found]
    sibling = None if not found or path is None else hierarchical_sibling(path)
    if sibling is not None:
        lines.append(f"warning: or use {sibling}, the same network aggregating lower in the tree")
    return lines


def _note(c: Convergence) -> str:
    return (
        f"warning: job {c.job}: link {c.below} - {c.above}: fan-in {c.fan_in}"
        f" ({', '.join(c.sources)}) unsummed toward {c.aggregator}, each way: {_floor(c)};"
        f" set `role: aggregate` on switch {c.below} to sum them there"
    )


def _floor(c: Convergence) -> str:
    ratio = c.floor_ratio
    if ratio is None:
        return "unshaped: no time floor known"
    rates = f"{c.fan_in} x S at {c.link_mbit:g} Mbit/s vs S at {c.host_mbit:g} Mbit/s"
    if ratio <= 1:
        return f"the link's rate carries them ({rates})"
    return f"INA needs at least {ratio:g}x a host link's time ({rates})"
