"""``inalab pcap FILE ...``: every RoCEv2 frame of a capture, checked by scapy's RoCE layer.

Emulation layer (bench), an independent reader of what the hosts and switches put on the
wire for INA over RoCEv2 (docs/protocol.md): the frames are parsed by
``scapy.contrib.roce`` (BTH) and their ICRC recomputed by scapy from the frame's own
IPv4 header, not by :mod:`hostlib.rocev2`, whose assumptions (IPv4 identification 0,
Don't Fragment) are thereby checked too. What a capture must show:

- every UDP 4791 frame parses as a BTH of an INA opcode (UC RDMA WRITE), with its RETH on
  a FIRST or ONLY and its immediate on a LAST or ONLY, and a length that fits;
- its ICRC is the one scapy computes, except from the addresses named ``zero_icrc``
  (a P4 switch, which neither computes nor checks it: p4/README.md), whose frames carry 0;
- each queue pair's stream (source, destination, destination QPN) has its PSNs
  accounted: a worker numbers its packets in turn, so on a capture where nothing was lost
  on the way (a sender's own link) they are consecutive, and elsewhere gaps (frames lost
  before the capture point), repeats (duplicated frames) and late frames (reordered) are
  counted, so a test can hold them to the switch's counters;
- a switch's reply carries the PSN its message and place fix (its queue pair's base +
  ``seq << ROCE_PSN_SEQ_SHIFT`` + place): re-sends repeat PSNs and messages jump, so what
  holds there is one base per stream, read off each LAST or ONLY (whose immediate names
  the message) as :attr:`Stream.bases`;
- each stream's messages name one R_Key, and their addresses (RETH VA) stay in one
  region: a worker registered one buffer per queue pair, and the switch writes there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hostlib.protocol import (
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_PSN_SEQ_SHIFT,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    RoceOpcode,
)
from hostlib.rocev2 import IMM_OPCODES, RETH, RETH_OPCODES

__all__ = ["PcapCheck", "PcapError", "Stream", "add_arguments", "check_frames", "check_pcap",
           "run"]  # fmt: skip

PROG = "inalab pcap"
_PSN_MOD = 1 << 24
_INA_OPCODES = frozenset(RoceOpcode)  # UC RDMA WRITE FIRST .. ONLY with immediate


class PcapError(Exception):
    """A capture cannot be read (not a pcap, or not there)."""


StreamKey = tuple[str, str, int]
"""A queue pair's stream: (source address, destination address, destination QPN)."""


@dataclass
class Stream:
    """One queue pair's frames in a capture, in capture order."""

    frames: int = 0
    first_psn: int = -1
    next_psn: int = -1  # the PSN after the highest one seen (unwrapped order)
    missing: int = 0  # PSNs skipped over: frames lost before the capture point
    repeats: int = 0  # a PSN seen before: a duplicated frame
    late: int = 0  # a PSN below the highest but not seen: a reordered frame
    rkeys: set[int] = field(default_factory=set)
    packets: int = 1  # packets per message, from a FIRST's DMA length
    va_low: int = 1 << 64
    va_high: int = 0  # one past the last byte of a message (VA + DMA length)
    _seen: set[int] = field(default_factory=set, repr=False)
    _lasts: set[tuple[int, int, bool]] = field(default_factory=set, repr=False)

    def take_last(self, psn: int, seq24: int, only: bool) -> None:
        """A LAST or ONLY with immediate: its PSN and the seq its immediate names."""
        self._lasts.add((psn, seq24, only))

    @property
    def bases(self) -> set[int]:
        """PSN - (seq << ROCE_PSN_SEQ_SHIFT) - place of each LAST or ONLY: one value on a
        switch's reply stream (docs/protocol.md); a worker's numbers its packets in turn."""
        return {
            (psn - (seq24 << ROCE_PSN_SEQ_SHIFT) - (0 if only else self.packets - 1)) % _PSN_MOD
            for psn, seq24, only in self._lasts
        }

    def take(self, psn: int) -> None:
        """Account for a frame's PSN: in order, ahead (a gap), repeated or late."""
        self.frames += 1
        if self.first_psn < 0:
            self.first_psn, self.next_psn = psn, (psn + 1) % _PSN_MOD
        elif psn in self._seen:
            self.repeats += 1
        elif (psn - self.next_psn) % _PSN_MOD < _PSN_MOD // 2:  # at or ahead of next
            self.missing += (psn - self.next_psn) % _PSN_MOD
            self.next_psn = (psn + 1) % _PSN_MOD
        else:  # behind the highest and new: it fills a gap counted as missing
            self.late += 1
            self.missing -= 1
        self._seen.add(psn)

    @property
    def consecutive(self) -> bool:
        """Every PSN once, in order, none skipped."""
        return self.missing == 0 and self.repeats == 0 and self.late == 0


