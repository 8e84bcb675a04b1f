"""INA over RoCEv2 in the soft switch (emulation/softswitch/roce.py): messages of UC
WRITEs aggregated slot by slot, replies as WRITEs with each worker's PSNs, and every
frame the switch refuses counted under its reason."""

from __future__ import annotations

import numpy as np
import pytest

from emulation.softswitch.pipeline import DropSimulator, JobConfig, Pipeline
from emulation.softswitch.roce import RoceFront, RoceSend
from emulation.softswitch.roce_tables import RoceReply, RoceRequest, RoceTableError
from hostlib import rocev2
from hostlib.protocol import ROCE_UDP_PORT, RoceOpcode
from hostlib.transport.rnic import EmulatedRnic

SWITCH = "10.0.0.100"
LANES = 64
M = 4  # packets per message
WINDOW = 3  # messages per worker
JOB = 9
IPS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


def switch_qpn(rank: int, position: int) -> int:
    return 0x800000 | rank << 16 | position


def worker_qpn(rank: int, position: int) -> int:
    return 0x100 + rank * 0x10 + position


class Worker:
    """What a worker's RNIC puts on the wire: messages of M packets, PSNs per queue pair."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ip = IPS[rank]
        self.psn = [1000 * rank + 7 * p for p in range(WINDOW)]

    def message(
        self, position: int, seq: int, values: np.ndarray, pool_set: int = 0, exponent: int = 0
    ) -> list[bytes]:
        lanes = values.astype(">i4").reshape(M, LANES)
        rkey = (0x8000 if pool_set else 0) | position * M
        va = rocev2.pack_request_va(seq, exponent)
        imm = rocev2.pack_imm(seq, exponent)
        out = []
        for k in range(M):
            psn = self.psn[position]
            self.psn[position] = rocev2.psn_add(psn, 1)
            op, qpn = rocev2.message_opcode(k, M), switch_qpn(self.rank, position)
            length = M * LANES * 4
            frame = rocev2.RoceFrame(op, qpn, psn, lanes[k].tobytes(), va, rkey, length, imm)
            out.append(rocev2.build_frame(frame, self.ip, SWITCH))
        return out


def front(drops: DropSimulator | None = None) -> RoceFront:
    pipe = Pipeline(lanes=LANES, slots=64, drops=drops)
    pipe.add_job(JobConfig(JOB, tuple((ip, ROCE_UDP_PORT) for ip in IPS), M * WINDOW))
    tables = pipe.roce
    tables.set_job(JOB, M)
    for rank in range(len(IPS)):
        for p in range(WINDOW):
            reg = rank * WINDOW + p
            tables.set_request(switch_qpn(rank, p), RoceRequest(JOB, rank, reg, IPS[rank]))
            reply = RoceReply(worker_qpn(rank, p), 0xABC0 + rank, 0x7F00_0000_0000 + p * 4096, reg)
            tables.set_reply(JOB, rank, p, reply)
            tables.set_reply_psn(reg, 50 * rank + p)
    return RoceFront(pipe, SWITCH)


def send(f: RoceFront, rank: int, frames: list[bytes]) -> list[RoceSend]:
    out: list[RoceSend] = []
    for data in frames:
        out += f.process(memoryview(data), (IPS[rank], ROCE_UDP_PORT))
    return out


def inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-(2**20), 2**20, M * LANES, dtype=np.int32) for _ in IPS]


def test_a_message_from_every_worker_comes_back_as_a_write_to_each() -> None:
    f, workers, xs = front(), [Worker(r) for r in range(3)], inputs(1)
    assert send(f, 0, workers[0].message(1, 5, xs[0], exponent=3)) == []
    assert send(f, 1, workers[1].message(1, 5, xs[1], exponent=-2)) == []
    sends = send(f, 2, workers[2].message(1, 5, xs[2], exponent=7))
    assert len(sends) == 3 * M
    total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
    for rank in range(3):
        mine = [s for s in sends if s.dest == (IPS[rank], ROCE_UDP_PORT)]
        frames = [rocev2.parse_frame(s.payload) for s in mine]
        assert [fr.opcode for fr in frames] == [rocev2.message_opcode(k, M) for k in range(M)]
        psns = [rocev2.reply_psn(50 * rank + 1, 5, k) for k in range(M)]
        assert [fr.psn for fr in frames] == psns
        assert {fr.dest_qp for fr in frames} == {worker_qpn(rank, 1)}
        first, last = frames[0], frames[-1]
        assert (first.va, first.rkey, first.dma_length) == (
            0x7F00_0000_1000,
            0xABC0 + rank,
            M * LANES * 4,
        )
        assert rocev2.split_imm(last.imm or 0) == (5, 7)
        got = np.frombuffer(b"".join(fr.payload for fr in frames), dtype=">i4")
        np.testing.assert_array_equal(got, total)
        assert all(rocev2.icrc_ok(SWITCH, IPS[rank], ROCE_UDP_PORT, s.payload) for s in mine)
    c = f.pipeline.counters()
    assert (c["received"], c["aggregated"], c["completed"], c["results_sent"]) == (12, 12, 4, 12)


def test_a_resent_message_counts_once_and_a_finished_one_is_answered_to_its_sender() -> None:
    f, workers, xs = front(), [Worker(r) for r in range(3)], inputs(2)
    first = workers[0].message(0, 9, xs[0])
    send(f, 0, first)
    assert send(f, 0, workers[0].message(0, 9, xs[0])) == []  # a timeout's whole message
    assert f.pipeline.counters()["duplicates_ignored"] == M
    send(f, 1, workers[1].message(0, 9, xs[1]))
    assert len(send(f, 2, workers[2].message(0, 9, xs[2]))) == 3 * M
    answers = send(f, 1, workers[1].message(0, 9, xs[1]))  # rank 1 lost its replies
    assert {a.dest for a in answers} == {(IPS[1], ROCE_UDP_PORT)}
    frames = [rocev2.parse_frame(a.payload) for a in answers]
    assert [fr.psn for fr in frames] == [rocev2.reply_psn(50, 9, k) for k in range(M)]  # again
    got = np.frombuffer(b"".join(fr.payload for fr in frames), dtype=">i4")
    np.testing.assert_array_equal(got, np.sum(xs, axis=0, dtype=np.int64).astype(np.int32))
    assert f.pipeline.counters()["retransmits_answered"] == M


def test_a_psn_gap_drops_the_rest_of_the_message_until_the_next_first() -> None:
    f, w, xs = front(), Worker(0), inputs(3)
    frames = w.message(2, 4, xs[0])
    send(f, 0, [frames[0], frames[2], frames[3]])  # the middle packet 1 was lost
    c = f.pipeline.counters()
    assert (c["aggregated"], c["drop_bad_psn"]) == (1, 2)
    send(f, 0, w.message(2, 4, xs[0]))  # the whole message again
    c = f.pipeline.counters()
    assert (c["aggregated"], c["duplicates_ignored"]) == (M, 1)


def _one(f: RoceFront, data: bytes, src: str = IPS[0]) -> dict[str, int]:
    assert f.process(memoryview(data), (src, ROCE_UDP_PORT)) == []
    return {k: v for k, v in f.pipeline.counters().items() if v and k.startswith("drop_")}


def test_each_refused_frame_is_counted_under_its_reason() -> None:
    f, w = front(), Worker(0)
    good = w.message(0, 1, inputs(4)[0])[0]
    assert _one(f, good[:10]) == {"drop_truncated": 1}
    assert _one(front(), bytes([0x04]) + good[1:]) == {"drop_malformed": 1}
    bad_crc = good[:-1] + bytes([good[-1] ^ 1])
    assert _one(front(), bad_crc) == {"drop_bad_icrc": 1}
    assert _one(front(), good, src=IPS[1]) == {"drop_bad_icrc": 1}  # the ICRC covers it

    def frame(**change: int) -> bytes:
        base = rocev2.parse_frame(good)
        fields = {s: getattr(base, s) for s in base.__slots__} | change
        return rocev2.build_frame(rocev2.RoceFrame(**fields), IPS[0], SWITCH)

    assert _one(front(), frame(dest_qp=0x123)) == {"drop_unknown_qp": 1}
    assert _one(front(), frame(rkey=0x10000)) == {"drop_malformed": 1}
    assert _one(front(), frame(rkey=1)) == {"drop_bad_slot": 1}
    assert _one(front(), frame(dma_length=LANES * 4)) == {"drop_bad_length": 1}
    short = rocev2.build_frame(rocev2.RoceFrame(**{s: getattr(rocev2.parse_frame(good), s)
                               for s in rocev2.RoceFrame.__slots__} | {"payload": b"\0" * 8}),
                               IPS[0], SWITCH)  # fmt: skip
    assert _one(front(), short) == {"drop_bad_length": 1}
    stranger = rocev2.build_frame(rocev2.parse_frame(good), "10.0.0.77", SWITCH)
    assert _one(front(), stranger, src="10.0.0.77") == {"drop_bad_source": 1}
    middle = w.message(0, 1, inputs(4)[0])[1]
    assert _one(front(), middle) == {"drop_bad_psn": 1}  # no open message


def test_an_egress_drop_leaves_a_gap_in_the_psns() -> None:
    f = front(DropSimulator(egress=0.5, seed=3))
    workers, xs = [Worker(r) for r in range(3)], inputs(5)
    for r in range(3):
        sends = send(f, r, workers[r].message(0, 1, xs[r]))
    c = f.pipeline.counters()
    assert c["drop_sim_egress"] + c["results_sent"] == 3 * M
    assert 0 < c["drop_sim_egress"] < 3 * M
    psns = sorted(rocev2.parse_frame(s.payload).psn for s in sends if s.dest[0] == IPS[0])
    sent = [rocev2.reply_psn(0, 1, k) for k in range(M)]
    assert set(psns) <= set(sent) and (len(psns) < M or psns == sent)
    assert f.tables.reply_psn[0] == 0  # rank 0, position 0: the base, only read


def test_multi_packet_messages_need_packets_of_a_path_mtu_and_a_power_of_two() -> None:
    tables = Pipeline(lanes=28, slots=64).roce
    tables.set_job(1, 1)  # the Tofino program's 28 lanes: one packet per message
    with pytest.raises(RoceTableError, match="path MTU"):
        tables.set_job(1, 2)
    with pytest.raises(RoceTableError, match="power of two"):
        Pipeline(lanes=64, slots=64).roce.set_job(1, 3)
    with pytest.raises(RoceTableError, match="24 bits"):
        tables.set_request(1 << 24, RoceRequest(1, 0, 0, "10.0.0.1"))
    with pytest.raises(RoceTableError, match="register index"):
        tables.set_reply(1, 0, 0, RoceReply(1, 1, 1, 1 << 20))
    with pytest.raises(RoceTableError, match="PSN"):
        tables.set_reply_psn(0, 1 << 24)


def test_every_opcode_of_a_reply_parses_in_scapy() -> None:
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.packet import Raw

    f, workers, xs = front(), [Worker(r) for r in range(3)], inputs(6)
    sends = [s for r in range(3) for s in send(f, r, workers[r].message(0, 2, xs[r]))]
    seen = set()
    for s in sends:
        udp = UDP(sport=ROCE_UDP_PORT, dport=ROCE_UDP_PORT)
        pkt = IP(bytes(IP(src=SWITCH, dst=s.dest[0], id=0, flags="DF") / udp / Raw(s.payload)))
        seen.add(RoceOpcode(pkt[BTH].opcode))
    assert seen == {RoceOpcode.UC_WRITE_FIRST, RoceOpcode.UC_WRITE_MIDDLE,
                    RoceOpcode.UC_WRITE_LAST_IMM}  # fmt: skip


def test_a_resent_answer_interleaved_with_the_first_never_completes_misplaced() -> None:
    """CI's stop 48 failure: rank 0 resent its message while rank 1's resend completed
    the message's last slots, so rank 0's queue pair got FIRST (resent), MIDDLE 2 (first
    answer), MIDDLE 1 (resent), LAST (first answer). With PSNs taken in turn that was a
    message of the right length with places 1 and 2 swapped; with each packet's PSN fixed
    by its message and place, the RNIC drops it and rank 0's next resend completes."""
    f, workers, xs = front(), [Worker(r) for r in range(3)], inputs(8)
    with EmulatedRnic("127.0.0.61", pmtu=LANES * 4) as nic:
        nic.check_icrc = False  # the switch's frames are addressed to IPS[0]
        qp, mr = nic.create_qp(), nic.register(WINDOW * M * LANES * 4)
        nic.connect(qp, SWITCH, switch_qpn(0, 0), 0)
        f.tables.set_reply(JOB, 0, 0, RoceReply(qp.qpn, mr.rkey, mr.va, 0))
        to_rank0: list[RoceSend] = []

        def go(rank: int, frames: list[bytes]) -> None:
            to_rank0.extend(s for s in send(f, rank, frames) if s.dest[0] == IPS[0])

        go(0, workers[0].message(0, 3, xs[0]))
        go(2, workers[2].message(0, 3, xs[2]))
        go(1, workers[1].message(0, 3, xs[1])[:2])  # rank 1's packets 2 and 3 lost
        again0, again1 = workers[0].message(0, 3, xs[0]), workers[1].message(0, 3, xs[1])
        for rank, frame in [(0, again0[0]), (1, again1[0]), (1, again1[1]), (1, again1[2]),
                            (0, again0[1]), (1, again1[3])]:  # fmt: skip
            go(rank, [frame])
        places = [rocev2.parse_frame(s.payload).psn for s in to_rank0]
        assert places == [rocev2.reply_psn(0, 3, k) for k in (0, 1, 0, 2, 1, 3)]
        for s in to_rank0:
            nic.on_frame(memoryview(s.payload), (SWITCH, ROCE_UDP_PORT))
        assert nic.poll(0) == []  # was a completion with places 1 and 2 swapped
        go(0, workers[0].message(0, 3, xs[0]))  # rank 0's next timeout
        for s in to_rank0[6:]:
            nic.on_frame(memoryview(s.payload), (SWITCH, ROCE_UDP_PORT))
        assert len(nic.poll(0)) == 1
        total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
        got = np.frombuffer(mr.read(0, M * LANES * 4), dtype=">i4")
        np.testing.assert_array_equal(got, total)
