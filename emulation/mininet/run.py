"""``inalab emulate TOPOLOGY run -- COMMAND``: your own program, one process per rank, in
the emulated hosts.

The emulator installs the topology's job itself (it knows each worker's host, MAC and
switch port; the hosts' namespaces cannot reach a switch's P4Runtime server on the root
namespace's loopback): rank r of the job, on host h with local rank k, is installed at
``h``'s address and UDP port :data:`~emulation.mininet.network.WORKER_UDP_PORT` + k, and told
where its packets go (its aggregating switch: under hierarchical aggregation, its leaf)
and which rank they carry there. Then COMMAND starts once per rank inside that rank's
host (``mnexec`` into its network namespace, in a session of its own), with:

- what ``torch.distributed``'s ``env://`` needs, as torchrun sets it: ``MASTER_ADDR``
  (rank 0's host address), ``MASTER_PORT`` (a port free there), ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and ``GLOO_SOCKET_IFNAME`` (the
  host's interface: Gloo would otherwise take the machine's hostname address);
- what the ``"ina"`` backend (``dynamiccl.torch_backend``) needs for a job installed
  already: ``INALAB_SWITCH``, ``INALAB_JOB``, ``INALAB_BIND``, ``INALAB_PORT``,
  ``INALAB_SWITCH_RANK``, ``INALAB_WORKERS``, ``INALAB_LANES``, ``INALAB_SLOTS``, and no
  ``INALAB_P4RUNTIME``;
- ``INALAB_LINK_CONTROL``: where a rank asks for every host link's rate to change
  mid-run (``emulation.mininet.linkcontrol.set_link_rate(mbit)``; needs ``--bw``);
- ``INALAB_RUN_DIR`` (the run directory) and ``PYTHONUNBUFFERED=1`` unless set (so
  output streams as it is printed), ``OMP_NUM_THREADS=1`` unless set (torchrun's
  default: the ranks share the machine's cores); ``PATH`` led by the directory of the Python that
  runs inalab (a virtual environment's ``bin`` under ``sudo .venv/bin/inalab``).

Each rank's stdout and stderr are copied line by line to ours, prefixed ``[rank N]``, and
to ``RUN_DIR/rank-N.log``. The first rank to exit non-zero ends the run: the others get
SIGTERM, then SIGKILL after a grace period, and the command exits with that rank's
status (128 + the signal's number for a rank killed by one). Ctrl-C or SIGTERM to the
emulator stops the ranks the same way before the network goes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TextIO

from emulation.argtypes import int_in, positive_float
from emulation.bench.config import DEFAULT_EMULATED_SLOTS
from emulation.mininet.linkcontrol import ENV_LINK_CONTROL
from emulation.mininet.linkcontrol import serve as serve_link_control

if TYPE_CHECKING:
    from emulation.mininet.network import Emulation
    from emulation.topology import TopologyJob

__all__ = [
    "DEFAULT_GRACE",
    "RankSpec",
    "add_arguments",
    "exit_status",
    "rank_environment",
    "run_command",
    "stream_lines",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when the other ranks are stopped."""

# The "ina" backend's variables (dynamiccl.torch_backend.ENV_*; a unit test keeps them
# equal), named here so that the launcher does not import torch.
_ENV_SWITCH = "INALAB_SWITCH"
_ENV_P4RUNTIME = "INALAB_P4RUNTIME"
_ENV_JOB = "INALAB_JOB"
_ENV_BIND = "INALAB_BIND"
_ENV_PORT = "INALAB_PORT"
_ENV_SWITCH_RANK = "INALAB_SWITCH_RANK"
_ENV_WORKERS = "INALAB_WORKERS"
_ENV_LANES = "INALAB_LANES"
_ENV_SLOTS = "INALAB_SLOTS"

_POLL_SECONDS = 0.1
_LINK_SOCKET = "links.sock"


