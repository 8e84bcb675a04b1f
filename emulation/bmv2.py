"""bmv2 as an inalab switch: find the tools, compile ``p4/ina.p4``, run ``simple_switch_grpc``.

Emulation layer, the bmv2 counterpart of :mod:`emulation.softswitch.process` and of the
soft switch's Mininet node; the data-plane vectors' bmv2 target uses it too.

- :func:`find_bmv2` finds ``simple_switch_grpc`` and ``p4c-bm2-ss`` on PATH (or a search
  path given, as ``inalab emulate --p4-tools`` does), or raises :class:`Bmv2Unavailable`
  saying how to install them, or, under sudo, that sudo set PATH and how to pass yours.
- :func:`compile_program` runs ``p4c-bm2-ss --arch v1model`` and keeps the JSON (and the
  P4Info p4c derives) in a directory, named by a hash of the sources: switches of one
  run, and later runs in the same directory, compile once.
- :class:`Bmv2Process` runs one ``simple_switch_grpc --no-p4`` and proves it ready, as
  p4-utils' ``P4Switch.start`` does: its PID alive, listening on its P4Runtime and Thrift
  ports, and P4Runtime answering. bmv2 cannot report ports it picked itself, so port 0
  means one chosen here; the listening check is what shows the port is this process's
  and not a stale answer from another. It starts without a program, as bmv2's README
  recommends: the first :meth:`Bmv2Process.controller` pushes the JSON with its P4Info
  (the one p4c derived in the same compile) by SetForwardingPipelineConfig, which resets
  every table, so later controllers only read the installed pipeline.
- its Mininet node (``kind: bmv2`` in a topology) is
  :func:`emulation.mininet.nodes.bmv2_switch_class`.

What bmv2 cannot do that the soft switch does (p4/README.md): lanes are fixed at 64
and the pool at :data:`~hostlib.protocol.SWITCH_SLOTS` per set (``configuration.p4``);
INA is recognised by UDP destination port alone, so there is no forward-only mode;
registers are read and written over Thrift, which its P4Runtime server cannot replace.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4c import compile_command
from controller.p4info import DEFAULT_P4INFO_PATH, P4Info
from controller.switch import SwitchController
from emulation.softswitch.process import RecordedProcess, SwitchStartError
from hostlib.protocol import LANES_PER_PACKET, SWITCH_SLOTS

__all__ = [
    "BMV2_LANES",
    "BMV2_SLOTS",
    "INSTALL_HINT",
    "P4INFO_PATH",
    "P4_PROGRAM",
    "Bmv2Process",
    "Bmv2Tools",
    "Bmv2Unavailable",
    "CompileError",
    "check_bmv2_switch",
    "compile_command",
    "compile_program",
    "compiled_p4info",
    "find_bmv2",
    "free_tcp_ports",
]

logger = logging.getLogger(__name__)

P4_PROGRAM = Path(__file__).resolve().parents[1] / "p4" / "ina.p4"
"""The INA program of the checkout this package was imported from."""
P4INFO_PATH = DEFAULT_P4INFO_PATH
"""Its P4Info as p4c emits it, committed (``p4/ina.p4info.txtpb``; ``p4/compile.py``
keeps it current): pushed with a JSON compiled elsewhere."""
BMV2_LANES = LANES_PER_PACKET
"""int32 lanes per packet of ``p4/ina.p4``: fixed, one register array per lane."""
BMV2_SLOTS = SWITCH_SLOTS
"""Slots per set of ``p4/ina.p4``'s pool: fixed by ``configuration.p4``."""

SWITCH_TOOL = "simple_switch_grpc"
COMPILER_TOOL = "p4c-bm2-ss"
INSTALL_HINT = (
    "install bmv2 and p4c: on Ubuntu or Debian add the home:p4lang repository of the "
    "openSUSE Build Service as https://github.com/p4lang/behavioral-model#installing-bmv2 "
    "shows, then `apt-get install p4lang-bmv2 p4lang-p4c`; or build them from source "
    "(behavioral-model: ./configure --with-pi --with-thrift)"
)

_DROP_PORT = 511  # v1model's port is bit<9>; bmv2 reserves 511 as its drop port
_POLL_SECONDS = 0.05
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp


