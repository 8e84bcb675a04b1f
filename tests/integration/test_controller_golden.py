"""The writes a whole-job operation sends, pinned as golden text protos.

:class:`SwitchController` drives a real in-process P4Runtime server (the soft switch's,
over gRPC on port 0) that records every WriteRequest; the sequence for installing and
removing a two-worker job must equal tests/golden/add_job.txtpb and remove_job.txtpb
(the order matters: the jobs entry is written last and deleted first), with the Python
pipeline and with the eBPF data plane behind the server (whose maps must then hold the
job: marked ``ebpf``). A leaf's job
installed with ``upstream=`` writes the upstream entry after the workers and before the
jobs entry (which turns the job on), and ``remove_job`` deletes it right after the jobs
entry: add_job_upstream.txtpb and remove_job_upstream.txtpb. Set INALAB_REGEN_GOLDEN=1
to rewrite the files after an intended change, and review the diff.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from p4.v1 import p4runtime_pb2

from controller.p4info import P4Info
from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch.p4runtime import SoftSwitchP4Runtime, serve_p4runtime, softswitch_p4info
from emulation.softswitch.pipeline import Pipeline

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
_SEPARATOR = "# ---- next WriteRequest\n"


class RecordingService(SoftSwitchP4Runtime):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[Any] = []

    def Write(self, request: Any, context: Any) -> Any:
        self.writes.append(request)
        return super().Write(request, context)


@pytest.fixture(params=["python", pytest.param("ebpf", marks=[pytest.mark.ebpf, pytest.mark.root])])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[RecordingService, str, Pipeline]]:
    if request.param == "ebpf":
        from emulation.softswitch.ebpf.dataplane import EbpfDataplane

        pipeline: Pipeline = EbpfDataplane(lanes=2, slots=4)
    else:
        pipeline = Pipeline(lanes=2, slots=4)
    service = RecordingService(pipeline, softswitch_p4info(P4Info.load(), 2, 4))
    server, port = serve_p4runtime(service, "127.0.0.1:0")
    try:
        yield service, f"127.0.0.1:{port}", pipeline
    finally:
        server.stop(grace=None).wait()
        if request.param == "ebpf":
            pipeline.close()  # type: ignore[attr-defined]


def _check(name: str, writes: list[Any]) -> None:
    text = _SEPARATOR.join(text_format.MessageToString(w) for w in writes)
    path = GOLDEN / f"{name}.txtpb"
    if os.environ.get("INALAB_REGEN_GOLDEN"):
        header = (
            "# proto-file: p4/v1/p4runtime.proto\n# proto-message: p4.v1.WriteRequest\n"
            f"# The WriteRequests of SwitchController.{name}, in order "
            "(tests/integration/test_controller_golden.py).\n"
        )
        path.write_text(header + text)
    expected = [
        text_format.Parse(part, p4runtime_pb2.WriteRequest())
        for part in path.read_text().split(_SEPARATOR)
    ]
    assert [text_format.MessageToString(m) for m in expected] == text.split(_SEPARATOR)
    assert expected == writes


def test_add_and_remove_job_send_the_golden_writes(
    served: tuple[RecordingService, str, Pipeline],
) -> None:
    service, address, pipeline = served
    workers = [
        WorkerAddress("10.0.0.1", 40001, "02:00:00:00:00:01", 1),
        WorkerAddress("10.0.0.2", 40002, "02:00:00:00:00:02", 2),
    ]
    with SwitchController.connect(address) as ctl:
        ctl.add_job(7, workers, slot_count=2, slot_base=1)
        _check("add_job", service.writes)
        assert [j.job_id for j in pipeline.jobs()] == [7]
        assert _map_jobs(pipeline) in ({7}, None)  # the eBPF maps hold it too
        service.writes.clear()
        ctl.remove_job(7)
        _check("remove_job", service.writes)
        assert pipeline.jobs() == [] and _map_jobs(pipeline) in (set(), None)


def _map_jobs(pipeline: Pipeline) -> set[int] | None:
    """The job ids in the eBPF program's jobs map (None: the Python pipeline)."""
    maps = getattr(pipeline, "_maps", None)
    if maps is None:
        return None
    return {int(k.value) for k in maps["jobs"].keys(ctypes.c_uint32)}


def _tables(writes: list[Any]) -> list[tuple[str, int]]:
    """(table id or entity kind, update type) of every update, in order."""
    out = []
    for w in writes:
        for u in w.updates:
            which = u.entity.WhichOneof("entity")
            key = str(u.entity.table_entry.table_id) if which == "table_entry" else which
            out.append((key, u.type))
    return out


def test_a_leaf_job_writes_its_upstream_entry_before_the_job(
    served: tuple[RecordingService, str, Pipeline],
) -> None:
    service, address, pipeline = served
    workers = [
        WorkerAddress("10.0.0.1", 40001, "02:00:00:00:00:01", 1),
        WorkerAddress("10.0.0.2", 40002, "02:00:00:00:00:02", 2),
    ]
    spine = WorkerAddress("10.0.1.254", 20033, "02:00:00:00:01:fe", 3)
    with SwitchController.connect(address) as ctl:
        p4info = ctl.p4info
        upstream_id = str(p4info.table("Ingress.upstream.upstream").id)
        jobs_id = str(p4info.table("Ingress.jobs.jobs").id)
        ctl.add_job(7, workers, slot_count=2, slot_base=1, upstream=(1, spine))
        _check("add_job_upstream", service.writes)
        order = _tables(service.writes)
        insert = p4runtime_pb2.Update.INSERT
        assert order[-2:] == [(upstream_id, insert), (jobs_id, insert)]
        up = pipeline.upstream(7)
        assert up is not None
        assert (up.rank, up.addr, up.mac, up.port) == (1, ("10.0.1.254", 20033), 0x0200000001FE, 3)
        service.writes.clear()
        ctl.remove_job(7)
        _check("remove_job_upstream", service.writes)
        delete = p4runtime_pb2.Update.DELETE
        assert _tables(service.writes)[:2] == [(jobs_id, delete), (upstream_id, delete)]
        assert pipeline.upstream(7) is None
