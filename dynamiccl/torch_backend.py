"""The PyTorch seam of dynamiccl: a ``torch.distributed`` backend named ``"ina"``.

``import dynamiccl.torch_backend`` registers the backend; then
``torch.distributed.init_process_group("ina", ...)`` builds an :class:`InaProcessGroup`.
Its SUM and AVG allreduce and reduce-scatter (``reduce_scatter_tensor``) and its
all-gather (``all_gather_into_tensor``) of int32/float32 tensors (CPU; CUDA staged through
host memory) run on hostlib: through the switch (:class:`~hostlib.session.InaSession`,
UDP) or host to host (:class:`~hostlib.ring.RingAllreduce`, ring or tree, over a UDP
socket of its own), as the :class:`Chooser` says; AVG is that SUM divided by the group's
size here, as Gloo divides its sum (so an integer AVG fails as Gloo's does, after the
sum). Every other call (MAX/MIN/PRODUCT, logged once per op; other dtypes; broadcast,
the list forms of allgather, barrier, ...) goes to a Gloo backend built from the same
store.

Gloo, and the GIL (issue #20). A Gloo worker thread destroys each finished work while
it holds Gloo's work-queue lock, and destroying a work whose tensors belong to Python
objects takes the GIL; every Gloo collective takes that lock to enqueue. So a thread
that holds the GIL while it enqueues can deadlock with a worker. torch's C++ trampoline
for Python subclasses of ``ProcessGroup`` does exactly that for a collective the
subclass does not define: it takes the GIL to look for a Python method and, finding
none, calls the C++ base method, which dispatches to the registered Gloo backend, with
the GIL still held (a loop of list all-gathers hung within 50 calls). Hence:

- this class defines every collective of ``ProcessGroup`` (those the trampoline
  forwards, which C++ callers such as functional collectives reach, and the rest, which
  ``torch.distributed``'s functions call by name; :data:`GLOO_COLLECTIVES` are Gloo's
  alone), so none is left to the C++ base class; a test holds torch's list to this;
- whatever goes to Gloo goes through :meth:`InaProcessGroup._to_gloo`, which calls the
  ``ProcessGroupGloo`` object's own methods: their bindings release the GIL for the whole
  C++ call (``py::call_guard<py::gil_scoped_release>`` on every collective of c10d's
  ``Backend`` class), so the GIL is never held while Gloo's lock is awaited; waiting on
  the returned work releases it too (``Work.wait``);
- what runs on hostlib runs to the end in the calling thread (its waits are socket
  waits, which release the GIL) and returns a work completed already, so nothing waits
  on another thread for it.

A Gloo thread may still wait for the GIL, but never while the thread holding the GIL
waits for that Gloo thread: no cycle remains. Gloo is also registered as the group's
CPU (and CUDA) backend, for torch code that asks the group for it (``_get_backend``);
calling c10d's dispatcher ops (``torch.ops.c10d.*``) on this group directly from Python
would reach it with the GIL held, and is not supported (``torch.distributed`` and its
functional collectives go through the methods above). ``dist.monitored_barrier`` refuses
every backend not named "gloo" before it reaches a group: call the group's own
``monitored_barrier`` (Gloo's).

Job setup (:func:`connect_session`), in one of two modes:

- rank 0 installs (``INALAB_P4RUNTIME`` set): each rank binds a UDP socket and writes its
  address to the c10d store; rank 0 reads them all, installs the job on the switch over
  P4Runtime (``controller.switch.SwitchController.add_job``) and writes the outcome and
  the switch's lanes per packet; the other ranks wait for that key; rank 0 removes the
  job at shutdown. With several aggregators (comma lists in ``INALAB_SWITCH`` and
  ``INALAB_P4RUNTIME``, or :attr:`InaOptions.stripes`) each rank binds a socket per
  aggregator, rank 0 installs the job on each, and calls are striped across them;
- installed already (``INALAB_P4RUNTIME`` absent or empty): a launcher that knows the
  network (``inalab emulate TOPOLOGY run``) installed the job for fixed addresses; each
  rank binds its own (``INALAB_BIND``, ``INALAB_PORT``), sends to its own switch
  (``INALAB_SWITCH``: under hierarchical aggregation its leaf) as the rank the job has
  there (``INALAB_SWITCH_RANK``), quantizes for ``INALAB_WORKERS`` contributions and
  packs ``INALAB_LANES`` lanes per packet; nothing is exchanged, installed or removed.

Configuration comes from ``pg_options=InaOptions(...)`` or, without it, from the
environment (:meth:`InaOptions.from_env`, the ``ENV_*`` names below).

What runs each call is the chooser's pick (:func:`resolve_action`): :class:`AlwaysIna`
by default, dynamiccl's :class:`~dynamiccl.policy.Policy` (``chooser=Policy(profile,
world_size)``, or ``INALAB_CHOOSER=dynamiccl`` with an optional ``INALAB_PROFILE`` from
``inalab calibrate``), or any object with ``choose(size_bytes)`` and optionally
``choose_call(collective, size_bytes)``. A name: ``"ina"`` through the switch; any other
name sends an allreduce to Gloo (so the policy's ``ring`` and ``tree`` mean Gloo's) and a
reduce-scatter or all-gather to hostlib's ring. A :class:`~dynamiccl.actions.Action`:
its algorithm with its lanes and window on hostlib. What cannot run here runs on
hostlib's ring with the action's lanes and window, with a warning logged once per kind:
CollNet without machines of several ranks, INA without switch slots, an algorithm that
does not run the collective (``all_gather`` is the ring's only). Nothing a chooser
returns fails the job.

Several ranks per machine (``torchrun --nproc-per-node P`` on several nodes), where rank
0 installs the job: the ranks say which machine they are on (:data:`ENV_HOST`, by
default :func:`host_key`) and, as NCCL's CollNet with SHARP, each machine's first rank
alone is a worker of the switch (:func:`connect_collnet`): an ``"ina"`` allreduce adds
the machine's ranks through shared memory (:mod:`hostlib.collnet`, the segment named in
the store), the heads add the machines' sums through the switch, and every rank copies
the result out; a reduce-scatter is that allreduce, each rank keeping its part. The
switch then carries one machine's traffic per head instead of P ranks'. Ring, tree and
Gloo calls still run between all ranks. ``INALAB_COLLNET=0`` keeps every rank a worker
of the switch.

Every rank must make the same sequence of calls with the same sizes and the same picks
(the session's slot sets and the ring's messages follow it), so a chooser must decide
from the collective and size alone, the same way on all ranks.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]  # not in the stubs
    _create_work_from_future,
)

from dynamiccl.actions import (
    FALLBACK_ACTION_ALGORITHM,
    Action,
    ActionError,
    algorithms_for,
)
from dynamiccl.learning import AgreedLearner
from hostlib.collnet import SHM_PREFIX, CollNetAllreduce, LocalGroup, ina_inter
from hostlib.communicator import Communicator
from hostlib.ina import Addr, InaError, JobSpec, RetryPolicy
from hostlib.p2p import PeerSpec
from hostlib.protocol import DEFAULT_SLOTS_PER_JOB
from hostlib.ring import RingAllreduce
from hostlib.session import InaSession, StripedInaSession, part_bounds
from hostlib.transport.udp import UdpTransport, interface_for, route_source

if TYPE_CHECKING:
    from controller.tls import TlsFiles

__all__ = [
    "BACKEND_NAME",
    "DEFAULT_DEADLINE",
    "ENV_AGENT_FROZEN",
    "ENV_AGENT_SAVE",
    "ENV_AGENT_STATE",
    "ENV_AGENT_SYNC_EVERY",
    "ENV_BIND",
    "ENV_CHOOSER",
    "ENV_COLLNET",
    "ENV_COLLNET_BYTES",
    "ENV_DEADLINE",
    "ENV_DEVICE_ID",
    "ENV_GLOO_IFNAME",
    "ENV_HOST",
    "ENV_JOB",
    "ENV_LANES",
    "ENV_P4RUNTIME",
    "ENV_PORT",
    "ENV_PROFILE",
    "ENV_SLOTS",
    "ENV_SWITCH",
    "ENV_SWITCH_RANK",
    "ENV_WORKERS",
    "GLOO_COLLECTIVES",
    "Aggregator",
    "AlwaysIna",
    "Chooser",
    "CollNetMember",
    "Exchange",
    "GroupExchange",
    "HostLayout",
    "InaOptions",
    "InaProcessGroup",
    "InaSetupError",
    "StaticChooser",
    "StoreExchange",
    "choose_for",
    "chooser_from_env",
    "connect_collnet",
    "connect_peers",
    "connect_session",
    "gloo_group",
    "gloo_interface",
    "host_key",
    "host_layout",
    "ina_action",
    "ina_allreduce_",
    "parse_addr",
    "register_backend",
    "remove_job",
    "resolve_action",
    "uses_ina",
]

log = logging.getLogger(__name__)

BACKEND_NAME = "ina"
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
ENV_GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
"""torch's own variable: the interfaces Gloo binds. Unset, the ``"ina"`` group sets it,
for its process, to the interface this host's routes use toward ``MASTER_ADDR``
(:func:`gloo_group`), not leaving Gloo the address the hostname resolves to, which
Debian and others map to loopback."""

INA_DTYPES = (torch.float32, torch.int32)
DEFAULT_COLLNET_BYTES = 16 * 2**20
DEFAULT_DEADLINE: float = RetryPolicy.deadline
"""The no-progress deadline of :data:`ENV_DEADLINE`, hostlib's own
(:attr:`hostlib.ina.RetryPolicy.deadline`): seconds, not ``init_process_group``'s 30
minutes, so a dead switch ends every rank's call within it."""


