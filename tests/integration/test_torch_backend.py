"""The "ina" torch.distributed backend and the DDP hook, over a real soft switch.

Ranks are spawned processes (torch.multiprocessing); their allreduce goes over UDP to
an ``inalab switch`` process, the job installed by rank 0 over P4Runtime. A worker
raises on a wrong result, which fails the spawn and the test.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import tcp_init_method

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.ddp import InaHookState, ina_allreduce_hook  # noqa: E402
from dynamiccl.torch_backend import (  # noqa: E402
    DEFAULT_CC_TARGET,
    DEFAULT_DEADLINE,
    Aggregator,
    InaOptions,
    InaProcessGroup,
    InaSetupError,
    gloo_interface,
)
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


def _inputs(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count).astype(np.int32)
    return (rng.standard_normal(count) * np.exp2(rng.integers(-8, 8, count))).astype(np.float32)


def _expected(world: int, count: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    xs = np.stack([_inputs(r, count, dtype).astype(np.float64) for r in range(world)])
    return xs.sum(axis=0), np.abs(xs).max(axis=0)


def _spawn(fn: Any, world: int, *args: Any) -> None:
    mp.spawn(fn, args=(world, tcp_init_method(), *args), nprocs=world)


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


def _striped_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    from hostlib.session import StripedInaSession

    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup) and isinstance(pg.session, StripedInaSession)
    lanes = pg.session.spec.lanes
    for count in (1, 3 * lanes + 5, 40_000):
        x = torch.from_numpy(_inputs(rank, count, "int32"))
        dist.all_reduce(x)
        ref, _ = _expected(world, count, "int32")
        np.testing.assert_array_equal(x.numpy(), ref.astype(np.int32))
        x = torch.from_numpy(_inputs(rank, count, "float32"))
        dist.all_reduce(x)
        ref, absmax = _expected(world, count, "float32")
        err = np.abs(x.numpy().astype(np.float64) - ref)
        assert np.all(err <= error_bound(absmax, world, lanes, ref)), err.max()
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


@pytest.mark.slow
def test_a_job_striped_across_two_aggregators(switch: SoftSwitchProcess, tmp_path: Path) -> None:
    with SoftSwitchProcess(tmp_path / "second") as second:
        stripe = Aggregator(second.data_addr, second.p4runtime_address)
        options = _options(switch, 60, stripes=(stripe,))
        _spawn(_striped_rank, 3, options)
        for sw in (switch, second):  # rank 0 removed the job from both at shutdown
            with sw.controller() as ctl:
                assert 60 not in [j.job_id for j in ctl.installed_jobs()]
                assert ctl.counters()["aggregated"] > 0


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


def test_the_no_progress_deadline_is_seconds_not_the_groups_30_minutes() -> None:
    env = {"INALAB_SWITCH": "10.0.0.1:9999", "INALAB_P4RUNTIME": "10.0.0.1:50051",
           "INALAB_JOB": "3"}  # fmt: skip
    default = InaOptions.from_env(env)
    assert default.deadline is None
    assert default.no_progress_deadline(dist.default_pg_timeout) == DEFAULT_DEADLINE == 10.0
    assert default.no_progress_deadline(timedelta(seconds=4)) == 4.0  # a shorter group's
    longer = InaOptions.from_env(env | {"INALAB_DEADLINE": "120"})
    assert longer.no_progress_deadline(dist.default_pg_timeout) == 120.0
    with pytest.raises(InaSetupError, match=r"bad INALAB.*deadline"):
        InaOptions.from_env(env | {"INALAB_DEADLINE": "0"})
    with pytest.raises(InaSetupError, match="bad INALAB"):
        InaOptions.from_env(env | {"INALAB_DEADLINE": "soon"})


def test_the_congestion_target_is_milliseconds_or_off() -> None:
    """#41: INALAB_CC_TARGET, as ``inalab bench --cc-target``; the sessions' policy."""
    env = {"INALAB_SWITCH": "10.0.0.1:9999", "INALAB_P4RUNTIME": "10.0.0.1:50051",
           "INALAB_JOB": "3"}  # fmt: skip
    timeout = dist.default_pg_timeout
    default = InaOptions.from_env(env)
    assert default.cc_target is None
    assert InaOptions.from_env(env | {"INALAB_CC_TARGET": ""}).cc_target is None
    policy = default.retry_policy(timeout)
    assert (policy.cc_target, policy.deadline) == (DEFAULT_CC_TARGET, DEFAULT_DEADLINE)
    assert math.isinf(DEFAULT_CC_TARGET)  # hostlib's: off
    wide = InaOptions.from_env(env | {"INALAB_CC_TARGET": "20", "INALAB_DEADLINE": "120"})
    assert wide.cc_target == 0.02
    policy = wide.retry_policy(timeout)
    assert (policy.cc_target, policy.deadline) == (0.02, 120.0)
    assert InaOptions.from_env(env | {"INALAB_CC_TARGET": "0.5"}).cc_target == 0.0005
    for off in ("off", " OFF "):
        options = InaOptions.from_env(env | {"INALAB_CC_TARGET": off})
        assert options.cc_target == math.inf
        assert options.retry_policy(timeout).cc_target == math.inf
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(InaSetupError) as info:
            InaOptions.from_env(env | {"INALAB_CC_TARGET": bad})
        assert str(info.value) == (
            f"bad INALAB_* setting: INALAB_CC_TARGET={bad!r}: give milliseconds above 0, or off"
        )
    with pytest.raises(ValueError, match="congestion target"):
        InaOptions(switch=("10.0.0.1", 9999), p4runtime="10.0.0.1:50051", job_id=3, cc_target=0)


