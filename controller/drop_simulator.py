"""Controller of ``p4/drop_simulator.p4``: the loss probabilities at ingress and per
replica at egress, each a one-cell register holding round(p * 2**31) (0: off)."""

from __future__ import annotations

from controller.registers import RegisterAccess

__all__ = ["SIM_SCALE", "DropSimulator"]

SIM_SCALE = 1 << 31
"""configuration.p4's SIM_RANDOM_MAX + 1: random() draws 0..2**31-1 and a packet is
dropped when the draw is below the register's value."""

INGRESS = "Ingress.drop_simulator.probability"
EGRESS = "Egress.drop_simulator.probability"


class DropSimulator:
    """Set and read the switch's simulated loss."""

    def __init__(self, registers: RegisterAccess) -> None:
        self.registers = registers

    def set(self, ingress: float, egress: float) -> None:
        """Drop INA packets with probability ``ingress`` on arrival and each result
        replica with probability ``egress`` on departure.

        Raises:
            ValueError: a probability outside 0..1.
            P4RuntimeError | ThriftError: the switch refused the write.
        """
        for name, p in (("ingress", ingress), ("egress", egress)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} drop probability {p} outside 0..1")
        self.registers.fill(INGRESS, 0, 1, round(ingress * SIM_SCALE))
        self.registers.fill(EGRESS, 0, 1, round(egress * SIM_SCALE))

    def get(self) -> tuple[float, float]:
        """The (ingress, egress) probabilities in force."""
        ingress = self.registers.read(INGRESS, [0])[0]
        egress = self.registers.read(EGRESS, [0])[0]
        return ingress / SIM_SCALE, egress / SIM_SCALE
