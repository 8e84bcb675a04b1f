"""Round-trip samples from the RESEND flag results carry (docs/protocol.md, "Timeouts").

A RESULT carries the ``FLAG_RESEND`` of the packet that completed the use, or of the
retransmission it answers (every data plane: ``tests/dataplane/vectors/result_flags.json``).
Karn's rule alone skips a worker's retransmitted packets; with the flag an engine also

- skips a result a retransmission completed: its time is another worker's recovery;
- takes the round trip of a packet it resent once, when the first result came from a
  first transmission and a late answer then proves the retransmission was not needed:
  the spurious timeouts of a queue (the fat tree's) teach the estimator the queue.

Each scenario drives both engines (the Python specification and the native core) by hand
through the soft switch's real pipeline, one packet at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import FAKE_SWITCH

from emulation.softswitch.pipeline import JobConfig, Pipeline
from hostlib.ina import InaAllreduce, JobSpec, RetryPolicy
from hostlib.native import NativeInaAllreduce, native_unavailable

LANES = 8
POLICY = RetryPolicy(timeout=0.02, min_timeout=0.01, max_timeout=0.5)
A, B = ("10.0.0.1", 5000), ("10.0.0.2", 5001)

ENGINES: list[Any] = [InaAllreduce]
if native_unavailable() is None:
    ENGINES.append(NativeInaAllreduce)


def _job(engine: Callable[..., Any], flagged: bool, blocks: int = 3) -> tuple[Pipeline, list[Any]]:
    """Two workers, a window of one slot, ``blocks`` packets each."""
    pipe = Pipeline(LANES, slots=4)
    pipe.add_job(JobConfig(1, (A, B), 1))
    spec = [JobSpec(1, r, 2, FAKE_SWITCH, LANES, 1) for r in range(2)]
    data = [np.full(blocks * LANES, r + 1, np.int32) for r in range(2)]
    uses = np.zeros(1, np.int64)
    return pipe, [engine(spec[r], data[r], uses.copy(), POLICY, flagged=flagged) for r in (0, 1)]


def _fire(engine: Any) -> list[Any]:
    """Wake the engine each time it asks (its stall check's heartbeat, then its timer:
    a wake-up later than asked is a stall, whose timers are re-armed rather than fired)
    until a timer fires; what it sends then."""
    for _ in range(1000):
        out = list(engine.on_timer(engine.next_wakeup()))
        if out:
            return out
    raise AssertionError("no timer fired")


def _switch(pipe: Pipeline, packet: Any, src: tuple[str, int]) -> list[bytes]:
    """What the switch sends for ``packet`` from ``src``: one copy per destination."""
    emit = pipe.process(memoryview(bytes(packet)), src)
    return [] if emit is None else [bytes(emit.payload)] * len(emit.dests)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("flagged", [True, False])
def test_a_late_answer_proves_a_timeout_spurious_and_gives_its_round_trip(
    engine: Callable[..., Any], flagged: bool
) -> None:
    pipe, (a, b) = _job(engine, flagged)
    (pa,), (pb,) = a.start(0.0), b.start(0.0)
    assert _switch(pipe, pa, A) == []  # A's first transmission is counted
    (ra,) = _fire(a)  # B's is queued somewhere: A's timer fires
    assert ra[1] & 1  # FLAG_RESEND
    result, _ = _switch(pipe, pb, B)  # B's first transmission completes the use
    assert result[1] & 1 == 0
    a.on_datagram(memoryview(result), 0.060)
    b.on_datagram(memoryview(result), 0.060)
    assert a.rtt.samples == 0 and b.rtt.samples == 1  # A's is ambiguous, for now
    (late,) = _switch(pipe, ra, A)  # A's retransmission, after completion: answered
    assert late[1] & 1
    a.on_datagram(memoryview(late), 0.070)
    if flagged:
        assert (a.rtt.samples, a.rtt.srtt, a.stats.late_samples) == (1, 0.060, 1)
    else:  # Karn's rule alone (RoCEv2's results carry no flag)
        assert (a.rtt.samples, a.stats.late_samples) == (0, 0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("flagged", [True, False])
def test_a_result_a_retransmission_completed_gives_no_sample(
    engine: Callable[..., Any], flagged: bool
) -> None:
    pipe, (a, b) = _job(engine, flagged)
    a.start(0.0)
    (pb,) = b.start(0.0)
    assert _switch(pipe, pb, B) == []  # B's first transmission is counted; A's is lost
    (ra,) = _fire(a)
    result, _ = _switch(pipe, ra, A)  # A's retransmission completes the use
    assert result[1] & 1
    b.on_datagram(memoryview(result), 0.040)
    a.on_datagram(memoryview(result), 0.040)
    # B's 40 ms were A's recovery, not a round trip: a sample only without the flag.
    assert b.rtt.samples == (0 if flagged else 1)
    assert a.rtt.samples == 0 and a.stats.late_samples == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_packet_resent_twice_gives_no_late_sample(engine: Callable[..., Any]) -> None:
    """Resent twice, the first retransmission may have been the one counted (the first
    transmission lost) and the late answer the second's: ambiguous, no sample."""
    pipe, (a, b) = _job(engine, True)
    a.start(0.0)
    (pb,) = b.start(0.0)
    (r1,) = _fire(a)
    (r2,) = _fire(a)
    assert _switch(pipe, r1, A) == []  # A's first transmission was lost: r1 counted
    result, _ = _switch(pipe, pb, B)  # B's late first transmission completes it
    a.on_datagram(memoryview(result), 0.110)
    (late,) = _switch(pipe, r2, A)
    a.on_datagram(memoryview(late), 0.120)
    assert a.rtt.samples == 0 and a.stats.late_samples == 0
