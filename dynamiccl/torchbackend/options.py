"""The ``"ina"`` torch backend's options (layer: dynamiccl; served by
:mod:`dynamiccl.torch_backend`).

Owns how a rank is configured: the ``INALAB_*`` variables (the ``ENV_*`` names) and their
defaults (``DEFAULT_*``), :class:`InaOptions` with the further aggregators of a striped
job (:class:`Aggregator`), their reading from the environment
(:meth:`InaOptions.from_env`, :func:`chooser_from_env`, :func:`parse_addr`), and
:class:`InaSetupError`, the error a job that cannot be set up raises.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from dynamiccl.learning import AgreedLearner
from dynamiccl.torchbackend.choosers import AlwaysIna, Chooser
from hostlib.ina import Addr, RetryPolicy
from hostlib.protocol import DEFAULT_SLOTS_PER_JOB, LANE_BYTES, MAX_LANES, ROCE_PMTUS
from hostlib.transport.udp import route_source

if TYPE_CHECKING:
    from controller.tls import TlsFiles

__all__ = [
    "DEFAULT_CC_TARGET",
    "DEFAULT_COLLNET_BYTES",
    "DEFAULT_DEADLINE",
    "DEFAULT_MSG_PACKETS",
    "ENV_AGENT_FROZEN",
    "ENV_AGENT_SAVE",
    "ENV_AGENT_STATE",
    "ENV_AGENT_SYNC_EVERY",
    "ENV_BIND",
    "ENV_CC_TARGET",
    "ENV_CHOOSER",
    "ENV_COLLNET",
    "ENV_COLLNET_BYTES",
    "ENV_DEADLINE",
    "ENV_DEVICE_ID",
    "ENV_GLOO_IFNAME",
    "ENV_HOST",
    "ENV_JOB",
    "ENV_LANES",
    "ENV_MSG_PACKETS",
    "ENV_P4RUNTIME",
    "ENV_PORT",
    "ENV_PROFILE",
    "ENV_RDMA_DEVICE",
    "ENV_RDMA_ICRC",
    "ENV_SLOTS",
    "ENV_SWITCH",
    "ENV_SWITCH_RANK",
    "ENV_TRANSPORT",
    "ENV_WORKERS",
    "TRANSPORTS",
    "Aggregator",
    "InaOptions",
    "InaSetupError",
    "chooser_from_env",
    "parse_addr",
    "rdma_lanes_problems",
    "rdma_problems",
]


ENV_SWITCH = "INALAB_SWITCH"
"""``host:port``: the switch's UDP data address (required): where this rank sends. A
comma list names several aggregators the job is striped across
(:class:`~hostlib.session.StripedInaSession`), each with its P4Runtime server at the same
place in :data:`ENV_P4RUNTIME`."""
ENV_P4RUNTIME = "INALAB_P4RUNTIME"
"""``host:port``: the switch's P4Runtime server, where rank 0 installs the job (a comma
list: one per aggregator of :data:`ENV_SWITCH`); absent or empty: the job is installed
already (then :data:`ENV_LANES` is required, and one aggregator)."""
ENV_JOB = "INALAB_JOB"
"""The job id, 0..65535 (required): unused on the switch, or the installed job's."""
ENV_BIND = "INALAB_BIND"
"""The address this rank's UDP socket binds (default 127.0.0.1)."""
ENV_PORT = "INALAB_PORT"
"""The UDP port this rank's socket binds (default 0: any free one); a job installed
already needs the port it was installed for."""
ENV_SWITCH_RANK = "INALAB_SWITCH_RANK"
"""A job installed already: the rank this rank's packets carry at its switch (default:
its rank in the group); under hierarchical aggregation, its rank at its leaf."""
ENV_WORKERS = "INALAB_WORKERS"
"""A job installed already: the contributions the job sums in all, which float32
quantization leaves headroom for (default: the group's size)."""
ENV_LANES = "INALAB_LANES"
"""int32 lanes per packet, the switch's: required when the job is installed already
(otherwise rank 0 reads them from the switch)."""
ENV_SLOTS = "INALAB_SLOTS"
"""Slots per set the job gets (default hostlib's DEFAULT_SLOTS_PER_JOB)."""
ENV_DEVICE_ID = "INALAB_DEVICE_ID"
"""The switch's P4Runtime device id (default 0)."""
ENV_CHOOSER = "INALAB_CHOOSER"
"""``ina`` (default: every supported allreduce through the switch), ``dynamiccl``
(dynamiccl's policy per size) or ``agent`` (the online agent, learning inside the job:
:data:`ENV_AGENT_STATE`, :data:`ENV_AGENT_FROZEN`, :data:`ENV_AGENT_SAVE`); the last two
need ``WORLD_SIZE``, as torchrun sets it."""
ENV_PROFILE = "INALAB_PROFILE"
"""``dynamiccl`` chooser: the profile JSON (``inalab calibrate``; default: built-in)."""
ENV_AGENT_STATE = "INALAB_AGENT_STATE"
"""``agent`` chooser: an online agent's saved state (``inalab replay --agent-state``) to
continue learning from inside the job (``dynamiccl.learning``: every rank learns the
times the ranks agree on, so all choose alike); unset: learn from scratch."""
ENV_AGENT_FROZEN = "INALAB_AGENT_FROZEN"
"""``1``: use :data:`ENV_AGENT_STATE` frozen (:meth:`dynamiccl.agent.Agent.frozen`): it
decides by what it learnt and learns nothing more."""
ENV_AGENT_SAVE = "INALAB_AGENT_SAVE"
"""``agent`` chooser: where rank 0 saves the agent's state when the group shuts down."""
ENV_AGENT_SYNC_EVERY = "INALAB_AGENT_SYNC_EVERY"
"""``agent`` chooser: calls between the ranks' agreements on times (default 16)."""
ENV_HOST = "INALAB_HOST"
"""The name of this rank's machine (default :func:`host_key`: hostname, boot id and
network namespace). Ranks that give the same name must share ``/dev/shm``: where rank 0
installs the job and the ranks sit on several machines, some with several ranks, each
machine's first rank alone is the switch's worker and its other ranks add into it
through shared memory (CollNet, :mod:`hostlib.collnet`), as NCCL's CollNet does."""
ENV_COLLNET = "INALAB_COLLNET"
"""``0``: every rank is a worker of the switch, whatever machine it is on (default
``1``: CollNet where :data:`ENV_HOST` says machines have several ranks)."""
ENV_COLLNET_BYTES = "INALAB_COLLNET_BYTES"
"""CollNet: the largest piece of a call the ranks of a machine reduce through shared
memory at once, in bytes (default 16 MiB); each machine maps ``(ranks + 1)`` times it."""

