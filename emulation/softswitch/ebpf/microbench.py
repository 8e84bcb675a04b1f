"""How fast the eBPF program aggregates, measured by the kernel, with no sockets.

The eBPF counterpart of :func:`emulation.softswitch.loadgen.measure_pipeline`: one job of
N workers, each worker's DATA frame of every slot handed to the program by the kernel's
test runner (``BPF_PROG_TEST_RUN``), round after round, the slots driven exactly as
workers drive them (set alternation, a newer seq per use). The kernel reports the
program's own time per run, so the Python loop around it does not count. Results are
not transmitted (the replicas' port has no interface): this is the cost of the checks,
the registers under the lock, the lane arithmetic and the result written into the
frame, which is checked against the expected sum on every completion.

``framing="roce"``: the same contributions as RoCEv2 WRITE ONLY frames (one packet a
message, hostlib.rocev2 builds them as a worker's RNIC would, ICRC and all), through the
program's RoCEv2 path: the ICRC checked, the queue pair's step, the same slot, then each
replica's reply built (headers, PSN, ICRC; the replicas' port has no interface, so it
is not sent, as a UDP result is not). The last reply's lanes and ICRC are checked on
every completion.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from emulation.softswitch.ebpf.dataplane import EbpfDataplane
from emulation.softswitch.roce_tables import RoceReply, RoceRequest
from hostlib import rocev2
from hostlib.protocol import (
    HEADER,
    INA_UDP_PORT,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    ROCE_UDP_PORT,
    PacketType,
    RoceOpcode,
)

__all__ = ["FRAMINGS", "MAX_RUN_LANES", "measure_program"]

MAX_RUN_LANES = 896
"""The widest packet the kernel's test runner takes: it copies a frame into one page
(4 KiB less its head- and tailroom; 928 lanes were refused here)."""

FRAMINGS = ("udp", "roce")
"""How the contributions are framed: INA's UDP header, or RoCEv2 WRITEs."""

_LOOPBACK = 1  # the test runner's default device: frames "arrive" on the program's port 1
_SWITCH_IP = "10.255.255.1"
_VT_DATA = (PROTOCOL_VERSION << 4) | PacketType.DATA


def _frame(rank: int, lanes: int) -> bytearray:
    """A worker's Ethernet/IPv4/UDP/INA frame (lanes all ``rank + 1``; slot and seq set
    per use)."""
    payload = HEADER.pack(_VT_DATA, 0, 1, rank, -128, lanes, 0, 0, 0)
    payload += struct.pack(f"!{lanes}i", *([rank + 1] * lanes))
    return _udp_frame(rank, 40000 + rank, INA_UDP_PORT, payload)


def _udp_frame(rank: int, sport: int, dport: int, payload: bytes) -> bytearray:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(_worker_ip(rank)), socket.inet_aton(_SWITCH_IP))  # fmt: skip
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    eth = bytes.fromhex("0200000000fe" + f"02000001{rank:04x}") + b"\x08\x00"
    return bytearray(eth + ip + udp + payload)  # fmt: skip


def _worker_ip(rank: int) -> str:
    return f"10.0.1.{rank + 1}"


def measure_program(
    workers: int, lanes: int, window: int, packets: int, seconds: float, framing: str = "udp"
) -> dict[str, Any]:
    """The program's time per packet over ``packets`` contributions (or ``seconds``).

    Raises:
        ValueError: lanes above :data:`MAX_RUN_LANES`, or a framing not in
            :data:`FRAMINGS`.
        RuntimeError: a completed slot's result is not the sum (a program bug).
        EbpfUnavailable, EbpfBuildError, LibbpfError: it cannot be built or run here.
    """
    if lanes > MAX_RUN_LANES:
        raise ValueError(f"the kernel's test runner takes at most {MAX_RUN_LANES} lanes")
    if framing not in FRAMINGS:
        raise ValueError(f"framing {framing!r}: one of {', '.join(FRAMINGS)}")
    roce = framing == "roce"
    dp = EbpfDataplane(lanes, window, roce=roce)
    try:
        dp.set_port(1, _LOOPBACK)
        for rank in range(workers):
            addr = (_worker_ip(rank), ROCE_UDP_PORT if roce else 40000 + rank)
            dp.insert_worker(1, rank, addr)
            dp.set_replica(1, rank, 2, addr)
        dp.set_group(1, [(2, rank) for rank in range(workers)])
        dp.insert_job(1, workers, 0, window, 1)
        if roce:
            _install_roce(dp, workers, window)
            result = _drive_roce(dp, workers, lanes, window, packets, seconds)
        else:
            result = _drive(dp, workers, lanes, window, packets, seconds)
        return {**result, "ebpf_program_framing": framing}
    finally:
        dp.close()


