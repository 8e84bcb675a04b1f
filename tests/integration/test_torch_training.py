"""FSDP1, FSDP2 (``fully_shard``) and DDP train through the switch as they do on Gloo.

Issue #20, item 3. Four spawned ranks train the same small MLP (layers of 17, 7 and 3
outputs: FSDP1's flat parameters need padding to 4 shards, FSDP2's rows split 5/5/5/2,
2/2/2/1 and 1/1/1/0) for a few SGD steps, once on a Gloo group and once on the "ina"
group, from the same seed and the same batches, in the same processes. Then:

- the parameters of the two runs differ by no more than the float32 bound: the INA
  quantization's (``hostlib.quantize.error_bound``) and Gloo's own rounding of each
  step's gradient, float32 evaluation and update rounding, propagated through the later
  steps by ``I - lr * H`` (the loss's Hessian along the trajectory, computed here in
  float64); the bound is far below how far training moved the parameters;
- the gradients went through the switch: the chooser (a real one, INA wherever the
  backend can use it, which records what it is asked) saw every gradient byte once per
  step as a reduce-scatter (FSDP) or an allreduce (DDP), the ranks sent exactly the INA
  packets those calls need, and the switch's counters aggregated that many from every
  rank (FSDP2 reduce-scatters with ``ReduceOp.AVG``: the switch's SUM, scaled here);
- the parameter all-gathers went where the backend sends them: FSDP2's
  ``all_gather_into_tensor`` through hostlib's ring (one ring call per all-gather the
  chooser was asked about); FSDP1 on the CPU gathers with the list form of
  ``all_gather``, which the ina group leaves to Gloo (so the ring saw none).
"""

from __future__ import annotations

import itertools
import json
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

from dynamiccl.torch_backend import InaOptions, InaProcessGroup  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402
from hostlib.quantize import error_bound  # noqa: E402

WORLD = 4
STEPS = 6
LR = 0.05
BATCH = 8
WIDTHS = (11, 17, 7, 3)
"""The MLP's layer widths: input, two hidden, output."""
TIMEOUT = timedelta(seconds=60)
U = 2.0**-24
"""float32's unit roundoff."""
WRAPPERS = ("fsdp1", "fsdp2", "ddp")


