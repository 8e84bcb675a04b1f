"""UDP GSO in the native p2p core: runs of datagrams to one peer leave in one send, the
kernel cuts them back into the same datagrams, and the results are the same bytes as
without it (``INALAB_UDP_GSO=0``), over real sockets on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import peer_ranks

from hostlib import RetryPolicy, RingAllreduce, TreeAllreduce
from hostlib.native import GSO_ENV, native_p2p_unavailable, udp_gso

pytestmark = pytest.mark.skipif(
    native_p2p_unavailable() is not None, reason=str(native_p2p_unavailable())
)

POLICY = RetryPolicy(deadline=10.0)


def _run(make: Any, x: np.ndarray, monkeypatch: pytest.MonkeyPatch, gso: str) -> list[Any]:
    monkeypatch.setenv(GSO_ENV, gso)

    def work(rank: int, session: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        ar = session.allreduce(x[rank])
        rs = session.reduce_scatter(x[rank]) if make is RingAllreduce else ar
        ag = session.all_gather(x[rank]) if make is RingAllreduce else ar
        return ar, rs, ag, session.endpoint.core.state["gso_sends"]

    class Native(make):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, engine="native", **kwargs)

    return peer_ranks(Native, len(x), work, POLICY, lanes=256, window=16)


@pytest.mark.parametrize("make", [RingAllreduce, TreeAllreduce])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_gso_sends_give_the_same_results(
    make: Any, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    x = rng.integers(-1000, 1000, size=(4, 256 * 40 + 13)).astype(dtype)
    with_gso = _run(make, x, monkeypatch, "1")
    without = _run(make, x, monkeypatch, "0")
    # A rank that holds a window of its own data at the start sends it as one run: every
    # ring rank, and the tree's leaves. The tree's inner ranks forward what arrives, and
    # on a busy machine it may arrive one datagram at a time, so they may have no runs.
    n = len(x)
    first = range(n) if make is RingAllreduce else [r for r in range(n) if 2 * r + 1 >= n]
    assert all(with_gso[r][3] > 0 for r in first), "their first window left as one send"
    assert all(r[3] == 0 for r in without)
    for a, b in zip(with_gso, without, strict=True):
        for got, want in zip(a[:3], b[:3], strict=True):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_switch_is_read_from_the_environment() -> None:
    assert udp_gso({}) is True
    assert udp_gso({GSO_ENV: "0"}) is False
    with pytest.raises(ValueError, match="INALAB_UDP_GSO"):
        udp_gso({GSO_ENV: "yes"})
