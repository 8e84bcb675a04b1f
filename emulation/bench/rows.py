"""A bench row: one algorithm at one size, merged over ranks, with nccl-tests' bandwidth math.

Emulation layer (bench), below both ``report.py`` (tables, JSON, plot) and ``notes.py``
(the words around the tables), which re-exports :data:`BUS_FORMULA` from here and
``report.py`` the rest: :class:`Row` (its bandwidths, its CPU figures per Gbit and its
JSON form, both ways), :func:`bus_factor` and the table's ``redop``. Bandwidths follow
nccl-tests: ``algbw = S / t`` and, for allreduce, ``busbw = algbw * 2(n-1)/n``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from emulation.bench.cpu import RowCpu

__all__ = ["BUS_FORMULA", "REDOP", "Row", "bus_factor", "redop"]

BUS_FORMULA = {"allreduce": "2(n-1)/n", "reduce_scatter": "(n-1)/n", "all_gather": "(n-1)/n"}
"""nccl-tests' bus-bandwidth factor per collective, as the table's words spell it."""

REDOP = "sum"


def bus_factor(num_workers: int, collective: str = "allreduce") -> float:
    """nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` for allreduce, ``(n-1)/n`` for
    reduce-scatter and all-gather (what each rank of a ring sends, per byte of the size).

    Raises:
        ValueError: ``num_workers`` < 1, or an unknown collective.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers {num_workers} must be positive")
    if collective not in BUS_FORMULA:
        raise ValueError(f"unknown collective {collective!r}")
    steps = 2.0 if collective == "allreduce" else 1.0
    return steps * (num_workers - 1) / num_workers


def redop(collective: str) -> str:
    """The table's and JSON's ``redop``: ``sum``, or ``none`` for an all-gather."""
    return "none" if collective == "all_gather" else REDOP


@dataclass(frozen=True)
class Row:
    """One algorithm at one size, merged over ranks."""

    algo: str
    nbytes: int
    count: int
    dtype: str
    num_workers: int
    time_us_mean: float
    time_us_min: float
    time_us_max: float
    wrong: int
    """Elements outside tolerance, summed over ranks."""
    max_abs_err: float = 0.0
    retransmits: int = 0
    """Packets the hosts sent again (INA), summed over ranks, warm-up calls included."""
    fast_retransmits: int = 0
    """Of ``retransmits``, those sent because later packets were answered first (fast
    retransmission); the rest waited for a timer."""
    host_drops: int = 0
    """Datagrams the ranks' kernels dropped for their sockets (receive buffer full) during
    the size's calls, warm-up included: losses the hosts made, not the network."""
    chosen: str | None = None
    """``auto``: the algorithm dynamiccl chose and ran at this size."""
    cpu: RowCpu | None = None
    """CPU use during the timed calls (``None``: not measured)."""
    late_answers: int = 0
    """Packets that reached a rank a second time, summed over ranks: retransmissions
    whose first copy was late rather than lost (timers that fired too early), and
    duplicates made on the way."""
    late_timers: int = 0
    """Timers the ranks served late and re-armed instead of retransmitting (warm-up
    included): a rank had not been running when they expired (the machine stalled)."""
    collective: str = "allreduce"
    """What was timed; ``nbytes`` is its whole vector (see ``bench.config.COLLECTIVES``)."""
    transport: str | None = None
    """``ina``: how its ranks reached the switch, ``udp`` or ``rdma`` (RoCEv2); ``None``
    for the other algorithms."""
    sent_bytes: int | None = None
    """Bytes per call the hosts put on their links (Ethernet frames, by the interfaces'
    transmit counters over the timed calls), summed over hosts: headers, retransmissions
    and (Gloo) TCP's acknowledgements included. ``None`` where ranks share no link of
    their own (loopback)."""
    retransmits_timed: int = 0
    """Of ``retransmits``, those sent during the timed calls: the warm-up's include what
    ranks entering the first call apart cost (a rank early sends its window and its
    timers fire until the others join), which is not the network's doing."""
    late_samples: int = 0
    """Round trips the INA ranks' estimators took from late answers, summed over ranks
    (warm-up included): timeouts proved spurious (docs/protocol.md, "Timeouts")."""

    @property
    def algbw(self) -> float:
        """GB/s (1e9 B/s) at the slowest rank's mean time."""
        if self.time_us_max <= 0:
            return 0.0
        return self.nbytes / self.time_us_max / 1e3

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.num_workers, self.collective)

    @property
    def worker_cpu_s_per_gbit(self) -> float | None:
        """The mean rank's CPU seconds per Gbit it sent: its CPU share of the timed calls
        times their time, over what it sends per call (INA: the size once, for an
        allreduce and a reduce-scatter alike; ring, tree and Gloo: the bus factor of it,
        ``2(n-1)/n`` for an allreduce, ``(n-1)/n`` for the others). ``None``: CPU not
        measured, or an algorithm whose ranks send unequal amounts (collnet, auto).
        Includes what the kernel did in the rank's context: on emulated links that is
        much of the switch's and the links' work."""
        algo = self.chosen or self.algo
        if algo == "ina":
            sent_share = 1.0
        elif algo in ("ring", "tree", "gloo"):
            sent_share = bus_factor(self.num_workers, self.collective)
        else:
            return None
        cpu_s = self._worker_cpu_s
        return None if cpu_s is None else round(cpu_s / (self.nbytes * 8e-9 * sent_share), 4)

    @property
    def worker_cpu_s_per_gbit_size(self) -> float | None:
        """The mean rank's CPU seconds per Gbit of the size (the nccl-tests ``size``
        column, which ``algbw`` divides): the same bytes for every algorithm, so rows of
        INA, ring, tree and Gloo compare as the CPU it takes to reduce (or gather) one
        Gbit, where :attr:`worker_cpu_s_per_gbit` divides by what each sends. ``None``:
        CPU not measured."""
        cpu_s = self._worker_cpu_s
        return None if cpu_s is None else round(cpu_s / (self.nbytes * 8e-9), 4)

    @property
    def _worker_cpu_s(self) -> float | None:
        """The mean rank's CPU seconds per timed call (its CPU share times the call's
        time), the numerator of both per-Gbit figures; ``None``: not measured, or no
        bytes to divide by."""
        if self.cpu is None or self.nbytes == 0:
            return None
        known = [w for w in self.cpu.workers if w is not None]
        if not known:
            return None
        return sum(known) / len(known) * self.time_us_max / 1e6

    @property
    def switch_dataplane_cpu_s_per_gbit(self) -> float | None:
        """The switches' data planes' CPU seconds (their BPF programs' run time, all
        switches) per Gbit the ranks sent, per rank: on the scale of
        :attr:`worker_cpu_s_per_gbit`, which includes most of it (the kernel runs the
        programs in the sending rank's context). ``None``: not measured (no eBPF switch,
        or the kernel's statistics could not be turned on), or no per-Gbit figure for
        the algorithm."""
        per_rank = self.worker_cpu_s_per_gbit
        cores = self.cpu.dataplane_cores if self.cpu is not None else None
        known = [w for w in self.cpu.workers if w is not None] if self.cpu is not None else []
        if per_rank is None or cores is None or not known or sum(known) <= 0:
            return None
        # Same time and bytes as the ranks' figure: scale it by data plane over ranks' CPU.
        return round(per_rank * cores / sum(known), 4)

    @classmethod
    def from_json(cls, doc: Any, num_workers: int) -> Row:
        """A row of a bench JSON document (:meth:`to_json`) back, without its ``cpu``: the
        document keeps the shares, not the samples they came from (read ``cpu`` as it is).

        Args:
            doc: one entry of the document's ``rows``.
            num_workers: the run's ranks (``metadata.workers``), which busbw depends on.

        Raises:
            ValueError: ``doc`` is not such a row (the message names the key).
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"expected a row object, got {type(doc).__name__}")
        try:
            time_us = doc["time_us"]
            chosen = doc.get("chosen")
            return cls(
                algo=_text(doc["algo"]),
                nbytes=_whole(doc["size_bytes"]),
                count=_whole(doc["count"]),
                dtype=_text(doc["type"]),
                num_workers=num_workers,
                time_us_mean=_real(time_us["mean"]),
                time_us_min=_real(time_us["min"]),
                time_us_max=_real(time_us["max"]),
                wrong=_whole(doc["wrong"]),
                max_abs_err=_real(doc.get("max_abs_err", 0.0)),
                retransmits=_whole(doc.get("retransmits", 0)),
                fast_retransmits=_whole(doc.get("retransmits_fast", 0)),
                retransmits_timed=_whole(doc.get("retransmits_timed", 0)),
                late_samples=_whole(doc.get("late_samples", 0)),
                host_drops=_whole(doc.get("host_drops", 0)),
                late_answers=_whole(doc.get("late_answers", 0)),
                late_timers=_whole(doc.get("late_timers", 0)),
                chosen=None if chosen is None else _text(chosen),
                collective=_text(doc.get("collective", "allreduce")),
                transport=None if doc.get("transport") is None else _text(doc["transport"]),
                sent_bytes=None if doc.get("sent_bytes") is None else _whole(doc["sent_bytes"]),
            )
        except KeyError as exc:
            raise ValueError(f"no {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    def to_json(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "size_bytes": self.nbytes,
            "count": self.count,
            "type": self.dtype,
            "collective": self.collective,
            "redop": redop(self.collective),
            "time_us": {
                "mean": self.time_us_mean,
                "min": self.time_us_min,
                "max": self.time_us_max,
            },
            "algbw_gbps": self.algbw,
            "busbw_gbps": self.busbw,
            "wrong": self.wrong,
            "max_abs_err": self.max_abs_err,
            "retransmits": self.retransmits,
            "retransmits_fast": self.fast_retransmits,
            "retransmits_timed": self.retransmits_timed,
            "host_drops": self.host_drops,
            "late_answers": self.late_answers,
            "late_timers": self.late_timers,
            "late_samples": self.late_samples,
            **({"chosen": self.chosen} if self.chosen is not None else {}),
            **({"transport": self.transport} if self.transport is not None else {}),
            **({"sent_bytes": self.sent_bytes} if self.sent_bytes is not None else {}),
            **({"cpu": self.cpu.to_json()} if self.cpu is not None else {}),
            **(
                {"worker_cpu_s_per_gbit": self.worker_cpu_s_per_gbit}
                if self.worker_cpu_s_per_gbit is not None
                else {}
            ),
            **(
                {"worker_cpu_s_per_gbit_size": self.worker_cpu_s_per_gbit_size}
                if self.worker_cpu_s_per_gbit_size is not None
                else {}
            ),
            **(
                {"switch_dataplane_cpu_s_per_gbit": self.switch_dataplane_cpu_s_per_gbit}
                if self.switch_dataplane_cpu_s_per_gbit is not None
                else {}
            ),
        }


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)
