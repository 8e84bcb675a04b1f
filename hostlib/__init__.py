"""The worker side of inalab: wire protocol, quantization, transports, collectives.

Import what a worker needs from here; ``hostlib.protocol`` is the wire format shared
with the switches. The names below load on first use (PEP 562), so a switch that imports
``hostlib.protocol`` gets the wire format and not the host engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hostlib.collnet import CollNetAllreduce, CollNetError, LocalGroup, ina_inter
    from hostlib.errors import InaError, InaTimeoutError, P2pError, P2pTimeoutError
    from hostlib.ina import InaAllreduce, JobSpec, RetryPolicy
    from hostlib.p2pwire import PeerSpec
    from hostlib.peers import RingAllreduce, TreeAllreduce
    from hostlib.session import InaSession, StripedInaSession

__all__ = [
    "CollNetAllreduce",
    "CollNetError",
    "InaAllreduce",
    "InaError",
    "InaSession",
    "InaTimeoutError",
    "JobSpec",
    "LocalGroup",
    "P2pError",
    "P2pTimeoutError",
    "PeerSpec",
    "RetryPolicy",
    "RingAllreduce",
    "StripedInaSession",
    "TreeAllreduce",
    "ina_inter",
]

_HOME = (
    {name: "hostlib.ina" for name in __all__}
    | dict.fromkeys(("InaSession", "StripedInaSession"), "hostlib.session")
    | dict.fromkeys(
        ("InaError", "InaTimeoutError", "P2pError", "P2pTimeoutError"), "hostlib.errors"
    )
    | {"PeerSpec": "hostlib.p2pwire"}
    | dict.fromkeys(("RingAllreduce", "TreeAllreduce"), "hostlib.peers")
    | dict.fromkeys(
        ("CollNetAllreduce", "CollNetError", "LocalGroup", "ina_inter"), "hostlib.collnet"
    )
)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'hostlib' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
