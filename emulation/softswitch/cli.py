"""inalab switch: run the software INA switch on a UDP socket, configured over P4Runtime.

The switch starts with empty tables; a controller (``inalab ctl``, the ``controller``
package, p4runtime-shell) installs jobs through its P4Runtime server. With
``--ready-file`` it writes ``{data, interfaces, p4runtime, p4runtime_tls, device_id, pid, lanes,
slots}`` as JSON
once both servers are bound (atomically, so a reader never sees half a file); this is how
:class:`emulation.softswitch.process.SoftSwitchProcess` learns the ports it got.

On ports (``--interface``), ``--link PORT:delay=2ms,loss=0.01,queue=100,ingress``
emulates the port's link (``emulation/softswitch/links.py``) and ``--link-stats PATH``
writes its counts as JSON (before the ready file, then at most once a second while they
change, and on exit); ``--pcap`` records Ethernet frames there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from controller.tls import TlsRequiredError, require_tls, tls_argument
from emulation.softswitch.argtypes import int_in, probability
from emulation.softswitch.frames import FrameSwitchServer
from emulation.softswitch.links import ONLY_EBPF, parse_link
from emulation.softswitch.p4runtime import ARBITRATIONS
from emulation.softswitch.pcap import LINKTYPE_ETHERNET, LINKTYPE_RAW, PcapWriter
from emulation.softswitch.pipeline import Addr, DropSimulator, Pipeline
from emulation.softswitch.server import SwitchServer
from hostlib.protocol import (
    INA_UDP_PORT,
    LANES_PER_PACKET,
    MAX_LANES,
    SLOT_MASK,
    SWITCH_SLOTS,
    TNA_LANES_PER_PACKET,
    TNA_SWITCH_SLOTS,
)

__all__ = [
    "DEFAULT_P4RUNTIME_PORT",
    "add_arguments",
    "main",
    "parse_addr",
    "parse_interface",
    "run",
]

log = logging.getLogger(__name__)

DATAPATHS = ("python", "ebpf")
"""The data planes a switch with ports can run: the Python pipeline, or the eBPF program."""

PROGRAMS = ("v1model", "tna")
"""Whose P4Info the switch serves: ``p4/ina.p4``'s (v1model, bmv2) or ``p4/tna/``'s
(Tofino), with the same pipeline behind either (the controller picks names by it)."""

DEFAULT_P4RUNTIME_PORT = 9559
"""P4Runtime's IANA port, simple_switch_grpc's default too."""


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


def parse_interface(text: str) -> tuple[int, str]:
    """Parse ``PORT@IFACE`` (bmv2's ``-i`` syntax), port 0..511.

    Raises:
        argparse.ArgumentTypeError: no ``@``, or a port that is not 0..511.
    """
    port, sep, name = text.partition("@")
    if not sep or not name or not port.isdigit() or int(port) > 511:
        raise argparse.ArgumentTypeError(f"{text!r} is not PORT@IFACE with a port 0..511")
    return int(port), name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``inalab switch`` options on ``parser``."""
    a = parser.add_argument
    a(
        "--listen",
        type=parse_addr,
        default=("127.0.0.1", INA_UDP_PORT),
        metavar="HOST:PORT",
        help=f"UDP data address (default 127.0.0.1:{INA_UDP_PORT}; port 0 picks a free port)",
    )
    a(
        "--p4runtime",
        type=parse_addr,
        default=("127.0.0.1", DEFAULT_P4RUNTIME_PORT),
        metavar="HOST:PORT",
        help=f"P4Runtime gRPC address (default 127.0.0.1:{DEFAULT_P4RUNTIME_PORT}; port 0 "
        "picks a free port, named in --ready-file and on a terminal)",
    )
    a(
        "--p4runtime-tls",
        type=tls_argument,
        metavar="CERT,KEY,CA",
        help="serve P4Runtime over mutual TLS: this switch's certificate and key, and the "
        "CA that must have signed every controller's certificate (PEM files); required "
        "when --p4runtime is not a loopback address. A refused client is logged in one line",
    )
    a(
        "--roce",
        action="store_true",
        help="also aggregate INA over RoCEv2 (RDMA WRITEs from RNICs, or hostlib's emulated "
        "one) on UDP port 4791: of --listen's address, every such datagram on "
        "--interface ports (in the kernel with --datapath ebpf), or those to the NIC's "
        "address with --one-armed (docs/protocol.md, 'INA over RoCEv2')",
    )
    a("--device-id", type=int_in(0), default=0, help="P4Runtime device id (default 0)")
    a(
        "--arbitration",
        choices=ARBITRATIONS,
        default=ARBITRATIONS[0],
        help="who is P4Runtime primary when the primary leaves: spec (P4Runtime's rule: "
        "nobody, until a controller arbitrates with an election id at least the highest "
        "seen) or bmv2 (the highest connected id, as simple_switch_grpc) (default spec)",
    )
    a(
        "-i",
        "--interface",
        type=parse_interface,
        action="append",
        default=[],
        metavar="PORT@IFACE",
        help="a switch port on a network interface (repeatable; root): the switch then "
        "takes Ethernet frames on its ports instead of UDP on --listen, as bmv2 does",
    )
    a(
        "--datapath",
        choices=DATAPATHS,
        help="with --interface: python (this process handles every frame; links may "
        "delay) or ebpf (a TC classifier on each port does, in the kernel: needs root, "
        "clang and libbpf; links may lose, duplicate and reorder frames but not delay them) "
        "(default python)",
    )
    a(
        "--one-armed",
        metavar="IFACE",
        help="be a reduction server on this host's NIC IFACE (eBPF, root): aggregate the "
        "INA packets sent to IFACE's IPv4 address, send each result to every worker as a "
        "unicast datagram to the MAC that worker's own packets came from (where none came "
        "yet: the kernel's route, if IFACE forwards), and leave every other packet (SSH, "
        "P4Runtime, ...) to the host; workers send to IFACE's address, port "
        f"{INA_UDP_PORT}. Implies --datapath ebpf and port 1 on IFACE",
    )
    a(
        "--forward-only",
        action="store_true",
        help="with --interface: aggregate nothing, forward INA packets like other frames",
    )
    a(
        "--program",
        choices=PROGRAMS,
        default="v1model",
        help="serve this P4 program's P4Info over P4Runtime: v1model (p4/ina.p4, bmv2's) or "
        "tna (p4/tna/, a Tofino switch's: a controller configures the switch through the "
        f"Tofino program's names; {TNA_LANES_PER_PACKET} lanes) (default v1model)",
    )
    a(
        "--lanes",
        type=int_in(1, MAX_LANES),
        default=None,
        help=f"int32 lanes per packet (default {LANES_PER_PACKET}; with --program tna "
        f"{TNA_LANES_PER_PACKET}, the only value it takes)",
    )
    a(
        "--slots",
        type=int_in(1, SLOT_MASK + 1),
        default=None,
        help=f"slots per set in the switch pool (default {SWITCH_SLOTS}; with --program tna "
        f"{TNA_SWITCH_SLOTS}, the most it takes)",
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
    a(
        "--link",
        type=parse_link,
        action="append",
        default=[],
        metavar="PORT:SPEC",
        help="with --interface: emulate the link on PORT (repeatable), SPEC a comma "
        "list of delay=D (250us, 2ms, 0.1s; a bare number is ms), loss=P (0 <= P < 1), "
        "queue=N (frames the delay line holds, default 1000; tail drop beyond), dup=P and "
        "reorder=P (a frame sent twice, held back behind later frames; --datapath ebpf "
        "only), and the flag ingress (also frames arriving on PORT: a port facing a host); "
        "frames sent out of PORT always go through it. Example: --link "
        "1:delay=2ms,loss=0.01,ingress",
    )
    a(
        "--link-stats",
        type=Path,
        metavar="PATH",
        help='with --interface: write the links\' counts as JSON {"ports": {"1": '
        '{"egress": {"offered", "lost", "queue_dropped", "delivered", "in_flight"}, '
        '"ingress": {...}}}} here (eBPF: also "duplicated", "reordered"), at start, at '
        "most once a second while they change, and on exit",
    )
    a(
        "--seed",
        type=int,
        default=0,
        help="seed of the drop simulator and of --link loss (default 0)",
    )
    a(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="once listening, write {data, interfaces, p4runtime, p4runtime_tls, device_id, "
        "pid, lanes, slots} as JSON here",
    )
    a(
        "--pcap",
        type=Path,
        metavar="PATH",
        help="record every datagram received and sent to this pcap (IPv4/UDP/INA); with "
        "--interface every Ethernet frame accepted from a port (after its ingress link) "
        "and sent out of one (after its egress link)",
    )
    a(
        "--pcap-count",
        type=int_in(0),
        default=0,
        metavar="N",
        help="stop recording after N packets (default 0: no limit)",
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
    """Run the switch until SIGTERM/SIGINT; return its exit status."""
    if args.one_armed is not None:
        if args.interface or args.forward_only or args.datapath == "python":
            return _usage_error("--one-armed IFACE is the switch's one port, on the eBPF "
                                "data plane: drop --interface, --forward-only and "
                                "--datapath python")  # fmt: skip
        args.datapath = "ebpf"
        args.interface = [(1, args.one_armed)]
    args.datapath = args.datapath or "python"
    if (message := _resolve_program(args)) is not None:
        return _usage_error(message)
    ports = dict(args.interface)
    if (message := _ports_error(args, ports)) is not None:
        return _usage_error(message)
    try:
        require_tls(_hostport(args.p4runtime), args.p4runtime_tls, "--p4runtime-tls")
    except TlsRequiredError as exc:
        return _usage_error(str(exc))
    drops = DropSimulator(args.drop_ingress, args.drop_egress, args.seed)
    if args.datapath == "ebpf":
        try:
            server = _make_ebpf_server(args, ports, drops)
        except (OSError, RuntimeError, ValueError) as exc:
            return _usage_error(f"--datapath ebpf: {exc}", status=1)
        return _serve(args, server)
    pipeline = Pipeline(args.lanes, args.slots, drops)
    try:
        pcap = _open_pcap(args, ethernet=bool(ports))
    except OSError as exc:
        return _usage_error(f"--pcap: {exc}", status=1)
    try:
        server = _make_server(args, pipeline, ports, pcap)
    except OSError as exc:
        if pcap is not None:
            pcap.close()
        data = ", ".join(f"{p}@{n}" for p, n in ports.items()) if ports else _hostport(args.listen)
        where = f"data {data}, P4Runtime {_hostport(args.p4runtime)}"
        return _usage_error(f"cannot bind {where}: {exc}", status=1)
    return _serve(args, server)


def _resolve_program(args: argparse.Namespace) -> str | None:
    """Fill ``--lanes``/``--slots`` defaults for ``--program`` and load its P4Info into
    ``args.p4info`` (None: the servers' default, v1model's sized to the pipeline); the
    usage error, if any."""
    tna = args.program == "tna"
    if args.lanes is None:
        args.lanes = TNA_LANES_PER_PACKET if tna else LANES_PER_PACKET
    if args.slots is None:
        args.slots = TNA_SWITCH_SLOTS if tna else SWITCH_SLOTS
    args.p4info = None
    if not tna:
        return None
    if args.lanes != TNA_LANES_PER_PACKET:
        return f"--program tna: its program has {TNA_LANES_PER_PACKET} lanes, not {args.lanes}"
    if args.slots > TNA_SWITCH_SLOTS:
        return f"--program tna: its pool is {TNA_SWITCH_SLOTS} slots a set, not {args.slots}"
    from controller.p4info import TNA_P4INFO_PATH, P4Info, P4InfoError
    from emulation.softswitch.p4runtime import softswitch_p4info

    try:
        args.p4info = softswitch_p4info(P4Info.load(TNA_P4INFO_PATH), args.lanes, args.slots)
    except (OSError, P4InfoError) as exc:
        return f"--program tna: {TNA_P4INFO_PATH}: {exc}"
    return None


def _serve(args: argparse.Namespace, server: SwitchServer) -> int:
    """Serve until SIGTERM/SIGINT, writing the link stats and ready files first."""
    with server:
        server.install_signal_handlers()
        write_link_stats = getattr(server, "write_link_stats", None)  # switches on ports
        if write_link_stats is not None:
            try:
                write_link_stats()  # a bad path fails now, not while serving
            except OSError as exc:
                return _usage_error(f"--link-stats: {exc}", status=1)
        if args.ready_file is not None:
            _write_ready_file(args.ready_file, server)
        if sys.stdout.isatty():  # a person started it: say where to reach it
            print(_listening(server), flush=True)
        final = server.serve_forever()
    print(_stopped(final), file=sys.stderr, flush=True)
    return 0


def _stopped(counters: dict[str, int]) -> str:
    """The line ``inalab switch`` prints when it stops: its non-zero counters (drops,
    ``no_route``, ``passed_to_host`` and the rest), whatever the log level."""
    shown = ", ".join(f"{name} {value}" for name, value in sorted(counters.items()) if value)
    return f"inalab switch: stopped; counters: {shown or 'all zero'}"


def _ports_error(args: argparse.Namespace, ports: dict[int, str]) -> str | None:
    """What is wrong with the port options together (None: nothing)."""
    if len(ports) != len(args.interface):
        return "--interface: a port is given twice"
    if args.datapath == "ebpf":
        if not ports:
            return "--datapath ebpf needs --interface (the program runs on the ports)"
        if args.pcap is not None:
            return ("--datapath ebpf: frames never reach this process, so it cannot record "
                    "them; capture on the ports (tcpdump -i IFACE) or use --datapath python")
        if delayed := sorted(p for p, spec in args.link if spec.delay):
            return (f"--link {delayed[0]}: the eBPF data plane cannot delay frames (no "
                    "netem here); use --datapath python for links with delay")
    elif faulty := sorted(p for p, spec in args.link if spec.dup or spec.reorder):
        return f"--link {faulty[0]}: {ONLY_EBPF}"
    if not ports:
        for given, name in ((args.forward_only, "--forward-only"), (args.link, "--link"),
                            (args.link_stats, "--link-stats")):  # fmt: skip
            if given:
                return f"{name} needs --interface (a switch with ports)"
        return None
    links = dict(args.link)
    if len(links) != len(args.link):
        return "--link: a port is given twice"
    if unknown := sorted(set(links) - set(ports)):
        return f"--link: port {unknown[0]} is not an --interface port"
    return None


def _open_pcap(args: argparse.Namespace, ethernet: bool) -> PcapWriter | None:
    """The ``--pcap`` writer: Ethernet frames on ports, IPv4/UDP datagrams otherwise.

    Raises:
        OSError: the file cannot be created.
    """
    if args.pcap is None:
        return None
    return PcapWriter(args.pcap, args.pcap_count, LINKTYPE_ETHERNET if ethernet else LINKTYPE_RAW)


def _make_server(
    args: argparse.Namespace, pipeline: Pipeline, ports: dict[int, str], pcap: PcapWriter | None
) -> SwitchServer:
    """The switch on ``ports``, or on the UDP socket when there are none.

    Raises:
        OSError: an interface or an address cannot be bound.
    """
    if ports:
        return FrameSwitchServer(
            pipeline, ports, args.p4runtime, device_id=args.device_id, pcap=pcap,
            forward_only=args.forward_only, links=dict(args.link), seed=args.seed,
            link_stats=args.link_stats, arbitration=args.arbitration, tls=args.p4runtime_tls,
            p4info=args.p4info, roce=args.roce,
        )  # fmt: skip
    return SwitchServer(pipeline, args.listen, args.p4runtime, device_id=args.device_id, pcap=pcap,
                        arbitration=args.arbitration, tls=args.p4runtime_tls,
                        p4info=args.p4info, roce=args.roce)  # fmt: skip


def _make_ebpf_server(
    args: argparse.Namespace, ports: dict[int, str], drops: DropSimulator
) -> SwitchServer:
    """The switch with the eBPF program on ``ports`` (imported here: the Python data
    plane does not need libbpf).

    Raises:
        OSError: an interface or the P4Runtime address cannot be used, or libbpf refused.
        RuntimeError: clang or libbpf is missing, or clang refused the program.
        ValueError: a link the program cannot emulate.
    """
    from emulation.softswitch.ebpf.dataplane import EbpfDataplane
    from emulation.softswitch.ebpf.server import EbpfSwitchServer, interface_ipv4

    own_ip = interface_ipv4(args.one_armed) if args.one_armed else None
    dataplane = EbpfDataplane(args.lanes, args.slots, drops, forward_only=args.forward_only,
                              one_armed=own_ip, roce=args.roce)  # fmt: skip
    try:
        return EbpfSwitchServer(
            dataplane, ports, args.p4runtime, device_id=args.device_id, links=dict(args.link),
            link_stats=args.link_stats, arbitration=args.arbitration, tls=args.p4runtime_tls,
            p4info=args.p4info,
        )  # fmt: skip
    except BaseException:
        dataplane.close()
        raise


def _usage_error(message: str, status: int = 2) -> int:
    # Same shape as argparse's own errors; a bad option is not a crash, so no traceback.
    print(f"inalab switch: error: {message}", file=sys.stderr)
    return status


def _hostport(addr: Addr) -> str:
    return f"{addr[0]}:{addr[1]}"


def _listening(server: SwitchServer) -> str:
    """One line saying where ``server`` takes data and P4Runtime."""
    interfaces: dict[int, str] = getattr(server, "interfaces", {})
    if interfaces and server.data_addr[1]:  # one-armed: INA to the host's address
        data = "UDP {}:{} (one-armed on {})".format(*server.data_addr, interfaces[1])
    elif interfaces:
        data = "ports " + ", ".join(f"{p}@{n}" for p, n in sorted(interfaces.items()))
    else:
        data = "UDP {}:{}".format(*server.data_addr)
    return (
        f"inalab switch: data on {data}; P4Runtime on {server.p4runtime_addr[0]}:"
        f"{server.p4runtime_addr[1]}{' (mutual TLS)' if server.p4runtime_tls else ''} (device "
        f"{server.device_id}); {server.pipeline.lanes} "
        f"lanes, {server.pipeline.slots} slots; Ctrl-C stops"
    )


def _write_ready_file(path: Path, server: SwitchServer) -> None:
    """Write the ready file atomically (readers poll for its existence)."""
    interfaces: dict[int, str] = getattr(server, "interfaces", {})
    info = {
        # A switch on ports has no UDP endpoint (port 0), but a one-armed server has one.
        "data": list(server.data_addr) if server.data_addr[1] else None,
        "interfaces": {str(p): n for p, n in interfaces.items()},
        "p4runtime": "{}:{}".format(*server.p4runtime_addr),
        "p4runtime_tls": server.p4runtime_tls,
        "device_id": server.device_id,
        "pid": os.getpid(),
        "lanes": server.pipeline.lanes,
        "slots": server.pipeline.slots,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
