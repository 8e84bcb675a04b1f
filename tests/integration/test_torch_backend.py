"""The "ina" torch.distributed backend and the DDP hook, over a real soft switch.

Ranks are spawned processes (torch.multiprocessing); their allreduce goes over UDP to
an ``inalab switch`` process, the job installed by rank 0 over P4Runtime. A worker
raises on a wrong result, which fails the spawn and the test.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.ddp import InaHookState, ina_allreduce_hook  # noqa: E402
from dynamiccl.torch_backend import InaOptions, InaProcessGroup, InaSetupError  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402
from hostlib.quantize import error_bound  # noqa: E402

TIMEOUT = timedelta(seconds=60)


class SmallOnly:
    """A chooser: INA up to 4 KiB, Gloo above (picklable, for spawned ranks)."""

    def choose(self, size_bytes: int) -> str:
        return "ina" if size_bytes <= 4096 else "gloo"


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path_factory.mktemp("torch-switch")) as sw:
        yield sw


def _options(sw: SoftSwitchProcess, job_id: int, **kw: Any) -> InaOptions:
    return InaOptions(
        switch=sw.data_addr,
        p4runtime=sw.p4runtime_address,
        job_id=job_id,
        device_id=sw.device_id,
        **kw,
    )


def _init_method() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _inputs(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count).astype(np.int32)
    return (rng.standard_normal(count) * np.exp2(rng.integers(-8, 8, count))).astype(np.float32)


def _expected(world: int, count: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    xs = np.stack([_inputs(r, count, dtype).astype(np.float64) for r in range(world)])
    return xs.sum(axis=0), np.abs(xs).max(axis=0)


def _spawn(fn: Any, world: int, *args: Any) -> None:
    mp.spawn(fn, args=(world, _init_method(), *args), nprocs=world)


# ----------------------------------------------------------------- spawned ranks
def _collectives_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup) and dist.get_backend() == "ina"
    lanes = pg.session.spec.lanes

    x = torch.from_numpy(_inputs(rank, 1000, "int32"))
    dist.all_reduce(x)
    ref, _ = _expected(world, 1000, "int32")
    np.testing.assert_array_equal(x.numpy(), ref.astype(np.int32))

    x = torch.from_numpy(_inputs(rank, 1000, "float32")).reshape(10, 100)
    seq = pg.session.next_seq
    dist.all_reduce(x)
    assert pg.session.next_seq > seq, "float32 SUM did not go through the switch"
    ref, absmax = _expected(world, 1000, "float32")
    err = np.abs(x.numpy().reshape(-1).astype(np.float64) - ref)
    assert np.all(err <= error_bound(absmax, world, lanes, ref)), err.max()

    # Delegated to Gloo: the chooser's large sizes, other dtypes, other ops.
    big = torch.full((4096,), float(rank + 1))
    seq = pg.session.next_seq
    dist.all_reduce(big)
    assert pg.session.next_seq == seq and torch.all(big == world * (world + 1) / 2)
    f64 = torch.full((5,), 0.5 * rank, dtype=torch.float64)
    dist.all_reduce(f64)
    assert torch.allclose(f64, torch.full((5,), 0.25 * world * (world - 1), dtype=torch.float64))
    m = torch.tensor([rank], dtype=torch.int32)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert m.item() == world - 1
    assert pg.session.next_seq == seq

    b = torch.arange(4.0) if rank == world - 1 else torch.zeros(4)
    dist.broadcast(b, src=world - 1)
    assert torch.equal(b, torch.arange(4.0))
    dist.barrier()
    out = [torch.zeros(2, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(out, torch.full((2,), rank, dtype=torch.int32))
    assert [int(t[0]) for t in out] == list(range(world))
    dist.destroy_process_group()


def _tiny_model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))


def _grads(model: Any, rank: int) -> list[Any]:
    from torch.nn.parallel import DistributedDataParallel

    ddp = model if isinstance(model, DistributedDataParallel) else None
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 20, generator=gen), torch.randn(16, 5, generator=gen)
    assert ddp is not None
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    return [p.grad.detach().clone() for p in ddp.module.parameters()]


def _local_grads(rank: int) -> list[Any]:
    model = _tiny_model()
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 20, generator=gen), torch.randn(16, 5, generator=gen)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _hook_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    reference = _grads(DistributedDataParallel(_tiny_model()), rank)
    state = InaHookState.connect(options)
    hooked = DistributedDataParallel(_tiny_model())
    hooked.register_comm_hook(state, ina_allreduce_hook)
    got = _grads(hooked, rank)
    assert state.ina_buckets > 0 and state.fallback_buckets == 0

    # The bound of the INA sum (float64 sums of every rank's local gradients), / world.
    every = [_local_grads(r) for r in range(world)]
    for i, (g, ref) in enumerate(zip(got, reference, strict=True)):
        parts = np.stack([e[i].numpy().reshape(-1).astype(np.float64) for e in every])
        total = parts.sum(axis=0)
        # Block exponents follow the bucket's layout, unknown here: bound every block
        # by the largest input of the whole bucket (a block's max can only be lower).
        absmax = np.full_like(
            total, max(float(np.abs(e[j]).max()) for e in every for j in range(len(e)))
        )
        bound = error_bound(absmax, world, state.session.spec.lanes, total) / world
        err = np.abs(g.numpy().reshape(-1).astype(np.float64) - ref.numpy().reshape(-1))
        gloo_slack = 1e-6 * np.abs(total / world) + 1e-9
        assert np.all(err <= bound + gloo_slack), (i, err.max(), bound.max())
    state.close()
    dist.destroy_process_group()


def _setup_error_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        InaHookState.connect(options)
    except InaSetupError as exc:
        assert "JobExistsError" in str(exc), exc
    else:
        raise AssertionError("a taken job id was accepted")
    dist.destroy_process_group()


def _installed_rank(rank: int, world: int, init: str, env: list[dict[str, str]]) -> None:
    # What a launcher gives each rank: its own address, port and switch rank, no P4Runtime.
    os.environ.update(env[rank])
    dist.init_process_group("ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup) and pg.options.installed
    spec = pg.session.spec
    assert (spec.rank, spec.num_workers) == (world - 1 - rank, world)
    x = torch.from_numpy(_inputs(rank, 700, "int32"))
    dist.all_reduce(x)
    ref, _ = _expected(world, 700, "int32")
    np.testing.assert_array_equal(x.numpy(), ref.astype(np.int32))
    x = torch.from_numpy(_inputs(rank, 700, "float32"))
    dist.all_reduce(x)
    ref, absmax = _expected(world, 700, "float32")
    err = np.abs(x.numpy().astype(np.float64) - ref)
    assert np.all(err <= error_bound(absmax, world, spec.lanes, ref)), err.max()
    dist.destroy_process_group()


def _cuda_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    x = torch.full((300,), rank + 1, dtype=torch.int32, device="cuda")
    dist.all_reduce(x)
    assert torch.all(x.cpu() == world * (world + 1) // 2)
    dist.destroy_process_group()


# ----------------------------------------------------------------- tests
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_allreduce_through_the_switch_and_the_rest_through_gloo(
    switch: SoftSwitchProcess, world: int
) -> None:
    job_id = 10 + world
    _spawn(_collectives_rank, world, _options(switch, job_id, chooser=SmallOnly()))
    with switch.controller() as ctl:
        # destroy_process_group removed the job (rank 0, after every rank closed).
        assert job_id not in [j.job_id for j in ctl.installed_jobs()]


@pytest.mark.slow
def test_ddp_hook_gives_the_default_allreduce_gradients(switch: SoftSwitchProcess) -> None:
    _spawn(_hook_rank, 4, _options(switch, 20))
    with switch.controller() as ctl:
        assert 20 not in [j.job_id for j in ctl.installed_jobs()]


@pytest.mark.slow
def test_a_refused_job_fails_on_every_rank(switch: SoftSwitchProcess) -> None:
    from controller.switch import WorkerAddress

    with switch.controller() as ctl:  # closed again: rank 0 must become the primary
        ctl.add_job(30, [WorkerAddress("127.0.0.1", 9)], 4)
    try:
        _spawn(_setup_error_rank, 2, _options(switch, 30))
    finally:
        with switch.controller() as ctl:
            ctl.remove_job(30)


def _free_udp_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.slow
def test_a_job_installed_already_by_a_launcher(switch: SoftSwitchProcess) -> None:
    # The launcher installs job 50 for fixed ports, switch rank r = group rank world-1-r
    # (as a leaf numbers its hosts apart from the global ranks); the ranks install and
    # remove nothing, and their packets must carry the switch's ranks to be aggregated.
    from controller.switch import WorkerAddress

    world, job_id = 3, 50
    ports = _free_udp_ports(world)
    with switch.controller() as ctl:
        workers = [WorkerAddress("127.0.0.1", ports[world - 1 - r]) for r in range(world)]
        ctl.add_job(job_id, workers, 16)
        lanes = ctl.lanes
    host, port = switch.data_addr
    env = [
        {
            "INALAB_SWITCH": f"{host}:{port}",
            "INALAB_JOB": str(job_id),
            "INALAB_BIND": "127.0.0.1",
            "INALAB_PORT": str(ports[rank]),
            "INALAB_SWITCH_RANK": str(world - 1 - rank),
            "INALAB_WORKERS": str(world),
            "INALAB_LANES": str(lanes),
            "INALAB_SLOTS": "16",
        }
        for rank in range(world)
    ]
    try:
        _spawn(_installed_rank, world, env)
        with switch.controller() as ctl:  # the launcher's to remove
            assert job_id in [j.job_id for j in ctl.installed_jobs()]
            assert ctl.counters()["drop_bad_source"] == 0
    finally:
        with switch.controller() as ctl:
            ctl.remove_job(job_id)


@pytest.mark.gpu
def test_cuda_tensors_are_staged_through_host_memory(switch: SoftSwitchProcess) -> None:
    _spawn(_cuda_rank, 2, _options(switch, 40))


def test_options_from_the_environment() -> None:
    env = {
        "INALAB_SWITCH": "10.0.0.1:9999",
        "INALAB_P4RUNTIME": "10.0.0.1:50051",
        "INALAB_JOB": "3",
    }
    opts = InaOptions.from_env(env | {"INALAB_SLOTS": "64", "INALAB_BIND": "10.0.0.2"})
    assert (opts.switch, opts.p4runtime, opts.job_id) == (("10.0.0.1", 9999), "10.0.0.1:50051", 3)
    assert (opts.slots, opts.bind_ip, opts.device_id) == (64, "10.0.0.2", 0)
    with pytest.raises(InaSetupError, match="INALAB_JOB"):
        InaOptions.from_env({k: v for k, v in env.items() if k != "INALAB_JOB"})
    with pytest.raises(InaSetupError, match="bad INALAB"):
        InaOptions.from_env(env | {"INALAB_SWITCH": "10.0.0.1"})
    with pytest.raises(InaSetupError, match="bad INALAB"):
        InaOptions.from_env(env | {"INALAB_JOB": "70000"})


def test_options_of_a_job_installed_already_from_the_environment() -> None:
    env = {
        "INALAB_SWITCH": "10.255.255.2:20033",
        "INALAB_JOB": "1",
        "INALAB_BIND": "10.0.0.6",
        "INALAB_PORT": "47000",
        "INALAB_SWITCH_RANK": "1",
        "INALAB_WORKERS": "8",
        "INALAB_LANES": "64",
    }
    for p4runtime in ({}, {"INALAB_P4RUNTIME": ""}):  # absent or empty: installed already
        opts = InaOptions.from_env(env | p4runtime)
        assert opts.installed and opts.p4runtime is None
        assert (opts.bind_ip, opts.bind_port, opts.switch) == (
            "10.0.0.6", 47000, ("10.255.255.2", 20033)
        )
        assert (opts.switch_rank, opts.num_workers, opts.lanes) == (1, 8, 64)
    with pytest.raises(InaSetupError, match=r"INALAB_P4RUNTIME .* or INALAB_LANES"):
        InaOptions.from_env({k: v for k, v in env.items() if k != "INALAB_LANES"})
    with pytest.raises(InaSetupError, match="bad INALAB"):
        InaOptions.from_env(env | {"INALAB_PORT": "70000"})
    with pytest.raises(ValueError, match="needs lanes"):
        InaOptions(switch=("10.0.0.1", 1), p4runtime=None, job_id=1)
    # Rank 0 installs when INALAB_P4RUNTIME is set; INALAB_PORT applies there too.
    opts = InaOptions.from_env(env | {"INALAB_P4RUNTIME": "127.0.0.1:9559"})
    assert not opts.installed and opts.bind_port == 47000


def test_the_dynamiccl_chooser_from_the_environment(tmp_path: Path) -> None:
    from helpers import save_latency_vs_bandwidth_profile

    from dynamiccl.policy import Policy
    from dynamiccl.torch_backend import AlwaysIna

    env = {
        "INALAB_SWITCH": "10.0.0.1:9999",
        "INALAB_P4RUNTIME": "10.0.0.1:50051",
        "INALAB_JOB": "3",
    }
    assert isinstance(InaOptions.from_env(env).chooser, AlwaysIna)
    path = save_latency_vs_bandwidth_profile(tmp_path / "profile.json")
    dyn = env | {"INALAB_CHOOSER": "dynamiccl", "INALAB_PROFILE": str(path), "WORLD_SIZE": "4"}
    chooser = InaOptions.from_env(dyn).chooser
    assert isinstance(chooser, Policy) and chooser.workers == 4
    assert chooser.choose(64) == "ina" and chooser.choose(1 << 30) == "ring"
    with pytest.raises(InaSetupError, match="WORLD_SIZE"):
        InaOptions.from_env({k: v for k, v in dyn.items() if k != "WORLD_SIZE"})
    with pytest.raises(InaSetupError, match="ina or dynamiccl"):
        InaOptions.from_env(env | {"INALAB_CHOOSER": "nccl"})
    with pytest.raises(InaSetupError, match="bad INALAB"):
        InaOptions.from_env(dyn | {"INALAB_PROFILE": str(tmp_path / "missing.json")})