ENV_DEADLINE = "INALAB_DEADLINE"
"""Seconds an INA, ring or tree call may go without progress (no new result from the
switch, no packet from a peer) while it has packets outstanding before it fails with an
error naming the switch or peer (default :data:`DEFAULT_DEADLINE`, or the process group's
timeout where that is shorter). A dead switch answers nothing, and neither does a live
one while a rank has not entered the call: raise it where ranks can enter a collective
further apart than this (one rank saving a checkpoint while the others wait)."""
ENV_CC_TARGET = "INALAB_CC_TARGET"
"""Milliseconds of queueing an INA call's packets may meet above the least round trip
seen before this rank's congestion window shrinks (:mod:`hostlib.congestion`), a number
above 0 (5: what the fat tree was measured with), or ``off``: no congestion control
(default :data:`DEFAULT_CC_TARGET`, off, as ``inalab bench --cc-target``'s: measured, it
does not pay yet); ring and tree calls have no congestion window."""
ENV_TRANSPORT = "INALAB_TRANSPORT"
"""How INA ranks reach the switch: ``udp`` (default) or ``rdma``: RoCEv2 WRITEs from an
emulated RNIC bound to this rank's address (:data:`ENV_BIND` or the route's source), UDP
4791, so one rank an address; or from :data:`ENV_RDMA_DEVICE`. The switch's data address
in :data:`ENV_SWITCH` keeps its port (its RoCEv2 endpoint is its address's UDP 4791), rank
0 installs the job (:data:`ENV_P4RUNTIME` is required) and its queue pairs, and the
switch's lanes must make a RoCE path MTU (64, 128, 256, 512 or 1024)."""
ENV_MSG_PACKETS = "INALAB_MSG_PACKETS"
"""``rdma``: packets per RDMA message, a power of two up to 32 whose product with the lanes
is at most 2,048 and which divides :data:`ENV_SLOTS` (default
:data:`DEFAULT_MSG_PACKETS`); a retransmission resends a whole message."""
ENV_RDMA_DEVICE = "INALAB_RDMA_DEVICE"
"""``rdma``: a verbs device (e.g. ``mlx5_0``, ``rxe0``) whose RoCEv2 GID holds this rank's
address, instead of an emulated RNIC (:class:`hostlib.transport.verbs.VerbsDevice`)."""
ENV_RDMA_ICRC = "INALAB_RDMA_ICRC"
"""``rdma``: ``0`` turns the emulated RNIC's ICRC check off, for a P4 switch (bmv2, a
Tofino) whose replies carry ICRC 0 (docs/rdma.md, "The ICRC and the MTU"); default
``1``. A verbs device's check is the RNIC's own setting."""
ENV_GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
"""torch's own variable: the interfaces Gloo binds. Unset, the ``"ina"`` group sets it,
for its process, to the interface this host's routes use toward ``MASTER_ADDR``
(:func:`gloo_group`), not leaving Gloo the address the hostname resolves to, which
Debian and others map to loopback."""