class _Command(argparse.Action):
    """COMMAND [ARGS...] after ``run`` (a leading ``--`` dropped); none is a usage error."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        command = list(values)
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            parser.error("no COMMAND: inalab emulate TOPOLOGY run [--job ID] -- COMMAND [ARGS...]")
        setattr(namespace, self.dest, command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``run``'s options and COMMAND."""
    add = parser.add_argument
    # SUPPRESS: without it here, ``inalab emulate TOPOLOGY --job ID run`` keeps its ID.
    add("--job", type=int, default=argparse.SUPPRESS,
        help="the topology job whose ranks run COMMAND (default: its first)")  # fmt: skip
    add("--lanes", type=int_in(1, 2048), default=None,
        help="int32 lanes per packet of the soft switches (default 2048, or 64 when the "
        "topology has a bmv2 switch: as bench's)")  # fmt: skip
    add("--slots", type=int_in(1), default=DEFAULT_EMULATED_SLOTS,
        help="INA packets each rank keeps in flight (INALAB_SLOTS; default "
        f"{DEFAULT_EMULATED_SLOTS}, as the emulated bench's)")  # fmt: skip
    add("--grace", type=positive_float, default=DEFAULT_GRACE, metavar="SECONDS",
        help="between SIGTERM and SIGKILL when ranks are stopped (default "
        f"{DEFAULT_GRACE:g})")  # fmt: skip
    # Not "command": inalab's own parser keeps the subcommand's name there.
    add("program", nargs=argparse.REMAINDER, action=_Command, metavar="-- COMMAND [ARGS...]",
        help="the program each rank runs, e.g. python train.py")  # fmt: skip


@dataclass(frozen=True)
class RankSpec:
    """One rank of the job: where it runs and how its switch knows it.

    Attributes:
        rank: its rank in the job (``RANK``).
        host: its Mininet host.
        local_rank: its index on that host (``LOCAL_RANK``).
        local_world_size: the host's ranks (``LOCAL_WORLD_SIZE``).
        ip: the host's address (what it binds).
        ifname: the host's interface (Gloo's).
        port: the UDP port the job was installed for.
        switch: the INA address its packets go to (its aggregating switch).
        switch_rank: the rank they carry there.
        lanes: int32 lanes per packet of that switch.
    """

    rank: int
    host: str
    local_rank: int
    local_world_size: int
    ip: str
    ifname: str
    port: int
    switch: tuple[str, int]
    switch_rank: int
    lanes: int


