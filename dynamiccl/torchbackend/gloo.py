"""The ``"ina"`` torch backend's Gloo (layer: dynamiccl; served by
:mod:`dynamiccl.torch_backend`).

Owns the Gloo process group the ``"ina"`` group delegates to (:func:`gloo_group`), the
interface it binds (:func:`gloo_interface`, as ``GLOO_SOCKET_IFNAME``), which collectives
are Gloo's alone (:data:`GLOO_COLLECTIVES`) and how their options are passed on
(``_given``). How the group calls Gloo without holding the GIL is
:mod:`dynamiccl.torchbackend.group`'s.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from dynamiccl.torchbackend.options import ENV_GLOO_IFNAME, InaSetupError
from hostlib.transport.udp import interface_for, route_source

__all__ = ["GLOO_COLLECTIVES", "gloo_group", "gloo_interface"]

log = logging.getLogger("dynamiccl.torch_backend")
"""The backend's one logger, by the name of its public module (users and tests capture
it so), whichever of the package's modules logs."""


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
    interface = interface_for(source)
    if interface is None:  # a secondary address: Gloo keeps its own choice, said once
        log.warning("ina group: no interface has %s (the route toward MASTER_ADDR %s) as "
                    "its address; Gloo binds its default: set %s if peers cannot connect",
                    source, master, ENV_GLOO_IFNAME)  # fmt: skip
    return interface


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
