"""Congestion control of INA traffic: how many of a call's slots a worker keeps in flight.

Layer: hostlib engines (below :mod:`hostlib.ina`, which owns the packet plan). The
window of an INA call is its slots: every worker uses the same, and packet ``p`` goes
to slot ``p % W``. The congestion window ``cwnd`` does not change that plan; it only
holds packets back: a packet whose slot is free is sent when ``cwnd >= W`` or fewer than
``cwnd`` packets are in flight (TCP's pipe: a loss holds back one packet's credit until
it is recovered, not the window behind it, as a sequence window ``una + cwnd`` did, which
made 5% link loss cost a timeout per lost packet). No worker waits on another forever:
the lowest held packet also goes when every packet in flight lies above it (sent out of
order while the window was open), which makes it the lowest this worker never sent. The
job's oldest packet not yet sent by every worker is such a packet for each worker that
has not sent it, once its slot is free, and its slot's previous packet was sent by all,
so its result comes.

The signal is delay, not ECN. Every engine already times each packet's result (Karn's
rule keeps the samples unambiguous). A sample at or below the least round trip seen plus
:attr:`~hostlib.ina.RetryPolicy.cc_target` (the bound) grows ``cwnd`` by one packet per
window of results (``cwnd += 1 / cwnd``); at ``W`` the limit is off. The cut judges a
round (a smoothed round trip of samples) by its least sample, Copa's standing RTT
(NSDI'18): a queue delays every packet of the round, while a loss delays only the
packets whose slot waited for a retransmission, and the others of the round come back in
time. When a round's least sample ``m`` lies above the bound, ``cwnd`` is cut in
proportion to the excess (Swift, SIGCOMM'20): ``cwnd *= max(1 - beta (m - bound) / m,
1 - max_cut)``. Judging every sample instead cut the window to one packet under 5%
random link loss (star8: 41 ms calls became 2 s).

ECN (ATP's AIMD) needs a mark from the queue, and the queues that build here are the
Linux qdiscs of the emulated links, ahead of the switch programs that would OR a mark
into the result: the delay is measurable on every data plane as it is. Losses are
not a signal: fast retransmission and the timers recover them, and random loss should
not shrink the window (the emulated links lose packets at random).

Packets sent before a call's first result are not samples: their results also wait for
the ranks still entering the call (:attr:`~hostlib.ina.RetryPolicy.timeout`). Nor are
packets in flight while their worker stalled (:class:`~hostlib.ina.StallClock`): on one
machine (a VM whose vCPUs the hypervisor took) the switch and the peers stalled with it,
and no queue grew.

The native core (``hostlib/_inacore.c``, ``cc_sample``) repeats :meth:`CongestionWindow.
on_sample` in the same order of operations; the differential test holds them together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ROUND_SAMPLES", "CongestionWindow", "check_congestion"]

ROUND_SAMPLES = 8
"""The fewest samples a round is judged on (``_congestion.h`` repeats it): with a window
of one or two packets a round of one round trip holds one or two, and under 5% link loss
on star8 a third of them waited for a retransmission."""


def check_congestion(target: float, beta: float, max_cut: float) -> None:
    """Refuse a congestion policy out of range.

    Raises:
        ValueError: ``target`` not positive (``math.inf``: off), ``beta`` not in (0, 1],
            or ``max_cut`` not in (0, 1).
    """
    if not target > 0:
        raise ValueError(f"cc_target {target} must be positive (math.inf: off)")
    if not 0 < beta <= 1:
        raise ValueError(f"cc_beta {beta} outside (0, 1]")
    if not 0 < max_cut < 1:
        raise ValueError(f"cc_max_cut {max_cut} outside (0, 1)")


@dataclass
class CongestionWindow:
    """A session's congestion window, carried across its calls as its RTT estimate is.

    ``cwnd`` is in packets; ``math.inf`` is no limit (the call's whole window).
    """

    cwnd: float = math.inf
    base_rtt: float = math.inf
    """The least round trip seen: the path without a queue."""
    round_start: float = -math.inf
    """When the current round of samples began; it ends a smoothed round trip later."""
    round_min: float = math.inf
    """The least sample of the current round."""
    round_samples: int = 0
    """The samples of the current round: it ends at :data:`ROUND_SAMPLES` at the least."""
    cuts: int = 0

    def limit(self, window: int) -> int:
        """Packets a call of ``window`` slots may have in flight."""
        if self.cwnd >= window:
            return window
        return max(1, int(self.cwnd))

    def on_sample(
        self, rtt: float, now: float, srtt: float, window: int, target: float, beta: float,
        max_cut: float,
    ) -> None:  # fmt: skip
        """One unambiguous round trip ``rtt`` taken at ``now`` (``srtt`` already holds it)."""
        if rtt < self.base_rtt:
            self.base_rtt = rtt
        if rtt < self.round_min:
            self.round_min = rtt
        self.round_samples += 1
        w = self.cwnd if self.cwnd < window else float(window)
        bound = self.base_rtt + target
        if rtt <= bound:
            w = w + 1.0 / w
            self.cwnd = math.inf if w >= window else w
        if now - self.round_start < srtt or self.round_samples < ROUND_SAMPLES:
            return
        least = self.round_min
        self.round_start, self.round_min, self.round_samples = now, math.inf, 0
        if least > bound:
            factor = 1.0 - beta * (least - bound) / least
            if factor < 1.0 - max_cut:
                factor = 1.0 - max_cut
            w = w * factor
            self.cwnd = w if w > 1.0 else 1.0
            self.cuts += 1
