"""The native emulated RNIC (hostlib.transport.rnic_native, hostlib/_rnicore.c) against
the Python one (hostlib.transport.rnic), its specification: the same random frames in
(messages, losses, duplicates, reorders, bad ICRCs, foreign queue pairs, truncations,
wrong sources, MIDDLE/LAST outside a message, bad R_Keys and lengths) and the same
writes posted give the same completions, memory, queue pair state, counters and frames
out, byte for byte; and the native NIC's frames are RoCEv2 by scapy."""

from __future__ import annotations

import random
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

from hostlib import rocev2
from hostlib.native import ENGINE_ENV, emulated_rnic
from hostlib.protocol import ROCE_PMTUS, ROCE_UDP_PORT, RoceOpcode
from hostlib.transport.base import TransportError
from hostlib.transport.rnic import RNIC_COUNTERS, EmulatedRnic
from hostlib.transport.rnic_native import NativeRnic, rnic_core_unavailable

pytestmark = pytest.mark.skipif(
    rnic_core_unavailable() is not None, reason=str(rnic_core_unavailable())
)

ME, PEER, OTHER = "127.0.0.71", "127.0.0.72", "127.0.0.73"
FOREIGN_QPN = 0x777
QUICK_SEEDS = range(50)
SLOW_SEEDS = range(50, 3000)

Event = tuple[Any, ...]