DEFAULT_COLLNET_BYTES = 16 * 2**20
DEFAULT_MSG_PACKETS = 2
"""``rdma``'s packets per message (as ``inalab bench --transport rdma``'s)."""
TRANSPORTS = ("udp", "rdma")
"""What :data:`ENV_TRANSPORT` takes."""
DEFAULT_DEADLINE: float = RetryPolicy.deadline
"""The no-progress deadline of :data:`ENV_DEADLINE`, hostlib's own
(:attr:`hostlib.ina.RetryPolicy.deadline`): seconds, not ``init_process_group``'s 30
minutes, so a dead switch ends every rank's call within it."""
DEFAULT_CC_TARGET: float = RetryPolicy.cc_target
"""The congestion target of :data:`ENV_CC_TARGET`, in seconds, hostlib's own
(:attr:`hostlib.ina.RetryPolicy.cc_target`)."""


class InaSetupError(RuntimeError):
    """The INA job could not be set up (bad configuration, or the switch refused it)."""


@dataclass(frozen=True)
class Aggregator:
    """One more aggregator of a striped job: its UDP data address and P4Runtime server."""

    switch: Addr
    p4runtime: str


@dataclass(frozen=True)
class InaOptions:
    """Where the INA job runs and how this rank joins it.

    Attributes:
        switch: the switch's UDP data address (where this rank sends).
        p4runtime: ``host:port`` of its P4Runtime server (rank 0 installs the job there);
            ``None``: the job is installed already, for this rank at ``bind_ip:bind_port``.
        stripes: further aggregators (each a server's ``inalab switch --one-armed``) the
            job is striped across, after ``switch``: rank 0 installs the job on each, and
            every call is cut into one stripe per aggregator
            (:class:`~hostlib.session.StripedInaSession`); only where rank 0 installs.
        job_id: the job's id on the switch, 0..65535.
        device_id: the switch's P4Runtime device id.
        bind_ip: the address this rank's UDP sockets bind; ``None``: the address this
            host's routes send from toward the switch (:attr:`local_ip`), so ranks on
            any machine are reachable from it (``INALAB_BIND``).
        bind_port: the port it binds (0: any free one).
        slots: slots per set the job gets (its window of packets in flight); a job
            installed already: at most the slots it was installed with.
        deadline: seconds without progress before a call fails (:data:`ENV_DEADLINE`);
            ``None``: :data:`DEFAULT_DEADLINE`, or the process group's timeout where that
            is shorter (:meth:`no_progress_deadline`).
        cc_target: seconds of queueing above the least round trip before an INA call's
            congestion window shrinks (:data:`ENV_CC_TARGET`; ``math.inf``: no
            congestion control); ``None``: :data:`DEFAULT_CC_TARGET`.
        chooser: what runs each call, per collective and size (:func:`resolve_action`).
        remove_on_shutdown: rank 0 removes the job when the group shuts down (only a job
            it installed).
        switch_rank: a job installed already: the rank this rank has at its switch
            (``None``: its rank in the group). Where rank 0 installs, the group's rank.
        num_workers: a job installed already: the contributions it sums in all, for the
            float32 quantization's headroom (``None``: the group's size). Where rank 0
            installs, the group's size.
        lanes: int32 lanes per packet; required for a job installed already (rank 0
            otherwise reads the switch's).
        p4runtime_tls: mutual TLS files for ``p4runtime`` (``INALAB_P4RUNTIME_TLS``:
            ``CERT,KEY,CA``); required when it is not a loopback address.
        host: this rank's machine (:data:`ENV_HOST`); ``None``: :func:`host_key`.
        collnet: CollNet across machines with several ranks (:data:`ENV_COLLNET`);
            only where rank 0 installs the job.
        collnet_bytes: CollNet's shared-memory piece (:data:`ENV_COLLNET_BYTES`).
        transport: ``udp`` or ``rdma`` (:data:`ENV_TRANSPORT`).
        msg_packets: ``rdma``: packets per message (:data:`ENV_MSG_PACKETS`).
        rdma_device: ``rdma``: a verbs device instead of an emulated RNIC
            (:data:`ENV_RDMA_DEVICE`).
        check_icrc: ``rdma``: the emulated RNIC checks the replies' ICRC
            (:data:`ENV_RDMA_ICRC`).

    Raises:
        ValueError: a field out of range, a job installed already without ``lanes``, or
            ``rdma`` settings that cannot go together (:func:`rdma_problems`).
    """

    switch: Addr
    p4runtime: str | None
    job_id: int
    device_id: int = 0
    bind_ip: str | None = None
    slots: int = DEFAULT_SLOTS_PER_JOB
    deadline: float | None = None
    chooser: Chooser = field(default_factory=AlwaysIna)
    remove_on_shutdown: bool = True
    bind_port: int = 0
    switch_rank: int | None = None
    num_workers: int | None = None
    lanes: int | None = None
    p4runtime_tls: TlsFiles | None = None
    stripes: tuple[Aggregator, ...] = ()
    host: str | None = None
    collnet: bool = True
    collnet_bytes: int = DEFAULT_COLLNET_BYTES
    transport: str = "udp"
    msg_packets: int = DEFAULT_MSG_PACKETS
    rdma_device: str | None = None
    check_icrc: bool = True
    cc_target: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.job_id <= 0xFFFF:
            raise ValueError(f"job id {self.job_id} outside 0..65535")
        if self.slots < 1:
            raise ValueError(f"slots {self.slots} must be positive")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline {self.deadline} must be positive")
        if self.cc_target is not None and not self.cc_target > 0:
            raise ValueError(f"congestion target {self.cc_target} must be positive (inf: off)")
        if not 0 <= self.bind_port <= 0xFFFF:
            raise ValueError(f"bind port {self.bind_port} outside 0..65535")
        if self.collnet_bytes < 64:
            raise ValueError(f"collnet bytes {self.collnet_bytes} below 64")
        if self.p4runtime is None and self.lanes is None:
            raise ValueError("a job installed already (no p4runtime) needs lanes")
        if self.p4runtime is None and self.stripes:
            raise ValueError(
                "a job installed already runs on one aggregator: several need p4runtime "
                "servers (rank 0 installs the job on each)"
            )
        if problems := rdma_problems(self):
            raise ValueError("; ".join(problems))
        # JobSpec checks the rest (rank below num_workers, lanes in range) at setup.

    @property
    def local_ip(self) -> str:
        """The address this rank binds: :attr:`bind_ip`, else the route's source toward
        the switch (127.0.0.1 for a switch on loopback).

        Raises:
            OSError: no route to the switch.
        """
        return self.local_ip_for(self.switch)

    @property
    def aggregators(self) -> list[tuple[Addr, str | None]]:
        """Every aggregator's ``(data address, P4Runtime server)``, ``switch`` first."""
        return [(self.switch, self.p4runtime)] + [(a.switch, a.p4runtime) for a in self.stripes]

    def local_ip_for(self, switch: Addr) -> str:
        """The address this rank binds toward ``switch``: :attr:`bind_ip`, else the
        route's source toward it.

        Raises:
            OSError: no route to ``switch``.
        """
        return self.bind_ip or route_source(switch[0])

    def no_progress_deadline(self, timeout: timedelta) -> float:
        """Seconds a call may go without progress: :attr:`deadline`, else
        :data:`DEFAULT_DEADLINE` or ``timeout`` (the process group's) if shorter."""
        if self.deadline is not None:
            return self.deadline
        return min(DEFAULT_DEADLINE, timeout.total_seconds())

    def retry_policy(self, timeout: timedelta) -> RetryPolicy:
        """The retry policy of this rank's sessions (INA, ring and tree): hostlib's, with
        :meth:`no_progress_deadline` and, where set, :attr:`cc_target` (only INA calls
        have a congestion window)."""
        deadline = self.no_progress_deadline(timeout)
        if self.cc_target is None:
            return RetryPolicy(deadline=deadline)
        return RetryPolicy(deadline=deadline, cc_target=self.cc_target)

    @property
    def installed(self) -> bool:
        """Whether the job is installed already (by a launcher), not by rank 0."""
        return self.p4runtime is None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InaOptions:
        """Options from ``INALAB_*`` variables (see the module's ``ENV_*`` names).

        Raises:
            InaSetupError: a required variable is missing or a value does not parse.
        """
        from controller.tls import TlsFiles  # grpc: only where a switch is dialled

        env = os.environ if environ is None else environ
        missing = [k for k in (ENV_SWITCH, ENV_JOB) if not env.get(k)]
        if not env.get(ENV_P4RUNTIME) and not env.get(ENV_LANES):
            # Neither mode is complete: name what each one lacks.
            missing.append(f"{ENV_P4RUNTIME} (rank 0 installs the job) or {ENV_LANES} "
                           "(the job is installed already)")  # fmt: skip
        if missing:
            raise InaSetupError(f"the ina backend needs {', '.join(missing)} (or pg_options)")

        def number(name: str) -> int | None:
            return int(env[name]) if env.get(name) else None

        def seconds(name: str) -> float | None:
            return float(env[name]) if env.get(name) else None

        try:
            switches = [parse_addr(a.strip()) for a in env[ENV_SWITCH].split(",")]
            servers = [a.strip() for a in env.get(ENV_P4RUNTIME, "").split(",") if a.strip()]
            if servers and len(servers) != len(switches):
                raise ValueError(
                    f"{ENV_SWITCH} names {len(switches)} aggregator(s), {ENV_P4RUNTIME} "
                    f"{len(servers)}: give one P4Runtime server per aggregator, in order"
                )
            if len(switches) > 1 and not servers:
                raise ValueError(f"{len(switches)} aggregators in {ENV_SWITCH} need "
                                 f"{ENV_P4RUNTIME} (rank 0 installs the job on each)")  # fmt: skip
            return cls(
                switch=switches[0],
                p4runtime=servers[0] if servers else None,
                stripes=tuple(map(Aggregator, switches[1:], servers[1:])),
                job_id=int(env[ENV_JOB]),
                device_id=int(env.get(ENV_DEVICE_ID, "0")),
                bind_ip=env.get(ENV_BIND) or None,
                bind_port=number(ENV_PORT) or 0,
                slots=int(env.get(ENV_SLOTS, str(DEFAULT_SLOTS_PER_JOB))),
                deadline=seconds(ENV_DEADLINE),
                chooser=chooser_from_env(env),
                switch_rank=number(ENV_SWITCH_RANK),
                num_workers=number(ENV_WORKERS),
                lanes=number(ENV_LANES),
                p4runtime_tls=TlsFiles.from_env(env),
                host=env.get(ENV_HOST) or None,
                collnet=_flag(env, ENV_COLLNET, default=True),
                collnet_bytes=number(ENV_COLLNET_BYTES) or DEFAULT_COLLNET_BYTES,
                transport=env.get(ENV_TRANSPORT, "").strip().lower() or "udp",
                msg_packets=number(ENV_MSG_PACKETS) or DEFAULT_MSG_PACKETS,
                rdma_device=env.get(ENV_RDMA_DEVICE) or None,
                check_icrc=_flag(env, ENV_RDMA_ICRC, default=True),
                cc_target=_cc_target(env),
            )
        except ValueError as exc:  # ProfileError is a ValueError
            raise InaSetupError(f"bad INALAB_* setting: {exc}") from None


