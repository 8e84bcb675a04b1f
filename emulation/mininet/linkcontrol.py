"""Changing the emulated links' rate from inside a job: ``inalab emulate TOPOLOGY run``
serves it, a rank's program asks for it.

A training script run by ``inalab emulate ... run`` may want the network to change at a
point of its own (an iteration), as ``inalab replay --scenario bandwidth-drop`` changes
it between iterations. The ranks run in the hosts' network namespaces and cannot run
``tc`` on the switch side, and the emulator does not know the script's iterations; so
the emulator listens on a Unix socket in its run directory (a path in the file system:
reachable from every namespace, unlike an abstract socket), named to the ranks by
``INALAB_LINK_CONTROL``, and a rank asks with :func:`set_link_rate`.

The protocol is one line each way: ``rate MBIT`` asks for every host link's HTB rate
(both ends) to become ``MBIT`` Mbit/s; the answer is ``ok MBIT`` once ``tc`` has changed
every link, or ``error MESSAGE``. Requests are served one at a time, in order of arrival.
Every request and its outcome is printed by the emulator (``# run: ...``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

__all__ = [
    "ENV_LINK_CONTROL",
    "LinkControlError",
    "serve",
    "set_link_rate",
]

log = logging.getLogger(__name__)

ENV_LINK_CONTROL = "INALAB_LINK_CONTROL"
"""The Unix socket where ``inalab emulate TOPOLOGY run`` takes link-rate requests."""

_ANSWER_TIMEOUT = 30.0
"""Seconds a rank waits for the answer: ``tc`` on every host link of a large topology."""


class LinkControlError(RuntimeError):
    """The link rate could not be changed (no emulator to ask, or it refused)."""


def set_link_rate(mbit: float, environ: Mapping[str, str] | None = None) -> float:
    """Ask the emulator running this program to set every host link to ``mbit`` Mbit/s;
    returns once it has. Call it from one rank (the others should wait at a barrier).

    Raises:
        ValueError: ``mbit`` not a positive finite number.
        LinkControlError: not run by ``inalab emulate TOPOLOGY run``, the emulator gone,
            or the change refused (e.g. unshaped links), with the emulator's reason.
    """
    if not (math.isfinite(mbit) and mbit > 0):
        raise ValueError(f"a link rate must be a positive number of Mbit/s, got {mbit!r}")
    env = os.environ if environ is None else environ
    path = env.get(ENV_LINK_CONTROL)
    if not path:
        raise LinkControlError(
            f"no {ENV_LINK_CONTROL}: link rates change only under inalab emulate TOPOLOGY run"
        )
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_ANSWER_TIMEOUT)
            sock.connect(path)
            sock.sendall(f"rate {mbit:g}\n".encode())
            answer = sock.makefile("r", encoding="utf-8").readline().strip()
    except OSError as exc:
        raise LinkControlError(f"the emulator at {path} did not answer: {exc}") from None
    word, _, rest = answer.partition(" ")
    if word == "ok":
        return float(rest)
    if word == "error":
        raise LinkControlError(f"the emulator refused rate {mbit:g} Mbit/s: {rest}")
    raise LinkControlError(f"the emulator at {path} answered {answer!r}")


@contextlib.contextmanager
def serve(
    path: Path, set_rate: Callable[[float], None], say: Callable[[str], None]
) -> Iterator[Path]:
    """Take link-rate requests at ``path`` (a Unix socket, created here and removed on
    exit; in a directory of its own under the temporary directory when ``path`` is too
    long for a socket's address) until the block ends, yielding where it listens; each
    request runs ``set_rate(mbit)`` and ``say``s what happened. ``set_rate`` raising is
    answered as ``error`` with its message."""
    with contextlib.ExitStack() as stack:
        if len(os.fsencode(path)) >= _SUN_PATH_MAX:
            path = (
                Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="inalab-"))) / path.name
            )
        yield stack.enter_context(_listening(path, set_rate, say))


_SUN_PATH_MAX = 108
"""``sizeof(sockaddr_un.sun_path)`` on Linux, the terminating NUL included."""


@contextlib.contextmanager
def _listening(
    path: Path, set_rate: Callable[[float], None], say: Callable[[str], None]
) -> Iterator[Path]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(8)
        stop = threading.Event()
        thread = threading.Thread(
            target=_accept, args=(listener, stop, set_rate, say), name="link-control", daemon=True
        )
        thread.start()
        try:
            yield path
        finally:
            stop.set()
            # The accept loop wakes on its timeout; close after it has seen stop.
            thread.join(timeout=5.0)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


_ACCEPT_POLL = 0.2


def _accept(
    listener: socket.socket,
    stop: threading.Event,
    set_rate: Callable[[float], None],
    say: Callable[[str], None],
) -> None:
    listener.settimeout(_ACCEPT_POLL)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return  # closed under us
        with conn:
            conn.settimeout(_ANSWER_TIMEOUT)
            try:
                line = conn.makefile("r", encoding="utf-8").readline()
                conn.sendall((_answer(line, set_rate, say) + "\n").encode())
            except OSError as exc:  # the rank went away: its problem, not the run's
                log.warning("link control: %s", exc)


def _answer(line: str, set_rate: Callable[[float], None], say: Callable[[str], None]) -> str:
    """The answer to one request line (see the module docstring)."""
    word, _, value = line.strip().partition(" ")
    if word != "rate":
        return f"error unknown request {line.strip()!r} (expected: rate MBIT)"
    try:
        mbit = float(value)
    except ValueError:
        return f"error not a rate: {value!r}"
    if not (math.isfinite(mbit) and mbit > 0):
        return f"error not a positive rate: {value!r}"
    try:
        set_rate(mbit)
    except Exception as exc:  # reported to the rank, which raises it; the run goes on
        say(f"# run: host links not set to {mbit:g} Mbit/s: {exc}")
        return f"error {exc}"
    say(f"# run: host links set to {mbit:g} Mbit/s (asked by a rank)")
    return f"ok {mbit:g}"
