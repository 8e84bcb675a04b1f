"""Per-call packet width (``lanes``) and window of hostlib's collectives.

What :class:`dynamiccl.actions.Action` sets for one call: INA's window (slots
``0..window-1`` of the job's), CollNet's INA-leg window, the ring's and tree's packet
width and per-peer window. Checked on the fake network (virtual time, loss, duplication,
reordering; the in-flight count is watched after every event) and over real UDP sockets
on 127.0.0.1 against an in-process soft switch (a :class:`SwitchServer` thread), with
calls of different knobs mixed in one session.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from helpers import (
    FAKE_SWITCH,
    FakeJob,
    FakePeers,
    SwitchJob,
    check_allreduce,
    expected,
    in_threads,
    peer_ranks,
    random_inputs,
    switch_thread,
    wrapping_sum,
)

from emulation.softswitch.pipeline import Pipeline
from emulation.softswitch.server import SwitchServer
from hostlib import InaSession, JobSpec, RetryPolicy, RingAllreduce, TreeAllreduce
from hostlib.collnet import CollNetAllreduce, LocalGroup, ina_inter
from hostlib.ina import InaAllreduce
from hostlib.p2p import CollectiveCall
from hostlib.peers import PeerCollective
from hostlib.protocol import MAX_LANES
from hostlib.ring import RingCall
from hostlib.transport.memory import FakeNetwork, LinkModel
from hostlib.tree import TreeCall

POLICY = RetryPolicy(timeout=0.0005, min_timeout=0.0002, max_timeout=0.002, deadline=5.0)
LINGER = 40 * POLICY.max_timeout  # see tests/unit/test_ring_tree.py
LOSSY = LinkModel(loss=0.1, duplicate=0.1, reorder=0.2, reorder_delay=0.001)
UDP_POLICY = RetryPolicy(deadline=20.0)
ACTIONS = [(64, 1), (256, 8), (2048, 32)]
"""(lanes, window) of the Action-like calls."""
SWITCH_LANES = 64
SLOTS = 16
KINDS: dict[str, type[PeerCollective]] = {"ring": RingAllreduce, "tree": TreeAllreduce}
CALLS: dict[str, type[CollectiveCall]] = {"ring": RingCall, "tree": TreeCall}
_job_ids = itertools.count(400)


# ----------------------------------------------------------------- shared drivers
def kind_ranks(
    kind: str, n: int, work: Callable[[int, PeerCollective], Any], **spec: Any
) -> list[Any]:
    """Run ``work(rank, session)`` on ``n`` ring or tree sessions over UDP."""
    return peer_ranks(KINDS[kind], n, work, UDP_POLICY, **spec)


def messages(kind: str, n: int, rank: int, size: int, lanes: int) -> int:
    """Data packets one rank sends in one allreduce (no retransmissions)."""
    if kind == "ring":
        seg = [(g + 1) * size // n - g * size // n for g in range(n)]
        return sum(-(-seg[(rank - s) % n] // lanes) for s in range(2 * (n - 1)))
    links = (rank > 0) + sum(c < n for c in (2 * rank + 1, 2 * rank + 2))
    return links * -(-size // lanes)


# ----------------------------------------------------------------- ring and tree, UDP
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_action_like_lanes_and_window_in_one_session(kind: str) -> None:
    n, rng = 4, np.random.default_rng(1)
    plan = [(lanes, window, dtype, size) for (lanes, window), dtype, size in itertools.product(
        ACTIONS, (np.int32, np.float32), (1, 3 * 2048 + 17))]  # fmt: skip
    inputs = [random_inputs(rng, dtype, n, size) for _, _, dtype, size in plan]

    def work(rank: int, s: PeerCollective) -> list[tuple[np.ndarray, int]]:
        out = []
        for (lanes, window, _, _), x in zip(plan, inputs, strict=True):
            before = s.endpoint.stats.sent - s.endpoint.stats.retransmitted
            got = s.allreduce(x[rank], lanes=lanes, window=window)
            out.append((got, s.endpoint.stats.sent - s.endpoint.stats.retransmitted - before))
        return out

    # The spec's defaults differ from every call's knobs.
    per_rank = kind_ranks(kind, n, work, lanes=16, window=2)
    for i, ((lanes, _, _, size), x) in enumerate(zip(plan, inputs, strict=True)):
        check_allreduce([r[i][0] for r in per_rank], x)
        sent = [r[i][1] for r in per_rank]
        assert sent == [messages(kind, n, rank, size, lanes) for rank in range(n)], (i, lanes)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_spec_defaults_still_apply_without_knobs(kind: str) -> None:
    n, x = 3, np.arange(3 * 100, dtype=np.int32).reshape(3, 100)

    def work(rank: int, s: PeerCollective) -> tuple[np.ndarray, int]:
        # Fresh data packets only: a busy machine delays acks into retransmissions.
        got = s.allreduce(x[rank])
        return got, s.endpoint.stats.sent - s.endpoint.stats.retransmitted

    per_rank = kind_ranks(kind, n, work, lanes=7, window=3)
    check_allreduce([r[0] for r in per_rank], x)
    assert [r[1] for r in per_rank] == [messages(kind, n, rank, 100, 7) for rank in range(n)]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_knobs_are_rejected_and_the_session_stays_usable(kind: str) -> None:
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"lanes": 0}, ValueError),
        ({"lanes": MAX_LANES + 1}, ValueError),
        ({"window": 0}, ValueError),
        ({"window": 1.5}, TypeError),
        ({"lanes": True}, TypeError),
    ]

    def work(rank: int, s: PeerCollective) -> np.ndarray:
        for knobs, error in bad:
            with pytest.raises(error, match=r"lanes|window"):
                s.allreduce(np.ones(5, np.int32), **knobs)
        return s.allreduce(np.full(5, rank, np.int32), lanes=MAX_LANES, window=1)

    for got in kind_ranks(kind, 2, work):
        np.testing.assert_array_equal(got, np.ones(5, np.int32))


# ----------------------------------------------------------------- ring and tree, fake net
class Watched:
    """A call whose endpoint's packets in flight per peer are checked after every event."""

    def __init__(self, call: CollectiveCall, window: int) -> None:
        self.call, self.window, self.most = call, window, 0

    def _check(self) -> None:
        inflight = max(len(ch.inflight) for ch in self.call.endpoint._peers)
        assert inflight <= self.window
        self.most = max(self.most, inflight)

    @property
    def done(self) -> bool:
        return self.call.done

    def start(self, now: float) -> list[bytes | bytearray]:
        out = self.call.start(now)
        self._check()
        return out

    def on_datagram(self, data: memoryview, now: float) -> None:
        self.call.on_datagram(data, now)
        self._check()

    def on_timer(self, now: float) -> list[bytes | bytearray]:
        out = self.call.on_timer(now)
        self._check()
        return out

    def next_wakeup(self) -> float:
        return self.call.next_wakeup()


