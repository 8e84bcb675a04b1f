"""inalab ctl: inspect and configure an INA switch (soft switch or bmv2) over P4Runtime.

Subcommands (simple_switch_CLI and p4runtime-shell users will recognise the reads):

- ``jobs``: the installed jobs, read from the switch's tables;
- ``add-job --job J --slots N IP:PORT ...``: install a job, rank r = the r-th address;
  ``--shared N [--region SIZE] --fallback IP:PORT`` gives it N more slots in the
  switch's shared region and a fallback aggregator (docs/sharing.md);
- ``add-behind --job J --workers N --slots S IP:PORT``: install job J on this switch as the
  fallback aggregator of the switch at IP:PORT;
- ``remove-job --job J``: tear a job down and clear its slots;
- ``set-upstream --job J --rank R IP:PORT [--mac MAC --port P]``: make the switch a leaf
  of hierarchical aggregation for job J (its partial sums go to the upstream switch at
  IP:PORT, as rank R there); ``remove-upstream --job J`` undoes it;
- ``show-bitmap --job J --slot S``: one slot's registers in both sets (bitmaps, ranks
  seen, remaining, seq, exponent, lane values);
- ``stats``: the switch's counters, and each sharing job's;
- ``drops [--ingress P --egress P]``: show or set the drop simulator.

The switch is ``--switch HOST:PORT`` (default: ``inalab switch``'s 127.0.0.1:9559) or the
one named in a run manifest (``--manifest PATH``: the ready file ``inalab switch
--ready-file`` writes, or a file with a ``switches`` mapping, chosen by ``--name``).
Reading needs no mastership; writing arbitrates with ``--election-id`` (another
controller holding the same id is refused: pick a higher one to take over).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from controller.tls import TLS_ENV, TlsError, TlsFiles, tls_argument

__all__ = ["ManifestError", "add_arguments", "resolve_switch", "run"]

DEFAULT_SWITCH = "127.0.0.1:9559"


class ManifestError(ValueError):
    """A run manifest that cannot be read or does not name the switch."""


def _endpoint(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT with a port 1..65535")
    return text


def _worker(text: str) -> tuple[str, int]:
    import ipaddress

    ip, port = _endpoint(text).rsplit(":", 1)
    try:
        ip = str(ipaddress.IPv4Address(ip))
    except ValueError:
        raise argparse.ArgumentTypeError(f"worker {text!r}: {ip!r} is not IPv4") from None
    return ip, int(port)


def _election(text: str) -> tuple[int, int]:
    high, sep, low = text.partition(":")
    if not sep:
        high, low = "0", text
    if not (high.isdigit() and low.isdigit()) or int(high) >= 2**64 or int(low) >= 2**64:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOW or HIGH:LOW (unsigned 64-bit)")
    return int(high), int(low)


def _nonneg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def _mac(text: str) -> str:
    import re

    if not re.fullmatch(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a MAC address (xx:xx:xx:xx:xx:xx)")
    return text


def _probability(text: str) -> float:
    try:
        p = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"probability {p} outside 0..1")
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``inalab ctl`` options and subcommands on ``parser``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--switch", type=_endpoint, metavar="HOST:PORT",
        help=f"the switch's P4Runtime server (default {DEFAULT_SWITCH})",
    )  # fmt: skip
    where.add_argument(
        "--manifest", type=Path, metavar="PATH",
        help="run manifest naming the switch (inalab switch --ready-file writes one)",
    )  # fmt: skip
    parser.add_argument("--name", help="switch name in a manifest with several switches")
    parser.add_argument("--device-id", type=_nonneg, help="P4Runtime device id (default 0)")
    parser.add_argument(
        "--thrift", type=_endpoint, metavar="HOST:PORT",
        help="bmv2's Thrift server, for register reads and writes (bmv2 only)",
    )  # fmt: skip
    parser.add_argument(
        "--election-id", type=_election, default=(0, 1), metavar="[HIGH:]LOW",
        help="election id for writes (default 0:1)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds per request (default 5)"
    )
    parser.add_argument(
        "--tls", type=tls_argument, metavar="CERT,KEY,CA",
        help="mutual TLS: this controller's certificate and key, and the CA that signed the "
        f"switch's (PEM files; default ${TLS_ENV}); required for a switch not on loopback",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="ctl_command", required=True, metavar="SUBCOMMAND")

    jobs = sub.add_parser("jobs", help="list the installed jobs")
    jobs.add_argument("--json", action="store_true", help="print JSON")

    add = sub.add_parser("add-job", help="install a job (rank r = the r-th worker)")
    add.add_argument("--job", type=_nonneg, required=True, help="job id 0..65535")
    add.add_argument("--slots", type=_nonneg, default=256, help="slots per set (default 256)")
    add.add_argument("--slot-base", type=_nonneg, help="first slot (default: lowest free)")
    add.add_argument(
        "--shared", type=_nonneg, default=0, metavar="N",
        help="N more slots in the switch's shared region, best effort (default 0)",
    )  # fmt: skip
    add.add_argument(
        "--region", type=_nonneg, metavar="SIZE",
        help="slots of the shared region, a power of two, made at the top of the pool if "
        "the switch has none (default: the switch's, or --shared rounded up)",
    )  # fmt: skip
    add.add_argument(
        "--fallback", type=_worker, metavar="IP:PORT",
        help="the job's fallback aggregator: what collides or does not fit goes there",
    )  # fmt: skip
    add.add_argument("--fallback-mac", type=_mac, default="00:00:00:00:00:00")
    add.add_argument(
        "--fallback-port", type=_nonneg, default=0, help="switch port toward the fallback"
    )
    add.add_argument("workers", type=_worker, nargs="+", metavar="IP:PORT")

    behind = sub.add_parser(
        "add-behind", help="install a job as the fallback aggregator of another switch"
    )
    behind.add_argument("--job", type=_nonneg, required=True, help="job id 0..65535")
    behind.add_argument("--workers", type=_nonneg, required=True, help="the job's ranks")
    behind.add_argument("--slots", type=_nonneg, default=256, help="its whole window")
    behind.add_argument("--mac", type=_mac, default="00:00:00:00:00:00", help="switch's MAC")
    behind.add_argument("--port", type=_nonneg, default=0, help="port toward the switch")
    behind.add_argument("address", type=_worker, metavar="IP:PORT", help="switch's INA address")

    remove = sub.add_parser("remove-job", help="tear a job down and clear its slots")
    remove.add_argument("--job", type=_nonneg, required=True)

    up = sub.add_parser(
        "set-upstream", help="send a job's partial sums to an upstream switch (hierarchy)"
    )
    up.add_argument("--job", type=_nonneg, required=True)
    up.add_argument(
        "--rank", type=_nonneg, required=True, help="this switch's rank in the upstream's job"
    )
    up.add_argument("--mac", type=_mac, default="00:00:00:00:00:00", help="upstream's MAC")
    up.add_argument("--port", type=_nonneg, default=0, help="switch port toward the upstream")
    up.add_argument("address", type=_worker, metavar="IP:PORT", help="upstream's INA address")

    no_up = sub.add_parser("remove-upstream", help="aggregate a job on this switch alone again")
    no_up.add_argument("--job", type=_nonneg, required=True)

    show = sub.add_parser("show-bitmap", help="one slot's registers in both sets")
    show.add_argument("--job", type=_nonneg, required=True)
    show.add_argument("--slot", type=_nonneg, required=True, help="job-relative slot")
    show.add_argument(
        "--lanes", type=_nonneg, default=8, help="lane values to print (default 8, 0: all)"
    )
    show.add_argument("--json", action="store_true", help="print JSON (every lane)")

    stats = sub.add_parser("stats", help="the switch's counters")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument("--all", action="store_true", help="include counters that are 0")

    drops = sub.add_parser("drops", help="show or set the drop simulator")
    drops.add_argument("--ingress", type=_probability, metavar="P")
    drops.add_argument("--egress", type=_probability, metavar="P")


def resolve_switch(args: argparse.Namespace) -> tuple[str, int, str | None]:
    """(P4Runtime address, device id, Thrift address) from the flags or the manifest.

    Raises:
        ManifestError: the manifest cannot be read or does not name one switch.
    """
    address, device_id, thrift = args.switch or DEFAULT_SWITCH, 0, None
    if args.manifest is not None:
        entry = _manifest_entry(args.manifest, args.name)
        address = str(entry["p4runtime"])
        device_id = int(entry.get("device_id", 0))
        thrift = entry.get("thrift")
    if args.device_id is not None:
        device_id = args.device_id
    return address, device_id, args.thrift or thrift


def _manifest_entry(path: Path, name: str | None) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ManifestError(f"manifest {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"manifest {path} is not a JSON object")
    if "switches" in doc:
        switches = doc["switches"]
        if name is None and isinstance(switches, dict) and len(switches) == 1:
            name = next(iter(switches))
        if name is None or not isinstance(switches, dict) or name not in switches:
            known = ", ".join(switches) if isinstance(switches, dict) else "none"
            raise ManifestError(f"manifest {path}: name one switch with --name ({known})")
        doc = switches[name]
    if not isinstance(doc, dict) or "p4runtime" not in doc:
        raise ManifestError(f"manifest {path} names no P4Runtime address ('p4runtime')")
    return doc


_WRITES = {"add-job", "add-behind", "remove-job", "set-upstream", "remove-upstream"}


def run(args: argparse.Namespace) -> int:
    """Run one ``inalab ctl`` subcommand; 0 on success, 1 on a refused request."""
    from controller.bmv2_thrift import ThriftError
    from controller.client import P4RuntimeError
    from controller.switch import ControllerError, SwitchController

    try:
        address, device_id, thrift = resolve_switch(args)
    except ManifestError as exc:
        return _error(str(exc), 2)
    writes = args.ctl_command in _WRITES or (
        args.ctl_command == "drops" and (args.ingress is not None or args.egress is not None)
    )
    try:
        tls = args.tls if args.tls is not None else TlsFiles.from_env(os.environ)
    except TlsError as exc:
        return _error(f"${TLS_ENV}: {exc}", 2)
    try:
        with SwitchController.connect(
            address,
            device_id=device_id,
            election_id=args.election_id,
            timeout=args.timeout,
            thrift=thrift,
            arbitrate=writes,
            tls=tls,
        ) as ctl:
            if writes and not ctl.is_primary:
                return _error(f"not primary at {address} with election id {args.election_id}")
            return _COMMANDS[args.ctl_command](ctl, args)
    except (P4RuntimeError, ThriftError, ControllerError, ValueError) as exc:
        return _error(f"{address}: {exc}")


def _jobs(ctl: Any, args: argparse.Namespace) -> int:
    jobs = ctl.installed_jobs()
    if args.json:
        print(json.dumps([_job_doc(j) for j in jobs], indent=2))
        return 0
    if not jobs:
        print("no jobs")
        return 0
    print(f"{'job':>6} {'workers':>7} {'slots':>13} {'mgid':>5}  ranks")
    for job in jobs:
        e = job.entry
        ranks = ", ".join(f"{w.rank}={w.ip}:{w.udp_port}" for w in job.workers)
        span = f"{e.slot_base}+{e.slot_count}"
        up = job.upstream
        above = "" if up is None else f"; upstream rank {up.rank} at {up.ip}:{up.udp_port}"
        print(f"{e.job_id:>6} {e.num_workers:>7} {span:>13} {e.mgid:>5}  {ranks}{above}"
              f"{_sharing_text(job)}")  # fmt: skip
    return 0


def _sharing_text(job: Any) -> str:
    out = ""
    if job.shared is not None:
        s = job.shared
        out += f"; {s.count} shared in region {s.base}+{s.size} from {s.offset}"
    if job.fallback is not None:
        out += f"; fallback {job.fallback.ip}:{job.fallback.udp_port}"
    if job.behind:
        out += "; fallback aggregator behind the switch"
    return out


def _job_doc(job: Any) -> dict[str, Any]:
    e = job.entry
    return {
        "job_id": e.job_id,
        "num_workers": e.num_workers,
        "slot_base": e.slot_base,
        "slot_count": e.slot_count,
        "mgid": e.mgid,
        "workers": [[w.rank, w.ip, w.udp_port] for w in job.workers],
        "replicas": [[r.rid, r.egress_port, r.ip, r.udp_port] for r in job.replicas],
        "upstream": None
        if job.upstream is None
        else {
            "rank": job.upstream.rank,
            "ip": job.upstream.ip,
            "udp_port": job.upstream.udp_port,
            "mac": job.upstream.mac,
            "egress_port": job.upstream.egress_port,
        },
        "shared": None
        if job.shared is None
        else {k: getattr(job.shared, k) for k in ("count", "base", "size", "offset")},
        "fallback": None
        if job.fallback is None
        else {k: getattr(job.fallback, k) for k in ("ip", "udp_port", "mac", "egress_port")},
        "behind": job.behind,
    }


def _add_job(ctl: Any, args: argparse.Namespace) -> int:
    from controller.switch import WorkerAddress

    workers = [WorkerAddress(ip, port) for ip, port in args.workers]
    fallback = None
    if args.fallback is not None:
        ip, udp_port = args.fallback
        fallback = WorkerAddress(ip, udp_port, args.fallback_mac, args.fallback_port)
    job = ctl.add_job(args.job, workers, args.slots, args.slot_base, shared=args.shared,
                      region=args.region, fallback=fallback)  # fmt: skip
    e = job.entry
    print(f"job {e.job_id}: {e.num_workers} workers, slots {e.slot_base}+{e.slot_count}, "
          f"multicast group {e.mgid}{_sharing_text(job)}")  # fmt: skip
    return 0


def _add_behind(ctl: Any, args: argparse.Namespace) -> int:
    from controller.switch import WorkerAddress

    ip, udp_port = args.address
    switch = WorkerAddress(ip, udp_port, args.mac, args.port)
    job = ctl.add_behind(args.job, args.workers, args.slots, switch)
    e = job.entry
    print(f"job {e.job_id}: fallback aggregator of {switch.ip}:{switch.udp_port}, "
          f"{e.num_workers} workers, slots {e.slot_base}+{e.slot_count}")  # fmt: skip
    return 0


def _remove_job(ctl: Any, args: argparse.Namespace) -> int:
    job = ctl.remove_job(args.job)
    e = job.entry
    print(f"job {e.job_id} removed; slots {e.slot_base}+{e.slot_count} cleared")
    return 0


def _set_upstream(ctl: Any, args: argparse.Namespace) -> int:
    from controller.switch import WorkerAddress

    ip, udp_port = args.address
    up = ctl.set_upstream(args.job, args.rank, WorkerAddress(ip, udp_port, args.mac, args.port))
    print(f"job {up.job_id}: partial sums go to {up.ip}:{up.udp_port} as rank {up.rank}")
    return 0


def _remove_upstream(ctl: Any, args: argparse.Namespace) -> int:
    up = ctl.remove_upstream(args.job)
    print(f"job {up.job_id}: upstream {up.ip}:{up.udp_port} removed")
    return 0


def _show_bitmap(ctl: Any, args: argparse.Namespace) -> int:
    reads = [ctl.read_slot(args.job, args.slot, pool_set) for pool_set in (0, 1)]
    if args.json:
        docs = [
            {
                "set": r.pool_set, "bitmap": r.bitmap, "ranks": r.ranks(),
                "remaining": r.remaining, "seq": r.seq, "exponent": r.exponent,
                "final": r.final, "values": list(r.values),
            }
            for r in reads
        ]  # fmt: skip
        print(json.dumps({"job": args.job, "slot": args.slot, "sets": docs}, indent=2))
        return 0
    job = ctl.jobs.get(args.job)
    print(f"job {args.job} slot {args.slot} (switch slot {job.slot_base + args.slot}), "
          f"{job.num_workers} workers")  # fmt: skip
    shown = len(reads[0].values) if args.lanes == 0 else min(args.lanes, len(reads[0].values))
    for r in reads:
        bits = format(r.bitmap, f"0{job.num_workers}b")[::-1]  # rank 0 first
        state = "idle" if r.seq == 0 else ("done" if r.remaining == 0 else "running")
        if r.final and state == "done":
            state = "done, final: the upstream's result"
        values = " ".join(str(v) for v in r.values[:shown])
        more = f" ... ({len(r.values)} lanes)" if shown < len(r.values) else ""
        print(f"  set {r.pool_set}: bitmap {bits} ranks {r.ranks()} remaining {r.remaining} "
              f"seq {r.seq} exponent {r.exponent} [{state}]")  # fmt: skip
        print(f"         values {values}{more}")
    return 0


def _stats(ctl: Any, args: argparse.Namespace) -> int:
    counters = ctl.counters()
    sharing = [j for j in ctl.installed_jobs() if j.shared or j.fallback]
    per_job = {str(j.job_id): ctl.job_counters(j.job_id) for j in sharing}
    if args.json:
        print(json.dumps(counters | ({"jobs": per_job} if per_job else {}), indent=2))
        return 0
    for name, value in counters.items():
        if value or args.all or not name.startswith("drop_"):
            print(f"{name:<22} {value}")
    if per_job:
        print(f"\n{'job':>6} {'reserved':>9} {'shared':>7} {'shared uses':>12} "
              f"{'collisions':>11} {'to fallback':>12} {'from fallback':>14}")  # fmt: skip
        for job in sharing:
            c = per_job[str(job.job_id)]
            shared = 0 if job.shared is None else job.shared.count
            print(f"{job.job_id:>6} {job.entry.slot_count:>9} {shared:>7} "
                  f"{c['shared_uses']:>12} {c['collisions']:>11} {c['to_fallback']:>12} "
                  f"{c['from_fallback']:>14}")  # fmt: skip
    return 0


def _drops(ctl: Any, args: argparse.Namespace) -> int:
    if args.ingress is not None or args.egress is not None:
        current = ctl.drop_simulator.get()
        ingress = current[0] if args.ingress is None else args.ingress
        egress = current[1] if args.egress is None else args.egress
        ctl.set_drops(ingress, egress)
    ingress, egress = ctl.drop_simulator.get()
    print(f"ingress {ingress:.6g} egress {egress:.6g}")
    return 0


_COMMANDS = {
    "jobs": _jobs,
    "add-job": _add_job,
    "add-behind": _add_behind,
    "remove-job": _remove_job,
    "set-upstream": _set_upstream,
    "remove-upstream": _remove_upstream,
    "show-bitmap": _show_bitmap,
    "stats": _stats,
    "drops": _drops,
}


def _error(message: str, status: int = 1) -> int:
    print(f"inalab ctl: error: {message}", file=sys.stderr)
    return status
