"""INA over RoCEv2 in the TNA model: p4/tna/roce.p4 and roce_replies.p4, control by control.

Part of the executable TNA model (:mod:`emulation.tnamodel`): ``model.py`` calls it where
ina_tna.p4 applies the controls. Ingress: :meth:`RoceProgram.requests` (TnaRoceRequests:
the stateless lookups and header checks), :meth:`RoceProgram.step` (TnaRoceStep: the
queue pair's five registers, after the drop simulator) and :meth:`RoceProgram.verdict`
(TnaRoceVerdict, before the checks). Egress: :meth:`RoceProgram.reply` (TnaRoceEgress:
the RDMA WRITE and its PSN). The registers' RegisterActions are functions below, held
to the compiler's by tests/unit/test_tna_model.py; the const tables (roce_shapes,
roce_positions, roce_places) are read from the program's entries files. Like the
program, the model neither checks nor computes the ICRC: replies carry 0.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from emulation.tnamodel.packet import Headers, Ina, ina_or_zero
from emulation.tnamodel.phv import Phv, RoceMeta
from emulation.tnamodel.program import TNA_DIR, ConstTable, load_table
from emulation.tnamodel.stateful import (
    PassState,
    Register,
    RegisterAction,
    Salu,
    SaluOut,
    TofinoLimitError,
)

__all__ = ["RoceProgram", "RoceReply", "RoceRequest", "RoceTables", "parse_request"]

_M16 = 0xFFFF
_M32 = 0xFFFFFFFF
_PSN = 0xFFFFFF
_REG = 0x3FFF  # roce_qp_index_t: bit<14>
_BTH = struct.Struct("!BBHI I")
_RETH = struct.Struct("!QII")
_IPV4_DF = 2


class RoceRequest(NamedTuple):
    """set_roce_qp's parameters (the worker's address as the P4 field's integer)."""

    job_id: int
    rank: int
    qp_reg: int
    ipv4_src: int


class RoceReply(NamedTuple):
    """set_roce_reply's parameters."""

    qpn: int
    rkey: int
    va: int
    psn_index: int


@dataclass
class RoceTables:
    """The control plane's RoCEv2 tables: roce_requests, roce_jobs, roce_replies."""

    requests: dict[int, RoceRequest] = field(default_factory=dict)
    jobs: dict[int, int] = field(default_factory=dict)
    replies: dict[tuple[int, int, int], RoceReply] = field(default_factory=dict)


# --------------------------------------------------------------------- RegisterActions
def _roce(phv: Phv) -> RoceMeta:
    if phv.meta.roce is None:
        raise TofinoLimitError("a RoCEv2 RegisterAction on a packet the parser took as INA")
    return phv.meta.roce


