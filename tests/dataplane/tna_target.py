"""The ``tna-model`` target: the TNA program's Python model (emulation.tnamodel), in process.

No Tofino, no veths, no root: each vector port ``p`` is a port of the model with the
runner's port identity (:func:`runner.port_identity`), and frames are the Ethernet/IPv4/UDP
frames the bmv2 target builds, handed to ``TnaModel.process``; what it returns is queued
on the egress port. The tables are written as the controller writes the program's
(the same tables, actions and parameters): jobs, workers, a multicast group per job
with one replica per rank (rid = rank), the replicas' destinations, the upstream entry,
and a host route per port in the forwarder. The model has the vector's lanes. A RoCEv2
job's ranks are bound at (their address, 4791) and its queue pairs written as
controller/roce.py writes them (roce_steps.switch_qpns's order, each worker queue pair's
first PSN in reply_psn); frames go both ways as an RNIC sends them (UDP 4791, IPv4
identification 0, DF). A sharing job's entries (sharing_steps) are the controller's
(controller/switch.py add_job and add_behind): one region at the top of the pool, each
job at controller.sharing.best_offset, counter cells from controller.sharing.free_cell.
"""

from __future__ import annotations

import struct
from collections import deque
from pathlib import Path

from roce_steps import endpoint
from runner import (
    COUNTERS,
    ROCE,
    Forward,
    PortIdentity,
    Received,
    Vector,
    VectorFailure,
    port_identity,
)

from controller.roce import ROCE_QPN_BASE
from controller.sharing import FallbackEntry, SharedEntry, best_offset, free_cell
from emulation.tnamodel import TnaModel
from hostlib.protocol import INA_UDP_PORT, LANE_BYTES, ROCE_UDP_PORT

SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"
"""The switch's INA endpoint on the wire, as on the bmv2 target."""
_HEADERS = 14 + 20 + 8


class TnaModelTarget:
    """:class:`runner.Target` over :class:`emulation.tnamodel.TnaModel`."""

    name = "tna-model"
    roce_icrc = False

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._model: TnaModel | None = None
        self._queues: dict[int, deque[bytes]] = {}
        self._stats: dict[int, tuple[int | None, int | None]] = {}

    def configure(self, vector: Vector, run_dir: Path) -> None:
        self._model = model = TnaModel(lanes=vector.lanes, seed=self._seed)
        self._queues = {port: deque() for port in vector.ports}
        for port in vector.ports:
            model.set_egress_port(port_identity(port).mac, port)
        base, qp_reg = 0, 0
        sharing = _Sharing(model)
        for mgid, job in enumerate(vector.jobs, start=1):
            spec = job.sharing
            if spec is not None and spec.behind is not None:
                sharing.add_behind(job.job_id, spec.behind_workers, spec.behind, base,
                                   job.slot_count, mgid)  # fmt: skip
                base += job.slot_count
                continue
            model.set_job(job.job_id, len(job.workers), base, job.slot_count, mgid)
            base += job.slot_count
            if spec is not None:
                sharing.add(job.job_id, spec.shared, spec.region, spec.fallback)
            model.set_group(mgid, [(port, rank) for rank, port in enumerate(job.workers)])
            for rank, port in enumerate(job.workers):
                me = port_identity(port)
                sport = me.udp_port if job.msg_packets is None else ROCE_UDP_PORT
                model.worker_hit(job.job_id, rank, me.ip, sport)
                model.set_destination(job.job_id, rank, port, me.mac, me.ip, me.udp_port)
            if job.msg_packets is not None:
                qp_reg = _add_roce_job(model, job.job_id, job.workers, job.slot_count,
                                       job.msg_packets, qp_reg)  # fmt: skip
            if job.upstream is not None:
                up = port_identity(job.upstream.port)
                model.set_upstream(
                    job.job_id, job.upstream.rank, up.ip, up.udp_port, up.mac, up.port
                )
        model.set_drops(*vector.drops)
        self._stats = sharing.stats

    def roce_ips(self, port: int) -> tuple[str, str]:
        return port_identity(port).ip, SWITCH_IP

    def send(self, port: int, payload: bytes, to: Forward | None) -> None:
        me = port_identity(port)
        if to is None:
            frame = udp_frame(me, SWITCH_MAC, SWITCH_IP, INA_UDP_PORT, payload)
        elif to == ROCE:
            frame = udp_frame(me, SWITCH_MAC, SWITCH_IP, ROCE_UDP_PORT, payload, roce=True)
        else:
            peer = port_identity(to.port)
            frame = udp_frame(me, peer.mac, peer.ip, to.udp_dport, payload)
        for out_port, out in self._require().process(port, frame):
            if out_port not in self._queues:
                raise VectorFailure(
                    f"the model sent a frame out of port {out_port}, not a vector's"
                )
            self._queues[out_port].append(out)

    def recv(self, port: int, timeout: float) -> Received | None:
        queue = self._queues[port]
        return datagram(port, queue.popleft()) if queue else None

    def set_drops(self, ingress: float, egress: float) -> None:
        self._require().set_drops(ingress, egress)

    def counters(self) -> dict[str, int]:
        model = self._require()
        out = {k: v for k, v in model.statistics().items() if k in COUNTERS}
        for job_id, (shared, fallback) in self._stats.items():
            for name, cell in (("shared_uses", shared), ("collisions", shared),
                               ("from_fallback", fallback), ("to_fallback", fallback)):  # fmt: skip
                gress = "Egress" if name == "to_fallback" else "Ingress"
                cells = model.counters[f"{gress}.sharing.{name}"]
                out[f"job{job_id}.{name}"] = 0 if cell is None else cells[cell]
        return out

    def close(self) -> None:
        self._model = None
        self._queues.clear()

    def _require(self) -> TnaModel:
        if self._model is None:
            raise RuntimeError("target not configured")
        return self._model


