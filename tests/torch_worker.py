"""One rank of the ``"ina"`` torch backend as a process, configured only by the
environment, as a cluster's rank under ``torchrun`` is (``INALAB_*``, ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): for tests that place ranks in network
namespaces (``tests/cluster.py``). Runs ``calls`` int32 all_reduces of ``elements``
elements, each after a barrier, and prints one JSON line: the rank, each result's
sha256, each call's seconds, whether the calls went through the switch, on what
transport, and how many units the session retransmitted.

    PYTHONPATH=.:tests python tests/torch_worker.py '{"elements": 100000, "calls": 3, "seed": 1}'

Rank r's input of call c is ``ina_worker.inputs(seed, r, c, elements, "int32")``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from ina_worker import inputs

import dynamiccl.torch_backend  # noqa: F401  (registers "ina")


def main(spec: dict) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("ina", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    pg = dist.group.WORLD
    seq = pg.session.next_seq  # type: ignore[union-attr]
    digests, seconds = [], []
    for call in range(spec["calls"]):
        x = torch.from_numpy(inputs(spec["seed"], rank, call, spec["elements"], "int32"))
        dist.barrier()  # every rank starts the call together, as cluster_bench's Gloo ranks
        start = time.monotonic()
        dist.all_reduce(x)
        seconds.append(time.monotonic() - start)
        digests.append(hashlib.sha256(x.numpy().tobytes()).hexdigest())
    through = pg.session.next_seq > seq  # type: ignore[union-attr]
    retransmissions = pg.session.retransmissions  # type: ignore[union-attr]
    transport = type(pg.session.transport).__name__  # type: ignore[union-attr]
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "sha256": digests, "seconds": seconds,
                      "through_switch": through, "transport": transport,
                      "retransmissions": retransmissions}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
