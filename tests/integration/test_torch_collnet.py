"""The "ina" torch backend on machines of several ranks: CollNet (issue #22, item 3).

Four spawned ranks on loopback say they sit on two machines of two (``InaOptions.host``,
as ``INALAB_HOST`` does): each machine's first rank alone is a worker of the switch's
job, the other adds into it through shared memory joined by a name agreed in the store.
``tests/integration/test_one_armed.py`` runs the same under torchrun on namespaces that
stand in for machines. A worker raises on a wrong result, which fails the spawn.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from helpers import tcp_init_method

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.ddp import InaHookState  # noqa: E402
from dynamiccl.torch_backend import (  # noqa: E402
    HostLayout,
    InaOptions,
    InaProcessGroup,
    InaSetupError,
)
from emulation.bench.workers import count_wrong  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402
from hostlib.collnet import SHM_PREFIX  # noqa: E402

TIMEOUT = timedelta(seconds=60)
WORLD = 4


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path_factory.mktemp("collnet-switch")) as sw:
        yield sw


def _inputs(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(2000 + rank)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count).astype(np.int32)
    return (rng.standard_normal(count) * np.exp2(rng.integers(-8, 8, count))).astype(np.float32)


def _reference(count: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    xs = np.stack([_inputs(r, count, dtype).astype(np.float64) for r in range(WORLD)])
    return xs.sum(axis=0), np.abs(xs).max(axis=0)


def _check(rank: int, y: np.ndarray, count: int, dtype: str, lanes: int) -> None:
    ref, absmax = _reference(count, dtype)
    wrong, err = count_wrong("collnet", y, ref, absmax, WORLD, lanes, hosts=2, max_local=2)
    assert wrong == 0, f"rank {rank}: {wrong} of {count} {dtype} wrong (max error {err})"


def _collnet_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    options = dataclasses.replace(options, host=f"machine{rank // 2}")
    dist.init_process_group("ina", init_method=init, rank=rank, world_size=world,
                            timeout=TIMEOUT, pg_options=options)  # fmt: skip
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup)
    member = pg.collnet
    assert member is not None and member.layout == HostLayout(((0, 1), (2, 3)))
    assert (member.host, member.local_rank) == (rank // 2, rank % 2)
    lanes = member.lanes
    # The heads alone are the switch's workers, numbered by machine.
    if rank % 2 == 0:
        assert pg.session is not None and pg.session.spec.num_workers == 2
        assert pg.session.spec.rank == rank // 2
        seq = pg.session.next_seq
    else:
        assert pg.session is None
    # The shared segment, named in the store, is mapped by both ranks of a machine.
    assert member.group.name.startswith(SHM_PREFIX)
    for dtype, count in (("int32", 3000), ("float32", 3000), ("int32", 1)):
        t = torch.from_numpy(_inputs(rank, count, dtype).copy())
        dist.all_reduce(t)
        assert pg.last_action is not None and pg.last_action.algorithm == "collnet"
        _check(rank, t.numpy(), count, dtype, lanes)
    if rank % 2 == 0:
        assert pg.session is not None and pg.session.next_seq > seq, "no packet to the switch"
    # Larger than the segment's piece (16 KiB here): in pieces, still exact.
    big = torch.from_numpy(_inputs(rank, 10_000, "int32").copy())
    dist.all_reduce(big)
    _check(rank, big.numpy(), 10_000, "int32", lanes)
    # AVG: the CollNet sum over the group's size.
    avg = torch.from_numpy(_inputs(rank, 500, "float32").copy())
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    _check(rank, avg.numpy() * WORLD, 500, "float32", lanes)
    # reduce_scatter_tensor: CollNet's sum, each rank keeping its part.
    k = 777
    inp = torch.from_numpy(_inputs(rank, WORLD * k, "int32").copy())
    out = torch.empty(k, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, inp)
    ref, _ = _reference(WORLD * k, "int32")
    assert np.array_equal(out.numpy(), ref[rank * k : (rank + 1) * k].astype(np.int32))
    # all_gather_into_tensor: hostlib's ring between all four ranks.
    full = torch.empty(WORLD * 5, dtype=torch.int32)
    dist.all_gather_into_tensor(full, torch.full((5,), rank, dtype=torch.int32))
    assert full.tolist() == [r for r in range(WORLD) for _ in range(5)]
    # What the switch cannot do still runs on Gloo.
    m = torch.tensor([float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert m.item() == WORLD - 1
    # The DDP hook needs a session per rank: refused with the way out.
    with pytest.raises(InaSetupError, match="CollNet"):
        InaHookState.from_process_group(pg)
    name = member.group.name
    dist.destroy_process_group()
    if rank % 2 == 0:  # the head unlinked its machine's segment
        assert not os.path.exists(f"/dev/shm/{name}")


def _every_rank_a_worker(rank: int, world: int, init: str, options: InaOptions) -> None:
    options = dataclasses.replace(options, host=f"machine{rank // 2}", collnet=False)
    dist.init_process_group("ina", init_method=init, rank=rank, world_size=world,
                            timeout=TIMEOUT, pg_options=options)  # fmt: skip
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup) and pg.collnet is None
    assert pg.session is not None and pg.session.spec.num_workers == world
    t = torch.from_numpy(_inputs(rank, 100, "int32").copy())
    dist.all_reduce(t)
    _check(rank, t.numpy(), 100, "int32", pg.session.spec.lanes)
    dist.destroy_process_group()


def _options(sw: SoftSwitchProcess, job_id: int, **kw: Any) -> InaOptions:
    return InaOptions(switch=sw.data_addr, p4runtime=sw.p4runtime_address, job_id=job_id,
                      device_id=sw.device_id, **kw)  # fmt: skip


def test_two_machines_of_two_ranks_run_collnet_through_the_switch(
    switch: SoftSwitchProcess,
) -> None:
    options = _options(switch, 301, collnet_bytes=16384)
    mp.spawn(_collnet_rank, args=(WORLD, tcp_init_method(), options), nprocs=WORLD)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"{SHM_PREFIX}job301-")]


def test_collnet_off_keeps_every_rank_a_worker_of_the_switch(switch: SoftSwitchProcess) -> None:
    mp.spawn(_every_rank_a_worker, args=(WORLD, tcp_init_method(), _options(switch, 302)),
             nprocs=WORLD)  # fmt: skip


def test_the_layout_of_ranks_on_machines() -> None:
    layout = HostLayout.from_keys(["a", "a", "b", "a", "b"])
    assert layout.hosts == ((0, 1, 3), (2, 4)) and layout.collnet
    assert layout.place(3) == (0, 2) and layout.place(4) == (1, 1)
    assert str(layout) == "2 machines of 3/2 ranks"
    # One machine, or one rank per machine: every rank stays a worker of the switch.
    assert not HostLayout.from_keys(["a", "a"]).collnet
    assert not HostLayout.from_keys(["a", "b", "c"]).collnet
    with pytest.raises(ValueError, match="no machine"):
        layout.place(5)


def test_collnet_options_from_the_environment() -> None:
    base = {"INALAB_SWITCH": "127.0.0.1:9", "INALAB_JOB": "1", "INALAB_P4RUNTIME": "127.0.0.1:1"}
    options = InaOptions.from_env(base)
    assert options.collnet and options.host is None and options.collnet_bytes == 16 * 2**20
    env = {"INALAB_HOST": "rack1-n3", "INALAB_COLLNET": "0", "INALAB_COLLNET_BYTES": "1048576"}
    options = InaOptions.from_env({**base, **env})
    assert (options.host, options.collnet, options.collnet_bytes) == ("rack1-n3", False, 2**20)
    with pytest.raises(InaSetupError, match="INALAB_COLLNET='yes': give 0 or 1"):
        InaOptions.from_env({**base, "INALAB_COLLNET": "yes"})
