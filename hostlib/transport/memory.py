"""An in-memory network in virtual time, for deterministic tests of the host library.

In the spirit of trio's FakeNet: workers' engines and a switch (anything with
``process(data, src)``, e.g. the soft switch pipeline) exchange datagrams through a
seeded network that loses, duplicates and reorders them. Time is virtual, so a
retransmission timeout costs nothing and every run with one seed is identical. The
engines are the same objects the UDP driver runs.

Layer: hostlib transports. The network drives any engine with the sans-I/O interface of
:class:`EngineLike` (``hostlib.ina``'s and ``hostlib.native``'s INA calls, the p2p
calls): it knows that interface and the error base :class:`~hostlib.errors.InaError`,
not the engines, which stand a floor above.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hostlib.errors import InaError
from hostlib.transport.base import Addr

__all__ = ["EngineLike", "FakeNetwork", "LinkModel", "SwitchLike"]


class _Emit(Protocol):
    payload: memoryview
    dests: Sequence[Addr]


_Packet = bytes | bytearray | memoryview


class EngineLike(Protocol):
    """What the fake network needs of a worker's engine: one call's sans-I/O state
    machine (:class:`~hostlib.ina.InaAllreduce` has it, and every engine held to it)."""

    @property
    def done(self) -> bool: ...

    def start(self, now: float) -> Iterable[_Packet]: ...

    def on_datagram(self, data: memoryview, now: float) -> _Packet | None: ...

    def next_wakeup(self) -> float: ...

    def on_timer(self, now: float) -> Iterable[_Packet]: ...


class SwitchLike(Protocol):
    """What the fake network needs of a switch (the soft switch pipeline has it)."""

    def process(self, data: memoryview, src: Addr) -> _Emit | None: ...


@dataclass(frozen=True)
class LinkModel:
    """Per-traversal impairments of every link (worker->switch and switch->worker).

    Raises:
        ValueError: a probability outside 0..1 or a negative time.
    """

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    latency: float = 20e-6
    reorder_delay: float = 200e-6

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} probability outside 0..1")
        if self.latency < 0 or self.reorder_delay < 0:
            raise ValueError("latencies must be >= 0")


@dataclass(order=True)
class _Event:
    time: float
    order: int
    dest: Addr = field(compare=False)
    src: Addr = field(compare=False)
    data: bytes = field(compare=False)


class FakeNetwork:
    """Runs INA engines against a switch over a simulated lossy network.

    Args:
        switch: the data plane under test.
        switch_addr: the address workers send to.
        link: impairments applied on every link traversal.
        seed: seed of the network's random decisions.
        uplink: seconds each packet toward the switch holds one link all workers share,
            in order of sending (0: no such link): a bottleneck's serialization and its
            queue, as 4 hosts' traffic meets on a pod's uplink (8 KiB at 100 Mbit/s is
            0.66 ms). ``queue_peak`` records the longest wait in its queue.

    Raises:
        ValueError: a negative ``uplink``.
    """

    def __init__(
        self, switch: SwitchLike, switch_addr: Addr, link: LinkModel | None = None, seed: int = 0,
        *, uplink: float = 0.0,
    ) -> None:  # fmt: skip
        if uplink < 0:
            raise ValueError("uplink must be >= 0 seconds per packet")
        self.switch = switch
        self.switch_addr = switch_addr
        self.link = link or LinkModel()
        self.uplink = uplink
        self._uplink_free = 0.0  # when the shared uplink has sent what it holds
        self.queue_peak = 0.0
        self.now = 0.0
        self._random = random.Random(seed)
        self._events: list[_Event] = []
        self._order = 0
        self._dead: dict[Addr, float] = {}
        self._stalls: list[tuple[float, float]] = []
        self.delivered = 0
        self.lost = 0

    def kill(self, addr: Addr, at: float) -> None:
        """From virtual time ``at`` on, the worker at ``addr`` neither sends nor receives."""
        self._dead[addr] = at

    def stall(self, at: float, duration: float) -> None:
        """From virtual time ``at`` the whole machine stops for ``duration`` seconds, as a
        VM does when the hypervisor takes its vCPUs: nothing moves and no worker runs;
        then everything resumes where it was, and the engines serve their timers late.

        Raises:
            ValueError: a negative time or duration.
        """
        if at < 0 or duration < 0:
            raise ValueError("a stall needs a time and a duration >= 0")
        heapq.heappush(self._stalls, (at, duration))

    def run(
        self, engines: Mapping[Addr, EngineLike], max_time: float = 3600.0
    ) -> dict[Addr, InaError | None]:
        """Drive every engine to completion (or failure); return each worker's error.

        Raises:
            RuntimeError: virtual time passed ``max_time`` with engines still running.
        """
        errors: dict[Addr, InaError | None] = {}
        live = dict(engines)
        for addr, engine in live.items():
            for packet in engine.start(self.now):
                self._transmit(addr, self.switch_addr, packet)
        while live:
            live = self._step(live, errors)
            if self.now > max_time:
                raise RuntimeError(f"fake network still running at t={self.now:.3f}")
        return errors

    def _step(
        self, live: dict[Addr, EngineLike], errors: dict[Addr, InaError | None]
    ) -> dict[Addr, EngineLike]:
        wake = min(e.next_wakeup() for e in live.values())
        upcoming = min(wake, self._events[0].time) if self._events else wake
        if self._stalls and self._stalls[0][0] <= upcoming:
            at, duration = heapq.heappop(self._stalls)
            at = max(at, self.now)
            for event in self._events:  # the world froze: all that was to come comes later
                if event.time >= at:
                    event.time += duration
            heapq.heapify(self._events)
            if self._uplink_free > at:
                self._uplink_free += duration
            self.now = at + duration
        elif self._events and self._events[0].time <= wake:
            event = heapq.heappop(self._events)
            self.now = max(self.now, event.time)
            self._deliver(event, live)
        else:
            self.now = max(self.now, wake)
        still = {}
        for addr, engine in live.items():
            try:
                for packet in engine.on_timer(self.now) if self._alive(addr) else ():
                    self._transmit(addr, self.switch_addr, packet)
            except InaError as exc:
                errors[addr] = exc
                continue
            if engine.done or not self._alive(addr):
                errors.setdefault(addr, None)
            else:
                still[addr] = engine
        return still

    def _deliver(self, event: _Event, live: Mapping[Addr, EngineLike]) -> None:
        self.delivered += 1
        if event.dest == self.switch_addr:
            emit = self.switch.process(memoryview(event.data), event.src)
            if emit is not None:
                payload = bytes(emit.payload)  # the switch reuses its output buffer
                for dest in emit.dests:
                    self._transmit(self.switch_addr, dest, payload)
            return
        engine = live.get(event.dest)
        if engine is None or not self._alive(event.dest):
            return
        packet = engine.on_datagram(memoryview(event.data), self.now)
        if packet is not None:
            self._transmit(event.dest, self.switch_addr, packet)

    def _queue_up(self) -> float:
        """A packet onto the shared uplink now: its wait plus its own serialization."""
        if not self.uplink:
            return 0.0
        start = max(self.now, self._uplink_free)
        self.queue_peak = max(self.queue_peak, start - self.now)
        self._uplink_free = start + self.uplink
        return self._uplink_free - self.now

    def _alive(self, addr: Addr) -> bool:
        return self.now < self._dead.get(addr, float("inf"))

    def _transmit(self, src: Addr, dest: Addr, data: _Packet) -> None:
        if not self._alive(src):
            return
        link, rnd = self.link, self._random.random
        copies = 2 if link.duplicate and rnd() < link.duplicate else 1
        for _ in range(copies):
            if link.loss and rnd() < link.loss:
                self.lost += 1
                continue
            delay = link.latency + (self._queue_up() if dest == self.switch_addr else 0.0)
            if link.reorder and rnd() < link.reorder:
                delay += rnd() * link.reorder_delay
            self._order += 1
            heapq.heappush(
                self._events, _Event(self.now + delay, self._order, dest, src, bytes(data))
            )
