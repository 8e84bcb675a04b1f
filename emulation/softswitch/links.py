"""Link emulation in the soft switch: per-port loss, delay and queue limit, each way.

This kernel has no netem, so the soft switch on Ethernet ports (``frames.py``) plays
the links itself. A port's :class:`LinkSpec` always applies to frames sent *out* of it
(egress); with ``ingress`` it applies to frames coming *in* too, before the pipeline
sees them. A link between two of our switches is then emulated once each way (by each
switch on egress), and a link to a host, which has no switch of ours at its end, by
the one switch in both directions.

Each direction is a :class:`LinkDirection`, netem's order of events: a seeded Bernoulli
loss first, then a delay line whose length is capped by the queue (tail drop beyond it).
The delay of a direction is constant, so the line is a FIFO whose head is due first.
This module is pure logic: no sockets, an injected clock; the switch supplies both.

A spec may also ask for duplication and reordering (``dup``, ``reorder``): only the eBPF
data plane applies those (``ina.bpf.c``; it reorders on egress, in the lanes of the
port's shaper: ``ebpf/lanes.py``), so :class:`LinkEmulator`, the Python data plane's,
refuses them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from emulation.softswitch.argtypes import parse_delay_ms

__all__ = [
    "DEFAULT_QUEUE",
    "DIRECTIONS",
    "LINK_STATS_INTERVAL",
    "ONLY_EBPF",
    "LinkCounters",
    "LinkDirection",
    "LinkEmulator",
    "LinkSpec",
    "LinkStatsFile",
    "format_link",
    "parse_delay",
    "parse_link",
]

DEFAULT_QUEUE = 1000
"""Frames a delay line holds when ``queue`` is not given: netem's default ``limit``."""

DIRECTIONS = ("egress", "ingress")
"""The two directions of a port, as named in counters and in the link stats file."""

F = TypeVar("F", bound=bytes | memoryview)

LINK_STATS_INTERVAL = 1.0
"""Seconds between two writes of the link stats file while serving (only on change)."""

log = logging.getLogger(__name__)

ONLY_EBPF = "only the eBPF data plane duplicates or reorders frames (use --datapath ebpf)"
"""Why a link with ``dup`` or ``reorder`` cannot run on the Python data plane."""


@dataclass(frozen=True)
class LinkSpec:
    """How one switch port's link behaves.

    Attributes:
        delay: one-way delay in seconds (>= 0).
        loss: probability a frame is lost, ``0 <= loss < 1``.
        dup: probability a frame the link keeps is sent twice, ``0 <= dup < 1`` (the
            eBPF data plane only).
        reorder: probability a frame the link sends out of the port is held back
            behind the frames queued after it, ``0 <= reorder < 1`` (the eBPF data plane
            only, on egress only: nothing queues on ingress).
        queue: frames the delay line holds (>= 1); more are tail-dropped. Without delay
            no frame waits, so the queue never fills.
        ingress: emulate frames arriving on the port too (the port faces a host).

    Raises:
        ValueError: a value out of its range.
    """

    delay: float = 0.0
    loss: float = 0.0
    queue: int = DEFAULT_QUEUE
    ingress: bool = False
    dup: float = 0.0
    reorder: float = 0.0

    def __post_init__(self) -> None:
        if not self.delay >= 0.0:  # also rejects NaN
            raise ValueError(f"delay {self.delay} s is negative")
        for name in _PROBABILITIES:
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} {getattr(self, name)} outside [0, 1)")
        if isinstance(self.queue, bool) or not isinstance(self.queue, int) or self.queue < 1:
            raise ValueError(f"queue {self.queue!r} is not an integer >= 1")


_PROBABILITIES = ("loss", "dup", "reorder")
"""The keys of a spec that are a probability per frame."""


def parse_delay(text: str) -> float:
    """Parse a delay such as ``250us``, ``2ms``, ``0.1s`` or ``2`` (ms) into seconds.

    Raises:
        ValueError: not a non-negative number with an optional us/ms/s unit.
    """
    return parse_delay_ms(text) / 1e3


