"""One worker's side of an INA allreduce, as a sans-I/O state machine.

:class:`InaAllreduce` turns a buffer into packets, keeps a window of outstanding slots,
places results, and decides on retransmissions; it never touches a socket or a clock. A
driver feeds it datagrams and the time: ``hostlib.session`` over a real
:class:`~hostlib.transport.base.Transport`, and ``hostlib.transport.memory.FakeNetwork``
in virtual time for deterministic loss, duplication and reordering tests. Both run this
same code.

Packet plan (``docs/protocol.md``): ``W = min(slots, blocks)`` slots; packet ``p`` uses
slot ``p % W`` with set ``(uses of that slot so far) % 2`` and is sent only after the
result of packet ``p - W`` (the slot's previous use) arrived. int32 data: packet ``p``
carries block ``p``. float32 data: exponents travel one window ahead, so packet ``p``
carries the local exponent of block ``p`` and the data of block ``p - W``, quantized with
the global exponent that came back in the result of packet ``p - W``; the first ``W``
packets carry exponents only. The header's seq numbers packets monotonically across the
calls of a session, from 1 (0 is reserved for an unused switch slot, and skipped on
wrap-around): the switch drops a packet older than the use its slot holds.

Why no worker is left waiting at the end of a call: a worker waits only for results,
and only the switch sends them. A use of a slot completes once every worker's packet
arrived; a worker whose packet or result was lost sends the packet again, and the
switch answers a packet of a finished use it still holds with the result, by unicast
(``retransmits_answered``). It still holds it until the slot's next use completes, which
needs this worker's next packet, sent only after this result arrived. So no worker's
progress depends on another worker reading its socket, at the end of a call or between
calls; float32's exponent packets (the first ``W`` of a call) are packets of the same
slots, recovered the same way, and CollNet's local ranks wait only for their head rank
(``hostlib.collnet``), whose INA session waits only for the switch.

Loss recovery: a packet still without its result when the result of a transmission
:func:`reorder_threshold` sends after it arrives is sent again at once (fast
retransmission, :meth:`InaAllreduce._detect_losses`); the per-slot RFC 6298 timer is
the backstop, for a call's last packets above all.

Congestion: a packet whose slot is free may still wait for the session's congestion
window (:mod:`hostlib.congestion`), which shrinks when round trips show a queue; it never
changes which slot, set or seq a packet has.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from hostlib.congestion import CongestionWindow, check_congestion
from hostlib.errors import InaError, InaTimeoutError
from hostlib.protocol import (
    DEFAULT_SLOTS_PER_JOB,
    EXPONENT_MIN,
    FLAG_RESEND,
    HEADER,
    HEADER_SIZE,
    LANES_PER_PACKET,
    MAX_LANES,
    MAX_SLOT,
    MAX_WORKERS,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    PacketType,
    packet_size,
)
from hostlib.quantize import block_exponents, dequantize_into, headroom_bits, quantize_into

SEQ_MODULUS = 0xFFFFFFFF
"""Packet numbers run 1..2**32-1 and wrap to 1."""

CC_TARGET = 0.005
"""The congestion target to opt in with (``RetryPolicy(cc_target=CC_TARGET)``,
``--cc-target 5``): what the fat tree was measured with (:attr:`RetryPolicy.cc_target`)."""

__all__ = [
    "CC_TARGET",
    "SEQ_MODULUS",
    "Addr",
    "InaAllreduce",
    "InaError",
    "InaTimeoutError",
    "JobSpec",
    "RetryPolicy",
    "StallClock",
    "check_call_data",
    "check_window",
    "commit_uses",
    "reorder_threshold",
    "timeout_message",
]

Addr = tuple[str, int]

_RESULT_VT = (PROTOCOL_VERSION << 4) | PacketType.RESULT
_WIRE_HEADER = np.dtype(
    [
        ("vt", "u1"),
        ("flags", "u1"),
        ("job", ">u2"),
        ("rank", "u1"),
        ("exp", "i1"),
        ("lanes", ">u2"),
        ("pool", ">u2"),
        ("reserved", ">u2"),
        ("seq", ">u4"),
    ]
)


@dataclass(frozen=True)
class JobSpec:
    """This worker's place in a job, as configured on the switch.

    Raises:
        ValueError: a field out of range.
    """

    job_id: int
    rank: int
    num_workers: int
    switch: Addr
    lanes: int = LANES_PER_PACKET
    slots: int = DEFAULT_SLOTS_PER_JOB

    def __post_init__(self) -> None:
        checks = (
            ("job_id", self.job_id, 0, 0xFFFF),
            ("num_workers", self.num_workers, 1, MAX_WORKERS),
            ("rank", self.rank, 0, self.num_workers - 1),
            ("lanes", self.lanes, 1, MAX_LANES),
            ("slots", self.slots, 1, MAX_SLOT + 1),
        )
        for name, value, lo, hi in checks:
            if not lo <= value <= hi:
                raise ValueError(f"{name}={value} outside {lo}..{hi}")


@dataclass(frozen=True)
class RetryPolicy:
    """Retransmission timing (seconds) and congestion control. The timeout adapts to the
    measured round trip (srtt + 4 rttvar, Karn's rule) within ``[min_timeout,
    max_timeout]`` and doubles per retransmission of a packet; the doubled timeout stays
    the session's until an unambiguous sample (RFC 6298, 5.5-5.7). ``deadline`` is the
    longest time without any new result before :class:`InaTimeoutError`. The ``cc_``
    fields steer the INA engines' congestion window (:mod:`hostlib.congestion`).

    Raises:
        ValueError: non-positive times, or min > max.
    """

    timeout: float = 0.02
    """The timeout before the first round-trip sample; also the least timeout of an INA
    call's packets sent before the call's first result. That result needs every rank to
    have entered the call, and ranks enter a call apart: 1.5-15.7 ms on this VM (star4,
    float32, 12 calls, by pcap), a delay the estimator, fed by the rest of the call, does
    not see. With the 10 ms floor, the first rank in sent its first window again when
    the last came 11 ms later. The point-to-point layer times its packets to a peer the
    same way until that peer answers from inside the call (``hostlib.p2p``, "Peers
    entering a call")."""
    min_timeout: float = 0.01
    max_timeout: float = 0.5
    backoff: float = 2.0
    deadline: float = 10.0
    late_timer: float = 0.1
    """A timer whose packet was in flight while its worker went unserved for more than
    this fraction of its timeout is re-armed once, from the moment it is served, instead
    of firing (INA and p2p engines, :class:`StallClock`). Unserved: woken more than
    ``late_timer * min_timeout`` after the wake-up the engine asked for. Its worker was
    not running meanwhile; on one machine (a VM whose vCPUs the hypervisor took, a
    CPU-limited container) the switch and the peers it waits for were stalled with it,
    so the silence is no evidence of loss. Measured on the 2-core VM: four zero-loss
    star4 benches retransmitted 147 packets, 126 of them from timers served 0.7-18 ms
    late after stalls of the whole VM of up to 28 ms (no samples on either core); and a
    stall that ended just as the timers came due (served 0.3 ms late after 10 ms with no
    scheduling on either core) still retransmitted until the stall counted wherever it
    fell in a timer's life. The price: a packet really lost while its worker stalled
    waits one timeout more. ``math.inf`` turns it off."""
    stall_check: float = 0.0025
    """The longest an engine sleeps while its call runs (its heartbeat), so that a stall
    is measured wherever it falls in a timer's life, not only after the timer's deadline;
    a stall shorter than this can go unseen."""
    cc_target: float = math.inf
    """The queueing delay an INA worker's packets may meet above the least round trip
    seen before its congestion window shrinks (``math.inf``, the default: no congestion
    control). Off by default because, measured, it does not pay yet: on the fat tree
    (fat_tree_k4, 100 Mbit/s) it changed neither the call time nor the retransmissions
    beyond run-to-run noise, and under 5% link loss (star8) it is as fast as without
    (docs/results.md). 5 ms (:data:`CC_TARGET`) is the value measured on the fat tree: a
    whole window of 8 KiB packets queues 0.5 ms on a 1 Gbit/s link, and this VM's
    scheduling adds a few ms now and then; 4 hosts' windows behind one 100 Mbit/s link
    (fat_tree_k4) queue 21 ms."""
    cc_beta: float = 0.8
    """How hard a sample above the target cuts: by ``beta`` times its excess share."""
    cc_max_cut: float = 0.5
    """The largest share one cut takes off the window."""

    def __post_init__(self) -> None:
        if min(self.timeout, self.min_timeout, self.max_timeout, self.deadline) <= 0:
            raise ValueError("retry times must be positive")
        if not self.late_timer > 0:
            raise ValueError("late_timer must be positive (math.inf: off)")
        if not self.stall_check > 0:
            raise ValueError("stall_check must be positive")
        if self.min_timeout > self.max_timeout or self.backoff < 1.0:
            raise ValueError("need min_timeout <= max_timeout and backoff >= 1")
        check_congestion(self.cc_target, self.cc_beta, self.cc_max_cut)

    @property
    def heartbeat(self) -> float:
        """How long an engine may sleep between looks at the clock: ``stall_check``, or
        forever when the late-timer rule is off."""
        return self.stall_check if math.isfinite(self.late_timer) else math.inf

    def stalled_through(self, stalled: float, timeout: float) -> bool:
        """Whether a timer of ``timeout`` seconds whose packet was in flight during
        ``stalled`` seconds of its worker's stalls is late (:attr:`late_timer`); the C
        cores test the same."""
        return stalled > self.late_timer * timeout


class StallClock:
    """The seconds an engine went unserved during its call: woken later than the
    wake-up it asked for (its earliest timer, its deadline, or its heartbeat,
    :attr:`RetryPolicy.heartbeat`) by more than ``late_timer * min_timeout``. Every call
    into the engine observes the clock once; a timer compares the total when it is
    served with the total when it was armed (:meth:`RetryPolicy.stalled_through`).
    The C cores keep the same clock (``stall_observe`` in ``_netcore.h``)."""

    __slots__ = ("_least", "seen", "stalled")

    def __init__(self, policy: RetryPolicy, now: float = 0.0) -> None:
        self.seen = now
        self.stalled = 0.0
        self._least = policy.late_timer * policy.min_timeout

    def observe(self, now: float, asked: float) -> None:
        """The engine is served at ``now``; it had asked to be woken at ``asked``."""
        gap = now - max(asked, self.seen)
        if gap > self._least:
            self.stalled += gap
        self.seen = now


@dataclass
class _Stats:
    """``retransmitted`` counts every packet sent again; ``fast_retransmitted`` the part
    of them sent because results of later transmissions arrived first (the rest waited
    for a timer)."""

    sent: int = 0
    retransmitted: int = 0
    fast_retransmitted: int = 0
    stale: int = 0
    foreign: int = 0
    late_timers: int = 0
    """Timers served late (``RetryPolicy.late_timer``) and re-armed instead of fired."""
    late_samples: int = 0
    """Round-trip samples taken from a late answer: a timeout proved spurious."""


@dataclass
class _Rtt:
    """Round-trip estimator (RFC 6298) shared by all slots of a session, and the
    session's congestion window (INA engines)."""

    rto: float
    srtt: float = 0.0
    rttvar: float = 0.0
    samples: int = field(default=0)
    cc: CongestionWindow = field(default_factory=CongestionWindow)

    def update(self, rtt: float, policy: RetryPolicy, flight: int = 1) -> None:
        """Take one round-trip sample. ``flight``: the packets in flight when it was
        taken (the one it times included), which is how many samples one round trip
        brings an estimator fed a sample per packet. RFC 6298's gains (1/8, 1/4) assume
        one per round trip; each is divided by ``flight`` (RFC 7323, Appendix G), so
        that ``rttvar`` still spans the variation between round trips rather than
        decaying within one. Without that, the point-to-point layer's 64-packet windows
        (every ack a sample) let ``rttvar`` shrink while a receiver's queue was short,
        and when it grew, a whole window's timers fired before their acks came back
        (star4 at 200 Mbit/s, 16 MiB ring: 10,950 timer retransmissions, every one a
        late answer, 1.32 s against Gloo's 1.05 s). INA passes its packets in flight too:
        with RFC 6298's gains per packet, 16 workers' windows behind the fat tree's pod
        uplinks let ``rttvar`` decay between the queue's swings, and 2.3% of the packets
        were spurious retransmissions; weighed, 1.0% (docs/results.md, 2026-11-30)."""
        if self.samples == 0:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            beta, alpha = 0.25 / flight, 0.125 / flight
            self.rttvar = (1 - beta) * self.rttvar + beta * abs(self.srtt - rtt)
            self.srtt = (1 - alpha) * self.srtt + alpha * rtt
        self.samples += 1
        self.rto = min(max(self.srtt + 4 * self.rttvar, policy.min_timeout), policy.max_timeout)


def out_buffer(out: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``out`` as the flat array a result of ``like``'s dtype and size is written into.

    Raises:
        TypeError: not a numpy array, or another dtype.
        ValueError: another size, not contiguous, or read-only.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    if out.dtype != like.dtype:
        raise TypeError(f"out is {out.dtype}, the input {like.dtype}")
    if out.size != like.size:
        raise ValueError(f"out holds {out.size} elements, the input {like.size}")
    if not out.flags.c_contiguous:
        raise ValueError("out is not contiguous")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    return out if out.ndim == 1 else out.reshape(-1)


def check_call_data(data: np.ndarray, first_seq: int | None = None) -> None:
    """What every engine's call (INA or point-to-point, Python or native) requires of its
    input, and of its first packet number when it has one.

    Raises:
        TypeError: data is not float32/int32.
        ValueError: data is not 1-D, or ``first_seq`` outside ``1..SEQ_MODULUS``.
    """
    if data.dtype not in (np.float32, np.int32):
        raise TypeError(f"allreduce supports float32 and int32, not {data.dtype}")
    if data.ndim != 1:
        raise ValueError("allreduce takes a 1-D array")
    if first_seq is not None and not 1 <= first_seq <= SEQ_MODULUS:
        raise ValueError(f"first_seq {first_seq} outside 1..{SEQ_MODULUS}")


def reorder_threshold(window: int) -> int:
    """How many later transmissions must be answered before an unanswered packet counts
    as lost: 3, as TCP's duplicate acks, or fewer in a window too small to have 3 more
    packets in flight behind it (a window of 1 leaves only the timer)."""
    return max(1, min(3, window - 1))


def check_window(window: int | None, slots: int) -> int:
    """The slots an INA call uses: ``window``, or all ``slots`` when it is ``None``.

    Raises:
        TypeError: ``window`` is not an integer.
        ValueError: ``window`` outside ``1..slots``.
    """
    if window is None:
        return slots
    if isinstance(window, bool) or not isinstance(window, int | np.integer):
        raise TypeError(f"window {window!r} is not an integer")
    if not 1 <= window <= slots:
        raise ValueError(f"window {window} outside 1..{slots} (the job's slots)")
    return int(window)


def _as_blocks(data: np.ndarray, nblocks: int, lanes: int) -> np.ndarray:
    """``data`` as ``(nblocks, lanes)`` rows: a view when it fills them exactly (the
    engine never writes its input), else a zero-padded copy."""
    if data.size == nblocks * lanes and data.flags.c_contiguous:
        return data.reshape(nblocks, lanes)
    blocks = np.zeros((nblocks, lanes), dtype=data.dtype)
    blocks.reshape(-1)[: data.size] = data
    return blocks


class InaAllreduce:
    """The state machine of one allreduce call of one worker.

    Args:
        spec: the job and this worker's rank.
        data: 1-D float32 or int32 array (not modified).
        uses: per-slot use counts of this worker's session, shape ``(spec.slots,)``;
            advanced by :meth:`commit` once the call has completed.
        policy: retransmission timing.
        rtt: the session's round-trip estimator (``None``: a fresh one).
        first_seq: packet number of this call's first packet (1 in a new session).
        window: slots this call may use, ``0..window-1`` of the job's (``None``: all
            ``spec.slots``); every worker of the job must use the same. A call of fewer
            packets uses fewer.
        flagged: whether results carry the ``FLAG_RESEND`` of the packet that completed
            the use or that they answer (UDP from every data plane; not RoCEv2, whose
            transport rebuilds the header). Then a result with the flag set gives no
            round-trip sample (it timed another worker's recovery), and a retransmission
            proved spurious by a late answer gives one (docs/protocol.md, "Timeouts").

    Raises:
        TypeError: data is not float32/int32.
        ValueError: data is not 1-D, holds NaN/infinity (float32), or the window is
            outside ``1..spec.slots``.
    """

    def __init__(
        self,
        spec: JobSpec,
        data: np.ndarray,
        uses: np.ndarray,
        policy: RetryPolicy,
        rtt: _Rtt | None = None,
        first_seq: int = 1,
        *,
        window: int | None = None,
        flagged: bool = True,
    ) -> None:
        check_call_data(data, first_seq)
        slots = check_window(window, spec.slots)
        self.spec, self.policy, self.uses = spec, policy, uses
        self.first_seq = first_seq
        self.rtt = rtt or _Rtt(policy.timeout)
        self.stats = _Stats()
        self.count = data.size
        self.is_float = data.dtype == np.float32
        lanes = spec.lanes
        self.nblocks = max(1, math.ceil(data.size / lanes))
        # Slots are used from 0 up: a slot's set alternation (uses) is its own, so calls
        # with other windows leave every slot's count consistent on all workers.
        self.window = min(slots, self.nblocks)
        self.npackets = self.nblocks + (self.window if self.is_float else 0)
        self._blocks = _as_blocks(data, self.nblocks, lanes)
        # The result, block by block as results arrive (float32: dequantized then, with
        # the block's global exponent): no pass over the whole array at the end.
        self._out = np.empty((self.nblocks, lanes), dtype=data.dtype)
        # Per block, the global exponent from the switch (Python ints: read one at a time
        # on the per-packet path, where a numpy scalar costs more than the arithmetic).
        self._global_exp = [EXPONENT_MIN] * self.nblocks
        self._headroom = headroom_bits(spec.num_workers)
        self._scratch = np.empty(lanes, dtype=np.float32)
        self._wire = self._build_wire()
        self._wire_view = self._wire.data.cast("B")
        self._size = packet_size(lanes)
        w = self.window
        # Per slot: index (within this call) of the packet in flight, -1 when none.
        self._outstanding = [-1] * w
        self._sent_at = [0.0] * w
        self._slot_rto = [0.0] * w
        self._deadline = [0.0] * w  # the slot's live timer; other heap entries are stale
        self._resends = [0] * w  # retransmissions of the slot's packet in flight
        # Per slot, a packet resent once whose first result a first transmission
        # completed (flag clear), and its round trip, taken if a late answer proves
        # the retransmission was not needed.
        self._flagged = flagged
        self._spurious = [-1] * w
        self._spurious_rtt = [0.0] * w
        self._rearmed = [False] * w  # the live timer was re-armed once for a stall
        self._stall_at = [0.0] * w  # the stall clock when the slot's timer was armed
        self._clock = StallClock(policy)
        self._timers: list[tuple[float, int, int]] = []
        self._done = 0
        self._last_progress = 0.0
        # Fast retransmission: transmissions numbered in send order, the latest one a
        # result is known to answer, and the transmissions still to be judged.
        self._tx = 0
        self._slot_tx = [0] * w
        self._high_tx = 0
        self._order: deque[tuple[int, int, int]] = deque()  # (tx, slot, index)
        self._reorder = reorder_threshold(w)
        self._fast: list[memoryview] = []  # found lost by a result, sent by on_timer
        # Congestion control (hostlib.congestion): packets whose slot is free but which
        # the congestion window holds back (a heap of indices), the packets sent and
        # without their result, and per slot whether the round trip of its packet is a
        # sample (sent after the call's first result).
        self._held: list[int] = []
        self._flight = 0
        self._sample_cc = [False] * w
        self._cc_on = math.isfinite(policy.cc_target)

    # ------------------------------------------------------------------ plan
    def _build_wire(self) -> np.ndarray:
        """All packets of the call, headers filled; payloads filled now (int32) or lazily."""
        spec, n, w = self.spec, self.npackets, self.window
        wire = np.zeros((n, packet_size(spec.lanes)), dtype=np.uint8)
        hdr = np.zeros(n, dtype=_WIRE_HEADER)
        index = np.arange(n, dtype=np.int64)
        slot = index % w
        pool_set = (self.uses[slot] + index // w) % 2
        hdr["vt"] = (PROTOCOL_VERSION << 4) | PacketType.DATA
        hdr["job"] = spec.job_id
        hdr["rank"] = spec.rank
        hdr["lanes"] = spec.lanes
        hdr["pool"] = slot | np.where(pool_set == 1, POOL_SET_BIT, 0)
        hdr["seq"] = (self.first_seq - 1 + index) % SEQ_MODULUS + 1
        if self.is_float:
            hdr["exp"] = EXPONENT_MIN
            hdr["exp"][: self.nblocks] = block_exponents(self._blocks)
        else:
            hdr["exp"] = EXPONENT_MIN
            self._payload(wire)[:] = self._blocks
        wire[:, :HEADER_SIZE] = hdr.view(np.uint8).reshape(n, HEADER_SIZE)
        return wire

    @staticmethod
    def _payload(rows: np.ndarray) -> np.ndarray:
        """Big-endian int32 view of the payload of wire rows."""
        return rows[..., HEADER_SIZE:].view(">i4")

    def _data_block(self, index: int) -> int:
        """Block whose data packet ``index`` (within this call) carries (-1: exponents only)."""
        return index - self.window if self.is_float else index

    # ------------------------------------------------------------------ driving
    @property
    def done(self) -> bool:
        return self._done == self.npackets

    def start(self, now: float) -> list[memoryview]:
        """The first window of packets to send."""
        self._last_progress = now
        self._clock.seen = now
        self._held = list(range(self.window))  # ascending: a heap
        return self._release(now)

    def on_datagram(self, data: memoryview, now: float) -> memoryview | None:
        """Take one received datagram; return the next packet to send, if any."""
        self._clock.observe(now, self.next_wakeup())
        if len(data) != self._size:
            self.stats.foreign += 1
            return None
        vt, _f, job, _r, exp, lanes, _p, _x, seq = HEADER.unpack_from(data)
        if vt != _RESULT_VT or job != self.spec.job_id or lanes != self.spec.lanes:
            self.stats.foreign += 1
            return None
        index = (seq - self.first_seq) % SEQ_MODULUS  # the header numbers the session
        slot = index % self.window if index < self.npackets else -1
        if slot < 0 or self._outstanding[slot] != index:
            self.stats.stale += 1  # a duplicate, or the unicast re-send of a result we had
            if slot >= 0 and self._spurious[slot] == index:
                self._late_sample(slot)
            return None
        self._accept(slot, index, exp, data, now)
        self._detect_losses(now)
        nxt = index + self.window
        if nxt < self.npackets:
            heapq.heappush(self._held, nxt)
        out = self._release(now)
        if not out:
            return None
        self._fast.extend(out[1:])  # sent by the next on_timer, as fast retransmissions
        return out[0]

    def _release(self, now: float) -> list[memoryview]:
        """Send the held packets the congestion window lets go, oldest first."""
        w = self.window
        limit = self.rtt.cc.limit(w)
        held, out = self._held, []
        while held and (limit >= w or self._flight < limit or self._escapes(held[0])):
            index = heapq.heappop(held)
            if self.is_float and index >= w:
                self._fill(index)
            out.append(self._send(index, now))
        return out

    def _escapes(self, index: int) -> bool:
        """Whether ``index``, the lowest held packet, goes beyond the congestion window:
        every packet in flight lies above it (sent out of order while the window was
        open). It is then the lowest this worker never sent: a lower one would be held,
        or wait for its slot's packet in flight, which lies below it. The job's oldest
        packet not yet sent by all is such a packet for each worker that has not sent
        it, so it always goes once its slot is free: no worker waits on another forever
        (hostlib.congestion)."""
        return all(o < 0 or o > index for o in self._outstanding)

    def _accept(self, slot: int, index: int, exp: int, data: memoryview, now: float) -> None:
        self._outstanding[slot] = -1
        self._done += 1
        self._last_progress = now
        self._flight -= 1
        # Karn's rule: a retransmitted packet's result is ambiguous; so is one that a
        # retransmission completed (another worker's recovery is in its time).
        flag = data[1] & FLAG_RESEND if self._flagged else 0
        self._spurious[slot] = -1
        if not self._resends[slot]:
            if not flag:
                self._sample(slot, now - self._sent_at[slot], now)
            if self._slot_tx[slot] > self._high_tx:
                self._high_tx = self._slot_tx[slot]
        elif self._flagged and not flag and self._resends[slot] == 1:
            self._spurious[slot] = index
            self._spurious_rtt[slot] = now - self._sent_at[slot]
        block = index - self.window if self.is_float else index
        if block >= 0:
            sums = np.frombuffer(data, dtype=">i4", offset=HEADER_SIZE)
            if self.is_float:
                shift = 29 - self._global_exp[block] - self._headroom  # quantize.scale_shift
                dequantize_into(sums, shift, self._out[block])
            else:
                self._out[block] = sums
        if self.is_float and index < self.nblocks:
            self._global_exp[index] = exp

    def _sample(self, slot: int, rtt: float, now: float) -> None:
        """A round trip of ``slot``'s packet: the estimator's, and the congestion
        window's unless this worker stalled meanwhile (on one machine all stalled, and no
        queue grew)."""
        policy = self.policy
        self.rtt.update(rtt, policy, max(1, self._flight + 1))
        if self._sample_cc[slot] and self._clock.stalled == self._stall_at[slot]:
            self.rtt.cc.on_sample(
                rtt, now, self.rtt.srtt, self.window, policy.cc_target, policy.cc_beta,
                policy.cc_max_cut,
            )  # fmt: skip

    def _late_sample(self, slot: int) -> None:
        """A late answer for the packet :attr:`_spurious` holds: its retransmission
        reached the switch after the use had completed, so its first transmission was
        counted, and the first result (a first transmission completed it) answered that:
        the round trip is not ambiguous. The estimator takes it (the congestion window
        does not: it is a round late)."""
        self._spurious[slot] = -1
        self.rtt.update(self._spurious_rtt[slot], self.policy, max(1, self._flight))
        self.stats.late_samples += 1

    def _fill(self, index: int) -> None:
        """Quantize the data of packet ``index`` with its block's global exponent."""
        block = index - self.window
        shift = 29 - self._global_exp[block] - self._headroom  # quantize.scale_shift
        quantize_into(self._blocks[block], shift, self._payload(self._wire[index]), self._scratch)

    def _send(self, index: int, now: float) -> memoryview:
        slot = index % self.window
        self._outstanding[slot] = index
        self._sent_at[slot] = now
        self._resends[slot] = 0
        self._sample_cc[slot] = self._cc_on and self._done > 0
        # Before the call's first result the peers may still be entering the call.
        rto = self.rtt.rto if self._done else max(self.rtt.rto, self.policy.timeout)
        self._slot_rto[slot] = rto
        self._arm(slot, index, now)
        self.stats.sent += 1
        self._flight += 1
        start = index * self._size
        return self._wire_view[start : start + self._size]

    def _arm(self, slot: int, index: int, now: float) -> None:
        """Number this transmission of ``slot``'s packet and start its timer."""
        self._tx += 1
        self._slot_tx[slot] = self._tx
        self._order.append((self._tx, slot, index))
        self._rearmed[slot] = False
        self._stall_at[slot] = self._clock.stalled
        deadline = now + self._slot_rto[slot]
        self._deadline[slot] = deadline
        heapq.heappush(self._timers, (deadline, slot, index))

    def _detect_losses(self, now: float) -> None:
        """Fast retransmission: a packet without its result when the result of a
        transmission ``reorder_threshold`` or more sends after it arrived is taken as
        lost (or its result lost) and queued to be sent again at once, without backing
        off its timer (TCP's duplicate-ack threshold, counted in sends as RACK counts in
        time; RFC 8985). Every worker sends the same packets in the same order and the
        switch completes a slot when the last worker's packet arrives, so results come
        back in send order unless something was lost. A worker whose own packet arrived
        but a peer's did not sends a duplicate the switch ignores (``duplicates_ignored``)
        or answers with the result by unicast; the timer stays the backstop, for the
        call's last packets above all."""
        threshold = self._high_tx - self._reorder
        order = self._order
        while order and order[0][0] <= threshold:
            tx, slot, index = order.popleft()
            if self._outstanding[slot] == index and self._slot_tx[slot] == tx:
                self._fast.append(self._resend(slot, index, now))
                self.stats.fast_retransmitted += 1

    def next_wakeup(self) -> float:
        """When :meth:`on_timer` has work next (a retransmission or the deadline), or
        the heartbeat of the stall clock (:attr:`RetryPolicy.heartbeat`) is due."""
        if self._fast:
            return -math.inf
        deadline = self._last_progress + self.policy.deadline
        wake = min(self._timers[0][0], deadline) if self._timers else deadline
        return min(wake, self._clock.seen + self.policy.heartbeat)

    def on_timer(self, now: float) -> list[memoryview]:
        """Packets to retransmit at ``now``: those found lost by later results, and
        those whose timer expired (each such timer doubles, RFC 6298 5.5). A timer whose
        packet was in flight while this worker stalled (``RetryPolicy.late_timer``) is
        re-armed from ``now`` once instead.

        Raises:
            InaTimeoutError: no new result for longer than the policy's deadline.
        """
        if self.done:
            return []
        self._clock.observe(now, self.next_wakeup())
        if now >= self._last_progress + self.policy.deadline:  # the next_wakeup() sum
            raise InaTimeoutError(self._timeout_message(now))
        out, self._fast = self._fast, []
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, slot, index = heapq.heappop(timers)
            if self._outstanding[slot] != index or self._deadline[slot] != deadline:
                continue  # answered, or re-armed since
            rto = self._slot_rto[slot]
            stalled = self._clock.stalled - self._stall_at[slot]
            if not self._rearmed[slot] and self.policy.stalled_through(stalled, rto):
                # This worker was not running, nor (on one machine) were the switch and
                # the peers. One timeout more from now, same transmission.
                self._rearmed[slot] = True
                self._deadline[slot] = now + rto
                heapq.heappush(timers, (now + rto, slot, index))
                self.stats.late_timers += 1
                continue
            rto = min(rto * self.policy.backoff, self.policy.max_timeout)
            self._slot_rto[slot] = rto
            if rto > self.rtt.rto:  # the session's, until an unambiguous sample (RFC 6298)
                self.rtt.rto = rto
            out.append(self._resend(slot, index, now))
        return out

    def _resend(self, slot: int, index: int, now: float) -> memoryview:
        self._resends[slot] += 1
        self._arm(slot, index, now)
        self._wire[index, 1] |= FLAG_RESEND
        self.stats.sent += 1
        self.stats.retransmitted += 1
        start = index * self._size
        return self._wire_view[start : start + self._size]

    def _timeout_message(self, now: float) -> str:
        waiting = sorted(int(s) for s in self._outstanding if s >= 0)
        return timeout_message(
            self.spec, self.policy, now - self._last_progress, self._done, self.npackets,
            waiting, self.stats.retransmitted,
        )  # fmt: skip

    # ------------------------------------------------------------------ result
    def result(self) -> np.ndarray:
        """The reduced array (float32 or int32, the input's size).

        Raises:
            InaError: the call has not completed.
        """
        if not self.done:
            raise InaError("allreduce has not completed")
        # A view of this call's own array (the padding of the last block cut off).
        return self._out.reshape(-1)[: self.count]

    @property
    def next_seq(self) -> int:
        """Packet number of the first packet of the session's next call."""
        return (self.first_seq - 1 + self.npackets) % SEQ_MODULUS + 1

    def commit(self) -> None:
        """Advance the session's per-slot use counts past this completed call."""
        if not self.done:
            raise InaError("allreduce has not completed")
        commit_uses(self.uses, self.window, self.npackets)


def commit_uses(uses: np.ndarray, window: int, npackets: int) -> None:
    """Advance per-slot use counts past a call of ``npackets`` packets on slots
    ``0..window-1`` (packet ``p`` used slot ``p % window``)."""
    uses[:window] += npackets // window
    uses[: npackets % window] += 1


def timeout_message(
    spec: JobSpec,
    policy: RetryPolicy,
    seconds: float,
    done: int,
    npackets: int,
    waiting: list[int],
    retransmitted: int,
) -> str:
    """What :class:`InaTimeoutError` says (either engine): who waited, how long, for what."""
    host, port = spec.switch
    return (
        f"job {spec.job_id} rank {spec.rank}: no result from switch {host}:{port} for "
        f"{seconds:.3f} s (deadline {policy.deadline} s); "
        f"{done}/{npackets} packets of the call done, waiting for packets "
        f"{waiting[:8]}{'...' if len(waiting) > 8 else ''}, "
        f"{retransmitted} retransmissions: the switch is down, or a rank has not entered "
        "this call (RetryPolicy.deadline; the torch backend's INALAB_DEADLINE)"
    )