def _qp(rank: int, slot: int, window: int) -> int:
    """The queue pair register (and number) of ``rank``'s window position ``slot``."""
    return rank * window + slot


def _install_roce(dp: EbpfDataplane, workers: int, window: int) -> None:
    """One-packet messages; per rank and slot, the switch's queue pair and the reply's."""
    dp.roce.set_job(1, 1)
    for rank in range(workers):
        for slot in range(window):
            reg = _qp(rank, slot, window)
            dp.roce.set_request(reg, RoceRequest(1, rank, reg, _worker_ip(rank)))
            dp.roce.set_reply(1, rank, slot, RoceReply(0x1000 + reg, 0xA000 + rank, 0, reg))


def _drive_roce(dp: EbpfDataplane, workers: int, lanes: int, window: int, packets: int,
                seconds: float) -> dict[str, Any]:  # fmt: skip
    values = [struct.pack(f"!{lanes}i", *([rank + 1] * lanes)) for rank in range(workers)]
    want = struct.pack("!i", workers * (workers + 1) // 2) * lanes
    last_ip = _worker_ip(workers - 1)  # the last reply written is the group's last
    done = total_ns = 0
    deadline = time.monotonic() + seconds
    rnd = 0
    while done < packets and time.monotonic() < deadline:
        for slot in range(window):
            seq = rnd * window + slot + 1
            rkey = slot | (POOL_SET_BIT if rnd % 2 else 0)
            for rank in range(workers):
                msg = rocev2.RoceFrame(RoceOpcode.UC_WRITE_ONLY_IMM, _qp(rank, slot, window),
                                       rnd, values[rank], rocev2.pack_request_va(seq, 0), rkey,
                                       len(values[rank]), rocev2.pack_imm(seq, 0))  # fmt: skip
                body = rocev2.build_frame(msg, _worker_ip(rank), _SWITCH_IP)
                run = dp.run(bytes(_udp_frame(rank, ROCE_UDP_PORT, ROCE_UDP_PORT, body)))
                total_ns += run.duration_ns
                if rank == workers - 1:
                    _check_reply(run.data_out[42:], want, last_ip, slot, rnd)
            done += workers
        rnd += 1
    return _summary(dp, done, rnd * window, total_ns, lanes)


def _check_reply(payload: bytes, want: bytes, dst_ip: str, slot: int, rnd: int) -> None:
    """The reply left in the frame: the sum, and an ICRC a receiver accepts.

    Raises:
        RuntimeError: either is wrong (a program bug).
    """
    lanes = rocev2.parse_frame(payload).payload
    if lanes != want or not rocev2.icrc_ok(_SWITCH_IP, dst_ip, ROCE_UDP_PORT, payload):
        raise RuntimeError(f"slot {slot} round {rnd}: the reply is not the sum with its ICRC")


def _summary(dp: EbpfDataplane, done: int, completed: int, total_ns: int,
             lanes: int) -> dict[str, Any]:  # fmt: skip
    """The figures, once the counters say every contribution was aggregated.

    Raises:
        RuntimeError: they do not.
    """
    counters = dp.counters()
    if counters["aggregated"] != done or counters["completed"] != completed:
        raise RuntimeError(f"the program lost work: {done} packets, counters {counters}")
    per_packet = total_ns / max(done, 1)
    return {
        "ebpf_program_lanes": lanes,
        "ebpf_program_packets": done,
        "ebpf_program_ns_per_packet": per_packet,
        "ebpf_program_pps": 1e9 / per_packet,
        "ebpf_program_elements_per_s": 1e9 / per_packet * lanes,
    }


def _drive(dp: EbpfDataplane, workers: int, lanes: int, window: int, packets: int,
           seconds: float) -> dict[str, Any]:  # fmt: skip
    frames = [_frame(rank, lanes) for rank in range(workers)]
    pool_at, seq_at, lane_at = 42 + 8, 42 + 12, 42 + HEADER.size  # protocol.HEADER offsets
    want = struct.pack("!i", workers * (workers + 1) // 2)
    done = total_ns = 0
    deadline = time.monotonic() + seconds
    rnd = 0
    while done < packets and time.monotonic() < deadline:
        for slot in range(window):
            seq = rnd * window + slot + 1
            pool = slot | (POOL_SET_BIT if rnd % 2 else 0)
            for rank, frame in enumerate(frames):
                struct.pack_into("!H", frame, pool_at, pool)
                struct.pack_into("!I", frame, seq_at, seq)
                run = dp.run(bytes(frame))
                total_ns += run.duration_ns
                if rank == workers - 1 and run.data_out[lane_at : lane_at + 4] != want:
                    raise RuntimeError(f"slot {slot} round {rnd}: the result is not the sum")
            done += workers
        rnd += 1
    return _summary(dp, done, rnd * window, total_ns, lanes)
