"""The bmv2 target for the data-plane vectors: simple_switch_grpc on veth pairs.

Selected only where ``simple_switch_grpc`` is on PATH (tests marked ``bmv2``). The switch is
``emulation.bmv2.Bmv2Process`` (compiled, started and proven ready as in the Mininet
emulation). Each vector port ``p`` is a veth pair: bmv2 owns one end as its port ``p``, the
test sends and receives Ethernet/IPv4/UDP frames on the other with a raw socket, built from
the port's identity (:func:`runner.port_identity`). The INA datagram of a vector step is
the frame's UDP payload. The switch is configured as the soft switch is, by the controller
(``controller.switch.SwitchController``): pipeline push and tables over P4Runtime,
registers (the drop simulator's, slot clearing) over bmv2's Thrift server, which its
P4Runtime server cannot replace for registers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import sharing_steps
from roce_steps import endpoint
from runner import (
    COUNTERS,
    ROCE,
    SOFT_SLOTS,
    Forward,
    Job,
    PortIdentity,
    Received,
    TargetUnavailable,
    Vector,
    VectorFailure,
    port_identity,
)

from controller.forwarder import HostRoute
from controller.p4info import P4Info
from controller.switch import SwitchController, WorkerAddress
from emulation.bmv2 import (
    P4_PROGRAM,
    P4INFO_PATH,
    Bmv2Process,
    Bmv2Tools,
    Bmv2Unavailable,
    CompileError,
    compile_program,
    compiled_p4info,
    find_bmv2,
)
from emulation.softswitch import SoftSwitchProcess, SwitchStartError
from hostlib.protocol import INA_UDP_PORT, LANE_BYTES, ROCE_UDP_PORT

P4INFO = P4INFO_PATH
ETHERNET_MIN_FRAME = 60
"""Bytes of the shortest Ethernet frame without its FCS (IEEE 802.3): what a NIC pads to."""
SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"
"""The switch's INA endpoint on the wire: where workers send DATA, whence RESULTs come."""
_ETH_P_ALL = 0x0003
MARKER_ETHERTYPE = 0x88B5
"""IEEE 802's local experimental EtherType: the settle markers, which the forwarder
carries like any frame and no vector sends."""
MARKER_SRC_MAC = bytes.fromhex("020000000100")
_SETTLE_SECONDS = 10.0


class Bmv2Control(Protocol):
    """What the bmv2 target needs from the P4Runtime controller, by protocol names.

    The controller's own API need not be this one: :func:`control_factory` adapts it.
    """

    def push_pipeline(self, p4info: Path | None, bmv2_json: Path | None) -> None: ...
    def set_switch_identity(self, mac: str, ip: str, udp_port: int) -> None: ...
    def add_job(
        self, job: Job, workers: list[PortIdentity], upstream: PortIdentity | None = None
    ) -> None: ...
    def add_host_route(self, host: PortIdentity) -> None: ...
    def set_drops(self, ingress: float, egress: float) -> None: ...
    def counters(self) -> dict[str, int]: ...
    def close(self) -> None: ...


def _address(port: int) -> WorkerAddress:
    """A port's identity as the controller takes an address."""
    me = port_identity(port)
    return WorkerAddress(me.ip, me.udp_port, me.mac, me.port)


