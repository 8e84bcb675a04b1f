"""Topologies as pure data: hosts, switches, links and jobs, and the aggregation tree a
job's placement implies.

A :class:`Topology` says what a network is, never how it runs: it imports neither
Mininet nor a switch, so it is built and checked without root, and the emulator and
``dynamiccl`` read the same object. :mod:`emulation.topology.load` builds one from a file.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "SWITCH_DATAPATHS",
    "SWITCH_KINDS",
    "SWITCH_ROLES",
    "AggregationTree",
    "Host",
    "Link",
    "Switch",
    "Topology",
    "TopologyError",
    "TopologyJob",
    "aggregation_tree",
    "shortest_path_tree",
]

SWITCH_KINDS = ("soft", "bmv2")
"""``soft``: inalab's software switch; ``bmv2``: simple_switch_grpc running ``p4/``."""

SWITCH_DATAPATHS = ("auto", "python", "ebpf")
"""A soft switch's data plane: ``python`` (the pipeline in the switch process; links may
delay), ``ebpf`` (the program on its ports, in the kernel) or ``auto`` (the emulator picks
ebpf where it can run and no link needs the Python delay line)."""

SWITCH_ROLES = ("aggregate", "forward", "fallback")
"""``aggregate``: runs INA for the jobs that name it; ``forward``: forwards only;
``fallback``: a Linux server (a soft switch with one link) that finishes, as the fallback
aggregator of the aggregating switch naming it (``fallback: NAME``), what that switch's
shared region cannot hold (docs/sharing.md); never on a worker's path, never a job's
switch."""


class TopologyError(ValueError):
    """A topology file or description that is not valid; the message says where.

    Attributes:
        path: where in the document the problem is (mapping keys and list indices from
            the top; empty: the document, or the file, as a whole). :func:`load_topology`
            turns it into the line and column in the file.
    """

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Host:
    """An end host: its interface address (with prefix length), MAC and rank count."""

    name: str
    ip: str
    mac: str
    ranks: int = 1

    @property
    def address(self) -> str:
        """The IPv4 address without the prefix length."""
        return self.ip.split("/")[0]


@dataclass(frozen=True)
class Switch:
    """A switch: its implementation, its role and, for INA, the packet width.

    Attributes:
        fallback: an ``aggregate`` switch's fallback aggregator: the ``fallback`` node
            linked to it (None: it has none).
    """

    name: str
    kind: str = "soft"
    role: str = "aggregate"
    lanes: int = 64
    datapath: str = "auto"
    fallback: str | None = None


@dataclass(frozen=True)
class Link:
    """A point-to-point link; a port is the switch port number at that end (None: host).

    Attributes:
        bw: Mbit/s each way, or None for unshaped.
        delay: one-way delay in ms.
        loss: probability a packet is lost, each way.
        queue: the shaper's queue in packets, or None for the default.
        jitter: the delay's variation in ms (netem's jitter; only where netem exists).
        dup: probability a packet is sent twice, each way (the eBPF switch's).
        reorder: probability a packet is held back behind the packets queued after it,
            on a soft switch's way out (the eBPF switch's; needs ``bw``).
    """

    a: str
    b: str
    a_port: int | None
    b_port: int | None
    bw: float | None = None
    delay: float = 0.0
    loss: float = 0.0
    queue: int | None = None
    jitter: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0


@dataclass(frozen=True)
class TopologyJob:
    """An INA job: its id, its worker hosts (rank order) and the switch aggregating it."""

    job_id: int
    workers: tuple[str, ...]
    switch: str


