"""Every collective of the "ina" torch.distributed backend, against Gloo, and never a hang.

Four spawned ranks run the same random sequence of collectives (one seed, the same on
every rank) on the "ina" group and on a "gloo" group of the same processes, some with
``async_op=True`` left in flight while later calls are issued, and compare the results
exactly: float32 data is integer-valued, which the switch's block quantization carries
without error. The sequence once deadlocked within a few dozen calls (issue #20: a
collective reaching Gloo with the GIL held while a Gloo thread held its queue lock and
waited for the GIL); a watchdog in every rank now turns such a hang into a failure that
shows each rank's Python stacks and the step it reached, instead of a silent timeout.

Beside it: every collective of ``ProcessGroup`` is a Python method of the ina group (so
torch's trampoline never falls back to Gloo with the GIL held), and AVG, the reduce ops
left to Gloo and the coalescing manager behave as on Gloo.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import tcp_init_method

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.torch_backend import GLOO_COLLECTIVES, InaOptions, InaProcessGroup  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402

WORLD = 4
TIMEOUT = timedelta(seconds=60)
STALL = 30.0
"""Seconds a rank may go without finishing a step before its watchdog dumps its stacks
and ends it (a correct step takes milliseconds; Gloo's own timeout is TIMEOUT)."""

ASYNC_OPS = (
    "all_gather", "all_gather_into_tensor", "broadcast", "barrier", "all_reduce_sum",
    "all_reduce_avg", "all_reduce_max", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "gather", "scatter", "reduce", "send_recv", "coalesced",
)  # fmt: skip
SYNC_OPS = ("monitored_barrier",)
OPS = ASYNC_OPS + SYNC_OPS


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path_factory.mktemp("collectives-switch")) as sw:
        yield sw


# ----------------------------------------------------------------- one call
class Call:
    """One collective's inputs for one step, built the same way for both groups."""

    def __init__(
        self,
        seed: int,
        step: int,
        rank: int,
        rng: np.random.Generator,
        op: str | None = None,
        may_async: bool = True,
    ) -> None:
        self.rank = rank
        self.op = str(rng.choice(OPS)) if op is None else op
        self.dtype = [torch.float32, torch.int32, torch.float64][int(rng.integers(3))]
        self.k = int(rng.integers(1, 300))
        self.root = int(rng.integers(WORLD))
        self.async_op = may_async and self.op in ASYNC_OPS and bool(rng.random() < 0.3)
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 97 + rank)

    def data(self, count: int, dtype: Any = None) -> Any:
        """Integer values (exact in float32 through the switch), fresh for each call."""
        values = torch.randint(-1000, 1000, (count,), generator=self.gen)
        return values.to(self.dtype if dtype is None else dtype)


def _issue(call: Call, group: Any) -> tuple[Any, list[Any]]:
    """Issue ``call`` on ``group``: its Work (``None`` when it ran synchronously) and the
    tensors that hold its result once the Work is done."""
    gen_state = call.gen.get_state()
    try:
        return _OPS[call.op](call, group)
    finally:
        call.gen.set_state(gen_state)  # the other group gets the same inputs


