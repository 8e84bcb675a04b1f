"""CollNet's host-local allreduce with real processes and real shared memory.

Every rank is a process started with the ``spawn`` method, as ``inalab bench`` starts
them; the test process is the coordinator: it creates each host's :class:`LocalGroup`,
passes it to the ranks, collects what each rank's calls returned or raised, and unlinks.
Across hosts the heads exchange their local sums over a pipe (the INA switch does this in
tests/integration/test_collnet_udp.py). Results are compared bit for bit with sums
computed here in the documented order; no segment may outlive its group.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import int32_with_limits, wrapping_sum

from hostlib.collnet import SHM_PREFIX, CollNetAllreduce, CollNetError, LocalGroup

CTX = multiprocessing.get_context("spawn")
SHM = Path("/dev/shm")
RUN_S = 120.0
"""Longest a test waits for its ranks (spawned ranks import numpy and pytest)."""

Op = tuple[Any, ...]
"""What a rank does: ("sum", dtype, shape, call) | ("unlink",)."""


def make_input(host: int, rank: int, dtype: str, shape: tuple[int, ...], call: int) -> np.ndarray:
    """Deterministic input of one rank for one call: int32 over the whole range (with
    the limits, so sums wrap), float32 over many magnitudes."""
    rng = np.random.default_rng([host, rank, call, len(shape)])
    size = int(np.prod(shape))
    if dtype == "int32":
        return int32_with_limits(rng, size).reshape(shape)
    scale = np.exp2(rng.integers(-30, 30, size=size))
    return (rng.standard_normal(size) * scale).astype(dtype).reshape(shape)


def local_sum(inputs: list[np.ndarray]) -> np.ndarray:
    """The documented local order: ``((x_0 + x_1) + x_2) + ...`` in the inputs' dtype."""
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = acc + x
    return acc


# ----------------------------------------------------------------- the rank processes
@dataclass(frozen=True)
class Rank:
    """One rank's part; picklable (the group only while spawning)."""

    group: LocalGroup
    local_rank: int
    ops: tuple[Op, ...]
    host: int = 0
    inter: str = "none"  # "none" | "pipe" (to the other head) | "boom" (fails from call 2)
    die_after: int | None = None  # exit abruptly after this many ops


def rank_main(rank: Rank, conn: Connection, peer: Connection | None, start_line: Barrier) -> None:
    """Run ``rank.ops``; send one outcome per op: ("ok", array) or ("err", type, text,
    step, seconds)."""
    outcomes: list[tuple[Any, ...]] = []
    try:
        with CollNetAllreduce(rank.group, rank.local_rank, _inter(rank, peer)) as coll:
            # All ranks start their calls together: the time a spawned process takes to
            # start is not charged to the group's (short) barrier timeout.
            start_line.wait(RUN_S)
            for i, op in enumerate(rank.ops):
                if i == rank.die_after:
                    os._exit(3)  # no cleanup, no goodbye: as a crashed rank
                start = time.monotonic()
                try:
                    outcomes.append(("ok", _run_op(coll, rank, op)))
                except (CollNetError, ValueError, TypeError) as exc:
                    took = time.monotonic() - start
                    step = getattr(exc, "step", None)
                    outcomes.append(("err", type(exc).__name__, str(exc), step, took))
        conn.send(outcomes)
    finally:
        conn.close()


def _inter(rank: Rank, peer: Connection | None) -> Any:
    if rank.inter == "boom":
        calls = itertools.count()

        def boom(x: np.ndarray) -> np.ndarray:
            if next(calls):
                raise RuntimeError("boom: the switch is on fire")
            return x.copy()

        return boom
    if rank.inter == "pipe":
        assert peer is not None

        def exchange(x: np.ndarray) -> np.ndarray:
            peer.send(np.array(x))
            other = peer.recv()
            # Both heads add host 0's sum first: identical results on both hosts.
            return x + other if rank.host == 0 else other + x

        return exchange
    return None