def rdma_problems(options: InaOptions) -> list[str]:
    """What is wrong with ``options``' transport settings (empty: nothing).

    ``rdma`` needs rank 0 to install the job (the switch's queue pairs come back from the
    install), one aggregator, a power-of-two ``msg_packets`` up to 32 dividing the slots,
    and lanes, where given, that make a RoCE path MTU with ``msg_packets`` x lanes at
    most :data:`~hostlib.protocol.MAX_LANES`.
    """
    if options.transport not in TRANSPORTS:
        return [f"{ENV_TRANSPORT}={options.transport!r}: expected udp or rdma"]
    if options.transport == "udp":
        return [f"{ENV_RDMA_DEVICE} needs {ENV_TRANSPORT}=rdma"] if options.rdma_device else []
    problems, m = [], options.msg_packets
    if options.installed:
        problems.append(f"{ENV_TRANSPORT}=rdma needs {ENV_P4RUNTIME}: rank 0 installs the job"
                        " and its queue pairs")  # fmt: skip
    if options.stripes:
        problems.append(f"{ENV_TRANSPORT}=rdma runs on one aggregator")
    if not 1 <= m <= 32 or m & (m - 1):
        problems.append(f"{ENV_MSG_PACKETS}={m}: a power of two up to 32")
    elif options.slots % m:
        problems.append(f"{ENV_SLOTS}={options.slots}: a multiple of {ENV_MSG_PACKETS}={m}")
    if options.lanes is not None:
        problems += rdma_lanes_problems(options.lanes, m)
    return problems


