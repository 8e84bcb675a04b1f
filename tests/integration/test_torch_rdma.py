"""The ``"ina"`` torch backend over RDMA (``INALAB_TRANSPORT=rdma``) on loopback: spawned
ranks, each an emulated RNIC on its own 127.0.5.x (``INALAB_BIND``), configured by the
environment as a cluster's ranks are; rank 0 installs the job and its RoCEv2 queue pairs
on ``inalab switch --roce``. int32 all_reduce results are exact and float32 within the
quantization's bound, through the switch; and the switch's program refusing RoCEv2
reaches every rank as one error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from helpers import tcp_init_method

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.torch_backend import InaProcessGroup, InaSetupError  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402
from hostlib.quantize import error_bound  # noqa: E402
from hostlib.transport.rdma import RdmaTransport  # noqa: E402

pytestmark = pytest.mark.slow

TIMEOUT = timedelta(seconds=60)
LANES, M, WORLD = 256, 2, 3
SIZES = (1000, 3 * LANES * M * 16 + 7)  # one message; many, past the window


def _env(sw: SoftSwitchProcess, rank: int, job: int) -> dict[str, str]:
    host, port = sw.data_addr
    return {
        "INALAB_TRANSPORT": "rdma",
        "INALAB_MSG_PACKETS": str(M),
        "INALAB_SWITCH": f"{host}:{port}",
        "INALAB_P4RUNTIME": sw.p4runtime_address,
        "INALAB_DEVICE_ID": str(sw.device_id),
        "INALAB_JOB": str(job),
        "INALAB_BIND": f"127.0.5.{10 + rank}",
        "INALAB_COLLNET": "0",  # every rank a worker of the switch, one RNIC each
        "INALAB_DEADLINE": "20",
    }


def _inputs(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(2000 + rank)
    if dtype == "int32":
        return rng.integers(-(2**24), 2**24, count).astype(np.int32)
    return (rng.standard_normal(count) * np.exp2(rng.integers(-8, 8, count))).astype(np.float32)


def _rank(rank: int, world: int, init: str, envs: list[dict[str, str]]) -> None:
    os.environ.update(envs[rank])
    dist.init_process_group("ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        pg = dist.group.WORLD
        assert isinstance(pg, InaProcessGroup)
        assert isinstance(pg.session.transport, RdmaTransport)
        assert pg.session.spec.lanes == M * LANES
        for count in SIZES:
            xs = [_inputs(r, count, "int32") for r in range(world)]
            x = torch.from_numpy(xs[rank].copy())
            seq = pg.session.next_seq
            dist.all_reduce(x)
            assert pg.session.next_seq > seq, "int32 SUM did not go through the switch"
            total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
            np.testing.assert_array_equal(x.numpy(), total)
        fs = np.stack([_inputs(r, SIZES[1], "float32").astype(np.float64) for r in range(world)])
        y = torch.from_numpy(fs[rank].astype(np.float32))
        dist.all_reduce(y)
        ref, absmax = fs.sum(axis=0), np.abs(fs).max(axis=0)
        err = np.abs(y.numpy().astype(np.float64) - ref)
        assert np.all(err <= error_bound(absmax, world, M * LANES, ref)), err.max()
    finally:
        dist.destroy_process_group()


@pytest.fixture
def roce_switch(tmp_path: Path) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path, lanes=LANES, slots=1024, extra_args=("--roce",)) as sw:
        yield sw


def test_all_reduce_over_rdma_is_exact(roce_switch: SoftSwitchProcess) -> None:
    envs = [_env(roce_switch, r, 31) for r in range(WORLD)]
    mp.spawn(_rank, args=(WORLD, tcp_init_method(), envs), nprocs=WORLD)
    with roce_switch.controller() as ctl:
        counters = ctl.counters()
        assert ctl.roce is not None and ctl.roce.read_requests() == []  # removed at shutdown
    assert counters["completed"] > 0 and counters["drop_bad_icrc"] == 0
    assert counters["drop_unknown_qp"] == counters["drop_bad_psn"] == 0


def _refused_rank(rank: int, world: int, init: str, envs: list[dict[str, str]]) -> None:
    os.environ.update(envs[rank])
    with pytest.raises(InaSetupError, match=r"over RDMA: .*lanes 100: over RDMA a packet is"):
        dist.init_process_group("ina", init_method=init, rank=rank, world_size=world,
                                timeout=TIMEOUT)  # fmt: skip


def test_lanes_that_are_no_path_mtu_fail_every_rank(tmp_path: Path) -> None:
    with SoftSwitchProcess(tmp_path, lanes=100, slots=1024, extra_args=("--roce",)) as sw:
        envs = [_env(sw, r, 32) for r in range(2)]
        mp.spawn(_refused_rank, args=(2, tcp_init_method(), envs), nprocs=2)