def psn_first(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 psn_first: a FIRST or ONLY that leaves its message open."""
    return SaluOut(_roce(phv).next_open, 1)


def psn_close(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 psn_close: a FIRST or ONLY that leaves no message open, or was refused."""
    return SaluOut(0, 1)


def psn_next(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 psn_next: the expected PSN of an open message moves on, else it closes."""
    r = _roce(phv)
    if salu.cond(value == r.psn_open):
        return SaluOut(r.next_open, 1)
    return SaluOut(0, 0)


def psn_next_close(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 psn_next_close: as psn_next for a packet that closes the message."""
    return SaluOut(0, int(salu.cond(value == _roce(phv).psn_open)))


def place_first(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 place_first: the message's next packet is its second."""
    return SaluOut(1, 0)


def place_next(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 place_next: 1 (over) beyond the message's packets, else count it."""
    if salu.cond(value > _roce(phv).mask):
        return SaluOut(value, 1)
    return SaluOut((value + 1) & _M16, 0)


def base_first(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 base_first: the R_Key's pool index is this packet's; the next follows."""
    pool_index = _roce(phv).rkey & _M16
    return SaluOut((pool_index + 1) & _M16, pool_index)


def base_next(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 base_next: this packet's pool index, and the next's."""
    return SaluOut((value + 1) & _M16, value)


def base_peek(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 base_peek (pass 2): the pool index pass 1 took."""
    return SaluOut(value, (value - 1) & _M16)


def seq_first(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 seq_first: the VA's bits 63..32."""
    seq = (_roce(phv).va >> 32) & _M32
    return SaluOut(seq, seq)


def exponent_first(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 exponent_first: the VA's bits 31..24."""
    exponent = (_roce(phv).va >> 24) & 0xFF
    return SaluOut(exponent, exponent)


def read(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce.p4 seq_read and exponent_read."""
    return SaluOut(value, value)


def read_psn(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """roce_replies.p4 read_psn: the queue pair's base PSN + the reply's offset (seq and
    place, from roce_positions), the base unchanged."""
    return SaluOut(value, (value + phv.meta.roce_psn_offset) & _M32)


def registers(size: int) -> list[Register]:
    """The RoCEv2 registers of ``size`` cells (ROCE_QP_REGISTERS) with their actions."""
    ra = RegisterAction
    return [
        Register("Ingress.roce.expect_psn", 32, size, [
            ra("psn_first", psn_first, 8), ra("psn_close", psn_close, 8),
            ra("psn_next", psn_next, 8), ra("psn_next_close", psn_next_close, 8),
        ]),
        Register("Ingress.roce.place", 16, size, [
            ra("place_first", place_first, 8), ra("place_next", place_next, 8),
        ]),
        Register("Ingress.roce.base", 16, size, [
            ra("base_first", base_first, 16), ra("base_next", base_next, 16),
            ra("base_peek", base_peek, 16),
        ]),
        Register("Ingress.roce.seq", 32, size, [
            ra("seq_first", seq_first, 32), ra("seq_read", read, 32),
        ]),
        Register("Ingress.roce.exponent", 8, size, [
            ra("exponent_first", exponent_first, 8), ra("exponent_read", read, 8),
        ]),
        Register("Egress.roce.reply_psn", 32, size, [ra("read_psn", read_psn, 32)]),
    ]  # fmt: skip


# --------------------------------------------------------------------- parser
def parse_request(hdr: Headers, c: dict[str, int], lanes: int) -> RoceMeta:
    """The ingress parser's RoCEv2 states on ``hdr.rest`` (the UDP payload): BTH, the
    opcode's RETH and ImmDt, the lanes (into ``hdr.lanes``) and the ICRC; each header is
    invalid if the frame ends before it, and an opcode INA does not send stops there."""
    data, r = hdr.rest, RoceMeta()
    if len(data) < _BTH.size:
        return r
    r.bth = True
    opcode, _, _, qp, psn = _BTH.unpack_from(data)
    r.opcode, r.dest_qp, r.psn = opcode, qp & _PSN, psn & _PSN
    kinds = {
        c["ROCE_WRITE_FIRST"]: (1, 0, 0), c["ROCE_WRITE_ONLY"]: (1, 1, 0),
        c["ROCE_WRITE_ONLY_IMM"]: (1, 1, 1), c["ROCE_WRITE_MIDDLE"]: (0, 0, 0),
        c["ROCE_WRITE_LAST"]: (0, 1, 0), c["ROCE_WRITE_LAST_IMM"]: (0, 1, 1),
    }  # fmt: skip
    if opcode not in kinds:
        return r
    r.opcode_ok = 1
    r.first, r.last, r.imm = kinds[opcode]
    at = _BTH.size
    if r.first:
        if len(data) < at + _RETH.size:
            return r
        r.reth = True
        r.va, r.rkey, r.dma_length = _RETH.unpack_from(data, at)
        at += _RETH.size
    if r.imm:
        if len(data) < at + 4:
            return r
        r.immdt = True
        at += 4
    end = at + 4 * lanes + c["ROCE_ICRC_BYTES"]
    if len(data) >= end:
        r.data = True
        hdr.lanes = list(struct.unpack_from(f"!{lanes}I", data, at))
        hdr.rest = data[end - c["ROCE_ICRC_BYTES"] :]
    return r


# --------------------------------------------------------------------- the controls
class RoceProgram:
    """The RoCEv2 controls of the TNA program, over the model's registers and constants.

    Args:
        c: the program's constants (the model's lanes).
        lanes: TNA_LANES_PER_PACKET.
        regs: the model's registers by name (it holds :func:`registers`'s).

    Raises:
        ProgramError: the const tables cannot be read from p4/tna/.
    """

    def __init__(self, c: dict[str, int], lanes: int, regs: dict[str, Register]) -> None:
        self.c = c
        self.lanes = lanes
        self.regs = regs
        self.tables = RoceTables()
        self.const_tables: dict[str, ConstTable] = {
            "Ingress.roce.roce_shapes": load_table(
                TNA_DIR / "roce.p4", "roce_shapes", TNA_DIR / "roce_shapes_entries.p4", c
            ),
            "Egress.roce.roce_positions": load_table(
                TNA_DIR / "roce_replies.p4", "roce_positions",
                TNA_DIR / "roce_positions_entries.p4", c,
            ),
            "Egress.roce.roce_places": load_table(
                TNA_DIR / "roce_replies.p4", "roce_places", TNA_DIR / "roce_places_entries.p4", c
            ),
        }  # fmt: skip

    # ----------------------------------------------------------------- ingress
    def requests(self, phv: Phv, ipv4_src: int) -> None:
        """TnaRoceRequests: roce_requests, the INA header, the header checks, roce_jobs,
        roce_shapes and the checks before the queue pair's state, in ../roce.p4's order."""
        r, hdr, c = _roce(phv), phv.hdr, self.c
        hit = self.tables.requests.get(r.dest_qp if r.bth else 0)
        if hit is None:
            r.qp_miss = 1
        else:
            r.job, r.rank, r.reg = hit.job_id, hit.rank, hit.qp_reg & _REG
            r.src_diff = ipv4_src ^ hit.ipv4_src
        hdr.ina = Ina(c["PROTOCOL_VERSION"], c["PTYPE_DATA"], 0, r.job, r.rank, 0, self.lanes,
                      0, 0, 0)  # fmt: skip
        udp_length = hdr.udp.length if hdr.udp is not None else 0
        if hdr.udp is not None:
            hdr.udp.src_port = c["ROCE_UDP_PORT"]
        r.short = int(not r.bth or udp_length < 24)  # roce.p4: length[15:5] 0, [4:3] not 3
        r.missing = int(bool((r.first and not r.reth) or (r.imm and not r.immdt)))
        r.len_ok = int(r.data and udp_length == self._udp_length(r))
        r.psn_open = (r.psn << 8) | c["ROCE_QP_OPEN"]
        r.next_open = (r.psn_open + c["ROCE_QP_PSN_ONE"]) & _M32
        r.opens = int(not r.last and r.len_ok)
        shift = self.tables.jobs.get(r.job)
        if shift is None:
            r.job_miss = 1
        else:
            r.shift = shift
        r.bad_source = int(r.src_diff != 0)
        self._shapes(r)
        reasons = (
            (r.short, "DROP_TRUNCATED"), (not r.opcode_ok, "DROP_MALFORMED"),
            (r.missing, "DROP_TRUNCATED"), (r.qp_miss, "DROP_UNKNOWN_QP"),
            (r.job_miss, "DROP_UNKNOWN_JOB"), (r.bad_source, "DROP_BAD_SOURCE"),
        )  # fmt: skip
        reason = next((name for failed, name in reasons if failed), None)
        if reason is not None:
            r.dropped, r.reason = 1, c[reason]

    def _udp_length(self, r: RoceMeta) -> int:
        c = self.c
        if r.first:
            return c["TNA_ROCE_UDP_ONLY_IMM"] if r.imm else c["TNA_ROCE_UDP_FIRST"]
        return c["TNA_ROCE_UDP_LAST_IMM"] if r.imm else c["TNA_ROCE_UDP_BYTES"]

    def _shapes(self, r: RoceMeta) -> None:
        keys = {"first": r.first, "msg_shift": r.shift, "dma_length": r.dma_length,
                "rkey": r.rkey}  # fmt: skip
        entry = self.const_tables["Ingress.roce.roce_shapes"].apply(keys)
        if entry.action == "roce_shape":
            (r.mask,) = entry.args
        elif entry.action == "roce_first_bad":
            r.first_bad, (r.first_reason,) = 1, entry.args
        else:
            raise TofinoLimitError(f"roce_shapes: unknown action {entry.action}")

    def step(self, phv: Phv, state: PassState) -> None:
        """TnaRoceStep: a check's drop reason, unless the drop simulator came first; the
        queue pair's registers, which give the INA packet its pool index, seq and
        exponent; the frame goes on as INA with the ICRC 0 after the lanes."""
        r, meta, hdr = _roce(phv), phv.meta, phv.hdr
        ina = ina_or_zero(hdr)
        counts = meta.sim_drop == 0 or meta.second_pass == 1
        if r.dropped and counts:
            meta.drop_reason = r.reason
        r.psn_ok = 1
        if not r.dropped and counts:
            if not meta.second_pass:
                if r.first:
                    psn = "psn_first" if not r.first_bad and r.opens else "psn_close"
                else:
                    psn = "psn_next" if r.opens else "psn_next_close"
                r.psn_ok = self._execute("Ingress.roce.expect_psn", psn, phv, state)
            if not r.first_bad:
                if meta.second_pass:
                    ina.pool_index = self._execute("Ingress.roce.base", "base_peek", phv, state)
                else:
                    kind = "first" if r.first else "next"
                    r.over = self._execute("Ingress.roce.place", f"place_{kind}", phv, state)
                    ina.pool_index = self._execute("Ingress.roce.base", f"base_{kind}", phv, state)
                first = r.first and not meta.second_pass
                kind = "first" if first else "read"
                ina.seq = self._execute("Ingress.roce.seq", f"seq_{kind}", phv, state)
                ina.exponent = self._execute("Ingress.roce.exponent", f"exponent_{kind}", phv,
                                             state)  # fmt: skip
        if r.data:
            hdr.rest = bytes(4) + hdr.rest[4:]  # icrc.crc = 0

    def verdict(self, phv: Phv) -> None:
        """TnaRoceVerdict: the queue pair's verdict, in ../roce.p4's order."""
        r, meta, c = _roce(phv), phv.meta, self.c
        if r.dropped or not (meta.sim_drop == 0 or meta.second_pass == 1):
            return
        if r.first_bad:
            meta.drop_reason = r.first_reason
        elif not r.psn_ok:
            meta.drop_reason = c["DROP_BAD_PSN"]
        elif r.over:
            meta.drop_reason = c["DROP_BAD_SLOT"]
        elif not r.len_ok:
            meta.drop_reason = c["DROP_BAD_LENGTH"]

    def _execute(self, register: str, action: str, phv: Phv, state: PassState) -> int:
        return self.regs[register].execute(action, _roce(phv).reg, phv, state)

    # ----------------------------------------------------------------- egress
    def reply(self, phv: Phv, shift: int, rank: int, state: PassState) -> bool:
        """TnaRoceEgress on a result ``phv`` (the INA header parsed, the lanes and the
        ICRC its rest) for worker ``rank``: the WRITE's headers in place of the INA header,
        with the PSN of its message and place. False when a table misses (the reply is
        dropped uncounted)."""
        hdr, c = phv.hdr, self.c
        ina = ina_or_zero(hdr)
        keys = {"msg_shift": shift}
        pos = self.const_tables["Egress.roce.roce_positions"].apply(keys)
        if not pos.action.startswith("roce_shift_") or pos.action == "roce_shift_miss":
            return False
        n = int(pos.action.rsplit("_", 1)[1])
        position = (ina.pool_index & 0x7FFF) >> n
        at = ina.pool_index & ((1 << n) - 1)
        phv.meta.roce_psn_offset = ((ina.seq << c["ROCE_PSN_SEQ_SHIFT"]) | at) & _M32
        dma_length = c[f"TNA_ROCE_MSG_BYTES_{1 << n}"]
        place = (
            self.const_tables["Egress.roce.roce_places"]
            .apply({"msg_shift": shift, "pool_index": ina.pool_index})
            .action
        )
        kinds = {"roce_only": ("ROCE_WRITE_ONLY_IMM", 1, 1, "TNA_ROCE_UDP_ONLY_IMM"),
                 "roce_first": ("ROCE_WRITE_FIRST", 1, 0, "TNA_ROCE_UDP_FIRST"),
                 "roce_middle": ("ROCE_WRITE_MIDDLE", 0, 0, "TNA_ROCE_UDP_BYTES"),
                 "roce_last": ("ROCE_WRITE_LAST_IMM", 0, 1, "TNA_ROCE_UDP_LAST_IMM")}  # fmt: skip
        opcode, first, last, length = kinds[place]
        entry = self.tables.replies.get((ina.job_id, rank, position))
        if entry is None:
            return False
        psn = self.regs["Egress.roce.reply_psn"].execute("read_psn", entry.psn_index & _REG,
                                                         phv, state)  # fmt: skip
        out = _BTH.pack(c[opcode], 0, 0xFFFF, entry.qpn & _PSN, psn & _PSN)
        if first:
            out += _RETH.pack(entry.va, entry.rkey, dma_length)
        if last:
            out += (((ina.seq & _PSN) << 8) | ina.exponent).to_bytes(4, "big")
        _address(hdr, c["ROCE_UDP_PORT"], c[length], c["IPV4_HEADER_BYTES"])
        hdr.roce, hdr.ina = out, None
        return True


def _address(hdr: Headers, port: int, udp_length: int, ipv4_bytes: int) -> None:
    """UDP 4791 both ways, the WRITE's lengths, IPv4 identification 0 and DF."""
    if hdr.udp is None or hdr.ipv4 is None:
        raise TofinoLimitError("a RoCEv2 reply without IPv4/UDP")  # the parser guarantees it
    hdr.udp.src_port = hdr.udp.dst_port = port
    hdr.udp.length, hdr.udp.checksum = udp_length, 0
    ip = hdr.ipv4
    ip.total_len, ip.identification = udp_length + ipv4_bytes, 0
    ip.flags_frag = (_IPV4_DF << 13) | (ip.flags_frag & 0x1FFF)
