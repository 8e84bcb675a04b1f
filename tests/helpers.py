"""Shared test code: reference allreduce results, a worker's state across calls, ranks
in threads, a fake network for point-to-point collectives and a soft switch in a thread.

Imported as ``helpers`` (``tests/conftest.py`` puts this directory on ``sys.path``).
The references are computed independently of the engine and the switch: int32 as a
wrapping sum in int64, float32 by quantizing each worker's blocks with the global exponent
exactly as the protocol specifies, so a correct INA run is *bit-identical* to them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from emulation.softswitch.pipeline import JobConfig, Pipeline
from hostlib.ina import Addr, InaAllreduce, JobSpec, RetryPolicy
from hostlib.p2p import P2pEndpoint
from hostlib.p2pwire import PeerSpec
from hostlib.peers import PeerCollective
from hostlib.protocol import INA_UDP_PORT
from hostlib.quantize import block_exponents, dequantize, error_bound, quantize_block
from hostlib.session import InaSession
from hostlib.transport.memory import FakeNetwork, LinkModel
from hostlib.transport.udp import UdpTransport

if TYPE_CHECKING:  # the controller layer (grpc) is imported only by tests that drive one
    from controller.switch import WorkerAddress
    from emulation.softswitch.server import SwitchServer

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def wrapping_sum(inputs: np.ndarray) -> np.ndarray:
    """Elementwise int32 sum over rows, wrapping like a switch ALU."""
    total = inputs.astype(np.int64).sum(axis=0)
    return ((total - INT32_MIN) % 2**32 + INT32_MIN).astype(np.int32)


def blocks_of(data: np.ndarray, lanes: int) -> np.ndarray:
    """``data`` zero-padded to whole packets, one row per block."""
    nblocks = max(1, math.ceil(data.size / lanes))
    out = np.zeros(nblocks * lanes, dtype=data.dtype)
    out[: data.size] = data
    return out.reshape(nblocks, lanes)


def quantized_sums(inputs: np.ndarray, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact int64 block sums of every worker's quantized blocks, and the global exponents.

    ``inputs`` holds one float32 row per worker. The sums are not wrapped, so a caller
    can check that they fit int32 (the no-overflow guarantee).
    """
    n = len(inputs)
    blocks = [blocks_of(row, lanes) for row in inputs]
    exps = np.max([block_exponents(b) for b in blocks], axis=0)
    total = np.zeros(blocks[0].shape, dtype=np.int64)
    q = np.empty(lanes, dtype=np.int32)
    for b in blocks:
        for i, e in enumerate(exps):
            quantize_block(b[i], int(e), n, q)
            total[i] += q
    return total, exps


def float_reference(inputs: np.ndarray, lanes: int) -> np.ndarray:
    """What a correct float32 INA allreduce of ``inputs`` (workers x size) returns."""
    sums, exps = quantized_sums(inputs, lanes)
    assert sums.min() >= INT32_MIN and sums.max() <= INT32_MAX, "int32 overflow"
    out = dequantize(sums.astype(np.int32), exps, len(inputs))
    return out.reshape(-1)[: inputs.shape[1]]


def assert_within_bound(result: np.ndarray, inputs: np.ndarray, lanes: int) -> None:
    """``|result - sum(inputs)| <= error_bound``, soundly.

    The float64 sum of n float32 values is itself off the exact sum by at most
    ``(n-1) * 2**-53 * sum|x|``; that (doubled) is allowed on top of the bound. It is
    ~2**-20 of the bound's own first term, so it does not loosen the check.
    """
    n = len(inputs)
    wide = inputs.astype(np.float64)
    reference = wide.sum(axis=0)
    slack = n * 2.0**-52 * np.abs(wide).sum(axis=0)
    bound = error_bound(np.abs(wide).max(axis=0), n, lanes, reference)
    err = np.abs(result.astype(np.float64) - reference)
    bad = np.flatnonzero(err > bound + slack)
    assert bad.size == 0, (
        f"{bad.size} elements outside the bound, first {bad[:5]}: "
        f"error {err[bad[:5]]} bound {bound[bad[:5]]}"
    )


