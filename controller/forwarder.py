"""Controller of ``p4/forwarder.p4``: L2 forwarding of ordinary traffic (a Gloo ring
baseline, ARP) across the INA switch: a host's MAC to its port, or flood to a group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p4.v1 import p4runtime_pb2

from controller.entries import modify
from controller.p4info import encode_value, mac_text
from controller.tables import TableManager

__all__ = ["Forwarder", "HostRoute"]


@dataclass(frozen=True)
class HostRoute:
    """Frames to ``mac`` leave on switch port ``port``."""

    mac: str
    port: int


class Forwarder(TableManager):
    """The ``Ingress.forwarder.forward`` table."""

    table_name = "Ingress.forwarder.forward"

    def add_host(self, route: HostRoute) -> None:
        """Raises: AlreadyExistsError for a known MAC; P4RuntimeError otherwise."""
        action = "Ingress.forwarder.set_egress_port"
        self._insert({"eth_dst": route.mac}, action, {"port": route.port})

    def delete_host(self, mac: str) -> None:
        """Raises: NotFoundError for an unknown MAC; P4RuntimeError otherwise."""
        self._delete({"eth_dst": mac})

    def flood_unknown(self, mgid: int) -> None:
        """Make the default action flood unknown destinations to group ``mgid``."""
        entry = self._default("Ingress.forwarder.flood")
        param = self.p4info.action("Ingress.forwarder.flood").param("mgid")
        entry.action.action.params.add(param_id=param.id, value=encode_value(mgid, 16))
        self.client.write([modify(entry)])

    def drop_unknown(self) -> None:
        """Restore the initial default: drop frames to unknown destinations."""
        self.client.write([modify(self._default("Ingress.forwarder.forward_drop"))])

    def read(self) -> list[HostRoute]:
        """Every host route, by port."""
        routes = [
            HostRoute(mac_text(m["eth_dst"]), p["port"])
            for m, action, p in self._read()
            if action == "Ingress.forwarder.set_egress_port"
        ]
        return sorted(routes, key=lambda r: (r.port, r.mac))

    def _default(self, action: str) -> Any:
        entry = p4runtime_pb2.TableEntry(table_id=self.table.id, is_default_action=True)
        entry.action.action.action_id = self.p4info.action(action).id
        return entry