class InaSetupError(RuntimeError):
    """The INA job could not be set up (bad configuration, or the switch refused it)."""


class Chooser(Protocol):
    """Picks what runs one call from its size; the same on every rank.

    A chooser may also have ``choose_call(collective: str, size_bytes: int) -> str |
    Action``, then used instead of :meth:`choose` (``collective``: ``"allreduce"``,
    ``"reduce_scatter"`` or ``"all_gather"``; ``size_bytes``: the whole vector's, i.e. a
    reduce-scatter's input and an all-gather's output). See :func:`resolve_action` for
    what each answer runs.
    """

    def choose(self, size_bytes: int) -> str | Action:
        """``"ina"`` to aggregate in the switch; any other name (``"gloo"``, ``"ring"``)
        sends the call to the host-based fallback; an :class:`Action` runs as it says."""
        ...


class AlwaysIna:
    """The default chooser: every supported allreduce goes through the switch."""

    def choose(self, size_bytes: int) -> str:
        return "ina"


@dataclass(frozen=True)
class StaticChooser:
    """A static configuration: one action per collective for every call (as ``inalab
    replay``'s ``static`` strategies); a collective it does not name runs as
    :class:`AlwaysIna` would run it."""

    actions: Mapping[str, Action]

    def choose_call(self, collective: str, size_bytes: int) -> str | Action:
        return self.actions.get(collective, "ina")

    def choose(self, size_bytes: int) -> str | Action:
        return self.choose_call("allreduce", size_bytes)


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

    Raises:
        ValueError: a field out of range, or a job installed already without ``lanes``.
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

    def __post_init__(self) -> None:
        if not 0 <= self.job_id <= 0xFFFF:
            raise ValueError(f"job id {self.job_id} outside 0..65535")
        if self.slots < 1:
            raise ValueError(f"slots {self.slots} must be positive")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline {self.deadline} must be positive")
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
            )
        except ValueError as exc:  # ProfileError is a ValueError
            raise InaSetupError(f"bad INALAB_* setting: {exc}") from None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A ``0``/``1`` variable (absent or empty: ``default``).

    Raises:
        ValueError: another value.
    """
    value = env.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: give 0 or 1")
    return default if value == "" else value == "1"


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


# ----------------------------------------------------------------- job setup
class Exchange(Protocol):
    """How the ranks of a job share their addresses and rank 0's outcome of the setup."""

    rank: int
    world_size: int

    def gather(self, value: str) -> list[str] | None:
        """Every rank's ``value`` on rank 0 (index = rank); ``None`` on other ranks."""
        ...

    def share(self, value: str | None) -> str:
        """Rank 0's ``value``, on every rank (others pass ``None``)."""
        ...


class StoreExchange:
    """An :class:`Exchange` over a c10d store (the one a backend is built from)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, prefix: str) -> None:
        self.store, self.rank, self.world_size, self.prefix = store, rank, world_size, prefix

    def gather(self, value: str) -> list[str] | None:
        self.store.set(f"{self.prefix}/addr/{self.rank}", value)
        if self.rank != 0:
            return None
        keys = [f"{self.prefix}/addr/{r}" for r in range(self.world_size)]
        return [self.store.get(key).decode() for key in keys]

    def share(self, value: str | None) -> str:
        if self.rank == 0:
            if value is None:
                raise ValueError("rank 0 must share a value")
            self.store.set(f"{self.prefix}/ready", value)
            return value
        return self.store.get(f"{self.prefix}/ready").decode()


class GroupExchange:
    """An :class:`Exchange` over an initialized process group's object collectives."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def gather(self, value: str) -> list[str] | None:
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.group)
        return [str(v) for v in values] if self.rank == 0 else None

    def share(self, value: str | None) -> str:
        box: list[Any] = [value]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return str(box[0])


