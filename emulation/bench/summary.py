"""Who won: the answer of ``inalab bench``, after its tables and in its JSON.

Emulation layer (bench). For each size the algorithms' times (the slowest rank's mean
per call, as the tables), the fastest, and each other's time over the fastest's; a size
is marked CPU-bound when any compared row was (:attr:`RowCpu.bound`: its time measures
this machine's CPU, not the network or the algorithm) and wrong when any row had wrong
elements. Then one line for the question the bench is run for: the subject (INA, else the
first algorithm) against the baseline (Gloo, else the first other algorithm), by ranges
of sizes. Pure: rows in, words and JSON out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from emulation.bench.notes import wrap
from hostlib.units import format_size

if TYPE_CHECKING:
    from emulation.bench.report import Row

__all__ = [
    "EVEN",
    "SizeVerdict",
    "Summary",
    "format_summary",
    "human_time",
    "summarize",
]

EVEN = 0.02
"""Speed ratios within this of 1 count as even in the overall line: closer than the
run-to-run noise of a quiet machine's loopback rows."""

SUBJECTS = ("ina", "collnet", "auto")
"""The algorithms the bench is run to judge, in order of preference as the subject."""


@dataclass(frozen=True)
class SizeVerdict:
    """One size: every algorithm's time there, the fastest, and the marks."""

    nbytes: int
    times_us: dict[str, float]
    """By algorithm, in the run's order: the slowest rank's mean time per call."""
    bound: tuple[str, ...] = ()
    """The algorithms whose row at this size was CPU-bound."""
    wrong: tuple[str, ...] = ()
    """The algorithms whose row at this size had wrong elements."""

    @property
    def fastest(self) -> str:
        return min(self.times_us, key=lambda a: self.times_us[a])

    def ratio(self, algo: str, to: str | None = None) -> float:
        """``algo``'s time over ``to``'s (default the fastest's): how many times faster
        ``to`` was; ``inf`` when ``to`` took no time.

        Raises:
            KeyError: either algorithm was not measured at this size.
        """
        base = self.times_us[self.fastest if to is None else to]
        return self.times_us[algo] / base if base > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {
            "size_bytes": self.nbytes,
            "times_us": dict(self.times_us),
            "fastest": self.fastest,
            "slower_than_fastest": {a: self.ratio(a) for a in self.times_us if a != self.fastest},
            "cpu_bound": bool(self.bound),
            "cpu_bound_algos": list(self.bound),
            "wrong_algos": list(self.wrong),
        }


