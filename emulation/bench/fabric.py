"""Where a bench runs: the network its ranks sit on and the switch their INA job uses.

The sweep (``sweep.py``) is the same everywhere; a :class:`Fabric` says where each rank
runs (:class:`~emulation.bench.workers.Placement`: a network namespace, an address, a
host) and provides the INA switch. :class:`LoopbackFabric` is ``inalab bench``'s: every
rank on 127.0.0.1 and a soft switch process of its own, started per algorithm. The
emulator's fabric (``emulation.mininet.emulate``) puts ranks into Mininet hosts and installs
jobs on the topology's switches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from emulation.bench.config import BenchConfig
from emulation.bench.workers import Placement

__all__ = ["Addr", "Fabric", "FabricError", "InaSwitch", "LoopbackFabric", "process_cpu_ms"]

Addr = tuple[str, int]


class FabricError(RuntimeError):
    """The fabric's switch could not be started or configured."""


class InaSwitch(Protocol):
    """The switch (or switches) an INA job runs on, for one algorithm's run."""

    @property
    def log_path(self) -> Path | None:
        """Where the switch logs, for error messages (``None``: several, see the run dir)."""
        ...

    def install(
        self, job_id: int, addrs: Sequence[Addr], hosts: Sequence[Placement]
    ) -> list[tuple[Addr, int]]:
        """Install job ``job_id`` whose i-th worker is ``addrs[i]`` on host ``hosts[i]``;
        return, for worker i, the address it sends its packets to and the rank its
        packets carry (its rank at that switch: with hierarchical aggregation, its index
        among the workers of its leaf switch).

        Raises:
            FabricError: the job cannot be installed.
        """
        ...

    def install_roce(
        self, job_id: int, ips: Sequence[str], endpoints: Sequence[Sequence[Any]], m: int
    ) -> list[tuple[int, ...]]:
        """Install the RoCEv2 queue pairs of job ``job_id`` (installed first), whose worker
        i sends from ``ips[i]`` and takes replies at ``endpoints[i]`` (``RdmaEndpoint``s,
        one per window position), messages of ``m`` packets; return, for worker i, the
        switch's queue pair of each window position.

        Raises:
            FabricError: the fabric's switch does not serve RoCEv2, or refused the job.
        """
        ...

    @property
    def roce_icrc(self) -> bool:
        """Whether the switch's RoCEv2 replies carry a computed ICRC (the software data
        planes'), which hosts then check; a P4 target's carry 0."""
        ...

    def counters(self) -> dict[str, Any]:
        """The switch's statistics after the run."""
        ...

    @property
    def pids(self) -> Mapping[str, int]:
        """The processes that run this switch's data plane, by switch name, for the
        bench's CPU accounting (empty: none, e.g. a data plane inside the kernel, whose
        time shows only in the machine's softirq share)."""
        ...

    def remove(self, job_id: int) -> None:
        """Remove the job (its slots are cleared)."""
        ...


class Fabric(Protocol):
    """Placements of ranks, Gloo's rendezvous and the INA switch."""

    description: str
    """How the ranks are connected, for the bench's banner and table headers."""

    def placements(self, workers: int) -> list[Placement]:
        """Where ranks ``0..workers-1`` run, index = rank."""
        ...

    def gloo_init(self, attempt: int) -> str:
        """Gloo's ``tcp://HOST:PORT`` rendezvous at rank 0; ``attempt`` counts runs, so a
        fabric can move to a fresh port (a previous run's socket may linger)."""
        ...

    def ina_switch(self, cfg: BenchConfig, run_dir: Path) -> AbstractContextManager[InaSwitch]:
        """The switch for one algorithm's run, stopped or cleaned up on exit."""
        ...

    def switch_pids(self) -> Mapping[str, int]:
        """Switch processes that carry every algorithm's packets while the fabric exists
        (an emulated network's switches forward ring and Gloo traffic too), by name, for
        the bench's CPU accounting; empty where a switch runs only for INA (loopback)."""
        ...

    def link_drops(self) -> Mapping[str, int]:
        """Frames the fabric's emulated links dropped so far (full shaper queues, full
        veth rings), by interface; empty where there are no such links (loopback)."""
        ...


