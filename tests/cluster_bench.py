"""INA through reduction servers against Gloo's ring on a namespace cluster (issue #22's
performance figures): run as root, prints a table and writes JSON.

    sudo .venv/bin/python tests/cluster_bench.py --size 64M --calls 5 --json out.json

The cluster (``tests/cluster.py``): four worker machines at ``--worker-mbit`` and
aggregator machines on one Linux bridge, every link shaped by HTB. Three set-ups, one
after another on fresh clusters: Gloo's ring allreduce (torch.distributed, TCP) between
the workers; INA through one ``inalab switch --one-armed`` at ``--agg-mbit``; INA
striped across two aggregators at half that rate each (``--setups``: which of them; its
``rdma`` adds INA over RoCEv2 through one one-armed aggregator serving ``--roce``, the
``"ina"`` torch backend's ranks on emulated RNICs, ``INALAB_TRANSPORT=rdma``). Each runs
``--warmup`` + ``--calls`` int32 allreduces of ``--size`` bytes per rank; a row's time
is the slowest rank's mean over the timed calls. Bytes per call are the veths' counters
over all calls divided by their number, beside the theory (INA: a worker sends and
receives the message once, in frames of 4 x lanes bytes with INA's 16-byte header and
UDP, IPv4 and Ethernet's 42; an aggregator n/K times that; ring: 2(n-1)/n of the
message, TCP's headers not counted). With the kernel's BPF statistics on, the
aggregator's program time per frame is read from its program's fdinfo (``run_time_ns /
run_cnt``): where the aggregator's time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from cluster import Cluster, Machine, one_armed_server  # noqa: E402

from emulation.argtypes import size as size_argument  # noqa: E402
from hostlib.protocol import (  # noqa: E402
    HEADER_SIZE,
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_RETH_SIZE,
)

WORKERS = 4
JOB = 9
WIRE_HEADERS = 14 + 20 + 8
"""Ethernet, IPv4 and UDP headers of each INA datagram, as a veth counts its bytes."""


def _counters(machine: Machine) -> tuple[int, int]:
    """(bytes the machine sent, bytes it received), from the bridge's end of its veth."""
    base = Path("/sys/class/net") / machine.outside / "statistics"
    return int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text())


