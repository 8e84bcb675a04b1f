"""Who emulates each link, and which data plane each soft switch runs: pure decisions.

A topology's links may ask for bandwidth, delay, jitter, loss, duplication and
reordering. Bandwidth is always HTB (Mininet's ``TCLink``). Delay, jitter and loss:

- where the kernel has netem (most distributions), netem on the link's interfaces, as
  Mininet users expect: every switch then forwards plain wires;
- where it has not (this project's CI machine), the soft switch's ports: loss in either
  data plane, delay only in the Python one (its delay line; a TC program cannot hold a
  frame for a time), jitter nowhere, so a link with jitter is refused rather than run
  without it.

Duplication and reordering are the eBPF data plane's ports' on any kernel (netem's
reordering needs a delay and means something else; one mechanism keeps one meaning), so
a soft switch with such a link runs eBPF or the topology is refused. Reordering holds
frames back in the lanes of the link's shaper on the switch's egress
(:mod:`emulation.softswitch.ebpf.lanes`): the link needs a rate, and where netem
emulates its delay or loss in that shaper's class it cannot be reordered too.

Each soft switch runs the eBPF data plane (:mod:`emulation.softswitch.ebpf`) or the Python
one: ``datapath: auto`` (the default) picks eBPF where this machine can run it, no pcap
was asked for (the Python data plane records what it processes; ``--datapath ebpf
--pcap`` records the eBPF one's ports with tcpdump instead, :mod:`.capture`) and none
of the switch's links needs the delay line; a topology or ``inalab emulate --datapath``
may ask for one explicitly, and asking for what cannot be is an error. Every choice comes with the
reason, which the emulator prints.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from emulation.mininet.capture import TCPDUMP
from emulation.topology import Link, Switch, Topology

__all__ = ["DatapathChoice", "LinkPlan", "link_specs", "netem_available", "plan_links"]


@dataclass(frozen=True)
class DatapathChoice:
    """A soft switch's data plane (``python`` or ``ebpf``) and why."""

    datapath: str
    reason: str


@dataclass(frozen=True)
class LinkPlan:
    """How the network's links and soft switches are realised.

    Attributes:
        netem: links' delay, jitter and loss are netem's (TCLink); else the switches'.
        datapaths: soft switch name -> its data plane.
        specs: soft switch name -> ``--link`` spec per port (empty with netem).
    """

    netem: bool
    datapaths: dict[str, DatapathChoice]
    specs: dict[str, dict[int, str]]


def netem_available(release: str | None = None, root: Path = Path("/")) -> bool:
    """Whether this kernel has netem (``sch_netem``): loaded or built in
    (``/sys/module``), or a module ``tc`` would load (``/lib/modules/RELEASE``).

    Args:
        release: the kernel release (default: the running kernel's).
        root: the file system root to look under (tests use another).
    """
    import os

    if (root / "sys/module/sch_netem").exists():
        return True
    modules = root / "lib/modules" / (release or os.uname().release)
    return any(modules.glob("kernel/net/sched/sch_netem.ko*"))


def link_specs(topo: Topology, netem: bool = False) -> dict[str, dict[int, str]]:
    """Per soft switch: ``--link`` specs (``delay=..ms,loss=..[,dup=..][,reorder=..]
    [,ingress]``) per port: everything without netem, only duplication and reordering
    with it.

    Each direction of a link is emulated once: on egress by the switch it leaves, and
    for a host's link (no switch of ours at the host's end) on ingress at the switch
    too. A link between two switches is applied by each on its own egress; if only one
    end is a soft switch, that one applies both directions.
    """
    out: dict[str, dict[int, str]] = {}
    for link in topo.links:
        delay, loss = (0.0, 0.0) if netem else (link.delay, link.loss)
        if not (delay or loss or link.dup or link.reorder):
            continue
        spec = f"delay={delay:g}ms,loss={loss:g}"
        faults = (("dup", link.dup), ("reorder", link.reorder))
        spec += "".join(f",{k}={v:g}" for k, v in faults if v)
        soft = _soft_ends(topo, link)
        for name, port in soft:
            both = len(soft) == 1
            out.setdefault(name, {})[port] = spec + (",ingress" if both else "")
    return out


def _soft_ends(topo: Topology, link: Link) -> list[tuple[str, int]]:
    ends = [(link.a, link.a_port), (link.b, link.b_port)]
    return [
        (n, p)
        for n, p in ends
        if p is not None and isinstance(topo.node(n), Switch) and topo.switch(n).kind == "soft"
    ]