def test_gloo_binds_the_interface_toward_the_master() -> None:
    """Issue #38: not the address the hostname resolves to (loopback on Debian)."""
    assert gloo_interface({"MASTER_ADDR": "127.0.0.1"}) == "lo"
    assert gloo_interface({"MASTER_ADDR": "localhost"}) == "lo"
    assert gloo_interface({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "eth9"}) is None
    assert gloo_interface({}) is None  # no env:// rendezvous: torch's own choice
    with pytest.raises(InaSetupError, match=r"MASTER_ADDR .no\.such\.host\.invalid."):
        gloo_interface({"MASTER_ADDR": "no.such.host.invalid"})


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
            "10.0.0.6",
            47000,
            ("10.255.255.2", 20033),
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
    with pytest.raises(InaSetupError, match="2 aggregators in INALAB_SWITCH need INALAB_P4RUN"):
        InaOptions.from_env(env | {"INALAB_SWITCH": "10.0.0.1:1,10.0.0.2:1"})
    with pytest.raises(ValueError, match="installed already runs on one aggregator"):
        InaOptions(("10.0.0.1", 1), None, 1, lanes=64, stripes=(Aggregator(("b", 1), "b:2"),))


def test_options_of_a_job_striped_across_aggregators_from_the_environment() -> None:
    env = {
        "INALAB_SWITCH": "10.0.0.1:20033, 10.0.1.1:20033",
        "INALAB_P4RUNTIME": "10.0.0.1:9559,10.0.1.1:9559",
        "INALAB_JOB": "3",
    }
    opts = InaOptions.from_env(env)
    assert opts.aggregators == [
        (("10.0.0.1", 20033), "10.0.0.1:9559"),
        (("10.0.1.1", 20033), "10.0.1.1:9559"),
    ]
    with pytest.raises(InaSetupError, match=r"names 2 aggregator.*INALAB_P4RUNTIME 1"):
        InaOptions.from_env(env | {"INALAB_P4RUNTIME": "10.0.0.1:9559"})


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
    with pytest.raises(InaSetupError, match="expected ina, dynamiccl or agent"):
        InaOptions.from_env(env | {"INALAB_CHOOSER": "nccl"})
    with pytest.raises(InaSetupError, match="bad INALAB"):
        InaOptions.from_env(dyn | {"INALAB_PROFILE": str(tmp_path / "missing.json")})