# ------------------------------------------------------------------ the frames in
class _Peer:
    """The far side of the NIC's queue pairs: it sends messages with consecutive PSNs,
    and the scenario spoils some of them on the way."""

    def __init__(self, rng: random.Random, pmtu: int, qps: dict[int, int]) -> None:
        self.rng, self.pmtu = rng, pmtu
        self.psn = dict(qps)  # queue pair -> the PSN the NIC expects first
        self.sent: list[list[bytes]] = []

    def message(self, qpn: int, va: int, rkey: int, nbytes: int, dma: int, imm: int | None,
                src: str = PEER, port: int = ROCE_UDP_PORT) -> list[bytes]:  # fmt: skip
        n = max(1, -(-nbytes // self.pmtu))
        psn = self.psn.get(qpn, self.rng.randrange(1 << 24))
        data = self.rng.randbytes(nbytes)
        frames = []
        for k in range(n):
            f = rocev2.RoceFrame(rocev2.message_opcode(k, n, imm is not None), qpn,
                                 rocev2.psn_add(psn, k), data[k * self.pmtu : (k + 1) * self.pmtu],
                                 va, rkey, dma, imm)  # fmt: skip
            frames.append(rocev2.build_frame(f, src, ME, port))
        self.psn[qpn] = rocev2.psn_add(psn, n)
        self.sent.append(frames)
        return frames

    def raw(self, body: bytes, src: str = PEER) -> bytes:
        """``body`` (from the BTH) with its correct ICRC: a frame that passes the ICRC
        check and only then meets the others."""
        return body + rocev2.icrc(src, ME, ROCE_UDP_PORT, body).to_bytes(4, "little")


def _spoil(rng: random.Random, peer: _Peer, frames: list[bytes]) -> list[Event]:
    """A message's frames as the NIC receives them: lost, repeated, reordered, corrupt,
    cut short, or from the wrong source, now and then."""
    frames = list(frames)
    roll = rng.random()
    if roll < 0.1 and frames:
        frames.pop(rng.randrange(len(frames)))
    elif roll < 0.2 and frames:
        frames.insert(rng.randrange(len(frames) + 1), rng.choice(frames))
    elif roll < 0.3 and len(frames) > 1:
        k = rng.randrange(len(frames) - 1)
        frames[k], frames[k + 1] = frames[k + 1], frames[k]
    events: list[Event] = []
    for f in frames:
        spoil = rng.random()
        if spoil < 0.03:
            at = rng.randrange(len(f))
            f = f[:at] + bytes([f[at] ^ (1 << rng.randrange(8))]) + f[at + 1 :]
        elif spoil < 0.05:
            f = f[: rng.randrange(len(f))]
        elif spoil < 0.07:  # cut inside its headers, with a correct ICRC: malformed
            f = peer.raw(f[: rng.randrange(12, 32)])
        elif spoil < 0.09:  # another opcode, a transport version or a pad count
            body = bytearray(f[:-4])
            where, value = rng.choice([(0, 0x04), (0, 0x2C), (1, 0x01), (1, 0x30)])
            body[where] = value if where == 0 else body[where] | value
            f = peer.raw(bytes(body))
        elif spoil < 0.11:  # the queue pair's PSNs, from another address
            events.append(("frame", _from(f, OTHER), OTHER, ROCE_UDP_PORT))
            continue
        events.append(("frame", f, PEER, ROCE_UDP_PORT))
    return events


def _from(frame: bytes, src: str) -> bytes:
    body = frame[:-4]
    return body + rocev2.icrc(src, ME, ROCE_UDP_PORT, body).to_bytes(4, "little")


def _stray(rng: random.Random, peer: _Peer, qpn: int) -> Event:
    """A MIDDLE or LAST at the PSN the NIC expects: outside any message."""
    op = rng.choice([RoceOpcode.UC_WRITE_MIDDLE, RoceOpcode.UC_WRITE_LAST,
                     RoceOpcode.UC_WRITE_LAST_IMM])  # fmt: skip
    psn = peer.psn.get(qpn, 0)
    peer.psn[qpn] = rocev2.psn_add(psn, 1)
    f = rocev2.RoceFrame(
        op, qpn, psn, rng.randbytes(4 * rng.randint(0, 8)), imm=rng.randrange(1 << 32)
    )
    return ("frame", rocev2.build_frame(f, PEER, ME), PEER, ROCE_UDP_PORT)


def scenario(seed: int, nic: Any) -> list[Event]:
    """The events of one seed: frames in, writes out, polls; the same for either NIC
    (the identifiers come from the NIC's seed, which both draw alike)."""
    rng = random.Random(seed)
    mrs = [nic.register(rng.choice([256, 1000, 4096, 8192])) for _ in range(rng.randint(1, 3))]
    qps = [nic.create_qp() for _ in range(rng.randint(2, 4))]
    recv = {}
    for qp in qps[:-1]:  # the last stays unconnected: unknown to the wire
        recv[qp.qpn] = rng.randrange(1 << 24)
        nic.connect(qp, PEER, rng.randrange(1 << 24), recv[qp.qpn])
    peer = _Peer(rng, nic.pmtu, recv)
    events: list[Event] = []
    for _ in range(rng.randint(20, 60)):
        events.extend(_step(rng, peer, nic.pmtu, [q.qpn for q in qps], mrs))
    events.append(("poll",))
    return events


def _step(
    rng: random.Random, peer: _Peer, pmtu: int, qpns: list[int], mrs: list[Any]
) -> list[Event]:
    roll = rng.random()
    connected = qpns[:-1]
    if roll < 0.1:
        return [("poll",)]
    if roll < 0.2:
        mr = rng.choice(mrs)
        nbytes = 4 * rng.randint(0, 3 * pmtu // 4)
        return [("write", rng.randrange(len(connected)), rng.randbytes(nbytes), mr.va, mr.rkey,
                 rng.choice([None, rng.randrange(1 << 32)]))]  # fmt: skip
    if roll < 0.25:
        return [_stray(rng, peer, rng.choice(connected))]
    if roll < 0.3 and peer.sent:
        return [("frame", f, PEER, ROCE_UDP_PORT) for f in rng.choice(peer.sent)]  # replayed
    qpn = rng.choice(connected) if rng.random() < 0.9 else rng.choice([qpns[-1], FOREIGN_QPN])
    mr = rng.choice(mrs)
    nbytes = 4 * rng.randint(0, min(len(mr.buf), 4 * pmtu) // 4)
    offset = 4 * rng.randint(0, (len(mr.buf) - nbytes) // 4)
    rkey = mr.rkey if rng.random() < 0.95 else rng.randrange(1 << 32)
    if rng.random() < 0.05:
        offset = len(mr.buf) - nbytes + 4 * rng.randint(1, 4)  # past the region's end
    dma = nbytes if rng.random() < 0.93 else max(0, nbytes + rng.choice([-4, 4, pmtu]))
    imm = rng.randrange(1 << 32) if rng.random() < 0.8 else None
    port = ROCE_UDP_PORT if rng.random() < 0.9 else 49152
    frames = peer.message(qpn, mr.va + offset, rkey, nbytes, dma, imm, port=port)
    if port != ROCE_UDP_PORT:
        return [("frame", f, PEER, port) for f in frames]
    return _spoil(rng, peer, frames)


# ------------------------------------------------------------------ what comes out
def _qp_state(qp: Any) -> tuple[int, int, bool]:
    open_ = qp._open if hasattr(qp, "_open") else qp._core.qp_state(qp.qpn)[2]
    return qp.send_psn, qp.recv_psn, bool(open_)


def run(cls: type, seed: int, pmtu: int) -> dict[str, Any]:
    """Everything observable of one seed's events on a NIC of ``cls``."""
    with cls(ME, pmtu=pmtu, seed=seed) as nic:
        nic.check_icrc = seed % 4 != 3  # off: as for a P4 switch's replies
        events = scenario(seed, nic)
        qps = list(nic.qps.values())
        out: list[Any] = []
        for ev in events:
            if ev[0] == "frame":
                nic.on_frame(memoryview(ev[1]), (ev[2], ev[3]))
            elif ev[0] == "poll":
                out.append(("poll", nic.poll(0)))
            else:
                out.append(("write", nic.build_write(qps[ev[1]], *ev[2:])))
        return {
            "out": out,
            "counters": dict(nic.counters),
            "memory": {rkey: bytes(mr.buf) for rkey, mr in nic.mrs.items()},
            "qps": [_qp_state(qp) for qp in qps],
        }


def _pmtu(seed: int) -> int:
    return ROCE_PMTUS[seed % 3]  # 256, 512, 1024: messages of several packets


def _same(seed: int) -> dict[str, Any]:
    want = run(EmulatedRnic, seed, _pmtu(seed))
    got = run(NativeRnic, seed, _pmtu(seed))
    for key in want:
        assert got[key] == want[key], f"seed {seed}: {key} differs"
    return want


def test_random_frames_give_the_same_state_counters_and_frames() -> None:
    seen = dict.fromkeys(RNIC_COUNTERS, 0)
    for seed in QUICK_SEEDS:
        for name, value in _same(seed)["counters"].items():
            seen[name] += value
    # the scenarios reach every check (else this test would prove little)
    assert {k for k, v in seen.items() if v == 0} == {"frames_in", "frames_out"}


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_random_frames_give_the_same_on_many_seeds(seed: int) -> None:
    _same(seed)


# ------------------------------------------------------------------ the socket path
@pytest.fixture
def peer_socket() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((PEER, ROCE_UDP_PORT))
        s.settimeout(2)
        yield s


def _over_sockets(cls: type, seed: int, peer: socket.socket) -> dict[str, Any]:
    """A seed's frames from the peer's socket (those from PEER:4791), and its writes to
    it: what the NIC completes and counts, what arrives at the peer."""
    with cls(ME, pmtu=_pmtu(seed), seed=seed) as nic:
        events = scenario(seed, nic)
        qps = list(nic.qps.values())
        frames = [ev[1] for ev in events if ev[0] == "frame" and ev[2:] == (PEER, ROCE_UDP_PORT)]
        for f in frames:
            peer.sendto(f, (ME, ROCE_UDP_PORT))
        done = []
        for _ in range(2000):
            done.extend(nic.poll(0.01))
            if nic.counters["frames_in"] == len(frames):
                break
        done.extend(nic.poll(0))
        writes = [ev for ev in events if ev[0] == "write"]
        for ev in writes:
            nic.post_write(qps[ev[1]], *ev[2:])
        wire = [peer.recvfrom(8192) for _ in range(nic.counters["frames_out"])]
        assert all(src == (ME, ROCE_UDP_PORT) for _, src in wire)
        return {
            "done": done,
            "counters": dict(nic.counters),
            "memory": {rkey: bytes(mr.buf) for rkey, mr in nic.mrs.items()},
            "wire": [data for data, _ in wire],
        }


@pytest.mark.parametrize("seed", [3, 4])
def test_over_sockets_both_nics_agree(seed: int, peer_socket: socket.socket) -> None:
    want = _over_sockets(EmulatedRnic, seed, peer_socket)
    got = _over_sockets(NativeRnic, seed, peer_socket)
    assert want["counters"]["frames_in"] > 0 and want["counters"]["frames_out"] > 0
    assert got == want


def test_its_frames_are_roce_by_scapy(peer_socket: socket.socket) -> None:
    with NativeRnic(ME, pmtu=256, seed=5) as nic:
        qp = nic.create_qp()
        nic.connect(qp, PEER, 0x123456, 0)
        start = qp.send_psn
        nic.post_write(qp, bytes(range(256)) * 3, va=0x1000, rkey=0x8004, imm=42)
        got = [peer_socket.recvfrom(4096)[0] for _ in range(3)]
    ops = []
    for k, data in enumerate(got):
        udp = UDP(sport=ROCE_UDP_PORT, dport=ROCE_UDP_PORT)
        bth = IP(bytes(IP(src=ME, dst=PEER, id=0, flags="DF") / udp / Raw(data)))[BTH]
        assert (bth.dqpn, bth.psn) == (0x123456, rocev2.psn_add(start, k))
        rebuilt = IP(src=ME, dst=PEER, id=0, flags="DF") / udp / BTH(
            opcode=bth.opcode, dqpn=bth.dqpn, psn=bth.psn) / Raw(data[12:-4])  # fmt: skip
        assert bytes(rebuilt)[-4:] == data[-4:]  # scapy's ICRC
        ops.append(RoceOpcode(bth.opcode))
    assert ops == [RoceOpcode.UC_WRITE_FIRST, RoceOpcode.UC_WRITE_MIDDLE,
                   RoceOpcode.UC_WRITE_LAST_IMM]  # fmt: skip
    assert rocev2.split_imm(rocev2.parse_frame(got[2]).imm or 0) == (0, 42)


def test_its_crc32_is_zlibs() -> None:
    from hostlib import _rnicore  # the core's CRC-32 folds by carry-less multiplication

    rng = random.Random(7)
    for n in [*range(200), 4095, 4096, 4111, 9000]:
        data, value = rng.randbytes(n), rng.randrange(1 << 32)
        assert _rnicore.crc32(data, value) == zlib.crc32(data, value), n
        assert _rnicore.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:]), n


def test_bad_use_is_one_clear_error() -> None:
    with NativeRnic(ME, pmtu=256, seed=1) as nic:
        qp = nic.create_qp()
        start = qp.send_psn
        with pytest.raises(TransportError, match="not connected"):
            nic.post_write(qp, b"\0" * 4, 0, 0, None)
        nic.connect(qp, PEER, 1, 0)
        with pytest.raises(rocev2.RoceError, match="whole words"):
            nic.post_write(qp, b"\0" * 6, 0, 0, None)
        with pytest.raises(rocev2.RoceError, match="imm"):
            nic.post_write(qp, b"", 0, 0, 1 << 32)
        with pytest.raises(ValueError, match="IPv4"):
            nic.connect(qp, "localhost", 1, 0)
        assert nic.counters["frames_out"] == 0 and qp.send_psn == start  # nothing sent
    with pytest.raises(ValueError, match="path MTU"):
        NativeRnic(ME, pmtu=300)


def test_the_engine_picks_the_nic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    with emulated_rnic(ME, 512) as nic:
        assert type(nic) is NativeRnic and nic.pmtu == 512
    with emulated_rnic(ME, engine="python") as nic:
        assert type(nic) is EmulatedRnic
    monkeypatch.setenv(ENGINE_ENV, "python")
    with emulated_rnic(ME) as nic:
        assert type(nic) is EmulatedRnic
    with emulated_rnic(ME, engine="native") as nic:
        assert type(nic) is NativeRnic
    with pytest.raises(ValueError, match="choose one of"):
        emulated_rnic(ME, engine="fortran")


def test_one_thread_at_a_time() -> None:
    """poll and post_write release the GIL: a second thread is refused, never raced."""
    with NativeRnic(ME, pmtu=256, seed=1) as nic:
        qp = nic.create_qp()
        nic.connect(qp, PEER, 1, 0)
        poller = threading.Thread(target=nic.poll, args=(1.0,))
        poller.start()
        refused = None
        deadline = time.monotonic() + 0.9
        while refused is None and time.monotonic() < deadline:
            try:
                nic.connect(qp, PEER, 1, 0)  # in time only once the poller waits
            except RuntimeError as exc:
                refused = exc
        poller.join()
        assert refused is not None and "another thread" in str(refused)
        nic.post_write(qp, b"", 0, 0, None)  # free again
