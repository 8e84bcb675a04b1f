"""The software INA switch: pipeline semantics, UDP server, P4Runtime server, process.

``pipeline`` is the data plane (what ``p4/`` implements on bmv2); ``server`` puts it on a
UDP socket; ``p4runtime`` is its P4Runtime server (the control interface bmv2 has too);
``process`` runs it as a subprocess and proves readiness; ``cli`` is ``inalab switch``;
``loadgen`` benchmarks it.
"""

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
