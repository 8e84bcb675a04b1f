"""Controller of the switch's counters: ``ina_stats`` and ``drops`` of Ingress and Egress
(``inalab ctl stats``). Indices are hostlib.protocol's SWITCH_STATS and SWITCH_DROPS,
the STAT_* and DROP_* of configuration.p4; a statistic is the sum of its two cells."""

from __future__ import annotations

from controller.client import P4RuntimeClient
from controller.entries import counter_entry, entity
from controller.p4info import P4Info
from hostlib.protocol import SWITCH_DROPS, SWITCH_STATS

__all__ = ["COUNTERS", "OWN_COUNTERS", "Stats"]

COUNTERS = ("Ingress.ina_stats", "Egress.ina_stats", "Ingress.drops", "Egress.drops")

OWN_COUNTERS = {"Ingress.received": "received", "Ingress.completed": "completed"}
"""The Tofino program's counters of one statistic each (a Tofino counter counts once a
pass; p4/tna/ina_tna.p4): read where the P4Info has them."""


class Stats:
    """Packet counters of one switch, read over P4Runtime (bmv2 serves counters too)."""

    def __init__(self, client: P4RuntimeClient, p4info: P4Info) -> None:
        self.client = client
        self.p4info = p4info

    def read(self) -> dict[str, int]:
        """Every statistic, ``received`` ... ``duplicates_ignored``, then ``drop_<reason>``.

        Raises:
            P4RuntimeError: the switch refused the read.
        """
        out = {name: 0 for name in SWITCH_STATS} | {f"drop_{r}": 0 for r in SWITCH_DROPS}
        present = {c.name for c in self.p4info.counters}
        counters = [*COUNTERS, *(name for name in OWN_COUNTERS if name in present)]
        wanted = [entity(counter_entry(self.p4info, name)) for name in counters]
        for found in self.client.read(wanted):
            entry = found.counter_entry
            counter = self.p4info.counter(entry.counter_id).name
            if counter in OWN_COUNTERS:
                out[OWN_COUNTERS[counter]] += entry.data.packet_count
                continue
            names = SWITCH_STATS if counter.endswith("ina_stats") else SWITCH_DROPS
            prefix = "" if counter.endswith("ina_stats") else "drop_"
            if entry.index.index < len(names):
                out[prefix + names[entry.index.index]] += entry.data.packet_count
        return out
