"""Train a small MLP on scikit-learn's digits with DDP, over INA and over Gloo.

Four worker processes (``torch.multiprocessing`` spawn, CPU) train the same model from
the same seed twice: once in an ``"ina"`` process group, whose gradient allreduce goes
through a soft switch this script starts (and stops), and once in a ``"gloo"`` group.
The test accuracy of each run is printed as one JSON object::

    python examples/ddp_digits.py [--workers 4] [--epochs 12]

The digits data ships with scikit-learn (no download).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dynamiccl.torch_backend import InaOptions  # importing it registers "ina"
from emulation.softswitch.process import SoftSwitchProcess

JOB_ID = 1
TEST_FRACTION = 0.2
BATCH_PER_RANK = 32
SWITCH_LANES = 256


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


def _free_port() -> int:
    # The rendezvous needs a port up front; the window before rank 0 binds it is accepted.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
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
