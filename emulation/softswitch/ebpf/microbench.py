"""How fast the eBPF program aggregates, measured by the kernel, with no sockets.

The eBPF counterpart of :func:`emulation.softswitch.loadgen.measure_pipeline`: one job of
N workers, each worker's DATA frame of every slot handed to the program by the kernel's
test runner (``BPF_PROG_TEST_RUN``), round after round, the slots driven exactly as
workers drive them (set alternation, a newer seq per use). The kernel reports the
program's own time per run, so the Python loop around it does not count. Results are
not transmitted (the replicas' port has no interface): this is the cost of the checks,
the registers under the lock, the lane arithmetic and the result written into the
frame, which is checked against the expected sum on every completion.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from emulation.softswitch.ebpf.dataplane import EbpfDataplane
from hostlib.protocol import HEADER, INA_UDP_PORT, POOL_SET_BIT, PROTOCOL_VERSION, PacketType

__all__ = ["MAX_RUN_LANES", "measure_program"]

MAX_RUN_LANES = 896
"""The widest packet the kernel's test runner takes: it copies a frame into one page
(4 KiB less its head- and tailroom; 928 lanes were refused here)."""

_LOOPBACK = 1  # the test runner's default device: frames "arrive" on the program's port 1
_SWITCH_IP = "10.255.255.1"
_VT_DATA = (PROTOCOL_VERSION << 4) | PacketType.DATA


def _frame(rank: int, lanes: int) -> bytearray:
    """A worker's Ethernet/IPv4/UDP/INA frame (lanes all ``rank + 1``; slot and seq set
    per use)."""
    payload = HEADER.pack(_VT_DATA, 0, 1, rank, -128, lanes, 0, 0, 0)
    payload += struct.pack(f"!{lanes}i", *([rank + 1] * lanes))
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(f"10.0.1.{rank + 1}"), socket.inet_aton(_SWITCH_IP))
    udp = struct.pack("!HHHH", 40000 + rank, INA_UDP_PORT, 8 + len(payload), 0)
    eth = bytes.fromhex("0200000000fe" + f"02000001{rank:04x}") + b"\x08\x00"
    return bytearray(eth + ip + udp + payload)  # fmt: skip


def measure_program(
    workers: int, lanes: int, window: int, packets: int, seconds: float
) -> dict[str, Any]:
    """The program's time per packet over ``packets`` contributions (or ``seconds``).

    Raises:
        ValueError: lanes above :data:`MAX_RUN_LANES`.
        RuntimeError: a completed slot's result is not the sum (a program bug).
        EbpfUnavailable, EbpfBuildError, LibbpfError: it cannot be built or run here.
    """
    if lanes > MAX_RUN_LANES:
        raise ValueError(f"the kernel's test runner takes at most {MAX_RUN_LANES} lanes")
    dp = EbpfDataplane(lanes, window)
    try:
        dp.set_port(1, _LOOPBACK)
        for rank in range(workers):
            dp.insert_worker(1, rank, (f"10.0.1.{rank + 1}", 40000 + rank))
            dp.set_replica(1, rank, 2, (f"10.0.1.{rank + 1}", 40000 + rank))
        dp.set_group(1, [(2, rank) for rank in range(workers)])
        dp.insert_job(1, workers, 0, window, 1)
        return _drive(dp, workers, lanes, window, packets, seconds)
    finally:
        dp.close()


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
    counters = dp.counters()
    if counters["aggregated"] != done or counters["completed"] != rnd * window:
        raise RuntimeError(f"the program lost work: {done} packets, counters {counters}")
    per_packet = total_ns / done
    return {
        "ebpf_program_lanes": lanes,
        "ebpf_program_packets": done,
        "ebpf_program_ns_per_packet": per_packet,
        "ebpf_program_pps": 1e9 / per_packet,
        "ebpf_program_elements_per_s": 1e9 / per_packet * lanes,
    }
