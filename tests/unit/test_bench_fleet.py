"""The bench coordinator's gathering of its ranks' messages (``sweep._Fleet.gather``)
against real processes and pipes: a rank may exit once it sent its result, never before.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from types import SimpleNamespace

import pytest

from emulation.bench.sweep import BenchError, _Fleet


def _send_and_exit(conn: Connection, kind: str) -> None:
    conn.send((kind, []))
    conn.close()


def _fleet_of_one(kind: str) -> _Fleet:
    """A fleet (without its plans) whose one rank has sent ``kind`` and exited, so that
    its message and its exit are both ready when the coordinator first waits."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_send_and_exit, args=(child, kind))
    proc.start()
    child.close()
    proc.join(10)
    assert proc.exitcode == 0
    fleet = object.__new__(_Fleet)
    fleet.algo, fleet.stall_s, fleet.switch_log = "ring", 10.0, None
    fleet.plans = [SimpleNamespace(log_path="/tmp/ring-rank0.log")]  # type: ignore[list-item]
    fleet.procs, fleet.conns = [proc], [parent]
    return fleet


def test_a_rank_that_sent_its_result_and_exited_is_not_taken_for_dead() -> None:
    # Seen in CI: "tree rank 7 exited with status 0 without reporting an error".
    assert _fleet_of_one("result").gather("result") == [("result", [])]


def test_a_rank_that_exits_after_a_barrier_is_dead() -> None:
    with pytest.raises(BenchError, match="rank 0 exited with status 0"):
        _fleet_of_one("barrier").gather("barrier")
