"""One INA rank as a process, for tests that place ranks in network namespaces
(``tests/cluster.py``): bind, join the job installed already, run the allreduces, print
one JSON line with the results' sha256, each call's seconds and the session's counts.

    python tests/ina_worker.py '{"bind": ["10.77.0.1", 41000], "switch": ["10.77.0.100",
        20033], "job": 5, "rank": 0, "workers": 4, "lanes": 2048, "slots": 8,
        "elements": 100000, "dtype": "int32", "calls": 3, "seed": 1}'

A job striped across aggregators gives lists instead, one entry per aggregator:
``"bind": [[ip, port], ...], "switch": [[ip, port], ...]``. A call that fails prints
``{"rank": r, "error": "...", "calls_done": n, "failed_after": seconds}`` and exits 3.

Rank r's input of call c is ``inputs(seed, r, c, elements, dtype)`` (also imported by
the tests, which sum them for the expected result).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np

from hostlib import InaError, InaSession, JobSpec, RetryPolicy, StripedInaSession
from hostlib.transport.udp import UdpTransport


def inputs(seed: int, rank: int, call: int, elements: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, call])
    if dtype == "int32":
        return rng.integers(-(1 << 20), 1 << 20, elements, dtype=np.int32)
    return rng.standard_normal(elements).astype(np.float32)


def _session(spec: dict) -> InaSession | StripedInaSession:
    policy = RetryPolicy(deadline=spec.get("deadline", 20.0))
    striped = isinstance(spec["switch"][0], list)
    binds, switches = (
        (spec["bind"], spec["switch"]) if striped else ([spec["bind"]], [spec["switch"]])
    )
    pairs = zip(binds, switches, strict=True)
    job = (spec["job"], spec["rank"], spec["workers"])
    sessions = [
        InaSession(
            JobSpec(*job, tuple(switch), spec["lanes"], spec["slots"]),
            UdpTransport(tuple(bind)),
            policy,
        )
        for bind, switch in pairs
    ]
    return StripedInaSession(sessions) if striped else sessions[0]


def main(spec: dict) -> tuple[dict, int]:
    digests: list[str] = []
    seconds: list[float] = []
    with _session(spec) as s:
        for call in range(spec["calls"]):
            x = inputs(spec["seed"], spec["rank"], call, spec["elements"], spec["dtype"])
            started = time.monotonic()
            try:
                result = s.allreduce(x)
                seconds.append(time.monotonic() - started)
                digests.append(hashlib.sha256(result.tobytes()).hexdigest())
            except InaError as exc:
                failed = {"error": str(exc), "calls_done": call,
                          "failed_after": time.monotonic() - started}  # fmt: skip
                return {"rank": spec["rank"], **failed}, 3
        counts = {"retransmissions": s.retransmissions, "late_answers": s.late_answers}
    return {"rank": spec["rank"], "sha256": digests, "seconds": seconds, **counts}, 0


if __name__ == "__main__":
    report, status = main(json.loads(sys.argv[1]))
    print(json.dumps(report), flush=True)
    sys.exit(status)
