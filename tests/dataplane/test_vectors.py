"""Every data-plane vector on every target: the soft switch and the Tofino program's model
(tna_target.py) always, bmv2 where it exists.

A target that cannot run here (no simple_switch_grpc or p4c, a vector for another target)
skips with its reason; a vector whose expectation fails names its file and step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runner import (
    SoftSwitchTarget,
    Target,
    TargetUnavailable,
    Vector,
    load_vectors,
    run_vector,
)

VECTORS = load_vectors()

QUICK_VECTORS = frozenset({"aggregation", "retransmission", "invalid_packets", "job_isolation"})
"""The vectors ``pytest -m "not slow"`` runs through a soft switch process: aggregation,
exactly-once under retransmission, drops and isolation. Every vector runs on every
available target in the full run."""


def _target(name: str) -> Target:
    if name == "soft":
        return SoftSwitchTarget()
    if name == "tna-model":
        from tna_target import TnaModelTarget  # the TNA program's Python model, in process

        return TnaModelTarget()
    from bmv2_target import (  # veths, raw sockets
        Bmv2Target,
        EbpfTarget,
        OneArmedTarget,
        SoftPortsTarget,
    )

    targets = {"soft-ports": SoftPortsTarget, "ebpf": EbpfTarget, "bmv2": Bmv2Target,
               "one-armed": OneArmedTarget}  # fmt: skip
    return targets[name]()


def _params() -> list[object]:
    params: list[object] = []
    for vector in VECTORS:
        quick = [] if vector.name in QUICK_VECTORS else [pytest.mark.slow]
        params.append(pytest.param(vector, "soft", id=f"{vector.name}-soft", marks=quick))
        params.append(pytest.param(vector, "tna-model", id=f"{vector.name}-tna-model"))
        ports = [pytest.mark.root, pytest.mark.slow]
        params.append(
            pytest.param(vector, "soft-ports", id=f"{vector.name}-soft-ports", marks=ports)
        )
        marks = [pytest.mark.ebpf, pytest.mark.root, pytest.mark.slow]
        params.append(pytest.param(vector, "ebpf", id=f"{vector.name}-ebpf", marks=marks))
        params.append(
            pytest.param(vector, "one-armed", id=f"{vector.name}-one-armed", marks=marks)
        )
        marks = [pytest.mark.bmv2, pytest.mark.root, pytest.mark.slow]
        params.append(pytest.param(vector, "bmv2", id=f"{vector.name}-bmv2", marks=marks))
    return params


@pytest.mark.parametrize(("vector", "target_name"), _params())
def test_vector(vector: Vector, target_name: str, tmp_path: Path) -> None:
    try:
        run_vector(vector, _target(target_name), tmp_path)
    except TargetUnavailable as exc:
        pytest.skip(str(exc))
