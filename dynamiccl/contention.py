"""What a job sees of the switch memory it shares with other jobs, and what that costs an
INA call (issue #41; docs/sharing.md, docs/dynamiccl.md "Contention").

A job on a sharing switch has ``reserved`` slots of its own and ``shared`` job slots
past them in a region of the pool that jobs share, best effort, with a fallback
aggregator on a server behind the switch. An INA window of ``w`` packets uses job slots
``0 .. w - 1``: the first ``reserved`` are the job's alone (**INA reserved**, ``w <=
reserved``); the others lie in the region (**INA shared**), where a cell another job
holds sends every packet of that slot to the fallback, unchanged, and slots past
``reserved + shared`` go there too. The fallback's one link then carries every worker's
contribution of those slots: a floor under the call's time that no window removes (4
workers' 16 MiB through a 1 Gbit/s link: 537 ms, measured 691 ms; docs/results.md
"2026-11-30").

:class:`Contention` is one reading: taken by :func:`read_contention` from a job's
controller (``SwitchController.job_sharing``: the owner register over the job's region
and its sharing counters), or given by hand (``inalab decide --reserved/--shared/
--blocked``). :func:`fallback_fraction` and :func:`fallback_floor` are the cost model's
part; :class:`~dynamiccl.agent.Agent` raises an INA arm's prior to the floor and, when the
blocked fraction moves by :data:`CHANGE` or more between readings, forgets what it
measured of the shared arms (they ran under another contention) and explores again.

Pure arithmetic apart from :func:`read_contention`, which only calls the controller it
is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CHANGE",
    "Contention",
    "ContentionError",
    "SharingSource",
    "fallback_floor",
    "fallback_fraction",
    "prospective",
    "read_contention",
]

CHANGE = 0.25
"""A move of the blocked fraction between two readings that makes the agent forget its
shared arms' times: a quarter of the job's shared slots changing hands changes a shared
arm's time by about that share of the fallback's floor, which is larger than the
call-to-call noise the agent's change band tolerates (x1.5)."""


class ContentionError(ValueError):
    """A contention reading out of range (a count below zero, a fraction outside 0..1)."""


@dataclass(frozen=True)
class Contention:
    """One reading of a job's switch memory.

    Attributes:
        reserved: the job's reserved slots.
        shared: its job slots in the shared region past them (0: none).
        blocked: the fraction of those shared slots whose cell another job holds now.
        region_free: the region's free cells (None: unknown or no region).
        fallback_share: of the job's uses in the region since the previous reading, the
            fraction the fallback completed (None: none since; informative, the cost
            model uses ``blocked``, which is known without using the region).
        fallback: whether the job has a fallback aggregator (without one, a window past
            its reservation and shared slots cannot run).
    """

    reserved: int
    shared: int = 0
    blocked: float = 0.0
    region_free: int | None = None
    fallback_share: float | None = None
    fallback: bool = True

    def __post_init__(self) -> None:
        if self.reserved < 0 or self.shared < 0:
            raise ContentionError(
                f"reserved and shared slots must be >= 0, got {self.reserved}, {self.shared}"
            )
        if not 0.0 <= self.blocked <= 1.0:
            raise ContentionError(f"blocked must be a fraction in 0..1, got {self.blocked!r}")
        share = self.fallback_share
        if share is not None and not 0.0 <= share <= 1.0:
            raise ContentionError(f"fallback_share must be in 0..1, got {share!r}")

    @property
    def slots(self) -> int:
        """Job slots on the switch: reserved and shared."""
        return self.reserved + self.shared

    def usable(self, window: int) -> bool:
        """Whether an INA window of ``window`` can run: within the job's slots, or past
        them with a fallback to take the rest."""
        return window <= self.slots or (self.fallback and self.slots > 0)

    def arm(self, window: int) -> str:
        """``reserved`` for a window within the reservation, else ``shared``."""
        return "reserved" if window <= self.reserved else "shared"

    def describe(self) -> str:
        """One line for a person."""
        text = f"{self.reserved} slots reserved"
        if self.shared:
            text += f", {self.shared} shared ({self.blocked:.0%} held by other jobs"
            if self.region_free is not None:
                text += f", {self.region_free} cells of the region free"
            text += ")"
        if self.fallback_share is not None:
            text += f"; the fallback completed {self.fallback_share:.0%} of its shared uses"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "reserved": self.reserved,
            "shared": self.shared,
            "blocked": self.blocked,
            "region_free": self.region_free,
            "fallback_share": self.fallback_share,
            "fallback": self.fallback,
        }


def fallback_fraction(contention: Contention, window: int) -> float:
    """The fraction of an INA window's packets that go to the fallback: the shared slots'
    blocked part, and every slot past the job's reserved and shared ones.

    Raises:
        ValueError: a window below 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    in_region = max(0, min(window, contention.slots) - contention.reserved)
    beyond = max(0, window - contention.slots)
    return (contention.blocked * in_region + beyond) / window


def fallback_floor(
    contention: Contention, window: int, size_bytes: int, workers: int, bandwidth: float | None
) -> float:
    """Seconds the fallback's link needs for its part of one call: every worker's
    contribution of the slots it aggregates, over one link of ``bandwidth`` bytes/s (the
    fallback is a server with one link, as the workers are); 0 when nothing goes there or
    the link is unshaped (None)."""
    if bandwidth is None or bandwidth <= 0:
        return 0.0
    return fallback_fraction(contention, window) * workers * size_bytes / bandwidth


class SharingSource(Protocol):
    """What :func:`read_contention` needs of a controller
    (:class:`controller.switch.SwitchController`)."""

    def job_sharing(self, job_id: int) -> Any: ...


def read_contention(
    controller: SharingSource, job_id: int, before: dict[str, int] | None = None
) -> tuple[Contention, dict[str, int]]:
    """``job_id``'s contention now, through its switch's controller, and the counters to
    pass as ``before`` next time (the fallback share is over the uses between the two).

    Raises:
        JobNotFoundError, P4RuntimeError, ThriftError: the controller's read failed.
    """
    state = controller.job_sharing(job_id)
    counters = dict(state.counters)
    region = state.region
    blocked = 0.0 if region is None or not region.mine else region.blocked / region.mine
    previous = before or {}
    here = counters["shared_uses"] - previous.get("shared_uses", 0)
    there = counters["from_fallback"] - previous.get("from_fallback", 0)
    share = there / (here + there) if here + there > 0 else None
    reading = Contention(
        reserved=state.reserved,
        shared=state.shared,
        blocked=blocked,
        region_free=None if region is None else region.free,
        fallback_share=share,
        fallback=state.fallback,
    )
    return reading, counters


def prospective(reserved: int, shared: int, owners: list[int], fallback: bool = True) -> Contention:
    """The contention a job not on the switch now (between two of its runs) would meet
    in a region whose owner cells are ``owners``: its shared slots spread over the
    region, so the fraction blocked is the fraction of cells other jobs hold (exact when
    its shared slots cover the region, as under ``inalab emulate --sharing dynamic``)."""
    held = sum(1 for v in owners if v)
    blocked = held / len(owners) if owners else 0.0
    return Contention(reserved, shared, blocked, len(owners) - held, None, fallback)