@pytest.mark.parametrize("kind", sorted(CALLS))
@pytest.mark.parametrize("link", [None, LOSSY], ids=["clean", "lossy"])
def test_each_calls_window_bounds_its_packets_in_flight(kind: str, link: LinkModel) -> None:
    n, rng = 5, np.random.default_rng(3)
    peers = FakePeers(n, POLICY, lanes=8, window=16, link=link, seed=4)
    for lanes, window in [(4, 1), (8, 6), (2, 1), (16, 3), (None, None)]:
        inputs = random_inputs(rng, np.int32, n, 1000)
        calls = peers.run_calls(
            lambda ep, x, lanes=lanes, window=window: Watched(
                CALLS[kind](ep, x, LINGER, lanes=lanes, window=window), window or 16
            ),
            inputs,
        )
        check_allreduce([calls[a].call.result() for a in peers.addrs], inputs)
        # Enough packets queue for the window to fill up, and no further.
        assert max(c.most for c in calls.values()) == (window or 16)
    if link is not None:
        assert peers.net.lost > 0 and peers.retransmissions > 0


# ----------------------------------------------------------------- INA, fake network
def ina_call(job: FakeJob, net: FakeNetwork, inputs: np.ndarray, window: int | None) -> list:
    """One call of every worker of ``job`` with ``window``, committed as a session does."""
    engines = {
        a: InaAllreduce(w.spec, x, w.uses, w.policy, None, w.next_seq, window=window)
        for a, w, x in zip(job.addrs, job.states, inputs, strict=True)
    }
    errors = net.run(engines)
    assert all(e is None for e in errors.values()), errors
    return job.finish(engines)


@pytest.mark.parametrize("seed", range(4))
def test_ina_windows_mixed_across_calls_on_a_lossy_network(seed: int) -> None:
    n, rng = 3, np.random.default_rng(20 + seed)
    pipeline = Pipeline(lanes=8, slots=64)
    job = FakeJob(pipeline, 7, n, POLICY, slots=8)
    net = FakeNetwork(pipeline, FAKE_SWITCH, LOSSY, seed=seed)
    plan = [(1, np.int32, 41), (8, np.float32, 100), (3, np.int32, 77),
            (None, np.float32, 8 * 8 + 3), (5, np.float32, 8 * 9 + 1)]  # fmt: skip
    for window, dtype, size in plan:
        uses = job.states[0].uses.copy()
        inputs = random_inputs(rng, dtype, n, size)
        want = expected(inputs, 8)
        for got in ina_call(job, net, inputs, window):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        used = np.flatnonzero(job.states[0].uses != uses)
        assert used.tolist() == list(range(window or 8))
    assert net.lost > 0


