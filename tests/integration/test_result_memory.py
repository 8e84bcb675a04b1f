"""Where an allreduce's result goes: ``out=`` (a buffer kept across calls) and
``inplace`` (the input's own memory), for INA and the ring and tree, on both engines,
over real UDP sockets.

The native engines write results where they belong (no new array per call, no copy);
the Python engines copy their own array there. Either way the caller gets the same bytes
in the same memory, and a bad ``out`` is refused before any packet is sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import SwitchJob, expected, in_threads, peer_ranks, random_inputs, switch_thread

from emulation.softswitch.pipeline import Pipeline
from hostlib import RetryPolicy, RingAllreduce, TreeAllreduce
from hostlib.native import native_p2p_unavailable, native_unavailable

POLICY = RetryPolicy(deadline=10.0)
ENGINES = [
    pytest.param(
        "native",
        marks=pytest.mark.skipif(
            native_unavailable() is not None or native_p2p_unavailable() is not None,
            reason="native cores not built",
        ),
    ),
    "python",
]
SIZE = 64 * 30 + 7  # several packets and a short last one


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_ina_writes_into_out_and_in_place(engine: str, dtype: type) -> None:
    n, rng = 3, np.random.default_rng(11)
    calls = [random_inputs(rng, dtype, n, SIZE) for _ in range(3)]
    with switch_thread(Pipeline(64, slots=64)) as server:
        job = SwitchJob(server, 1, n, 8, POLICY)
        for s in job.sessions:
            s.engine = engine

        def body(rank: int) -> list[tuple[np.ndarray, bool]]:
            session, out, got = job.sessions[rank], np.full(SIZE, 7, dtype=dtype), []
            for x in calls:
                result = session.allreduce(x[rank], out=out)
                got.append((out.copy(), result is out))
            y = calls[0][rank].copy()
            result = session.allreduce(y, inplace=True)
            got.append((y, result is y))
            return got

        try:
            ranks = in_threads([lambda r=r: body(r) for r in range(n)])  # type: ignore[misc]
        finally:
            job.close()
    for got in ranks:
        for (result, same), x in zip(got, [*calls, calls[0]], strict=True):
            assert same, "the caller's buffer is what comes back"
            np.testing.assert_array_equal(result.view(np.uint32), expected(x, 64).view(np.uint32))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("make", [RingAllreduce, TreeAllreduce])
def test_ring_and_tree_write_into_out_and_in_place(engine: str, make: Any) -> None:
    n, rng = 4, np.random.default_rng(5)
    x = random_inputs(rng, np.int32, n, SIZE)
    want = x.astype(np.int64).sum(axis=0).astype(np.int32)

    def work(rank: int, session: Any) -> list[np.ndarray]:
        assert session.engine == engine
        out = np.zeros((SIZE,), dtype=np.int32)
        first = session.allreduce(x[rank], out=out)
        assert first is out
        kept = out.copy()
        assert session.allreduce(x[rank], out=out) is out
        y = x[rank].copy()
        assert session.allreduce(y, inplace=True) is y
        return [kept, out, y]

    results = peer_ranks(_on_engine(make, engine), n, work, POLICY, lanes=64, window=4)
    for got in results:
        for r in got:
            np.testing.assert_array_equal(r, want)


def _on_engine(make: Any, engine: str) -> Any:
    """``make`` on ``engine`` (a session's engine is chosen when it is made)."""

    class OnEngine(make):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, engine=engine, **kwargs)

    return OnEngine


@pytest.mark.parametrize(
    ("make_out", "error", "match"),
    [
        (lambda x: np.zeros(x.size, dtype=np.float32), TypeError, "out is float32"),
        (lambda x: np.zeros(x.size + 1, dtype=np.int32), ValueError, "elements"),
        (lambda x: np.zeros(2 * x.size, dtype=np.int32)[::2], ValueError, "contiguous"),
        (lambda x: _read_only(np.zeros(x.size, dtype=np.int32)), ValueError, "read-only"),
        (lambda x: x, ValueError, "overlaps"),
        (lambda x: [0] * x.size, TypeError, "numpy array or torch tensor"),
    ],
)
def test_a_bad_out_is_refused_before_any_packet(make_out: Any, error: type, match: str) -> None:
    with switch_thread(Pipeline(64, slots=64)) as server:
        job = SwitchJob(server, 1, 1, 4, POLICY)
        try:
            session, x = job.sessions[0], np.arange(100, dtype=np.int32)
            with pytest.raises(error, match=match):
                session.allreduce(x, out=make_out(x))
            with pytest.raises(ValueError, match="not both"):
                session.allreduce(x, inplace=True, out=np.zeros_like(x))
            # Nothing was sent: the session goes on with the next call.
            np.testing.assert_array_equal(session.allreduce(x), x)
        finally:
            job.close()


def test_a_torch_tensor_as_out() -> None:
    torch = pytest.importorskip("torch")
    with switch_thread(Pipeline(64, slots=64)) as server:
        job = SwitchJob(server, 1, 1, 4, POLICY)
        try:
            out = torch.zeros(10, 10, dtype=torch.int32)
            x = torch.arange(100, dtype=torch.int32).reshape(10, 10)
            assert job.sessions[0].allreduce(x, out=out) is out
            assert torch.equal(out, x)
        finally:
            job.close()


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
