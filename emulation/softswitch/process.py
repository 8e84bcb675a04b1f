"""The soft switch as a separate process: start it, prove it is ready, stop it.

p4-utils' ``P4Switch.start`` pattern, with a sleeping poll: the switch is ready when its
ready file exists, its recorded PID is alive, and its P4Runtime server answers.
On failure the error names the switch's log and quotes its tail. :meth:`stop` signals
only the PID this object started.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import grpc
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.switch import SwitchController
from controller.tls import TlsFiles, grpc_channel
from emulation.softswitch.pipeline import Addr
from hostlib.protocol import LANES_PER_PACKET, SWITCH_SLOTS

__all__ = [
    "RecordedProcess",
    "SoftSwitchProcess",
    "SwitchStartError",
    "with_parent_death_signal",
]

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.02
_LOG_TAIL_LINES = 20


class SwitchStartError(RuntimeError):
    """The switch process did not become ready; the message names its log and tail."""

    def __init__(self, message: str, log_path: Path) -> None:
        super().__init__(f"{message}; log {log_path}:\n{_tail(log_path)}")
        self.log_path = log_path


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that the kernel sends it SIGTERM when this process dies.

    util-linux's ``setpriv --pdeathsig`` sets ``PR_SET_PDEATHSIG`` and execs ``argv`` (same
    PID), so a switch does not outlive a run that was killed outright (SIGKILL, a crash),
    where no cleanup code runs. The signal follows the *thread* that started the child:
    start switches from a thread that lives as long as they should. Without ``setpriv``
    (not Linux), ``argv`` unchanged.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "TERM", "--", *argv]


class RecordedProcess:
    """A child process this run started, known by its recorded PID: stopped by SIGTERM,
    then SIGKILL, never found by name, and sent SIGTERM by the kernel if this process
    dies first; its output goes to ``log_path``.

    Subclasses call :meth:`_launch` in :meth:`start`; ``what`` names the process in
    messages.
    """

    what = "switch"
    log_path: Path

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self.returncode: int | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the recorded PID, wait, SIGKILL if it lingers; idempotent.

        Returns:
            the exit status (negative: killed by that signal), or None if never started.
        """
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s pid %d ignored SIGTERM; killing it", self.what, proc.pid)
                proc.kill()
                proc.wait()
        if proc is not None:
            self.returncode = proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit by itself (a signal sent by someone else, a crash).

        Raises:
            RuntimeError: never started.
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        proc = self._require_proc()
        self.returncode = proc.wait(timeout)
        return self.returncode

    def is_running(self) -> bool:
        """Whether the recorded process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Self:
        return self if self._proc is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """PID of the process.

        Raises:
            RuntimeError: never started.
        """
        return self._require_proc().pid

    def _require_proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"{self.what} process not started")
        return self._proc

    def _launch(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Run ``argv`` with stdout and stderr in ``log_path``, dying with this process.

        Raises:
            SwitchStartError: it could not be run (the log is closed again).
        """
        self._log_file = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                with_parent_death_signal(argv),
                stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            )  # fmt: skip
        except OSError as exc:
            self.stop()
            raise SwitchStartError(f"cannot run {argv[0]}: {exc}", self.log_path) from exc
        log.debug("%s pid %d: %s", self.what, self._proc.pid, " ".join(argv))
        return self._proc


