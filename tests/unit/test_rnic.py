"""The emulated RNIC's UC responder (hostlib.transport.rnic): what it writes, completes,
and refuses, fed frames by hand; and its own frames, checked by scapy."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

from hostlib import rocev2
from hostlib.protocol import ROCE_UDP_PORT, RoceOpcode
from hostlib.transport.base import TransportError
from hostlib.transport.rnic import EmulatedRnic, QueuePair

ME, PEER, PEER_QPN = "127.0.0.41", "127.0.0.42", 0x123456


@pytest.fixture
def nic() -> Iterator[EmulatedRnic]:
    with EmulatedRnic(ME, pmtu=256, seed=1) as n:
        yield n


def _connected(nic: EmulatedRnic, recv_psn: int = 100) -> QueuePair:
    qp = nic.create_qp()
    nic.connect(qp, PEER, PEER_QPN, recv_psn)
    return qp


def _message(qp: QueuePair, va: int, rkey: int, data: bytes, psn: int, imm: int = 7) -> list[bytes]:
    n = max(1, -(-len(data) // 256))
    frames = []
    for k in range(n):
        f = rocev2.RoceFrame(rocev2.message_opcode(k, n), qp.qpn, rocev2.psn_add(psn, k),
                             data[k * 256 : (k + 1) * 256], va, rkey, len(data), imm)  # fmt: skip
        frames.append(rocev2.build_frame(f, PEER, ME))
    return frames


def _feed(nic: EmulatedRnic, frames: list[bytes], src: str = PEER) -> None:
    for f in frames:
        nic.on_frame(memoryview(f), (src, ROCE_UDP_PORT))


def _refused(nic: EmulatedRnic) -> dict[str, int]:
    skip = {"frames_in", "frames_out", "completions"}
    return {k: v for k, v in nic.counters.items() if v and k not in skip}


def test_a_message_lands_in_the_region_and_completes_with_its_immediate(nic: EmulatedRnic) -> None:
    qp, mr = _connected(nic), nic.register(4096)
    data = bytes(range(256)) * 3
    _feed(nic, _message(qp, mr.va + 512, mr.rkey, data, 100, imm=0xABCDEF01))
    assert nic.poll(0) == [(qp.qpn, 0xABCDEF01, len(data))]
    assert mr.buf[512 : 512 + len(data)] == data and qp.recv_psn == 103
    assert _refused(nic) == {}


def test_a_lost_packet_drops_the_rest_of_its_message_and_the_next_first_resyncs(
    nic: EmulatedRnic,
) -> None:
    qp, mr = _connected(nic), nic.register(4096)
    frames = _message(qp, mr.va, mr.rkey, bytes(1024), 100)
    _feed(nic, [frames[0], frames[2], frames[3]])  # PSN 101 lost
    assert nic.poll(0) == [] and _refused(nic) == {"psn_gap": 2}
    _feed(nic, _message(qp, mr.va, mr.rkey, bytes(1024), 104))  # the resend, next PSNs
    assert len(nic.poll(0)) == 1
    _feed(nic, frames[1:])  # the old PSNs' MIDDLE and LAST alone: behind, dropped
    assert nic.poll(0) == [] and _refused(nic) == {"psn_gap": 2, "duplicate": 3}
    _feed(nic, frames)  # the old message whole: UC takes a FIRST at any PSN (rxe does)
    assert len(nic.poll(0)) == 1 and qp.recv_psn == 104


def test_a_first_behind_restarts_the_message_and_packets_out_of_place_are_dropped(
    nic: EmulatedRnic,
) -> None:
    qp, mr = _connected(nic), nic.register(4096)
    frames = _message(qp, mr.va, mr.rkey, bytes(1024), 100)
    _feed(nic, [frames[0], frames[1], frames[0], frames[2], frames[1], frames[3]])
    assert nic.poll(0) == [] and _refused(nic) == {"psn_gap": 2, "duplicate": 1}


def test_each_refused_frame_is_counted(nic: EmulatedRnic) -> None:
    qp, mr = _connected(nic), nic.register(1024)
    good = _message(qp, mr.va, mr.rkey, bytes(512), 100)
    _feed(nic, [good[0][:-1] + bytes([good[0][-1] ^ 1])])
    _feed(nic, good[:1], src="127.0.0.43")  # the ICRC covers the source: bad ICRC too
    assert _refused(nic) == {"bad_icrc": 2}
    stranger = rocev2.build_frame(rocev2.parse_frame(good[0]), "127.0.0.43", ME)
    _feed(nic, [stranger], src="127.0.0.43")
    assert _refused(nic)["bad_source"] == 1
    _feed(nic, _message(qp, mr.va + 768, mr.rkey, bytes(512), 100))  # past the region
    _feed(nic, _message(qp, mr.va, mr.rkey ^ 1, bytes(512), 102))  # unknown R_Key
    # each message's LAST then finds no message open
    assert _refused(nic) == {"bad_icrc": 2, "bad_source": 1, "bad_rkey": 2, "out_of_message": 2}
    other = QueuePair(0x777, 0)
    _feed(nic, _message(other, mr.va, mr.rkey, bytes(256), 0))
    assert _refused(nic)["unknown_qp"] == 1
    middle = rocev2.RoceFrame(RoceOpcode.UC_WRITE_MIDDLE, qp.qpn, 104, bytes(256))
    _feed(nic, [rocev2.build_frame(middle, PEER, ME)])
    assert _refused(nic)["out_of_message"] == 3
    short = rocev2.RoceFrame(RoceOpcode.UC_WRITE_ONLY_IMM, qp.qpn, 105, bytes(256), mr.va,
                             mr.rkey, 512, 1)  # fmt: skip
    _feed(nic, [rocev2.build_frame(short, PEER, ME)])
    assert _refused(nic)["bad_length"] == 1 and nic.poll(0) == []


def test_its_frames_on_the_wire_are_roce_by_scapy(nic: EmulatedRnic) -> None:
    qp = _connected(nic)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind((PEER, ROCE_UDP_PORT))
        peer.settimeout(2)
        start = qp.send_psn
        nic.post_write(qp, bytes(range(256)) * 3, va=0x1000, rkey=0x8004, imm=42)
        got = [peer.recvfrom(4096) for _ in range(3)]
    ops = []
    for k, (data, src) in enumerate(got):
        assert src == (ME, ROCE_UDP_PORT)
        udp = UDP(sport=ROCE_UDP_PORT, dport=ROCE_UDP_PORT)
        pkt = IP(bytes(IP(src=ME, dst=PEER, id=0, flags="DF") / udp / Raw(data)))
        bth = pkt[BTH]
        assert (bth.dqpn, bth.psn) == (PEER_QPN, rocev2.psn_add(start, k))
        rebuilt = IP(src=ME, dst=PEER, id=0, flags="DF") / udp / BTH(
            opcode=bth.opcode, dqpn=bth.dqpn, psn=bth.psn) / Raw(data[12:-4])  # fmt: skip
        assert bytes(rebuilt)[-4:] == data[-4:]  # scapy's ICRC
        ops.append(RoceOpcode(bth.opcode))
    assert ops == [RoceOpcode.UC_WRITE_FIRST, RoceOpcode.UC_WRITE_MIDDLE,
                   RoceOpcode.UC_WRITE_LAST_IMM]  # fmt: skip
    first = rocev2.parse_frame(got[0][0])
    assert (first.va, first.rkey, first.dma_length) == (0x1000, 0x8004, 768)


def test_bad_setup_is_one_clear_error(nic: EmulatedRnic) -> None:
    with pytest.raises(ValueError, match="path MTU"):
        EmulatedRnic("127.0.0.44", pmtu=300)
    with pytest.raises(TransportError, match="not connected"):
        nic.post_write(nic.create_qp(), b"x" * 4, 0, 0, None)
    with pytest.raises(ValueError, match="24 bits"):
        nic.connect(nic.create_qp(), PEER, 1 << 24, 0)
