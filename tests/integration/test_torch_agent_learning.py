"""The online agent learning inside a job on the "ina" backend (``dynamiccl.learning``).

Four spawned ranks on a real ``inalab switch`` process run a mix of calls (a small and a
large allreduce, a reduce-scatter) for which a simulated environment decides the times:
each rank sees the simulated time of what it ran times a factor of its own, so the ranks'
local times always differ. The calls themselves are real (packets through the switch or
hostlib's ring, by the agent's choice). The simulation is the cost model's own
prediction with, per call, one algorithm other than the model's favourite made faster
than predicted, so the agent must learn against its prior. Checked: every rank made the
same choice for every call (a disagreement would also hang the calls), the agent
converged on the simulated optimum per call, and a saved state continues learning in a
second job.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import tcp_init_method

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.actions import Action  # noqa: E402
from dynamiccl.learning import AgreedLearner  # noqa: E402
from dynamiccl.model import DEFAULT_PROFILE  # noqa: E402
from dynamiccl.torch_backend import InaOptions, InaProcessGroup  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402

TIMEOUT = timedelta(seconds=60)
WORLD = 4
SMALL, LARGE = 4 << 10, 256 << 10
CALLS = [("allreduce", SMALL), ("allreduce", LARGE), ("reduce_scatter", LARGE)]
"""The calls of one step."""
FASTER = 0.3
"""In the simulation, the chosen algorithm of each call runs this share of the model's
prediction; the others run as predicted."""


def target_algorithm(prior: dict[Action, float]) -> str:
    """The algorithm the simulation makes fastest for a call: the best-predicted one
    among those other than the model's favourite (within the agent's exploration range
    of 2.5x), so that the agent must learn against its prior."""
    best = min(prior.values())
    favourite = min(prior, key=lambda a: prior[a]).algorithm
    others = {a: t for a, t in prior.items() if a.algorithm != favourite and t <= 2.5 * best}
    return min(others, key=lambda a: others[a]).algorithm if others else favourite


class SimulatedLearner(AgreedLearner):
    """The real learner, told a simulated time for each call instead of the measured one
    (times this rank's own factor), and logging its choices. The simulation is the cost
    model's prediction, with one algorithm per call made faster than predicted."""

    def __init__(self, rank_factor: float, **kw: Any) -> None:
        super().__init__(DEFAULT_PROFILE, WORLD, **kw)
        self.rank_factor = rank_factor
        self.log: list[str] = []
        self.prior: dict[tuple[str, int], dict[Action, float]] = {}
        self.target: dict[tuple[str, int], str] = {}

    def bind(self, switch_lanes: int, slots: int) -> None:
        super().bind(switch_lanes, slots)
        fresh = AgreedLearner(DEFAULT_PROFILE, WORLD)
        fresh.bind(switch_lanes, slots)
        assert fresh.agent is not None
        for c, s in CALLS:
            self.prior[c, s] = {v.action: v.estimate for v in fresh.agent.arms(c, s)}
            self.target[c, s] = target_algorithm(self.prior[c, s])

    def choose_call(self, collective: str, size_bytes: int) -> Action:
        action = super().choose_call(collective, size_bytes)
        self.log.append(f"{collective}:{size_bytes}:{action.label}")
        return action

    def observe(self, collective: str, size_bytes: int, action: Action, seconds: float) -> None:
        key = (collective, size_bytes)
        simulated = self.prior[key][action] * (FASTER if action.algorithm == self.target[key]
                                               else 1.0)  # fmt: skip
        super().observe(collective, size_bytes, action, simulated * self.rank_factor)


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path_factory.mktemp("agent-switch")) as sw:
        yield sw


