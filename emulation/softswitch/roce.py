"""INA over RoCEv2 in the soft switch: the queue-pair tables and registers in front of the
:class:`~emulation.softswitch.pipeline.Pipeline`, whose aggregation is unchanged.

docs/protocol.md ("INA over RoCEv2") is the specification; this is its reference
implementation, which the other data planes are held to by the vectors. What a P4
program would hold: the tables and registers of ``roce_tables.py`` (``roce_jobs``,
``roce_requests``, ``roce_replies``; the UC responder's state of each request queue
pair and the next PSN of each reply queue pair), which the pipeline keeps
(``pipeline.roce``), and per-packet logic without loops but over the replicas; p4/roce.p4
and p4/roce_replies.p4 are the same for bmv2.

A frame goes through, in order: the ingress drop simulator; the parse (``truncated``,
``malformed``); the ICRC (``bad_icrc``); the request table (``unknown_qp``); the source
address (``bad_source``); the queue pair's message state (``bad_psn``; RETH checks:
``malformed``, ``bad_slot``, ``bad_length``); then the pipeline, as the INA ``DATA``
packet of the message's rank, slot, set, seq and exponent. Each result replica becomes a
WRITE to its worker's queue pair with the PSN its message and place fix (the queue pair's
base PSN + ``seq << ROCE_PSN_SEQ_SHIFT`` + place: the same each time it is sent), and only
then meets the egress drop simulator, so a dropped reply leaves a PSN gap, as a loss on
the wire does.

Workers are bound in the pipeline's workers table at ``(ip, ROCE_UDP_PORT)``: the source
port of RoCEv2 varies per queue pair, so only the address is checked, and one rank is one
address (an emulated RNIC binds one).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.softswitch.pipeline import Addr, DropReason, Emit, Pipeline
from emulation.softswitch.roce_tables import RoceRequest
from hostlib import rocev2
from hostlib.protocol import (
    HEADER,
    HEADER_SIZE,
    LANE_BYTES,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    ROCE_UDP_PORT,
    SLOT_MASK,
    PacketType,
)

__all__ = ["RoceFront", "RoceSend"]

_DATA_VT = (PROTOCOL_VERSION << 4) | PacketType.DATA


@dataclass(frozen=True, slots=True)
class RoceSend:
    """One frame to send: the UDP payload (BTH ... ICRC), to ``dest`` (ip, 4791), out of
    ``link`` (egress port, MAC) on a switch with ports, else None."""

    payload: bytes
    dest: Addr
    link: tuple[int, int] | None = None


class RoceFront:
    """RoCEv2 in front of ``pipeline``, whose RoCEv2 tables (``pipeline.roce``) it runs;
    replies come from ``address`` (the switch's IPv4, which the ICRC covers)."""

    def __init__(self, pipeline: Pipeline, address: str) -> None:
        self.pipeline = pipeline
        self.tables = pipeline.roce
        self.address = address
        self._ina = bytearray(HEADER_SIZE + pipeline.lanes * LANE_BYTES)

    # ----------------------------------------------------------------- per frame
    def process(self, data: memoryview, src: Addr, address: str | None = None) -> list[RoceSend]:
        """Run one RoCEv2 UDP payload from ``src`` through the switch; the frames to send.

        ``address``: the frame's destination IPv4 (the ICRC covers it; replies come from
        it), where a switch with ports has several; by default the front's.
        Never raises on frame content: anything invalid is dropped and counted.
        """
        address = address or self.address
        pipe = self.pipeline
        pipe.count("received")
        if pipe.drops.ingress and pipe.drops.drop_ingress():
            return self._drop(DropReason.SIM_INGRESS)
        try:
            frame = rocev2.parse_frame(data)
        except rocev2.RoceError as exc:
            truncated = str(exc).startswith("truncated")
            return self._drop(DropReason.TRUNCATED if truncated else DropReason.MALFORMED)
        if not rocev2.icrc_ok(src[0], address, src[1], data):
            return self._drop(DropReason.BAD_ICRC)
        entry = self.tables.requests.get(frame.dest_qp)
        if entry is None:
            return self._drop(DropReason.UNKNOWN_QP)
        packets = self.tables.jobs.get(entry.job_id)
        if packets is None:
            return self._drop(DropReason.UNKNOWN_JOB)
        if src[0] != entry.ip:  # only the queue pair's worker touches its state
            return self._drop(DropReason.BAD_SOURCE)
        source = (src[0], ROCE_UDP_PORT)
        reason = self._advance(frame, entry.qp_reg, packets)
        if reason is not None:
            return self._drop(reason)
        emit = pipe.aggregate(self._as_ina(frame, entry), source)
        return [] if emit is None else self._replies(emit, entry.job_id, packets, address)

    def _advance(self, frame: rocev2.RoceFrame, reg: int, packets: int) -> DropReason | None:
        """The UC responder's step on queue pair register ``reg``: open, continue or close
        the message; the reason to drop ``frame``, or None."""
        t, payload = self.tables, self.pipeline.lanes * LANE_BYTES
        if frame.opcode in rocev2.RETH_OPCODES:
            t.open[reg] = 0
            if frame.rkey >> 16:
                return DropReason.MALFORMED
            if frame.dma_length != packets * payload:
                return DropReason.BAD_LENGTH
            if (frame.rkey & SLOT_MASK) % packets:
                return DropReason.BAD_SLOT
            seq, exponent = rocev2.split_request_va(frame.va)
            t.base[reg], t.seq[reg], t.exponent[reg] = frame.rkey, seq, exponent
            t.place[reg] = 0
        elif not t.open[reg] or frame.psn != t.expect_psn[reg]:
            t.open[reg] = 0  # UC: the rest of the message is dropped too
            return DropReason.BAD_PSN
        if t.place[reg] >= packets:
            t.open[reg] = 0
            return DropReason.BAD_SLOT
        t.expect_psn[reg] = rocev2.psn_add(frame.psn, 1)
        t.open[reg] = frame.opcode not in rocev2.LAST_OPCODES
        if len(frame.payload) != payload:
            t.open[reg] = 0
            return DropReason.BAD_LENGTH
        return None

    def _as_ina(self, frame: rocev2.RoceFrame, entry: RoceRequest) -> memoryview:
        """The INA DATA packet the frame stands for (its place taken, then advanced)."""
        t, reg = self.tables, entry.qp_reg
        base = int(t.base[reg])
        place = int(t.place[reg])
        t.place[reg] = place + 1
        pidx = (base & POOL_SET_BIT) | ((base & SLOT_MASK) + place)
        lanes = self.pipeline.lanes
        HEADER.pack_into(self._ina, 0, _DATA_VT, 0, entry.job_id, entry.rank,
                         int(t.exponent[reg]), lanes, pidx, 0, int(t.seq[reg]))  # fmt: skip
        self._ina[HEADER_SIZE:] = frame.payload
        return memoryview(self._ina)

    def _replies(self, emit: Emit, job_id: int, packets: int, address: str) -> list[RoceSend]:
        """A WRITE per replica of the pipeline's result, with the PSN of its message and
        place, then the egress simulator; counts ``results_sent`` and ``drop_sim_egress``."""
        pipe = self.pipeline
        _, _, _, _, exponent, _, pidx, _, seq = HEADER.unpack_from(emit.payload)
        slot = pidx & SLOT_MASK
        position, place = divmod(slot, packets)
        opcode = rocev2.message_opcode(place, packets)
        lanes = bytes(emit.payload[HEADER_SIZE:])
        imm = rocev2.pack_imm(seq, exponent)
        sends = []
        for n, dest in enumerate(emit.dests):
            rank = pipe.worker_rank(job_id, dest)
            reply = None if rank is None else self.tables.replies.get((job_id, rank, position))
            if reply is None:
                continue  # no reply entry: nowhere to write (as a table miss drops)
            psn = rocev2.reply_psn(int(self.tables.reply_psn[reply.psn_reg]), seq, place)
            frame = rocev2.RoceFrame(opcode, reply.qpn, psn, lanes, reply.va, reply.rkey,
                                     packets * len(lanes), imm)  # fmt: skip
            if pipe.drops.egress and pipe.drops.drop_egress():
                pipe.count("drop_" + DropReason.SIM_EGRESS.value)
                continue
            link = emit.links[n] if n < len(emit.links) else None
            sends.append(RoceSend(rocev2.build_frame(frame, address, dest[0]), dest, link))
        pipe.count("results_sent", len(sends))
        return sends

    def _drop(self, reason: DropReason) -> list[RoceSend]:
        self.pipeline.count("drop_" + reason.value)
        return []
