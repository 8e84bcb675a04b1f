"""The eBPF data plane's RoCEv2 part in the kernel: table writes that land in its maps,
and frames run through the program (the kernel's test runner) whose replies carry the
sum and an ICRC a receiver accepts. The RoCEv2 vectors (tests/dataplane) run it on
ports; these hold the control plane's side and the program's arithmetic.
Marked ``ebpf`` (root, clang, libbpf).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pytest

from emulation.softswitch.dataplane_types import RegisterCell
from emulation.softswitch.ebpf import layout
from emulation.softswitch.ebpf.dataplane import EbpfDataplane
from emulation.softswitch.ebpf.layout import be32_ip
from emulation.softswitch.ebpf.microbench import measure_program
from emulation.softswitch.pipeline import JobTableError
from emulation.softswitch.roce_tables import RoceReply, RoceRequest

pytestmark = [pytest.mark.ebpf, pytest.mark.root]

U32 = ctypes.c_uint32


@pytest.fixture
def dp() -> Iterator[EbpfDataplane]:
    plane = EbpfDataplane(64, 8, roce=True)  # 256 B: a path MTU, so messages may span packets
    try:
        yield plane
    finally:
        plane.close()


def _lookup(plane: EbpfDataplane, name: str, key: Any, value: Any) -> bool:
    """Whether map ``name`` holds ``key``; its value read into ``value``."""
    return plane.object.map(name, ctypes.sizeof(key), ctypes.sizeof(value)).lookup(key, value)


def test_roce_table_writes_land_in_the_maps(dp: EbpfDataplane) -> None:
    dp.roce.set_job(3, 4)
    shift = U32()
    assert _lookup(dp, "roce_jobs", U32(3), shift) and shift.value == 2
    dp.register_write(RegisterCell("roce_open", 5), 1)
    dp.roce.set_request(0x800005, RoceRequest(3, 1, 5, "10.0.0.7"))
    request = layout.InaRoceRequest()
    assert _lookup(dp, "roce_requests", U32(0x800005), request)
    assert (request.job, request.rank, request.qp_reg) == (3, 1, 5)
    assert request.ip == be32_ip("10.0.0.7")
    assert dp.register_read([RegisterCell("roce_open", 5)]) == [0]  # a new queue pair: closed
    dp.roce.set_reply(3, 1, 2, RoceReply(0x1234, 0xA001, 1 << 40, 6))
    reply = layout.InaRoceReply()
    assert _lookup(dp, "roce_replies", layout.InaRoceReplyKey(job=3, rank=1, position=2), reply)
    assert (reply.qpn, reply.rkey, reply.va, reply.psn_reg) == (0x1234, 0xA001, 1 << 40, 6)
    dp.roce.remove_job(3)
    assert not _lookup(dp, "roce_jobs", U32(3), shift)
    assert not _lookup(dp, "roce_requests", U32(0x800005), request)


def test_queue_pair_registers_read_back_and_refuse_an_index_out_of_range(
    dp: EbpfDataplane,
) -> None:
    dp.register_write(RegisterCell("roce_reply_psn", 7), 0xABCDEF)
    dp.register_write(RegisterCell("roce_exponent", 7), -5)
    cells = [RegisterCell("roce_reply_psn", 7), RegisterCell("roce_exponent", 7)]
    assert dp.register_read(cells) == [0xABCDEF, -5]
    with pytest.raises(JobTableError, match="register index"):
        dp.register_read([RegisterCell("roce_place", dp.roce.registers)])
    dp.reset()
    assert dp.register_read(cells) == [0, 0]


def test_roce_refuses_more_lanes_than_a_roce_packet_holds() -> None:
    with pytest.raises(ValueError, match="4096 B"):
        EbpfDataplane(2048, 8, roce=True)


@pytest.mark.parametrize("lanes", [1, 64, 896])
def test_the_program_answers_roce_frames_with_the_sum_and_a_good_icrc(lanes: int) -> None:
    # measure_program checks every completed slot's last reply: lanes and ICRC.
    result = measure_program(3, lanes, 4, 48, 30, "roce")
    assert result["ebpf_program_packets"] == 48
    assert result["ebpf_program_framing"] == "roce"
