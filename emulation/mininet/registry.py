"""Live emulations on this machine: which node names each one holds.

Mininet names a node's interfaces after the node (``h1-eth0``, ``s1-eth1``) and makes
the switches' in the root namespace, so two emulations with a node name in common
collide half-way through the build (``RTNETLINK answers: File exists``) and the first
one's interfaces are at risk. Each ``inalab emulate`` therefore registers the names it
will use, with its PID, the PID's start time and its run directory, in
:data:`REGISTRY_DIR` before it creates anything, and a second run that shares a name
is refused in one line naming the first run's directory and PID; so is a run whose
switches' interfaces exist without a live run holding them (a Mininet network not
started by ``inalab emulate``, or one that was killed before it cleaned up). A record whose
process is gone (or whose PID now belongs to another process: the start time
differs) is stale and is removed by the next run. Each run removes only its own record.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "REGISTRY_DIR",
    "EmulationBusy",
    "LiveRun",
    "existing_interfaces",
    "live_runs",
    "register",
]

REGISTRY_DIR = Path("/run/inalab/emulations")
"""Under /run: root's tmpfs, emptied at boot, so no record outlives a reboot."""

SYSFS_NET = Path("/sys/class/net")
"""This network namespace's interfaces, one entry each."""


class EmulationBusy(Exception):
    """Another live emulation holds some of the node names this one would create."""


@dataclass(frozen=True)
class LiveRun:
    """One registered emulation: who runs it, where its files are, what it holds."""

    pid: int
    start_time: int
    run_dir: str
    topology: str
    names: tuple[str, ...]

    @property
    def alive(self) -> bool:
        """Whether the recorded process still runs (the same process, not a reused PID)."""
        return _start_time(self.pid) == self.start_time


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _read(path: Path) -> LiveRun | None:
    try:
        doc = json.loads(path.read_text())
        return LiveRun(int(doc["pid"]), int(doc["start_time"]), str(doc["run_dir"]),
                       str(doc["topology"]), tuple(doc["names"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None  # half-written or foreign: treated as stale


def live_runs(directory: Path = REGISTRY_DIR) -> list[LiveRun]:
    """The registered emulations whose process still runs (stale records are left)."""
    runs = (_read(p) for p in sorted(directory.glob("*.json")))
    return [r for r in runs if r is not None and r.alive]


@contextmanager
def register(
    names: Iterable[str],
    run_dir: Path,
    topology: str,
    directory: Path = REGISTRY_DIR,
    sysfs: Path = SYSFS_NET,
) -> Iterator[LiveRun]:
    """Hold ``names`` for this process while the block runs; remove the record after.

    Args:
        names: the node names (hosts, switches) the emulation will create.
        run_dir: this run's directory (shown to a run that is refused).
        topology: the topology file or name (shown likewise).
        directory: where records are kept (tests use their own).
        sysfs: where this namespace's interfaces are listed (tests use their own).

    Raises:
        EmulationBusy: a live run holds one of the names (the message is one line that
            names its run directory and how to stop it), or interfaces named after them
            exist without one (another Mininet network, or one not cleaned up).
    """
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    start = _start_time(pid)
    assert start is not None  # our own /proc entry
    me = LiveRun(pid, start, str(run_dir), topology, tuple(sorted(set(names))))
    path = directory / f"{pid}.json"
    with open(directory / ".lock", "a") as lock:  # one checker at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _refuse_if_taken(me, directory, sysfs)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(me.__dict__) + "\n")
            tmp.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        yield me
    finally:
        path.unlink(missing_ok=True)


def _refuse_if_taken(me: LiveRun, directory: Path, sysfs: Path) -> None:
    for path in sorted(directory.glob("*.json")):
        other = _read(path)
        if other is None or not other.alive or other.pid == me.pid:
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        shared = sorted(set(other.names) & set(me.names))
        if shared:
            shown = ", ".join(shared[:4]) + (", ..." if len(shared) > 4 else "")
            raise EmulationBusy(
                f"nodes {shown} are in use by the emulation of {other.topology} running"
                f" in {other.run_dir} (PID {other.pid}); stop it with Ctrl-C in its"
                f" terminal or `sudo kill {other.pid}`, or rename the nodes"
            )
    present = existing_interfaces(me.names, sysfs)
    if present:
        shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
        raise EmulationBusy(
            f"interfaces {shown} exist already, and no live inalab emulate run holds"
            " them: another Mininet network with these node names runs (stop it), or one"
            f" was not cleaned up (`ip link del {present[0]}` for each)"
        )


def existing_interfaces(names: Iterable[str], sysfs: Path = SYSFS_NET) -> list[str]:
    """Interfaces in this namespace that Mininet would name for one of ``names``
    (``NAME-ethN``: a switch's ports live here; hosts' move to their namespaces)."""
    wanted = set(names)
    out = []
    for name in os.listdir(sysfs):
        node, sep, port = name.rpartition("-eth")
        if sep and node in wanted and port.isdigit():
            out.append(name)
    return sorted(out)