def parse_link(text: str) -> tuple[int, LinkSpec]:
    """Parse ``--link PORT:delay=2ms,loss=0.01,queue=100,ingress`` (argparse ``type=``;
    also ``dup=P`` and ``reorder=P``).

    Every key is optional (``1:ingress`` counts frames both ways and changes nothing);
    a key given twice is an error.

    Raises:
        argparse.ArgumentTypeError: no ``PORT:``, a port outside 0..511, an unknown or
            repeated key, or a value out of range.
    """
    port, sep, rest = text.partition(":")
    if not sep or not port.isdigit() or int(port) > 511:
        raise argparse.ArgumentTypeError(f"{text!r} is not PORT:KEY=VALUE,... with a port 0..511")
    fields: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key in fields:
            raise argparse.ArgumentTypeError(f"{key!r} given twice in {text!r}")
        try:
            fields[key] = _link_value(key, eq, value.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    try:
        return int(port), LinkSpec(**fields)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _link_value(key: str, eq: str, value: str) -> Any:
    if key == "ingress":
        if eq:
            raise ValueError("ingress is a flag and takes no value")
        return True
    if not eq:
        raise ValueError(f"{key!r} needs a value ({key}=...)")
    if key == "delay":
        return parse_delay(value)
    if key in _PROBABILITIES:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{key} {value!r} is not a number") from None
    if key == "queue":
        if not value.isdigit():
            raise ValueError(f"queue {value!r} is not an integer >= 1")
        return int(value)
    raise ValueError(f"unknown key {key!r} (delay, loss, queue, ingress, dup, reorder)")


def format_link(port: int, spec: LinkSpec) -> str:
    """The ``--link`` text of ``spec`` on ``port`` (:func:`parse_link` reads it back)."""
    text = f"{port}:delay={spec.delay!r}s,loss={spec.loss!r},queue={spec.queue}"
    text += "".join(f",{k}={getattr(spec, k)!r}" for k in ("dup", "reorder") if getattr(spec, k))
    return text + (",ingress" if spec.ingress else "")


@dataclass
class LinkCounters:
    """What happened to the frames offered to one direction of a link.

    ``offered = lost + queue_dropped + delivered + in_flight``: ``in_flight`` frames
    wait in the delay line (counted as delivered when they leave it).
    """

    offered: int = 0
    lost: int = 0
    queue_dropped: int = 0
    delivered: int = 0
    in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "offered": self.offered,
            "lost": self.lost,
            "queue_dropped": self.queue_dropped,
            "delivered": self.delivered,
            "in_flight": self.in_flight,
        }


