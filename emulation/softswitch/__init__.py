"""The software INA switch: pipeline semantics, UDP server, P4Runtime server, process.

``pipeline`` is the data plane (what ``p4/`` implements on bmv2); ``server`` puts it on a
UDP socket; ``p4runtime`` is its P4Runtime server (the control interface bmv2 has too;
its parts are the ``p4rt_*`` modules, its names import from ``p4runtime``); ``process``
runs it as a subprocess and proves readiness; ``cli`` is ``inalab switch``; ``loadgen``
benchmarks it; ``argtypes`` parses its options.

Switch-target layer. The package imports its modules only when one of the names below is
asked for (:func:`__getattr__`, PEP 562; no warning: the names live here): the emulation's
value parsers re-export ``argtypes``, and loading a topology must load no switch and no
gRPC (tests/unit/test_layering.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emulation.softswitch.p4runtime import SoftSwitchP4Runtime, softswitch_p4info
    from emulation.softswitch.pipeline import (
        Addr,
        Dataplane,
        DropReason,
        DropSimulator,
        Emit,
        JobConfig,
        JobTableError,
        Pipeline,
        SlotState,
    )
    from emulation.softswitch.process import SoftSwitchProcess, SwitchStartError
    from emulation.softswitch.server import SwitchServer

__all__ = [
    "Addr",
    "Dataplane",
    "DropReason",
    "DropSimulator",
    "Emit",
    "JobConfig",
    "JobTableError",
    "Pipeline",
    "SlotState",
    "SoftSwitchP4Runtime",
    "SoftSwitchProcess",
    "SwitchServer",
    "SwitchStartError",
    "softswitch_p4info",
]

_HOMES = {
    "SoftSwitchP4Runtime": "p4runtime",
    "softswitch_p4info": "p4runtime",
    **dict.fromkeys(
        ("Addr", "Dataplane", "DropReason", "DropSimulator", "Emit", "JobConfig",
         "JobTableError", "Pipeline", "SlotState"),
        "pipeline",
    ),
    "SoftSwitchProcess": "process",
    "SwitchStartError": "process",
    "SwitchServer": "server",
}  # fmt: skip
"""Each exported name -> the module of this package that defines it."""


def __getattr__(name: str) -> Any:
    """An exported name, from its module (imported on first use, then kept here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names and the exported ones not yet imported."""
    return sorted({*globals(), *__all__})
