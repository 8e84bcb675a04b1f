"""inalab switch: run the software INA switch on a UDP socket with a control socket.

With ``--ready-file`` the switch writes ``{data, control, pid, lanes, slots}`` as JSON once
both sockets are bound (atomically, so a reader never sees half a file); this is how
:class:`emulation.softswitch.process.SoftSwitchProcess` learns the ports it got.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from emulation.argtypes import int_in, probability
from emulation.softswitch.pcap import PcapWriter
from emulation.softswitch.pipeline import (
    Addr,
    DropSimulator,
    JobConfig,
    JobTableError,
    Pipeline,
)
from emulation.softswitch.server import SwitchServer
from hostlib.protocol import (
    INA_UDP_PORT,
    LANES_PER_PACKET,
    MAX_LANES,
    SLOT_MASK,
    SWITCH_SLOTS,
)

__all__ = ["DEFAULT_CONTROL_PORT", "add_arguments", "main", "parse_addr", "parse_job", "run"]

log = logging.getLogger(__name__)

DEFAULT_CONTROL_PORT = INA_UDP_PORT + 1
"""20034: the control channel sits next to the data port by convention only."""


def parse_addr(text: str) -> Addr:
    """Parse ``HOST:PORT`` (port 0 lets the kernel choose).

    Raises:
        argparse.ArgumentTypeError: no colon, or a port that is not 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    if not port.isdigit() or int(port) > 0xFFFF:
        raise argparse.ArgumentTypeError(f"port {port!r} in {text!r} is not 0..65535")
    return host, int(port)


def parse_job(text: str) -> JobConfig:
    """Parse ``JOB_ID:SLOTS:IP:PORT,IP:PORT,...`` (rank = position in the list).

    Raises:
        argparse.ArgumentTypeError: a missing part, a non-integer id, count or port, or a
            worker address that is not IPv4.
    """
    parts = text.split(":", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not JOB_ID:SLOTS:IP:PORT,...")
    workers = []
    for item in parts[2].split(","):
        ip, port = parse_addr(item)
        try:
            # Normalised: the pipeline compares with recvfrom()'s dotted quad.
            ip = str(ipaddress.IPv4Address(ip))
        except ValueError:
            raise argparse.ArgumentTypeError(f"worker {item!r}: {ip!r} is not IPv4") from None
        if port == 0:
            raise argparse.ArgumentTypeError(f"worker {item!r} needs a port, not 0")
        workers.append((ip, port))
    return JobConfig(int(parts[0]), tuple(workers), int(parts[1]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``inalab switch`` options on ``parser``."""
    a = parser.add_argument
    a(
        "--listen",
        type=parse_addr,
        default=("127.0.0.1", INA_UDP_PORT),
        metavar="HOST:PORT",
        help=f"UDP data address (default 127.0.0.1:{INA_UDP_PORT}; port 0 = any free)",
    )
    a(
        "--control",
        type=parse_addr,
        default=("127.0.0.1", DEFAULT_CONTROL_PORT),
        metavar="HOST:PORT",
        help=f"TCP control address (default 127.0.0.1:{DEFAULT_CONTROL_PORT})",
    )
    a(
        "--lanes",
        type=int_in(1, MAX_LANES),
        default=LANES_PER_PACKET,
        help=f"int32 lanes per packet (default {LANES_PER_PACKET})",
    )
    a(
        "--slots",
        type=int_in(1, SLOT_MASK + 1),
        default=SWITCH_SLOTS,
        help=f"slots per set in the switch pool (default {SWITCH_SLOTS})",
    )
    a(
        "--drop-ingress",
        type=probability(),
        default=0.0,
        metavar="P",
        help="drop probability at ingress (default 0)",
    )
    a(
        "--drop-egress",
        type=probability(),
        default=0.0,
        metavar="P",
        help="drop probability per result replica at egress (default 0)",
    )
    a("--seed", type=int, default=0, help="seed of the drop simulator (default 0)")
    a(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="write {data, control, pid, lanes, slots} as JSON here once listening",
    )
    a(
        "--pcap",
        type=Path,
        metavar="PATH",
        help="record every datagram received and sent to this pcap (IPv4/UDP/INA)",
    )
    a(
        "--pcap-count",
        type=int_in(0),
        default=0,
        metavar="N",
        help="stop recording after N packets (default 0: no limit)",
    )
    a(
        "--job",
        type=parse_job,
        action="append",
        default=[],
        metavar="JOB_ID:SLOTS:IP:PORT,...",
        help="install a job at start-up (repeatable); rank = position in the worker list",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m emulation.softswitch.cli``: ``inalab switch`` without the other
    subcommands' imports, so a switch subprocess starts fast and alone.
    """
    parser = argparse.ArgumentParser(prog="inalab switch", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    add_arguments(parser)
    args = parser.parse_args(argv)
    # The same levels and format as emulation.cli, so logs read alike.
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the switch until SIGTERM/SIGINT or a ``shutdown`` request; return exit status."""
    drops = DropSimulator(args.drop_ingress, args.drop_egress, args.seed)
    pipeline = Pipeline(args.lanes, args.slots, drops)
    try:
        for job in args.job:
            base = pipeline.add_job(job)
            log.info(
                "job %d: %d workers, slots %d+%d", job.job_id, job.num_workers, base, job.slot_count
            )
    except JobTableError as exc:
        return _usage_error(f"--job: {exc}")
    try:
        pcap = PcapWriter(args.pcap, args.pcap_count) if args.pcap is not None else None
    except OSError as exc:
        return _usage_error(f"--pcap: {exc}", status=1)
    try:
        server = SwitchServer(pipeline, args.listen, args.control, pcap=pcap)
    except OSError as exc:
        if pcap is not None:
            pcap.close()
        return _usage_error(f"cannot bind {args.listen} / {args.control}: {exc}", status=1)
    with server:
        server.install_signal_handlers()
        if args.ready_file is not None:
            _write_ready_file(args.ready_file, server)
        server.serve_forever()
    return 0


def _usage_error(message: str, status: int = 2) -> int:
    # Same shape as argparse's own errors; a bad option is not a crash, so no traceback.
    print(f"inalab switch: error: {message}", file=sys.stderr)
    return status


def _write_ready_file(path: Path, server: SwitchServer) -> None:
    """Write the ready file atomically (readers poll for its existence)."""
    info = {
        "data": list(server.data_addr),
        "control": list(server.control_addr),
        "pid": os.getpid(),
        "lanes": server.pipeline.lanes,
        "slots": server.pipeline.slots,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
