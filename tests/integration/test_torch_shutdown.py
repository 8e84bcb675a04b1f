"""Shutting the "ina" backend down when the switch or a rank is gone (issue #20).

Real processes: four ranks, each a spawned process of its own (so that one can be
killed with SIGKILL), and an ``inalab switch`` process per test. The ranks run a few
allreduces through the switch, then the switch or one rank is killed; the others' next
allreduce fails with the backend's error within its deadline, and their
``destroy_process_group`` ends within the group's timeout. Nothing is left behind: every
rank process ended, no UDP socket stays open in a rank after the group is destroyed,
and, where the switch lives, rank 0 removed the job.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import tcp_init_method

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dynamiccl.torch_backend import DEFAULT_DEADLINE, InaOptions, InaProcessGroup  # noqa: E402
from emulation.softswitch.process import SoftSwitchProcess  # noqa: E402
from hostlib.ina import InaError  # noqa: E402

WORLD = 4
pytestmark = pytest.mark.engine_neutral  # teardown: the engines' own tests run twice

TIMEOUT = timedelta(seconds=30)
"""The group's timeout: whatever happens, destroy_process_group must end within it."""
DEADLINE = 2.0
"""Seconds an allreduce goes without progress before it fails (InaOptions.deadline)."""


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[SoftSwitchProcess]:
    with SoftSwitchProcess(tmp_path / "switch") as sw:
        yield sw


def _udp_sockets() -> int:
    """UDP sockets this process holds open (its descriptors' inodes in /proc/net/udp)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the directory's own descriptor, closed by now
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    udp = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with open(table) as lines:
            udp |= {line.split()[9] for line in list(lines)[1:]}
    return len(inodes & udp)


def _rank(rank: int, init: str, options: InaOptions, ready: Any, out: str) -> None:
    udp_before = _udp_sockets()
    dist.init_process_group(
        "ina", init_method=init, rank=rank, world_size=WORLD, timeout=TIMEOUT, pg_options=options
    )
    pg = dist.group.WORLD
    assert isinstance(pg, InaProcessGroup)
    for _ in range(3):
        x = torch.full((1000,), float(rank + 1))
        dist.all_reduce(x)
        assert torch.all(x == WORLD * (WORLD + 1) / 2)
    ready.set()
    # The parent killed the switch or a rank. A file, not an Event: setting an Event
    # waits for every waiter to wake, and a killed rank never does.
    while not Path(out, "go").exists():
        time.sleep(0.01)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
        error, is_ina = "", False
    except Exception as exc:  # what a training loop would see
        error, is_ina = f"{type(exc).__name__}: {exc}", isinstance(exc, InaError)
    failed_after = time.monotonic() - start
    start = time.monotonic()
    dist.destroy_process_group()
    report = {
        "error": error,
        "ina_error": is_ina,
        "failed_after": failed_after,
        "destroy_seconds": time.monotonic() - start,
        "udp_left": _udp_sockets() - udp_before,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))


def _run(switch: SoftSwitchProcess, tmp_path: Path, job_id: int, kill: str) -> list[dict[str, Any]]:
    """Start the ranks, kill ``kill`` (``"switch"`` or ``"rank3"``) once they are ready,
    and return the survivors' reports once every rank process ended."""
    options = InaOptions(
        switch=switch.data_addr,
        p4runtime=switch.p4runtime_address,
        job_id=job_id,
        device_id=switch.device_id,
        deadline=DEADLINE,
    )
    ctx = mp.get_context("spawn")
    init = tcp_init_method()
    readies = [ctx.Event() for _ in range(WORLD)]
    procs = [
        ctx.Process(target=_rank, args=(r, init, options, readies[r], str(tmp_path)))
        for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    try:
        for ready in readies:
            assert ready.wait(120), "the ranks did not set up and run their first allreduces"
        if kill == "switch":
            os.kill(switch.pid, signal.SIGKILL)
            switch.wait(10)
        else:
            os.kill(procs[WORLD - 1].pid, signal.SIGKILL)
        (tmp_path / "go").touch()
        limit = time.monotonic() + DEADLINE + TIMEOUT.total_seconds() + 30
        for proc in procs:
            proc.join(max(limit - time.monotonic(), 0.1))
        alive = [r for r, proc in enumerate(procs) if proc.is_alive()]
        assert alive == [], f"ranks {alive} did not end"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    survivors = range(WORLD) if kill == "switch" else range(WORLD - 1)
    assert [procs[r].exitcode for r in survivors] == [0] * len(survivors)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in survivors]


