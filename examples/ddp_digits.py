"""Train a small MLP on scikit-learn's digits with DDP, over INA and over Gloo.

Four worker processes (``torch.multiprocessing`` spawn, CPU) train the same model from
the same seed twice: once in an ``"ina"`` process group, whose gradient allreduce goes
through a soft switch this script starts (and stops), and once in a ``"gloo"`` group.
The test accuracy of each run is printed as one JSON object::

    python examples/ddp_digits.py [--workers 4] [--epochs 12]

Under a launcher (``RANK`` and ``WORLD_SIZE`` set, as torchrun and ``inalab emulate
TOPOLOGY run`` set them) the script is that one rank instead: both runs rendezvous at
``MASTER_ADDR:MASTER_PORT``, the ``"ina"`` group takes its switch and job from the
``INALAB_*`` variables, and each rank prints its own JSON object::

    inalab emulate topologies/star4.yaml run -- python examples/ddp_digits.py

The digits data ships with scikit-learn (no download).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dynamiccl.torch_backend import InaOptions, InaProcessGroup  # registers "ina"
from emulation.softswitch.process import SoftSwitchProcess

JOB_ID = 1
TEST_FRACTION = 0.2
BATCH_PER_RANK = 32
SWITCH_LANES = 256
DEFAULT_WORKERS = 4
RENDEZVOUS_TIMEOUT = timedelta(minutes=5)


def split_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features in [0, 1] and labels, split into train and test with a fixed permutation."""
    from sklearn.datasets import load_digits  # the parent's import only: workers get arrays

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def worker(
    rank: int,
    world_size: int,
    runs: list[tuple[str, str, InaOptions | None]],
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    epochs: int,
    seed: int,
    results: Any,
) -> None:
    """One rank: each run of ``runs`` (backend, rendezvous, options) in turn; rank 0
    reports (backend, test accuracy, seconds) of each."""
    torch.set_num_threads(1)  # four ranks share two cores
    for backend, init_method, options in runs:
        start = time.perf_counter()
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, pg_options=options
        )
        try:
            accuracy = train(rank, world_size, data, epochs, seed)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            results.put((backend, accuracy, time.perf_counter() - start))


def train(
    rank: int,
    world_size: int,
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    epochs: int,
    seed: int,
) -> float:
    """Train in the current process group: this rank's stride of every epoch's
    permutation, gradients averaged by DDP; the test accuracy."""
    x_train, y_train, x_test, y_test = data
    model = DistributedDataParallel(make_model(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x_train))[rank::world_size]  # same permutation everywhere
        for start in range(0, len(order) - BATCH_PER_RANK + 1, BATCH_PER_RANK):
            batch = order[start : start + BATCH_PER_RANK]
            optimizer.zero_grad()
            logits = model(torch.from_numpy(x_train[batch]))
            loss_fn(logits, torch.from_numpy(y_train[batch])).backward()
            optimizer.step()
    with torch.no_grad():
        predicted = model.module(torch.from_numpy(x_test)).argmax(dim=1).numpy()
    return float(np.mean(predicted == y_test))


def launched(environ: Mapping[str, str]) -> bool:
    """Whether a launcher started this process as one rank (torchrun's variables)."""
    return "RANK" in environ and "WORLD_SIZE" in environ


def run_rank(epochs: int, seed: int) -> dict[str, Any]:
    """This process as the rank a launcher made it: the "ina" run, then the "gloo" run,
    over one c10d store from ``env://`` (``MASTER_ADDR:MASTER_PORT``, or torchrun's
    agent store); this rank's report."""
    torch.set_num_threads(1)  # the ranks share the machine's cores
    # One store for both runs, each under its own prefix: a second env:// rendezvous
    # would race rank 0's teardown of the first store on the same port.
    store, rank, world_size = next(dist.rendezvous("env://", timeout=RENDEZVOUS_TIMEOUT))
    data = split_digits(seed)
    report: dict[str, Any] = {"rank": rank, "world_size": world_size, "epochs": epochs}
    for backend in ("ina", "gloo"):
        start = time.perf_counter()
        dist.init_process_group(
            backend, store=dist.PrefixStore(f"{backend}/", store), rank=rank,
            world_size=world_size, timeout=RENDEZVOUS_TIMEOUT,
        )  # fmt: skip
        try:
            accuracy = train(rank, world_size, data, epochs, seed)
            group = dist.group.WORLD
            if isinstance(group, InaProcessGroup):  # packets this rank sent the switch
                # (under CollNet only each machine's head sends any)
                session = group.session
                report["ina_packets"] = 0 if session is None else session.packets
                report["collnet"] = group.collnet is not None
        finally:
            dist.destroy_process_group()
        report[backend] = {"accuracy": accuracy, "seconds": round(time.perf_counter() - start, 2)}
    # Rank 0 serves the store (unless torchrun's agent does): it leaves last.
    store.add("done", 1)
    if rank == 0:
        while store.add("done", 0) < world_size:
            time.sleep(0.05)
    return report


def _free_port() -> int:
    # The rendezvous needs a port up front; the window before rank 0 binds it is accepted.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int,
                        help=f"ranks to spawn (default {DEFAULT_WORKERS}; under a launcher: "
                        "its WORLD_SIZE)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if launched(os.environ):
        if args.workers is not None and args.workers != int(os.environ["WORLD_SIZE"]):
            parser.error(f"--workers {args.workers} but the launcher started "
                         f"WORLD_SIZE={os.environ['WORLD_SIZE']} ranks")  # fmt: skip
        # One write per report: ranks of torchrun share one stdout.
        sys.stdout.write(json.dumps(run_rank(args.epochs, args.seed)) + "\n")
        sys.stdout.flush()
        return
    args.workers = args.workers or DEFAULT_WORKERS
    # Gloo picks its interface from the hostname; every rank here is on loopback.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    start = time.perf_counter()
    data = split_digits(args.seed)
    report: dict[str, Any] = {"workers": args.workers, "epochs": args.epochs}
    # 256 lanes (1 KiB datagrams): a quarter of the packets of the default 64.
    with (
        tempfile.TemporaryDirectory(prefix="ddp-digits-") as run_dir,
        SoftSwitchProcess(Path(run_dir), lanes=SWITCH_LANES) as switch,
    ):
        options = InaOptions(
            switch=switch.data_addr,
            p4runtime=switch.p4runtime_address,
            job_id=JOB_ID,
            device_id=switch.device_id,
        )
        # One spawn for both runs: starting four torch processes costs more than
        # training this model.
        runs = [
            ("ina", f"tcp://127.0.0.1:{_free_port()}", options),
            ("gloo", f"tcp://127.0.0.1:{_free_port()}", None),
        ]
        results = mp.get_context("spawn").SimpleQueue()
        worker_args = (args.workers, runs, data, args.epochs, args.seed, results)
        mp.spawn(worker, args=worker_args, nprocs=args.workers)
        with switch.controller() as ctl:
            report["switch_aggregated_packets"] = ctl.counters()["aggregated"]
    for _ in runs:
        backend, accuracy, seconds = results.get()
        report[backend] = {"accuracy": accuracy, "seconds": round(seconds, 2)}
    report["total_seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