@dataclass
class PcapCheck:
    """What a capture showed: its RoCEv2 frames, streams, and each frame that broke a rule.

    Attributes:
        frames: RoCEv2 frames (UDP 4791) read.
        streams: each queue pair's stream by (source, destination, destination QPN).
        problems: one line per frame that broke a rule (its number in the capture, from 1).
    """

    frames: int = 0
    streams: dict[StreamKey, Stream] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def streams_from(self, address: str) -> dict[StreamKey, Stream]:
        """The streams an address sent."""
        return {k: s for k, s in self.streams.items() if k[0] == address}

    def psn_problems(self, senders: Iterable[str]) -> list[str]:
        """The streams of ``senders`` (captured on their own links) whose PSNs were not
        consecutive."""
        return [
            f"{src} -> {dst} QP {qpn:#x}: {s.missing} missing, {s.repeats} repeated, {s.late} late"
            for sender in senders
            for (src, dst, qpn), s in self.streams_from(sender).items()
            if not s.consecutive
        ]


def check_frames(packets: Iterable[object], zero_icrc: Iterable[str] = ()) -> PcapCheck:
    """Check scapy packets (as ``rdpcap`` reads them) against the rules above.

    Args:
        packets: scapy packets; those that are not IPv4/UDP to port 4791 are skipped.
        zero_icrc: addresses whose frames carry ICRC 0 (P4 switches) instead of scapy's.
    """
    from scapy.layers.inet import IP, UDP

    zero = set(zero_icrc)
    check = PcapCheck()
    for number, pkt in enumerate(packets, 1):
        if IP not in pkt or UDP not in pkt or pkt[UDP].dport != ROCE_UDP_PORT:  # type: ignore[operator,index]
            continue
        check.frames += 1
        _check_one(pkt, number, zero, check)
    return check