def _check_ended_cleanly(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        # The allreduce after the loss failed with the backend's error, near its deadline.
        assert report["ina_error"], report
        assert report["failed_after"] < DEADLINE + 5, report
        assert report["destroy_seconds"] < TIMEOUT.total_seconds(), report
        assert report["udp_left"] == 0, report


@pytest.mark.timeout(300)
def test_destroy_with_the_switch_gone(switch: SoftSwitchProcess, tmp_path: Path) -> None:
    reports = _run(switch, tmp_path, job_id=100, kill="switch")
    _check_ended_cleanly(reports)
    assert not switch.is_running()


@pytest.mark.timeout(300)
def test_destroy_with_a_rank_killed(switch: SoftSwitchProcess, tmp_path: Path) -> None:
    reports = _run(switch, tmp_path, job_id=101, kill="rank3")
    _check_ended_cleanly(reports)
    with switch.controller() as ctl:
        # Rank 0 removed the job although rank 3 never shut down.
        assert 101 not in [j.job_id for j in ctl.installed_jobs()]


def _training_rank(rank: int, init: str, options: InaOptions, ready: Any, out: str) -> None:
    """A training loop as a user writes it: ``init_process_group("ina")`` with torch's
    default timeout (30 minutes), allreduces until one raises, and the exception ends the
    process (recorded first, for the parent)."""
    dist.init_process_group("ina", init_method=init, rank=rank, world_size=WORLD,
                            pg_options=options)  # fmt: skip
    ready.set()
    try:
        while True:
            dist.all_reduce(torch.ones(50_000))
    except Exception as exc:
        Path(out, f"rank{rank}.err").write_text(f"{type(exc).__name__}: {exc}")
        raise


@pytest.mark.timeout(300)
def test_a_killed_switch_ends_a_default_timeout_job_within_the_deadline(
    switch: SoftSwitchProcess, tmp_path: Path
) -> None:
    """Issue #38: with ``init_process_group``'s default 30-minute timeout and no deadline
    set, ``kill -9`` of the switch mid-training ends every rank within the backend's
    documented no-progress deadline (10 s) + 5 s, each naming the switch."""
    options = InaOptions(switch=switch.data_addr, p4runtime=switch.p4runtime_address,
                         job_id=102, device_id=switch.device_id)  # fmt: skip
    assert options.no_progress_deadline(dist.default_pg_timeout) == DEFAULT_DEADLINE == 10.0
    ctx = mp.get_context("spawn")
    init = tcp_init_method()
    readies = [ctx.Event() for _ in range(WORLD)]
    procs = [ctx.Process(target=_training_rank, args=(r, init, options, readies[r], str(tmp_path)))
             for r in range(WORLD)]  # fmt: skip
    for proc in procs:
        proc.start()
    try:
        for ready in readies:
            assert ready.wait(120), "the ranks did not set up"
        time.sleep(1.0)  # allreduces under way
        os.kill(switch.pid, signal.SIGKILL)
        killed = time.monotonic()
        ended = []
        for proc in procs:
            proc.join(max(killed + DEFAULT_DEADLINE + 30 - time.monotonic(), 0.1))
            ended.append(time.monotonic() - killed)
        assert not any(proc.is_alive() for proc in procs), ended
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert max(ended) <= DEFAULT_DEADLINE + 5, ended
    where = "{}:{}".format(*switch.data_addr)
    for r, proc in enumerate(procs):
        assert proc.exitcode != 0
        error = (tmp_path / f"rank{r}.err").read_text()
        assert f"no result from switch {where} for " in error, error