# ----------------------------------------------------------------- reduce-scatter, all-gather
class ActionChooser:
    """A chooser of :class:`~dynamiccl.actions.Action` per collective and size (picklable).

    allreduce: ring/l64/w1 up to 1 KiB, tree/l256/w8 up to 16 KiB, ina/w4 above;
    reduce_scatter: ina/w2 up to 4 KiB, ring/l2048/w32 above; all_gather: ring/l256/w8,
    but collnet (which this backend runs on the ring, warning once) up to 64 bytes.
    """

    def choose(self, size_bytes: int) -> Any:
        return self.choose_call("allreduce", size_bytes)

    def choose_call(self, collective: str, size_bytes: int) -> Any:
        from dynamiccl.actions import Action

        if collective == "allreduce":
            if size_bytes <= 1024:
                return Action("ring", 64, 1)
            return Action("tree", 256, 8) if size_bytes <= 16384 else Action("ina", 64, 4)
        if collective == "reduce_scatter":
            return Action("ina", 64, 2) if size_bytes <= 4096 else Action("ring", 2048, 32)
        return Action("collnet", 64, 4) if size_bytes <= 64 else Action("ring", 256, 8)


def _p2p_messages(algorithm: str, world: int, rank: int, size: int, lanes: int) -> int:
    """Data packets one rank sends in one ring or tree allreduce of ``size`` elements."""
    if algorithm == "ring":
        seg = [(g + 1) * size // world - g * size // world for g in range(world)]
        return sum(-(-seg[(rank - s) % world] // lanes) for s in range(2 * (world - 1)))
    links = (rank > 0) + sum(c < world for c in (2 * rank + 1, 2 * rank + 2))
    return links * -(-size // lanes)


def _ring_bound(world: int, count: int, dtype: str) -> np.ndarray:
    """``gamma_(n-1) * sum|x|`` per element, and the float64 reference's own error."""
    xs = np.stack([_inputs(r, count, dtype).astype(np.float64) for r in range(world)])
    wide, u = np.abs(xs).sum(axis=0), 2.0**-24
    return (world - 1) * u / (1 - (world - 1) * u) * wide + world * 2.0**-52 * wide


def _check_part(got: Any, world: int, rank: int, k: int, dtype: str, how: str, lanes: int) -> None:
    """Rank ``rank``'s part of the sum of every rank's ``world * k`` inputs."""
    ref, absmax = _expected(world, world * k, dtype)
    part = slice(rank * k, (rank + 1) * k)
    values = got.numpy().reshape(-1)
    assert values.dtype == np.dtype(dtype) and values.size == k
    if dtype == "int32":
        np.testing.assert_array_equal(values, ref[part].astype(np.int32))
        return
    if how == "ina":
        bound = error_bound(absmax, world, lanes, ref)[part]
    else:
        bound = _ring_bound(world, world * k, dtype)[part]
    assert np.all(np.abs(values.astype(np.float64) - ref[part]) <= bound)


def _gathered(world: int, k: int, dtype: str) -> np.ndarray:
    return np.concatenate([_inputs(r, k, dtype) for r in range(world)])


def _rs_ag_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup)
    lanes = pg.session.spec.lanes
    for k, dtype in [(1, "int32"), (7, "float32"), (333, "int32"), (1001, "float32")]:
        x = torch.from_numpy(_inputs(rank, world * k, dtype)).reshape(world, k)  # stack form
        out = torch.empty(k, dtype=x.dtype)
        seq = pg.session.next_seq
        dist.reduce_scatter_tensor(out, x)
        assert pg.session.next_seq > seq, "the default chooser's ina did not run"
        _check_part(out, world, rank, k, dtype, "ina", lanes)
        np.testing.assert_array_equal(x.numpy().reshape(-1), _inputs(rank, world * k, dtype))

        call = pg.peers.endpoint.call
        gathered = torch.empty(world * k, dtype=x.dtype)
        dist.all_gather_into_tensor(gathered, torch.from_numpy(_inputs(rank, k, dtype)))
        assert pg.peers.endpoint.call == call + 1, "all_gather did not run on the ring"
        np.testing.assert_array_equal(gathered.numpy(), _gathered(world, k, dtype))

    # A non-contiguous output and input, and Gloo for what hostlib does not carry.
    def rows(r: int) -> Any:
        return torch.from_numpy(_inputs(r, 2 * world * 5, "int32")).reshape(2 * world, 5)[::2]

    out = torch.zeros(5, 2, dtype=torch.int32)[:, 0]
    dist.reduce_scatter_tensor(out, rows(rank))
    assert torch.equal(out, sum(rows(r)[rank] for r in range(world)))
    seq, call = pg.session.next_seq, pg.peers.endpoint.call
    f64 = torch.full((world * 3,), float(rank + 1), dtype=torch.float64)
    o64 = torch.empty(3, dtype=torch.float64)
    dist.reduce_scatter_tensor(o64, f64)
    assert torch.all(o64 == world * (world + 1) / 2)
    g64 = torch.empty(world * 2, dtype=torch.float64)
    dist.all_gather_into_tensor(g64, torch.full((2,), float(rank), dtype=torch.float64))
    assert g64.tolist() == [float(r) for r in range(world) for _ in range(2)]
    m = torch.full((world * 2,), rank, dtype=torch.int32)
    o = torch.empty(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(o, m, op=dist.ReduceOp.MAX)
    assert o.tolist() == [world - 1] * 2
    assert (pg.session.next_seq, pg.peers.endpoint.call) == (seq, call)
    dist.destroy_process_group()


def _actions_rank(rank: int, world: int, init: str, options: InaOptions) -> None:
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("dynamiccl.torch_backend").addHandler(handler)
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup)
    ep, session = pg.peers.endpoint, pg.session

    # allreduce: ring/l64/w1, tree/l256/w8, ina/w4 (slots 0..3 only).
    for count, algorithm, knobs in [(201, "ring", (64, 1)), (3001, "tree", (256, 8))]:
        x = torch.from_numpy(_inputs(rank, count, "int32"))
        sent, seq = ep.stats.sent - ep.stats.retransmitted, session.next_seq
        dist.all_reduce(x)
        ref, _ = _expected(world, count, "int32")
        np.testing.assert_array_equal(x.numpy(), ref.astype(np.int32))
        assert (ep.lanes, ep.window) == knobs and session.next_seq == seq
        lanes = knobs[0]
        want = _p2p_messages(algorithm, world, rank, count, lanes)
        assert ep.stats.sent - ep.stats.retransmitted - sent == want, algorithm
    x = torch.from_numpy(_inputs(rank, 8001, "float32"))
    uses, call = session.uses.copy(), ep.call
    dist.all_reduce(x)
    ref, absmax = _expected(world, 8001, "float32")
    err = np.abs(x.numpy().astype(np.float64) - ref)
    assert np.all(err <= error_bound(absmax, world, session.spec.lanes, ref))
    assert np.flatnonzero(session.uses - uses).tolist() == [0, 1, 2, 3] and ep.call == call

    # reduce_scatter: ina/w2 for 4 KiB, ring/l2048/w32 above.
    for k, how in [(1024 // world, "ina"), (3001, "ring")]:
        uses, call = session.uses.copy(), ep.call
        x = torch.from_numpy(_inputs(rank, world * k, "float32"))
        out = torch.empty(k, dtype=torch.float32)
        dist.reduce_scatter_tensor(out, x)
        _check_part(out, world, rank, k, "float32", how, session.spec.lanes)
        if how == "ina":
            assert np.flatnonzero(session.uses - uses).tolist() == [0, 1] and ep.call == call
        else:
            assert (ep.lanes, ep.window, ep.call) == (2048, 32, call + 1)

    # all_gather: collnet falls back to the ring (one warning), ring/l256/w8.
    for k in (3, 3, 1001):
        gathered = torch.empty(world * k, dtype=torch.int32)
        dist.all_gather_into_tensor(gathered, torch.from_numpy(_inputs(rank, k, "int32")))
        np.testing.assert_array_equal(gathered.numpy(), _gathered(world, k, "int32"))
        assert (ep.lanes, ep.window) == ((64, 4) if 4 * world * k <= 64 else (256, 8))
    warned = [r.getMessage() for r in records if r.levelname == "WARNING"]
    collnet = [m for m in warned if "collnet" in m]
    assert len(collnet) == (1 if 4 * world * 3 <= 64 else 0), warned
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "world", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(4, marks=pytest.mark.slow)]
)
def test_reduce_scatter_and_all_gather_tensors(switch: SoftSwitchProcess, world: int) -> None:
    _spawn(_rs_ag_rank, world, _options(switch, 60 + world, slots=16))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_a_chooser_of_actions_sets_algorithm_lanes_and_window(
    switch: SoftSwitchProcess, world: int
) -> None:
    _spawn(_actions_rank, world, _options(switch, 70 + world, slots=16, chooser=ActionChooser()))


def test_what_an_action_resolves_to() -> None:
    from dynamiccl.actions import Action, ActionError
    from dynamiccl.torch_backend import resolve_action

    warned: list[tuple[str, str]] = []

    def resolve(choice: Any, collective: str, slots: int = 16) -> Any:
        return resolve_action(choice, collective, switch_lanes=64, slots=slots, lanes=128,
                              window=8, warn=lambda k, m: warned.append((k, m)))  # fmt: skip

    # Names: "ina" through the switch with every slot; others to Gloo (allreduce) or ring.
    assert resolve("ina", "allreduce") == Action("ina", 64, 16)
    assert resolve("ina", "reduce_scatter") == Action("ina", 64, 16)
    assert resolve("ina", "all_gather") == Action("ring", 128, 8)
    assert resolve("ring", "allreduce") is None and resolve("gloo", "allreduce") is None
    assert resolve("tree", "reduce_scatter") == Action("ring", 128, 8)
    assert not warned
    # Actions: as chosen, an INA window within the slots and the switch's lanes.
    assert resolve(Action("tree", 2048, 32), "allreduce") == Action("tree", 2048, 32)
    assert resolve(Action("ina", 256, 4), "allreduce") == Action("ina", 64, 4)
    assert resolve(Action("ina", 64, 64), "reduce_scatter") == Action("ina", 64, 16)
    assert not warned
    # What cannot run here: the ring with the action's lanes and window, and a warning.
    assert resolve(Action("collnet", 64, 4), "allreduce") == Action("ring", 64, 4)
    assert resolve(Action("ina", 64, 4), "all_gather") == Action("ring", 64, 4)
    assert resolve(Action("tree", 256, 8), "reduce_scatter") == Action("ring", 256, 8)
    assert resolve(Action("ina", 64, 4), "allreduce", slots=0) == Action("ring", 64, 4)
    assert resolve("ina", "allreduce", slots=0) == Action("ring", 128, 8)
    assert [k for k, _ in warned] == [
        "collnet/allreduce", "ina/all_gather", "tree/reduce_scatter", "ina/allreduce",
        "ina/allreduce",
    ]  # fmt: skip
    # Where machines have several ranks: CollNet as chosen, the switch's lanes and a
    # window within its slots.
    collnet = resolve_action(Action("collnet", 256, 64), "allreduce", switch_lanes=64,
                             slots=16, lanes=128, window=8, collnet=True)  # fmt: skip
    assert collnet == Action("collnet", 64, 16)
    with pytest.raises(ActionError, match="broadcast"):
        resolve("ina", "broadcast")
    with pytest.raises(ActionError, match="not an algorithm name"):
        resolve(3, "allreduce")
