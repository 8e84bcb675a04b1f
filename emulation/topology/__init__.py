"""The topology data: what a network is, read from a file, and what follows from it.

- :mod:`~emulation.topology.model`: hosts, switches, links and jobs as pure data, and
  the aggregation tree of a job;
- :mod:`~emulation.topology.load`: topology files (inalab's YAML, p4lang/tutorials'
  ``topology.json``) loaded and validated, every error placed in its file;
- :mod:`~emulation.topology.summary`: the network as ``dynamiccl`` sees it;
- :mod:`~emulation.topology.convergence`: the links where a job's streams converge.

Nothing here imports Mininet or a switch: it runs without root, and the emulation, the
bench and ``dynamiccl``'s command read the same objects. The names below are those
``emulation.topology`` always had.
"""

from emulation.topology.load import load_topology, parse_topology
from emulation.topology.model import (
    SWITCH_DATAPATHS,
    SWITCH_KINDS,
    SWITCH_ROLES,
    AggregationTree,
    Host,
    Link,
    Switch,
    Topology,
    TopologyError,
    TopologyJob,
    aggregation_tree,
    shortest_path_tree,
)

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
    "load_topology",
    "parse_topology",
    "shortest_path_tree",
]
