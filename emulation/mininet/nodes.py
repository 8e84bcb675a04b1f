"""inalab's switches as Mininet nodes: each starts its switch target's process on the
node's interfaces when Mininet starts the switch, and stops it with the node.

The targets themselves (:mod:`emulation.softswitch`, :mod:`emulation.bmv2`) know nothing
of Mininet; these classes are the one place the two meet. Mininet is imported when a
class is made, so the module imports without it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emulation.bmv2 import (
    BMV2_LANES,
    BMV2_SLOTS,
    Bmv2Process,
    Bmv2Tools,
    check_bmv2_switch,
    find_bmv2,
)
from emulation.mininet.capture import PortCapture
from emulation.softswitch.process import SoftSwitchProcess

__all__ = ["SWITCH_CLASSES", "bmv2_switch_class", "soft_switch_class"]

log = logging.getLogger(__name__)


def soft_switch_class() -> type:
    """The Mininet node class running inalab's soft switch (imports Mininet lazily)."""
    from mininet.node import Switch

    class SoftMininetSwitch(Switch):
        """Mininet switch running inalab's soft switch on its interfaces."""

        def __init__(
            self,
            name: str,
            run_dir: Path,
            lanes: int = 64,
            slots: int = 1024,
            forward_only: bool = False,
            links: dict[int, str] | None = None,
            pcap: bool = False,
            seed: int = 0,
            datapath: str = "python",
            roce: bool = False,
            **params: Any,
        ) -> None:
            super().__init__(name, **params)
            self.run_dir, self.lanes, self.slots = Path(run_dir), lanes, slots
            self.forward_only, self.links, self.pcap, self.seed = forward_only, links, pcap, seed
            self.datapath, self.roce = datapath, roce
            self.process: SoftSwitchProcess | None = None
            self.capture: PortCapture | None = None  # --pcap on the eBPF data plane

        def _args(self) -> tuple[str, ...]:
            args: list[str] = ["--datapath", self.datapath]
            if self.forward_only:
                args.append("--forward-only")
            if self.roce:
                args.append("--roce")
            for port, spec in sorted((self.links or {}).items()):
                args += ["--link", f"{port}:{spec}"]
            if self.links:
                args += ["--link-stats", str(self.run_dir / f"{self.name}.links.json")]
            if self.pcap and self.datapath == "python":  # eBPF's frames: tcpdump's
                args += ["--pcap", str(self.run_dir / f"{self.name}.pcap")]
            return tuple(args)

        def start(self, controllers: list[Any]) -> None:
            interfaces = {
                self.ports[intf]: intf.name for intf in self.intfList() if intf.name != "lo"
            }
            if self.pcap and self.datapath == "ebpf":
                self.capture = PortCapture(self.run_dir, interfaces).start()
            self.process = SoftSwitchProcess(
                self.run_dir, name=self.name, lanes=self.lanes, slots=self.slots,
                seed=self.seed, interfaces=interfaces, extra_args=self._args(),
            ).start()  # fmt: skip

        def stop(self, deleteIntfs: bool = True) -> None:
            if self.process is not None:
                code = self.process.stop()
                if code not in (0, None):
                    log.warning("switch %s exited %s; log %s", self.name, code,
                                self.process.log_path)  # fmt: skip
            if self.capture is not None:
                self.capture.stop()
            super().stop(deleteIntfs)

    return SoftMininetSwitch


def bmv2_switch_class(tools: Bmv2Tools | None = None) -> type:
    """The Mininet node class running bmv2 on its interfaces (imports Mininet lazily).

    Args:
        tools: the switch and compiler it runs; by default found on PATH.

    Raises:
        Bmv2Unavailable: ``tools`` not given and simple_switch_grpc or p4c-bm2-ss is not
            on PATH.
    """
    from mininet.node import Switch

    tools = tools or find_bmv2()

    class Bmv2MininetSwitch(Switch):
        """Mininet switch running ``simple_switch_grpc`` with ``p4/ina.p4`` on its ports.

        Takes the soft switch node's parameters (the emulation passes both the same) and
        refuses what bmv2 cannot do (:func:`check_bmv2_switch`) before Mininet starts
        anything. The device id is the switch's dpid; ``pcap`` writes bmv2's per-port
        captures to ``run_dir/pcaps``; ``log`` turns on bmv2's packet log.

        ``links`` (per-port delay and loss) must be empty: only the soft switch emulates
        them. ``seed`` is accepted and unused: bmv2's ``random()`` cannot be seeded, and
        so is ``roce``: p4/ina.p4 always parses RoCEv2 (p4/roce.p4).
        """

        def __init__(
            self,
            name: str,
            run_dir: Path,
            lanes: int = BMV2_LANES,
            slots: int = BMV2_SLOTS,
            forward_only: bool = False,
            pcap: bool = False,
            log: bool = False,
            links: dict[int, str] | None = None,
            seed: int = 0,
            roce: bool = False,
            **params: Any,
        ) -> None:
            check_bmv2_switch(lanes, slots, forward_only)
            if links:
                raise ValueError(
                    f"bmv2 cannot delay or drop on its ports ({links}): put a soft switch "
                    "at one end of those links"
                )
            super().__init__(name, **params)
            self.run_dir, self.pcap, self.log = Path(run_dir), pcap, log
            self.process: Bmv2Process | None = None

        def start(self, controllers: list[Any]) -> None:
            interfaces = {
                self.ports[intf]: intf.name for intf in self.intfList() if intf.name != "lo"
            }
            self.process = Bmv2Process(
                self.run_dir, name=self.name, interfaces=interfaces,
                device_id=int(self.dpid, 16), pcap=self.pcap, log=self.log, tools=tools,
            ).start()  # fmt: skip

        def stop(self, deleteIntfs: bool = True) -> None:
            if self.process is not None:
                code = self.process.stop()
                if code not in (0, None, -signal.SIGTERM):
                    log.warning("switch %s exited %s; log %s", self.name, code,
                                   self.process.log_path)  # fmt: skip
            super().stop(deleteIntfs)

    return Bmv2MininetSwitch


SWITCH_CLASSES: dict[str, Callable[[], type]] = {
    "soft": soft_switch_class,
    "bmv2": bmv2_switch_class,
}
"""Switch kind -> a function returning its Mininet class (imports Mininet lazily)."""
