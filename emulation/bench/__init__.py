"""``inalab bench``: allreduce benchmarks of INA through the soft switch against Gloo.

``config`` holds the sweep (pure data), ``workers`` the per-rank processes, ``sweep`` the
coordinator that starts the switch and the ranks, ``cpu`` the CPU use during each size's
timed calls, ``report`` the nccl-tests style table, JSON and plot, ``cli`` the
subcommand, and ``calibrate`` ``inalab calibrate`` (sweeps whose measurements fit a
dynamiccl profile). ``replay`` is ``inalab replay`` (a training iteration's calls, from
``workloads``, under static, model, agent and oracle strategies), with ``replay_setup``
(its flags as pure data), ``replay_worker`` (its ranks) and ``replay_report`` (oracle,
table, JSON, plot). Importing this package starts nothing and does not import torch.
"""

from emulation.bench.config import DEFAULT_BENCH_LANES, BenchConfig, parse_size, size_sweep

__all__ = ["DEFAULT_BENCH_LANES", "BenchConfig", "parse_size", "size_sweep"]