def _add_roce_job(
    model: TnaModel, job_id: int, workers: tuple[int, ...], slots: int, m: int, reg: int
) -> int:
    """A RoCEv2 job's tables as controller/roce.py's Roce.install writes them, from
    register ``reg``; the next free register."""
    model.set_roce_job(job_id, m.bit_length() - 1)
    msg_bytes = m * model.lanes * LANE_BYTES
    for rank, port in enumerate(workers):
        for position in range(slots // m):
            ep = endpoint(port, position, msg_bytes)
            model.set_roce_qp(ROCE_QPN_BASE + reg, job_id, rank, reg, port_identity(port).ip)
            model.set_roce_reply(job_id, rank, position, ep.qpn, ep.rkey, ep.va, reg)
            model.set_reply_psn(reg, ep.psn)
            reg += 1
    return reg


class _Sharing:
    """A vector's sharing entries, written as the controller writes them."""

    def __init__(self, model: TnaModel) -> None:
        self.model = model
        self.shared: list[SharedEntry] = []
        self.fallback: list[FallbackEntry] = []
        self.stats: dict[int, tuple[int | None, int | None]] = {}
        """Each sharing job's counter cells: (its shared entry's, its fallback's)."""

    def add(self, job_id: int, count: int, region: int | None, fallback: int | None) -> None:
        cell = free_cell(self.shared, self.fallback)
        shared_cell = fallback_cell = None
        if fallback is not None:
            fb = port_identity(fallback)
            entry = FallbackEntry(job_id, fb.ip, fb.udp_port, fb.mac, fb.port, cell)
            self.fallback.append(entry)
            self.model.set_fallback(job_id, fb.ip, fb.udp_port, fb.mac, fb.port, cell)
            fallback_cell = cell
        if count:
            if self.shared:
                base, size = self.shared[0].base, self.shared[0].size
            else:
                size = region if region is not None else 1 << max(count - 1, 0).bit_length()
                base = self.model.slots - size
            offset = best_offset(self.shared, size, count)
            self.shared.append(SharedEntry(job_id, count, base, size, offset, cell))
            self.model.set_shared(job_id, count, base, size - 1, offset, cell)
            shared_cell = cell
        self.stats[job_id] = (shared_cell, fallback_cell)

    def add_behind(
        self, job_id: int, workers: int, front: int, base: int, slots: int, mgid: int
    ) -> None:
        """The job as add_behind installs it: every rank bound to the front switch's
        address, its one replica (rid 0), and the behind entry."""
        me = port_identity(front)
        self.model.set_job(job_id, workers, base, slots, mgid)
        self.model.set_group(mgid, [(front, 0)])
        self.model.set_destination(job_id, 0, front, me.mac, me.ip, me.udp_port)
        for rank in range(workers):
            self.model.worker_hit(job_id, rank, me.ip, me.udp_port)
        self.model.set_behind(job_id)


def udp_frame(
    me: PortIdentity, dst_mac: str, dst_ip: str, dport: int, payload: bytes, roce: bool = False
) -> bytes:
    """An Ethernet/IPv4/UDP frame from port identity ``me`` (no options, UDP checksum 0);
    ``roce``: as an RNIC sends it (source port 4791, IPv4 identification 0 and DF)."""
    sport = ROCE_UDP_PORT if roce else me.udp_port
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    ip = bytearray(
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + len(udp) + len(payload),
            0 if roce else 1,
            0x4000 if roce else 0,
            64,
            17,
            0,
            _ip(me.ip),
            _ip(dst_ip),
        )
    )
    ip[10:12] = _checksum(bytes(ip)).to_bytes(2, "big")
    return _mac(dst_mac) + _mac(me.mac) + b"\x08\x00" + bytes(ip) + udp + payload


