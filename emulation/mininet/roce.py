"""INA over RoCEv2 in an emulated network: ``inalab emulate T bench --transport rdma``.

Each rank is one Mininet host with an emulated RNIC bound to the host's address, UDP
4791 (one rank a host: the switch knows a RoCEv2 worker by its address alone). Its
messages go to the job's aggregating switch's INA address (the address hosts already
route to the switch), where a soft switch started with ``--roce`` takes every UDP
datagram to port 4791, and bmv2 runs p4/roce.p4. The controller installs the queue pairs
through :attr:`controller.switch.SwitchController.roce`, as on loopback.

What each switch kind does with RoCEv2 is asked of the switch itself, never assumed
here: a soft switch whose data plane does not serve it refuses ``--roce`` when it starts
(its log says why), and a program without RoCEv2's tables has no ``roce`` manager
(:func:`install_roce` then names the switch and its kind).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from emulation.topology import aggregation_tree

if TYPE_CHECKING:
    from emulation.mininet.network import Emulation
    from emulation.topology import Topology, TopologyJob

__all__ = ["icrc_computed", "install_roce", "rdma_lanes", "roce_problems"]

ICRC_KINDS = frozenset({"soft"})
"""Switch kinds whose RoCEv2 replies carry a computed ICRC (the software data planes,
Python and eBPF); a P4 target's carry 0, so hosts turn ICRC checking off for them."""


def rdma_lanes(topo: Topology) -> int:
    """The bench's lanes over RDMA when ``--lanes`` is not given: the topology's default
    (p4/'s 64 with a bmv2 switch), but no wider than a 4 KiB path MTU (a RoCEv2 packet's
    payload is a path MTU)."""
    from emulation.bench.config import DEFAULT_RDMA_LANES
    from emulation.mininet.overrides import default_lanes

    return min(default_lanes(topo), DEFAULT_RDMA_LANES)


def roce_problems(topo: Topology, job: TopologyJob) -> list[str]:
    """Why ``job`` cannot run INA over RoCEv2 on ``topo`` (empty: it can).

    One rank a host (an RNIC is one address, and the switch tells RoCEv2 workers apart
    by address), and one aggregating switch (partial sums between switches are INA over
    UDP; a tree of RoCEv2 switches is not built).
    """
    problems = []
    crowded = [h for h in job.workers if topo.host(h).ranks != 1]
    if crowded:
        problems.append(f"--transport rdma: one rank a host ({', '.join(crowded)} have more)")
    if aggregation_tree(topo, job).hierarchical:
        problems.append(f"--transport rdma: job {job.job_id} aggregates on several switches"
                        " (hierarchical aggregation is INA over UDP only)")  # fmt: skip
    return problems


def icrc_computed(topo: Topology, switches: Sequence[str]) -> bool:
    """Whether every one of ``switches`` computes its replies' ICRC (:data:`ICRC_KINDS`)."""
    return all(topo.switch(s).kind in ICRC_KINDS for s in switches)


def install_roce(
    em: Emulation,
    switches: Sequence[str],
    job_id: int,
    ips: Sequence[str],
    endpoints: Sequence[Sequence[Any]],
    m: int,
) -> list[tuple[int, ...]]:
    """Install job ``job_id``'s RoCEv2 queue pairs (its INA job installed first) on its
    one aggregating switch: rank ``i`` sends from ``ips[i]`` and takes replies at
    ``endpoints[i]``, messages of ``m`` packets; return each rank's switch queue pairs.

    Raises:
        FabricError: not one switch, a switch whose program has no RoCEv2 tables (the
            message names it and its kind), or a refused write.
    """
    from controller.bmv2_thrift import ThriftError
    from controller.client import P4RuntimeError
    from emulation.bench.fabric import FabricError

    if len(switches) != 1:
        raise FabricError(f"INA over RoCEv2 runs on one aggregating switch, not {switches}")
    (name,) = switches
    ctl = em.controllers[name]
    if ctl.roce is None:
        kind = em.topology.switch(name).kind
        raise FabricError(f"switch {name} ({kind}): its program has no RoCEv2 tables")
    try:
        return list(ctl.roce.install(job_id, ips, endpoints, m).switch_qpns)
    except (ValueError, P4RuntimeError, ThriftError) as exc:
        raise FabricError(f"switch {name}: RoCEv2 queue pairs of job {job_id}: {exc}") from exc