class LinkDirection:
    """One direction of one link: Bernoulli loss, then a FIFO delay line with a limit.

    Args:
        spec: delay, loss and queue (``spec.ingress`` is the caller's business).
        rng: this direction's own random stream (its loss pattern depends on it alone).
        clock: seconds, monotonic; read only when the direction has a delay.
    """

    def __init__(
        self,
        spec: LinkSpec,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.counters = LinkCounters()
        self._delay = spec.delay
        self._loss = spec.loss
        self._queue = spec.queue
        self._random = rng.random
        self._clock = clock
        self._line: deque[tuple[float, bytes]] = deque()

    def offer(self, frame: F) -> F | None:
        """Offer a frame to the link.

        Returns:
            ``frame`` itself when it passes now (no delay); None when it is lost,
            tail-dropped, or waits in the delay line (a copy: ``frame`` may be reused).
        """
        c = self.counters
        c.offered += 1
        if self._loss and self._random() < self._loss:
            c.lost += 1
            return None
        if not self._delay:
            c.delivered += 1
            return frame
        line = self._line
        if len(line) >= self._queue:
            c.queue_dropped += 1
            return None
        line.append((self._clock() + self._delay, bytes(frame)))
        c.in_flight += 1
        return None

    @property
    def next_due(self) -> float | None:
        """When the head of the delay line is due (clock seconds), None when empty."""
        return self._line[0][0] if self._line else None

    def release(self, now: float) -> list[bytes]:
        """Take the frames due at ``now`` out of the delay line, oldest first."""
        line = self._line
        out = []
        while line and line[0][0] <= now:
            out.append(line.popleft()[1])
        if out:
            c = self.counters
            c.delivered += len(out)
            c.in_flight -= len(out)
        return out


class LinkEmulator:
    """The emulated directions of a switch's ports, built from their specs.

    Args:
        specs: switch port -> its link; an egress direction for each, an ingress one
            for those with ``ingress``.
        seed: the seed every direction's random stream derives from, with the port and
            direction, so each has its own reproducible stream.
        clock: seconds, monotonic, shared by all directions.

    Raises:
        ValueError: a spec asks for duplication or reordering (the eBPF data plane's).
    """

    def __init__(
        self,
        specs: Mapping[int, LinkSpec],
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for port, spec in sorted(specs.items()):
            if spec.dup or spec.reorder:
                raise ValueError(f"port {port}: {ONLY_EBPF}")
        self.specs = dict(specs)
        self.clock = clock
        self.egress: dict[int, LinkDirection] = {}
        self.ingress: dict[int, LinkDirection] = {}
        for port, spec in sorted(self.specs.items()):
            self.egress[port] = LinkDirection(spec, _stream(seed, port, "egress"), clock)
            if spec.ingress:
                self.ingress[port] = LinkDirection(spec, _stream(seed, port, "ingress"), clock)
        self._delayed = [d for d in (*self.egress.values(), *self.ingress.values()) if d.spec.delay]

    def __bool__(self) -> bool:
        return bool(self.specs)

    def next_due(self) -> float | None:
        """The earliest due time of any delayed frame, None when none waits."""
        dues = [d for line in self._delayed if (d := line.next_due) is not None]
        return min(dues) if dues else None

    def release(self, now: float) -> Iterator[tuple[str, int, bytes]]:
        """``(direction, port, frame)`` for every frame due at ``now``, port by port."""
        for name, lines in (("egress", self.egress), ("ingress", self.ingress)):
            for port, line in lines.items():
                if line.next_due is not None and line.next_due <= now:
                    for frame in line.release(now):
                        yield name, port, frame

    def stats(self) -> dict[str, Any]:
        """``{"ports": {"1": {"egress": {...}, "ingress": {...}}}}`` (no ``ingress`` key
        for a port emulated on egress only); values as :meth:`LinkCounters.as_dict`."""
        ports: dict[str, Any] = {}
        for port in self.specs:
            entry = {"egress": self.egress[port].counters.as_dict()}
            if port in self.ingress:
                entry["ingress"] = self.ingress[port].counters.as_dict()
            ports[str(port)] = entry
        return {"ports": ports}

    def counters(self) -> dict[str, int]:
        """The same counts flat, for the switch's counters: ``link<PORT>_<dir>_<count>``."""
        return {
            f"link{port}_{direction}_{key}": value
            for port, entry in self.stats()["ports"].items()
            for direction, counts in entry.items()
            for key, value in counts.items()
        }


def _stream(seed: int, port: int, direction: str) -> random.Random:
    # A str seed is hashed with SHA-512: stable across runs and PYTHONHASHSEED, and
    # unrelated to the DropSimulator's Random(seed).
    return random.Random(f"inalab-link:{seed}:{port}:{direction}")


class LinkStatsFile:
    """Where a switch writes its links' counts (``--link-stats``): JSON from ``stats``
    (:meth:`LinkEmulator.stats`'s shape), replaced atomically, only when it changed.

    Args:
        path: the file; None writes nothing.
        stats: what to write, called at each write.
    """

    def __init__(self, path: Path | None, stats: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self._stats = stats
        self._text = ""
        self._due = 0.0

    def write(self) -> None:
        """Write the counts now (if they changed).

        Raises:
            OSError: the file cannot be written.
        """
        if self.path is None:
            return
        text = json.dumps(self._stats(), sort_keys=True) + "\n"
        if text == self._text:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._text = text

    def write_logged(self) -> None:
        """:meth:`write`, logging a failure: while serving, a full disk must not stop the
        data plane."""
        try:
            self.write()
        except OSError as exc:
            log.warning("cannot write link stats %s: %s", self.path, exc)

    def tick(self) -> None:
        """Write if :data:`LINK_STATS_INTERVAL` has passed since the last tick's write."""
        if self.path is None:
            return
        now = time.monotonic()
        if now >= self._due:
            self._due = now + LINK_STATS_INTERVAL
            self.write_logged()
