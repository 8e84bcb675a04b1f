"""Two jobs share one soft switch's region, with a fallback aggregator behind it, end to end.

Two real ``inalab switch`` processes on loopback, both configured by the controller over
P4Runtime: the switch, with a shared region of 8 slots, and a fallback aggregator with
both jobs installed behind the switch (``add_behind``). Job A reserves 4 slots and shares
4; job B reserves none and shares 8 of the same region, so their windows of 16 overlap
there and the rest of each window goes to the fallback. The workers are real sessions
(the native engine where it is built) on UDP sockets, and nothing in their API knows of
the sharing. Every result is the exact sum; then A leaves, its slots are freed and
cleared, and B's slots move onto the switch, still exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sharing_jobs import LANES, SharingJob, a_leaves, share

from controller.switch import WorkerAddress
from emulation.softswitch import SoftSwitchProcess

POOL = 64


@pytest.fixture
def switches(tmp_path: Path) -> Iterator[tuple[SoftSwitchProcess, SoftSwitchProcess]]:
    front = SoftSwitchProcess(tmp_path / "switch", lanes=LANES, slots=POOL).start()
    try:
        back = SoftSwitchProcess(tmp_path / "fallback", lanes=LANES, slots=POOL).start()
    except BaseException:
        front.stop()
        raise
    try:
        yield front, back
    finally:
        codes = (back.stop(), front.stop())
        assert codes == (0, 0), (back.log_path.read_text(), front.log_path.read_text())


def test_two_jobs_share_the_region_and_the_fallback_finishes_the_rest_exactly(
    switches: tuple[SoftSwitchProcess, SoftSwitchProcess],
) -> None:
    front, back = switches
    rng = np.random.default_rng(7)
    to_front, to_back = WorkerAddress(*front.data_addr), WorkerAddress(*back.data_addr)
    with front.controller() as ctl, back.controller() as fb:
        a = SharingJob(ctl, fb, "127.0.0.1", to_front, front.data_addr, to_back, 4, 4)
        b = SharingJob(ctl, fb, "127.0.0.1", to_front, front.data_addr, to_back, 0, 8)
        try:
            share(ctl, fb, a, b, rng)
            a_leaves(ctl, fb, a, b, rng)
        finally:
            a.close()
            b.close()