class SoftSwitchProcess(RecordedProcess):
    """One ``inalab switch`` subprocess with its addresses, PID and log.

    It runs ``python -m emulation.softswitch.cli`` (the same options and code as
    ``inalab switch``) so the switch does not import the other subcommands.

    Args:
        run_dir: directory for ``<name>.log`` and ``<name>.ready.json`` (created).
        name: file name stem, unique within ``run_dir``.
        host: address both sockets bind to; the ports are chosen by the kernel.
        lanes: int32 lanes per packet.
        slots: slots per set in the switch pool.
        drop_ingress: drop probability at ingress.
        drop_egress: drop probability per result replica at egress.
        seed: drop simulator seed.
        start_timeout: seconds :meth:`start` waits for readiness.
        interfaces: switch port -> network interface: the switch takes Ethernet
            frames on these (root) instead of UDP datagrams.
        extra_args: more ``inalab switch`` options, appended as given.
        tls: serve P4Runtime over mutual TLS with these files (``--p4runtime-tls``).
        controller_tls: the client's files for the readiness check and
            :meth:`controller`; required with ``tls``.

    Raises:
        ValueError: ``tls`` without ``controller_tls``.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        name: str = "switch",
        host: str = "127.0.0.1",
        lanes: int = LANES_PER_PACKET,
        slots: int = SWITCH_SLOTS,
        drop_ingress: float = 0.0,
        drop_egress: float = 0.0,
        seed: int = 0,
        start_timeout: float = 15.0,
        interfaces: dict[int, str] | None = None,
        extra_args: tuple[str, ...] = (),
        tls: TlsFiles | None = None,
        controller_tls: TlsFiles | None = None,
    ) -> None:
        if tls is not None and controller_tls is None:
            raise ValueError("a switch serving mutual TLS needs controller_tls to reach it")
        self.run_dir = Path(run_dir)
        self.log_path = self.run_dir / f"{name}.log"
        self.ready_path = self.run_dir / f"{name}.ready.json"
        self.start_timeout = start_timeout
        self.argv = [
            sys.executable, "-m", "emulation.softswitch.cli", "-v",
            "--listen", f"{host}:0", "--p4runtime", f"{host}:0",
            "--ready-file", str(self.ready_path),
            "--lanes", str(lanes), "--slots", str(slots),
            "--drop-ingress", repr(drop_ingress), "--drop-egress", repr(drop_egress),
            "--seed", str(seed), *extra_args,
        ]  # fmt: skip
        for port, iface in (interfaces or {}).items():
            self.argv += ["--interface", f"{port}@{iface}"]
        self.controller_tls = controller_tls
        if tls is not None:
            self.argv += ["--p4runtime-tls", str(tls)]
        super().__init__()
        self._ready: dict[str, Any] | None = None

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> SoftSwitchProcess:
        """Launch the switch and wait until it is ready; return ``self``.

        Raises:
            RuntimeError: already started.
            SwitchStartError: it could not be run, exited, or was not ready within
                ``start_timeout``; the process is stopped before this is raised.
        """
        if self._proc is not None:
            raise RuntimeError("switch process already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Our own file from an earlier start in this run directory: never a stale answer.
        self.ready_path.unlink(missing_ok=True)
        proc = self._launch(self.argv)
        try:
            self._wait_ready(proc)
        except BaseException:
            self.stop()
            raise
        return self

    # ----------------------------------------------------------------- what it realised
    @property
    def data_addr(self) -> Addr:
        """The UDP ``(ip, port)`` workers send to (from the ready file)."""
        data = self._require_ready()["data"]
        if data is None:
            raise RuntimeError("this switch has Ethernet ports, not a UDP data address")
        ip, port = data
        return ip, port

    @property
    def p4runtime_address(self) -> str:
        """``host:port`` of the switch's P4Runtime server (from the ready file)."""
        return str(self._require_ready()["p4runtime"])

    @property
    def device_id(self) -> int:
        """The switch's P4Runtime device id."""
        return int(self._require_ready()["device_id"])

    @property
    def ready_info(self) -> dict[str, Any]:
        """The ready file's content: data (None on ports), interfaces, p4runtime,
        p4runtime_tls, device_id, pid, lanes, slots."""
        return dict(self._require_ready())

    def controller(
        self, election_id: tuple[int, int] = (0, 1), timeout: float = 10.0
    ) -> SwitchController:
        """A new controller of this switch, primary if ``election_id`` is the highest
        (close it, or use it as a context manager).

        Raises:
            P4RuntimeError: the switch cannot be reached or refused the arbitration.
        """
        return SwitchController.connect(
            self.p4runtime_address,
            device_id=self.device_id,
            election_id=election_id,
            timeout=timeout,
            tls=self.controller_tls,
        )

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = proc.poll()
            if code is not None:
                raise SwitchStartError(f"switch exited with status {code}", self.log_path)
            info = self._read_ready_file()
            if info is not None and info.get("pid") == proc.pid and self._answers(info):
                self._ready = info
                log.info("switch pid %d ready: %s", proc.pid, info["data"] or info["interfaces"])
                return
            if time.monotonic() > deadline:
                raise SwitchStartError(
                    f"switch not ready after {self.start_timeout:.1f}s", self.log_path
                )
            time.sleep(_POLL_SECONDS)

    def _read_ready_file(self) -> dict[str, Any] | None:
        try:
            info = json.loads(self.ready_path.read_text())
        except (FileNotFoundError, ValueError):
            return None  # not written yet (the switch replaces it atomically)
        return info if isinstance(info, dict) else None

    def _answers(self, info: dict[str, Any]) -> bool:
        """Whether the P4Runtime server named in ``info`` answers (Capabilities)."""
        channel = grpc_channel(str(info["p4runtime"]), self.controller_tls)
        try:
            stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
            stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
        finally:
            channel.close()
        return True

    def _require_ready(self) -> dict[str, Any]:
        if self._ready is None:
            raise RuntimeError("switch process not started (or not ready)")
        return self._ready


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(log empty)"