def gloo_interface(environ: Mapping[str, str] | None = None) -> str | None:
    """The interface Gloo should bind for ranks on other machines to reach it: the one
    holding the address this host's routes use toward ``MASTER_ADDR`` (torchrun's and
    ``env://``'s rendezvous); ``None`` where :data:`ENV_GLOO_IFNAME` is set already, no
    ``MASTER_ADDR`` is, or no interface has that address as its primary one.

    Raises:
        InaSetupError: ``MASTER_ADDR`` does not resolve, or no route leads to it.
    """
    env = os.environ if environ is None else environ
    master = env.get("MASTER_ADDR", "")
    if env.get(ENV_GLOO_IFNAME) or not master:
        return None
    try:
        ip = str(socket.getaddrinfo(master, None, socket.AF_INET)[0][4][0])
        source = route_source(ip)
    except OSError as exc:
        raise InaSetupError(
            f"MASTER_ADDR {master!r}: no route from this host ({exc}); set "
            f"{ENV_GLOO_IFNAME} to the interface Gloo should use"
        ) from None
    return interface_for(source)


def gloo_group(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The Gloo process group the ``"ina"`` group delegates to. Where
    :data:`ENV_GLOO_IFNAME` is unset, it is set first, for this process, to
    :func:`gloo_interface`: Gloo's own default binds the address the hostname resolves
    to, which Debian's ``/etc/hosts`` maps to 127.0.1.1, and peers on other machines are
    then told to connect to their own loopback. Setting the variable, not only this
    group's device, lets the training script's own Gloo groups (a ``"gloo"`` baseline,
    ``new_group(backend="gloo")``) reach the other machines too.

    Raises:
        InaSetupError: as :func:`gloo_interface`.
    """
    interface = gloo_interface()
    if interface is not None:
        os.environ[ENV_GLOO_IFNAME] = interface
        log.info("ina group: %s=%s (the route toward MASTER_ADDR)", ENV_GLOO_IFNAME, interface)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def connect_session(
    options: InaOptions, exchange: Exchange, timeout: timedelta
) -> InaSession | StripedInaSession:
    """Join the INA job of ``options``: exchange addresses and rank 0 installs the job on
    the switch (unless it is installed already); return this rank's session (close it
    when done). With :attr:`InaOptions.stripes`, each rank binds one socket per
    aggregator, rank 0 installs the job on each, and the session is striped.

    Every rank of the group must call this; with the same options where rank 0 installs
    (a job installed already gives each rank its own address, switch and switch rank).

    Raises:
        InaSetupError: the job could not be installed (on every rank: rank 0 shares its
            error).
        ValueError: rank or world size out of range for a job.
        TransportError: ``options.local_ip``/``bind_port`` cannot be bound.
        OSError: no route to a switch.
    """
    aggregators = options.aggregators
    transports: list[UdpTransport] = []
    try:
        for k, (switch, _) in enumerate(aggregators):
            port = options.bind_port if k == 0 else 0
            transports.append(UdpTransport(local=(options.local_ip_for(switch), port)))
        if options.installed and options.lanes is not None:  # lanes: __post_init__
            # The launcher installed the job for this address, as this switch rank.
            lanes = options.lanes
            rank = exchange.rank if options.switch_rank is None else options.switch_rank
            workers = options.num_workers or exchange.world_size
        else:
            mine = json.dumps([list(t.local_addr) for t in transports])
            addrs = exchange.gather(mine)
            outcome = None if addrs is None else _install(options, [json.loads(a) for a in addrs])
            info = json.loads(exchange.share(outcome))
            if "error" in info:
                raise InaSetupError(f"job {options.job_id}: {info['error']}")
            # Rank 0 installed the group's ranks in order, on every aggregator.
            lanes, rank, workers = int(info["lanes"]), exchange.rank, exchange.world_size
        deadline = options.no_progress_deadline(timeout)
        sessions = [
            InaSession(
                JobSpec(options.job_id, rank, workers, switch, lanes, options.slots),
                transport,
                RetryPolicy(deadline=deadline),
            )
            for (switch, _), transport in zip(aggregators, transports, strict=True)
        ]
        return sessions[0] if len(sessions) == 1 else StripedInaSession(sessions)
    except BaseException:
        for transport in transports:
            transport.close()
        raise


def _install(options: InaOptions, addrs: list[Any]) -> str:
    """Rank 0: install the job on every aggregator with every rank's address for it
    (``addrs[rank][aggregator]``); the outcome as JSON. A failure removes what was
    installed."""
    from controller.client import P4RuntimeError
    from controller.switch import ControllerError, SwitchController, WorkerAddress

    info: dict[str, Any]
    done: list[str] = []
    try:
        lanes: set[int] = set()
        for k, (_, server) in enumerate(options.aggregators):
            assert server is not None  # connect_session installs only then
            with SwitchController.connect(
                server, device_id=options.device_id, tls=options.p4runtime_tls
            ) as ctl:
                workers = [WorkerAddress(str(a[k][0]), int(a[k][1])) for a in addrs]
                ctl.add_job(options.job_id, workers, options.slots)
                done.append(server)
                lanes.add(ctl.lanes)
        if len(lanes) > 1:
            raise ControllerError(f"the aggregators pack different lanes per packet: {lanes}")
        info = {"lanes": lanes.pop()}
    except (P4RuntimeError, ControllerError, ValueError) as exc:
        # Shared with every rank, so all of them fail with the switch's reason.
        where = f" (aggregator {len(done) + 1})" if len(options.aggregators) > 1 else ""
        info = {"error": f"{type(exc).__name__}{where}: {exc}"}
        _remove(options, done)
    servers = ", ".join(str(server) for _, server in options.aggregators)
    log.info("ina job %d on %s: %s", options.job_id, servers, info)
    return json.dumps(info)


def remove_job(options: InaOptions) -> None:
    """Remove the job of ``options`` from its switch (every aggregator); a failure is
    logged, not raised (teardown must not hide the error that ended a run). A job
    installed already is its launcher's to remove: nothing is done."""
    _remove(options, [server for _, server in options.aggregators if server is not None])