@dataclass(frozen=True)
class Summary:
    """The whole answer: per size, and the subject against the baseline."""

    sizes: tuple[SizeVerdict, ...]
    subject: str | None
    """The algorithm judged (``None``: fewer than two algorithms, nothing to compare)."""
    baseline: str | None

    def speedups(self) -> list[tuple[int, float]]:
        """(size, the baseline's time over the subject's) where both were measured."""
        if self.subject is None or self.baseline is None:
            return []
        return [
            (v.nbytes, v.ratio(self.baseline, self.subject))
            for v in self.sizes
            if self.subject in v.times_us and self.baseline in v.times_us
        ]

    def overall(self) -> str:
        """One sentence: where the subject was faster than the baseline, slower, even,
        each by its ranges of sizes and its extreme speed ratio; and where rows were
        CPU-bound."""
        if not self.sizes:
            return "no size finished: nothing to compare"
        if self.subject is None or self.baseline is None:
            only = ", ".join(sorted({a for v in self.sizes for a in v.times_us}))
            return f"{only} alone: nothing to compare"
        pairs = self.speedups()
        if not pairs:
            return f"{self.subject} and {self.baseline} never ran at the same size"
        parts = _clauses(pairs, self.baseline)
        text = f"{self.subject} " + ", ".join(parts)
        bound = [v.nbytes for v in self.sizes if v.bound]
        if bound:
            text += f"; CPU-bound at {_ranges(bound, [v.nbytes for v in self.sizes])}"
        return text

    def fastest(self) -> str:
        """Which algorithm was fastest where: ``ina at 4K..16K; ring at 64K, 1M..4M``."""
        every = [v.nbytes for v in self.sizes]
        winners = dict.fromkeys(v.fastest for v in self.sizes)
        return "; ".join(
            f"{a} at {_ranges([v.nbytes for v in self.sizes if v.fastest == a], every)}"
            for a in winners
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON document's ``summary``: per size, the comparison and the sentence."""
        pairs = self.speedups()
        return {
            "subject": self.subject,
            "baseline": self.baseline,
            "speedup": "baseline's time / subject's time at a size (above 1: subject faster)",
            "speedups": {str(n): x for n, x in pairs},
            "sizes": [v.to_json() for v in self.sizes],
            "fastest": self.fastest(),
            "overall": self.overall(),
        }


def _clauses(pairs: Sequence[tuple[int, float]], baseline: str) -> list[str]:
    """``faster than gloo at 4K..1M (up to 2.10x)``, ``slower at 4M (down to 0.45x)``,
    ``even at 16M (within 2%)``: the sizes of ``pairs`` (size, speed ratio) by outcome;
    the first clause names the baseline."""
    order = [n for n, _ in pairs]
    faster = [(n, x) for n, x in pairs if x > 1 + EVEN]
    slower = [(n, x) for n, x in pairs if x < 1 - EVEN]
    even = [(n, x) for n, x in pairs if 1 - EVEN <= x <= 1 + EVEN]
    groups = []
    if faster:
        groups.append(("faster", faster, f"up to {_times(max(x for _, x in faster))}"))
    if slower:
        groups.append(("slower", slower, f"down to {_times(min(x for _, x in slower))}"))
    if even:
        groups.append(("even", even, f"within {EVEN:.0%}"))
    parts: list[str] = []
    for word, group, extreme in groups:
        named = word if parts else f"{word} {'with' if word == 'even' else 'than'} {baseline}"
        parts.append(f"{named} at {_ranges([n for n, _ in group], order)} ({extreme})")
    return parts


def summarize(rows: Iterable[Row], algos: Sequence[str] = ()) -> Summary:
    """Who won at each size among ``rows``; ``algos`` orders the algorithms (the run's
    order; algorithms not in it follow in the rows' order).

    Raises:
        ValueError: two rows of one algorithm at one size.
    """
    rows = list(rows)
    order = list(dict.fromkeys([*algos, *(r.algo for r in rows)]))
    by_size: dict[int, dict[str, Row]] = {}
    for r in rows:
        at = by_size.setdefault(r.nbytes, {})
        if r.algo in at:
            raise ValueError(f"two rows of {r.algo} at {r.nbytes} bytes")
        at[r.algo] = r
    sizes = tuple(_verdict(n, by_size[n], order) for n in sorted(by_size))
    present = [a for a in order if any(a in v.times_us for v in sizes)]
    subject = next((a for a in SUBJECTS if a in present), present[0] if present else None)
    others = [a for a in present if a != subject]
    baseline = "gloo" if "gloo" in others else (others[0] if others else None)
    return Summary(sizes, subject if baseline is not None else None, baseline)


def _verdict(nbytes: int, at: dict[str, Row], order: Sequence[str]) -> SizeVerdict:
    algos = [a for a in order if a in at]
    return SizeVerdict(
        nbytes,
        {a: at[a].time_us_max for a in algos},
        tuple(a for a in algos if _bound(at[a])),
        tuple(a for a in algos if at[a].wrong),
    )


def _bound(row: Row) -> bool:
    return row.cpu is not None and row.cpu.bound


def format_summary(summary: Summary) -> str:
    """The report's last block: one line per size (each algorithm's time, who won and by
    how much, CPU-bound and wrong marks), then the overall sentence."""
    head = "# summary: who won at each size (time per call, slowest rank)"
    if summary.subject is None:
        return f"{head}\n# overall: {summary.overall()}"
    algos = list(dict.fromkeys(a for v in summary.sizes for a in v.times_us))
    width = max(len(format_size(v.nbytes)) for v in summary.sizes)
    lines = [head]
    for v in summary.sizes:
        cells = "  ".join(
            f"{a} {human_time(v.times_us[a]) if a in v.times_us else '-':>7}" for a in algos
        )
        lines.append(f"# {format_size(v.nbytes):>{width}}  {cells}  -> {_winner(v)}{_marks(v)}")
    if len(algos) > 2:
        lines += wrap(f"fastest: {summary.fastest()}")
    lines += wrap(f"overall: {summary.overall()}")
    return "\n".join(lines)


def _winner(v: SizeVerdict) -> str:
    """``ina 1.39x faster than gloo`` (more: ``ina 1.20x faster than ring, 1.39x than
    gloo``), or ``ina alone``."""
    best = v.fastest
    ratios = [f"{_times(v.ratio(a))} than {a}" for a in v.times_us if a != best]
    if not ratios:
        return f"{best} alone"
    return f"{best} {ratios[0].replace(' than ', ' faster than ', 1)}" + "".join(
        f", {r}" for r in ratios[1:]
    )


def _marks(v: SizeVerdict) -> str:
    marks = ""
    if v.bound:
        marks += f"  CPU-bound ({', '.join(v.bound)})"
    if v.wrong:
        marks += f"  WRONG ({', '.join(v.wrong)})"
    return marks


def human_time(us: float) -> str:
    """A time per call in its own unit, three significant digits: ``85.2 us``,
    ``1.80 ms``, ``2.31 s``."""
    for scale, unit in ((1e6, "s"), (1e3, "ms")):
        if us >= scale:
            return f"{_sig3(us / scale)} {unit}"
    return f"{_sig3(us)} us"


def _sig3(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _times(ratio: float) -> str:
    """A speed ratio: ``1.39x``, ``12.4x``, ``250x``."""
    return f"{_sig3(ratio)}x"


def _ranges(sizes: Sequence[int], order: Sequence[int]) -> str:
    """``sizes`` as runs of neighbours in ``order``: ``4K..1M, 16M``."""
    runs: list[list[int]] = []
    previous = None
    for n in order:
        if n in sizes:
            if runs and runs[-1][-1] == previous:
                runs[-1].append(n)
            else:
                runs.append([n])
        previous = n
    return ", ".join(
        format_size(r[0]) if len(r) == 1 else f"{format_size(r[0])}..{format_size(r[-1])}"
        for r in runs
    )