def rdma_lanes_problems(lanes: int, msg_packets: int) -> list[str]:
    """Why ``lanes`` cannot carry INA over RoCEv2 in messages of ``msg_packets`` (empty:
    they can): a packet is a path MTU, a message at most MAX_LANES lanes."""
    if lanes * LANE_BYTES not in ROCE_PMTUS:
        pmtus = ", ".join(str(b // LANE_BYTES) for b in ROCE_PMTUS)
        return [f"lanes {lanes}: over RDMA a packet is a path MTU ({pmtus} lanes)"]
    if lanes * msg_packets > MAX_LANES:
        return [f"{ENV_MSG_PACKETS}={msg_packets} x lanes {lanes} above {MAX_LANES}"]
    return []


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A ``0``/``1`` variable (absent or empty: ``default``).

    Raises:
        ValueError: another value.
    """
    value = env.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: give 0 or 1")
    return default if value == "" else value == "1"


def _cc_target(env: Mapping[str, str]) -> float | None:
    """:data:`ENV_CC_TARGET` in seconds: milliseconds above 0, or ``off`` (``math.inf``);
    absent or empty: ``None``.

    Raises:
        ValueError: another value.
    """
    text = env.get(ENV_CC_TARGET, "").strip()
    if not text:
        return None
    if text.lower() == "off":
        return math.inf
    try:
        ms = float(text)
    except ValueError:
        ms = math.nan
    if not 0 < ms < math.inf:
        raise ValueError(f"{ENV_CC_TARGET}={text!r}: give milliseconds above 0, or off")
    return ms / 1000.0


def chooser_from_env(env: Mapping[str, str]) -> Chooser:
    """The chooser ``INALAB_CHOOSER`` names (see :data:`ENV_CHOOSER`).

    Raises:
        ValueError: an unknown chooser, a missing or bad ``WORLD_SIZE``, or a profile
            that cannot be read.
    """
    name = env.get(ENV_CHOOSER, "ina").strip().lower()
    if name == "ina":
        return AlwaysIna()
    if name not in ("dynamiccl", "agent"):
        raise ValueError(f"{ENV_CHOOSER}={name!r}: expected ina, dynamiccl or agent")
    from dynamiccl.model import DEFAULT_PROFILE, Profile
    from dynamiccl.policy import Policy

    if "WORLD_SIZE" not in env:
        raise ValueError(f"{ENV_CHOOSER}={name} needs WORLD_SIZE (the job's ranks)")
    workers = int(env["WORLD_SIZE"])
    path = env.get(ENV_PROFILE)
    profile = Profile.load(path) if path else DEFAULT_PROFILE
    if name == "agent":
        from dynamiccl.agent import Agent
        from dynamiccl.learning import DEFAULT_SYNC_EVERY

        state = env.get(ENV_AGENT_STATE) or None
        if env.get(ENV_AGENT_FROZEN, "").strip().lower() in ("1", "true", "yes"):
            if not state:
                raise ValueError(f"{ENV_AGENT_FROZEN} needs {ENV_AGENT_STATE} (a saved agent)")
            # Every rank decides by the same saved means: no learning, no agreement.
            return Agent.load(state, profile, workers=workers).frozen()
        # Learning inside the job: times agreed across ranks (dynamiccl.learning).
        return AgreedLearner(
            profile, workers, state=state, save_to=env.get(ENV_AGENT_SAVE) or None,
            sync_every=int(env.get(ENV_AGENT_SYNC_EVERY) or DEFAULT_SYNC_EVERY),
        )  # fmt: skip
    # No exploration: every rank must choose the same way for the same size.
    return Policy(profile, workers, epsilon=0.0)


def parse_addr(text: str) -> Addr:
    """``"host:port"`` as ``(host, port)``.

    Raises:
        ValueError: no port, or a port outside 1..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not host:port")
    number = int(port)
    if not 1 <= number <= 0xFFFF:
        raise ValueError(f"port {number} outside 1..65535")
    return host, number
