"""The ``"ina"`` torch backend's machines, as NCCL's CollNet sees them (layer: dynamiccl;
served by :mod:`dynamiccl.torch_backend`).

Owns which ranks share a machine (:func:`host_key`, :class:`HostLayout`,
:func:`host_layout`) and a rank's part in CollNet (:func:`connect_collnet`,
:class:`CollNetMember`): each machine's head is the switch's worker, and the machine's
ranks add through shared memory (:mod:`hostlib.collnet`).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from dynamiccl.torchbackend.exchange import Exchange, StoreExchange
from dynamiccl.torchbackend.options import InaOptions, InaSetupError
from dynamiccl.torchbackend.session import connect_session
from hostlib.collnet import SHM_PREFIX, CollNetAllreduce, LocalGroup, ina_inter
from hostlib.session import InaSession, StripedInaSession

__all__ = ["CollNetMember", "HostLayout", "connect_collnet", "host_key", "host_layout"]


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
