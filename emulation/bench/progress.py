"""Progress of a sweep, for a person watching a terminal.

One line per finished size (``# [3/12] ina 64K done, 4.1 s``) on standard error when it
is a terminal; nothing otherwise, so logs and CI output hold only the tables. Lines, not
a redrawn bar: they read the same in any terminal, a pty of unknown width included, and
stay on screen as a record of where the time went.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from emulation.bench.config import format_size

__all__ = ["TerminalProgress"]


class TerminalProgress:
    """Count finished steps out of ``total`` and, on a terminal, print one line each.

    Args:
        total: the steps to come (e.g. algorithms x sizes).
        stream: where lines go (default standard error).
        enabled: None: only when ``stream`` is a terminal.
    """

    def __init__(
        self, total: int, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled if enabled is not None else bool(isatty and isatty())
        self.done = 0
        self._start = time.monotonic()

    def step(self, what: str) -> None:
        """One more step finished: ``what`` it was."""
        self.done += 1
        if self.enabled:
            elapsed = time.monotonic() - self._start
            print(f"# [{self.done}/{self.total}] {what} done, {elapsed:.1f} s",
                  file=self.stream, flush=True)  # fmt: skip

    def sweep(self, sizes: Sequence[int], prefix: str = "") -> Callable[[str, int], None]:
        """The ``progress`` callback of a sweep of ``sizes``: (algorithm, size index)."""
        return lambda algo, k: self.step(f"{prefix}{algo} {format_size(sizes[k])}")
