"""The ``"ina"`` torch backend's INA session over RDMA, ``INALAB_TRANSPORT=rdma`` (layer:
dynamiccl; served by :mod:`dynamiccl.torch_backend` through
:func:`~dynamiccl.torchbackend.session.connect_session`).

Owns how a rank joins a job over RoCEv2, SwitchML's ``RdmaSession`` exchange in two
rounds: rank 0 reads the switch's lanes (a packet is a path MTU, so every rank's RNIC
needs them before it exists) and shares them; each rank opens its RDMA device on its
address (an emulated RNIC at UDP 4791, or ``INALAB_RDMA_DEVICE``'s verbs device) and
sends rank 0 its address and reply endpoints, one per window position; rank 0 installs
the job and its queue pairs (``SwitchController.roce``) and shares each rank's switch
queue pairs. A failure on rank 0 reaches every rank as :class:`InaSetupError`.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from dynamiccl.torchbackend.exchange import Exchange
from dynamiccl.torchbackend.options import (
    ENV_RDMA_DEVICE,
    InaOptions,
    InaSetupError,
    rdma_lanes_problems,
)
from hostlib.ina import JobSpec
from hostlib.protocol import LANE_BYTES, ROCE_UDP_PORT
from hostlib.session import InaSession
from hostlib.transport.base import TransportError
from hostlib.transport.rdma import RdmaEndpoint, RdmaTransport

__all__ = ["connect_rdma_session", "open_device"]

log = logging.getLogger("dynamiccl.torch_backend")


def connect_rdma_session(options: InaOptions, exchange: Exchange, timeout: timedelta) -> InaSession:
    """Join the INA job of ``options`` over RDMA (every rank of the group calls this with
    the same options); return this rank's session (close it when done).

    Raises:
        InaSetupError: the switch's lanes cannot carry RoCEv2, its program has no
            RoCEv2 tables, it refused the job, or the device cannot be opened (without
            an RDMA device: the probe's one-line reason).
        TransportError: this rank's address's UDP 4791 is taken.
    """
    first = exchange.within("rdma-lanes")
    shared = first.share(_switch_lanes(options) if first.rank == 0 else None)
    lanes, m = int(_outcome(options, shared)["lanes"]), options.msg_packets
    second = exchange.within("rdma-qps")
    try:
        transport = _open_transport(options, lanes)
    except (InaSetupError, TransportError) as exc:
        # Every rank hears of it (rank 0 waits for this rank's endpoints), then this
        # rank raises its own.
        gathered = second.gather(json.dumps({"error": str(exc)}))
        second.share(None if gathered is None else _install(options, gathered))
        raise
    try:
        gathered = second.gather(json.dumps(_mine(transport)))
        info = _outcome(
            options, second.share(None if gathered is None else _install(options, gathered))
        )
        switch_ip = options.switch[0]
        transport.connect_switch(switch_ip, info["qpns"][second.rank])
        spec = JobSpec(options.job_id, second.rank, second.world_size,
                       (switch_ip, ROCE_UDP_PORT), m * lanes, options.slots // m)  # fmt: skip
        policy = options.retry_policy(timeout)
        return InaSession(spec, transport, policy)
    except BaseException:
        transport.close()
        raise


def _open_transport(options: InaOptions, lanes: int) -> RdmaTransport:
    """This rank's device (:func:`open_device`) and the rdma transport on it.

    Raises:
        InaSetupError | TransportError: :func:`open_device`'s.
    """
    m, pmtu = options.msg_packets, lanes * LANE_BYTES
    device = open_device(options, pmtu, m * pmtu)
    try:
        return RdmaTransport(device, options.slots // m, m, lanes)
    except BaseException:
        device.close()
        raise


def _mine(transport: RdmaTransport) -> dict[str, Any]:
    """What this rank tells rank 0: its address and its reply endpoints."""
    return {"ip": transport.local_addr[0], "endpoints": [list(e) for e in transport.endpoints()]}


def _outcome(options: InaOptions, shared: str) -> dict[str, Any]:
    """Rank 0's shared outcome.

    Raises:
        InaSetupError: it is an error.
    """
    info: dict[str, Any] = json.loads(shared)
    if "error" in info:
        raise InaSetupError(f"job {options.job_id} over RDMA: {info['error']}")
    return info


def open_device(options: InaOptions, pmtu: int, max_message: int) -> Any:
    """This rank's RDMA device on its address (:attr:`InaOptions.local_ip`): an emulated
    RNIC (:func:`hostlib.native.emulated_rnic`), or the verbs device
    ``options.rdma_device`` names.

    Raises:
        InaSetupError: verbs cannot run here (the probe's one-line reason), or the
            address's RoCEv2 GID is on another device than the one named.
        TransportError: the address's UDP 4791 is taken (emulated RNIC).
    """
    address = options.local_ip
    if options.rdma_device is None:
        from hostlib.native import emulated_rnic

        nic = emulated_rnic(address, pmtu)  # the host engine's: native where built
        nic.check_icrc = options.check_icrc
        return nic
    from hostlib.transport.verbs import VerbsDevice, verbs_unavailable

    named = f"{ENV_RDMA_DEVICE}={options.rdma_device}"
    why = verbs_unavailable()
    if why is not None:
        raise InaSetupError(f"{named}: {why}")
    try:
        device = VerbsDevice(address, pmtu=pmtu, max_message=max_message)
    except TransportError as exc:
        raise InaSetupError(f"{named}: {exc}") from None
    if device.device != options.rdma_device:
        device.close()
        raise InaSetupError(f"{named}: {address}'s RoCEv2 GID is on {device.device}")
    return device


def _switch_lanes(options: InaOptions) -> str:
    """Rank 0: the switch's lanes, or why they cannot carry RoCEv2, as JSON."""
    from controller.client import P4RuntimeError
    from controller.switch import ControllerError, SwitchController

    assert options.p4runtime is not None  # InaOptions: rdma needs it
    try:
        with SwitchController.connect(
            options.p4runtime, device_id=options.device_id, tls=options.p4runtime_tls
        ) as ctl:
            lanes, serves = ctl.lanes, ctl.roce is not None
    except (P4RuntimeError, ControllerError) as exc:
        return json.dumps({"error": f"{type(exc).__name__}: {exc}"})
    if not serves:
        return json.dumps({"error": f"{options.p4runtime}: the switch's program has no "
                                    "RoCEv2 tables"})  # fmt: skip
    if problems := rdma_lanes_problems(lanes, options.msg_packets):
        return json.dumps({"error": f"the switch's {'; '.join(problems)}"})
    return json.dumps({"lanes": lanes})


def _install(options: InaOptions, gathered: list[str]) -> str:
    """Rank 0: install the job for the ranks' gathered :func:`_mine` (in rank order) and
    its queue pairs; the outcome as JSON (each rank's switch queue pairs, or the error:
    a rank that could not open its device, ranks sharing an address, the switch's
    refusal). A failure removes what was installed."""
    from controller.client import P4RuntimeError
    from controller.switch import ControllerError, SwitchController, WorkerAddress

    assert options.p4runtime is not None
    ranks = [json.loads(g) for g in gathered]
    failed = [f"rank {r}: {d['error']}" for r, d in enumerate(ranks) if "error" in d]
    ips = [str(d.get("ip")) for d in ranks]
    shared = sorted({ip for ip in ips if ips.count(ip) > 1})
    if failed or shared:
        crowded = [f"ranks share {ip} (one rank an address: set INALAB_BIND)" for ip in shared]
        return json.dumps({"error": "; ".join(failed or crowded)})
    endpoints = [[RdmaEndpoint(*e) for e in d["endpoints"]] for d in ranks]
    info: dict[str, Any]
    try:
        with SwitchController.connect(
            options.p4runtime, device_id=options.device_id, tls=options.p4runtime_tls
        ) as ctl:
            ctl.add_job(options.job_id, [WorkerAddress(ip, ROCE_UDP_PORT) for ip in ips],
                        options.slots)  # fmt: skip
            try:
                assert ctl.roce is not None  # _switch_lanes checked it
                installed = ctl.roce.install(options.job_id, ips, endpoints, options.msg_packets)
            except BaseException:
                ctl.remove_job(options.job_id)
                raise
        info = {"qpns": [list(q) for q in installed.switch_qpns]}
    except (P4RuntimeError, ControllerError, ValueError) as exc:
        info = {"error": f"{type(exc).__name__}: {exc}"}
    log.info("ina job %d over RDMA on %s: %s", options.job_id, options.p4runtime, info)
    return json.dumps(info)
