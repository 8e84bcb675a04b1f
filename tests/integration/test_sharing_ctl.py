"""The controller and ``inalab ctl`` on sharing, against a real soft switch over gRPC.

``add_job(shared=, fallback=)`` makes the switch's one region at the top of the pool and
spreads jobs over it; reservations keep out of it; each sharing job gets a counter cell of
its own, zeroed; ``remove_job`` frees and clears the region's slots the job held, so the
next job takes them with nothing of the old one left; bad requests are refused with
nothing written. ``inalab ctl add-job --shared --fallback``, ``add-behind``, ``jobs`` and
``stats`` show the same.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Iterator

import pytest
from helpers import bound_udp_sockets, worker_addresses

from controller.sharing import OWNER
from controller.switch import NoFreeSlotsError, SwitchController, WorkerAddress
from emulation.cli import main as inalab
from emulation.softswitch import SoftSwitchProcess
from hostlib.protocol import Header, PacketType, pack_header

LANES = 8
POOL = 64
FALLBACK = WorkerAddress("127.0.0.1", 9)  # nothing listens: what goes there is lost
_eras = itertools.count(1)


@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    sw = SoftSwitchProcess(tmp_path_factory.mktemp("sharing"), lanes=LANES, slots=POOL).start()
    yield sw
    assert sw.stop() == 0, sw.log_path.read_text()


@pytest.fixture
def ctl(switch: SoftSwitchProcess) -> Iterator[SwitchController]:
    era = next(_eras)
    with switch.controller(election_id=(era, 10)) as c:
        yield c
    with switch.controller(election_id=(era, 1000)) as last:
        for job in last.installed_jobs():
            last.remove_job(job.job_id)


def send(sock: socket.socket, switch: SoftSwitchProcess, job: int, rank: int, slot: int,
         seq: int) -> None:  # fmt: skip
    header = Header(PacketType.DATA, job, rank, slot, 0, seq, LANES)
    sock.sendto(pack_header(header) + bytes(4 * LANES), switch.data_addr)


def settle(ctl: SwitchController, sent: int) -> None:
    """Wait until the switch has received ``sent`` datagrams in all."""
    deadline = time.monotonic() + 10.0
    while ctl.counters()["received"] < sent:
        assert time.monotonic() < deadline, "the switch did not receive what was sent"
        time.sleep(0.005)


def test_the_region_jobs_and_their_release(switch: SoftSwitchProcess,
                                            ctl: SwitchController) -> None:  # fmt: skip
    base_received = ctl.counters()["received"]
    with bound_udp_sockets(4) as socks:
        addrs = worker_addresses(s.getsockname() for s in socks)
        a = ctl.add_job(11, addrs[:2], 2, shared=4, region=8, fallback=FALLBACK)
        b = ctl.add_job(12, addrs[2:], 0, shared=4, fallback=FALLBACK)
        assert a.shared is not None and b.shared is not None
        assert (a.shared.base, a.shared.size, a.shared.offset) == (POOL - 8, 8, 0)
        assert (b.shared.base, b.shared.size, b.shared.offset) == (POOL - 8, 8, 4)
        assert (a.shared.stats, b.shared.stats) == (0, 1)
        assert a.fallback is not None and a.fallback.stats == 0
        with pytest.raises(NoFreeSlotsError):  # the region is no reservation's
            ctl.add_job(13, addrs[:1], 4, slot_base=POOL - 6)
        with pytest.raises(ValueError, match="one region"):
            ctl.add_job(13, addrs[:1], 1, shared=2, region=16, fallback=FALLBACK)
        assert {j.job_id for j in ctl.installed_jobs()} == {11, 12}

        # job 11's shared slots 2..5 take region cells 0..3 on first use
        for slot in range(2, 6):
            send(socks[0], switch, 11, 0, slot, slot)
        settle(ctl, base_received + 4)
        assert ctl.job_counters(11)["shared_uses"] == 4
        owners = ctl.registers.read(OWNER, a.shared.cells())
        assert [v >> 16 for v in owners] == [11] * 4

        ctl.remove_job(11)
        assert ctl.registers.read(OWNER, a.shared.cells()) == [0] * 4
        seqs = ctl.registers.read("Ingress.seq", a.shared.cells())
        assert seqs == [0] * 4  # cleared: the next job's seq 1 is not stale

        # job 14 takes job 11's counter cell, zeroed, and its region cells
        c = ctl.add_job(14, addrs[:2], 0, shared=4, fallback=FALLBACK)
        assert c.shared is not None and c.shared.stats == 0 and c.shared.offset == 0
        assert ctl.job_counters(14) == dict.fromkeys(ctl.job_counters(14), 0)
        send(socks[0], switch, 14, 0, 0, 1)
        settle(ctl, base_received + 5)
        assert ctl.job_counters(14)["shared_uses"] == 1
        assert ctl.registers.read(OWNER, c.shared.cells()[:1])[0] >> 16 == 14


def test_sharing_requests_that_cannot_be_met_write_nothing(ctl: SwitchController) -> None:
    addrs = [WorkerAddress("127.0.0.1", 7000 + r) for r in range(2)]
    with pytest.raises(ValueError, match="slot count 0"):
        ctl.add_job(20, addrs, 0)  # no reservation needs sharing
    with pytest.raises(ValueError, match="power of two"):
        ctl.add_job(20, addrs, 1, shared=3, region=12, fallback=FALLBACK)
    with pytest.raises(ValueError, match="hierarchically"):
        ctl.add_job(20, addrs, 1, upstream=(0, FALLBACK), fallback=FALLBACK)
    assert ctl.installed_jobs() == []
    assert ctl.sharing is not None and ctl.sharing.shared.read() == []


def test_inalab_ctl_add_job_with_sharing_jobs_and_stats(
    switch: SoftSwitchProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = str(switch.ready_path)

    def run(*argv: str, code: int = 0) -> str:
        # Above every election id the module's controllers used: the switch may hold on to
        # the last primary's id (docs/p4runtime.md).
        got = inalab(["ctl", "--manifest", manifest, "--election-id", "100:1", *argv])
        out = capsys.readouterr()
        assert got == code, out.err
        return out.out + out.err

    out = run("add-job", "--job", "30", "--slots", "1", "--shared", "4", "--region", "4",
              "--fallback", "127.0.0.1:9", "127.0.0.1:7001", "127.0.0.1:7002")  # fmt: skip
    assert "4 shared in region 60+4 from 0; fallback 127.0.0.1:9" in out
    out = run("add-behind", "--job", "31", "--workers", "3", "--slots", "8", "127.0.0.1:9")
    assert "fallback aggregator of 127.0.0.1:9, 3 workers, slots" in out
    jobs = json.loads(run("jobs", "--json"))
    by_id = {j["job_id"]: j for j in jobs}
    assert by_id[30]["shared"] == {"count": 4, "base": 60, "size": 4, "offset": 0}
    assert by_id[30]["fallback"]["udp_port"] == 9 and by_id[31]["behind"] is True
    assert "fallback aggregator behind the switch" in run("jobs")
    text = run("stats")
    assert "shared uses" in text and "to fallback" in text
    stats = json.loads(run("stats", "--json"))
    assert stats["jobs"]["30"] == {"shared_uses": 0, "collisions": 0, "to_fallback": 0,
                                   "from_fallback": 0}  # fmt: skip
    out = run("add-job", "--job", "32", "--slots", "0", "127.0.0.1:7003", code=1)
    assert "slot count 0" in out
    for job in ("30", "31"):
        run("remove-job", "--job", job)
    assert "no jobs" in run("jobs")
