"""``hostlib.shmbarrier``: a barrier that processes with no common parent join by the
name of a shared-memory segment (what torchrun's local ranks need for CollNet)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from multiprocessing import shared_memory

import numpy as np
import pytest

from hostlib.shmbarrier import ShmBarrier, barrier_bytes

ROUNDS = 300


def _rank(name: str, size: int, rank: int, rounds: int, out: multiprocessing.Queue) -> None:
    # Attached by name only, as a torchrun rank would: no object from the parent.
    shm = shared_memory.SharedMemory(name)
    try:
        bar = ShmBarrier(shm.buf[: barrier_bytes(size)], size, rank)
        data = np.frombuffer(shm.buf, dtype=np.int64, offset=barrier_bytes(size), count=size)
        bad = 0
        for k in range(1, rounds + 1):
            data[rank] = k
            bar.wait(10.0)
            bad += int((data != k).sum())  # every rank wrote round k before passing
            bar.wait(10.0)  # nobody writes round k + 1 before all have read round k
        out.put((rank, bad))
        del bar, data
    finally:
        shm.close()


@pytest.mark.parametrize("size", [1, 2, 4])
def test_ranks_started_apart_pass_in_step(size: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    shm = shared_memory.SharedMemory(create=True, size=barrier_bytes(size) + 8 * size)
    try:
        shm.buf[:] = bytes(len(shm.buf))
        out: multiprocessing.Queue = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(shm.name, size, r, ROUNDS, out))
                 for r in range(size)]  # fmt: skip
        for p in procs:
            p.start()
        results = dict(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(10)
        assert results == dict.fromkeys(range(size), 0)
    finally:
        shm.close()
        shm.unlink()


def test_a_timeout_breaks_it_for_everyone() -> None:
    buf = memoryview(bytearray(barrier_bytes(2)))
    a, b = ShmBarrier(buf, 2, 0), ShmBarrier(buf, 2, 1)
    start = time.monotonic()
    with pytest.raises(threading.BrokenBarrierError):
        a.wait(0.05)  # b never comes
    assert 0.05 <= time.monotonic() - start < 1.0
    assert b.broken
    with pytest.raises(threading.BrokenBarrierError):
        b.wait(1.0)


def test_an_abort_wakes_a_waiter() -> None:
    buf = memoryview(bytearray(barrier_bytes(2)))
    a, b = ShmBarrier(buf, 2, 0), ShmBarrier(buf, 2, 1)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            a.wait(10.0)
        except threading.BrokenBarrierError as exc:
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    b.abort()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rank 2 outside"):
        ShmBarrier(memoryview(bytearray(64)), 2, 2)
    with pytest.raises(ValueError, match="hold no barrier"):
        ShmBarrier(memoryview(bytearray(8)), 2, 0)


def _collnet_rank(name: str, size: int, rank: int, out: multiprocessing.Queue) -> None:
    from hostlib.collnet import CollNetAllreduce, LocalGroup

    group = LocalGroup.join(name, size, 4 * 1000, rank, timeout=20.0)
    cn = CollNetAllreduce(group, rank)
    results = []
    for call in range(20):
        x = np.arange(1000, dtype=np.int32) * (rank + 1) + call
        results.append(int(cn.allreduce(x).astype(np.int64).sum()))
    cn.close()
    if rank == 0:
        group.unlink()
    else:
        group.close()
    out.put((rank, results))


@pytest.mark.parametrize("size", [2, 3])
def test_a_local_group_joined_by_name_sums_across_ranks_started_apart(size: int) -> None:
    import secrets

    ctx = multiprocessing.get_context("spawn")
    name = f"inalab-cn-test-{secrets.token_hex(4)}"
    out: multiprocessing.Queue = ctx.Queue()
    # Rank 0 last: the others wait for its segment to appear.
    procs = [ctx.Process(target=_collnet_rank, args=(name, size, r, out))
             for r in reversed(range(size))]  # fmt: skip
    for p in procs:
        p.start()
        time.sleep(0.2)
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    base = np.arange(1000, dtype=np.int64)
    want = [int(sum(base * (r + 1) + call for r in range(size)).sum()) for call in range(20)]
    assert results == dict.fromkeys(range(size), want)