class _ControllerAdapter:
    """:class:`Bmv2Control` over :class:`controller.switch.SwitchController`.

    Without a Thrift address (the soft switch) registers go over P4Runtime and
    ``push_pipeline`` only connects: the soft switch has its program built in.
    """

    def __init__(self, grpc_address: str, thrift_address: str | None) -> None:
        self.grpc_address = grpc_address
        self.thrift_address = thrift_address
        self._ctl: SwitchController | None = None
        self._jobs: list[Job] = []

    def push_pipeline(self, p4info: Path | None, bmv2_json: Path | None) -> None:
        pipeline = None
        if p4info is not None and bmv2_json is not None:
            pipeline = (P4Info.load(p4info), bmv2_json.read_bytes())
        self._ctl = SwitchController.connect(
            self.grpc_address, pipeline=pipeline, thrift=self.thrift_address
        )

    def set_switch_identity(self, mac: str, ip: str, udp_port: int) -> None:
        """Nothing to write: next_step.p4 answers from the address the worker sent to."""

    def add_job(
        self, job: Job, workers: list[PortIdentity], upstream: PortIdentity | None = None
    ) -> None:
        if job.msg_packets is not None:  # RoCEv2: ranks at (IPv4, 4791), then queue pairs
            self._add_roce_job(job, workers)
            return
        self._jobs.append(job)
        if sharing_steps.install(self._require(), job, _address):
            return
        addrs = [WorkerAddress(w.ip, w.udp_port, w.mac, w.port) for w in workers]
        up = None
        if job.upstream is not None and upstream is not None:
            address = WorkerAddress(upstream.ip, upstream.udp_port, upstream.mac, upstream.port)
            up = (job.upstream.rank, address)
        self._require().add_job(job.job_id, addrs, job.slot_count, upstream=up)

    def _add_roce_job(self, job: Job, workers: list[PortIdentity]) -> None:
        ctl, m = self._require(), job.msg_packets or 1
        addrs = [WorkerAddress(w.ip, ROCE_UDP_PORT, w.mac, w.port) for w in workers]
        ctl.add_job(job.job_id, addrs, job.slot_count)
        msg_bytes = m * ctl.lanes * LANE_BYTES
        window = job.slot_count // m
        endpoints = [[endpoint(w.port, u, msg_bytes) for u in range(window)] for w in workers]
        ctl.roce.install(job.job_id, [w.ip for w in workers], endpoints, m)

    def add_host_route(self, host: PortIdentity) -> None:
        self._require().forwarder.add_host(HostRoute(host.mac, host.port))

    def set_drops(self, ingress: float, egress: float) -> None:
        self._require().set_drops(ingress, egress)

    def counters(self) -> dict[str, int]:
        ctl = self._require()
        return ctl.counters() | sharing_steps.job_counters(ctl, self._jobs)

    def close(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def _require(self) -> SwitchController:
        if self._ctl is None:
            raise RuntimeError("push the pipeline first")
        return self._ctl


def control_factory() -> Callable[[str, str | None], Bmv2Control]:
    """What connects a :class:`Bmv2Control` to the switch's gRPC and Thrift addresses."""
    return _ControllerAdapter


class Bmv2Target:
    """simple_switch_grpc with one veth pair per vector port, configured over P4Runtime."""

    name = "bmv2"
    roce_icrc = False  # a P4 switch leaves it 0 (p4/roce.p4)

    def __init__(self) -> None:
        self._bmv2: Bmv2Process | None = None
        self._veths: list[str] = []
        self._socks: dict[int, socket.socket] = {}
        self._control: Bmv2Control | None = None
        self._ina_sent = 0  # frames to the INA UDP port: each counts in `received`
        self._pending: dict[int, deque[bytes]] = {}  # frames read while settling
        self._markers = 0

    def configure(self, vector: Vector, run_dir: Path) -> None:
        """Check every prerequisite, then build veths, start bmv2 and push the config.

        Raises:
            TargetUnavailable: a prerequisite is missing (nothing has been started then).
        """
        connect = control_factory()
        tools = _prerequisites()
        bmv2_json = _compile(run_dir, tools)
        p4info = compiled_p4info(bmv2_json)
        self._bmv2 = Bmv2Process(
            run_dir, name=f"bmv2-{vector.name}", interfaces=self._make_ports(vector),
            json_path=bmv2_json, p4info_path=p4info, tools=tools,
        )  # fmt: skip
        try:
            self._bmv2.start()
        except SwitchStartError as exc:
            raise VectorFailure(str(exc)) from None
        self._control = connect(self._bmv2.p4runtime_address, self._bmv2.thrift_address)
        self._control.push_pipeline(p4info, bmv2_json)
        self._configure_tables(vector)

    def _configure_tables(self, vector: Vector) -> None:
        assert self._control is not None
        self._control.set_switch_identity(SWITCH_MAC, SWITCH_IP, INA_UDP_PORT)
        for port in vector.ports:
            self._control.add_host_route(port_identity(port))
        for job in vector.jobs:
            upstream = None if job.upstream is None else port_identity(job.upstream.port)
            self._control.add_job(job, [port_identity(p) for p in job.workers], upstream)
        self._control.set_drops(*vector.drops)

    def roce_ips(self, port: int) -> tuple[str, str]:
        return port_identity(port).ip, SWITCH_IP

    def send(self, port: int, payload: bytes, to: Forward | None) -> None:
        from scapy.layers.inet import IP, UDP
        from scapy.layers.l2 import Ether

        me = port_identity(port)
        sport, ip = me.udp_port, IP(src=me.ip)
        if to is None:
            dst_mac, dst_ip, dport = SWITCH_MAC, SWITCH_IP, INA_UDP_PORT
        elif to == ROCE:  # as an RNIC sends: UDP 4791 both ways, identification 0, DF
            dst_mac, dst_ip, dport = SWITCH_MAC, SWITCH_IP, ROCE_UDP_PORT
            sport, ip = ROCE_UDP_PORT, IP(src=me.ip, id=0, flags="DF")
        else:
            peer = port_identity(to.port)
            dst_mac, dst_ip, dport = peer.mac, peer.ip, to.udp_dport
        ip.dst = dst_ip
        frame = Ether(src=me.mac, dst=dst_mac) / ip / UDP(sport=sport, dport=dport) / payload
        # A NIC pads a frame to Ethernet's minimum (60 bytes without the FCS); a veth does
        # not, so the padding is added here: a short datagram's padding must not pass for
        # the rest of its INA header (DROP_TRUNCATED by its UDP length).
        self._socks[port].send(bytes(frame).ljust(ETHERNET_MIN_FRAME, b"\0"))
        if dport in (INA_UDP_PORT, ROCE_UDP_PORT):
            self._ina_sent += 1

    def recv(self, port: int, timeout: float) -> Received | None:
        pending = self._pending.get(port)
        while pending:
            got = _datagram(port, pending.popleft())
            if got is not None:
                return got
        deadline = time.monotonic() + timeout
        sock = self._socks[port]
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 1e-6))
            try:
                frame = sock.recv(65536)
            except TimeoutError:
                return None
            got = _datagram(port, frame)
            if got is not None:
                return got

    def set_drops(self, ingress: float, egress: float) -> None:
        self._settle()  # the new rates must not reach frames sent before
        self._require_control().set_drops(ingress, egress)

    def counters(self) -> dict[str, int]:
        return {
            k: v
            for k, v in self._settle().items()
            if k in COUNTERS or sharing_steps.is_job_counter(k)
        }

    def _settle(self) -> dict[str, int]:
        """The counters once the switch has processed every frame sent so far.

        A switch is not synchronous with the test: bmv2 queues frames between its port
        threads, its ingress thread and its egress threads. First ingress: wait until
        ``received`` covers every frame sent to the INA port. Then egress, which counts
        results and egress drops: a marker frame per port, forwarded back out of that
        port by the forwarder, arrives after every packet queued for the port before it
        (egress queues are first in, first out per port). Frames read meanwhile are kept
        for :meth:`recv`.

        Raises:
            VectorFailure: the switch did not catch up within a generous bound.
        """
        control = self._require_control()
        deadline = time.monotonic() + _SETTLE_SECONDS
        self._await_ingress(deadline)
        self._markers += 1
        marker = self._markers.to_bytes(4, "big") + bytes(42)
        ethertype = MARKER_ETHERTYPE.to_bytes(2, "big")
        for port, sock in self._socks.items():
            dst = bytes.fromhex(port_identity(port).mac.replace(":", ""))
            sock.send(dst + MARKER_SRC_MAC + ethertype + marker)
        for port, sock in self._socks.items():
            self._await_marker(port, sock, marker, deadline)
        return control.counters()

    def _await_ingress(self, deadline: float) -> dict[str, int]:
        """The counters once ``received`` covers every frame sent to the INA port.

        Raises:
            VectorFailure: not by ``deadline``.
        """
        control = self._require_control()
        while (c := control.counters())["received"] < self._ina_sent:
            if time.monotonic() > deadline:
                raise VectorFailure(f"switch received {c['received']} of {self._ina_sent} frames")
            time.sleep(0.005)
        return c

    def _await_marker(
        self, port: int, sock: socket.socket, marker: bytes, deadline: float
    ) -> None:
        pending = self._pending.setdefault(port, deque())
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 1e-6))
            try:
                frame = sock.recv(65536)
            except TimeoutError:
                raise VectorFailure(f"port {port}: the switch did not forward a marker") from None
            if frame[6:12] != MARKER_SRC_MAC:
                pending.append(frame)
            elif frame[14 : 14 + len(marker)] == marker:
                return

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        self._pending.clear()
        if self._bmv2 is not None:  # before its interfaces go away
            self._bmv2.stop()
            self._bmv2 = None
        for name in self._veths:  # only the pairs this target created
            subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)
        self._veths.clear()

    def _make_ports(self, vector: Vector) -> dict[int, str]:
        """A veth pair per vector port: the test's raw socket on one end; return the
        switch's ends by port."""
        tag = f"iv{os.getpid() % 100000}"
        ports = {}
        for port in vector.ports:
            host_if, switch_if = f"{tag}h{port}", f"{tag}s{port}"
            _ip("link", "add", host_if, "type", "veth", "peer", "name", switch_if)
            self._veths.append(host_if)
            for name in (host_if, switch_if):
                # No IPv6 router solicitations or other kernel chatter on the test ports.
                _sysctl(f"net.ipv6.conf.{name}.disable_ipv6", "1")
                _ip("link", "set", name, "up")
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
            sock.bind((host_if, 0))
            self._socks[port] = sock
            ports[port] = switch_if
        return ports

    def _require_control(self) -> Bmv2Control:
        if self._control is None:
            raise RuntimeError("target not configured")
        return self._control