class RecordingChooser:
    """INA wherever the backend can use it (the default's choices: allreduce and
    reduce-scatter through the switch, all-gather on hostlib's ring), recording every
    ``(collective, size_bytes)`` it is asked; picklable, for spawned ranks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def choose(self, size_bytes: int) -> str:
        return self.choose_call("allreduce", size_bytes)

    def choose_call(self, collective: str, size_bytes: int) -> str:
        self.calls.append((collective, size_bytes))
        return "ina"


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path_factory.mktemp("training-switch")) as sw:
        yield sw


def _model(dtype: Any = None) -> Any:
    torch.manual_seed(0)
    layers: list[Any] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(WIDTHS)):
        layers += [torch.nn.Linear(n_in, n_out)] + ([torch.nn.Tanh()] if i < 2 else [])
    model = torch.nn.Sequential(*layers)
    return model if dtype is None else model.to(dtype)


def _batch(rank: int, step: int, dtype: Any = None) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, WIDTHS[0], generator=gen)
    y = torch.randn(BATCH, WIDTHS[-1], generator=gen)
    return (x, y) if dtype is None else (x.to(dtype), y.to(dtype))


def _linears(model: Any) -> list[Any]:
    return [m for m in model if isinstance(m, torch.nn.Linear)]


# ----------------------------------------------------------------- spawned ranks
def _wrap(kind: str, group: Any) -> Any:
    model = _model()
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, process_group=group)
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        policy = ModuleWrapPolicy({torch.nn.Linear})  # a unit, and a reduce-scatter, per layer
        return FullyShardedDataParallel(
            model, process_group=group, device_id=torch.device("cpu"), auto_wrap_policy=policy
        )
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in _linears(model):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _full_state(kind: str, wrapped: Any) -> dict[str, Any]:
    """The whole parameters by name, on every rank."""
    if kind == "ddp":
        return {k: v.detach().clone() for k, v in wrapped.module.state_dict().items()}
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

        with FullyShardedDataParallel.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT):
            return {k: v.detach().clone() for k, v in wrapped.state_dict().items()}
    return {k: v.full_tensor().detach().clone() for k, v in wrapped.state_dict().items()}


def _train(kind: str, group: Any, rank: int) -> Any:
    wrapped = _wrap(kind, group)
    opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()
    return wrapped


def _train_rank(rank: int, world: int, init: str, options: InaOptions, kind: str, out: str) -> None:
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT, pg_options=options
    )
    ina = dist.group.WORLD
    assert isinstance(ina, InaProcessGroup)
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    reference = _full_state(kind, _train(kind, gloo, rank))

    chooser = ina.options.chooser
    assert isinstance(chooser, RecordingChooser)
    chooser.calls.clear()
    seq, ring_calls = ina.session.next_seq, ina.peers.endpoint.call
    wrapped = _train(kind, ina, rank)
    # What training alone ran on hostlib (the full state below gathers once more).
    calls = list(chooser.calls)
    packets, ring_calls = ina.session.next_seq - seq, ina.peers.endpoint.call - ring_calls
    got = _full_state(kind, wrapped)
    dist.destroy_process_group()

    spec = ina.session.spec
    report = {"calls": calls, "packets": packets, "ring_calls": ring_calls,
              "lanes": spec.lanes, "slots": spec.slots}  # fmt: skip
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    if rank == 0:
        torch.save({"gloo": reference, "ina": got}, Path(out, "params.pt"))


# ----------------------------------------------------------------- the float32 bound
def _trajectory_bound(lanes: int) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """The bound on ``max |params_ina - params_gloo|`` after ``STEPS`` steps, and the
    initial and final parameters of the float64 run (the same training, exact enough).

    Each step adds a per-element difference of at most ``lr * (ina + gloo + eval) +
    update`` to the two runs' parameters: ``ina``, the switch's quantization of a sum of
    ``WORLD`` gradients of at most ``G`` (the largest of any rank's at that step), over
    ``WORLD`` (the bound is the same for any power-of-two pre- and post-division, as
    FSDP1's); ``gloo``, Gloo's float32 sum and division, ``WORLD * u * G``; ``eval``,
    float32 evaluation of a gradient at two nearby points, ``2 * n * u * G`` with ``n``
    the longest chain of additions behind one element (a dot product per layer and the
    batch's sum); ``update``, the rounding of ``p - lr * g`` in both runs. The
    difference carried from earlier steps is multiplied by ``||I - lr * H||_inf`` (``H``
    the mean loss's Hessian at that step).
    """
    model = _model(torch.float64)
    names = [name for name, _ in model.named_parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    first = dict(zip(names, params, strict=True))
    sizes = [p.numel() for p in params]
    chain = sum(WIDTHS) + BATCH

    def unflat(flat: Any) -> dict[str, Any]:
        views = [v.reshape(p.shape) for v, p in zip(flat.split(sizes), params, strict=True)]
        return dict(zip(names, views, strict=True))

    def local_loss(flat: Any, x: Any, y: Any) -> Any:
        out = torch.func.functional_call(model, unflat(flat), (x,))
        return torch.nn.functional.mse_loss(out, y)

    flat, bound = torch.cat([p.reshape(-1) for p in params]), 0.0
    for step in range(STEPS):
        batches = [_batch(r, step, torch.float64) for r in range(WORLD)]
        grads = torch.stack([torch.func.grad(local_loss)(flat, x, y) for x, y in batches])
        total = grads.sum(dim=0).numpy()
        most = float(grads.abs().max())
        ina = error_bound(np.full(total.size, most), WORLD, lanes, total).max() / WORLD
        per_element = LR * (ina + WORLD * U * most + 2 * chain * U * most)
        per_element += 2 * U * (float(flat.abs().max()) + LR * most)
        xs, ys = (torch.cat(b) for b in zip(*batches, strict=True))  # equal batches: mean
        hessian = torch.func.jacrev(torch.func.grad(local_loss))(flat, xs, ys)  # no forward AD
        step_matrix = torch.eye(flat.numel(), dtype=flat.dtype) - LR * hessian
        bound = float(step_matrix.abs().sum(dim=1).max()) * bound + per_element
        flat = flat - LR * grads.mean(dim=0)  # the step of the mean gradient, as every run's
    return bound, first, unflat(flat)


def _flat(state: dict[str, Any], names: list[str]) -> Any:
    return torch.cat([state[n].reshape(-1).to(torch.float64) for n in names])


# ----------------------------------------------------------------- the test
def _gradient_bytes(kind: str) -> int:
    """The bytes one step's gradient communication carries: FSDP1 pads each layer's flat
    parameter to a multiple of the world, FSDP2 each parameter's rows; DDP none."""
    total = 0
    for n_in, n_out in itertools.pairwise(WIDTHS):
        if kind == "fsdp1":
            total += -(-(n_out * n_in + n_out) // WORLD) * WORLD
        elif kind == "fsdp2":
            total += -(-n_out // WORLD) * WORLD * (n_in + 1)
        else:
            total += n_out * n_in + n_out
    return 4 * total


def _float32_packets(size_bytes: int, lanes: int, slots: int) -> int:
    """The INA packets of one float32 call: a packet per block of ``lanes``, and the
    exponents of the first window's blocks a window ahead (``hostlib.ina``)."""
    blocks = -(-size_bytes // (4 * lanes))
    return blocks + min(slots, blocks)


@pytest.mark.parametrize(
    # FSDP2 in the quick run: its AVG on the switch and its all-gathers on the ring.
    "kind", [pytest.param("fsdp1", marks=pytest.mark.slow), "fsdp2",
             pytest.param("ddp", marks=pytest.mark.slow)],
)  # fmt: skip
def test_training_through_the_switch_matches_gloo(
    switch: SoftSwitchProcess, tmp_path: Path, kind: str
) -> None:
    options = InaOptions(
        switch=switch.data_addr,
        p4runtime=switch.p4runtime_address,
        job_id=90 + WRAPPERS.index(kind),
        device_id=switch.device_id,
        chooser=RecordingChooser(),
    )
    with switch.controller() as ctl:
        before = ctl.counters()
    args = (WORLD, tcp_init_method(), options, kind, str(tmp_path))
    mp.spawn(_train_rank, args=args, nprocs=WORLD)
    with switch.controller() as ctl:
        after = ctl.counters()
        assert options.job_id not in [j.job_id for j in ctl.installed_jobs()]

    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    lanes = reports[0]["lanes"]
    for report in reports:
        calls = [tuple(c) for c in report["calls"]]
        assert calls == [tuple(c) for c in reports[0]["calls"]]  # every rank the same
        reduced = "allreduce" if kind == "ddp" else "reduce_scatter"
        gathers = [size for collective, size in calls if collective == "all_gather"]
        # Every gradient byte, once a step, reduced on the switch and nothing else.
        assert {c for c, _ in calls} <= {reduced, "all_gather"}, calls
        assert sum(s for c, s in calls if c == reduced) == STEPS * _gradient_bytes(kind)
        want = sum(_float32_packets(s, lanes, report["slots"]) for c, s in calls if c == reduced)
        assert report["packets"] == want
        # Parameter all-gathers: FSDP2's on hostlib's ring; FSDP1's (the list form on the
        # CPU) and DDP's broadcasts on Gloo.
        assert report["ring_calls"] == len(gathers)
        assert (len(gathers) > 0) == (kind == "fsdp2"), gathers
    packets = reports[0]["packets"]
    assert packets > 0
    assert after["completed"] - before["completed"] == packets
    assert after["aggregated"] - before["aggregated"] == WORLD * packets

    params = torch.load(tmp_path / "params.pt")
    bound, first, last = _trajectory_bound(lanes)
    names = list(first)
    assert sorted(params["ina"]) == sorted(params["gloo"]) == sorted(names)
    ina, gloo = _flat(params["ina"], names), _flat(params["gloo"], names)
    moved = float((_flat(last, names) - _flat(first, names)).abs().max())
    diff = float((ina - gloo).abs().max())
    assert diff <= bound, (diff, bound)
    # The bound says something: training moved the parameters far more, and the float64
    # run agrees with Gloo's to float32 rounding.
    assert bound < 1e-3 * moved, (bound, moved)
    assert float((gloo - _flat(last, names)).abs().max()) < 1e-3 * moved