def _run_op(coll: CollNetAllreduce, rank: Rank, op: Op) -> Any:
    if op[0] == "sum":
        _, dtype, shape, call = op
        return coll.allreduce(make_input(rank.host, rank.local_rank, dtype, shape, call))
    if op[0] == "unlink":
        rank.group.unlink()
        return None
    raise ValueError(f"unknown op {op!r}")


def run_ranks(ranks: list[Rank], links: dict[int, Connection] | None = None) -> list[Any]:
    """Start one spawned process per rank, return each rank's outcomes (``None`` for a
    rank that died) and its exit code. ``links`` gives ranks (by index) a pipe end."""
    links = links or {}
    procs, conns = [], []
    start_line = CTX.Barrier(len(ranks))
    try:
        for i, rank in enumerate(ranks):
            parent, child = CTX.Pipe()
            args = (rank, child, links.get(i), start_line)
            proc = CTX.Process(target=rank_main, args=args, daemon=True)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for end in links.values():
            end.close()
        outcomes: list[Any] = [None] * len(ranks)
        deadline = time.monotonic() + RUN_S
        pending = set(range(len(ranks)))
        while pending and time.monotonic() < deadline:
            ready = wait([conns[i] for i in pending], deadline - time.monotonic())
            for i in [i for i in pending if conns[i] in ready]:
                with contextlib.suppress(EOFError):  # EOF: died without a word
                    outcomes[i] = conns[i].recv()
                pending.discard(i)
        assert not pending, f"ranks {sorted(pending)} hung"
        for proc in procs:
            proc.join(RUN_S)
        return [(out, proc.exitcode) for out, proc in zip(outcomes, procs, strict=True)]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            proc.close()
        for conn in conns:
            conn.close()


def assert_unlinked(group: LocalGroup) -> None:
    assert group.name.startswith(SHM_PREFIX)
    assert not (SHM / group.name).exists(), f"{group.name} left in /dev/shm"


def ok(outcome: tuple[Any, ...]) -> np.ndarray:
    assert outcome[0] == "ok", outcome
    return np.asarray(outcome[1])


def err(outcome: tuple[Any, ...], kind: str, step: str | None, *words: str) -> float:
    """Check an ("err", ...) outcome; return how long the call took."""
    assert outcome[0] == "err", outcome
    _, name, text, got_step, took = outcome
    assert (name, got_step) == (kind, step), outcome
    for w in words:
        assert w in text, outcome
    return float(took)


# ----------------------------------------------------------------- one host
SHAPES = [("int32", (1000,)), ("int32", (3, 7)), ("float32", (4093,)), ("int32", (0,)),
          ("float32", (2, 2048)), ("int32", (4096,))]  # fmt: skip
"""Sizes not divisible by the ranks, smaller than a rank's chunk, empty, and at capacity."""
CAPACITY = 4096 * 4


@pytest.mark.parametrize("local_size", [1, 2, 4])
def test_one_host_sums_exactly_and_identically(local_size: int) -> None:
    ops = tuple(("sum", dtype, shape, call) for call, (dtype, shape) in enumerate(SHAPES))
    with LocalGroup(local_size, CAPACITY, CTX, timeout=60) as group:
        got = run_ranks([Rank(group, r, ops) for r in range(local_size)])
    assert_unlinked(group)
    assert [code for _, code in got] == [0] * local_size
    for call, (dtype, shape) in enumerate(SHAPES):
        inputs = [make_input(0, r, dtype, shape, call) for r in range(local_size)]
        want = local_sum(inputs)
        results = [ok(outcomes[call]) for outcomes, _ in got]
        for y in results:
            assert (y.dtype, y.shape) == (want.dtype, want.shape)
            # Bit for bit: the same bytes on every rank, in the documented order.
            assert y.tobytes() == want.tobytes(), (dtype, shape)
        if dtype == "int32":
            np.testing.assert_array_equal(want.reshape(-1), wrapping_sum(
                np.stack([x.reshape(-1) for x in inputs])))  # fmt: skip
        else:
            wide = np.stack([x.astype(np.float64) for x in inputs])
            # (L-1) float32 roundings, each within 2**-24 of a partial sum.
            bound = (local_size - 1) * 2.0**-23 * np.abs(wide).sum(axis=0)
            assert np.all(np.abs(want.astype(np.float64) - wide.sum(axis=0)) <= bound)


