"""Reliable point-to-point messages between workers, for the host-based collectives.

Layer: hostlib engines, beside ``hostlib.ina``. Ring and tree allreduce (``hostlib.ring``,
``hostlib.tree``) run over the same :class:`~hostlib.transport.base.Transport` and the
same packet size as INA, so the three compare on equal terms. This module owns:

* :class:`P2pEndpoint`: the sans-I/O reliable channels of one worker's session (per-peer
  sequence numbers, selective + cumulative acks, a send window, retransmission with the
  adaptive timeout of :class:`~hostlib.ina.RetryPolicy`, duplicate suppression);
* :class:`CollectiveCall`: one call of a collective as a state machine with the driving
  interface of :class:`~hostlib.ina.InaAllreduce` (``start``, ``on_datagram``,
  ``on_timer``, ``next_wakeup``, ``done``), so ``hostlib.transport.memory.FakeNetwork``
  runs it in virtual time with loss, duplication and reordering.

The wire header, :class:`~hostlib.p2pwire.PeerSpec` (a worker's rank, every rank's
address, and the default packet width and window a call may override with
:class:`CollectiveCall`'s ``lanes`` and ``window``) and the helpers both engines share
are in ``hostlib.p2pwire``; the errors in ``hostlib.errors``. This module re-exports them.
The session driver over a real transport, :class:`~hostlib.peers.PeerCollective`, is in
``hostlib.peers`` (``hostlib.p2p.PeerCollective`` still resolves, with a
``DeprecationWarning``).

A message's payload is copied when it is queued, so the sender may overwrite its buffer
at once (the ring's all-gather does). Packets of the *next* call (a faster peer) are
acknowledged and kept until that call starts; a call never runs two ahead, since an
allreduce cannot complete without every rank's input.

Why no rank is left waiting at the end of a call. A call ends when every message it
expects has arrived *and* every packet it sent is acknowledged, so a rank never leaves a
peer without the data that peer needs. The one thing that can still be missing is an
acknowledgement: the ack of a call's last packet can be lost after its receiver finished
the call (the end-of-transfer problem of every reliable protocol over datagrams; TCP
keeps TIME_WAIT for it). The receiver may then wait anywhere (a barrier, a call of
another session, a training step), so :class:`~hostlib.peers.PeerCollective` answers on
the socket whenever no call runs: from its creation a responder thread waits on the
socket with the GIL released and, under the session's lock, acknowledges again every
duplicate of a finished call (and keeps and acknowledges the next call's early packets);
a call answers them itself while it runs, and
:meth:`~hostlib.peers.PeerCollective.close` lingers for them. A sender's retransmission
is therefore answered within a round trip as long as the peer's process lives; only a
dead or unreachable peer ends the call, with :class:`P2pTimeoutError` at the deadline.

Loss recovery. Each channel numbers its transmissions; an ack that answers a
transmission :func:`reorder_threshold` or more sends after a still-unacknowledged packet
marks that packet lost, and it is sent again at once (fast retransmission; TCP's
duplicate-ack threshold, counted in sends as RACK counts in time, RFC 8985). The
RFC 6298 timer (srtt + 4 rttvar within the policy's bounds, doubled per expiry) is the
backstop, for the call's last packets above all, which have no later ones. Every acked
packet is a sample, a window of them per round trip, so each sample's gains are divided
by the packets in flight with it (RFC 7323, Appendix G; ``hostlib.ina._Rtt.update``):
``rttvar`` then spans the variation between round trips, as a peer's queue (which its
acks wait behind) fills and drains, instead of shrinking within one round trip.

Spurious timeouts. A timer that fires while the packet is only delayed (a queue behind a
peer's own data, a descheduled peer on a busy machine) sends a copy the peer already
has, and Karn's rule keeps the delay that caused it out of the round-trip estimate, so
the next delay of that size fires the timer again. Every ACK therefore echoes the
FLAG_RESEND of the DATA it answers. When the ack that names a retransmitted packet, the
first to acknowledge it, answers the original (no echo), the retransmission was
spurious, and the round trip from the original send is taken as a sample after all (the
Eifel algorithm of RFC 3522 and its response, RFC 4015, with the echoed flag in the role
of Eifel's timestamps): the timeout grows to the delays this path really has. An ack
that answers a copy is ambiguous (the original may have been lost, or its ack), and
nothing is learnt from it, nor from acks that only move the cumulative point. The ACK
of a DATA that had arrived before is also marked FLAG_DUPLICATE (RFC 2883's D-SACK), for
the statistics and pcaps only: a network that duplicates a retransmitted copy makes
such an ack without anything having been spurious, so it is never a sample.

Peers entering a call. Ranks enter a call apart: a ring rank finishes its call when its
last packets are acknowledged, then its caller prepares the next one (on this VM, star4,
64 MiB: 12-36 ms between a rank's last packet of one call and its first of the next, by
pcap). A faster peer's packets meanwhile go to the responder, which keeps and
acknowledges them, but while the late rank starts the call (queueing its first messages
under the session's lock) nobody answers: 6-9 ms, and the faster peer's timers, at the
10 ms floor by then, fired (58-378 retransmissions per star4 row at zero loss, every one
a late answer). So an ACK of a DATA of the receiver's next call carries FLAG_EARLY, and
until a peer answers a DATA of the current call without it, packets to that peer are
timed with at least the initial timeout (``RetryPolicy.timeout``), as INA times a call's
packets until its first result. Once the peer answers from inside the call, the
estimator's timeout applies again.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hostlib.errors import P2pError, P2pTimeoutError
from hostlib.ina import RetryPolicy, StallClock, _Rtt, check_call_data, reorder_threshold
from hostlib.p2pwire import (
    FLAG_DUPLICATE,
    FLAG_EARLY,
    P2P_ACK,
    P2P_DATA,
    P2P_HEADER,
    P2P_VERSION,
    PeerSpec,
    call_knobs,
    stall_message,
)
from hostlib.protocol import FLAG_RESEND

__all__ = [
    "FLAG_DUPLICATE",
    "FLAG_EARLY",
    "P2P_ACK",
    "P2P_DATA",
    "P2P_HEADER",
    "P2P_VERSION",
    "CollectiveCall",
    "P2pEndpoint",
    "P2pError",
    "P2pStats",
    "P2pTimeoutError",
    "PeerSpec",
    "call_knobs",
    "reorder_threshold",
    "stall_message",
]

_HSIZE = P2P_HEADER.size
_SEQ_MAX = 0xFFFFFFFF  # a channel carries at most 2**32-1 packets per session (no wrap)

Handler = Callable[[int, int, memoryview, float], None]
"""``handler(src_rank, tag, payload, now)``: one new message of the current call."""


@dataclass
class P2pStats:
    """Counters of one endpoint, over its session.

    ``retransmitted`` counts every packet sent again, ``fast_retransmitted`` the part of
    them sent because later packets to the same peer were acknowledged first (the rest
    waited for a timer); ``duplicates`` counts DATA that arrived again (a retransmission
    whose original had arrived: spurious on the peer's side, or an ack that was lost);
    ``late_answered`` counts datagrams answered while no call ran (the responder);
    ``spurious`` counts retransmissions shown to be spurious (their first ack answered
    the original), whose delay then entered the timeout.
    """

    sent: int = 0
    retransmitted: int = 0
    fast_retransmitted: int = 0
    duplicates: int = 0
    foreign: int = 0
    late_answered: int = 0
    spurious: int = 0
    late_timers: int = 0
    """Timers served late (``RetryPolicy.late_timer``) and re-armed instead of fired."""


@dataclass
class _Pending:
    packet: bytearray
    sent_at: float
    rto: float
    deadline: float
    tx: int  # the channel's transmission number of its latest copy
    resent: bool = False
    rearmed: bool = False  # its live timer was re-armed once for a stall
    stall_at: float = 0.0  # the endpoint's stall clock when the live timer was armed


class _Channel:
    """Both directions of the link to one peer."""

    def __init__(self) -> None:
        self.next_seq = 1
        self.inflight: dict[int, _Pending] = {}  # insertion order = seq order
        self.queue: deque[tuple[int, bytearray]] = deque()  # waiting for the window
        self.cum = 0  # every seq <= cum has arrived
        self.above: set[int] = set()  # arrived seqs > cum
        self.tx = 0  # transmissions so far (first copies and retransmissions)
        self.high_tx = 0  # the latest transmission an ack is known to answer
        self.order: deque[tuple[int, int]] = deque()  # (tx, seq) in transmission order
        self.entered = False  # the peer answered a DATA of the current call from inside it


class P2pEndpoint:
    """One worker's reliable channels to all peers, kept across the calls of a session.

    Sans-I/O: datagrams go in through :meth:`on_datagram`, packets to send come out of
    :meth:`take_outbox` (each addressed by its ``dst`` byte), time is passed in.

    Args:
        spec: rank, addresses, packet size and window.
        policy: retransmission timing (the timeout adapts to the measured round trip).
    """

    def __init__(self, spec: PeerSpec, policy: RetryPolicy | None = None) -> None:
        self.spec = spec
        self.policy = policy or RetryPolicy()
        self.rtt = _Rtt(self.policy.timeout)
        self.stats = P2pStats()
        self.call = 0  # number of the current (or last) call; the first is 1
        self.last_progress = 0.0  # last new data or new ack
        self.last_rx = -math.inf  # last datagram of any kind from a peer
        self._peers = [_Channel() for _ in spec.addrs]
        self._timers: list[tuple[float, int, int]] = []
        self._clock = StallClock(self.policy)
        self._outbox: list[bytes | bytearray] = []
        self._handler: Handler | None = None
        self._stash: list[tuple[int, int, bytes]] = []  # messages of the next call
        self.lanes = spec.lanes  # the current call's largest message
        self.window = spec.window  # the current call's packets in flight per peer

    # ------------------------------------------------------------------ calls
    def begin_call(
        self, handler: Handler, now: float, *, lanes: int | None = None, window: int | None = None
    ) -> list[tuple[int, int, bytes]]:
        """Start the next call; return the messages of it that arrived early.

        Args:
            handler: takes each new message of the call.
            now: the time.
            lanes: the call's largest message in elements (``None``: ``spec.lanes``).
            window: the call's packets in flight per peer (``None``: ``spec.window``).
                Safe to change between calls: a call ends only when every packet it
                sent is acknowledged, so the next starts with nothing in flight.

        Raises:
            TypeError: a knob that is not an integer.
            ValueError: lanes or window out of range (see :func:`call_knobs`).
        """
        self.lanes, self.window = call_knobs(self.spec, lanes, window)
        self.call += 1
        self._handler = handler
        self.last_progress = now
        self._clock.seen = now  # the time between calls is no stall
        for ch in self._peers:
            ch.entered = False
        early, self._stash = self._stash, []
        return early

    def end_call(self) -> None:
        self._handler = None

    def count(self, counter: str) -> None:
        """Count one event the session's driver saw (``foreign``, ``late_answered``)."""
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    @property
    def unacked(self) -> bool:
        """Whether any sent or queued packet still waits for its ack."""
        return any(ch.inflight or ch.queue for ch in self._peers)

    def waiting_for(self) -> dict[int, int]:
        """Unacknowledged packets per peer rank (for error messages)."""
        return {
            r: len(ch.inflight) + len(ch.queue)
            for r, ch in enumerate(self._peers)
            if ch.inflight or ch.queue
        }

    # ------------------------------------------------------------------ sending
    def send(self, dst: int, tag: int, payload: np.ndarray, now: float) -> None:
        """Queue one message (at most the call's ``lanes`` int32/float32 elements) for
        ``dst``; it leaves once fewer than the call's ``window`` packets to ``dst`` wait
        for their ack.

        Raises:
            ValueError: a bad destination, tag or payload size.
            P2pError: the channel ran out of sequence numbers.
        """
        if not 0 <= dst < self.spec.world_size or dst == self.spec.rank:
            raise ValueError(f"no peer rank {dst}")
        if payload.size > self.lanes or not 0 <= tag <= 0xFFFFFFFF:
            raise ValueError(f"payload of {payload.size} elements or tag {tag} out of range")
        ch = self._peers[dst]
        seq = ch.next_seq
        if seq > _SEQ_MAX:
            raise P2pError(f"channel to rank {dst} ran out of sequence numbers")
        ch.next_seq += 1
        packet = bytearray(_HSIZE + 4 * payload.size)
        P2P_HEADER.pack_into(
            packet, 0, P2P_DATA, 0, self.spec.rank, dst, seq, tag, self.call & 0xFFFF, payload.size
        )
        packet[_HSIZE:] = payload.astype(payload.dtype.newbyteorder("<"), copy=False).tobytes()
        if len(ch.inflight) < self.window:
            self._transmit(dst, seq, packet, now)
        else:
            ch.queue.append((seq, packet))

    def _transmit(self, dst: int, seq: int, packet: bytearray, now: float) -> None:
        ch = self._peers[dst]
        ch.tx += 1
        # Until the peer answers from inside this call, it may still be entering it.
        rto = self.rtt.rto if ch.entered else max(self.rtt.rto, self.policy.timeout)
        stall_at = self._clock.stalled
        ch.inflight[seq] = _Pending(packet, now, rto, now + rto, ch.tx, stall_at=stall_at)
        ch.order.append((ch.tx, seq))
        heapq.heappush(self._timers, (now + rto, dst, seq))
        self._outbox.append(packet)
        self.stats.sent += 1

    def _retransmit(self, dst: int, seq: int, pending: _Pending, now: float) -> None:
        """Send ``pending`` again, re-armed at its current timeout (a timer's expiry
        backs the timeout off first; a fast retransmission does not)."""
        ch = self._peers[dst]
        ch.tx += 1
        pending.tx = ch.tx
        ch.order.append((ch.tx, seq))
        pending.deadline = now + pending.rto
        pending.resent = True
        pending.rearmed = False
        pending.stall_at = self._clock.stalled
        pending.packet[1] |= FLAG_RESEND
        heapq.heappush(self._timers, (pending.deadline, dst, seq))
        self._outbox.append(pending.packet)
        self.stats.sent += 1
        self.stats.retransmitted += 1

    def take_outbox(self) -> list[bytes | bytearray]:
        out, self._outbox = self._outbox, []
        return out

    @property
    def has_output(self) -> bool:
        return bool(self._outbox)

    # ------------------------------------------------------------------ receiving
    def on_datagram(self, data: memoryview, now: float) -> None:
        """Take one datagram: an ack frees window, new data goes to the call's handler."""
        self._clock.observe(now, self.next_timer())
        if len(data) < _HSIZE:
            self.stats.foreign += 1
            return
        vt, flags, src, dst, seq, aux, call, count = P2P_HEADER.unpack_from(data)
        n = self.spec.world_size
        if dst != self.spec.rank or src >= n or src == dst:
            self.stats.foreign += 1
        elif vt == P2P_ACK:
            self.last_rx = now
            self._on_ack(src, seq, aux, call, flags, now)
        elif vt == P2P_DATA and len(data) == _HSIZE + 4 * count:
            self.last_rx = now
            self._on_data(src, seq, aux, call, flags, data[_HSIZE:], now)
        else:
            self.stats.foreign += 1

    def _on_data(
        self,
        src: int,
        seq: int,
        tag: int,
        call: int,
        data_flags: int,
        payload: memoryview,
        now: float,
    ) -> None:
        ch = self._peers[src]
        flags = data_flags & FLAG_RESEND  # echoed: which copy this ack answers
        ahead = (call - self.call) & 0xFFFF
        if ahead == 1:
            flags |= FLAG_EARLY  # kept for a call this endpoint has not started
        if seq <= ch.cum or seq in ch.above:
            self.stats.duplicates += 1  # our ack was lost or late: acknowledge again
            flags |= FLAG_DUPLICATE
        else:
            if ahead == 0 and self._handler is not None:
                self._handler(src, tag, payload, now)
            elif ahead == 1:
                self._stash.append((src, tag, bytes(payload)))
            else:  # cannot happen between correct peers: do not acknowledge it
                self.stats.foreign += 1
                return
            self.last_progress = now
            if seq == ch.cum + 1:
                ch.cum = seq
                while ch.cum + 1 in ch.above:
                    ch.cum += 1
                    ch.above.discard(ch.cum)
            else:
                ch.above.add(seq)
        self._outbox.append(
            P2P_HEADER.pack(P2P_ACK, flags, self.spec.rank, src, seq, ch.cum, call, 0)
        )

    def _on_ack(self, src: int, seq: int, cum: int, call: int, flags: int, now: float) -> None:
        ch = self._peers[src]
        if call == self.call & 0xFFFF and not flags & FLAG_EARLY:
            ch.entered = True
        pending = ch.inflight.pop(seq, None)
        if pending is not None:
            self._acked(ch, pending, now, answers_original=not flags & FLAG_RESEND)
        while ch.inflight:
            first = next(iter(ch.inflight))
            if first > cum:
                break
            self._acked(ch, ch.inflight.pop(first), now)
        self._detect_losses(src, ch, now)
        while ch.queue and len(ch.inflight) < self.window:
            qseq, packet = ch.queue.popleft()
            self._transmit(src, qseq, packet, now)

    def _acked(
        self, ch: _Channel, pending: _Pending, now: float, answers_original: bool = False
    ) -> None:
        """``answers_original``: the ack named this packet and echoed no FLAG_RESEND.
        ``pending`` is out of flight already; a sample's gains are divided by the packets
        in flight with it, on every channel (:meth:`hostlib.ina._Rtt.update`)."""
        self.last_progress = now
        if not pending.resent:  # Karn's rule: a retransmitted packet's ack is ambiguous ...
            self.rtt.update(now - pending.sent_at, self.policy, self._flight())
            ch.high_tx = max(ch.high_tx, pending.tx)
        elif answers_original:  # ... unless it answers the original: spurious
            self.rtt.update(now - pending.sent_at, self.policy, self._flight())
            self.stats.spurious += 1

    def _flight(self) -> int:
        """The packets in flight on every channel, plus the one just acknowledged; but
        no more than the samples taken so far, so that a session's first round trip
        (whose samples rise as the peers' queues fill) weighs them alike instead of
        barely moving from the first (star8 at 200 Mbit/s, 4 MiB float32 ring: 997-1,052
        timer retransmissions with this, 1,303-1,737 without)."""
        return min(1 + sum(len(ch.inflight) for ch in self._peers), max(self.rtt.samples, 1))

    def _detect_losses(self, dst: int, ch: _Channel, now: float) -> None:
        """Fast retransmission: a packet still unacknowledged when an ack answered a
        transmission ``reorder_threshold`` or more sends after it is taken as lost and
        sent again at once (TCP's duplicate-ack threshold, counted in transmissions as
        RACK counts in time; RFC 8985). One peer's acks arrive in the order it got the
        data, so only loss or reordering deeper than the threshold triggers it; the
        timer stays the backstop (the call's last packets have no later ones)."""
        threshold = ch.high_tx - reorder_threshold(self.window)
        order = ch.order
        while order and order[0][0] <= threshold:
            tx, seq = order.popleft()
            pending = ch.inflight.get(seq)
            if pending is not None and pending.tx == tx:
                self._retransmit(dst, seq, pending, now)
                self.stats.fast_retransmitted += 1

    # ------------------------------------------------------------------ timers
    def next_timer(self) -> float:
        """The earliest timer, or the stall clock's heartbeat while any timer runs
        (:attr:`RetryPolicy.heartbeat`)."""
        if not self._timers:
            return math.inf
        return min(self._timers[0][0], self._clock.seen + self.policy.heartbeat)

    def on_timer(self, now: float) -> None:
        """Retransmit every packet whose timeout expired (into the outbox); a timer
        whose packet was in flight while this endpoint stalled (``RetryPolicy.late_timer``)
        is re-armed from ``now`` once instead."""
        self._clock.observe(now, self.next_timer())
        timers, policy = self._timers, self.policy
        backed_off = False
        while timers and timers[0][0] <= now:
            deadline, dst, seq = heapq.heappop(timers)
            pending = self._peers[dst].inflight.get(seq)
            if pending is None or pending.deadline != deadline:
                continue  # acknowledged, or re-armed since
            stalled = self._clock.stalled - pending.stall_at
            if not pending.rearmed and policy.stalled_through(stalled, pending.rto):
                # This endpoint was not running, nor (on one machine) the peer it waits
                # for. One timeout more from now, same transmission.
                pending.rearmed = True
                pending.deadline = now + pending.rto
                heapq.heappush(timers, (pending.deadline, dst, seq))
                self.stats.late_timers += 1
                continue
            if not backed_off:  # RFC 6298 5.5, once per expiry: new packets wait longer too
                self.rtt.rto = min(self.rtt.rto * policy.backoff, policy.max_timeout)
                backed_off = True
            pending.rto = min(pending.rto * policy.backoff, policy.max_timeout)
            self._retransmit(dst, seq, pending, now)


class CollectiveCall:
    """One call of a host-based collective on one worker, as a state machine.

    Subclasses set up their state in :meth:`_prepare` (the constructor's last step, so
    a subclass without arguments of its own needs no ``__init__``), plan the messages in
    :meth:`_begin` and react to each new one in :meth:`_on_message`, counting down
    ``_remaining`` (messages still expected). The call is done when nothing is expected,
    every sent packet is acknowledged, and no datagram arrived for ``linger`` seconds (a
    peer whose last ack we lost retransmits within its timeout; a session instead answers
    such late packets in its next call or in close).

    Args:
        endpoint: the worker's session channels.
        data: 1-D int32 or float32 array (not modified).
        linger: quiet time before :attr:`done` (0 in a session).
        lanes: elements per message (packet) of this call; ``None``: ``spec.lanes``.
        window: packets in flight per peer in this call; ``None``: ``spec.window``.
            Every rank must pass the same ``lanes`` (messages are cut by it); the
            window may differ between ranks, but normally does not.

    Raises:
        TypeError: data is not int32/float32.
        ValueError: data is not 1-D, or lanes or window out of range.
    """

    def __init__(
        self,
        endpoint: P2pEndpoint,
        data: np.ndarray,
        linger: float = 0.0,
        *,
        lanes: int | None = None,
        window: int | None = None,
    ) -> None:
        check_call_data(data)
        self.endpoint = endpoint
        self.spec = endpoint.spec
        self.lanes, self.window = call_knobs(self.spec, lanes, window)
        self.data = data
        self.out = data.copy()
        self.linger = linger
        self._wire_dtype = data.dtype.newbyteorder("<")
        self._remaining = 0
        self._done = False
        self._prepare()

    # ------------------------------------------------------------------ for subclasses
    def _prepare(self) -> None:
        """The algorithm's state for this call, from the fields set above (``spec``,
        ``data``, ``lanes``, ...), ``_remaining`` among it.

        Raises:
            ValueError: a call the algorithm cannot make (e.g. too many messages).
        """

    def _begin(self, now: float) -> None:
        raise NotImplementedError

    def _on_message(self, src: int, tag: int, payload: memoryview, now: float) -> None:
        raise NotImplementedError

    def _received(self, payload: memoryview, lo: int, hi: int) -> np.ndarray:
        """``payload`` as elements, checked to fill ``out[lo:hi]``."""
        if len(payload) != 4 * (hi - lo):
            raise P2pError(
                f"rank {self.spec.rank} call {self.endpoint.call}: a message of "
                f"{len(payload) // 4} elements where {hi - lo} were expected "
                "(do all ranks call with the same sizes?)"
            )
        self._remaining -= 1
        return np.frombuffer(payload, dtype=self._wire_dtype)

    def _bad_tag(self, src: int, tag: int) -> P2pError:
        return P2pError(
            f"rank {self.spec.rank} call {self.endpoint.call}: unexpected message {tag} "
            f"from rank {src} (do all ranks call with the same sizes and algorithm?)"
        )

    # ------------------------------------------------------------------ driving
    @property
    def done(self) -> bool:
        return self._done

    def start(self, now: float) -> list[bytes | bytearray]:
        """Begin the call; return the first packets to send."""
        early = self.endpoint.begin_call(
            self._on_message, now, lanes=self.lanes, window=self.window
        )
        self._begin(now)
        for src, tag, payload in early:
            self._on_message(src, tag, memoryview(payload), now)
        self._check(now)
        return self.endpoint.take_outbox()

    def on_datagram(self, data: memoryview, now: float) -> None:
        """Take one datagram; what it causes to send comes out of the next on_timer."""
        self.endpoint.on_datagram(data, now)
        self._check(now)

    def next_wakeup(self) -> float:
        """When :meth:`on_timer` has work next."""
        ep = self.endpoint
        if ep.has_output:
            return -math.inf
        wake = min(ep.next_timer(), ep.last_progress + ep.policy.deadline)
        if self._remaining == 0 and not ep.unacked:
            wake = min(wake, ep.last_rx + self.linger)
        return wake

    def on_timer(self, now: float) -> list[bytes | bytearray]:
        """Packets to send at ``now``: acks, forwarded chunks, retransmissions.

        Raises:
            P2pTimeoutError: no new data or ack for longer than the policy's deadline.
        """
        ep = self.endpoint
        ep.on_timer(now)
        self._check(now)
        waiting = not self._done and (self._remaining or ep.unacked)
        if waiting and now >= ep.last_progress + ep.policy.deadline:
            raise P2pTimeoutError(self._timeout_message(now))
        return ep.take_outbox()

    def _check(self, now: float) -> None:
        ep = self.endpoint
        if self._done or self._remaining or ep.unacked:
            return
        if now >= ep.last_rx + self.linger:
            self._done = True
            ep.end_call()

    def _timeout_message(self, now: float) -> str:
        ep = self.endpoint
        return stall_message(ep, now - ep.last_progress, self._remaining)

    def result(self) -> np.ndarray:
        """The reduced array (the input's dtype and size).

        Raises:
            P2pError: the call has not completed.
        """
        if not self._done:
            raise P2pError("allreduce has not completed")
        return self.out


def __getattr__(name: str) -> Any:
    """``PeerCollective``, a session, moved up to ``hostlib.peers`` (issue #39): it still
    resolves here, imported on first use, with a ``DeprecationWarning``."""
    if name == "PeerCollective":
        from hostlib.peers import PeerCollective

        warnings.warn(f"{__name__}.{name} moved to hostlib.peers", DeprecationWarning, stacklevel=2)
        return PeerCollective
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
