"""The controller against a real soft switch process, over real gRPC and UDP.

Jobs installed by :class:`SwitchController` carry real allreduces; reads of tables,
registers and counters show what the data plane did; mastership, a controller restart
and failed installs leave the switch consistent.

The switch follows P4Runtime's arbitration: once an election id was seen, only a
controller with at least that id can be primary. Election ids therefore only grow over the
module's one switch: each test runs in its own era (the id's high word), above every id
of the tests before it.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.client import AlreadyExistsError, NotPrimaryError
from controller.replicas import ReplicaEntry
from controller.switch import (
    JobExistsError,
    JobNotFoundError,
    NoFreeSlotsError,
    SwitchController,
    UpstreamNotFoundError,
    WorkerAddress,
)
from controller.upstream import UpstreamEntry
from emulation.cli import main as inalab
from emulation.softswitch import SoftSwitchProcess
from hostlib import InaSession, JobSpec
from hostlib.transport.udp import UdpTransport

LANES = 8
POOL = 64
SLOTS = 4


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    sw = SoftSwitchProcess(tmp_path_factory.mktemp("ctl"), lanes=LANES, slots=POOL).start()
    yield sw
    assert sw.stop() == 0, sw.log_path.read_text()


_ERAS = itertools.count(1)


@pytest.fixture
def era() -> int:
    """This test's election-id high word: above every id of the tests before it."""
    return next(_ERAS)


@pytest.fixture
def ctl(switch: SoftSwitchProcess, era: int) -> Iterator[SwitchController]:
    with switch.controller(election_id=(era, 10)) as c:
        yield c
    # The test may have taken mastership with a higher id: clean up above all of them.
    with switch.controller(election_id=(era, 1000)) as last:
        for job in last.installed_jobs():  # leave the module's switch empty
            last.remove_job(job.job_id)
        last.set_drops(0.0, 0.0)