@pytest.mark.slow
def test_two_hosts_of_three_ranks_add_the_heads_sums() -> None:
    ops = (("sum", "int32", (5000,), 0), ("sum", "float32", (777,), 1), ("sum", "int32", (5,), 2))
    cap = 5000 * 4
    with LocalGroup(3, cap, CTX) as g0, LocalGroup(3, cap, CTX) as g1:
        a, b = CTX.Pipe()
        ranks = [Rank(g, r, ops, host=h, inter="pipe" if r == 0 else "none")
                 for h, g in enumerate((g0, g1)) for r in range(3)]  # fmt: skip
        got = run_ranks(ranks, links={0: a, 3: b})
    assert_unlinked(g0)
    assert_unlinked(g1)
    assert [code for _, code in got] == [0] * 6
    for call, (_, dtype, shape, _) in enumerate(ops):
        host_sums = [local_sum([make_input(h, r, dtype, shape, call) for r in range(3)])
                     for h in range(2)]  # fmt: skip
        want = host_sums[0] + host_sums[1]
        for outcomes, _ in got:
            assert ok(outcomes[call]).tobytes() == want.tobytes()
        if dtype == "int32":
            every = [make_input(h, r, dtype, shape, call) for h in range(2) for r in range(3)]
            np.testing.assert_array_equal(want, wrapping_sum(np.stack(every)))


# ----------------------------------------------------------------- bad calls
def test_bad_calls_raise_and_leave_the_group_usable() -> None:
    ops = (
        ("sum", "int32", (CAPACITY // 4 + 1,), 0),  # one element over capacity
        ("sum", "float64", (4,), 1),
        ("sum", "int32", (10,), 2),  # rank 1 has 12 elements instead
        ("sum", "int32", (10,), 3),  # rank 1 has float32 instead
        ("sum", "int32", (10,), 4),
        ("unlink",),
    )
    theirs = list(ops)
    theirs[2], theirs[3] = ("sum", "int32", (12,), 2), ("sum", "float32", (10,), 3)
    with LocalGroup(2, CAPACITY, CTX, timeout=60) as group:
        got = run_ranks([Rank(group, 0, ops), Rank(group, 1, tuple(theirs))])
    assert_unlinked(group)
    for r, (outcomes, code) in enumerate(got):
        assert code == 0
        assert outcomes[0][:2] == ("err", "ValueError") and "capacity of 16384" in outcomes[0][2]
        assert outcomes[1][:2] == ("err", "TypeError") and "float64" in outcomes[1][2]
        err(outcomes[2], "CollNetError", "gather", "rank 0: int32[10], rank 1: int32[12]")
        err(outcomes[3], "CollNetError", "gather", "rank 0: int32[10], rank 1: float32[10]")
        want = make_input(0, 0, "int32", (10,), 4) + make_input(0, 1, "int32", (10,), 4)
        np.testing.assert_array_equal(ok(outcomes[4]), want, err_msg=f"rank {r}")
        err(outcomes[5], "CollNetError", "unlink", "only the process that created")


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="local_size"):
        LocalGroup(0, 64, CTX)
    with pytest.raises(ValueError, match="capacity"):
        LocalGroup(2, 0, CTX)
    with pytest.raises(ValueError, match="timeout"):
        LocalGroup(2, 64, CTX, timeout=0)
    with LocalGroup(2, 64, CTX) as group:
        with pytest.raises(ValueError, match=r"outside 0\.\.1"):
            CollNetAllreduce(group, 2)
        with pytest.raises(ValueError, match="only the head"):
            CollNetAllreduce(group, 1, inter=lambda x: x)
        with CollNetAllreduce(group, 0) as coll, pytest.raises(TypeError, match="numpy array"):
            coll.allreduce([1, 2, 3])  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="inheritance"):
            # Like every multiprocessing lock: only as an argument of a starting process.
            pickle.dumps(group)
    assert_unlinked(group)
    group.unlink()  # a second time: nothing to do