class LoopbackFabric:
    """All ranks on 127.0.0.1; ``ranks_per_host`` consecutive ranks form one "host" for
    CollNet; a soft switch process per algorithm run.

    Raises:
        ValueError: ``ranks_per_host`` < 1.
    """

    description = "127.0.0.1"
    links = "none: loopback (127.0.0.1), no wire, no shaping"
    """What the ranks' packets cross, for headers, titles and the JSON."""

    def __init__(self, ranks_per_host: int = 1) -> None:
        if ranks_per_host < 1:
            raise ValueError(f"ranks per host {ranks_per_host} must be positive")
        self.ranks_per_host = ranks_per_host

    def placements(self, workers: int) -> list[Placement]:
        k = self.ranks_per_host
        return [Placement(host=r // k, local_rank=r % k) for r in range(workers)]

    def gloo_init(self, attempt: int) -> str:
        return f"tcp://127.0.0.1:{_free_tcp_port()}"

    def switch_pids(self) -> Mapping[str, int]:
        return {}  # ring, tree and Gloo talk over loopback; the switch is INA's alone

    def link_drops(self) -> Mapping[str, int]:
        return {}  # no emulated links: loopback

    @contextmanager
    def ina_switch(self, cfg: BenchConfig, run_dir: Path) -> Iterator[InaSwitch]:
        from controller.client import P4RuntimeError
        from controller.switch import ControllerError
        from emulation.softswitch.process import SoftSwitchProcess, SwitchStartError

        roce = ("--roce",) if cfg.transport == "rdma" else ()
        switch = SoftSwitchProcess(
            run_dir, lanes=cfg.lanes, slots=cfg.slots, seed=cfg.seed,
            extra_args=(*_pcap_args(cfg, run_dir), "--program", cfg.program, *roce),
        )  # fmt: skip
        try:
            switch.start()
            with switch.controller() as ctl:
                # The real control path: the job and the loss are P4Runtime writes.
                ctl.set_drops(cfg.loss, cfg.loss)
                yield _LoopbackSwitch(switch, ctl, cfg.slots)
        except (SwitchStartError, P4RuntimeError, ControllerError) as exc:
            raise FabricError(f"soft switch: {exc}") from exc
        finally:
            switch.stop()


class _LoopbackSwitch:
    def __init__(self, process: Any, ctl: Any, slots: int) -> None:
        self._process, self._ctl, self._slots = process, ctl, slots

    @property
    def log_path(self) -> Path | None:
        return Path(self._process.log_path)

    def install(
        self, job_id: int, addrs: Sequence[Addr], hosts: Sequence[Placement]
    ) -> list[tuple[Addr, int]]:
        from controller.switch import WorkerAddress

        self._ctl.add_job(job_id, [WorkerAddress(ip, port) for ip, port in addrs], self._slots)
        data = self._process.data_addr
        return [((str(data[0]), int(data[1])), i) for i in range(len(addrs))]

    def install_roce(
        self, job_id: int, ips: Sequence[str], endpoints: Sequence[Sequence[Any]], m: int
    ) -> list[tuple[int, ...]]:
        from controller.client import P4RuntimeError

        if self._ctl.roce is None:
            raise FabricError("the switch's program has no RoCEv2 tables")
        try:
            return list(self._ctl.roce.install(job_id, ips, endpoints, m).switch_qpns)
        except (ValueError, P4RuntimeError) as exc:
            raise FabricError(f"RoCEv2 queue pairs of job {job_id}: {exc}") from exc

    @property
    def roce_icrc(self) -> bool:
        return True  # the soft switch computes every reply's ICRC

    def counters(self) -> dict[str, Any]:
        """The switch's statistics and ``cpu_ms``, its process's CPU time so far."""
        return {**self._ctl.counters(), "cpu_ms": process_cpu_ms(self._process.pid)}

    def remove(self, job_id: int) -> None:
        self._ctl.remove_job(job_id)

    @property
    def pids(self) -> Mapping[str, int]:
        return {"switch": self._process.pid}


def process_cpu_ms(pid: int) -> int:
    """User + system CPU time of a process in ms (Linux ``/proc/PID/stat``).

    Raises:
        OSError: no such process.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ticks * 1000 // os.sysconf("SC_CLK_TCK")


def _free_tcp_port() -> int:
    import socket

    # Gloo's tcp:// rendezvous needs a port number up front; the small window between
    # closing this socket and rank 0 binding it is accepted (loopback, our own run).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pcap_args(cfg: BenchConfig, run_dir: Path) -> tuple[str, ...]:
    """The switch's capture options: its first ``cfg.pcap_count`` packets, if any."""
    if not cfg.pcap_count:
        return ()
    return ("--pcap", str(run_dir / "switch.pcap"), "--pcap-count", str(cfg.pcap_count))