class Workers:
    """UDP sessions for a job: bind first, so the controller can name their addresses."""

    def __init__(self, switch: SoftSwitchProcess, job_id: int, count: int) -> None:
        self.switch, self.job_id, self.count = switch, job_id, count
        self.transports = [UdpTransport(("127.0.0.1", 0)) for _ in range(count)]
        self.addresses = [WorkerAddress(*t.local_addr) for t in self.transports]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        sessions = [
            InaSession(JobSpec(self.job_id, r, self.count, self.switch.data_addr, LANES, SLOTS), t)
            for r, t in enumerate(self.transports)
        ]
        out: list[Any] = [None] * self.count

        def work(rank: int) -> None:
            out[rank] = sessions[rank].allreduce(inputs[rank])

        threads = [threading.Thread(target=work, args=(r,)) for r in range(self.count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for s in sessions:
            s.close()
        return out


def test_a_job_installed_by_the_controller_aggregates(
    switch: SoftSwitchProcess, ctl: SwitchController
) -> None:
    workers = Workers(switch, 21, 3)
    job = ctl.add_job(21, workers.addresses, SLOTS)
    assert (job.entry.num_workers, job.entry.slot_count) == (3, SLOTS)
    inputs = [np.arange(40, dtype=np.int32) * (r + 1) for r in range(3)]
    before = ctl.counters()
    results = workers.run(inputs)
    for got in results:
        np.testing.assert_array_equal(got, inputs[0] * 6)
    after = ctl.counters()
    packets = 3 * (40 // LANES)  # 5 packets per rank
    assert after["completed"] - before["completed"] == packets // 3
    assert after["aggregated"] - before["aggregated"] == packets
    assert after["results_sent"] - before["results_sent"] == packets
    # Chunk 0 (seq 1) used slot 0 in set 0; chunk 4 (seq 5) reused slot 0 in set 1 and
    # so cleared the ranks' bits in set 0 (SwitchML's two-set bitmaps).
    first, last = ctl.read_slot(21, 0, 0), ctl.read_slot(21, 0, 1)
    assert (last.ranks(), last.remaining, last.seq) == ([0, 1, 2], 0, 5)
    assert list(last.values) == list(inputs[0][32:40] * 6)
    assert (first.bitmap, first.remaining, first.seq) == (0, 0, 1)
    assert list(first.values) == list(inputs[0][:LANES] * 6)


def test_installed_jobs_are_read_back_from_the_tables(ctl: SwitchController) -> None:
    a = [WorkerAddress("127.0.0.1", 7001), WorkerAddress("127.0.0.1", 7002)]
    b = [WorkerAddress("127.0.0.1", 7003)]
    ctl.add_job(1, a, 8)
    ctl.add_job(2, b, 8)
    jobs = {j.job_id: j for j in ctl.installed_jobs()}
    assert (jobs[1].entry.slot_base, jobs[2].entry.slot_base) == (0, 8)
    assert jobs[1].entry.mgid != jobs[2].entry.mgid
    assert [(w.rank, w.udp_port) for w in jobs[1].workers] == [(0, 7001), (1, 7002)]
    assert [(r.rid, r.udp_port) for r in jobs[1].replicas] == [(0, 7001), (1, 7002)]
    assert jobs[1].group == ((0, 0), (0, 1))
    with pytest.raises(JobExistsError):
        ctl.add_job(1, b, 8)
    with pytest.raises(NoFreeSlotsError):
        ctl.add_job(3, b, 8, slot_base=4)
    with pytest.raises(NoFreeSlotsError):
        ctl.add_job(3, b, POOL)
    with pytest.raises(ValueError):
        ctl.add_job(3, [b[0], b[0]], 8)


def test_a_lower_election_id_reads_but_cannot_write(
    switch: SoftSwitchProcess, ctl: SwitchController, era: int
) -> None:
    ctl.add_job(5, [WorkerAddress("127.0.0.1", 7005)], 4)
    with switch.controller(election_id=(era, 3)) as backup:
        assert not backup.is_primary and ctl.is_primary
        assert [j.job_id for j in backup.installed_jobs()] == [5]
        with pytest.raises(NotPrimaryError):
            backup.add_job(6, [WorkerAddress("127.0.0.1", 7006)], 4)
        with pytest.raises(NotPrimaryError):
            backup.remove_job(5)
    assert [j.job_id for j in ctl.installed_jobs()] == [5]


def test_a_restarted_controller_tears_down_a_job_it_did_not_install(
    switch: SoftSwitchProcess, ctl: SwitchController, era: int
) -> None:
    workers = Workers(switch, 30, 2)
    with switch.controller(election_id=(era, 11)) as first:
        first.add_job(30, workers.addresses, SLOTS, slot_base=16)
        workers.run([np.ones(LANES, np.int32), np.ones(LANES, np.int32)])
        assert first.read_slot(30, 0, 0).seq == 1
    # That controller is gone; its job stays on the switch for the next one.
    with switch.controller(election_id=(era, 12)) as again:
        (job,) = again.installed_jobs()
        assert (job.job_id, job.entry.slot_base, len(job.workers)) == (30, 16, 2)
        removed = again.remove_job(30)
        assert removed.entry == job.entry
        assert again.installed_jobs() == []
        assert again.workers.read() == [] and again.replicas.read() == []
        assert again.multicast.read() == {}
        # The job's slots are clear: no stale seq to drop the next job's packets.
        base = 16
        assert again.registers.read("Ingress.seq", list(range(base, base + SLOTS))) == [0] * 4
        with pytest.raises(JobNotFoundError):
            again.remove_job(30)


def test_a_failed_install_leaves_nothing_behind(ctl: SwitchController) -> None:
    # Someone else's replica entry on the key rank 1 of job 40 will take.
    ctl.replicas.insert(ReplicaEntry(40, 1, 0, "00:00:00:00:00:00", "127.0.0.2", 9))
    before_groups = ctl.multicast.read()
    addrs = [WorkerAddress("127.0.0.1", 7040), WorkerAddress("127.0.0.1", 7041)]
    with pytest.raises(AlreadyExistsError):
        ctl.add_job(40, addrs, 4)
    assert ctl.jobs.read() == [] and ctl.workers.read() == []
    assert [(r.job_id, r.rid) for r in ctl.replicas.read()] == [(40, 1)]
    assert ctl.multicast.read() == before_groups
    ctl.replicas.delete(ReplicaEntry(40, 1, 0, "00:00:00:00:00:00", "127.0.0.2", 9))


def test_an_upstream_entry_is_set_replaced_and_removed_with_its_job(
    ctl: SwitchController,
) -> None:
    spine = WorkerAddress("127.0.0.9", 20033, "02:00:00:00:00:09", 3)
    # Before the job: the tables are independent, the job turns on with its upstream.
    entry = ctl.set_upstream(60, 1, spine)
    assert entry == UpstreamEntry(60, 1, "127.0.0.9", 20033, "02:00:00:00:00:09", 3)
    assert ctl.upstream.read() == [entry]
    moved = ctl.set_upstream(60, 2, WorkerAddress("127.0.0.8", 9000))  # a modify
    assert ctl.upstream.read() == [UpstreamEntry(60, 2, "127.0.0.8", 9000, "00:00:00:00:00:00", 0)]
    ctl.add_job(60, [WorkerAddress("127.0.0.1", 7060)], 4)
    assert ctl.job(60).upstream == moved
    removed = ctl.remove_job(60)
    assert removed.upstream == moved and ctl.upstream.read() == []
    with pytest.raises(UpstreamNotFoundError):
        ctl.remove_upstream(60)
    with pytest.raises(ValueError, match="upstream rank 32"):
        ctl.set_upstream(60, 32, spine)
    assert ctl.upstream.read() == []


def test_add_job_with_an_upstream_writes_it_before_the_job_or_not_at_all(
    ctl: SwitchController,
) -> None:
    spine = WorkerAddress("127.0.0.9", 20033)
    job = ctl.add_job(61, [WorkerAddress("127.0.0.1", 7061)], 4, upstream=(1, spine))
    assert job.upstream == UpstreamEntry(61, 1, "127.0.0.9", 20033, "00:00:00:00:00:00", 0)
    assert ctl.job(61).upstream == job.upstream
    removed = ctl.remove_upstream(61)  # the job goes on, flat
    assert removed == job.upstream and ctl.job(61).upstream is None
    # Someone else's entry for job 62: the install fails and leaves nothing of its own.
    other = ctl.set_upstream(62, 0, spine)
    with pytest.raises(AlreadyExistsError):
        ctl.add_job(62, [WorkerAddress("127.0.0.1", 7062)], 4, upstream=(1, spine))
    assert [j.job_id for j in ctl.jobs.read()] == [61]
    assert [w.job_id for w in ctl.workers.read()] == [61]
    assert ctl.upstream.read() == [other]
    ctl.remove_upstream(62)


def test_drop_simulator_round_trips(ctl: SwitchController) -> None:
    ctl.set_drops(0.25, 1.0)
    assert ctl.drop_simulator.get() == (0.25, 1.0)
    with pytest.raises(ValueError):
        ctl.set_drops(1.5, 0.0)


# ----------------------------------------------------------------- inalab ctl


def _ctl(capsys: pytest.CaptureFixture[str], manifest: Path, *argv: str) -> tuple[int, str]:
    code = inalab(["ctl", "--manifest", str(manifest), *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.slow
def test_inalab_ctl_end_to_end(
    switch: SoftSwitchProcess, ctl: SwitchController, capsys: pytest.CaptureFixture[str], era: int
) -> None:
    manifest = switch.ready_path
    workers = Workers(switch, 50, 2)
    args = [f"{a.ip}:{a.udp_port}" for a in workers.addresses]
    # Writes need mastership: take a higher election id than the fixture's controller.
    code, out = _ctl(capsys, manifest, "--election-id", f"{era}:20", "add-job", "--job", "50",
                     "--slots", str(SLOTS), *args)  # fmt: skip
    assert code == 0, out
    assert "job 50: 2 workers" in out
    workers.run([np.full(LANES, 3, np.int32), np.full(LANES, 4, np.int32)])

    code, out = _ctl(capsys, manifest, "jobs", "--json")
    assert code == 0 and [j["job_id"] for j in json.loads(out)] == [50]
    code, out = _ctl(capsys, manifest, "show-bitmap", "--job", "50", "--slot", "0", "--json")
    doc = json.loads(out)
    assert doc["sets"][0]["ranks"] == [0, 1] and doc["sets"][0]["values"] == [7] * LANES
    code, out = _ctl(capsys, manifest, "show-bitmap", "--job", "50", "--slot", "0")
    assert "ranks [0, 1] remaining 0 seq 1" in out and "[done]" in out
    before = ctl.counters()["completed"]
    code, out = _ctl(capsys, manifest, "stats", "--json")
    assert json.loads(out)["completed"] == before >= 1
    code, out = _ctl(capsys, manifest, "--election-id", f"{era}:20", "drops", "--ingress", "0.5")
    assert code == 0 and "ingress 0.5 egress 0" in out

    code, out = _ctl(capsys, manifest, "add-job", "--job", "50", *args)
    assert code == 1 and "election id" in out  # (0, 1) is not the primary: refused
    code, out = _ctl(capsys, manifest, "--election-id", f"{era}:20", "remove-job", "--job", "50")
    assert code == 0 and "removed" in out
    code, out = _ctl(capsys, manifest, "show-bitmap", "--job", "50", "--slot", "0")
    assert code == 1 and "no job 50" in out


@pytest.mark.slow
def test_inalab_ctl_sets_and_removes_an_upstream(
    switch: SoftSwitchProcess, ctl: SwitchController, capsys: pytest.CaptureFixture[str], era: int
) -> None:
    manifest, primary = switch.ready_path, f"{era}:20"
    ctl.add_job(70, [WorkerAddress("127.0.0.1", 7070)], SLOTS)
    code, out = _ctl(capsys, manifest, "--election-id", f"{era}:20", "set-upstream", "--job", "70",
                     "--rank", "2", "--mac", "02:00:00:00:00:0a", "--port", "4",
                     "127.0.0.5:20033")  # fmt: skip
    assert code == 0, out
    assert "job 70: partial sums go to 127.0.0.5:20033 as rank 2" in out
    code, out = _ctl(capsys, manifest, "jobs")
    assert "upstream rank 2 at 127.0.0.5:20033" in out
    code, out = _ctl(capsys, manifest, "jobs", "--json")
    (doc,) = json.loads(out)
    assert doc["upstream"] == {
        "rank": 2, "ip": "127.0.0.5", "udp_port": 20033, "mac": "02:00:00:00:00:0a",
        "egress_port": 4,
    }  # fmt: skip
    code, out = _ctl(capsys, manifest, "show-bitmap", "--job", "70", "--slot", "0", "--json")
    assert [s["final"] for s in json.loads(out)["sets"]] == [0, 0]
    code, out = _ctl(capsys, manifest, "--election-id", primary, "remove-upstream", "--job", "70")
    assert code == 0 and "upstream 127.0.0.5:20033 removed" in out
    code, out = _ctl(capsys, manifest, "--election-id", primary, "remove-upstream", "--job", "70")
    assert code == 1 and "no upstream entry" in out
    with pytest.raises(SystemExit) as usage:
        _ctl(capsys, manifest, "set-upstream", "--job", "70", "--rank", "0",
             "--mac", "nope", "127.0.0.5:20033")  # fmt: skip
    assert usage.value.code == 2 and "'nope' is not a MAC address" in capsys.readouterr().err


def test_inalab_ctl_reports_bad_manifests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.json"
    code, out = _ctl(capsys, missing, "stats")
    assert code == 2 and "cannot read manifest" in out
    several = tmp_path / "run.json"
    several.write_text(json.dumps({"switches": {"s1": {"p4runtime": "x:1"}, "s2": {}}}))
    code, out = _ctl(capsys, several, "stats")
    assert code == 2 and "--name" in out and "s1, s2" in out