def test_ina_window_outside_the_jobs_slots_is_rejected() -> None:
    spec = JobSpec(1, 0, 2, FAKE_SWITCH, lanes=8, slots=4)
    data, uses = np.ones(3, np.int32), np.zeros(4, np.int64)
    for window, error in [(0, ValueError), (5, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="window"):
            InaAllreduce(spec, data, uses, POLICY, window=window)  # type: ignore[arg-type]
    assert InaAllreduce(spec, np.ones(40, np.int32), uses, POLICY, window=2).window == 2
    assert InaAllreduce(spec, data, uses, POLICY, window=4).window == 1  # one packet


# ----------------------------------------------------------------- INA, soft switch
@pytest.fixture(scope="module")
def switch() -> Iterator[SwitchServer]:
    with switch_thread(Pipeline(SWITCH_LANES, 256)) as server:
        yield server


def switch_job(switch: SwitchServer, n: int) -> SwitchJob:
    """A job of ``n`` workers installed in ``switch``'s pipeline, one session each."""
    return SwitchJob(switch, next(_job_ids), n, SLOTS, UDP_POLICY)


@pytest.mark.parametrize("n", [1, 3])
def test_ina_windows_one_four_and_all_against_a_soft_switch(switch: SwitchServer, n: int) -> None:
    rng = np.random.default_rng(30 + n)
    size = SWITCH_LANES * SLOTS * 2 + 5  # every window is filled, twice
    plan = [(w, dtype) for w in (1, 4, None, 4, 1, SLOTS) for dtype in (np.int32, np.float32)]
    inputs = [random_inputs(rng, dtype, n, size) for _, dtype in plan]
    job = switch_job(switch, n)

    def work(s: InaSession) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for (window, _), x in zip(plan, inputs, strict=True):
            uses = s.uses.copy()
            out.append((s.allreduce(x[s.spec.rank], window=window), s.uses - uses))
        return out

    try:
        per_rank = in_threads([lambda s=s: work(s) for s in job.sessions])
    finally:
        job.close()
    for i, ((window, _), x) in enumerate(zip(plan, inputs, strict=True)):
        want = expected(x, SWITCH_LANES)
        for got, advanced in (r[i] for r in per_rank):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            assert np.flatnonzero(advanced).tolist() == list(range(window or SLOTS))


def test_ina_session_rejects_a_bad_window_and_stays_usable(switch: SwitchServer) -> None:
    job = switch_job(switch, 1)
    (s,) = job.sessions
    try:
        for window in (0, SLOTS + 1):
            with pytest.raises(ValueError, match="window"):
                s.allreduce(np.ones(3, np.int32), window=window)
            with pytest.raises(ValueError, match="window"):
                s.reduce_scatter(np.ones(3, np.int32), window=window)
        np.testing.assert_array_equal(s.allreduce(np.arange(3, dtype=np.int32), window=2),
                                      np.arange(3))  # fmt: skip
    finally:
        job.close()


def test_collnet_passes_the_window_to_the_heads_ina_leg(switch: SwitchServer) -> None:
    hosts, local, size = 2, 2, SWITCH_LANES * SLOTS + 3  # every window filled
    job = switch_job(switch, hosts)
    ctx = multiprocessing.get_context("spawn")
    groups = [LocalGroup(local, 4 * size, ctx) for _ in range(hosts)]
    inputs = np.arange(hosts * local * size, dtype=np.int32).reshape(hosts, local, size)
    windows = [1, 4, None, 2]

    def rank(host: int, local_rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
        session = job.sessions[host]
        inter = ina_inter(session) if local_rank == 0 else None
        out = []
        with CollNetAllreduce(groups[host], local_rank, inter) as coll:
            for window in windows:
                uses = session.uses.copy()
                got = coll.allreduce(inputs[host, local_rank], window=window)
                out.append((got, session.uses - uses))
        return out

    try:
        per_rank = in_threads([lambda h=h, r=r: rank(h, r) for h in range(hosts)
                               for r in range(local)])  # fmt: skip
    finally:
        job.close()
        for g in groups:
            g.unlink()
    want = wrapping_sum(inputs.reshape(hosts * local, size))
    for i, window in enumerate(windows):
        for j, results in enumerate(per_rank):
            got, advanced = results[i]
            np.testing.assert_array_equal(got, want)
            if j % local == 0:  # a head: its session used the call's window
                assert np.flatnonzero(advanced).tolist() == list(range(window or SLOTS))


def test_collnet_calls_a_plain_inter_without_a_window() -> None:
    seen: list[Any] = []

    def plain(local: np.ndarray) -> np.ndarray:
        seen.append("plain")
        return local.copy()

    def windowed(local: np.ndarray, window: int | None = None) -> np.ndarray:
        seen.append(window)
        return local.copy()

    with LocalGroup(1, 64, multiprocessing.get_context("spawn")) as group:
        with CollNetAllreduce(group, 0, plain) as coll:
            np.testing.assert_array_equal(coll.allreduce(np.ones(3, np.int32)), np.ones(3))
        with CollNetAllreduce(group, 0, windowed) as coll:
            coll.allreduce(np.ones(3, np.int32), window=3)
            coll.allreduce(np.ones(3, np.int32))
    assert seen == ["plain", 3, None]