# ----------------------------------------------------------------- failures
@pytest.mark.slow
def test_a_dead_sibling_fails_the_others_within_the_timeout() -> None:
    timeout = 1.5
    ops = (("sum", "int32", (100,), 0), ("sum", "int32", (100,), 1), ("sum", "int32", (100,), 2))
    with LocalGroup(3, 400, CTX, timeout=timeout) as group:
        ranks = [Rank(group, 0, ops), Rank(group, 1, ops), Rank(group, 2, ops, die_after=1)]
        start = time.monotonic()
        got = run_ranks(ranks)
        elapsed = time.monotonic() - start
    assert_unlinked(group)
    (dead, dead_code), alive = got[2], got[:2]
    assert (dead, dead_code) == (None, 3)
    texts = []
    for outcomes, code in alive:
        assert code == 0
        ok(outcomes[0])  # before the death
        took = err(outcomes[1], "CollNetError", "gather")
        assert took < timeout + 5.0
        texts.append(outcomes[1][2])
        # The group stays broken: the next call fails at once.
        assert err(outcomes[2], "CollNetError", "gather", "unusable") < 0.5
    assert any("timed out after" in t for t in texts), texts
    assert elapsed < RUN_S / 2


def test_a_failing_head_fails_its_siblings_at_once() -> None:
    ops = (("sum", "float32", (64,), 0), ("sum", "float32", (64,), 1))
    with LocalGroup(3, 256, CTX, timeout=60) as group:
        ranks = [Rank(group, 0, ops, inter="boom"), Rank(group, 1, ops), Rank(group, 2, ops)]
        got = run_ranks(ranks)
    assert_unlinked(group)
    assert [code for _, code in got] == [0, 0, 0]
    assert all(ok(outcomes[0]).shape == (64,) for outcomes, _ in got)
    err(got[0][0][1], "CollNetError", "inter", "RuntimeError: boom")
    for outcomes, _ in got[1:]:
        # A sibling still waking from "reduce" when the head aborts sees that barrier
        # broken (threading.Barrier semantics); either way it fails with the head's reason.
        step = outcomes[1][3]
        assert step in ("reduce", "broadcast"), outcomes[1]
        took = err(outcomes[1], "CollNetError", step, "local rank 0 failed", "boom")
        assert took < 10.0  # not the 60 s timeout: the head broke the barrier


# ----------------------------------------------------------------- shared memory hygiene
COORDINATOR = textwrap.dedent(
    """
    import multiprocessing, sys
    from test_collnet import CTX, Rank, run_ranks
    from hostlib.collnet import LocalGroup

    if __name__ == "__main__":
        with LocalGroup(3, 4096, CTX) as group:
            got = run_ranks([Rank(group, r, (("sum", "float32", (1000,), 0),)) for r in range(3)])
            assert all(out[0][0] == "ok" and code == 0 for out, code in got), got
        print(group.name)
    """
)


@pytest.mark.slow
def test_a_run_leaves_no_segment_and_no_resource_tracker_complaint(tmp_path: Path) -> None:
    # A coordinator of its own, so its resource tracker (shared with its ranks) exits with
    # it, and whatever that tracker says at exit lands in the stderr captured here.
    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR)
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=RUN_S
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # no "leaked shared_memory", no KeyError
    name = proc.stdout.strip()
    assert name.startswith(SHM_PREFIX) and not (SHM / name).exists()


def test_a_process_with_its_own_tracker_does_not_take_the_segment_away() -> None:
    # A process outside the creator's multiprocessing family has a resource tracker of its
    # own, which would unlink the segment when the process exits: attaching unregisters.
    with LocalGroup(1, 64, CTX) as group:
        code = f"from hostlib.collnet import _attach; _attach({group.name!r}, None).close()"
        root = str(Path(__file__).resolve().parents[2])
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=RUN_S, cwd=root
        )
        assert (proc.returncode, proc.stderr) == (0, "")
        assert (SHM / group.name).exists()
        with CollNetAllreduce(group, 0) as coll:
            np.testing.assert_array_equal(coll.allreduce(np.arange(4, dtype=np.int32)), range(4))
    assert_unlinked(group)