def _remove(options: InaOptions, servers: Sequence[str]) -> None:
    from controller.client import P4RuntimeError
    from controller.switch import ControllerError, SwitchController

    for server in servers:
        try:
            with SwitchController.connect(
                server, device_id=options.device_id, tls=options.p4runtime_tls
            ) as ctl:
                ctl.remove_job(options.job_id)
        except (P4RuntimeError, ControllerError) as exc:
            log.warning("could not remove ina job %d from %s: %s", options.job_id, server, exc)


def connect_peers(
    options: InaOptions, exchange: Exchange, lanes: int, window: int, timeout: timedelta
) -> RingAllreduce:
    """This rank's host-to-host session (ring calls, and tree calls through
    :meth:`~hostlib.p2p.PeerCollective.run`) on a UDP socket of its own at
    ``options.local_ip``; every rank's address goes round the exchange. Close it when done.

    Every rank of the group must call this.

    Args:
        options: where to bind and the no-progress deadline.
        exchange: the group's ranks.
        lanes: the default packet width of a call.
        window: the default packets in flight per peer.
        timeout: the process group's (:meth:`InaOptions.no_progress_deadline`).

    Raises:
        TransportError: ``options.local_ip`` cannot be bound.
        ValueError: lanes or window out of range.
    """
    transport = UdpTransport(local=(options.local_ip, 0))
    try:
        gathered = exchange.gather(json.dumps(list(transport.local_addr)))
        every = None if gathered is None else json.dumps([json.loads(a) for a in gathered])
        addrs = tuple((str(host), int(port)) for host, port in json.loads(exchange.share(every)))
        spec = PeerSpec(exchange.rank, addrs, lanes, window)
        deadline = options.no_progress_deadline(timeout)
        return RingAllreduce(spec, transport, RetryPolicy(deadline=deadline))
    except BaseException:
        transport.close()
        raise


