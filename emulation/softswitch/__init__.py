"""The software INA switch: pipeline semantics, UDP server, control channel, process.

``pipeline`` is the data plane (what ``p4/`` implements on bmv2); ``server`` puts it on a
UDP socket; ``control`` is its interim JSON-lines control channel; ``process`` runs it as
a subprocess and proves readiness; ``cli`` is ``inalab switch``; ``loadgen`` benchmarks it.
"""

from emulation.softswitch.control import ErrorKind, SwitchControl, SwitchControlError
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
    "ErrorKind",
    "JobConfig",
    "JobTableError",
    "Pipeline",
    "SlotState",
    "SoftSwitchProcess",
    "SwitchControl",
    "SwitchControlError",
    "SwitchServer",
    "SwitchStartError",
]
