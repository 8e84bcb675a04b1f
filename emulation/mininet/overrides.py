"""The topology as a run applies it: the command line's overrides and what follows from them.

Emulation layer, below both :mod:`emulation.mininet.emulate` (which builds the network) and
:mod:`emulation.mininet.check` (which says what would be built): the ``--bw``/``--delay``/
``--jitter``/``--link-loss``/``--link-dup``/``--link-reorder`` and ``--lanes`` overrides
applied to a loaded topology (:func:`apply_overrides`, pure data in, data out), the INA
packet width a run takes unless told (:func:`default_lanes`), and the one-line account of
the links as applied (:func:`describe_links`). Needs neither root nor Mininet.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emulation.topology import Topology

__all__ = ["apply_overrides", "default_lanes", "describe_links"]


def apply_overrides(
    topo: Topology,
    bw: float | None = None,
    delay: float | None = None,
    loss: float | None = None,
    lanes: int | None = None,
    jitter: float | None = None,
    dup: float | None = None,
    reorder: float | None = None,
) -> Topology:
    """``topo`` with every link's bw/delay/loss/jitter/dup/reorder and every soft switch's
    lanes replaced where given (a pure function: the topology object stays data)."""
    changes: dict[str, Any] = {}
    if dup is not None:
        changes["dup"] = dup
    if reorder is not None:
        changes["reorder"] = reorder
    if jitter is not None:
        changes["jitter"] = jitter
    if bw is not None:
        changes["bw"] = bw
    if delay is not None:
        changes["delay"] = delay
    if loss is not None:
        changes["loss"] = loss
    links = tuple(dataclasses.replace(link, **changes) for link in topo.links)
    switches = tuple(
        dataclasses.replace(s, lanes=lanes) if lanes is not None and s.kind == "soft" else s
        for s in topo.switches
    )
    return dataclasses.replace(topo, links=links, switches=switches, _index={})


def default_lanes(topo: Topology) -> int:
    """The INA packet width a bench on ``topo`` takes unless told: bmv2's fixed width
    when the topology has a bmv2 switch (soft switches follow it), else the bench's."""
    from emulation.bench.config import DEFAULT_BENCH_LANES
    from emulation.bmv2 import BMV2_LANES

    return BMV2_LANES if any(s.kind == "bmv2" for s in topo.switches) else DEFAULT_BENCH_LANES


def describe_links(topo: Topology, netem: bool | None) -> str:
    """The links as applied (after ``--bw``/``--delay``/``--link-loss``/``--link-dup``/
    ``--link-reorder``), for a table's header and a plot's title: ``4 links: 100 Mbit/s,
    1 ms, loss 0.01; ...`` (dup and reorder where set), and who emulates them
    (``netem``: True netem, False the soft switches' ports, None unknown)."""
    groups: dict[tuple[float | None, float, float, float, float, float], int] = {}
    for link in topo.links:
        key = (link.bw, link.delay, link.loss, link.jitter, link.dup, link.reorder)
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (bw, delay_ms, loss, jitter, dup, reorder), count in groups.items():
        rate = "unshaped" if bw is None else f"{bw:g} Mbit/s"
        spread = f" +/- {jitter:g} ms" if jitter else ""
        which = "every link" if count == len(topo.links) else f"{count} links"
        faults = f"loss {loss:g}" + (f", dup {dup:g}" if dup else "")
        faults += f", reorder {reorder:g}" if reorder else ""
        parts.append(f"{which} {rate}, {delay_ms:g} ms{spread} one way, {faults} each way")
    text = "; ".join(parts) or "none"
    if any(link.bw is not None for link in topo.links):
        text += "; rate by HTB"
    if any(link.delay or link.loss or link.jitter for link in topo.links) and netem is not None:
        text += ", delay and loss by " + ("netem" if netem else "the soft switches' ports")
    if any(link.dup or link.reorder for link in topo.links):
        text += ", duplication and reordering by the eBPF switches' ports"
    return text