@dataclass(frozen=True)
class Topology:
    """A whole network description, validated (see :func:`parse_topology`)."""

    name: str
    hosts: tuple[Host, ...]
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    jobs: tuple[TopologyJob, ...] = ()
    _index: dict[str, Host | Switch] = field(default_factory=dict, compare=False, repr=False)

    def node(self, name: str) -> Host | Switch:
        """The host or switch called ``name``.

        Raises:
            KeyError: no such node.
        """
        if not self._index:
            nodes: list[Host | Switch] = [*self.hosts, *self.switches]
            self._index.update({n.name: n for n in nodes})
        return self._index[name]

    def host(self, name: str) -> Host:
        node = self.node(name)
        if not isinstance(node, Host):
            raise KeyError(f"{name} is a switch")
        return node

    def switch(self, name: str) -> Switch:
        node = self.node(name)
        if not isinstance(node, Switch):
            raise KeyError(f"{name} is a host")
        return node

    def ports(self, switch: str) -> dict[int, str]:
        """The ports of ``switch``: port number -> the node at the other end."""
        out = {}
        for link in self.links:
            if link.a == switch and link.a_port is not None:
                out[link.a_port] = link.b
            if link.b == switch and link.b_port is not None:
                out[link.b_port] = link.a
        return dict(sorted(out.items()))

    def host_links(self) -> list[Link]:
        """The links with a host at one end (what ``--bw`` and a rate change shape)."""
        hosts = {h.name for h in self.hosts}
        return [link for link in self.links if link.a in hosts or link.b in hosts]

    def attachment(self, host: str) -> tuple[str, int, Link]:
        """The switch, port and link a host is attached to.

        Raises:
            KeyError: not a host.
        """
        self.host(host)
        for link in self.links:
            if link.a == host and link.b_port is not None:
                return link.b, link.b_port, link
            if link.b == host and link.a_port is not None:
                return link.a, link.a_port, link
        raise KeyError(f"host {host} has no link")  # parse_topology never lets this happen


@dataclass(frozen=True)
class AggregationTree:
    """How one job aggregates: which switch each worker host sends to, and where each
    aggregating switch sends its partial sums (hierarchical aggregation).

    Attributes:
        root: the job's switch, where the last sum completes.
        host_switch: worker host -> the aggregating switch it sends to (the first
            ``aggregate`` switch on its shortest path to ``root``).
        parent: aggregating switch other than ``root`` -> the next ``aggregate`` switch
            on its path to ``root``, where it is one worker.
        members: aggregating switch -> its workers in rank order: its hosts (in the
            job's order) then its child switches (in topology order).
    """

    root: str
    host_switch: dict[str, str]
    parent: dict[str, str]
    members: dict[str, tuple[str, ...]]

    @property
    def hierarchical(self) -> bool:
        return bool(self.parent)


def shortest_path_tree(topo: Topology, root: str) -> dict[str, str]:
    """Every node ``root`` reaches -> the next node on its shortest path to ``root``, in
    breadth-first order (ties by link order): the one search that forwarding entries
    and aggregation trees are both read from."""
    neighbours: dict[str, list[str]] = {}
    for link in topo.links:
        neighbours.setdefault(link.a, []).append(link.b)
        neighbours.setdefault(link.b, []).append(link.a)
    toward_root: dict[str, str] = {}
    queue, seen = deque([root]), {root}
    while queue:
        node = queue.popleft()
        for other in neighbours.get(node, []):
            if other not in seen:
                seen.add(other)
                toward_root[other] = node
                queue.append(other)
    return toward_root


def aggregation_tree(topo: Topology, job: TopologyJob) -> AggregationTree:
    """Every ``aggregate`` switch on a worker's shortest path to the job's switch takes
    part: it sums its hosts' (and child switches') contributions and sends one partial
    sum on. With ``forward`` switches on the way, the job's switch aggregates alone.
    Ties between shortest paths go by link order (a breadth-first search from the
    root), so the tree is a pure function of the topology.
    """
    toward_root = shortest_path_tree(topo, job.switch)

    def next_aggregator(node: str) -> str:
        while node != job.switch:
            node = toward_root[node]
            if topo.switch(node).role == "aggregate":
                return node
        return node

    host_switch = {h: next_aggregator(h) for h in job.workers}
    parent: dict[str, str] = {}
    pending = sorted(set(host_switch.values()) - {job.switch})
    while pending:
        s = pending.pop()
        if s not in parent:
            parent[s] = next_aggregator(s)
            if parent[s] != job.switch:
                pending.append(parent[s])
    order = [s.name for s in topo.switches]
    members = {
        s: tuple(h for h in job.workers if host_switch[h] == s)
        + tuple(sorted((c for c, p in parent.items() if p == s), key=order.index))
        for s in {job.switch, *host_switch.values(), *parent}
    }
    return AggregationTree(job.switch, host_switch, parent, members)