def datagram(port: int, frame: bytes) -> Received:
    """The UDP payload of a frame the model sent out of ``port``, as the bmv2 target's
    ``_datagram`` reads it, plus the IPv4 checksum egress recomputes.

    Raises:
        VectorFailure: not IPv4/UDP, not addressed to the port, a wrong IPv4 checksum,
            or a source that is neither the switch nor a port.
    """
    me = port_identity(port)
    if len(frame) < _HEADERS or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        raise VectorFailure(f"port {port} got a frame that is not IPv4/UDP: {frame.hex()}")
    ip = frame[14:34]
    if _checksum(ip) != 0:
        raise VectorFailure(f"port {port} got an IPv4 header with a bad checksum: {ip.hex()}")
    sport, dport, length, _ = struct.unpack_from("!HHHH", frame, 34)
    if (frame[0:6], ip[16:20]) != (_mac(me.mac), _ip(me.ip)):
        raise VectorFailure(f"port {port} got a frame for {frame[0:6].hex()} {ip[16:20].hex()}")
    payload = frame[_HEADERS : _HEADERS + length - 8]
    if ip[12:16] == _ip(SWITCH_IP) and sport == INA_UDP_PORT:
        if frame[6:12] != _mac(SWITCH_MAC):
            raise VectorFailure(f"port {port}: a result from MAC {frame[6:12].hex()}")
        if dport != me.udp_port:
            raise VectorFailure(f"port {port}: result to UDP {dport}, not {me.udp_port}")
        return Received(payload, None)
    if ip[12:16] == _ip(SWITCH_IP) and sport == ROCE_UDP_PORT:
        ident, flags = struct.unpack_from("!HH", ip, 4)
        if (dport, ident, flags >> 13) != (ROCE_UDP_PORT, 0, 2):
            raise VectorFailure(
                f"port {port}: a RoCEv2 reply to UDP {dport}, IPv4 id {ident} flags "
                f"{flags >> 13}: expected 4791, 0, DF (the IPv4 header the ICRC covers)"
            )
        return Received(payload, ROCE)
    src = next((p for p in range(1, 251) if _ip(port_identity(p).ip) == ip[12:16]), None)
    if src is None:
        raise VectorFailure(f"port {port} got a frame from unknown IP {ip[12:16].hex()}")
    return Received(payload, Forward(src, dport))


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _ip(text: str) -> bytes:
    return bytes(int(part) for part in text.split("."))


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
