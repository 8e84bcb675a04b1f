"""The controller's Tofino path: one :class:`SwitchController` configures a switch that
serves the Tofino program's P4Info (p4/tna/ina_tna.p4info.txtpb) through that program's
names, chosen by the P4Info it reads.

No Tofino is at hand: the soft switch serves the TNA P4Info over its real P4Runtime
server with its pipeline behind it (``inalab switch --program tna``), so the writes are
pinned as golden text protos (tests/golden/*_tna.txtpb; INALAB_REGEN_GOLDEN=1 rewrites
them after an intended change), and a job configured through the TNA names carries real
allreduces over UDP, read back through the TNA registers and counters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_controller_golden import RecordingService, _check

from controller.client import P4RuntimeError
from controller.p4info import DEFAULT_P4INFO_PATH, TNA_P4INFO_PATH, P4Info
from controller.roce import ROCE_QPN_BASE
from controller.sharing import FallbackEntry, SharedEntry
from controller.switch import SwitchController, WorkerAddress
from emulation.cli import main as inalab
from emulation.softswitch import SoftSwitchProcess
from emulation.softswitch.p4runtime import is_tofino, serve_p4runtime, softswitch_p4info
from emulation.softswitch.pipeline import Pipeline
from hostlib import InaSession, JobSpec
from hostlib.protocol import (
    ROCE_QP_REGISTERS,
    ROCE_UDP_PORT,
    TNA_LANES_PER_PACKET,
    TNA_SWITCH_SLOTS,
)
from hostlib.transport.rdma import RdmaEndpoint
from hostlib.transport.udp import UdpTransport

LANES = TNA_LANES_PER_PACKET


@pytest.fixture
def served() -> Iterator[tuple[RecordingService, str, Pipeline]]:
    pipeline = Pipeline(lanes=LANES, slots=4)
    p4info = softswitch_p4info(P4Info.load(TNA_P4INFO_PATH), LANES, 4)
    service = RecordingService(pipeline, p4info)
    server, port = serve_p4runtime(service, "127.0.0.1:0")
    try:
        yield service, f"127.0.0.1:{port}", pipeline
    finally:
        server.stop(grace=None).wait()


def _register_names(p4info: P4Info, writes: list[Any]) -> set[str]:
    return {
        p4info.register(u.entity.register_entry.register_id).name
        for w in writes
        for u in w.updates
        if u.entity.WhichOneof("entity") == "register_entry"
    }


def test_add_and_remove_job_write_the_tofino_programs_names(
    served: tuple[RecordingService, str, Pipeline],
) -> None:
    service, address, pipeline = served
    workers = [
        WorkerAddress("10.0.0.1", 40001, "02:00:00:00:00:01", 1),
        WorkerAddress("10.0.0.2", 40002, "02:00:00:00:00:02", 2),
    ]
    with SwitchController.connect(address) as ctl:
        assert is_tofino(ctl.p4info)  # read from the switch, not given
        assert (ctl.lanes, ctl.slots_per_set) == (LANES, 4)
        ctl.add_job(7, workers, slot_count=2, slot_base=1)
        _check("add_job_tna", service.writes)
        # The slot state the Tofino program keeps: seq and the missing workers, not the
        # v1model program's bitmaps and count (which its P4Info does not have).
        assert _register_names(ctl.p4info, service.writes) == {"Ingress.seq", "Ingress.missing"}
        assert [j.job_id for j in pipeline.jobs()] == [7]
        service.writes.clear()
        ctl.remove_job(7)
        _check("remove_job_tna", service.writes)
        assert pipeline.jobs() == []


def test_the_missing_register_is_the_pipelines_bitmap_and_count(
    served: tuple[RecordingService, str, Pipeline],
) -> None:
    _, address, pipeline = served
    with SwitchController.connect(address) as ctl:
        ctl.add_job(3, [WorkerAddress("127.0.0.1", 40000 + r) for r in range(3)], 2)
        regs = ctl.registers
        # A use in progress with ranks 0 and 2 in: rank 1 is missing.
        pipeline.register_write(_cell("seq", 4 + 0), 9)  # set 1, slot 0
        pipeline.register_write(_cell("remaining", 4 + 0), 1)
        pipeline.register_write(_cell("bitmap_set1", 0), 0b101)
        assert regs.read("Ingress.missing", [4]) == [0b010]
        slot = ctl.read_slot(3, 0, 1)
        assert (slot.ranks(), slot.remaining, slot.seq) == ([0, 2], 1, 9)
        regs.fill("Ingress.missing", 4, 5, 0)  # what clearing a slot writes
        assert regs.read("Ingress.missing", [4]) == [0]
        assert pipeline.register_read([_cell("remaining", 4), _cell("bitmap_set1", 0)]) == [0, 0]
        with pytest.raises(P4RuntimeError, match="takes 0"):
            regs.fill("Ingress.missing", 4, 5, 1)


def _cell(array: str, index: int) -> Any:
    from emulation.softswitch.pipeline import RegisterCell

    return RegisterCell(array, index)


@pytest.fixture(scope="module")
def tna_switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    sw = SoftSwitchProcess(
        tmp_path_factory.mktemp("tna"), lanes=LANES, slots=64, extra_args=("--program", "tna")
    ).start()
    yield sw
    assert sw.stop() == 0, sw.log_path.read_text()


def _allreduce(switch: SoftSwitchProcess, job_id: int, inputs: list[np.ndarray],
               ctl: SwitchController) -> list[np.ndarray]:  # fmt: skip
    transports = [UdpTransport(("127.0.0.1", 0)) for _ in inputs]
    ctl.add_job(job_id, [WorkerAddress(*t.local_addr) for t in transports], 4)
    sessions = [
        InaSession(JobSpec(job_id, r, len(inputs), switch.data_addr, LANES, 4), t)
        for r, t in enumerate(transports)
    ]
    out: list[Any] = [None] * len(inputs)

    def work(rank: int) -> None:
        out[rank] = sessions[rank].allreduce(inputs[rank])

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in sessions:
        s.close()
    return out


def test_a_job_configured_through_the_tofino_names_aggregates(
    tna_switch: SoftSwitchProcess,
) -> None:
    with tna_switch.controller() as ctl:
        assert is_tofino(ctl.p4info)
        assert ctl.slots_per_set == 64
        before = ctl.counters()
        inputs = [np.arange(5 * LANES, dtype=np.int32) * (r + 1) for r in range(3)]
        for got in _allreduce(tna_switch, 31, inputs, ctl):
            np.testing.assert_array_equal(got, inputs[0] * 6)
        after = ctl.counters()
        # received and completed come from the Tofino program's counters of their own.
        assert after["received"] - before["received"] == 15
        assert after["completed"] - before["completed"] == 5
        assert after["aggregated"] - before["aggregated"] == 15
        assert after["results_sent"] - before["results_sent"] == 15
        slot = ctl.read_slot(31, 0, 1)  # chunk 4 (seq 5) reused slot 0 in set 1
        assert (slot.ranks(), slot.remaining, slot.seq) == ([0, 1, 2], 0, 5)
        assert slot.values[:3] == (4 * LANES * 6, (4 * LANES + 1) * 6, (4 * LANES + 2) * 6)
        ctl.remove_job(31)


def test_ctl_reads_a_tofino_switchs_counters(
    tna_switch: SoftSwitchProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    address = tna_switch.p4runtime_address
    assert inalab(["ctl", "--switch", address, "stats", "--all"]) == 0
    out = capsys.readouterr().out
    assert "received" in out and "completed" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["switch", "--program", "tna", "--lanes", "64"], f"its program has {LANES} lanes, not 64"),
        (["switch", "--program", "tna", "--slots", str(2 * TNA_SWITCH_SLOTS)], "8192 slots a set"),
    ],
)
def test_the_switch_refuses_sizes_the_tofino_program_lacks(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert inalab(argv) == 2
    assert message in capsys.readouterr().err


def test_the_p4info_file_is_where_the_controller_finds_it() -> None:
    checkout = Path(__file__).resolve().parents[2]
    assert checkout / "p4/tna/ina_tna.p4info.txtpb" == TNA_P4INFO_PATH


def test_the_tofino_path_installs_and_removes_a_jobs_roce_tables(
    served: tuple[RecordingService, str, Pipeline],
) -> None:
    # p4/tna/ declares p4/roce.p4's RoCEv2 tables and PSN register under the same names,
    # keys and actions: the one controller installs them through the TNA P4Info.
    service, address, pipeline = served
    tna = P4Info.load(TNA_P4INFO_PATH)
    for name in ("Ingress.roce.roce_requests", "Ingress.roce.roce_jobs",
                 "Egress.roce.roce_replies"):  # fmt: skip
        assert tna.table(name) is not None
    assert tna.register("Egress.roce.reply_psn").size == ROCE_QP_REGISTERS
    endpoints = [[RdmaEndpoint(0x100 + 2 * r + u, 0xA0 + r, 0x1000 * u, 7 + u) for u in range(2)]
                 for r in range(2)]  # fmt: skip
    workers = [WorkerAddress(f"10.0.0.{r + 1}", ROCE_UDP_PORT) for r in range(2)]
    with SwitchController.connect(address) as ctl:
        assert is_tofino(ctl.p4info) and ctl.roce is not None
        ctl.add_job(7, workers, slot_count=2)
        service.writes.clear()
        installed = ctl.roce.install(7, [w.ip for w in workers], endpoints, msg_packets=1)
        _check("roce_install_tna", service.writes)
        assert installed.switch_qpns == ((ROCE_QPN_BASE, ROCE_QPN_BASE + 1),
                                         (ROCE_QPN_BASE + 2, ROCE_QPN_BASE + 3))  # fmt: skip
        assert [(e.rank, e.position, e.qpn) for e in ctl.roce.read_replies(7)] == [
            (0, 0, 0x100), (0, 1, 0x101), (1, 0, 0x102), (1, 1, 0x103),
        ]  # fmt: skip
        assert ctl.registers.read("Egress.roce.reply_psn", [0, 1, 3]) == [7, 8, 8]
        assert ctl.roce.msg_packets(7) == 1
        ctl.remove_job(7)
        assert ctl.roce.read_requests() == [] and ctl.roce.msg_packets(7) is None
        assert pipeline.jobs() == []


SHARING_TABLES = ("Ingress.sharing.shared", "Ingress.sharing.fallback", "Ingress.sharing.behind")


def test_the_tofino_path_installs_a_shared_job_its_fallback_and_a_job_behind(
    served: tuple[RecordingService, str, Pipeline],
) -> None:
    # p4/tna/sharing.p4 declares p4/sharing.p4's tables and actions under the same names
    # and ids, its counters and owner register under the same names: the one controller
    # installs sharing through the TNA P4Info, unchanged.
    service, address, pipeline = served
    tna, v1 = P4Info.load(TNA_P4INFO_PATH), P4Info.load(DEFAULT_P4INFO_PATH)
    for name in SHARING_TABLES:
        assert tna.table(name).id == v1.table(name).id
    workers = [
        WorkerAddress("10.0.0.1", 40001, "02:00:00:00:00:01", 1),
        WorkerAddress("10.0.0.2", 40002, "02:00:00:00:00:02", 2),
    ]
    fallback = WorkerAddress("10.0.0.9", 20033, "02:00:00:00:00:09", 5)
    front = WorkerAddress("10.0.0.254", 20033, "02:00:00:00:00:fe", 3)
    with SwitchController.connect(address) as ctl:
        assert is_tofino(ctl.p4info) and ctl.sharing is not None
        service.writes.clear()
        job = ctl.add_job(7, workers, slot_count=1, shared=2, region=2, fallback=fallback)
        ctl.add_behind(8, 2, 1, front)
        _check("sharing_install_tna", service.writes)
        # the region at the top of the 4-slot pool; job 8 behind, in the slot between
        assert job.shared == SharedEntry(7, 2, 2, 2, 0, 0)
        assert job.fallback == FallbackEntry(7, "10.0.0.9", 20033, "02:00:00:00:00:09", 5, 0)
        assert ctl.sharing.behind.read() == [8]
        assert [(j.job_id, j.slot_base) for j in pipeline.jobs()] == [(7, 0), (8, 1)]
        assert set(ctl.job_counters(7).values()) == {0}
        ctl.remove_job(7)
        ctl.remove_job(8)
        assert (ctl.sharing.shared.read(), ctl.sharing.fallback.read()) == ([], [])
        assert ctl.sharing.behind.read() == [] and pipeline.jobs() == []
