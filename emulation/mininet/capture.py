"""Recording a switch's ports with tcpdump, for data planes whose frames never reach a
process: the eBPF program answers in the kernel, so ``inalab emulate --pcap`` taps its
ports instead of asking the switch process to write what it saw.

A tap on a port sees a frame arriving before the program's ingress link faults (loss,
duplication: a duplicate is put back at the end of the receive queue, and is seen
again) and a frame leaving after the egress faults (a frame the link lost never leaves;
a duplicate leaves twice; a held-back frame leaves late): what a wire between the host
and the switch would carry, on the switch's side of the link's faults.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["TCPDUMP", "CaptureError", "PortCapture"]

TCPDUMP = "tcpdump"
_READY_S = 10.0


class CaptureError(RuntimeError):
    """tcpdump is missing, or a capture did not start."""


class PortCapture:
    """One ``tcpdump -w`` per port of a switch, into ``run_dir/INTERFACE.pcap``.

    Only the processes this object started are stopped (their PIDs are its own).
    """

    def __init__(self, run_dir: Path, interfaces: Mapping[int, str]) -> None:
        self.paths = {port: Path(run_dir) / f"{name}.pcap" for port, name in interfaces.items()}
        self._interfaces = dict(interfaces)
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> PortCapture:
        """Start every port's tcpdump and wait until each listens.

        Raises:
            CaptureError: tcpdump is not on PATH, or one exited or did not listen within
                10 s (its stderr is in the message).
        """
        tcpdump = shutil.which(TCPDUMP)
        if tcpdump is None:
            raise CaptureError("tcpdump is not on PATH (apt install tcpdump)")
        try:
            for port, name in sorted(self._interfaces.items()):
                self._procs.append(self._start_one(tcpdump, name, self.paths[port]))
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _start_one(tcpdump: str, interface: str, path: Path) -> subprocess.Popen[bytes]:
        # -U: each packet written as it comes (a run stopped early keeps its frames);
        # -s 0: whole frames (the ICRC is the last 4 bytes); -n: no name lookups.
        proc = subprocess.Popen(
            [tcpdump, "-i", interface, "-w", str(path), "-U", "-s", "0", "-n",
             "-B", "16384", "--immediate-mode"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        deadline = time.monotonic() + _READY_S
        line = b""
        while time.monotonic() < deadline:
            line = proc.stderr.readline()  # "listening on IFACE, link-type ..." once ready
            if b"listening on" in line or not line:
                break
        if b"listening on" not in line:
            proc.kill()
            rest = proc.stderr.read().decode(errors="replace")
            raise CaptureError(f"tcpdump on {interface}: {line.decode(errors='replace')}{rest}")
        return proc

    def stop(self) -> None:
        """Stop the captures (SIGTERM: tcpdump flushes and closes its file); idempotent."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        self._procs.clear()