class Bmv2Unavailable(RuntimeError):
    """``simple_switch_grpc`` or ``p4c-bm2-ss`` is not installed; the message says how."""


class CompileError(RuntimeError):
    """p4c-bm2-ss could not be run or refused the program; the message quotes its stderr.

    Attributes:
        command: the command run.
        returncode: its exit status (None: it could not be run).
        stderr: what it wrote on stderr.
    """

    def __init__(self, command: list[str], returncode: int | None, stderr: str) -> None:
        what = "could not be run" if returncode is None else f"exited with status {returncode}"
        super().__init__(f"{command[0]} {what}: {' '.join(command)}\n{stderr.rstrip()}")
        self.command = command
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class Bmv2Tools:
    """Where bmv2's tools are: the switch, and the compiler (None: not needed)."""

    switch: Path
    compiler: Path | None = None


def find_bmv2(
    need_compiler: bool = True, path: str | None = None, *, origin: str = "PATH"
) -> Bmv2Tools:
    """``simple_switch_grpc`` and (unless not needed) ``p4c-bm2-ss`` on ``path``.

    Args:
        need_compiler: False when a compiled JSON is at hand.
        path: the search path (directories separated by ``os.pathsep``); by default
            ``$PATH``.
        origin: what ``path`` is, for the message (``inalab emulate --p4-tools``).

    Raises:
        Bmv2Unavailable: a tool is missing. The message has an install hint and, under
            sudo, says that sudo set ``PATH`` and how to hand the caller's on.
    """
    switch = _which(SWITCH_TOOL, "runs the bmv2 switch", path, origin)
    compiler = _which(COMPILER_TOOL, "compiles p4/ina.p4", path, origin) if need_compiler else None
    return Bmv2Tools(switch, compiler)


def _which(tool: str, purpose: str, path: str | None, origin: str = "PATH") -> Path:
    found = shutil.which(tool, path=path)
    if found is None:
        raise Bmv2Unavailable(_missing_tool_message(tool, purpose, path, origin))
    return Path(found)


def _missing_tool_message(tool: str, purpose: str, path: str | None, origin: str = "PATH") -> str:
    """Why ``tool`` was not found on ``path`` and what to do.

    Searching ``$PATH`` (``path`` None) under sudo (``SUDO_USER`` set), the message says
    that sudo replaces ``PATH`` (its ``secure_path``, unless told to keep the caller's)
    and how to pass the caller's on, before the install hint: the tools may well be on
    the user's own ``PATH``, and reinstalling would not help.
    """
    if path is not None:
        return f"{tool} (it {purpose}) is not in {origin} {path}; {INSTALL_HINT}"
    searched = os.environ.get("PATH", os.defpath)
    user = os.environ.get("SUDO_USER")
    if not user:
        return f"{tool} (it {purpose}) is not on PATH; {INSTALL_HINT}"
    return (
        f"{tool} (it {purpose}) is not on PATH ({searched}), which sudo (run by {user}) "
        f"sets to its own unless told otherwise: if {user}'s PATH has it, hand that on "
        f'with `sudo .venv/bin/inalab emulate --p4-tools "$PATH" ...` (or `sudo env '
        f'PATH="$PATH" COMMAND`); if it is not installed, {INSTALL_HINT}'
    )


# --------------------------------------------------------------------- compiling