def rank_environment(
    base: Mapping[str, str],
    spec: RankSpec,
    world_size: int,
    master: tuple[str, int],
    job_id: int,
    slots: int,
    run_dir: Path,
) -> dict[str, str]:
    """The environment of ``spec``'s process: ``base`` plus torch.distributed's and the
    ``"ina"`` backend's variables (see the module's docstring); ``INALAB_P4RUNTIME`` is
    removed (the job is installed already: the backend must not install it again).

    The directory of the Python running inalab leads ``PATH``, so ``python`` and
    ``torchrun`` in COMMAND are the virtual environment's under ``sudo .venv/bin/inalab``
    too (sudo resets ``PATH``)."""
    env = dict(base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default: ranks share the cores
    here = os.path.dirname(sys.executable)
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != here]
    env["PATH"] = os.pathsep.join([here, *path])
    env.pop(_ENV_P4RUNTIME, None)
    env.update({
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
        "RANK": str(spec.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(spec.local_rank),
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "GLOO_SOCKET_IFNAME": spec.ifname,
        _ENV_SWITCH: f"{spec.switch[0]}:{spec.switch[1]}",
        _ENV_JOB: str(job_id),
        _ENV_BIND: spec.ip,
        _ENV_PORT: str(spec.port),
        _ENV_SWITCH_RANK: str(spec.switch_rank),
        _ENV_WORKERS: str(world_size),
        _ENV_LANES: str(spec.lanes),
        _ENV_SLOTS: str(slots),
        "INALAB_RUN_DIR": str(run_dir),
    })  # fmt: skip
    return env


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


def stream_lines(pipe: IO[bytes], prefix: str, out: TextIO, log: TextIO, lock: Any) -> None:
    """Copy ``pipe``'s lines to ``out`` after ``prefix`` and to ``log`` as they are, until
    end of file (undecodable bytes replaced); then close ``pipe``."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            with lock:
                out.write(prefix + line)
                out.flush()
                log.write(line)


def run_command(
    args: argparse.Namespace, em: Emulation, job: TopologyJob, run_dir: Path, label: str = ""
) -> int:
    """Install ``job``, run ``args.program`` (COMMAND) once per rank in its host, wait,
    stop the ranks, remove the job. ``label`` begins each rank's prefix (``run --jobs``:
    ``job N ``).

    Returns:
        0 when every rank exited 0, else the exit status of the first rank that failed.

    Raises:
        EmulationError: the job could not be installed.
    """
    specs = _install(em, job)
    try:
        em.write_manifest()  # now naming the switches the job is on
        switches = em.installed_switches(job)
        before = em.counters(switches)
        master = (specs[0].ip, _free_tcp_port(em.host(specs[0].host).pid, specs[0].ip))
        hosts = list(dict.fromkeys(s.host for s in specs))
        print(f"# run: job {job.job_id}, {len(specs)} ranks on {', '.join(hosts)}, switches "
              f"{', '.join(switches)}; MASTER_ADDR={master[0]} MASTER_PORT={master[1]}",
              flush=True)  # fmt: skip
        print(f"# rank logs: {run_dir}/rank-N.log, N = 0..{len(specs) - 1}", flush=True)
        with serve_link_control(run_dir / _LINK_SOCKET, _link_rate_setter(em), _say) as sock:
            status = _run_ranks(args, em, job, specs, master, run_dir, sock, label)
        _report_counters(em, switches, before)
        return status
    finally:
        _remove(em, job.job_id)


def _say(line: str) -> None:
    print(line, flush=True)


def _link_rate_setter(em: Emulation) -> Callable[[float], None]:
    """What a rank's link-rate request runs: every host link's rate, both ends."""
    links = em.topology.host_links()
    return lambda mbit: em.set_link_rate(mbit, links)


def _remove(em: Emulation, job_id: int) -> None:
    """Remove the job; a switch that cannot is logged, not raised (the network goes next
    anyway, and the run's own outcome must not be hidden)."""
    from controller.client import P4RuntimeError
    from controller.switch import ControllerError

    try:
        em.remove_job(job_id)
    except (P4RuntimeError, ControllerError) as exc:
        log.warning("job %d left on a switch until the network goes: %s", job_id, exc)


def _install(em: Emulation, job: TopologyJob) -> list[RankSpec]:
    """Install ``job`` with rank k of each host at WORKER_UDP_PORT + k, as
    :meth:`~emulation.mininet.network.Emulation.configure` does; each rank's :class:`RankSpec`."""
    from emulation.mininet.network import WORKER_UDP_PORT
    from emulation.topology import aggregation_tree

    topo = em.topology
    places = [(h, k, topo.host(h)) for h in job.workers for k in range(topo.host(h).ranks)]
    workers = [(h, (host.address, WORKER_UDP_PORT + k)) for h, k, host in places]
    answers = em.install_job(job, workers)
    tree = aggregation_tree(topo, job)
    specs = []
    for rank, ((h, k, host), (addr, switch_rank)) in enumerate(zip(places, answers, strict=True)):
        specs.append(
            RankSpec(
                rank=rank,
                host=h,
                local_rank=k,
                local_world_size=host.ranks,
                ip=host.address,
                ifname=em.host(h).defaultIntf().name,
                port=WORKER_UDP_PORT + k,
                switch=(str(addr[0]), int(addr[1])),
                switch_rank=switch_rank,
                lanes=topo.switch(tree.host_switch[h]).lanes,
            )
        )
    return specs


def _free_tcp_port(host_pid: int, ip: str) -> int:
    """A TCP port free on ``ip`` inside the namespace of the host shell ``host_pid``.

    The probe runs on a thread of its own: ``setns`` moves only the calling thread, and
    the thread ends with the probe. The window before rank 0 binds the port is accepted
    (a fresh namespace: nothing else there takes ports meanwhile).
    """
    from emulation.bench.workers import enter_netns

    found: list[int] = []
    errors: list[BaseException] = []

    def probe() -> None:
        try:
            enter_netns(f"/proc/{host_pid}/ns/net")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((ip, 0))
                found.append(int(s.getsockname()[1]))
        except BaseException as exc:  # re-raised on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=probe, name="free-port-probe")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return found[0]


class _Rank:
    """COMMAND of one rank in its host, its output streamed and logged."""

    def __init__(
        self, spec: RankSpec, node: Any, command: Sequence[str], env: dict[str, str],
        log_path: Path, lock: Any, label: str = "",
    ) -> None:  # fmt: skip
        self.spec = spec
        self.log = log_path.open("w", buffering=1, encoding="utf-8", errors="replace")
        try:
            # mnexec -d: a session of its own (the process group the rank's children
            # join, what signal() reaches); -a: the host's network namespace.
            self.proc: subprocess.Popen[bytes] = node.popen(
                list(command), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        except BaseException:
            self.log.close()
            raise
        prefix = f"[{label}rank {spec.rank}] "
        streams = ((self.proc.stdout, sys.stdout), (self.proc.stderr, sys.stderr))
        self.pumps = [
            threading.Thread(
                target=stream_lines, args=(pipe, prefix, out, self.log, lock), daemon=True
            )
            for pipe, out in streams
        ]
        for pump in self.pumps:
            pump.start()

    def poll(self) -> int | None:
        """The rank's return code (-N: killed by signal N), ``None`` while it runs.

        An exited rank stays a zombie until :meth:`close` (``WNOWAIT``): its PID, the id
        of its process group, cannot be reused meanwhile, so :meth:`signal` reaches only
        the rank's own processes, whatever it left behind included.
        """
        if self.proc.returncode is not None:
            return self.proc.returncode
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        info = os.waitid(os.P_PID, self.proc.pid, flags)
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank's process group (the rank and its children)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def close(self) -> None:
        """Reap the rank, wait for its last output, close the log."""
        self.proc.wait()
        for pump in self.pumps:
            pump.join(timeout=5.0)
        self.log.close()


def _run_ranks(
    args: argparse.Namespace,
    em: Emulation,
    job: TopologyJob,
    specs: list[RankSpec],
    master: tuple[str, int],
    run_dir: Path,
    link_control: Path,
    label: str = "",
) -> int:
    lock = threading.Lock()
    ranks: list[_Rank] = []
    try:
        for spec in specs:
            env = rank_environment(
                os.environ, spec, len(specs), master, job.job_id,
                min(args.slots, em.slot_count), run_dir,
            )  # fmt: skip
            env[ENV_LINK_CONTROL] = str(link_control)
            log_path = run_dir / f"rank-{spec.rank}.log"
            ranks.append(_Rank(spec, em.host(spec.host), args.program, env, log_path, lock, label))
        return _wait(ranks, args.grace)
    finally:
        _stop(ranks, args.grace)  # whatever ended the wait: a failure, Ctrl-C, SIGTERM
        for r in ranks:
            r.close()


def _wait(ranks: list[_Rank], grace: float) -> int:
    """Until every rank exited 0 (0), or one failed: stop the others; its status."""
    start = time.monotonic()
    while True:
        codes = [r.poll() for r in ranks]
        failed = [(r, code) for r, code in zip(ranks, codes, strict=True) if code]
        if failed:
            rank, code = failed[0]
            status = exit_status(code)
            others = sum(c is None for c in codes)
            print(f"# rank {rank.spec.rank} exited with status {status}: stopping the "
                  f"{others} running ranks", file=sys.stderr, flush=True)  # fmt: skip
            _stop(ranks, grace)
            return status
        if all(c == 0 for c in codes):
            print(f"# all {len(ranks)} ranks exited 0 in {time.monotonic() - start:.1f} s",
                  flush=True)  # fmt: skip
            return 0
        time.sleep(_POLL_SECONDS)


def _stop(ranks: list[_Rank], grace: float) -> None:
    """SIGTERM to every rank still running, SIGKILL to what is left after ``grace``
    seconds; then SIGKILL to every rank's process group, for children left behind."""
    running = [r for r in ranks if r.poll() is None]
    for r in running:
        r.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(r.poll() is None for r in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for r in ranks:
        r.signal(signal.SIGKILL)


def _report_counters(em: Emulation, switches: list[str], before: dict[str, dict[str, int]]) -> None:
    """What the job's switches did during the run (packets aggregated and completed)."""
    after = em.counters(switches)
    for name in switches:
        delta = {k: v - before[name].get(k, 0) for k, v in after[name].items()}
        print(f"# {name}: aggregated {delta.get('aggregated', 0)} packets, completed "
              f"{delta.get('completed', 0)} slot uses during the run", flush=True)  # fmt: skip