def random_inputs(rng: np.random.Generator, dtype: type, workers: int, size: int) -> np.ndarray:
    """Worker inputs (one row each): int32 near both limits, float32 over many scales."""
    if dtype is np.int32:
        out = rng.integers(
            INT32_MIN, INT32_MAX, size=(workers, size), dtype=np.int64, endpoint=True
        )
        edge = rng.random((workers, size)) < 0.3
        out[edge] = rng.choice(
            [INT32_MIN, INT32_MIN + 1, INT32_MAX - 1, INT32_MAX], size=int(edge.sum())
        )
        return out.astype(np.int32)
    scale = np.exp2(rng.integers(-20, 20, size=(1, size)))
    floats = rng.standard_normal((workers, size)) * scale
    floats[rng.random((workers, size)) < 0.05] = 0.0
    return floats.astype(np.float32)


def int32_with_limits(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` int32 over the whole range, a fifth of them at its limits (sums wrap)."""
    out = rng.integers(INT32_MIN, INT32_MAX, size=size, dtype=np.int64, endpoint=True)
    edge = rng.random(size) < 0.2
    out[edge] = rng.choice([INT32_MIN, INT32_MAX], size=int(edge.sum()))
    return out.astype(np.int32)


def expected(inputs: np.ndarray, lanes: int) -> np.ndarray:
    """The bit-exact result of an INA allreduce of ``inputs``."""
    if inputs.dtype == np.int32:
        return wrapping_sum(inputs)
    return float_reference(inputs, lanes)


class WorkerState:
    """What :class:`hostlib.session.InaSession` keeps across calls, for engines driven
    by hand (the fake network): per-slot uses, the next packet number, the RTT estimate.
    """

    def __init__(self, spec: JobSpec, policy: RetryPolicy, first_seq: int = 1) -> None:
        self.spec = spec
        self.policy = policy
        self.uses = np.zeros(spec.slots, dtype=np.int64)
        self.next_seq = first_seq
        self._rtt = None

    def engine(self, data: np.ndarray) -> InaAllreduce:
        eng = InaAllreduce(
            self.spec, data, self.uses, self.policy, self._rtt, first_seq=self.next_seq
        )
        self._rtt = eng.rtt
        return eng

    def finish(self, engine: InaAllreduce) -> np.ndarray:
        """Commit a completed call (as the session does) and return its result."""
        engine.commit()
        self.next_seq = engine.next_seq
        return engine.result()


FAKE_SWITCH: Addr = ("10.255.0.1", INA_UDP_PORT)
"""Where workers on a :class:`FakeNetwork` send."""


class FakeJob:
    """A job installed on ``pipeline`` whose workers live on a :class:`FakeNetwork`.

    Every call goes through the same per-worker :class:`WorkerState`, so consecutive
    calls exercise slot reuse and packet numbering exactly as a session's do.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        job_id: int,
        workers: int,
        policy: RetryPolicy,
        slots: int = 4,
        first_seq: int = 1,
    ) -> None:
        self.addrs = tuple((f"10.{job_id % 250}.0.{r + 1}", 5000 + r) for r in range(workers))
        pipeline.add_job(JobConfig(job_id, self.addrs, slots))
        self.states = [
            WorkerState(
                JobSpec(job_id, r, workers, FAKE_SWITCH, pipeline.lanes, slots), policy, first_seq
            )
            for r in range(workers)
        ]

    def start(self, inputs: np.ndarray) -> dict[Addr, InaAllreduce]:
        """One engine per worker for one call (``inputs``: one row per worker)."""
        return {a: w.engine(x) for a, w, x in zip(self.addrs, self.states, inputs, strict=True)}

    def finish(self, engines: dict[Addr, InaAllreduce]) -> list[np.ndarray]:
        return [w.finish(engines[a]) for a, w in zip(self.addrs, self.states, strict=True)]

    def allreduce(self, net: FakeNetwork, inputs: np.ndarray) -> list[np.ndarray]:
        """Run one call of every worker to completion; return each worker's result."""
        engines = self.start(inputs)
        errors = net.run(engines)
        assert all(e is None for e in errors.values()), errors
        return self.finish(engines)


def float_sum_bound(inputs: np.ndarray) -> np.ndarray:
    """``gamma_(n-1) * sum|x|`` per element of the sum of ``inputs`` (one row per rank):
    any order of n-1 float32 additions stays within it (Higham, Accuracy and Stability,
    4.2); plus the float64 reference's own error."""
    n, u = len(inputs), 2.0**-24
    wide = np.abs(inputs.astype(np.float64)).sum(axis=0)
    return (n - 1) * u / (1 - (n - 1) * u) * wide + n * 2.0**-52 * wide


def check_allreduce(results: Sequence[np.ndarray], inputs: np.ndarray) -> None:
    """Every rank holds the same bytes, of the inputs' dtype and shape, and they are the
    sum: int32 exactly (wrapping), float32 within :func:`float_sum_bound`."""
    first = results[0]
    for got in results:
        assert got.dtype == inputs.dtype and got.shape == inputs.shape[1:]
        np.testing.assert_array_equal(got.view(np.uint32), first.view(np.uint32))
    if inputs.dtype == np.int32:
        np.testing.assert_array_equal(first, wrapping_sum(inputs))
    else:
        err = np.abs(first.astype(np.float64) - inputs.astype(np.float64).sum(axis=0))
        assert np.all(err <= float_sum_bound(inputs))


# ----------------------------------------------------------------- ranks in threads
def in_threads(bodies: Sequence[Callable[[], Any]], timeout: float = 120.0) -> list[Any]:
    """Run every body in its own thread; return their values (re-raise the first error).

    Raises:
        AssertionError: a body still ran after ``timeout`` seconds.
    """
    out: list[Any] = [None] * len(bodies)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = bodies[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return out


def peer_ranks(
    make: type[PeerCollective],
    n: int,
    work: Callable[[int, Any], Any],
    policy: RetryPolicy,
    **spec: Any,
) -> list[Any]:
    """Run ``work(rank, session)`` on ``n`` ring or tree sessions (``make``) over UDP on
    127.0.0.1, one thread each; return each rank's value. ``spec``: the
    :class:`PeerSpec`'s other arguments (``lanes``, ``window``)."""
    transports = [UdpTransport() for _ in range(n)]
    addrs = tuple(t.local_addr for t in transports)
    sessions = [make(PeerSpec(r, addrs, **spec), t, policy) for r, t in enumerate(transports)]

    def body(rank: int) -> Any:
        try:
            return work(rank, sessions[rank])
        finally:
            sessions[rank].close(linger=0.05)

    return in_threads([functools.partial(body, r) for r in range(n)])


# ----------------------------------------------------------------- p2p on the fake network
ROUTER: Addr = ("10.254.0.1", 9)
"""Where ranks on a :class:`FakePeers` network send: its :class:`Router`."""


@dataclass
class _Routed:
    payload: memoryview
    dests: Sequence[Addr]


class Router:
    """Forwards a p2p datagram to the address of its destination rank (the ``dst`` byte),
    as an L3 switch forwards non-INA traffic: the "switch" of a :class:`FakeNetwork`."""

    def __init__(self, addrs: Sequence[Addr]) -> None:
        self.addrs = list(addrs)

    def process(self, data: memoryview, src: Addr) -> _Routed | None:
        dst = data[3]
        return _Routed(data, [self.addrs[dst]]) if dst < len(self.addrs) else None


_Call = TypeVar("_Call")


class FakePeers:
    """``n`` ranks' p2p endpoints on one fake network through a :class:`Router`, kept
    across calls (every traversal, rank->router and router->rank, impaired by ``link``)."""

    def __init__(
        self,
        n: int,
        policy: RetryPolicy,
        lanes: int,
        window: int,
        link: LinkModel | None = None,
        seed: int = 0,
    ) -> None:
        self.addrs = [(f"10.1.0.{r + 1}", 7000 + r) for r in range(n)]
        self.endpoints = [
            P2pEndpoint(PeerSpec(r, tuple(self.addrs), lanes, window), policy) for r in range(n)
        ]
        self.net = FakeNetwork(Router(self.addrs), ROUTER, link, seed=seed)

    def run_calls(
        self, make: Callable[[P2pEndpoint, np.ndarray], _Call], inputs: Sequence[np.ndarray]
    ) -> dict[Addr, _Call]:
        """One call of every rank, ``make(endpoint, its input)``, run to completion
        without an error; the calls by address."""
        calls = {
            a: make(ep, x) for a, ep, x in zip(self.addrs, self.endpoints, inputs, strict=True)
        }
        errors = self.net.run(calls)  # type: ignore[arg-type]
        assert all(e is None for e in errors.values()), errors
        return calls

    def run(
        self, make: Callable[[P2pEndpoint, np.ndarray], Any], inputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """As :meth:`run_calls`; every rank's result in rank order."""
        calls = self.run_calls(make, inputs)
        return [calls[a].result() for a in self.addrs]

    @property
    def retransmissions(self) -> int:
        return sum(ep.stats.retransmitted for ep in self.endpoints)


# ----------------------------------------------------------------- a soft switch in a thread
@contextlib.contextmanager
def switch_thread(pipeline: Pipeline, join_timeout: float = 30.0) -> Iterator[SwitchServer]:
    """A :class:`SwitchServer` of ``pipeline`` on free ports of 127.0.0.1, serving in a
    daemon thread until the block ends (then stopped, joined and closed)."""
    from emulation.softswitch.server import SwitchServer

    server = SwitchServer(pipeline, ("127.0.0.1", 0), ("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, name="switch", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.request_stop()
        thread.join(join_timeout)
        server.close()


class SwitchJob:
    """Job ``job_id`` of ``n`` workers installed directly in ``switch``'s pipeline, one
    :class:`InaSession` each on its own UDP socket of 127.0.0.1."""

    def __init__(
        self, switch: SwitchServer, job_id: int, n: int, slots: int, policy: RetryPolicy
    ) -> None:
        self.switch, self.job_id = switch, job_id
        transports = [UdpTransport(("127.0.0.1", 0)) for _ in range(n)]
        addrs = tuple(t.local_addr for t in transports)
        switch.control.call(lambda: switch.pipeline.add_job(JobConfig(job_id, addrs, slots)))
        lanes = switch.pipeline.lanes
        self.sessions = [
            InaSession(JobSpec(job_id, r, n, switch.data_addr, lanes, slots), t, policy)
            for r, t in enumerate(transports)
        ]

    def close(self) -> None:
        """Close every session, then remove the job from the switch."""
        for s in self.sessions:
            s.close()
        self.switch.control.call(lambda: self.switch.pipeline.remove_job(self.job_id))


@contextlib.contextmanager
def bound_udp_sockets(count: int, timeout: float = 5.0) -> Iterator[list[socket.socket]]:
    """``count`` UDP sockets bound to free ports on 127.0.0.1, closed on exit."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
            s.settimeout(timeout)
        yield socks
    finally:
        for s in socks:
            s.close()


def worker_addresses(addrs: Iterable[tuple[str, int]]) -> list[WorkerAddress]:
    """Rank-ordered ``(ip, port)`` pairs as the controller's worker list (loopback:
    no MAC, no switch port)."""
    from controller.switch import WorkerAddress

    return [WorkerAddress(ip, port) for ip, port in addrs]


def save_latency_vs_bandwidth_profile(path: Path) -> Path:
    """A dynamiccl profile where INA has the lowest latency and the worst bandwidth, the
    ring the other way round: small messages must pick INA, large ones the ring."""
    from dynamiccl.model import AlgoParams, Profile

    Profile(
        ina=AlgoParams(5e-6, 10e-9),
        ring=AlgoParams(50e-6, 0.1e-9),
        tree=AlgoParams(50e-6, 1e-9),
        switch_rate=1e15,
        source="crafted for the test",
    ).save(path)
    return path


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def assert_child_dies_with_its_parent(start: str, timeout: float = 30.0) -> None:
    """Run ``start`` (Python that starts a process and binds its PID to ``pid``) in a
    parent interpreter, SIGKILL that parent once the child runs, and assert that the
    child is gone within ``timeout`` seconds (no cleanup code ran: the kernel's doing)."""
    code = f"import sys, time\n{start}\nprint(pid, flush=True)\ntime.sleep(600)\n"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), parent.communicate(timeout=60)
        child = int(line)
        assert _alive(child)
    finally:
        parent.kill()
        parent.communicate(timeout=60)
    deadline = time.monotonic() + timeout
    while _alive(child):
        assert time.monotonic() < deadline, f"pid {child} outlived its killed parent"
        time.sleep(0.05)


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now (children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def still_running(pids: Iterable[int], grace: float = 5.0) -> set[int]:
    """Which of ``pids`` still run after up to ``grace`` seconds (for the kernel to
    finish a SIGKILL or a parent to reap)."""
    deadline = time.monotonic() + grace
    while (alive := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


class Terminal:
    """A command on a pseudo-terminal, as a person runs it: standard output and error
    are the terminal (so ``isatty()`` holds), and keys typed go through the terminal's
    line discipline (``\\x03`` becomes SIGINT to the foreground process group, as
    Ctrl-C does).

    Args:
        argv: the command.
        cwd: its working directory (default: this one).
    """

    def __init__(self, argv: Sequence[str], cwd: Path | None = None) -> None:
        self.output = ""
        self._status: int | None = None
        pid, fd = pty.fork()
        if pid == 0:  # the child: a new session whose controlling terminal is the pty
            try:
                if cwd is not None:
                    os.chdir(cwd)
                os.execvp(argv[0], list(argv))
            finally:
                os._exit(127)
        self.pid, self._fd = pid, fd

    def expect(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """Read until ``pattern`` (a regex) appears in the output; return its match.

        Raises:
            AssertionError: the command ended or ``timeout`` passed first.
        """
        deadline = time.monotonic() + timeout
        while (match := re.search(pattern, self.output)) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} within {timeout} s in:\n{self.output[-3000:]}"
            assert self._read(left), f"ended without {pattern!r}:\n{self.output[-3000:]}"
        return match

    def type(self, keys: bytes) -> None:
        """Type ``keys`` at the terminal."""
        os.write(self._fd, keys)

    def wait(self, timeout: float = 120.0) -> int:
        """Read the output to its end and return the exit status (negative: killed by
        that signal).

        Raises:
            AssertionError: still running after ``timeout`` (then it is killed).
        """
        deadline = time.monotonic() + timeout
        while self._read(deadline - time.monotonic()):
            pass
        while self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"still running after {timeout} s:\n{self.output[-3000:]}")
            else:
                time.sleep(0.05)
        return self._status

    def close(self) -> None:
        """Kill the command if it still runs, and close the terminal."""
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, timeout: float) -> bool:
        """Read what is there within ``timeout``; False once the terminal is closed or
        the time is up."""
        if timeout <= 0 or not select.select([self._fd], [], [], timeout)[0]:
            return False
        try:
            data = os.read(self._fd, 65536)
        except OSError:  # EIO: every process holding the terminal has exited
            return False
        # A terminal turns "\n" into "\r\n"; tests match the text as written.
        self.output += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)


def tcp_init_method() -> str:
    """A ``tcp://`` init method for ``torch.distributed`` on a free loopback port (the
    window before rank 0 binds it is accepted)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def load_script(path: Path, name: str) -> ModuleType:
    """Import the script at ``path`` (p4/'s and examples/' are not in a package) as module
    ``name``, registered in ``sys.modules`` (dataclasses look their module up there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def gid_table(root: Path, entries: list[tuple[str, int, int, str, str]]) -> Path:
    """A copy of /sys/class/infiniband's layout: (device, port, index, gid, type)."""
    for device, port, index, gid, kind in entries:
        port_dir = root / device / "ports" / str(port)
        (port_dir / "gids").mkdir(parents=True, exist_ok=True)
        (port_dir / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
        (port_dir / "gids" / str(index)).write_text(gid + "\n")
        (port_dir / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
    return root


def tna_frame(
    src_port: int, payload: bytes, *, udp: tuple[int, int] | None = None, df: bool = False
) -> bytes:
    """A frame from the TNA model's port ``src_port`` (its identity: MAC
    02:00:00:00:00:PP, 10.0.0.PP) to the switch's INA endpoint 10.0.0.254: UDP from
    40000 + PP to 0x4E41 unless ``udp`` gives (source, destination) ports; ``df``: the
    IPv4 header an RNIC sends (identification 0, don't fragment), which the ICRC covers."""
    sport, dport = udp if udp is not None else (40000 + src_port, 0x4E41)
    ident, frag = (0, 0x4000) if df else (1, 0)
    udp_header = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), ident, frag, 64, 17, 0,
        bytes([10, 0, 0, src_port]), bytes([10, 0, 0, 254]),
    )  # fmt: skip
    eth = bytes.fromhex("0200000000fe") + bytes([2, 0, 0, 0, 0, src_port]) + b"\x08\x00"
    return eth + ip + udp_header + payload