def plan_links(
    topo: Topology,
    *,
    netem: bool,
    ebpf_reason: str | None,
    override: str | None = None,
    pcap: bool = False,
) -> LinkPlan:
    """Decide who emulates the links and each soft switch's data plane.

    Args:
        topo: the network.
        netem: the kernel has netem (:func:`netem_available`).
        ebpf_reason: why the eBPF data plane cannot run here (None: it can).
        override: ``python``/``ebpf``/``auto`` for every soft switch (``inalab emulate
            --datapath``); None keeps each switch's own ``datapath``.
        pcap: the soft switches are to record their ports (the Python data plane in
            process; the eBPF one by tcpdump on each port).

    Raises:
        ValueError: what was asked for cannot be: jitter without netem, delay or loss on a
            link with no soft switch at either end without netem, duplication or
            reordering on such a link, reordering on a link without a rate or with
            netem's delay or loss, or an ``ebpf`` switch that cannot run it here,
            records a pcap without tcpdump, or has a link with delay; a switch with a link that
            duplicates or reorders frames that cannot run ``ebpf``.
    """
    for link in topo.links:
        _check_faults(topo, link, netem)
    if not netem:
        for link in topo.links:
            if link.jitter:
                raise ValueError(
                    f"link {link.a}-{link.b} asks for jitter, which needs netem (this kernel "
                    "has none; the soft switch's delay line is constant)"
                )
            if (link.delay or link.loss) and not _soft_ends(topo, link):
                raise ValueError(
                    f"link {link.a}-{link.b} asks for delay or loss, which without netem only "
                    "the soft switch applies: put a soft switch at one end"
                )
    specs = link_specs(topo, netem)
    datapaths = {
        s.name: _choose(s, override or s.datapath, specs.get(s.name, {}), ebpf_reason, pcap)
        for s in topo.switches
        if s.kind == "soft"
    }
    return LinkPlan(netem, datapaths, specs)


def _check_faults(topo: Topology, link: Link, netem: bool) -> None:
    """Refuse duplication or reordering ``link`` cannot have (see :func:`plan_links`)."""
    where = f"link {link.a}-{link.b} asks for"
    if (link.dup or link.reorder) and not _soft_ends(topo, link):
        raise ValueError(
            f"{where} duplication or reordering, which only the soft switch's eBPF data "
            "plane applies: put a soft switch at one end"
        )
    if link.reorder and link.bw is None:
        raise ValueError(
            f"{where} reordering, which holds frames back in the lanes of the link's "
            "shaper: give it a rate (bw)"
        )
    if link.reorder and netem and (link.delay or link.jitter or link.loss):
        raise ValueError(
            f"{where} reordering and netem's delay, jitter or loss, which netem applies in "
            "the shaper's class that the reordering lanes take over"
        )


def _choose(
    switch: Switch, wanted: str, specs: dict[int, str], ebpf_reason: str | None, pcap: bool
) -> DatapathChoice:
    delayed = sorted(p for p, spec in specs.items() if not spec.startswith("delay=0ms"))
    faulty = sorted(p for p, spec in specs.items() if ",dup=" in spec or ",reorder=" in spec)
    why_not = None
    if ebpf_reason is not None:
        why_not = ebpf_reason
    elif pcap and shutil.which(TCPDUMP) is None:
        why_not = "--pcap records the eBPF data plane's ports with tcpdump, not on PATH"
    elif delayed:
        why_not = (
            f"port {delayed[0]}'s link has a delay and this kernel has no netem: only the "
            "Python data plane's delay line can hold frames back"
        )
    if faulty:
        if wanted == "python":
            why_not = "the Python data plane was asked for"
        if why_not is not None:
            raise ValueError(
                f"switch {switch.name}: port {faulty[0]}'s link duplicates or reorders "
                f"frames, which only the eBPF data plane does: {why_not}"
            )
        return DatapathChoice("ebpf", f"port {faulty[0]}'s link duplicates or reorders frames")
    if wanted == "python":
        return DatapathChoice("python", "asked for")
    if wanted == "ebpf":
        if why_not is not None:
            raise ValueError(f"switch {switch.name}: datapath ebpf: {why_not}")
        return DatapathChoice("ebpf", "asked for")
    if why_not is not None:
        return DatapathChoice("python", why_not)
    if pcap:
        return DatapathChoice("python", "--pcap: the Python data plane records what it "
                              "processes (--datapath ebpf: tcpdump on its ports)")  # fmt: skip
    return DatapathChoice("ebpf", "the kernel data plane runs here")
