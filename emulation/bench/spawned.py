"""Processes a measurement spawns per rank (switch-only's senders, the wire floor's
ranks): their next report from a queue, without waiting out a dead one, and their end."""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

__all__ = ["HANDSHAKE_SECONDS", "next_report", "reap"]

HANDSHAKE_SECONDS = 60.0
"""How long a spawned rank may take to report: N interpreters that import numpy start
on a loaded host."""


def next_report(
    q: Queue[Any],
    procs: Sequence[BaseProcess],
    error: type[Exception],
    what: str,
    seconds: float = HANDSHAKE_SECONDS,
) -> Any:
    """The next item of ``q``; ``error`` if one of ``procs`` died first (non-zero exit)
    or nothing came within ``seconds``. ``what``: the processes, for the message."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            pass  # look whether a process died instead of waiting the whole deadline
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise error(f"{what} process failed with exit codes {dead}")
    raise error(f"no {what} report within {seconds:g} s")


def reap(procs: Sequence[BaseProcess]) -> None:
    """Join the processes; terminate (by their own handles) any still running."""
    for p in procs:
        p.join(timeout=5.0)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
