"""One INA rank as a process, for tests that place ranks in network namespaces
(``tests/cluster.py``): bind, join the job installed already, run the allreduces, print
one JSON line with the results' sha256 and the session's counts.

    python tests/ina_worker.py '{"bind": ["10.77.0.1", 41000], "switch": ["10.77.0.100",
        20033], "job": 5, "rank": 0, "workers": 4, "lanes": 2048, "slots": 8,
        "elements": 100000, "dtype": "int32", "calls": 3, "seed": 1}'

Rank r's input of call c is ``inputs(seed, r, c, elements, dtype)`` (also imported by
the tests, which sum them for the expected result).
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

from hostlib import InaSession, JobSpec, RetryPolicy
from hostlib.transport.udp import UdpTransport


def inputs(seed: int, rank: int, call: int, elements: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, call])
    if dtype == "int32":
        return rng.integers(-(1 << 20), 1 << 20, elements, dtype=np.int32)
    return rng.standard_normal(elements).astype(np.float32)


def main(spec: dict) -> dict:
    transport = UdpTransport(tuple(spec["bind"]))
    job = JobSpec(spec["job"], spec["rank"], spec["workers"], tuple(spec["switch"]),
                  spec["lanes"], spec["slots"])  # fmt: skip
    digests = []
    with InaSession(job, transport, RetryPolicy(deadline=spec.get("deadline", 20.0))) as s:
        for call in range(spec["calls"]):
            x = inputs(spec["seed"], spec["rank"], call, spec["elements"], spec["dtype"])
            digests.append(hashlib.sha256(s.allreduce(x).tobytes()).hexdigest())
        counts = {"retransmissions": s.retransmissions, "late_answers": s.late_answers}
    return {"rank": spec["rank"], "sha256": digests, **counts}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