def _rank(
    rank: int, init: str, sw: tuple[Any, ...], steps: int, state: str | None, save: str, out: str
) -> None:
    data_addr, p4runtime, device_id, job_id = sw
    learner = SimulatedLearner(1.0 + 0.5 * rank, state=state, save_to=save, sync_every=8)
    options = InaOptions(switch=data_addr, p4runtime=p4runtime, job_id=job_id,
                         device_id=device_id, slots=32, chooser=learner)  # fmt: skip
    dist.init_process_group("ina", init_method=init, rank=rank, world_size=WORLD,
                            timeout=TIMEOUT, pg_options=options)  # fmt: skip
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup)
    for step in range(steps):
        for collective, size in CALLS:
            x = torch.full((size // 4,), float(rank + step % 3), dtype=torch.float32)
            if collective == "allreduce":
                dist.all_reduce(x)
                want = sum(r + step % 3 for r in range(WORLD))
                assert torch.allclose(x, torch.full_like(x, float(want)), rtol=1e-5)
            else:
                part = torch.empty(size // 4 // WORLD, dtype=torch.float32)
                dist.reduce_scatter_tensor(part, x)
                want = sum(r + step % 3 for r in range(WORLD))
                assert torch.allclose(part, torch.full_like(part, float(want)), rtol=1e-5)
    result = {"log": learner.log, "recorded": learner.recorded, "agreements": learner.agreements,
              "target": [learner.target[c] for c in CALLS],
              "favourite": [min(learner.prior[c], key=learner.prior[c].__getitem__).algorithm
                            for c in CALLS]}  # fmt: skip
    dist.destroy_process_group()  # rank 0 saves the agent here
    Path(f"{out}.{rank}").write_text(json.dumps(result))


def _run(sw: SoftSwitchProcess, job_id: int, steps: int, state: str | None, save: Path,
         out: Path) -> list[dict[str, Any]]:  # fmt: skip
    where = (sw.data_addr, sw.p4runtime_address, sw.device_id, job_id)
    mp.spawn(_rank, args=(tcp_init_method(), where, steps, state, str(save), str(out)),
             nprocs=WORLD)  # fmt: skip
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(WORLD)]


def _chosen_algorithms(log: list[str], collective: str, size: int) -> list[str]:
    return [e.split(":")[2].split("/")[0] for e in log if e.startswith(f"{collective}:{size}:")]


@pytest.mark.slow
def test_the_agent_learns_in_the_job_with_every_rank_choosing_alike(
    switch: SoftSwitchProcess, tmp_path: Path
) -> None:
    save = tmp_path / "agent.json"
    ranks = _run(switch, 91, 48, None, save, tmp_path / "first")
    logs = [r["log"] for r in ranks]
    assert all(log == logs[0] for log in logs), "ranks chose differently"
    assert ranks[0]["recorded"] == 48 * len(CALLS) // 8 * 8 and ranks[0]["agreements"] == 18
    targets, favourites = ranks[0]["target"], ranks[0]["favourite"]
    assert targets != favourites, "the simulation must contradict the model somewhere"
    for (collective, size), target in zip(CALLS, targets, strict=True):
        chosen = _chosen_algorithms(logs[0], collective, size)
        last = Counter(chosen[-16:])
        assert last.most_common(1)[0][0] == target, (collective, size, chosen)
    # A saved state continues: the second job starts from what the first learnt.
    assert save.exists()
    saved = json.loads(save.read_text())
    again = _run(switch, 92, 16, str(save), tmp_path / "resumed.json", tmp_path / "second")
    assert all(r["log"] == again[0]["log"] for r in again)
    for (collective, size), target in zip(CALLS, targets, strict=True):
        first = _chosen_algorithms(again[0]["log"], collective, size)[:4]
        assert first.count(target) >= 3, (collective, size, first)
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    calls = {(c["collective"], c["bucket"]): c["calls"] for c in saved["contexts"]}
    grown = {(c["collective"], c["bucket"]): c["calls"] for c in resumed["contexts"]}
    assert all(grown[k] > v for k, v in calls.items()), "learning went on from the saved state"