def _prog_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs process ``pid`` holds."""
    ns = cnt = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        with contextlib.suppress(OSError):
            info = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                if ":\t" in line
            )
            if "prog_type" in info and "run_cnt" in info:
                ns += int(info["run_time_ns"])
                cnt += int(info["run_cnt"])
    return ns, cnt


@contextlib.contextmanager
def _bpf_stats() -> Iterator[None]:
    path = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


def _run_all(argvs: list[list[str]], env: dict[str, str]) -> list[dict[str, Any]]:
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for a in argvs]  # fmt: skip
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed ({p.returncode}): {out[-2000:]} {err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def _row(name: str, reports: list[dict[str, Any]], warmup: int, size: int) -> dict[str, Any]:
    timed = [r["seconds"][warmup:] for r in reports]
    seconds = max(sum(t) / len(t) for t in timed)
    return {"setup": name, "size_bytes": size, "time_s": round(seconds, 4),
            "algbw_gbit_s": round(size * 8 / seconds / 1e9, 3)}  # fmt: skip


def _traffic(row: dict[str, Any], machines: list[Machine], before: dict[str, tuple[int, int]],
             calls: int) -> None:  # fmt: skip
    for m in machines:
        sent, got = _counters(m)
        row[f"{m.name}_sent_per_call"] = (sent - before[m.name][0]) // calls
        row[f"{m.name}_received_per_call"] = (got - before[m.name][1]) // calls


def gloo(args: argparse.Namespace, size: int) -> dict[str, Any]:
    names = {f"w{r}": r + 1 for r in range(WORKERS)}
    rates = dict.fromkeys(names, args.worker_mbit)
    with Cluster(names, net=79, rates=rates, mtu=args.mtu) as c:
        machines = [c[f"w{r}"] for r in range(WORKERS)]
        before = {m.name: _counters(m) for m in machines}
        env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "eth0",
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        argvs = [
            m.command(
                [
                    sys.executable,
                    __file__,
                    "gloo-worker",
                    json.dumps(
                        {
                            "rank": r,
                            "world": WORKERS,
                            "master": machines[0].ip,
                            "elements": size // 4,
                            "calls": args.warmup + args.calls,
                        }
                    ),
                ]
            )
            for r, m in enumerate(machines)
        ]
        reports = _run_all(argvs, env)
        row = _row("gloo ring (TCP)", reports, args.warmup, size)
        _traffic(row, machines, before, args.warmup + args.calls)
    ring = 2 * (WORKERS - 1) / WORKERS * size
    row["theory_worker_each_way"] = int(ring)
    return row


def ina(
    args: argparse.Namespace, size: int, aggregators: int, tls: Path, run: Path
) -> dict[str, Any]:
    from controller.switch import SwitchController, WorkerAddress
    from controller.tls import TlsFiles

    names = {f"w{r}": r + 1 for r in range(WORKERS)} | {
        f"agg{k}": 100 + k for k in range(aggregators)
    }
    agg_mbit = args.agg_mbit / aggregators
    rates = dict.fromkeys(names, args.worker_mbit) | {
        f"agg{k}": agg_mbit for k in range(aggregators)
    }
    ctl_tls = TlsFiles.parse(f"{tls}/ctl.crt,{tls}/ctl.key,{tls}/ca.crt")
    with Cluster(names, net=80, rates=rates, mtu=args.mtu) as c, contextlib.ExitStack() as stack:
        workers = [c[f"w{r}"] for r in range(WORKERS)]
        aggs = [c[f"agg{k}"] for k in range(aggregators)]
        files = f"{tls}/switch.crt,{tls}/switch.key,{tls}/ca.crt"
        servers = [
            stack.enter_context(one_armed_server(a, run / a.name, files, "--lanes",
                                                 str(args.lanes), "--slots", "256"))
            for a in aggs
        ]  # fmt: skip
        for k, s in enumerate(servers):
            ctl = stack.enter_context(SwitchController.connect(s["p4runtime"], tls=ctl_tls))
            ctl.add_job(JOB, [WorkerAddress(w.ip, 41000 + 100 * k + r)
                              for r, w in enumerate(workers)], args.slots)  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argvs = []
        for r, w in enumerate(workers):
            binds = [[w.ip, 41000 + 100 * k + r] for k in range(aggregators)]
            switches = [s["data"] for s in servers]
            spec = {"bind": binds if aggregators > 1 else binds[0],
                    "switch": switches if aggregators > 1 else switches[0], "job": JOB,
                    "rank": r, "workers": WORKERS, "lanes": args.lanes, "slots": args.slots,
                    "elements": size // 4, "dtype": "int32", "calls": args.warmup + args.calls,
                    "seed": 1, "deadline": 60.0}  # fmt: skip
            argvs.append(w.command([sys.executable, str(REPO / "tests" / "ina_worker.py"),
                                    json.dumps(spec)]))  # fmt: skip
        machines = workers + aggs
        before = {m.name: _counters(m) for m in machines}
        progs_before = [_prog_stats(s["proc"].pid) for s in servers]
        with _bpf_stats():
            reports = _run_all(argvs, env)
            progs_after = [_prog_stats(s["proc"].pid) for s in servers]
        calls = args.warmup + args.calls
        if len({tuple(r["sha256"]) for r in reports}) != 1:
            raise RuntimeError("the ranks' results differ")
        row = _row(f"ina, {aggregators} aggregator(s) at {agg_mbit:g} Mbit/s", reports,
                   args.warmup, size)  # fmt: skip
        row["retransmissions"] = sum(r["retransmissions"] for r in reports)
        _traffic(row, machines, before, calls)
        for k, (b, a) in enumerate(zip(progs_before, progs_after, strict=True)):
            runs = a[1] - b[1]
            row[f"agg{k}_program_ns_per_frame"] = round((a[0] - b[0]) / runs) if runs else None
            row[f"agg{k}_frames_per_call"] = runs // calls
    packets = -(-size // 4 // args.lanes)  # the last block padded to full lanes
    one_way = packets * (WIRE_HEADERS + HEADER_SIZE + 4 * args.lanes)
    row["theory_worker_each_way"] = one_way
    row["theory_aggregator_each_way"] = WORKERS * one_way // aggregators
    return row


def ina_rdma(args: argparse.Namespace, size: int, tls: Path, run: Path) -> dict[str, Any]:
    """INA over RoCEv2 through one ``inalab switch --one-armed eth0 --roce`` at
    ``--agg-mbit``: ``"ina"`` torch ranks (``tests/torch_worker.py``) on emulated RNICs,
    configured by ``INALAB_TRANSPORT=rdma`` and the other ``INALAB_*`` variables; rank 0
    installs the job and its queue pairs."""
    names = {f"w{r}": r + 1 for r in range(WORKERS)} | {"agg0": 100}
    rates = dict.fromkeys(names, args.worker_mbit) | {"agg0": args.agg_mbit}
    lanes, m = args.rdma_lanes, args.msg_packets
    with Cluster(names, net=80, rates=rates, mtu=args.mtu) as c:
        workers, agg = [c[f"w{r}"] for r in range(WORKERS)], c["agg0"]
        files = f"{tls}/switch.crt,{tls}/switch.key,{tls}/ca.crt"
        with one_armed_server(agg, run / "rdma-agg0", files, "--roce", "--lanes", str(lanes),
                              "--slots", "256") as server:  # fmt: skip
            host, port = server["data"]
            base = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
                    "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
                    "WORLD_SIZE": str(WORKERS), "MASTER_ADDR": workers[0].ip,
                    "MASTER_PORT": "29512", "INALAB_TRANSPORT": "rdma",
                    "INALAB_MSG_PACKETS": str(m), "INALAB_SWITCH": f"{host}:{port}",
                    "INALAB_P4RUNTIME": server["p4runtime"],
                    "INALAB_P4RUNTIME_TLS": f"{tls}/ctl.crt,{tls}/ctl.key,{tls}/ca.crt",
                    "INALAB_JOB": str(JOB), "INALAB_SLOTS": str(args.slots),
                    "INALAB_DEADLINE": "60"}  # fmt: skip
            spec = json.dumps({"elements": size // 4, "calls": args.warmup + args.calls,
                               "seed": 1})  # fmt: skip
            machines = [*workers, agg]
            before = {mc.name: _counters(mc) for mc in machines}
            procs = [
                subprocess.Popen(w.command([sys.executable, str(REPO / "tests" / "torch_worker.py"),
                                            spec]),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**base, "RANK": str(r)})
                for r, w in enumerate(workers)
            ]  # fmt: skip
            reports = []
            for p in procs:
                out, err = p.communicate(timeout=1800)
                if p.returncode != 0:
                    raise RuntimeError(f"a rank failed ({p.returncode}): {err[-3000:]}")
                reports.append(json.loads(out.strip().splitlines()[-1]))
        if len({tuple(r["sha256"]) for r in reports}) != 1:
            raise RuntimeError("the ranks' results differ")
        row = _row(f"ina over RoCEv2 (emulated RNIC), 1 aggregator at {args.agg_mbit:g} Mbit/s",
                   reports, args.warmup, size)  # fmt: skip
        _traffic(row, machines, before, args.warmup + args.calls)
    row["theory_worker_each_way"] = rdma_bytes(size, lanes, m)
    row["theory_aggregator_each_way"] = WORKERS * row["theory_worker_each_way"]
    row["message_wire_bytes"] = rdma_bytes(4 * m * lanes, lanes, m)
    for r, report in enumerate(reports):
        row[f"w{r}_retransmissions"] = report["retransmissions"]
    return row


def rdma_bytes(size: int, lanes: int, m: int) -> int:
    """Bytes on the wire each way per worker and call over RoCEv2: messages of ``m``
    packets of ``lanes`` lanes (the last block padded to a whole message), each packet
    with Ethernet, IPv4, UDP, BTH and ICRC (42 + 16), a message's first with a RETH (16)
    and its last with an ImmDt (4)."""
    messages = -(-size // 4 // (m * lanes))
    return messages * (m * (WIRE_HEADERS + ROCE_BTH_SIZE + ROCE_ICRC_SIZE + 4 * lanes)
                       + ROCE_RETH_SIZE + ROCE_IMMDT_SIZE)  # fmt: skip


def gloo_worker(spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{spec['master']}:29511",
                            rank=spec["rank"], world_size=spec["world"])  # fmt: skip
    x = torch.ones(spec["elements"], dtype=torch.int32)
    seconds = []
    for _ in range(spec["calls"]):
        dist.barrier()
        start = time.monotonic()
        dist.all_reduce(x)
        seconds.append(time.monotonic() - start)
    dist.destroy_process_group()
    print(json.dumps({"rank": spec["rank"], "seconds": seconds}), flush=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "gloo-worker":
        gloo_worker(json.loads(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=size_argument, default="64M",
                        help="bytes per rank (default 64M)")  # fmt: skip
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=2048,
                        help="INA lanes per packet (default 2048: jumbo frames)")  # fmt: skip
    parser.add_argument("--mtu", type=int, default=9000, help="every link's MTU")
    parser.add_argument("--slots", type=int, default=16, help="the job's window per aggregator")
    parser.add_argument("--worker-mbit", type=float, default=1000.0)
    parser.add_argument("--agg-mbit", type=float, default=4000.0,
                        help="one aggregator's link; two get half each")  # fmt: skip
    parser.add_argument("--setups", default="gloo,ina1,ina2",
                        help="comma list of gloo, ina1, ina2 (one or two aggregators) and rdma"
                        " (INA over RoCEv2, one aggregator) (default gloo,ina1,ina2)")  # fmt: skip
    parser.add_argument("--rdma-lanes", type=int, default=1024,
                        help="rdma: lanes per packet, a path MTU (default 1024)")  # fmt: skip
    parser.add_argument("--msg-packets", type=int, default=2,
                        help="rdma: packets per RDMA message (default 2)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = args.size
    with tempfile.TemporaryDirectory(prefix="inalab-cluster-bench-") as tmp:
        tls, run = Path(tmp) / "pki", Path(tmp)
        ips = ",".join(f"10.80.0.{100 + k}" for k in range(2))
        subprocess.run(["bash", str(REPO / "examples" / "make-certs.sh"), str(tls),
                        f"switch:{ips}", "ctl"], check=True, capture_output=True)  # fmt: skip
        setups = {
            "gloo": lambda: gloo(args, size),
            "ina1": lambda: ina(args, size, 1, tls, run),
            "ina2": lambda: ina(args, size, 2, tls, run),
            "rdma": lambda: ina_rdma(args, size, tls, run),
        }
        chosen = args.setups.split(",")
        if unknown := [s for s in chosen if s not in setups]:
            parser.error(f"--setups: unknown {', '.join(unknown)} (of {', '.join(setups)})")
        rows = [setups[s]() for s in chosen]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        meta = vars(args) | {"json": str(args.json)}
        args.json.write_text(json.dumps({"rows": rows, "args": meta}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
