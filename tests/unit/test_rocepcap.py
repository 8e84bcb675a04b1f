"""``inalab pcap``: scapy's checks of a capture's RoCEv2 frames find what is wrong in it.

The captures are written here (pcap, Ethernet), from frames of :mod:`hostlib.rocev2`,
then read back through scapy as a tcpdump capture would be."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from emulation.bench import rocepcap
from hostlib import rocev2
from hostlib.protocol import ROCE_UDP_PORT, RoceOpcode

HOST, SWITCH = "10.0.0.1", "10.0.0.100"
QP = 0x800003


def _frame(op: RoceOpcode, psn: int, src: str = HOST, dst: str = SWITCH, *, rkey: int = 7,
           va: int = 0x1000, ident: int = 0, icrc: bytes | None = None) -> Ether:  # fmt: skip
    frame = rocev2.RoceFrame(op, dest_qp=QP, psn=psn, payload=bytes(range(64)) * 4, va=va,
                             rkey=rkey, dma_length=256, imm=5)  # fmt: skip
    body = rocev2.build_frame(frame, src, dst)
    if icrc is not None:
        body = body[:-4] + icrc
    return Ether() / IP(src=src, dst=dst, id=ident, flags="DF") / UDP(
        sport=ROCE_UDP_PORT, dport=ROCE_UDP_PORT) / Raw(body)  # fmt: skip


def _check(tmp_path: Path, frames: list[Ether], zero: tuple[str, ...] = ()) -> rocepcap.PcapCheck:
    path = tmp_path / "c.pcap"
    wrpcap(str(path), frames)
    return rocepcap.check_pcap(path, zero)


ONLY = RoceOpcode.UC_WRITE_ONLY_IMM


def test_a_clean_stream_passes_with_consecutive_psns(tmp_path: Path) -> None:
    check = _check(tmp_path, [_frame(ONLY, psn) for psn in range(5)])
    assert check.frames == 5 and check.problems == []
    stream = check.streams[(HOST, SWITCH, QP)]
    assert stream.consecutive and stream.rkeys == {7}
    assert check.psn_problems([HOST]) == []


def test_a_wrong_icrc_and_the_ip_id_the_icrc_assumed_are_caught(tmp_path: Path) -> None:
    check = _check(tmp_path, [_frame(ONLY, 0, icrc=b"\x01\x02\x03\x04"), _frame(ONLY, 1, ident=9)])
    assert len(check.problems) == 2 and all("scapy computes" in p for p in check.problems)


def test_a_p4_switch_s_zero_icrc_is_accepted_only_from_its_address(tmp_path: Path) -> None:
    frames = [_frame(ONLY, 0, SWITCH, HOST, icrc=bytes(4)), _frame(ONLY, 0, icrc=bytes(4))]
    check = _check(tmp_path, frames, zero=(SWITCH,))
    assert check.problems == [f"frame 2 ({HOST} -> {SWITCH}): ICRC 00000000, scapy computes "
                              f"{_frame(ONLY, 0)[Raw].load[-4:].hex()}"]  # fmt: skip


def test_lost_repeated_and_late_psns_are_counted(tmp_path: Path) -> None:
    check = _check(tmp_path, [_frame(ONLY, p) for p in (0, 1, 3, 3, 2, 6, 7)])
    s = check.streams[(HOST, SWITCH, QP)]
    assert (s.missing, s.repeats, s.late) == (2, 1, 1)  # 4, 5 lost; 3 twice; 2 late
    assert not s.consecutive and len(check.psn_problems([HOST])) == 1


def test_psns_wrap_at_24_bits(tmp_path: Path) -> None:
    psns = [p % (1 << 24) for p in range((1 << 24) - 2, (1 << 24) + 2)]
    check = _check(tmp_path, [_frame(ONLY, p) for p in psns])
    assert check.streams[(HOST, SWITCH, QP)].consecutive


def test_rkeys_and_addresses_per_stream(tmp_path: Path) -> None:
    check = _check(tmp_path, [_frame(ONLY, 0, va=0x1000), _frame(ONLY, 1, va=0x1100, rkey=8)])
    s = check.streams[(HOST, SWITCH, QP)]
    assert s.rkeys == {7, 8} and (s.va_low, s.va_high) == (0x1000, 0x1200)


def test_non_ina_opcodes_and_truncated_frames_are_problems(tmp_path: Path) -> None:
    good = _frame(ONLY, 0)
    short = good.copy()
    short[Raw].load = good[Raw].load[:20]
    rc = good.copy()
    rc[Raw].load = b"\x0a" + good[Raw].load[1:]  # RC WRITE ONLY
    check = _check(tmp_path, [short, rc, Ether() / IP() / UDP(dport=53) / Raw(b"x")])
    assert check.frames == 2 and len(check.problems) == 2, check.problems


def test_the_command_exits_1_on_a_problem_and_2_on_a_bad_file(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.pcap", tmp_path / "bad.pcap"
    wrpcap(str(good), [_frame(ONLY, p) for p in range(3)])
    wrpcap(str(bad), [_frame(ONLY, p) for p in (0, 2)])

    def inalab(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "emulation.cli", "pcap", *argv],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    ok = inalab(str(good), "--consecutive", HOST)
    assert ok.returncode == 0 and "3 RoCEv2 frames, 1 queue pairs, 0 problems" in ok.stdout
    assert inalab(str(bad), "--consecutive", HOST).returncode == 1
    assert inalab(str(bad)).returncode == 0  # a gap is a problem only on a sender's own link
    missing = inalab(str(tmp_path / "none.pcap"))
    assert missing.returncode == 2 and "inalab pcap: error:" in missing.stderr


@pytest.mark.parametrize("op", list(RoceOpcode))
def test_every_ina_opcode_passes(tmp_path: Path, op: RoceOpcode) -> None:
    assert _check(tmp_path, [_frame(op, 0)]).problems == []
