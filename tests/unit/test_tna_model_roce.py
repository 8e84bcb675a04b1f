"""The TNA model's RoCEv2 (p4/tna/roce.p4, roce_replies.p4) where the data-plane vectors
do not reach: PSNs that wrap at 24 bits, a message longer than its job's, a resubmitted
first packet that must not step its queue pair twice, a reply table miss."""

from __future__ import annotations

import struct

from helpers import tna_frame

from emulation.tnamodel import TnaModel
from hostlib import rocev2
from hostlib.protocol import ROCE_PSN_SEQ_SHIFT, RoceOpcode

LANES = 4
JOB = 3
QP = 0x800000  # controller.roce.ROCE_QPN_BASE + register 0
SWITCH_IP = "10.0.0.254"


def _model(msg_packets: int = 2, workers: int = 1) -> TnaModel:
    """A job of ``workers`` RoCEv2 ranks (ports 1..), one window position of
    ``msg_packets`` slots; rank r's queue pair is register r."""
    model = TnaModel(lanes=LANES, slots=16)
    model.set_job(JOB, num_workers=workers, slot_base=0, slot_count=msg_packets, mgid=1)
    model.set_group(1, [(port, port - 1) for port in range(1, workers + 1)])
    model.set_roce_job(JOB, msg_packets.bit_length() - 1)
    for rank in range(workers):
        port = rank + 1
        ip, mac = f"10.0.0.{port}", f"02:00:00:00:00:{port:02x}"
        model.worker_hit(JOB, rank, ip, 4791)
        model.set_destination(JOB, rank, port, mac, ip, 4791)
        model.set_roce_qp(QP + rank, JOB, rank, rank, ip)
        model.set_roce_reply(JOB, rank, 0, 0x100 + port, 0xA000, 0x5000, rank)
    return model


def _frame(op: RoceOpcode, psn: int, msg_packets: int = 2, port: int = 1, seq: int = 1) -> bytes:
    """Port ``port``'s WRITE packet (lanes of 1) to the switch, as an RNIC sends it."""
    lanes = struct.pack(f"!{LANES}i", *([1] * LANES))
    body = rocev2.RoceFrame(op, QP + port - 1, psn, lanes, rocev2.pack_request_va(seq, 0), 0,
                            msg_packets * len(lanes), rocev2.pack_imm(seq, 0))  # fmt: skip
    payload = rocev2.build_frame(body, f"10.0.0.{port}", SWITCH_IP)
    return tna_frame(port, payload, udp=(4791, 4791), df=True)


def _replies(out: list[tuple[int, bytes]]) -> list[rocev2.RoceFrame]:
    return [rocev2.parse_frame(frame[42:]) for _, frame in out]


def test_psns_wrap_at_24_bits_both_ways() -> None:
    model = _model()  # one worker: each slot completes with its packet
    model.set_reply_psn(0, 0xFFFFFF - (1 << ROCE_PSN_SEQ_SHIFT))  # seq 1's places: FFFFFF, 0
    out = model.process(1, _frame(RoceOpcode.UC_WRITE_FIRST, 0xFFFFFF))
    out += model.process(1, _frame(RoceOpcode.UC_WRITE_LAST_IMM, 0))
    replies = _replies(out)
    assert [(r.opcode, r.psn, r.dest_qp) for r in replies] == [
        (RoceOpcode.UC_WRITE_FIRST, 0xFFFFFF, 0x101),
        (RoceOpcode.UC_WRITE_LAST_IMM, 0, 0x101),
    ]
    assert (replies[0].rkey, replies[0].va, replies[0].dma_length) == (0xA000, 0x5000, 32)
    assert replies[1].imm == rocev2.pack_imm(1, 0)
    assert all(r.icrc == 0 for r in replies)  # a P4 switch leaves the ICRC 0
    stats = model.statistics()
    assert (stats["aggregated"], stats["completed"], stats["drop_bad_psn"]) == (2, 2, 0)


def test_a_first_packet_takes_two_passes_and_steps_its_queue_pair_once() -> None:
    model = _model(workers=2)
    model.process(1, _frame(RoceOpcode.UC_WRITE_FIRST, 20))
    assert model.passes == ["ingress pass 1", "ingress pass 2"]  # the use's first packet
    model.process(1, _frame(RoceOpcode.UC_WRITE_LAST_IMM, 21))
    stats = model.statistics()
    assert (stats["aggregated"], stats["drop_bad_psn"]) == (2, 0)


def test_a_packet_past_its_message_is_bad_slot_and_a_gap_bad_psn() -> None:
    model = _model(workers=2)
    model.process(1, _frame(RoceOpcode.UC_WRITE_FIRST, 5))
    model.process(1, _frame(RoceOpcode.UC_WRITE_MIDDLE, 6))
    model.process(1, _frame(RoceOpcode.UC_WRITE_LAST_IMM, 7))  # a third packet of two
    assert model.statistics()["drop_bad_slot"] == 1
    assert model.statistics()["aggregated"] == 2
    model.process(1, _frame(RoceOpcode.UC_WRITE_FIRST, 8))
    model.process(1, _frame(RoceOpcode.UC_WRITE_LAST_IMM, 10))  # PSN 9 lost
    assert model.statistics()["drop_bad_psn"] == 1


def test_a_result_without_a_reply_entry_is_dropped_uncounted() -> None:
    model = _model()
    model.roce.tables.replies.clear()
    model.process(1, _frame(RoceOpcode.UC_WRITE_FIRST, 1))
    assert model.process(1, _frame(RoceOpcode.UC_WRITE_LAST_IMM, 2)) == []
    assert model.statistics()["completed"] == 2
    assert model.statistics()["results_sent"] == 0
