"""The ``"ina"`` torch backend's job set-up (layer: dynamiccl; served by
:mod:`dynamiccl.torch_backend`).

Owns how a rank joins the job: its INA session (:func:`connect_session`: addresses
exchanged, rank 0 installing the job on every aggregator over P4Runtime, unless a
launcher installed it already), its host-to-host session for ring and tree calls
(:func:`connect_peers`), and the job's removal (:func:`remove_job`). The controller is
imported only where a switch is dialled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from dynamiccl.torchbackend.exchange import Exchange
from dynamiccl.torchbackend.options import InaOptions, InaSetupError
from dynamiccl.torchbackend.rdma import connect_rdma_session
from hostlib.ina import JobSpec
from hostlib.p2p import PeerSpec
from hostlib.peers import RingAllreduce
from hostlib.session import InaSession, StripedInaSession
from hostlib.transport.udp import UdpTransport

__all__ = ["connect_peers", "connect_session", "remove_job"]

log = logging.getLogger("dynamiccl.torch_backend")
"""The backend's one logger, by the name of its public module (users and tests capture
it so), whichever of the package's modules logs."""


def connect_session(
    options: InaOptions, exchange: Exchange, timeout: timedelta
) -> InaSession | StripedInaSession:
    """Join the INA job of ``options``: exchange addresses and rank 0 installs the job on
    the switch (unless it is installed already); return this rank's session (close it
    when done). With :attr:`InaOptions.stripes`, each rank binds one socket per
    aggregator, rank 0 installs the job on each, and the session is striped. Over RDMA
    (:attr:`InaOptions.transport`): :func:`~dynamiccl.torchbackend.rdma.connect_rdma_session`.

    Every rank of the group must call this; with the same options where rank 0 installs
    (a job installed already gives each rank its own address, switch and switch rank).

    Raises:
        InaSetupError: the job could not be installed (on every rank: rank 0 shares its
            error).
        ValueError: rank or world size out of range for a job.
        TransportError: ``options.local_ip``/``bind_port`` cannot be bound.
        OSError: no route to a switch.
    """
    if options.transport == "rdma":
        return connect_rdma_session(options, exchange, timeout)
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
        policy = options.retry_policy(timeout)
        sessions = [
            InaSession(
                JobSpec(options.job_id, rank, workers, switch, lanes, options.slots),
                transport,
                policy,
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
    :meth:`~hostlib.peers.PeerCollective.run`) on a UDP socket of its own at
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
        return RingAllreduce(spec, transport, options.retry_policy(timeout))
    except BaseException:
        transport.close()
        raise
