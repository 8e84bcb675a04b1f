"""Vectors of sharing (docs/sharing.md): a job's shared slots, its fallback, a job served
behind another switch, and the per-job counters a step may name.

Test tooling beside ``runner.py``. A job of a vector may say

- ``"shared": {"count": N, "region": SIZE}``: N slots after its reservation in the
  switch's shared region (made with SIZE slots by the first job that asks);
- ``"fallback": {"port": P}``: port P plays the job's fallback aggregator;
- ``"behind": {"port": P, "workers": N}`` instead of ``"workers"``: the switch is the
  job's fallback aggregator, and port P plays the switch in front of it (every rank's
  packets come from there).

``expect_counters`` may then name ``job<J>.<counter>`` for the sharing counters of job J
(``shared_uses``, ``collisions``, ``to_fallback``, ``from_fallback``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.switch import SwitchController, WorkerAddress

__all__ = ["SharingSpec", "counter_keys", "install", "is_job_counter", "job_counters", "parse"]

STATS = ("shared_uses", "collisions", "to_fallback", "from_fallback")
_KEY = re.compile(r"job(\d+)\.(" + "|".join(STATS) + r")")


@dataclass(frozen=True)
class SharingSpec:
    """A vector job's sharing: shared slots and region, fallback port, front port."""

    shared: int = 0
    region: int | None = None
    fallback: int | None = None
    behind: int | None = None
    behind_workers: int = 0


def parse(job: dict[str, Any], at: Any, port: Callable[[Any, Any], int]) -> SharingSpec | None:
    """The sharing of a job's JSON object (None without any); ``at`` is the runner's
    place for errors, ``port`` its checked port number.

    Raises:
        VectorError: a malformed sharing field.
    """
    if not job.keys() & {"shared", "fallback", "behind"}:
        return None
    spec = SharingSpec()
    if "shared" in job:
        s = job["shared"]
        if not isinstance(s, dict) or not set(s) <= {"count", "region"} or "count" not in s:
            raise (at / "shared").error('needs {"count": N} and may name "region"')
        spec = SharingSpec(int(s["count"]), None if "region" not in s else int(s["region"]))
    if "fallback" in job:
        f = job["fallback"]
        if not isinstance(f, dict) or set(f) != {"port"}:
            raise (at / "fallback").error('needs {"port": P}')
        spec = SharingSpec(spec.shared, spec.region, port(f["port"], at / "fallback" / "port"))
    if "behind" in job:
        b = job["behind"]
        if "workers" in job or not isinstance(b, dict) or set(b) != {"port", "workers"}:
            raise (at / "behind").error('needs {"port": P, "workers": N} and no "workers"')
        spec = SharingSpec(behind=port(b["port"], at / "behind" / "port"),
                           behind_workers=int(b["workers"]))  # fmt: skip
    return spec


def counter_keys(jobs: Sequence[Any]) -> frozenset[str]:
    """The ``job<J>.<counter>`` names a vector with ``jobs`` may expect."""
    return frozenset(f"job{j.job_id}.{s}" for j in jobs if j.sharing is not None for s in STATS)


def is_job_counter(name: str) -> bool:
    return _KEY.fullmatch(name) is not None


def install(
    ctl: SwitchController, job: Any, address: Callable[[int], WorkerAddress]
) -> bool:
    """Install ``job`` if it shares or is served behind a port; False if it does not."""
    spec: SharingSpec | None = job.sharing
    if spec is None:
        return False
    if spec.behind is not None:
        ctl.add_behind(job.job_id, spec.behind_workers, job.slot_count, address(spec.behind))
        return True
    workers = [address(p) for p in job.workers]
    fallback = None if spec.fallback is None else address(spec.fallback)
    ctl.add_job(job.job_id, workers, job.slot_count, shared=spec.shared, region=spec.region,
                fallback=fallback)  # fmt: skip
    return True


def job_counters(ctl: SwitchController, jobs: Sequence[Any]) -> dict[str, int]:
    """The sharing counters of the vector's sharing jobs, as ``job<J>.<counter>``."""
    return {
        f"job{j.job_id}.{k}": v
        for j in jobs
        if j.sharing is not None
        for k, v in ctl.job_counters(j.job_id).items()
    }
