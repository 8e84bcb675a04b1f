"""``inalab emulate T [--jobs A,B,...] --sharing POLICY bench``: how jobs share a switch's memory.

Emulation layer, pure decisions (no Mininet, no root), beside :mod:`.multijob`. Each
aggregating switch has a pool of ``--switch-slots`` slots per set; a policy says what
each job takes of it and how wide its window (the INA packets each rank keeps in
flight) is:

- ``reserve`` (the default, inalab's static partition): each job reserves its window,
  ``--slots``, for its whole run; a job whose range does not fit fails to install;
- ``partition``: the pool split evenly: each of N jobs reserves ``--switch-slots // N``
  slots, and that is its window;
- ``shared``: no reservation; each job's whole window (``--slots``) is aggregated in a
  region that is the whole pool (a power of two), best effort, and what collides with
  another job's slots there goes to the fallback aggregator of the job's switch, the
  topology's ``role: fallback`` node it names (docs/sharing.md);
- ``dynamic`` (dynamiccl's choice): each of N jobs reserves ``--switch-slots // 2N``
  slots and shares as many again as the region, the top half of the pool, holds, with the
  fallback behind it; dynamiccl's agent picks, round by round from what it reads of the
  region (:mod:`dynamiccl.contention`), among INA within the reservation, INA over the
  whole window, the ring and the tree (:mod:`emulation.mininet.dynamic`).

Jobs aggregated hierarchically (on several switches) take ``reserve`` only.
:func:`plan_sharing` checks a policy against the topology's jobs before any network
exists; :class:`SharingPlan` is what :class:`~emulation.mininet.network.Emulation`
installs by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emulation.topology import Topology, TopologyJob, aggregation_tree

__all__ = ["DEFAULT_ROUNDS", "POLICIES", "SharingPlan", "plan_sharing"]

POLICIES = ("reserve", "partition", "shared", "dynamic")
"""``--sharing``'s choices (the first is the default)."""

DEFAULT_ROUNDS = 10
"""``dynamic``: rounds per job and phase (``--rounds``): the agent's exploration budget
(4 arms) and six more."""

COUNTERS = ("shared_uses", "collisions", "to_fallback", "from_fallback")
"""A sharing job's counters on its switch (``SwitchController.job_counters``)."""