# ----------------------------------------------------------------- machines (CollNet)
def host_key() -> str:
    """This machine as ranks that can share memory tell it apart: hostname, boot id and
    network namespace (so namespaces that stand in for machines, as the cluster tests'
    do, count as machines of their own)."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            parts.append(f.read().strip())
        parts.append(os.readlink("/proc/self/ns/net"))
    except OSError:  # not Linux: the hostname alone
        pass
    return "/".join(parts)


@dataclass(frozen=True)
class HostLayout:
    """Which ranks share a machine.

    Attributes:
        hosts: each machine's ranks in rank order; machines in the order of their first
            rank, so rank 0 is machine 0's first.
    """

    hosts: tuple[tuple[int, ...], ...]

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> HostLayout:
        """The layout of ranks whose machines are ``keys[rank]``."""
        machines: dict[str, list[int]] = {}
        for rank, key in enumerate(keys):
            machines.setdefault(key, []).append(rank)
        return cls(tuple(tuple(ranks) for ranks in machines.values()))

    @property
    def collnet(self) -> bool:
        """Whether CollNet applies: several machines, one at least with several ranks. On
        one machine every rank stays a worker of the switch (NCCL, too, uses CollNet only
        across nodes)."""
        return len(self.hosts) > 1 and any(len(ranks) > 1 for ranks in self.hosts)

    def place(self, rank: int) -> tuple[int, int]:
        """``(machine, local rank)`` of ``rank``; local rank 0 is the machine's head.

        Raises:
            ValueError: a rank on no machine.
        """
        for host, ranks in enumerate(self.hosts):
            if rank in ranks:
                return host, ranks.index(rank)
        raise ValueError(f"rank {rank} is on no machine of {self.hosts}")

    def __str__(self) -> str:
        return f"{len(self.hosts)} machines of {'/'.join(str(len(h)) for h in self.hosts)} ranks"


def host_layout(options: InaOptions, exchange: Exchange) -> HostLayout:
    """Every rank's machine (:attr:`InaOptions.host`, else :func:`host_key`), gathered
    over ``exchange``; every rank of the group must call this."""
    keys = exchange.gather(options.host or host_key())
    every = json.loads(exchange.share(None if keys is None else json.dumps(keys)))
    return HostLayout.from_keys([str(k) for k in every])


@dataclass
class CollNetMember:
    """This rank's part in CollNet: its machine's shared-memory group and allreduce, and
    (the machine's head alone) the INA session whose job has one worker per machine.

    Attributes:
        layout: the group's machines.
        host: this rank's machine.
        local_rank: its rank there (0: the head).
        group: the machine's shared memory and barrier.
        allreduce: this rank's side of the machine's calls.
        session: the head's INA session (``None`` on the other ranks).
        lanes: the switch's lanes per packet.
        slots: the job's slots per set.
    """

    layout: HostLayout
    host: int
    local_rank: int
    group: LocalGroup
    allreduce: CollNetAllreduce
    session: InaSession | StripedInaSession | None
    lanes: int
    slots: int

    def close(self) -> None:
        """Unmap the machine's segment (the head unlinks it) and close the session."""
        self.allreduce.close()
        try:
            self.group.leave()
        finally:
            if self.session is not None:
                self.session.close()

    def abort(self) -> None:
        """Break the machine's barrier (a sibling waiting in a call fails at once), then
        :meth:`close`."""
        self.group.barrier.abort()
        self.close()


def connect_collnet(
    options: InaOptions, store: dist.Store, rank: int, layout: HostLayout, timeout: timedelta
) -> CollNetMember:
    """Join the INA job as CollNet does: each machine's head rank is the job's worker
    (its rank at the switch: its machine's index; rank 0 installs the job for the heads),
    and the ranks of each machine meet in a shared-memory segment the head creates and
    names in ``store``. Every rank of the group must call this.

    Raises:
        InaSetupError: the job could not be installed, or the head could not make the
            segment (on every rank of that machine).
        The errors of :func:`connect_session`, and :class:`~hostlib.collnet.CollNetError`:
            the segment did not appear.
    """
    host, local = layout.place(rank)
    prefix = f"ina/job{options.job_id}"
    # The heads are the job's workers, numbered by machine; the other ranks (never rank
    # 0) only read rank 0's outcome.
    heads = StoreExchange(store, host if local == 0 else rank, len(layout.hosts), prefix)
    session: InaSession | StripedInaSession | None = None
    if local == 0:
        session = connect_session(options, heads, timeout)
        lanes, slots = session.spec.lanes, session.spec.slots
    else:
        info = json.loads(heads.share(None))
        if "error" in info:
            raise InaSetupError(f"job {options.job_id}: {info['error']}")
        lanes, slots = int(info["lanes"]), options.slots
    size, key = len(layout.hosts[host]), f"{prefix}/collnet/{host}"
    wait = options.no_progress_deadline(timeout) + 10.0  # beyond the head's INA
    try:
        if local == 0:
            name = f"{SHM_PREFIX}job{options.job_id}-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                group = LocalGroup.join(name, size, options.collnet_bytes, 0, timeout=wait)
            except OSError as exc:
                store.set(key, json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
                raise InaSetupError(f"machine {host}: no shared memory for CollNet: {exc}") from exc
            store.set(key, json.dumps({"name": name, "tracker": group.tracker}))
        else:
            made = json.loads(store.get(key))
            if "error" in made:
                why = made["error"]
                raise InaSetupError(f"machine {host}: no shared memory for CollNet: {why}")
            tracker = None if made["tracker"] is None else (made["tracker"][0], made["tracker"][1])
            group = LocalGroup.join(made["name"], size, options.collnet_bytes, local, wait, tracker)
        try:
            inter = None if session is None else ina_inter(session)
            allreduce = CollNetAllreduce(group, local, inter)
        except BaseException:
            group.leave()
            raise
    except BaseException:
        if session is not None:
            session.close()
        raise
    return CollNetMember(layout, host, local, group, allreduce, session, lanes, slots)


# ----------------------------------------------------------------- choosing
def choose_for(chooser: Chooser, collective: str, size_bytes: int) -> str | Action:
    """The chooser's answer for one call: ``choose_call(collective, size_bytes)`` when it
    has that method, else ``choose(size_bytes)``."""
    choose_call = getattr(chooser, "choose_call", None)
    if choose_call is not None:
        return cast(str | Action, choose_call(collective, size_bytes))
    return chooser.choose(size_bytes)


Warn = Callable[[str, str], None]
"""``warn(key, message)``: an action could not run as chosen (``key`` names the kind)."""


def resolve_action(
    choice: str | Action,
    collective: str,
    *,
    switch_lanes: int,
    slots: int,
    lanes: int,
    window: int,
    warn: Warn | None = None,
    collnet: bool = False,
) -> Action | None:
    """What runs a call of ``collective`` that the chooser answered ``choice`` for.

    Args:
        choice: a name (``"ina"``: through the switch; another name: Gloo for an
            allreduce, hostlib's ring for the others) or an :class:`Action`.
        collective: ``"allreduce"``, ``"reduce_scatter"`` or ``"all_gather"``.
        switch_lanes: the switch's lanes per packet (INA's only width).
        slots: the job's slots on the switch (an INA window is clamped to them); 0: no
            switch to use.
        lanes: the ring's packet width for a name.
        window: the ring's window for a name.
        warn: told when an action cannot run as chosen: CollNet without a host-local
            group, INA without slots, an algorithm that does not run ``collective``;
            the ring runs it then, with the action's lanes and window.
        collnet: whether the group has CollNet's host-local groups (then a CollNet
            action runs with the switch's lanes and a window within its slots).

    Returns:
        The action to run on hostlib, or ``None``: Gloo.

    Raises:
        ActionError: an unknown collective, or a choice that is neither a name nor an
            :class:`Action`.
    """
    supported = algorithms_for(collective)
    if isinstance(choice, str):
        return _resolve_name(choice, collective, switch_lanes, slots, lanes, window, warn)
    if not isinstance(choice, Action):
        raise ActionError(f"a chooser returned {choice!r}, not an algorithm name or Action")
    fallback = Action(FALLBACK_ACTION_ALGORITHM, choice.lanes, choice.window)
    why = ""
    if choice.algorithm not in supported:
        why = f"{choice.algorithm} does not run {collective}"
    elif choice.algorithm == "collnet" and not collnet:
        why = "no machine has several ranks (or INALAB_COLLNET=0): no host-local group"
    elif choice.algorithm in ("ina", "collnet") and slots < 1:
        why = f"no switch slots for {choice.algorithm}"
    if why:
        if warn is not None:
            warn(f"{choice.algorithm}/{collective}", f"{why}: {fallback} runs {choice} instead")
        return fallback
    if choice.algorithm in ("ina", "collnet"):
        return Action(choice.algorithm, switch_lanes, min(choice.window, slots))
    return choice


def _resolve_name(
    name: str,
    collective: str,
    switch_lanes: int,
    slots: int,
    lanes: int,
    window: int,
    warn: Warn | None,
) -> Action | None:
    """:func:`resolve_action` of a chooser's name."""
    ring = Action(FALLBACK_ACTION_ALGORITHM, lanes, window)
    if name != "ina":
        return None if collective == "allreduce" else ring
    if "ina" not in algorithms_for(collective):  # a chooser that does not know it
        return ring
    if slots < 1:
        if warn is not None:
            warn(f"ina/{collective}", f"no switch slots for ina: {ring} runs it instead")
        return ring
    return Action("ina", switch_lanes, slots)


def _carried(tensor: torch.Tensor) -> bool:
    """Whether hostlib can take ``tensor``: int32/float32, on the CPU or staged from CUDA."""
    return tensor.dtype in INA_DTYPES and tensor.device.type in ("cpu", "cuda")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def ina_action(tensor: torch.Tensor, chooser: Chooser, spec: JobSpec) -> Action | None:
    """The INA action (the switch's lanes, a window within the job's slots) of a SUM
    allreduce of ``tensor`` if it goes through the switch, else ``None``."""
    if not _carried(tensor) or tensor.numel() == 0:
        return None
    choice = choose_for(chooser, "allreduce", _nbytes(tensor))
    action = resolve_action(
        choice,
        "allreduce",
        switch_lanes=spec.lanes,
        slots=spec.slots,
        lanes=spec.lanes,
        window=spec.slots,
    )
    return action if action is not None and action.algorithm == "ina" else None


def uses_ina(tensor: torch.Tensor, chooser: Chooser) -> bool:
    """Whether a SUM allreduce of ``tensor`` goes through the switch: a non-empty int32
    or float32 tensor on the CPU or a CUDA device, and the chooser says ``"ina"`` (or an
    INA :class:`Action`)."""
    if not _carried(tensor) or tensor.numel() == 0:
        return False
    choice = choose_for(chooser, "allreduce", _nbytes(tensor))
    return choice == "ina" or (isinstance(choice, Action) and choice.algorithm == "ina")


# ----------------------------------------------------------------- the collectives
def ina_allreduce_(
    session: InaSession | StripedInaSession, tensor: torch.Tensor, *, window: int | None = None
) -> torch.Tensor:
    """Sum ``tensor`` in place over the session's job; return it.

    A CPU contiguous tensor is reduced in its own memory; a non-contiguous or CUDA
    tensor is staged through a contiguous host copy and copied back.

    Args:
        session: this rank's INA session.
        tensor: an int32 or float32 tensor.
        window: the call's INA window (``None``: the job's slots).

    Raises:
        TypeError: a dtype other than int32/float32.
        ValueError: NaN or infinity in float32 data, or a window outside the job's slots.
        InaError: the switch or a peer stopped answering.
    """
    return _in_place(tensor, lambda host: session.allreduce(host, inplace=True, window=window))


def _in_place(tensor: torch.Tensor, reduce: Callable[[torch.Tensor], Any]) -> torch.Tensor:
    """``reduce(host)`` on ``tensor``'s own memory if it is CPU and contiguous, else on a
    contiguous host copy that is copied back."""
    data = tensor.detach()
    if data.device.type == "cpu" and data.is_contiguous():
        reduce(data)
        return tensor
    host = data.to("cpu", memory_format=torch.contiguous_format, copy=True)
    reduce(host)
    data.copy_(host)
    return tensor


def _host_flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elements as a contiguous 1-D CPU tensor (a view when it is one)."""
    return tensor.detach().to("cpu").contiguous().reshape(-1)


def _completed(result: Any) -> dist.Work:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _all_done(works: Sequence[dist.Work]) -> dist.Work:
    """A completed work, once each of ``works`` is waited for here (``Work.wait``
    releases the GIL while it waits)."""
    for work in works:
        work.wait()
    return _completed(None)


def _kind(op: Any) -> Any:
    """The ``RedOpType`` of a ``ReduceOp`` (or of a ``RedOpType``), which compares with
    ``dist.ReduceOp.SUM`` and the like whichever side it is on."""
    return getattr(op, "op", op)


def _given(opts: Any) -> tuple[Any, ...]:
    """``(opts,)``, or nothing for ``None`` (then Gloo's binding takes its default)."""
    return () if opts is None else (opts,)


GLOO_COLLECTIVES = (
    "allgather", "allgather_coalesced", "alltoall", "alltoall_base", "barrier", "broadcast",
    "gather", "monitored_barrier", "recv", "recv_anysource", "reduce", "reduce_scatter",
    "scatter", "send",
)  # fmt: skip
"""The collectives of ``ProcessGroup`` that the ina group leaves to Gloo whatever their
arguments (by ``ProcessGroupGloo``'s names: ``all_to_all_single`` is its
``alltoall_base``); the others run on hostlib when they can."""


def _gloo_collective(name: str) -> Callable[..., Any]:
    """A method of :class:`InaProcessGroup` that runs Gloo's ``name`` with the
    arguments it is given (see :meth:`InaProcessGroup._to_gloo`)."""

    def collective(self: InaProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return self._to_gloo(name, *args, **kwargs)

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"Gloo's ``{name}``, with its arguments; its work (if any)."
    return collective


class InaProcessGroup(dist.ProcessGroup):
    """A process group whose SUM and AVG allreduce and reduce-scatter and whose all-gather
    of int32/float32 tensors run on hostlib (the switch, or host to host); everything
    else is Gloo's (created from ``store``), called so that the GIL is not held while
    Gloo's threads are waited for (see the module docstring).

    Built by ``init_process_group("ina")`` (see :func:`register_backend`); construct it
    directly only for a group of your own (every rank at once: it sets up the job).

    Attributes:
        session: this rank's INA session; ``None`` on a CollNet rank that is not its
            machine's head (the head's is in :attr:`collnet` too).
        collnet: this rank's CollNet membership where machines have several ranks
            (:class:`CollNetMember`), else ``None``: then every ``"ina"`` allreduce and
            reduce-scatter is CollNet's (the machine's ranks add in shared memory, the
            heads through the switch).
        peers: this rank's host-to-host session (ring and tree), by default with the
            switch's packet width and the job's slots as its window.

    Raises:
        InaSetupError: the job could not be set up.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        timeout: timedelta,
        options: InaOptions,
    ) -> None:
        # torch 2.13 rejects the (store, rank, size) constructor for Python subclasses.
        super().__init__(rank, world_size)  # type: ignore[call-arg]
        self.options = options
        self._store = store
        # Any: the stubs omit the collectives of ProcessGroupGloo (a c10d Backend).
        self._gloo: Any = gloo_group(dist.PrefixStore("gloo/", store), rank, world_size, timeout)
        # For torch code that asks the group for its backend; the collectives themselves
        # are all methods of this class (see the module docstring).
        gloo_type = dist.ProcessGroup.BackendType.GLOO
        self._register_backend(torch.device("cpu"), gloo_type, self._gloo)
        if torch.cuda.is_available():
            self._register_backend(torch.device("cuda"), gloo_type, self._gloo)
        prefix = f"ina/job{options.job_id}"
        self.collnet: CollNetMember | None = None
        self.session: InaSession | StripedInaSession | None
        layout = None
        if options.collnet and not options.installed:
            layout = host_layout(options, StoreExchange(store, rank, world_size, f"{prefix}/hosts"))
        if layout is not None and layout.collnet:
            self.collnet = connect_collnet(options, store, rank, layout, timeout)
            self.session = self.collnet.session
            self._lanes, self._slots = self.collnet.lanes, self.collnet.slots
            if rank == 0:
                log.info("ina job %d: CollNet on %s", options.job_id, layout)
        else:
            exchange = StoreExchange(store, rank, world_size, prefix)
            self.session = connect_session(options, exchange, timeout)
            self._lanes, self._slots = self.session.spec.lanes, self.session.spec.slots
        try:
            exchange = StoreExchange(store, rank, world_size, f"{prefix}/peers")
            self.peers = connect_peers(options, exchange, self._lanes, self._slots, timeout)
        except BaseException:
            self._close_ina()
            raise
        # Every action of every collective that runs on hostlib, mapped onto the wire in
        # hostlib's one place (the tree on the ring's socket). Under CollNet the switch
        # is reached only through the machine's group.
        ina = None if self.collnet is not None else self.session
        group = None if self.collnet is None else self.collnet.allreduce
        self.comm = Communicator(rank, world_size, ina=ina, ring=self.peers, collnet=group)
        self._chooser: Chooser = options.chooser
        self._bound: list[Chooser] = []
        self._bind(options.chooser)
        self.last_action: Action | None = None
        """The action the last call carried on hostlib ran (``None`` before any)."""
        self._closed = False
        self._warned: set[str] = set()
        self._coalesced: list[dist.Work] | None = None  # between start/end_coalescing

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # ------------------------------------------------------------------ choosing
    def use_chooser(self, chooser: Chooser) -> None:
        """Let ``chooser`` decide from the next call on (e.g. strategies taking turns in
        one job, as ``examples/train_mixed.py`` runs them).

        Every rank must call it between the same two calls, with choosers that decide
        alike: a choice must be the same on every rank. A learning chooser is bound to
        the job's switch the first time it is used; the times it has not agreed on yet
        wait for its next turn (its agreements still come at the same call on every
        rank, since every rank counts the same calls)."""
        self._bind(chooser)
        self._chooser = chooser

    def _bind(self, chooser: Chooser) -> None:
        """A learning chooser's actions need the switch's lanes and the job's slots: give
        them to it, once."""
        bind = getattr(chooser, "bind", None)
        if callable(bind) and not any(c is chooser for c in self._bound):
            bind(self._lanes, self._slots)
            self._bound.append(chooser)

    def _plan(self, collective: str, size_bytes: int) -> Action | None:
        """What runs this call (``None``: Gloo), from the chooser."""
        self.last_action = None  # until the call runs on hostlib
        choice = choose_for(self._chooser, collective, size_bytes)
        peers = self.peers.spec
        return resolve_action(
            choice,
            collective,
            switch_lanes=self._lanes,
            slots=self._slots,
            lanes=peers.lanes,
            window=peers.window,
            warn=self._warn_once,
            collnet=self.collnet is not None,
        )

    def _on_wire(self, action: Action) -> Action:
        """What runs ``action``: under CollNet, an INA action is CollNet's (the switch
        knows the machines' heads alone)."""
        if self.collnet is not None and action.algorithm == "ina":
            return Action("collnet", action.lanes, action.window)
        return action

    def _observed(self, collective: str, size_bytes: int, action: Action, start: float) -> None:
        """Record the call's action as :attr:`last_action`; tell a learning chooser
        (``dynamiccl.learning.AgreedLearner``) the call's time if it ran as chosen; when
        an agreement is due (at the same call on every rank), agree on the times with the
        other ranks."""
        self.last_action = self._on_wire(action)
        learner = self._chooser
        if not isinstance(learner, AgreedLearner) or learner.agent is None:
            return
        if action not in learner.agent.actions.get(collective, ()):
            return  # a fallback ran (the same on every rank): nothing to learn of the choice
        learner.observe(collective, size_bytes, action, time.perf_counter() - start)
        if learner.due:
            learner.agree(self._agree_max)

    def _agree_max(self, values: Sequence[float]) -> list[float]:
        """The elementwise maximum of ``values`` over the group's ranks (a Gloo allreduce,
        its binding releasing the GIL while Gloo's threads run)."""
        agreed = torch.tensor(list(values), dtype=torch.float64)
        opts: Any = dist.AllreduceOptions()  # Any: the stubs type reduceOp narrowly
        opts.reduceOp = dist.ReduceOp.MAX
        self._gloo.allreduce([agreed], opts).wait()
        return [float(v) for v in agreed.tolist()]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("ina backend: %s (logged once)", message)

    def _note_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.info("ina backend: %s (logged once)", message)

    def _check_open(self) -> None:
        if self._closed:
            raise InaError("the ina process group is shut down")

    # ------------------------------------------------------------------ collectives
    def allreduce(  # type: ignore[override]  # what the C++ trampoline passes
        self, tensors: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        """SUM or AVG of non-empty int32/float32 tensors as the chooser says; anything
        else, and a call the chooser sends to Gloo, through Gloo."""
        if opts is None:
            opts = dist.AllreduceOptions()
        work = self._allreduce_on_hostlib(tensors, opts.reduceOp)
        return self._to_gloo("allreduce", tensors, opts) if work is None else work

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """:meth:`allreduce` of several tensors at once (``all_reduce_coalesced``, and
        ``_coalescing_manager`` of allreduces)."""
        if opts is None:
            opts = dist.AllreduceCoalescedOptions()
        work = self._allreduce_on_hostlib(tensors, opts.reduceOp)
        return self._to_gloo("allreduce_coalesced", tensors, opts) if work is None else work

    def _allreduce_on_hostlib(self, tensors: list[torch.Tensor], op: Any) -> dist.Work | None:
        """Run a SUM or AVG allreduce of ``tensors`` on hostlib as the chooser says and
        return its completed work; ``None``: it is Gloo's to run."""
        if not all(_carried(t) and t.numel() for t in tensors) or not self._adds(op):
            return None
        actions = [self._plan("allreduce", _nbytes(t)) for t in tensors]
        if any(a is None for a in actions):
            return None
        self._check_open()
        for tensor, action in zip(tensors, actions, strict=True):
            start = time.perf_counter()
            self._allreduce_(tensor, cast(Action, action))
            self._observed("allreduce", _nbytes(tensor), cast(Action, action), start)
        if _kind(op) == dist.ReduceOp.AVG:
            self._average(tensors)
        return _completed(tensors)

    def _allreduce_(self, tensor: torch.Tensor, action: Action) -> None:
        wire = self._on_wire(action)
        _in_place(tensor, lambda host: self.comm.allreduce(host, wire, inplace=True))

    def _adds(self, op: Any) -> bool:
        """Whether reduce op ``op`` runs on hostlib (SUM, AVG); the others run on Gloo, as
        logged once per op."""
        kind = _kind(op)
        if kind in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            return True
        name = getattr(kind, "name", str(kind))
        self._note_once(f"op/{name}", f"{name} runs on Gloo: the switch and hostlib only add")
        return False

    def _average(self, tensors: Sequence[torch.Tensor]) -> None:
        """Divide sums by the group's size in place, as Gloo's AVG does after its sum; on
        an integer tensor that raises torch's RuntimeError (the sum stays), as Gloo's
        does (there when the work is waited for)."""
        for tensor in tensors:
            tensor.detach().div_(self.size())

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> dist.Work:
        """``reduce_scatter_tensor``: rank ``r`` of ``n`` gets elements ``r * k`` to
        ``(r + 1) * k`` of the SUM (or AVG) of every rank's ``n * k``-element input,
        through the switch (an INA allreduce of which it keeps its part) or hostlib's
        ring. Other ops, dtypes or sizes go to Gloo."""
        if opts is None:
            opts = dist.ReduceScatterOptions()
        k = output.numel()
        if not (
            _carried(input)
            and output.dtype == input.dtype
            and k > 0
            and input.numel() == self.size() * k
            and self._adds(opts.reduceOp)
        ):
            return self._to_gloo("_reduce_scatter_base", output, input, opts)
        action = self._plan("reduce_scatter", _nbytes(input))
        self._check_open()
        if action is None or action.algorithm != "ina":
            action = self._ring(action)
        start = time.perf_counter()
        wire = self._on_wire(action)
        if wire.algorithm == "collnet":
            # CollNet's allreduce, of which this rank keeps its part.
            total = self.comm.allreduce(_host_flat(input), wire)
            lo, hi = part_bounds(total.numel(), self.size(), self.rank())
            part = total[lo:hi]
        else:
            part = self.comm.reduce_scatter(_host_flat(input), action)
        output.detach().copy_(part.reshape(output.shape))
        self._observed("reduce_scatter", _nbytes(input), action, start)
        if _kind(opts.reduceOp) == dist.ReduceOp.AVG:
            self._average([output])
        return _completed([output])

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> dist.Work:
        """``all_gather_into_tensor``: every rank's ``k``-element input, in rank order, in
        every rank's ``n * k``-element output, over hostlib's ring. Other dtypes or sizes
        go to Gloo."""
        k = input.numel()
        if not (
            _carried(input) and output.dtype == input.dtype and k > 0
            and output.numel() == self.size() * k
        ):  # fmt: skip
            return self._to_gloo("_allgather_base", output, input, *_given(opts))
        action = self._ring(self._plan("all_gather", _nbytes(output)))
        self._check_open()
        start = time.perf_counter()
        full = self.comm.all_gather(_host_flat(input), action)
        output.detach().copy_(full.reshape(output.shape))
        self._observed("all_gather", _nbytes(output), action, start)
        return _completed([output])

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        """:meth:`all_gather_single` of each pair (``_coalescing_manager`` of
        ``all_gather_into_tensor``); done when it returns."""
        pairs = zip(outputs, inputs, strict=True)
        return _all_done([self.all_gather_single(o, i, opts) for o, i in pairs])

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        """:meth:`reduce_scatter_single` of each pair (``_coalescing_manager`` of
        ``reduce_scatter_tensor``); done when it returns."""
        pairs = zip(outputs, inputs, strict=True)
        return _all_done([self.reduce_scatter_single(o, i, opts) for o, i in pairs])

    # The names torch before 2.13 calls, deprecated there: the same collectives.
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # arg names
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def _ring(self, action: Action | None) -> Action:
        """The ring with ``action``'s packet width and window (``None``: the defaults)."""
        if action is None:
            return Action("ring", self.peers.spec.lanes, self.peers.spec.window)
        return Action("ring", action.lanes, action.window)

    # ------------------------------------------------------------------ Gloo's alone
    # Each a method of this class, so that no call reaches Gloo through the C++ base
    # class with the GIL held (see the module docstring); the arguments are Gloo's.
    allgather = _gloo_collective("allgather")
    allgather_coalesced = _gloo_collective("allgather_coalesced")
    alltoall = _gloo_collective("alltoall")
    all_to_all_single = _gloo_collective("alltoall_base")
    alltoall_base = all_to_all_single
    barrier = _gloo_collective("barrier")
    broadcast = _gloo_collective("broadcast")
    gather = _gloo_collective("gather")
    monitored_barrier = _gloo_collective("monitored_barrier")
    recv = _gloo_collective("recv")
    recv_anysource = _gloo_collective("recv_anysource")
    reduce = _gloo_collective("reduce")
    reduce_scatter = _gloo_collective("reduce_scatter")
    scatter = _gloo_collective("scatter")
    send = _gloo_collective("send")

    def _to_gloo(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Gloo's collective ``name`` (a method of ``ProcessGroupGloo``): its binding
        releases the GIL for the whole call, Gloo's enqueue included."""
        work = getattr(self._gloo, name)(*args, **kwargs)
        if self._coalesced is not None and work is not None:
            self._coalesced.append(work)
        return work

    def start_coalescing(self, device: Any = None) -> None:
        """``_coalescing_manager(group, device)`` begins: every call still runs when it
        is issued; :meth:`end_coalescing` waits for the works of those Gloo runs."""
        self._coalesced = []

    def end_coalescing(self, device: Any = None) -> dist.Work:
        """The coalesced calls' work, done when it returns (``Work.wait`` releases the
        GIL while it waits)."""
        works, self._coalesced = self._coalesced or [], None
        return _all_done(works)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # ------------------------------------------------------------------ teardown
    def shutdown(self) -> None:
        """Close the sessions; rank 0 removes the job once every rank has shut down, or
        after waiting a few seconds for them (a rank may be dead)."""
        if self._closed:
            return
        self._closed = True
        learner = self._chooser
        if isinstance(learner, AgreedLearner) and self.rank() == 0:
            try:  # every rank's agent holds the same state: rank 0 writes it
                learner.save()
            except OSError as exc:
                log.warning("ina backend: agent state not saved: %s", exc)
        self._close_ina()
        # A peer whose last ack from us was lost needs us a little longer, if any call ran.
        self.peers.close(linger=0.0 if self.peers.endpoint.call == 0 else None)
        if not self.options.remove_on_shutdown or self.options.installed:
            return
        key = f"ina/job{self.options.job_id}/closed"
        try:
            self._store.add(key, 1)
            if self.rank() == 0:
                self._wait_for_count(key, self.size())
        except (RuntimeError, InaSetupError) as exc:  # c10d store errors are RuntimeErrors
            log.warning("ina job %d: not every rank shut down: %s", self.options.job_id, exc)
        # Rank 0 removes the job even then: a rank that has not shut down by now is dead
        # or stuck (issue #20: a rank killed), and nobody else would remove it; a late
        # rank's packets are dropped by the switch as an unknown job's.
        if self.rank() == 0:
            remove_job(self.options)

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            if self.collnet is not None:
                self.collnet.abort()
            else:
                self._close_ina()
            self.peers.close(linger=0.0)

    def _close_ina(self) -> None:
        """Close the INA session, or this rank's CollNet membership (its session too)."""
        if self.collnet is not None:
            self.collnet.close()
        elif self.session is not None:
            self.session.close()

    def _wait_for_count(self, key: str, count: int, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while self._store.add(key, 0) < count:
            if time.monotonic() > deadline:
                raise InaSetupError(f"only some ranks shut down within {seconds:.0f}s")
            time.sleep(0.01)


def _create(backend_opts: Any, pg_options: Any) -> InaProcessGroup:
    """``init_process_group``'s factory (extended API): ``pg_options`` or the environment."""
    options = pg_options if pg_options is not None else InaOptions.from_env()
    if not isinstance(options, InaOptions):
        raise TypeError(f"pg_options of the ina backend must be InaOptions, not {options!r}")
    return InaProcessGroup(
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        options,
    )


def register_backend(devices: Sequence[str] = ("cpu", "cuda")) -> None:
    """Register ``"ina"`` with ``torch.distributed`` (done on import; idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=list(devices))


register_backend()