def _all_gather(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = [torch.empty(c.k, dtype=c.dtype) for _ in range(WORLD)]
    return dist.all_gather(out, c.data(c.k), group=g, async_op=c.async_op), out


def _all_gather_into_tensor(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = torch.empty(WORLD * c.k, dtype=c.dtype)
    work = dist.all_gather_single(out, c.data(c.k), group=g, async_op=c.async_op)
    return work, [out]


def _broadcast(c: Call, g: Any) -> tuple[Any, list[Any]]:
    x = c.data(c.k)
    return dist.broadcast(x, src=c.root, group=g, async_op=c.async_op), [x]


def _barrier(c: Call, g: Any) -> tuple[Any, list[Any]]:
    return dist.barrier(group=g, async_op=c.async_op), []


def _all_reduce(op: Any, float_only: bool = False) -> Callable[[Call, Any], tuple[Any, list[Any]]]:
    def run(c: Call, g: Any) -> tuple[Any, list[Any]]:
        x = c.data(c.k, torch.float32 if float_only and c.dtype == torch.int32 else None)
        return dist.all_reduce(x, op=op, group=g, async_op=c.async_op), [x]

    return run


def _reduce_scatter_tensor(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = torch.empty(c.k, dtype=c.dtype)
    # AVG where it has a meaning (Gloo refuses it for integers: tested elsewhere).
    op = dist.ReduceOp.AVG if c.root % 2 and c.dtype != torch.int32 else dist.ReduceOp.SUM
    work = dist.reduce_scatter_single(out, c.data(WORLD * c.k), op=op, group=g,
                                      async_op=c.async_op)  # fmt: skip
    return work, [out]


def _all_to_all(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = [torch.empty(c.k, dtype=c.dtype) for _ in range(WORLD)]
    ins = [c.data(c.k) for _ in range(WORLD)]
    return dist.all_to_all(out, ins, group=g, async_op=c.async_op), out


def _all_to_all_single(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = torch.empty(WORLD * c.k, dtype=c.dtype)
    work = dist.all_to_all_single(out, c.data(WORLD * c.k), group=g, async_op=c.async_op)
    return work, [out]


def _gather(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = [torch.empty(c.k, dtype=c.dtype) for _ in range(WORLD)] if c.rank == c.root else None
    work = dist.gather(c.data(c.k), out, dst=c.root, group=g, async_op=c.async_op)
    return work, out or []


def _scatter(c: Call, g: Any) -> tuple[Any, list[Any]]:
    out = torch.empty(c.k, dtype=c.dtype)
    ins = [c.data(c.k) for _ in range(WORLD)] if c.rank == c.root else None
    return dist.scatter(out, ins, src=c.root, group=g, async_op=c.async_op), [out]


def _reduce(c: Call, g: Any) -> tuple[Any, list[Any]]:
    x = c.data(c.k)
    work = dist.reduce(x, dst=c.root, group=g, async_op=c.async_op)
    return work, [x] if c.rank == c.root else []


def _send_recv(c: Call, g: Any) -> tuple[Any, list[Any]]:
    # A ring exchange; the works of one rank are combined into one by waiting on both.
    x, y = c.data(c.k), torch.empty(c.k, dtype=c.dtype)
    works = [dist.isend(x, dst=(c.rank + 1) % WORLD, group=g),
             dist.irecv(y, src=(c.rank - 1) % WORLD, group=g)]  # fmt: skip
    return _Both(works), [y]


def _coalesced(c: Call, g: Any) -> tuple[Any, list[Any]]:
    # What torch's coalescing manager batches: allreduces (the *_coalesced calls).
    xs = [c.data(c.k), c.data(c.k + 1)]
    with dist._coalescing_manager(group=g, async_ops=c.async_op) as cm:
        for x in xs:
            dist.all_reduce(x, group=g)
    return (cm if c.async_op else None), xs


def _monitored_barrier(c: Call, g: Any) -> tuple[Any, list[Any]]:
    # dist.monitored_barrier refuses any backend not named "gloo"; the group's own works.
    g.monitored_barrier(TIMEOUT, wait_all_ranks=True)
    return None, []


class _Both:
    """Two works waited as one."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


_OPS: dict[str, Callable[[Call, Any], tuple[Any, list[Any]]]] = {
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "broadcast": _broadcast,
    "barrier": _barrier,
    "all_reduce_sum": _all_reduce(dist.ReduceOp.SUM),
    "all_reduce_avg": _all_reduce(dist.ReduceOp.AVG, float_only=True),
    "all_reduce_max": _all_reduce(dist.ReduceOp.MAX),
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "gather": _gather,
    "scatter": _scatter,
    "reduce": _reduce,
    "send_recv": _send_recv,
    "coalesced": _coalesced,
    "monitored_barrier": _monitored_barrier,
}


# ----------------------------------------------------------------- spawned ranks
def _mixed_rank(
    rank: int, world: int, init: str, options: InaOptions, seed: int, burst: int,
    calls: int, out_dir: str, progress: Any,
) -> None:  # fmt: skip
    stacks = (Path(out_dir) / f"rank{rank}.stacks").open("w")
    # A rank the parent ends (another rank failed first) shows its stacks too.
    faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)
    faulthandler.dump_traceback_later(STALL * 2, exit=True, file=stacks)  # the setup
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    ina = dist.group.WORLD
    assert isinstance(ina, InaProcessGroup)
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    first_seq, first_call = ina.session.next_seq, ina.peers.endpoint.call
    rng = np.random.default_rng(seed)
    # First each collective `burst` times in a row, synchronously (a tight loop of
    # list all-gathers hung within 50 calls before issue #20 was fixed), then `calls`
    # random ones in bursts of 1 to 12 back to back on the ina group (async ones stay in
    # flight while the next are issued), the same on the gloo group, then the results;
    # half those bursts repeat one collective, as FSDP's all-gathers of its units do.
    plan = [[(op, False)] * burst for op in OPS]
    while (done := sum(map(len, plan)) - burst * len(OPS)) < calls:
        repeat = str(rng.choice(OPS)) if rng.random() < 0.5 else None
        plan.append([(repeat, True)] * min(int(rng.integers(1, 13)), calls - done))
    step = 0
    for bursts in plan:
        faulthandler.dump_traceback_later(STALL, exit=True, file=stacks)
        batch = [Call(seed, step + i, rank, rng, op, a) for i, (op, a) in enumerate(bursts)]
        issued = [_issue(call, ina) for call in batch]
        reference = [_issue(call, gloo) for call in batch]
        for i in rng.permutation(len(batch)):
            _finish(step + int(i), batch[i].op, issued[i], reference[i])
        step += len(batch)
        progress[rank] = step
    faulthandler.dump_traceback_later(STALL, exit=True, file=stacks)
    # The switch and hostlib's ring carried their share, not Gloo alone.
    assert ina.session.next_seq > first_seq and ina.peers.endpoint.call > first_call
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


def _finish(step: int, op: str, issued: tuple[Any, list[Any]],
            reference: tuple[Any, list[Any]]) -> None:  # fmt: skip
    (work, got), (ref_work, want) = issued, reference
    for w in (work, ref_work):
        if w is not None:
            w.wait()
    assert len(got) == len(want), (step, op)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if not torch.equal(a, b):
            raise AssertionError(f"step {step} {op} tensor {i}: ina {a[:8]} gloo {b[:8]}")


def _run_mixed(switch: SoftSwitchProcess, tmp_path: Path, job_id: int, seed: int,
               burst: int, calls: int) -> None:  # fmt: skip
    options = InaOptions(
        switch=switch.data_addr,
        p4runtime=switch.p4runtime_address,
        job_id=job_id,
        device_id=switch.device_id,
        slots=16,
    )
    progress = mp.get_context("spawn").Array("i", WORLD)
    args = (WORLD, tcp_init_method(), options, seed, burst, calls, str(tmp_path), progress)
    steps = burst * len(OPS) + calls
    try:
        mp.spawn(_mixed_rank, args=args, nprocs=WORLD)
    except mp.ProcessExitedException as exc:  # a watchdog fired (or a rank crashed)
        dumps = "\n".join(
            f"----- rank {r} (finished {progress[r]} of {steps} steps)\n"
            + (tmp_path / f"rank{r}.stacks").read_text()
            for r in range(WORLD)
        )
        pytest.fail(f"{exc}\n{dumps}", pytrace=False)


# ----------------------------------------------------------------- tests
def test_mixed_collectives_equal_gloo_and_never_hang(
    switch: SoftSwitchProcess, tmp_path: Path
) -> None:
    _run_mixed(switch, tmp_path, job_id=80, seed=1, burst=30, calls=100)


@pytest.mark.slow
def test_two_thousand_mixed_collectives_equal_gloo_and_never_hang(
    switch: SoftSwitchProcess, tmp_path: Path
) -> None:
    _run_mixed(switch, tmp_path, job_id=81, seed=2, burst=25, calls=1600)


# ----------------------------------------------------------------- what each method runs
NOT_COLLECTIVES = {
    "BackendType", "CUSTOM", "GLOO", "MPI", "NCCL", "UCC", "UNDEFINED", "XCCL",
    "_backend_id", "_device_types", "_enable_collectives_timing", "_get_backend",
    "_get_backend_name", "_get_sequence_number_for_group", "_has_hooks", "_id",
    "_pybind11_conduit_v1_", "_register_backend", "_register_on_completion_hook",
    "_set_default_backend", "_set_group_desc", "_set_group_name",
    "_set_sequence_number_for_group", "_wait_for_pending_works", "abort", "bound_device_id",
    "boxed", "get_group_store", "group_desc", "group_name", "merge_remote_group", "name",
    "rank", "set_timeout", "shutdown", "size", "split_group", "unbox",
    "use_pg_for_symm_mem_rendezvous",
}  # fmt: skip
"""What torch 2.13's ProcessGroup has besides collectives: a name not here nor a method
of the ina group is a collective a newer torch added, which would reach Gloo through
the C++ base class, with the GIL held."""


def test_every_collective_of_process_group_is_a_method_of_the_ina_group() -> None:
    names = {n for n in dir(dist.ProcessGroup) if not n.startswith("__")} - NOT_COLLECTIVES
    # The trampoline's names for the coalescing manager's calls, besides the bindings'.
    names |= {"start_coalescing", "end_coalescing"}
    assert sorted(names - set(vars(InaProcessGroup))) == []
    assert sorted(set(GLOO_COLLECTIVES) - set(dir(dist.ProcessGroupGloo))) == []


def _ops_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("dynamiccl.torch_backend")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    ina = dist.group.WORLD
    assert isinstance(ina, InaProcessGroup)
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    session = ina.session

    # AVG through the switch: its SUM, divided here by the group's size.
    seq = session.next_seq
    x = torch.full((100,), 2.0 * (rank + 1))
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    assert session.next_seq > seq
    seq = session.next_seq
    out = torch.empty(3)
    dist.reduce_scatter_single(out, torch.full((3 * world,), 4.0 * rank), op=dist.ReduceOp.AVG)
    assert session.next_seq > seq
    assert torch.all(x == world + 1) and torch.all(out == 2.0 * (world - 1))
    # Integers: Gloo sums and then fails to divide them in place; so does the ina group.
    for group in (ina, gloo):
        i = torch.full((5,), rank + 1, dtype=torch.int32)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Int"):
            dist.all_reduce(i, op=dist.ReduceOp.AVG, group=group)
        assert torch.all(i == world * (world + 1) // 2), group
        o = torch.empty(2, dtype=torch.int32)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Int"):
            dist.reduce_scatter_single(o, torch.ones(2 * world, dtype=torch.int32),
                                       op=dist.ReduceOp.AVG, group=group)  # fmt: skip

    # MAX, MIN, PRODUCT: Gloo's, one log line for each op in this process.
    seq = session.next_seq
    ops = [dist.ReduceOp.MAX, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
    for op, want in zip(ops, [world, world, 1, math.factorial(world)], strict=True):
        m = torch.tensor([rank + 1.0])
        dist.all_reduce(m, op=op)
        assert m.item() == want, op
    o = torch.empty(1)
    dist.reduce_scatter_single(o, torch.full((world,), rank + 1.0), op=dist.ReduceOp.MAX)
    assert o.item() == world and session.next_seq == seq
    noted = [r.getMessage() for r in records if "runs on Gloo" in r.getMessage()]
    assert [m.split()[2] for m in noted] == ["MAX", "MIN", "PRODUCT"], noted

    # The coalescing manager: batched allreduces (through the switch), and with a
    # device, calls that run as issued and are waited for at its end.
    seq = session.next_seq
    a, b = torch.full((7,), rank + 1.0), torch.full((9,), rank + 1, dtype=torch.int32)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    assert session.next_seq > seq
    total = world * (world + 1) // 2
    assert torch.all(a == total) and torch.all(b == total)
    c, bc = torch.full((4,), float(rank)), torch.full((3,), float(rank))
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(c)
        dist.broadcast(bc, src=world - 1)
    cm.wait()
    assert torch.all(c == world * (world - 1) // 2) and torch.all(bc == world - 1)
    gathered, part = torch.empty(2 * world), torch.empty(2)
    with dist._coalescing_manager():
        dist.all_gather_single(gathered, torch.full((2,), float(rank)))
    with dist._coalescing_manager():
        dist.reduce_scatter_single(part, torch.full((2 * world,), 1.0))
    assert gathered.tolist() == [float(r) for r in range(world) for _ in range(2)]
    assert part.tolist() == [float(world)] * 2

    # recv from any source, and the monitored barrier (by the group's own method:
    # dist.monitored_barrier refuses every backend not named "gloo").
    if rank == 0:
        got = torch.empty(2)
        assert dist.recv(got) == world - 1 and torch.all(got == 5.0)
    elif rank == world - 1:
        dist.send(torch.full((2,), 5.0), dst=0)
    ina.monitored_barrier(TIMEOUT, wait_all_ranks=True)
    dist.destroy_process_group()


def test_avg_the_ops_left_to_gloo_and_the_coalescing_manager(switch: SoftSwitchProcess) -> None:
    options = InaOptions(
        switch=switch.data_addr,
        p4runtime=switch.p4runtime_address,
        job_id=82,
        device_id=switch.device_id,
    )
    mp.spawn(_ops_rank, args=(3, tcp_init_method(), options), nprocs=3)
