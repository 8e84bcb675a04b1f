"""What one ``inalab bench`` run measures: the size sweep, data type and knobs. Pure data.

Sizes use nccl-tests' syntax (``4K``, ``1M``, ``64M``, plain bytes; binary multiples;
:mod:`hostlib.units`, re-exported here) and its sweep rule: ``minbytes, minbytes*f,
minbytes*f**2, ...`` while ``<= maxbytes``. Nothing here starts a process or imports
torch: ``inalab --help`` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiccl.model import ALGORITHMS as AUTO_CHOICES
from hostlib.ina import RetryPolicy
from hostlib.protocol import LANE_BYTES, MAX_LANES, MAX_WORKERS, ROCE_PMTUS, TNA_LANES_PER_PACKET
from hostlib.units import format_size, parse_size  # re-exported: the bench's size syntax

BENCH_JOB_ID = 1
"""The job id a bench installs on its switch unless its config says otherwise."""

DEFAULT_CC_TARGET = RetryPolicy.cc_target
"""The INA hosts' congestion target unless ``--cc-target`` says otherwise: hostlib's
(off)."""

__all__ = [
    "ALGORITHMS",
    "AUTO_CHOICES",
    "BENCH_JOB_ID",
    "COLLECTIVES",
    "COLLECTIVE_ALGORITHMS",
    "DEFAULT_ALGORITHMS",
    "DEFAULT_BENCH_LANES",
    "DEFAULT_BENCH_SLOTS",
    "DEFAULT_CC_TARGET",
    "DEFAULT_EMULATED_SLOTS",
    "ELEMENT_BYTES",
    "INA_ALGORITHMS",
    "PEER_ALGORITHMS",
    "SWITCH_ALGORITHMS",
    "BenchConfig",
    "align_down",
    "default_algorithms",
    "format_size",
    "parse_size",
    "size_sweep",
]

DEFAULT_BENCH_LANES = MAX_LANES
"""int32 lanes per packet in bench runs: 2048 (8 KiB payload, one 9000-byte jumbo frame).
The P4 target uses 64, but on loopback the soft switch and the host library pay a fixed
Python cost per datagram, so fewer, bigger packets measure the protocol rather than the
interpreter (measured here, 16 MiB with 4 workers: 4.0 s at 256 lanes, 0.6 s at 2048)."""

DEFAULT_BENCH_SLOTS = 32
"""The INA job's slots (its window of outstanding packets per worker) in bench runs. The
loopback bandwidth-delay product is tiny; a larger window only lengthens the queues of
processes sharing the CPU and turns queueing delay into spurious retransmissions."""

TRANSPORTS = ("udp", "rdma")
"""How INA ranks reach the switch: UDP datagrams, or RDMA WRITEs over RoCEv2 (an emulated
RNIC per rank, ``hostlib.transport.rdma``; docs/protocol.md, "INA over RoCEv2")."""

DEFAULT_RDMA_LANES = 1024
"""``--transport rdma``'s lanes per packet: 4 KiB, RoCE's largest path MTU."""

DEFAULT_MSG_PACKETS = 2
"""``--transport rdma``'s packets per message: 8 KiB messages at 1,024 lanes (the engine's
unit, ``msg_packets * lanes``, stays within 2,048 lanes)."""

RDMA_ALGORITHMS = ("ina", "ring", "tree", "gloo")
"""What runs with ``--transport rdma``: INA over RoCEv2, and the baselines as ever."""

DEFAULT_EMULATED_SLOTS = 8
"""The INA window in ``inalab emulate ... bench``: 8 packets of 8 KiB are 5 ms of a
100 Mbit/s link. The window is the queue a worker keeps in its shaped link, and a
longer queue turns into RTT variance and spurious retransmissions (measured, star4,
16 MiB: at 100 Mbit/s 1.47 s with 8 slots, 2.79 s with 32; at 1 Gbit/s 0.77 s with 8,
1.02 s with 32, where the switch is the bottleneck)."""

DEFAULT_EMULATED_WINDOW = 64
"""The ring's and tree's window (packets in flight per peer) in ``inalab emulate ...
bench``. Unlike INA's results, a peer's acks share its link with its own data, so an ack
waits behind up to a window of the peer's packets and only about half the window keeps
the sender's link busy; 8 KiB packets at 1 Gbit/s need more than INA's 8 (measured,
star4, 64 MiB int32, 3 calls: 1.2-1.5 s with 8, 1.03-1.06 s with 32, 0.89-0.95 s with 64,
0.90-0.92 s with 128; Gloo 0.85-0.89 s)."""

ALGORITHMS = ("ina", "collnet", "ring", "tree", "auto", "gloo")
"""Allreduce implementations the bench knows, in the order they run: flat INA (every rank
a worker of the switch's job), CollNet (the ranks of a host reduce through shared memory
and one head rank per host does INA, as NCCL's CollNet with SHARP), hostlib's ring and
binary tree (point to point on the same UDP transport and packet size as INA), ``auto``
(dynamiccl picks ina, ring or tree per size) and Gloo's ring (torch.distributed, TCP)."""

INA_ALGORITHMS = ("ina", "collnet")
"""The algorithms that run only through the switch."""

PEER_ALGORITHMS = ("ring", "tree")
"""The host-based algorithms of hostlib: ranks exchange packets directly, no switch."""

SWITCH_ALGORITHMS = (*INA_ALGORITHMS, "auto")
"""The algorithms whose run installs a job on the switch."""

DEFAULT_ALGORITHMS = ("ina", "gloo")
"""What runs without ``--algos``: collnet is only meaningful with several ranks per host."""

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
"""What the bench times (nccl-tests' all_reduce_perf, reduce_scatter_perf, all_gather_perf).
A size is the whole vector: an allreduce's or a reduce-scatter's input, an all-gather's
output (each rank contributes a ``1/n`` part), as nccl-tests counts it."""

COLLECTIVE_ALGORITHMS = {
    "allreduce": ALGORITHMS,
    "reduce_scatter": ("ina", "ring", "gloo"),  # INA: an allreduce of which each keeps its part
    "all_gather": ("ring", "gloo"),  # nothing to sum: no switch
}
"""The algorithms that run each collective."""


def default_algorithms(collective: str) -> tuple[str, ...]:
    """``--algos``'s default for ``collective``: INA and Gloo, or the ring and Gloo where
    INA cannot run it."""
    return DEFAULT_ALGORITHMS if "ina" in COLLECTIVE_ALGORITHMS[collective] else ("ring", "gloo")


# AUTO_CHOICES (imported above) is what ``auto`` chooses from: dynamiccl's algorithms; its
# ranks hold a session of each.

ELEMENT_BYTES = {"float32": 4, "int32": 4}
"""Supported data types and their sizes: the two types the INA wire format carries."""


def align_down(nbytes: int, element_bytes: int) -> int:
    """``nbytes`` rounded down to a whole number of elements."""
    return nbytes - nbytes % element_bytes


def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """Sizes from ``minbytes`` multiplied by ``factor`` while not above ``maxbytes``.

    Raises:
        ValueError: ``minbytes`` not positive, ``minbytes > maxbytes`` or ``factor < 2``.
    """
    if minbytes <= 0:
        raise ValueError(f"minbytes {minbytes} must be positive")
    if minbytes > maxbytes:
        raise ValueError(f"minbytes {minbytes} is larger than maxbytes {maxbytes}")
    if factor < 2:
        raise ValueError(f"stepfactor {factor} must be at least 2")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


@dataclass(frozen=True)
class BenchConfig:
    """One bench run, validated.

    Attributes:
        sizes: message sizes in bytes, each a multiple of the element size.
        algos: algorithms to run, a subset of :data:`ALGORITHMS`.
        workers: ranks per job.
        dtype: ``"float32"`` or ``"int32"``.
        iters: timed calls per size.
        warmup: untimed calls per size before the timed ones.
        lanes: int32 lanes per INA packet (switch and hosts agree).
        slots: the INA job's slots per set (its outstanding window).
        window: the ring's and tree's packets in flight per peer (``None``: ``slots``).
        loss: drop probability at switch ingress and, per replica, at egress.
        seed: seeds inputs and the switch's drop simulator.
        timeout: seconds a host waits without progress before failing the run.
        job_id: the id of the INA job on the switch (several benches on one fabric
            need their own).
        cc_target: the INA hosts' congestion target, seconds of queueing above the
            least round trip (``math.inf``: off; :attr:`hostlib.ina.RetryPolicy.cc_target`).
        pcap_count: packets the switch records into ``switch.pcap`` in the run
            directory (0: no capture).
        ranks_per_host: on loopback, consecutive ranks grouped into one emulated host
            (CollNet's local reduce); ``workers`` must be a multiple of it.
        collective: one of :data:`COLLECTIVES`; reduce-scatter and all-gather sizes
            hold a whole number of elements per rank.
        program: whose P4Info the loopback soft switch serves, so whose names the
            controller configures the job through: ``"v1model"`` (``p4/ina.p4``) or
            ``"tna"`` (``p4/tna/``, a Tofino switch's; ``lanes`` must be its
            ``TNA_LANES_PER_PACKET``).

    Raises:
        ValueError: any field out of range.
    """

    sizes: tuple[int, ...]
    algos: tuple[str, ...] = DEFAULT_ALGORITHMS
    workers: int = 4
    dtype: str = "float32"
    iters: int = 5
    warmup: int = 2
    lanes: int = DEFAULT_BENCH_LANES
    slots: int = DEFAULT_BENCH_SLOTS
    window: int | None = None
    loss: float = 0.0
    seed: int = 0
    timeout: float = 10.0
    cc_target: float = DEFAULT_CC_TARGET
    job_id: int = BENCH_JOB_ID
    pcap_count: int = 0
    ranks_per_host: int = 1
    collective: str = "allreduce"
    program: str = "v1model"
    transport: str = "udp"
    msg_packets: int = 1
    rdma_device: str | None = None
    """``--transport rdma``: the verbs device the ranks run on (None: emulated RNICs)."""

    @property
    def p2p_window(self) -> int:
        """The ring's and tree's window: ``window``, else the INA slots."""
        return self.window if self.window is not None else self.slots

    def __post_init__(self) -> None:
        problems = []
        if not self.sizes:
            problems.append("no sizes to run")
        if self.dtype not in ELEMENT_BYTES:
            problems.append(f"dtype {self.dtype!r} not one of {', '.join(ELEMENT_BYTES)}")
        elif any(s <= 0 or s % ELEMENT_BYTES[self.dtype] for s in self.sizes):
            problems.append(f"sizes must be positive multiples of the {self.dtype} size")
        if not self.algos or any(a not in ALGORITHMS for a in self.algos):
            problems.append(f"algos {self.algos} not a non-empty subset of {ALGORITHMS}")
        elif self.collective not in COLLECTIVES:
            problems.append(f"collective {self.collective!r} not one of {', '.join(COLLECTIVES)}")
        else:
            runs = COLLECTIVE_ALGORITHMS[self.collective]
            cannot = [a for a in self.algos if a not in runs]
            if cannot:
                problems.append(f"{', '.join(cannot)} cannot run {self.collective} (what does: "
                                f"{', '.join(runs)})")  # fmt: skip
            elif self.collective != "allreduce" and self.dtype in ELEMENT_BYTES:
                parts = [s for s in self.sizes if s % (ELEMENT_BYTES[self.dtype] * self.workers)]
                if parts:
                    problems.append(
                        f"{self.collective} sizes must hold a whole number of {self.dtype}"
                        f" elements for each of the {self.workers} ranks: not {parts[0]} B"
                        f" (sizes that are multiples of {ELEMENT_BYTES[self.dtype] * self.workers}"
                        " B do, e.g. from -b)"
                    )
        if not 1 <= self.workers <= MAX_WORKERS:
            problems.append(f"workers {self.workers} outside 1..{MAX_WORKERS}")
        if self.iters < 1 or self.warmup < 0:
            problems.append("iters must be >= 1 and warmup >= 0")
        if not 1 <= self.lanes <= MAX_LANES:
            problems.append(f"lanes {self.lanes} outside 1..{MAX_LANES}")
        if self.program not in ("v1model", "tna"):
            problems.append(f"program {self.program!r} not v1model or tna")
        elif self.program == "tna" and self.lanes != TNA_LANES_PER_PACKET:
            problems.append(
                f"lanes {self.lanes}: the Tofino program (--program tna) has {TNA_LANES_PER_PACKET}"
            )
        if self.slots < 1:
            problems.append(f"slots {self.slots} must be positive")
        problems += self._transport_problems()
        if self.window is not None and self.window < 1:
            problems.append(f"window {self.window} must be positive")
        if not 0.0 <= self.loss < 1.0:
            problems.append(f"loss {self.loss} outside [0, 1)")
        if self.ranks_per_host < 1 or self.workers % self.ranks_per_host:
            problems.append(
                f"workers {self.workers} not a multiple of ranks per host {self.ranks_per_host}"
            )
        if self.pcap_count < 0:
            problems.append(f"pcap_count {self.pcap_count} must be >= 0")
        if not self.timeout > 0:
            problems.append(f"timeout {self.timeout} must be positive")
        if not 0 <= self.job_id <= 0xFFFF:
            problems.append(f"job_id {self.job_id} outside 0..65535")
        if not self.cc_target > 0:
            problems.append(f"cc_target {self.cc_target} must be positive (inf: off)")
        if problems:
            raise ValueError("; ".join(problems))

    def _transport_problems(self) -> list[str]:
        if self.transport not in TRANSPORTS:
            return [f"transport {self.transport!r} not one of {', '.join(TRANSPORTS)}"]
        if self.transport == "udp":
            if self.rdma_device is not None:
                return ["rdma_device: --transport rdma only"]
            return [] if self.msg_packets == 1 else ["msg_packets: --transport rdma only"]
        m, problems = self.msg_packets, []
        if cannot := [a for a in self.algos if a not in RDMA_ALGORITHMS]:
            problems.append(f"{', '.join(cannot)}: not over RDMA yet (runs: "
                            f"{', '.join(RDMA_ALGORITHMS)})")  # fmt: skip
        if self.lanes * LANE_BYTES not in ROCE_PMTUS:
            pmtus = ", ".join(str(b // LANE_BYTES) for b in ROCE_PMTUS)
            problems.append(f"lanes {self.lanes}: over RDMA a packet is a path MTU ({pmtus})")
        if m < 1 or m & (m - 1) or m * self.lanes > MAX_LANES:
            problems.append(f"msg_packets {m}: a power of two with msg_packets x lanes <= "
                            f"{MAX_LANES}")  # fmt: skip
        elif self.slots % m:
            problems.append(f"slots {self.slots}: a multiple of msg_packets {m}")
        if self.ranks_per_host != 1 or self.program != "v1model":
            problems.append("--transport rdma: one rank a host, --program v1model")
        return problems

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]