def _check_one(pkt: object, number: int, zero: set[str], check: PcapCheck) -> None:
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP

    ip = pkt[IP]  # type: ignore[index]
    where = f"frame {number} ({ip.src} -> {ip.dst})"
    if BTH not in pkt:  # type: ignore[operator]
        check.problems.append(f"{where}: no BTH (scapy)")
        return
    body = bytes(pkt[UDP].payload)  # type: ignore[index]
    bth = pkt[BTH]  # type: ignore[index]
    problem = _frame_problem(bth.opcode, body)
    if problem is None:
        problem = _icrc_problem(bth, body, ip.src in zero)
    if problem is not None:
        check.problems.append(f"{where}: {problem}")
        return
    stream = check.streams.setdefault((ip.src, ip.dst, bth.dqpn), Stream())
    stream.take(bth.psn)
    if bth.opcode in RETH_OPCODES:
        va, rkey, length = RETH.unpack_from(body, ROCE_BTH_SIZE)
        stream.rkeys.add(rkey)
        stream.va_low = min(stream.va_low, va)
        stream.va_high = max(stream.va_high, va + length)
        payload = len(body) - _header_bytes(bth.opcode) - ROCE_ICRC_SIZE
        stream.packets = max(1, length // payload) if payload > 0 else 1
    if bth.opcode in IMM_OPCODES:
        imm = int.from_bytes(body[_header_bytes(bth.opcode) - ROCE_IMMDT_SIZE :][:4], "big")
        stream.take_last(bth.psn, imm >> 8, only=bth.opcode == RoceOpcode.UC_WRITE_ONLY_IMM)


def _header_bytes(opcode: int) -> int:
    """BTH and the opcode's RETH and ImmDt: where the lanes start."""
    extensions = ROCE_RETH_SIZE * (opcode in RETH_OPCODES)
    return ROCE_BTH_SIZE + extensions + ROCE_IMMDT_SIZE * (opcode in IMM_OPCODES)


def _frame_problem(opcode: int, body: bytes) -> str | None:
    """What is wrong with a frame's opcode and length, if anything."""
    if opcode not in _INA_OPCODES:
        return f"opcode {opcode:#x} is not a UC RDMA WRITE"
    headers = _header_bytes(opcode) + ROCE_ICRC_SIZE
    if len(body) < headers or (len(body) - headers) % 4:
        return f"{len(body)} bytes: not BTH, its extensions, whole lanes and an ICRC"
    return None


def _icrc_problem(bth: object, body: bytes, zero: bool) -> str | None:
    """Whether the trailer is scapy's ICRC (or 0 from a P4 switch)."""
    got = body[-ROCE_ICRC_SIZE:]
    if zero:
        return None if got == bytes(ROCE_ICRC_SIZE) else f"ICRC {got.hex()}, not 0 (P4 switch)"
    want = bth.compute_icrc(b"")  # type: ignore[attr-defined]
    return None if got == want else f"ICRC {got.hex()}, scapy computes {want.hex()}"


def check_pcap(path: Path, zero_icrc: Iterable[str] = ()) -> PcapCheck:
    """Read a capture (pcap, any link type scapy reads) and check its RoCEv2 frames.

    Raises:
        PcapError: the file is missing or not a capture.
    """
    # Bound before reading: BTH to UDP 4791, and Ethernet and Linux cooked link types.
    import scapy.contrib.roce
    import scapy.layers.l2  # noqa: F401
    from scapy.error import Scapy_Exception
    from scapy.utils import rdpcap

    try:
        packets = rdpcap(str(path))
    except (OSError, Scapy_Exception, EOFError) as exc:
        raise PcapError(f"{path}: {exc}") from exc
    return check_frames(packets, zero_icrc)


def format_check(name: str, check: PcapCheck) -> list[str]:
    """A capture's summary: one line per stream, then its problems."""
    lines = [f"{name}: {check.frames} RoCEv2 frames, {len(check.streams)} queue pairs, "
             f"{len(check.problems)} problems"]  # fmt: skip
    for (src, dst, qpn), s in sorted(check.streams.items()):
        rkeys = ",".join(f"{k:#x}" for k in sorted(s.rkeys)) or "-"
        lines.append(f"  {src:>15} -> {dst:<15} QP {qpn:#08x}  {s.frames:>6} frames  PSN "
                     f"{s.first_psn}..{(s.next_psn - 1) % _PSN_MOD}  missing {s.missing} "
                     f"repeated {s.repeats} late {s.late}  rkey {rkeys}  "
                     f"bases {len(s.bases)}")  # fmt: skip
    lines += [f"  {p}" for p in check.problems[:20]]
    if len(check.problems) > 20:
        lines.append(f"  ... and {len(check.problems) - 20} more")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``inalab pcap``'s arguments."""
    parser.add_argument("pcaps", nargs="+", type=Path, metavar="FILE",
                        help="captures (tcpdump -w, inalab switch --pcap, bmv2's)")  # fmt: skip
    parser.add_argument(
        "--zero-icrc", default="", metavar="IP,...",
        help="addresses whose frames carry ICRC 0: a P4 switch's (bmv2, Tofino)")  # fmt: skip
    parser.add_argument(
        "--consecutive", default="", metavar="IP,...",
        help="senders captured on their own link: their PSNs must be consecutive")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Check each capture; exit 1 when a frame or a stream broke a rule, 2 on a bad file."""
    zero = [a for a in args.zero_icrc.split(",") if a]
    consecutive = [a for a in args.consecutive.split(",") if a]
    failed = False
    for path in args.pcaps:
        try:
            check = check_pcap(path, zero)
        except PcapError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        problems = check.psn_problems(consecutive)
        check.problems += problems
        print("\n".join(format_check(str(path), check)))
        failed |= bool(check.problems)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as ``python -m emulation.bench.rocepcap``."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
