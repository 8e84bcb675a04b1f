"""A cluster on this machine for tests: network namespaces as machines, each with one
interface and its own address, joined by a plain Linux bridge (the "existing network").
No Mininet: nothing here is an emulated host, only namespaces and veths, as a real
cluster's machines and switch would be.

Cleanup removes exactly what this object made (its namespaces, its bridge, the root ends
of its veths), recorded as it made them. :func:`one_armed_server` runs a reduction server
on one of the machines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["Cluster", "Machine", "one_armed_server"]

REPO = Path(__file__).resolve().parents[1]


def _ip(*argv: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *argv], check=True, capture_output=True, timeout=30)


def _tc(*argv: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "tc", *argv], check=True, capture_output=True, timeout=30)


@dataclass
class Machine:
    """One namespace: its name, address and the interface (``eth0``) it has, and the
    root namespace's end of its veth (on the bridge: its counters are the machine's
    traffic, ``rx`` what it sent)."""

    name: str
    netns: str
    ip: str
    ifname: str = "eth0"
    outside: str = ""

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this machine."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Cluster:
    """Machines on one bridge, 10.NET.0.0/24 (the bridge itself is .254 in the root
    namespace, so the root can reach every machine, as an operator's laptop would).

    Args:
        machines: name -> last octet of its address.
        net: the second octet of the subnet.
        rates: name -> link rate in Mbit/s (HTB on both ends of its veth); absent:
            unshaped.
        mtu: every interface's MTU (9000: jumbo frames, for 2048-lane INA packets).
        loopback_hostname: inside every machine, this host's name resolves to
            127.0.1.1, as Debian's ``/etc/hosts`` makes it (``ip netns exec`` mounts
            ``/etc/netns/NETNS/hosts`` over ``/etc/hosts``): programs that bind the
            address their hostname resolves to (Gloo's default) get loopback.
    """

    machines: dict[str, int]
    net: int = 77
    rates: dict[str, float] = field(default_factory=dict)
    mtu: int = 1500
    loopback_hostname: bool = True
    tag: str = field(default_factory=lambda: f"c{os.getpid() % 100000}")
    made: dict[str, Machine] = field(default_factory=dict, init=False)
    _bridge: str | None = field(default=None, init=False)
    _veths: list[str] = field(default_factory=list, init=False)
    _etc: list[Path] = field(default_factory=list, init=False)

    @property
    def bridge_ip(self) -> str:
        return f"10.{self.net}.0.254"

    def __getitem__(self, name: str) -> Machine:
        return self.made[name]

    def __enter__(self) -> Cluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        bridge = f"{self.tag}br"
        _ip("link", "add", bridge, "type", "bridge")
        self._bridge = bridge
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", bridge)
        _ip("link", "set", bridge, "mtu", str(self.mtu), "up")
        for i, (name, octet) in enumerate(sorted(self.machines.items())):
            netns = f"{self.tag}-{name}"
            _ip("netns", "add", netns)
            outside = f"{self.tag}v{i}"
            machine = Machine(name, netns, f"10.{self.net}.0.{octet}", outside=outside)
            self.made[name] = machine
            _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", netns)
            self._veths.append(outside)
            _ip("link", "set", outside, "master", bridge, "mtu", str(self.mtu), "up")
            _ip("addr", "add", f"{machine.ip}/24", "dev", "eth0", netns=netns)
            _ip("link", "set", "eth0", "mtu", str(self.mtu), "up", netns=netns)
            _ip("link", "set", "lo", "up", netns=netns)
            if self.loopback_hostname:
                self._hosts_file(netns)
            rate = self.rates.get(name)
            if rate is not None:  # both ways: out of the machine, and out of the bridge
                for dev, ns in (("eth0", netns), (outside, None)):
                    _tc("qdisc", "add", "dev", dev, "root", "handle", "5:", "htb",
                        "default", "1", netns=ns)  # fmt: skip
                    _tc("class", "add", "dev", dev, "parent", "5:", "classid", "5:1", "htb",
                        "rate", f"{rate}mbit", "burst", "64k", "cburst", "64k",
                        netns=ns)  # fmt: skip

    def _hosts_file(self, netns: str) -> None:
        """``/etc/netns/NETNS/hosts``: this host's name at 127.0.1.1 (recorded for
        :meth:`close`)."""
        etc = Path("/etc/netns", netns)
        etc.mkdir(parents=True)
        self._etc.append(etc)
        name = socket.gethostname()
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n")

    def close(self) -> None:
        """Remove the namespaces, veths and bridge this cluster made; idempotent."""
        for machine in self.made.values():
            subprocess.run(["ip", "netns", "del", machine.netns], capture_output=True, timeout=30)
        self.made.clear()
        for dev in self._veths:  # gone with their namespace's end, normally
            subprocess.run(["ip", "link", "del", dev], capture_output=True, timeout=30)
        self._veths.clear()
        for etc in self._etc:
            shutil.rmtree(etc, ignore_errors=True)
        self._etc.clear()
        if self._bridge is not None:
            subprocess.run(["ip", "link", "del", self._bridge], capture_output=True, timeout=30)
            self._bridge = None


@contextlib.contextmanager
def one_armed_server(
    machine: Machine,
    run: Path,
    tls: str,
    *args: str,
    front: Sequence[str] = ("--one-armed", "eth0"),
) -> Iterator[dict[str, Any]]:
    """``inalab switch --one-armed eth0`` on ``machine``, P4Runtime at its address on port
    9559 behind mutual TLS (``tls``: ``CERT,KEY,CA``), with ``args`` added; its log and
    ready file in ``run``. Yields the ready file's content with ``log`` (its path) and
    ``proc``; on exit stops the switch if it still runs (its exit status is then
    ``proc.returncode``). ``front`` says how frames reach it: by default the eBPF
    one-armed data plane on ``eth0``; ``("--listen", "IP:PORT")``: the Python data plane
    on a UDP socket (what serves INA over RoCEv2 where the eBPF one does not yet).

    Raises:
        RuntimeError: the switch exited, or was not ready within 60 s (its log attached).
    """
    run.mkdir(parents=True, exist_ok=True)
    ready, log = run / "ready.json", run / "switch.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            machine.command([sys.executable, "-m", "emulation.cli", "switch", *front,
                             "--p4runtime", f"{machine.ip}:9559", "--p4runtime-tls",
                             tls, "--ready-file", str(ready), *args]),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.stat().st_size):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no switch on {machine.name}: {log.read_text()}")
            time.sleep(0.1)
        yield {**json.loads(ready.read_text()), "log": log, "proc": proc}
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