def _prerequisites() -> Bmv2Tools:
    """The tools, or why this target cannot run here (nothing is started before)."""
    if not P4_PROGRAM.exists() or not P4INFO.exists():
        raise TargetUnavailable(f"needs the P4 program {P4_PROGRAM} and its p4info {P4INFO}")
    try:
        tools = find_bmv2()
    except Bmv2Unavailable as exc:
        raise TargetUnavailable(str(exc)) from None
    if os.geteuid() != 0:
        raise TargetUnavailable("needs root for veth pairs and raw sockets")
    return tools


def _compile(run_dir: Path, tools: Bmv2Tools) -> Path:
    try:
        return compile_program(run_dir / "build", compiler=tools.compiler)
    except CompileError as exc:
        raise VectorFailure(str(exc)) from None


def _datagram(port: int, frame: bytes) -> Received | None:
    """The UDP payload of an IPv4/UDP frame for ``port``; None for other traffic.

    Raises:
        VectorFailure: an IPv4/UDP frame whose addresses are not this port's.
    """
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    pkt = Ether(frame)
    if IP not in pkt or UDP not in pkt:
        return None
    me, ip, udp = port_identity(port), pkt[IP], pkt[UDP]
    payload = bytes(udp.payload)[: udp.len - 8]  # without Ethernet padding
    if (pkt[Ether].dst, ip.dst) != (me.mac, me.ip):
        raise VectorFailure(f"port {port} got a frame for {pkt[Ether].dst} {ip.dst}")
    if ip.src == SWITCH_IP and udp.sport == INA_UDP_PORT:
        if udp.dport != me.udp_port:
            raise VectorFailure(f"port {port}: result to UDP {udp.dport}, not {me.udp_port}")
        return Received(payload, None)
    if ip.src == SWITCH_IP and udp.sport == ROCE_UDP_PORT:
        if udp.dport != ROCE_UDP_PORT or (ip.id, ip.flags) != (0, "DF"):
            raise VectorFailure(
                f"port {port}: a RoCEv2 reply to UDP {udp.dport}, IPv4 id {ip.id} flags "
                f"{ip.flags}: expected 4791, 0, DF (the IPv4 header the ICRC covers)"
            )
        return Received(payload, ROCE)
    src = next((p for p in range(1, 251) if port_identity(p).ip == ip.src), None)
    if src is None:
        raise VectorFailure(f"port {port} got a frame from unknown IP {ip.src}")
    return Received(payload, Forward(src, udp.dport))


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VectorFailure(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _sysctl(key: str, value: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    if path.exists():
        path.write_text(value)


class SoftPortsTarget(Bmv2Target):
    """The soft switch on the same veth pairs and raw sockets as bmv2 (``inalab switch
    --interface``), configured by the same controller (registers over P4Runtime)."""

    name = "soft-ports"
    roce_icrc = True
    datapath = "python"

    def __init__(self) -> None:
        super().__init__()
        self._switch: SoftSwitchProcess | None = None

    def configure(self, vector: Vector, run_dir: Path) -> None:
        if os.geteuid() != 0:
            raise TargetUnavailable("needs root for veth pairs and raw sockets")
        ports = self._make_ports(vector)
        self._switch = SoftSwitchProcess(
            run_dir, name=f"switch-{vector.name}", lanes=vector.lanes, slots=SOFT_SLOTS,
            interfaces=ports, extra_args=("--datapath", self.datapath, "--roce"),
        ).start()  # fmt: skip
        self._control = control_factory()(self._switch.p4runtime_address, None)
        self._control.push_pipeline(None, None)
        self._configure_tables(vector)

    def close(self) -> None:
        code, log_path = 0, None
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._switch is not None:  # before its interfaces go away
            code = self._switch.stop()
            log_path, self._switch = self._switch.log_path, None
        super().close()
        if code != 0:
            raise VectorFailure(f"soft switch exited with status {code}; log {log_path}")


class EbpfTarget(SoftPortsTarget):
    """The soft switch with the eBPF data plane (``inalab switch --datapath ebpf``): the
    same veths, raw sockets and controller; the frames are handled by the TC program."""

    name = "ebpf"
    datapath = "ebpf"

    def configure(self, vector: Vector, run_dir: Path) -> None:
        from emulation.softswitch.ebpf import ebpf_unavailable

        if (why := ebpf_unavailable()) is not None:
            raise TargetUnavailable(why)
        super().configure(vector, run_dir)



class OneArmedTarget(EbpfTarget):
    """The eBPF data plane as a reduction server (``inalab switch --one-armed NIC``): the
    vector's ports are hosts on one Linux bridge, and the switch is a host there too,
    with one NIC that has the switch's MAC and IP. Results leave by that NIC as unicast
    datagrams to the MAC each worker's packets came from, and the bridge takes them to
    the worker's port; so every vector without an upstream switch (whose MAC a
    one-armed server learns only from its packets) or plain forwarding runs unchanged.

    Its ports are a namespace's worth of state in the root namespace (the NIC holds the
    switch's address, 10.0.0.254/24, while the vector runs); all of it is removed at close.
    """

    name = "one-armed"

    def __init__(self) -> None:
        super().__init__()
        self._bridge: str | None = None

    def configure(self, vector: Vector, run_dir: Path) -> None:
        from emulation.softswitch.ebpf import ebpf_unavailable

        if (why := ebpf_unavailable()) is not None:
            raise TargetUnavailable(why)
        if any(job.upstream is not None for job in vector.jobs):
            raise TargetUnavailable(
                "a one-armed server learns where a peer is from its packets; an upstream "
                "switch sends none before the first partial sum goes up"
            )
        if os.geteuid() != 0:
            raise TargetUnavailable("needs root for veth pairs and raw sockets")
        tag = f"oa{os.getpid() % 100000}"
        ports = self._make_ports(vector)  # host end: raw socket; switch end: bridged
        self._bridge = f"{tag}br"
        _ip("link", "add", self._bridge, "type", "bridge")
        nic, nic_peer = f"{tag}n", f"{tag}p"
        _ip("link", "add", nic, "type", "veth", "peer", "name", nic_peer)
        self._veths.append(nic)
        _ip("link", "set", nic, "address", SWITCH_MAC)
        _sysctl(f"net.ipv6.conf.{nic}.disable_ipv6", "1")
        _sysctl(f"net.ipv6.conf.{nic_peer}.disable_ipv6", "1")
        _sysctl(f"net.ipv6.conf.{self._bridge}.disable_ipv6", "1")
        _ip("addr", "add", f"{SWITCH_IP}/24", "dev", nic)
        for name in (*ports.values(), nic_peer):
            _ip("link", "set", name, "master", self._bridge)
            _ip("link", "set", name, "up")
        _ip("link", "set", nic, "up")
        _ip("link", "set", self._bridge, "up")
        # Where every MAC is, from the start: no frame is flooded to a port it is not for
        # (a learning bridge floods until it has seen a MAC's sender).
        for port, name in ports.items():
            _bridge_fdb(port_identity(port).mac, name)
        _bridge_fdb(SWITCH_MAC, nic_peer)
        self._switch = SoftSwitchProcess(
            run_dir, name=f"switch-{vector.name}", lanes=vector.lanes, slots=SOFT_SLOTS,
            extra_args=("--one-armed", nic, "--roce"),
        ).start()  # fmt: skip
        self._control = control_factory()(self._switch.p4runtime_address, None)
        self._control.push_pipeline(None, None)
        self._configure_tables(vector)

    def _settle(self) -> dict[str, int]:
        """The counters once every INA frame sent was received: the program emits and
        counts a frame's results in the run that receives it, so nothing lags behind
        (and frames to other destinations, a marker among them, go to the host's stack,
        not back out)."""
        return self._await_ingress(time.monotonic() + _SETTLE_SECONDS)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._bridge is not None:
                subprocess.run(["ip", "link", "del", self._bridge], check=False,
                               capture_output=True)  # fmt: skip
                self._bridge = None


def _bridge_fdb(mac: str, port: str) -> None:
    proc = subprocess.run(["bridge", "fdb", "replace", mac, "dev", port, "master", "static"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise VectorFailure(f"bridge fdb replace {mac} dev {port}: {proc.stderr.strip()}")
