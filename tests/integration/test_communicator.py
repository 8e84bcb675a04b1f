"""One communicator per rank (``hostlib.communicator``): every action of every collective
over real UDP, INA through a soft switch in a thread, ranks in threads."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SwitchJob, expected, in_threads, random_inputs, switch_thread, wrapping_sum

from emulation.softswitch.pipeline import Pipeline
from hostlib import PeerSpec, RetryPolicy, RingAllreduce
from hostlib.actions import Action, ActionError
from hostlib.communicator import Communicator
from hostlib.session import part_bounds
from hostlib.transport.udp import UdpTransport

N, LANES, SLOTS = 4, 64, 8
POLICY = RetryPolicy(deadline=20.0)
ACTIONS = [
    ("allreduce", Action("ina", LANES, 4)),
    ("allreduce", Action("ring", 16, 2)),
    ("allreduce", Action("tree", 32, 3)),
    ("reduce_scatter", Action("ina", LANES, SLOTS)),
    ("reduce_scatter", Action("ring", 64, 8)),
    ("all_gather", Action("ring", 8, 4)),
]


def test_every_action_of_every_collective() -> None:
    rng = np.random.default_rng(0)
    inputs = [random_inputs(rng, np.int32, N, 5 * LANES + 3) for _ in ACTIONS]
    with switch_thread(Pipeline(LANES, slots=64)) as server:
        job = SwitchJob(server, 1, N, SLOTS, POLICY)
        transports = [UdpTransport() for _ in range(N)]
        addrs = tuple(t.local_addr for t in transports)
        comms = [
            Communicator(r, N, ina=job.sessions[r],
                         ring=RingAllreduce(PeerSpec(r, addrs), transports[r], POLICY))
            for r in range(N)
        ]  # fmt: skip

        def body(r: int) -> list[np.ndarray]:
            out = []
            for (collective, action), x in zip(ACTIONS, inputs, strict=True):
                mine = x[r][: x.shape[1] // N] if collective == "all_gather" else x[r]
                out.append(np.asarray(comms[r].run(collective, mine, action)))
            return out

        try:
            # No count of retransmissions is asserted: on a loaded machine a timer may
            # fire before a late answer on lossless loopback (the results still hold).
            results = in_threads([lambda r=r: body(r) for r in range(N)])  # type: ignore[misc]
        finally:
            for c in comms:
                c.ring.close(linger=0.05)  # type: ignore[union-attr]
            job.close()
    for k, ((collective, _), x) in enumerate(zip(ACTIONS, inputs, strict=True)):
        total = wrapping_sum(x)
        assert np.array_equal(expected(x, LANES), total)  # int32: INA is exact
        for r in range(N):
            got = results[r][k]
            if collective == "allreduce":
                np.testing.assert_array_equal(got, total)
            elif collective == "reduce_scatter":
                lo, hi = part_bounds(total.size, N, r)
                np.testing.assert_array_equal(got, total[lo:hi])
            else:
                np.testing.assert_array_equal(got, x[:, : x.shape[1] // N].reshape(-1))


def test_what_a_communicator_cannot_run_is_refused_before_any_packet() -> None:
    comm = Communicator(0, 2)
    x = np.zeros(4, dtype=np.int32)
    with pytest.raises(ActionError, match="tree does not run reduce_scatter"):
        comm.reduce_scatter(x, Action("tree", 8, 1))
    with pytest.raises(ActionError, match="ina does not run all_gather"):
        comm.all_gather(x, Action("ina", 8, 1))
    with pytest.raises(ActionError, match="no ina session"):
        comm.allreduce(x, Action("ina", 8, 1))
    with pytest.raises(ActionError, match="unknown collective"):
        comm.run("broadcast", x, Action("ring", 8, 1))
    with pytest.raises(ValueError, match="rank 2 outside"):
        Communicator(2, 2)