def compile_program(
    out_dir: Path, p4_path: Path = P4_PROGRAM, *, compiler: Path | None = None
) -> Path:
    """Compile ``p4_path`` for bmv2 into ``out_dir``, unless a compile of the same
    sources by the same compiler is there already; return the JSON's path.

    The P4Info p4c derives is written next to it (:func:`compiled_p4info`); outputs
    appear only when p4c succeeded.

    Args:
        out_dir: the cache directory (created).
        p4_path: the program; every ``*.p4`` beside it counts as its source.
        compiler: p4c-bm2-ss; by default found on PATH.

    Raises:
        Bmv2Unavailable: no compiler given and none on PATH.
        CompileError: p4c could not be run or failed (its stderr is in the message).
    """
    compiler = compiler or _which(COMPILER_TOOL, "compiles p4/ina.p4", None)
    p4_path = Path(p4_path)
    out_dir = Path(out_dir)
    stem = f"{p4_path.stem}-{_source_hash(compiler, p4_path)}"
    json_out = out_dir / f"{stem}.json"
    p4info_out = compiled_p4info(json_out)
    if json_out.exists() and p4info_out.exists():
        logger.debug("%s compiled already: %s", p4_path, json_out)
        return json_out
    out_dir.mkdir(parents=True, exist_ok=True)
    # p4c writes its outputs piecemeal: only a finished compile gets the cached names.
    json_tmp, p4info_tmp = out_dir / f"{stem}.partial.json", out_dir / f"{stem}.partial.txt"
    command = compile_command(compiler, p4_path, json_tmp, p4info_tmp)
    logger.info("compiling %s: %s", p4_path, " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompileError(command, None, str(exc)) from None
    if done.returncode != 0 or not json_tmp.exists() or not p4info_tmp.exists():
        for partial in (json_tmp, p4info_tmp):
            partial.unlink(missing_ok=True)
        stderr = done.stderr if done.returncode != 0 else done.stderr + "\n(wrote no output)"
        raise CompileError(command, done.returncode, stderr)
    os.replace(p4info_tmp, p4info_out)
    os.replace(json_tmp, json_out)
    return json_out


def compiled_p4info(json_path: Path) -> Path:
    """Where :func:`compile_program` put the P4Info of the program compiled to
    ``json_path`` (p4c writes text format for the ``.txt`` extension)."""
    return json_path.with_suffix(".p4info.txt")


def _source_hash(compiler: Path, p4_path: Path) -> str:
    """A digest of the program, every ``*.p4`` beside it (what it can include), and which
    compiler build (path, size, mtime) compiles it."""
    digest = hashlib.sha256()
    try:
        stat = compiler.stat()
        digest.update(f"{compiler.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    except OSError:
        digest.update(f"{compiler}\0".encode())  # CompileError follows when it is run
    digest.update(f"{p4_path.name}\0".encode())
    for source in sorted(p4_path.parent.glob("*.p4")):
        digest.update(f"{source.name}\0".encode() + source.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------- ports


def free_tcp_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different TCP ports the kernel hands out on ``host`` now.

    They are free when this returns, not reserved: whoever binds them must check that it
    got them (:class:`Bmv2Process` does).
    """
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:  # all bound at once, so the ports differ
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _listening_inodes(port: int) -> set[int]:
    """Socket inodes listening on TCP ``port`` (IPv4 or IPv6) in this network namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _TCP_LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def _process_tree(root: int) -> set[int]:
    """``root`` and its descendants (a wrapper script's child may be the real switch)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        ppid = int(stat.rpartition(")")[2].split()[1])  # the name may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def _listens(pids: set[int], port: int) -> bool:
    """Whether one of ``pids`` holds a socket listening on TCP ``port``."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return False
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False


def _p4runtime_answers(address: str) -> bool:
    """Whether the P4Runtime server at ``address`` answers Capabilities."""
    channel = grpc.insecure_channel(address)
    try:
        p4runtime_pb2_grpc.P4RuntimeStub(channel).Capabilities(
            p4runtime_pb2.CapabilitiesRequest(), timeout=1.0
        )
    except grpc.RpcError:
        return False
    finally:
        channel.close()
    return True


# --------------------------------------------------------------------- the process


class Bmv2Process(RecordedProcess):
    """One ``simple_switch_grpc`` with its ports, PID and log (``run_dir/NAME.log``).

    Stopping, waiting and the PID are :class:`RecordedProcess`'s (``-SIGTERM`` is
    bmv2's normal exit status).

    Args:
        run_dir: directory for ``NAME.log``, ``build/`` (compiles) and ``pcaps/``
            (created).
        name: file name stem, unique within ``run_dir``.
        interfaces: switch port -> network interface (bmv2's ``-i PORT@IFACE``).
        device_id: bmv2's ``--device-id``, also its P4Runtime device id.
        grpc_port: the P4Runtime server's TCP port; 0 picks a free one at start.
        thrift_port: the Thrift server's TCP port; 0 picks a free one at start.
        json_path: the compiled program; None compiles ``p4/ina.p4`` at start.
        pcap: record every port's packets in ``run_dir/pcaps`` (bmv2's ``--pcap``).
        log: bmv2's per-packet log (``--log-console``) in ``NAME.log``; slow.
        host: the address the P4Runtime server binds (Thrift binds all addresses).
        cpu_port: bmv2's ``--cpu-port`` for P4Runtime packet-in/out; None: none (ina.p4
            has no packet-in/out).
        p4info_path: the P4Info pushed with the JSON; None: the one p4c derived when
            this process compiles, else :data:`P4INFO_PATH`.
        start_timeout: seconds :meth:`start` waits for readiness.
        tools: where the tools are; by default found on PATH.

    Raises:
        ValueError: a port or device id out of range, a port given twice.
        Bmv2Unavailable: ``tools`` not given and one needed is not on PATH.
    """

    what = "bmv2"

    def __init__(
        self,
        run_dir: Path,
        *,
        name: str = "bmv2",
        interfaces: dict[int, str] | None = None,
        device_id: int = 0,
        grpc_port: int = 0,
        thrift_port: int = 0,
        json_path: Path | None = None,
        pcap: bool = False,
        log: bool = False,
        host: str = "127.0.0.1",
        cpu_port: int | None = None,
        p4info_path: Path | None = None,
        start_timeout: float = 30.0,
        tools: Bmv2Tools | None = None,
    ) -> None:
        super().__init__()
        self.interfaces = dict(sorted((interfaces or {}).items()))
        _check_ports(self.interfaces, cpu_port, grpc_port, thrift_port)
        if not 0 <= device_id < 1 << 64:
            raise ValueError(f"device id {device_id} is not a 64-bit unsigned integer")
        self.run_dir = Path(run_dir)
        self.name = name
        self.log_path = self.run_dir / f"{name}.log"
        self.pcap_dir = self.run_dir / "pcaps" if pcap else None
        self.log_packets = log
        self.host = host
        self.cpu_port = cpu_port
        self.json_path = Path(json_path) if json_path is not None else None
        self.p4info_path = Path(p4info_path) if p4info_path is not None else P4INFO_PATH
        self._p4info_given = p4info_path is not None
        self.start_timeout = start_timeout
        self.tools = tools or find_bmv2(need_compiler=json_path is None)
        self._device_id = device_id
        self._requested_ports = (grpc_port, thrift_port)
        self.argv: list[str] = []
        """The command :meth:`start` ran (empty before)."""
        self._ports: tuple[int, int] | None = None
        self._pipeline: tuple[P4Info, bytes] | None = None
        self._ready: dict[str, Any] | None = None

    def build_argv(self, grpc_port: int, thrift_port: int) -> list[str]:
        """The command line for these ports (pure: it starts nothing; :attr:`argv` is the
        one :meth:`start` ran). bmv2's own options come first, then ``--`` and
        simple_switch_grpc's.
        """
        argv = [str(self.tools.switch), "--device-id", str(self._device_id)]
        for port, iface in self.interfaces.items():
            argv += ["-i", f"{port}@{iface}"]
        argv += ["--thrift-port", str(thrift_port)]
        if self.pcap_dir is not None:
            # One token: bmv2 declares --pcap with an implicit value, and Boost does not
            # take the next argument as the value of such an option.
            argv.append(f"--pcap={self.pcap_dir}")
        if self.log_packets:
            argv.append("--log-console")  # stdout, which is NAME.log
        argv += ["--no-p4", "--", "--grpc-server-addr", f"{self.host}:{grpc_port}"]
        if self.cpu_port is not None:
            argv += ["--cpu-port", str(self.cpu_port)]
        return argv

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Bmv2Process:
        """Compile if needed, launch the switch and wait until it is ready; return ``self``.

        Raises:
            RuntimeError: already started.
            CompileError: compiling ``p4/ina.p4`` failed (nothing was launched).
            P4InfoError: the P4Info cannot be loaded (nothing was launched).
            SwitchStartError: it could not be run, exited, or was not ready within
                ``start_timeout``; the process is stopped before this is raised.
        """
        if self._proc is not None:
            raise RuntimeError("bmv2 process already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.json_path is None:
            self.json_path = compile_program(self.run_dir / "build", compiler=self.tools.compiler)
            if not self._p4info_given:
                self.p4info_path = compiled_p4info(self.json_path)
        self._pipeline = (P4Info.load(self.p4info_path), self.json_path.read_bytes())
        if self.pcap_dir is not None:
            self.pcap_dir.mkdir(exist_ok=True)  # bmv2 exits if it is missing
        free = iter(free_tcp_ports(self._requested_ports.count(0)))
        grpc_port, thrift_port = (p or next(free) for p in self._requested_ports)
        self.argv = self.build_argv(grpc_port, thrift_port)
        proc = self._launch(self.argv)
        try:
            self._wait_ready(proc, grpc_port, thrift_port)
        except BaseException:
            self.stop()
            raise
        self._ports = (grpc_port, thrift_port)
        self._ready = self._describe(proc.pid)
        logger.info("bmv2 pid %d ready: %s", proc.pid, self.interfaces)
        return self

    # ----------------------------------------------------------------- what it realised
    @property
    def device_id(self) -> int:
        """The switch's P4Runtime device id."""
        return self._device_id

    @property
    def p4runtime_address(self) -> str:
        """``host:port`` of the switch's P4Runtime server."""
        return f"{self.host}:{self._require_ports()[0]}"

    @property
    def thrift_address(self) -> str:
        """``host:port`` of the switch's Thrift server (registers)."""
        return f"127.0.0.1:{self._require_ports()[1]}"

    @property
    def ready_info(self) -> dict[str, Any]:
        """What the run manifest records, keyed as the soft switch's ready file plus
        ``kind``, ``thrift``, ``json``, ``p4info``, ``log`` and ``pcap``."""
        if self._ready is None:
            raise RuntimeError("bmv2 process not started (or not ready)")
        return dict(self._ready)

    def controller(
        self, election_id: tuple[int, int] = (0, 1), timeout: float = 10.0
    ) -> SwitchController:
        """A new controller of this switch, primary if ``election_id`` is the highest,
        with registers over Thrift (close it, or use it as a context manager).

        The first one pushes the pipeline (JSON and P4Info); until then the switch drops
        every packet. Later ones read the installed pipeline and leave the tables alone.

        Raises:
            RuntimeError: not started.
            P4RuntimeError: the switch cannot be reached, refused the arbitration or the
                pipeline.
            ThriftUnreachableError: its Thrift server did not answer.
        """
        address, thrift = self.p4runtime_address, self.thrift_address
        ctl = SwitchController.connect(
            address, device_id=self.device_id, election_id=election_id, timeout=timeout,
            thrift=thrift, pipeline=self._pipeline,
        )  # fmt: skip
        if self._pipeline is not None:
            logger.info("bmv2 %s: pipeline %s pushed", address, self.json_path)
            self._pipeline = None
        return ctl

    # ----------------------------------------------------------------- readiness
    def _wait_ready(self, proc: subprocess.Popen[bytes], grpc_port: int, thrift_port: int) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = proc.poll()
            if code is not None:
                raise SwitchStartError(f"{SWITCH_TOOL} exited with status {code}", self.log_path)
            waiting_for = self._waiting_for(proc.pid, grpc_port, thrift_port)
            if waiting_for is None:
                return
            if time.monotonic() > deadline:
                raise SwitchStartError(
                    f"{SWITCH_TOOL} not ready after {self.start_timeout:.1f}s: {waiting_for}",
                    self.log_path,
                )
            time.sleep(_POLL_SECONDS)

    def _waiting_for(self, pid: int, grpc_port: int, thrift_port: int) -> str | None:
        """What is not ready yet (None: everything)."""
        tree = _process_tree(pid)
        if not _listens(tree, grpc_port):
            return f"pid {pid} does not listen on its P4Runtime port {grpc_port}"
        if not _p4runtime_answers(f"{self.host}:{grpc_port}"):
            return f"its P4Runtime server on port {grpc_port} does not answer"
        if not _listens(tree, thrift_port):
            return (
                f"pid {pid} does not listen on its Thrift port {thrift_port} (the controller "
                "needs it for registers: build simple_switch_grpc with --with-thrift)"
            )
        return None

    def _describe(self, pid: int) -> dict[str, Any]:
        return {
            "kind": "bmv2",
            "data": None,
            "interfaces": {str(p): n for p, n in self.interfaces.items()},
            "p4runtime": self.p4runtime_address,
            "thrift": self.thrift_address,
            "device_id": self.device_id,
            "pid": pid,
            "lanes": BMV2_LANES,
            "slots": BMV2_SLOTS,
            "json": str(self.json_path),
            "p4info": str(self.p4info_path),
            "log": str(self.log_path),
            "pcap": str(self.pcap_dir) if self.pcap_dir is not None else None,
        }

    def _require_ports(self) -> tuple[int, int]:
        if self._ports is None:
            raise RuntimeError("bmv2 process not started (or not ready)")
        return self._ports


def _check_ports(
    interfaces: dict[int, str], cpu_port: int | None, grpc_port: int, thrift_port: int
) -> None:
    """Raises ValueError for ports bmv2 would refuse or that collide."""
    for port in interfaces:
        if not 0 <= port < _DROP_PORT:
            raise ValueError(f"switch port {port} outside 0..{_DROP_PORT - 1} (v1model bit<9>)")
    if len(set(interfaces.values())) != len(interfaces):
        raise ValueError(f"an interface is given for two ports: {interfaces}")
    if cpu_port is not None and not 0 < cpu_port < _DROP_PORT:
        raise ValueError(f"cpu port {cpu_port} outside 1..{_DROP_PORT - 1}")
    if cpu_port in interfaces:
        raise ValueError(f"cpu port {cpu_port} is also an interface's port")
    for what, tcp in (("grpc", grpc_port), ("thrift", thrift_port)):
        if not 0 <= tcp <= 0xFFFF:
            raise ValueError(f"{what} port {tcp} outside 0..65535")
    if grpc_port == thrift_port != 0:
        raise ValueError(f"gRPC and Thrift both on port {grpc_port}")


# --------------------------------------------------------------------- Mininet


def check_bmv2_switch(lanes: int, slots: int, forward_only: bool) -> None:
    """Refuse what ``p4/ina.p4`` on bmv2 cannot be (a pure check, before anything runs).

    Args:
        lanes: int32 lanes per packet the topology asks for: must be :data:`BMV2_LANES`.
        slots: the pool the emulation asks for. bmv2's is :data:`BMV2_SLOTS` per set, fixed
            at compile time; a smaller request is met by that larger pool (the controller
            reads the real size from the P4Info and reports it in ``ready_info``).
        forward_only: a switch that forwards INA packets without aggregating: bmv2 has no
            such mode, since ``p4/ina.p4`` takes every UDP datagram to the INA port for an
            INA packet at every switch (and drops it there if no job of its matches).

    Raises:
        ValueError: one of the above does not hold; the message says what to change.
    """
    if lanes != BMV2_LANES:
        raise ValueError(
            f"bmv2 runs p4/ina.p4 with {BMV2_LANES} lanes per packet (LANES_PER_PACKET in "
            f"p4/configuration.p4), not {lanes}: set lanes: {BMV2_LANES} or use kind: soft"
        )
    if not 1 <= slots <= BMV2_SLOTS:
        raise ValueError(f"bmv2's pool has {BMV2_SLOTS} slots per set; {slots} asked for")
    if forward_only:
        raise ValueError(
            "bmv2 cannot be a forward-only switch: p4/ina.p4 recognises INA by UDP "
            "destination port alone and aggregates (or drops) every INA packet it sees; "
            "use kind: soft for role: forward, or make this switch the job's aggregator"
        )


def __getattr__(name: str) -> Any:
    """``bmv2_switch_class`` moved up to the Mininet layer (issue #39)."""
    if name == "bmv2_switch_class":
        import warnings

        from emulation.mininet import nodes

        warnings.warn(
            "emulation.bmv2.bmv2_switch_class moved to emulation.mininet.nodes",
            DeprecationWarning,
            stacklevel=2,
        )
        return nodes.bmv2_switch_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
