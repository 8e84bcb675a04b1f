"""One rank of an allreduce, run inside an emulated host: ``python -m emulation.mininet.hostrun``.

The emulator starts one of these per worker in each Mininet host (its own network
namespace), reads the JSON line it prints, and compares ranks. Inputs are int32 from a
seeded generator per rank, so every rank can compute the exact expected sum (wrapping,
as the switch adds) and report how many elements differ: ``{"rank", "algo", "size",
"seconds", "wrong"}``. ``ina`` runs through the switch (hostlib.InaSession over UDP);
``gloo`` through torch.distributed's Gloo ring over TCP between the hosts, across the
same links and switches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

__all__ = ["expected_sum", "inputs", "main"]


def inputs(seed: int, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s int32 input (deterministic)."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-(2**31), 2**31, size=size, dtype=np.int64).astype(np.int32)


def expected_sum(seed: int, workers: int, size: int) -> np.ndarray:
    """The wrapping int32 sum of every rank's input."""
    total = np.zeros(size, dtype=np.int64)
    for rank in range(workers):
        total += inputs(seed, rank, size)
    return ((total + 2**31) % 2**32 - 2**31).astype(np.int32)


def _ina(args: argparse.Namespace, x: np.ndarray) -> np.ndarray:
    from hostlib import InaSession, JobSpec
    from hostlib.protocol import INA_UDP_PORT
    from hostlib.transport.udp import UdpTransport

    spec = JobSpec(args.job, args.rank, args.workers, (args.switch, INA_UDP_PORT), args.lanes,
                   args.slots)  # fmt: skip
    with InaSession(spec, UdpTransport((args.bind, args.port))) as session:
        return np.asarray(session.allreduce(x))


def _gloo(args: argparse.Namespace, x: np.ndarray) -> np.ndarray:
    import torch
    import torch.distributed as dist

    if args.iface:
        # Gloo finds its address from the hostname, which in an emulated host is the
        # machine's: name the host's own interface instead.
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.workers
    )
    try:
        t = torch.from_numpy(x.copy())
        dist.all_reduce(t)
        return t.numpy()
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m emulation.mininet.hostrun", description=__doc__)
    p.add_argument("algo", choices=("ina", "gloo"))
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--size", type=int, required=True, help="int32 elements")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", type=int, default=1)
    p.add_argument("--switch", help="the switch's INA address (ina)")
    p.add_argument("--bind", help="this host's address (ina)")
    p.add_argument("--port", type=int, default=47000, help="this worker's UDP port (ina)")
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--slots", type=int, default=256)
    p.add_argument("--master", help="HOST:PORT of rank 0's rendezvous (gloo)")
    p.add_argument("--iface", help="the interface Gloo uses (gloo; default: its own choice)")
    args = p.parse_args(argv)
    x = inputs(args.seed, args.rank, args.size)
    start = time.perf_counter()
    y = _ina(args, x) if args.algo == "ina" else _gloo(args, x)
    seconds = time.perf_counter() - start
    wrong = int(np.count_nonzero(y != expected_sum(args.seed, args.workers, args.size)))
    report = {"rank": args.rank, "algo": args.algo, "size": args.size, "seconds": seconds,
              "wrong": wrong}  # fmt: skip
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