@dataclass(frozen=True)
class SharingPlan:
    """What each job takes of its switch's pool, and its window.

    Attributes:
        policy: one of :data:`POLICIES`.
        window: each job's window: the slots its ranks keep in flight (the bench's
            ``slots``).
        pool: each switch's slot pool per set.
        jobs: how many jobs share the switch (the ``--jobs``; 1 for one job's bench).
        fallbacks: ``shared``: the aggregating switch -> its fallback node.
    """

    policy: str = "reserve"
    window: int = 8
    pool: int = 1024
    jobs: int = 1
    fallbacks: dict[str, str] = field(default_factory=dict)

    @property
    def reserved(self) -> int:
        """Slots each job reserves on its switch."""
        if self.policy == "dynamic":
            return self.window - self.pool // 2
        return 0 if self.policy == "shared" else self.window

    @property
    def shared(self) -> int:
        """Job slots each job has in the switch's shared region (after its reservation)."""
        return self.window - self.reserved

    @property
    def region(self) -> int | None:
        """The shared region's size (``shared``: the whole pool; ``dynamic``: its top
        half), or None: no region."""
        if self.policy == "dynamic":
            return self.pool // 2
        return self.pool if self.policy == "shared" else None

    @property
    def fallback(self) -> bool:
        """Whether jobs have a fallback node behind their switch."""
        return self.policy in ("shared", "dynamic")

    @property
    def fallback_pool(self) -> int:
        """A fallback node's pool: every job's whole window, side by side (it holds each
        job behind the switch as a reservation of its window); the switches' otherwise."""
        return max(self.pool, self.jobs * self.window) if self.fallback else self.pool

    def describe(self) -> str:
        """One line for the output's header (without ``# ``)."""
        jobs = "the job" if self.jobs == 1 else "each job"
        if self.policy == "partition":
            return (f"sharing: partition: the pool of {self.pool} slots split among"
                    f" {self.jobs} job(s): {jobs} reserves {self.window}, its window")  # fmt: skip
        if self.policy == "dynamic":
            fallbacks = ", ".join(f"{f} behind {s}" for s, f in self.fallbacks.items())
            return (f"sharing: dynamic: {jobs} reserves {self.reserved} slots and shares"
                    f" {self.shared} in a region of {self.region} (the pool's top half),"
                    f" fallback {fallbacks}; dynamiccl picks INA within the reservation (window"
                    f" {self.reserved}), INA over the whole window ({self.window}), ring or"
                    " tree, round by round")  # fmt: skip
        if self.policy == "shared":
            fallbacks = ", ".join(f"{f} behind {s}" for s, f in self.fallbacks.items())
            return (f"sharing: shared: {jobs} reserves none and shares its window of"
                    f" {self.window} slots in a region of the whole pool ({self.pool} slots);"
                    f" what collides there goes to the fallback ({fallbacks})")  # fmt: skip
        return (f"sharing: reserve: {jobs} reserves its window of {self.window} slots in a"
                f" pool of {self.pool}")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The JSON form (a multi-job document's ``sharing``, a bench's metadata)."""
        return {
            "policy": self.policy,
            "window": self.window,
            "pool": self.pool,
            "reserved": self.reserved,
            "shared": self.shared,
            "region": self.region,
            "fallbacks": dict(self.fallbacks),
        }


def plan_sharing(
    topo: Topology,
    jobs: Sequence[TopologyJob],
    policy: str,
    slots: int,
    switch_slots: int,
    transport: str = "udp",
) -> SharingPlan:
    """The plan of ``policy`` for ``jobs`` (run at once, on ``topo``), each asking for a
    window of ``slots`` in pools of ``switch_slots``.

    Raises:
        ValueError: the policy cannot be: an unknown policy; ``partition`` or ``shared``
            for a job aggregated on several switches; ``partition`` of a pool smaller
            than the jobs; ``shared`` with a pool that is no power of two, a window wider
            than it, a job's switch without a fallback, or over RoCEv2; ``dynamic``
            the same, and a pool too small for a slot of reservation per job.
    """
    if policy not in POLICIES:
        raise ValueError(f"--sharing {policy}: one of {', '.join(POLICIES)}")
    n = max(1, len(jobs))
    if policy == "reserve":
        return SharingPlan(policy, slots, max(switch_slots, slots), n)
    for job in jobs:
        tree = aggregation_tree(topo, job)
        if tree.hierarchical:
            on = ", ".join(sorted(tree.members))
            raise ValueError(f"--sharing {policy}: job {job.job_id} aggregates on several "
                             f"switches ({on}); {policy} is for jobs on one switch: give "
                             "--sharing reserve")  # fmt: skip
    if policy == "partition":
        if switch_slots < n:
            raise ValueError(f"--sharing partition: a pool of {switch_slots} slots "
                             f"(--switch-slots) cannot be split among {n} jobs")  # fmt: skip
        return SharingPlan(policy, switch_slots // n, switch_slots, n)
    if switch_slots & (switch_slots - 1):
        raise ValueError(f"--sharing {policy}: the shared region is the whole pool or its"
                         f" half, --switch-slots {switch_slots}: give a power of two (e.g."
                         f" {1 << (switch_slots.bit_length() - 1)})")  # fmt: skip
    if policy == "dynamic" and switch_slots < 4 * n:
        raise ValueError(f"--sharing dynamic: a pool of {switch_slots} slots (--switch-slots)"
                         f" leaves no reservation for each of {n} jobs in its lower"
                         " half")  # fmt: skip
    if policy == "shared" and slots > switch_slots:
        raise ValueError(f"--sharing shared: a window of {slots} slots (--slots) is wider"
                         f" than the region of {switch_slots} (--switch-slots): the job's"
                         " own slots would collide with each other")  # fmt: skip
    if transport != "udp":
        raise ValueError(f"--sharing {policy}: INA over UDP only, not --transport {transport}")
    fallbacks: dict[str, str] = {}
    for job in jobs:
        fallback = topo.switch(job.switch).fallback
        if fallback is None:
            raise ValueError(f"--sharing {policy}: job {job.job_id}'s switch {job.switch} has no"
                             " fallback: name a role fallback switch linked to it (fallback:"
                             f" NAME; e.g. topologies/star8_fallback.yaml)")  # fmt: skip
        fallbacks[job.switch] = fallback
    if policy == "dynamic":
        window = switch_slots // (2 * n) + switch_slots // 2
        return SharingPlan(policy, window, switch_slots, n, fallbacks)
    return SharingPlan(policy, slots, switch_slots, n, fallbacks)
