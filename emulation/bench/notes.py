"""The words around ``inalab bench``'s tables: one legend for the whole report, and the
footnotes under each table that carry its numbers.

Emulation layer (bench), beside ``report.py``, which re-exports the footnotes. A legend
line explains a column or a mark once, whatever the number of tables, and only when some
row has it; ``--explain`` gives each explanation in full. Footnotes stay under their table
because they count what happened in its rows. Lines are wrapped to :data:`WIDTH`.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from emulation.bench.cpu import BOUND_FRACTION
from emulation.bench.rows import BUS_FORMULA  # re-exported: the table's words for it

if TYPE_CHECKING:
    from emulation.bench.rows import Row

__all__ = [
    "BUS_FORMULA",
    "CPU_COLUMNS_NOTE",
    "RETX_FOOTNOTES",
    "RETX_NOTE",
    "STEAL_NOTED",
    "WIDTH",
    "bound_note",
    "busy_note",
    "dataplane_note",
    "legend",
    "link_drops_note",
    "size_cpu_note",
    "steal_note",
    "switch_notes",
    "wrap",
]

WIDTH = 100
"""Longest legend line: one screen's width beside the tables' 90-odd columns."""

INA_ALGOS = ("ina", "collnet")
"""The algorithms whose hosts send the size once, through the switch."""


def wrap(text: str) -> list[str]:
    """``text`` as comment lines of at most :data:`WIDTH` characters (``# `` first, and
    ``#   `` before each continuation); a word longer than a line stays whole."""
    return textwrap.wrap(
        text, WIDTH, initial_indent="# ", subsequent_indent="#   ",
        break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip


# ----------------------------------------------------------------- legend
RETX_NOTE = (
    "# retx = packets the ranks sent again (all ranks, warm-up calls included; the"
    " JSON's retransmits_timed: during the timed calls alone): loss"
    " recovered by the hosts, at once when later packets were answered first (fast;"
    " the JSON's retransmits_fast) or by their timers. The JSON says what each was for:"
    " host_drops (a rank's kernel dropped a datagram: its socket buffer was full),"
    " late_answers (a packet reached a rank twice: the first copy was late, not lost, so"
    " a timer fired too early), the switches' drop counters, the links' loss and"
    " link_drops (full queues of the emulated links)"
)
"""The long form of the ``retx`` column's legend (``--explain``)."""

CPU_COLUMNS_NOTE = (
    "# cpu during the timed calls: switch = busiest switch, its process and its in-kernel"
    " data plane (eBPF programs), worker = busiest rank (% of one core; the kernel runs"
    " an eBPF switch's data plane mostly in the sending rank's context, so it counts in"
    " both); machine = % of all cores busy;"
    f" ! = above {BOUND_FRACTION:.0%} (machine: the bench's own processes), ~ = the machine"
    " busy with other processes"
)
"""The long form of the CPU columns' legend (``--explain``)."""


def bound_note() -> str:
    """What the ``!`` of a CPU-bound row means: the legend's line, and the line under
    ``inalab compare``'s and the rate sweep's tables."""
    return (
        f"# ! CPU-bound (above {BOUND_FRACTION:.0%} busy): the time measures the CPU, not the"
        " network or the algorithm"
    )


def legend(rows: Sequence[Row], explain: bool = False) -> list[str]:
    """The explanations that apply to ``rows`` (every table's), once: time and
    bandwidths; INA's busbw when INA or CollNet ran; ``retx`` when a hostlib algorithm
    ran; the CPU columns when measured; ``!`` when a row was CPU-bound. ``explain``:
    each in full rather than in one short line.

    Raises:
        KeyError: a row's collective is not one of :data:`BUS_FORMULA`'s.
    """
    collective = rows[0].collective if rows else "allreduce"
    formula = BUS_FORMULA[collective]
    ina = any(r.algo in INA_ALGOS or r.chosen == "ina" for r in rows)
    retx = any(r.algo != "gloo" for r in rows)  # Gloo's TCP retransmits unseen
    cpu = any(r.cpu is not None for r in rows)
    bound = any(r.cpu is not None and r.cpu.bound for r in rows)
    if explain:
        texts = _long_legend(formula, ina, retx, cpu, bound)
    else:
        texts = _short_legend(formula, ina, retx, cpu, bound)
    return [line for text in texts for line in wrap(text)]


def _short_legend(formula: str, ina: bool, retx: bool, cpu: bool, bound: bool) -> list[str]:
    return [
        "legend (--explain: in full)",
        "time = slowest rank's mean per call; algbw = size/time;"
        f" busbw = algbw * {formula} (nccl-tests)",
        *(["INA's busbw can exceed the link rate (each host sends and receives the size"
           " once): compare algbw"] if ina else []),
        *(["retx = packets the ranks sent again, warm-up included; the footnotes and the"
           " JSON say why"] if retx else []),
        *([f"cpu (%): switch = busiest switch, worker = busiest rank, of one core;"
           f" machine = of all cores; ! = above {BOUND_FRACTION:.0%}, ~ = other processes"
           " busy"] if cpu else []),
        *([bound_note()[2:]] if bound else []),
    ]  # fmt: skip


def _long_legend(formula: str, ina: bool, retx: bool, cpu: bool, bound: bool) -> list[str]:
    return [
        "legend",
        "time = the slowest rank's mean wall time per call over the timed calls,"
        " after the untimed warm-up calls and a barrier (nccl-tests' convention);"
        f" algbw = size/time; busbw = algbw * {formula}, nccl-tests' bus bandwidth",
        *([f"INA's busbw can exceed the link rate, because each host sends and receives"
           f" the size once rather than {formula} of it: compare algbw across algorithms"]
          if ina else []),
        *([RETX_NOTE[2:]] if retx else []),
        *([CPU_COLUMNS_NOTE[2:], "worker cpu per Gbit: the mean rank's CPU seconds per Gbit"
           " of the size (JSON worker_cpu_s_per_gbit_size, the same bytes for every"
           " algorithm) and per Gbit it sent (worker_cpu_s_per_gbit)"] if cpu else []),
        *([bound_note()[2:] + f": a process of the bench above {BOUND_FRACTION:.0%} of a"
           " core, or its processes together above that share of all cores (JSON"
           " cpu.bound_by)"] if bound else []),
    ]  # fmt: skip


# ----------------------------------------------------------------- footnotes
RETX_FOOTNOTES = (
    (
        "host_drops",
        "# host drops: the ranks' kernels dropped {} datagrams for full socket receive"
        " buffers (JSON host_drops)",
    ),
    (
        "late_answers",
        "# late answers: {} packets reached a rank twice (JSON late_answers): late or"
        " duplicated, not lost",
    ),
    (
        "late_timers",
        "# late timers: {} timers expired while their rank was not running; re-armed, not"
        " resent (JSON late_timers)",
    ),
)
"""Row counters that explain a table's ``retx``, each with the line under the table
when any row has some."""


def busy_note(rows: Iterable[Row]) -> str | None:
    """The line under a table whose rows ran beside other load, or ``None``."""
    other = [r.cpu.other_cores for r in rows if r.cpu is not None and r.cpu.busy_other]
    if not other:
        return None
    most = max(o for o in other if o is not None)
    return (
        f"# machine busy with other processes: up to {most:.0%} of a core during"
        f" {len(other)} row(s) (cpu.other_cores)"
    )


def switch_notes(counters: Mapping[str, Any]) -> list[str]:
    """Lines under an INA table from its switches' counters, as the JSON's
    ``switch_counters`` holds them per algorithm (one switch: counter -> value; several:
    switch name -> counter -> value): the packets the switches ignored as duplicates,
    which at zero loss are retransmissions sent while a peer was late (its slot still
    waited), and the drops by reason."""
    dups, drops = 0, Counter[str]()
    nested = all(isinstance(v, Mapping) for v in counters.values())
    for values in counters.values() if nested else [counters]:
        for name, value in values.items():
            if not isinstance(value, int) or value <= 0:
                continue
            if name == "duplicates_ignored":
                dups += value
            elif name.startswith("drop_"):
                drops[name] += value
    lines = []
    if dups:
        lines.append(
            f"# switch: {dups} packets came for a slot that already held theirs, ignored"
            " (duplicates_ignored): late copies, not lost"
        )
    if drops:
        listed = ", ".join(f"{name} {n}" for name, n in sorted(drops.items()))
        lines.append(f"# switch drops: {listed} (JSON metadata switch_counters)")
    return lines


def link_drops_note(drops: Mapping[str, int]) -> str | None:
    """The line under a table whose algorithm's run lost frames in the emulated links'
    queues (the JSON metadata's ``link_drops`` for it: interface -> frames), or
    ``None``."""
    total = sum(drops.values())
    if not total:
        return None
    where = ", ".join(f"{name} {n}" for name, n in sorted(drops.items()))
    return (
        f"# link drops: the emulated links dropped {total} frames in full queues ({where};"
        " JSON metadata link_drops)"
    )


STEAL_NOTED = 0.01
"""A row whose timed calls lost more than this share of the cores to the hypervisor
gets the steal line under its table."""


def steal_note(rows: Iterable[Row]) -> str | None:
    """The line under a table whose rows ran while the hypervisor took this VM's cores
    (``cpu.steal``): the whole VM stood still meanwhile; or ``None``."""
    steal = [r.cpu.system.steal for r in rows if r.cpu is not None and r.cpu.system.steal]
    stolen = [s for s in steal if s > STEAL_NOTED]
    if not stolen:
        return None
    return (
        f"# steal: the hypervisor took up to {max(stolen):.1%} of this VM's cores during"
        f" {len(stolen)} row(s) (cpu.steal)"
    )


def size_cpu_note(rows: Iterable[Row]) -> str | None:
    """The line under a table giving the ranks' CPU per Gbit of the size at the largest
    size (:attr:`Row.worker_cpu_s_per_gbit_size`), and per Gbit a rank sent where the
    algorithm has that figure; ``None`` where not measured."""
    measured = [r for r in rows if r.worker_cpu_s_per_gbit_size is not None]
    if not measured:
        return None
    row = measured[-1]
    sent = row.worker_cpu_s_per_gbit
    return (
        f"# worker cpu, largest size: {row.worker_cpu_s_per_gbit_size:.3f} CPU-s per Gbit"
        " of the size" + (f", per Gbit a rank sent: {sent:.3f}" if sent else "")
    )


def dataplane_note(rows: Iterable[Row]) -> str | None:
    """The line under a table whose rows measured the switches' data plane per Gbit:
    how much of the ranks' CPU per Gbit was the emulated switch's (the kernel runs it
    mostly in the ranks' context), or ``None``."""
    pairs = [
        (r.worker_cpu_s_per_gbit, r.switch_dataplane_cpu_s_per_gbit)
        for r in rows
        if r.worker_cpu_s_per_gbit is not None and r.switch_dataplane_cpu_s_per_gbit is not None
    ]
    if not pairs:
        return None
    worker, switch = pairs[-1]
    return (
        f"# switch data plane: {switch:.3f} CPU-s per Gbit sent of the ranks' {worker:.3f}"
        f" (largest size); about {max(worker - switch, 0.0):.3f} was the rest"
    )
