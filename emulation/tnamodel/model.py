"""An executable model of the Tofino (TNA) program p4/tna/ina_tna.p4, pass by pass.

What a Tofino runs, transcribed control by control so that the data-plane vectors
(tests/dataplane) can hold the TNA program to the soft switch's reference semantics
(emulation/softswitch/pipeline.py) without Tofino hardware or its model: the registers
by their P4 names, one Python function per RegisterAction, executed under the stateful
ALU's limits (:mod:`emulation.tnamodel.stateful`); the const tables read from the
program's generated entries (:mod:`emulation.tnamodel.program`); the other tables,
multicast groups and counters as data. A frame goes through ingress pass 1, a resubmitted
pass 2 when the program resubmits it, and egress once per replica.

It is a model, not the program: the ingress and egress drop simulators draw from a
seeded ``random.Random`` (Tofino's Random extern cannot be seeded), and the parsers and
the traffic manager are the program's intent, not Tofino's every corner (a frame arrives
as built unless ``min_frame`` pads it as an Ethernet wire would).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from emulation.tnamodel.actions import (
    advance,
    below,
    check,
    exponent_max,
    exponent_read,
    exponent_write,
    final_clear,
    final_read,
    final_take,
    lane_op,
    missing_join,
    missing_peek,
    missing_restart,
    missing_start,
)
from emulation.tnamodel.control import ControlPlane, TableError, _Tables
from emulation.tnamodel.packet import (
    Ethernet,
    Headers,
    Ipv4,
    Udp,
    deparse,
    ina_or_zero,
    ipv4_checksum,
    parse,
)
from emulation.tnamodel.phv import Meta, Phv, Resubmit
from emulation.tnamodel.program import (
    P4_DIR,
    TNA_DIR,
    ConstTable,
    Entry,
    load_constants,
    load_table,
)
from emulation.tnamodel.roce import RoceProgram, parse_request
from emulation.tnamodel.roce import registers as roce_registers
from emulation.tnamodel.sharing import COUNTERS as SHARING_COUNTERS
from emulation.tnamodel.sharing import SharingProgram
from emulation.tnamodel.sharing import registers as sharing_registers
from emulation.tnamodel.stateful import (
    PassState,
    Register,
    RegisterAction,
    TofinoLimitError,
)

__all__ = ["TableError", "TnaModel", "TofinoLimitError"]


@dataclass
class Bridge:
    """bridge_h: what ingress tells egress."""

    result: int = 0
    upward: int = 0
    multicast: int = 0
    flooded: int = 0
    roce: int = 0
    fallback: int = 0
    ingress_port: int = 0
    roce_shift: int = 0
    fallback_stats: int = 0


@dataclass
class _Tm:
    """The ingress deparser's and traffic manager's inputs."""

    drop: bool = False
    resubmit: bool = False
    ucast_port: int | None = None
    mcast_grp: int = 0


TABLE_ACTIONS: dict[str, tuple[str, ...]] = {
    "Ingress.upstream.upstream": ("set_upstream", "upstream_miss"),
    "Ingress.jobs.jobs": ("set_job", "job_miss"),
    "Ingress.workers.workers": ("worker_hit", "worker_miss"),
    "Ingress.masks.masks": ("set_mask", "mask_miss"),
    "Ingress.checks.checks": (
        "drop", "join", "peek", "start", "take", "restart", "restart_shared", "join_resend",
        "take_over", "place", "place_resend", "to_fallback", "collide_fallback", "collide",
        "from_fallback",
    ),
    "Ingress.next_step.next_step": (
        "answer", "answer_upstream", "duplicate", "duplicate_fallback", "add",
        "add_complete", "resubmit", "stale", "first", "first_complete", "take_result",
    ),
    "Ingress.sharing.shared": ("set_shared", "shared_miss"),
    "Ingress.sharing.fallback": ("set_fallback", "fallback_miss"),
    "Ingress.sharing.behind": ("set_behind", "behind_miss"),
    "Ingress.forwarder.forward": ("set_egress_port", "flood", "forward_drop"),
    "Egress.replicas.replicas": ("set_destination", "replica_miss"),
    "Ingress.roce.roce_requests": ("set_roce_qp", "roce_qp_miss"),
    "Ingress.roce.roce_jobs": ("set_roce_job", "roce_job_miss"),
    "Ingress.roce.roce_shapes": ("roce_shape", "roce_first_bad"),
    "Egress.roce.roce_replies": ("set_roce_reply", "roce_reply_miss"),
    "Egress.roce.roce_positions": (
        "roce_shift_0", "roce_shift_1", "roce_shift_2", "roce_shift_3", "roce_shift_4",
        "roce_shift_5", "roce_shift_miss",
    ),
    "Egress.roce.roce_places": ("roce_only", "roce_first", "roce_middle", "roce_last"),
}  # fmt: skip
"""The program's tables and the actions each may run (short names; the full name is
the table's control and the action, e.g. ``Ingress.jobs.set_job``): what this model
implements, held to the P4Info by tests/unit/test_tna_model.py."""


class TnaModel(ControlPlane):
    """The TNA program with its state: registers, tables, multicast groups, counters.

    Args:
        lanes: lanes per packet (the program's TNA_LANES_PER_PACKET; gen_tna.py writes
            the program for any count 1..99). Default: p4/tna/configuration.p4's.
        slots: slots per set, a power of two (TNA_SWITCH_SLOTS); the register index is
            {set, abs_slot's low log2(slots) bits}.
        seed: the drop simulators' random stream.
        min_frame: frames shorter than this many bytes arrive zero-padded to it, as an
            Ethernet wire delivers them (60 without the FCS); 0, the default, takes a
            frame as built, as veths do.

    Raises:
        ValueError: lanes outside 1..99, slots not a power of two up to 2**15.
        ProgramError: the P4 sources cannot be read.
    """

    def __init__(
        self, lanes: int | None = None, slots: int | None = None, seed: int = 0, min_frame: int = 0
    ) -> None:
        # The program gen_tna.py writes for ``lanes``: what follows from them follows.
        given = None if lanes is None else {"TNA_LANES_PER_PACKET": lanes}
        files = (P4_DIR / "configuration.p4", TNA_DIR / "configuration.p4")
        self.c = load_constants(*files, given=given)
        self.lanes = self.c["TNA_LANES_PER_PACKET"]
        self.slots = self.c["TNA_SWITCH_SLOTS"] if slots is None else slots
        if not 1 <= self.lanes <= 99:
            raise ValueError(f"lanes {self.lanes} outside 1..99 (two-digit lane names)")
        if not (0 < self.slots <= 1 << 15 and self.slots & (self.slots - 1) == 0):
            raise ValueError(f"slots {self.slots}: a power of two up to 2**15")
        self.payload_bytes = self.c["HEADER_SIZE"] + self.lanes * self.c["LANE_BYTES"]
        self._random = random.Random(seed)
        self.min_frame = min_frame
        self.registers = self._registers()
        self.tables = _Tables()
        self.const_tables = self._const_tables()
        self.roce = RoceProgram(self.c, self.lanes, self.registers)
        """roce.p4 and roce_replies.p4: their tables (``roce.tables``) and controls."""
        self.sharing = SharingProgram(self.registers, self.slots)
        """sharing.p4: its tables (``sharing.tables``), the owner register's control."""
        self.passes: list[str] = []
        """The passes the last frame took (``ingress pass 1``, ``ingress pass 2``,
        ``egress to port P rid R``), for tests of the pass structure."""
        self.counters: dict[str, list[int]] = {
            "Ingress.received": [0],
            "Ingress.completed": [0],
            "Ingress.ina_stats": [0] * self.c["NUM_STATS"],
            "Ingress.drops": [0] * self.c["NUM_DROP_REASONS"],
            "Egress.ina_stats": [0] * self.c["NUM_STATS"],
            "Egress.drops": [0] * self.c["NUM_DROP_REASONS"],
        }
        self.counters.update({n: [0] * self.c["SHARING_STATS_SIZE"] for n in SHARING_COUNTERS})

    # ----------------------------------------------------------------- program state
    def _registers(self) -> dict[str, Register]:
        size, c = 2 * self.slots, self.c
        ra = RegisterAction
        registers = [
            Register("Ingress.seq", 32, size, [ra("check", check, 32), ra("advance", advance, 32)]),
            Register("Ingress.missing", 32, size, [
                ra("missing_join", missing_join, 32), ra("missing_peek", missing_peek, 32),
                ra("missing_start", missing_start, 32),
                ra("missing_restart", missing_restart, 32),
            ]),
            Register("Ingress.final", 8, size, [
                ra("final_read", final_read, 8), ra("final_clear", final_clear, 8),
                ra("final_take", final_take(c["LANE_OP_WRITE"], c["LANE_OP_NONE"]), 8),
            ]),
            Register("Ingress.exponents.exponent", 8, size, [
                ra("exponent_write", exponent_write, 8), ra("exponent_max", exponent_max, 8),
                ra("exponent_read", exponent_read, 8),
            ]),
            Register("Ingress.drop_simulator.probability", 32, 1, [ra("below", below, 8)]),
            Register("Egress.drop_simulator.probability", 32, 1, [ra("below", below, 8)]),
        ]  # fmt: skip
        write, add = self.c["LANE_OP_WRITE"], self.c["LANE_OP_ADD"]
        registers += [
            Register(
                f"Ingress.values.lane_{n:02d}",
                32,
                size,
                [ra(f"lane_{n:02d}_op", lane_op(n, write, add), 32)],
            )
            for n in range(self.lanes)
        ]
        registers += roce_registers(self.c["ROCE_QP_REGISTERS"])
        registers += sharing_registers(self.slots)
        return {r.name: r for r in registers}

    def _const_tables(self) -> dict[str, ConstTable]:
        def table(control: str, name: str) -> ConstTable:
            entries = TNA_DIR / f"{control}_entries.p4"
            return load_table(TNA_DIR / f"{control}.p4", name, entries, self.c)

        return {
            "Ingress.masks.masks": table("masks", "masks"),
            "Ingress.checks.checks": table("checks", "checks"),
            "Ingress.next_step.next_step": table("next_step", "next_step"),
        }

    def statistics(self) -> dict[str, int]:
        """The counters by protocol name (``received``, ..., ``drop_<reason>``): a
        statistic sums its cells of Ingress and Egress (as controller.stats reads them);
        ``received`` and ``completed`` have counters of their own."""
        out: dict[str, int] = {}
        for const, index in self.c.items():
            if const.startswith("STAT_"):
                name = const[5:].lower()
                cells = (self.counters["Ingress.ina_stats"], self.counters["Egress.ina_stats"])
            elif const.startswith("DROP_"):
                name = "drop_" + const[5:].lower()
                cells = (self.counters["Ingress.drops"], self.counters["Egress.drops"])
            else:
                continue
            out[name] = sum(c[index] for c in cells)
        out["received"] += self.counters["Ingress.received"][0]
        out["completed"] += self.counters["Ingress.completed"][0]
        return out

    # ----------------------------------------------------------------- data path
    def process(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Run ``frame`` arriving on ``port`` through the program: ingress, a resubmitted
        second pass if the program asks, the traffic manager, egress per replica.

        Returns:
            The frames that leave, as (egress port, bytes), in replica order.

        Raises:
            TofinoLimitError: the program broke a Tofino limit on this frame.
        """
        self.passes = []
        frame = frame.ljust(self.min_frame, b"\0")
        resubmit = Resubmit()
        tm, bridge, out = self._ingress(port, frame, None, resubmit)
        if tm.resubmit:
            tm, bridge, out = self._ingress(port, frame, resubmit, Resubmit())
            if tm.resubmit:
                raise TofinoLimitError("Tofino 1 resubmits a packet once")
        if tm.drop:
            return []
        copies: list[tuple[int, int]] = []
        if tm.mcast_grp:
            copies += self.tables.groups.get(tm.mcast_grp, ())
        if tm.ucast_port is not None:
            copies.append((tm.ucast_port, 0))
        sent = []
        for egress_port, rid in copies:
            frame_out = self._egress(bridge, out, egress_port, rid)
            if frame_out is not None:
                sent.append((egress_port, frame_out))
        return sent

    def _count(self, counter: str, index: int) -> None:
        cells = self.counters[counter]
        if not 0 <= index < len(cells):
            raise TofinoLimitError(f"{counter}[{index}] outside its {len(cells)} cells")
        cells[index] += 1

    def _execute(self, register: str, action: str, phv: Phv, state: PassState) -> int:
        return self.registers[register].execute(action, phv.meta.index, phv, state)

    # ----------------------------------------------------------------- ingress
    def _ingress(
        self, port: int, frame: bytes, parsed: Resubmit | None, data: Resubmit
    ) -> tuple[_Tm, Bridge, bytes]:
        """One ingress pass (InaIngress): the traffic manager's orders, the bridge header
        and the deparsed frame. ``parsed``: the resubmit data of pass 2 (None in pass 1);
        ``data``: the resubmit data this pass writes (pass 1's to pass 2)."""
        hdr = parse(frame, self.c["INA_UDP_PORT"], self.lanes)
        second_pass = parsed is not None
        phv = Phv(hdr, Meta(second_pass=int(second_pass), drop_reason=self.c["TNA_NO_DROP"]))
        if parsed is not None:  # parsers.p4's parse_resubmit, parse_shared_*
            phv.meta.shared_pass = parsed.shared
            phv.meta.shared_check = parsed.shared & parsed.check
            data.pass_, data.shared, data.check = parsed.pass_, parsed.shared, parsed.check
            data.cell, data.held = parsed.cell, parsed.held
        phv.meta.resubmit_data = data
        if not hdr.is_ina and hdr.udp is not None and hdr.udp.dst_port == self.c["ROCE_UDP_PORT"]:
            phv.meta.is_roce, hdr.is_ina = 1, True  # parsers.p4's parse_bth
            phv.meta.roce = parse_request(hdr, self.c, self.lanes)
        state = PassState("ingress pass 2" if second_pass else "ingress pass 1")
        self.passes.append(state.name)
        bridge, tm = Bridge(ingress_port=port), _Tm()
        if not hdr.is_ina:
            self._forwarder(hdr, bridge, tm)
        else:
            self._ina_ingress(phv, state, bridge, tm, port)
        return tm, bridge, deparse(hdr)

    def _forwarder(self, hdr: Headers, bridge: Bridge, tm: _Tm) -> None:
        dst = int.from_bytes(hdr.ethernet.dst) if hdr.ethernet is not None else 0
        action, param = self.tables.forward.get(dst, ("drop", 0))
        if action == "port":
            tm.ucast_port = param
        elif action == "flood":
            tm.mcast_grp = param
            bridge.flooded = 1
        else:
            tm.drop = True

    def _ina_ingress(self, phv: Phv, state: PassState, bridge: Bridge, tm: _Tm, port: int) -> None:
        meta, c = phv.meta, self.c
        if not meta.second_pass:
            self._count("Ingress.received", 0)
        if meta.is_roce:
            self.roce.requests(phv, int.from_bytes(_ipv4(phv.hdr).src))
        self._header_flags(phv)
        meta.draw = self._random.getrandbits(31)
        meta.sim_drop = self._execute("Ingress.drop_simulator.probability", "below", phv, state)
        if meta.is_roce and meta.roce is not None:
            self.roce.step(phv, state)
            bridge.roce, bridge.roce_shift = 1, meta.roce.shift
        self._upstream(phv)
        self.sharing.lookup(phv, int.from_bytes(_ipv4(phv.hdr).src), _udp(phv.hdr).src_port)
        self._jobs(phv)
        self._workers(phv)
        self._masks(phv)
        if meta.job_hit:
            meta.slot_diff = (meta.slot - meta.slot_count) & 0xFFFF
            meta.slot_next = (meta.slot + 1) & 0xFFFF
        meta.index = self._index(meta.abs_slot, meta.resubmit_data.cell)
        if meta.job_hit:
            advance = meta.second_pass and not meta.shared_check
            meta.seq_diff = self._execute("Ingress.seq", "advance" if advance else "check",
                                          phv, state)  # fmt: skip
        self.sharing.pool_slot(phv)
        if meta.is_roce:
            self.roce.verdict(phv)
        self.sharing.wrap(phv)
        if meta.drop_reason == c["TNA_NO_DROP"]:
            self._checks(phv, state)
        if meta.mode != c["MODE_NONE"]:
            self._next_step(phv, state)
        self.sharing.cell(phv)
        self._values(phv, state)
        if meta.place:
            self.sharing.place(phv, state)
        shared, fallback = meta.shared, meta.fallback
        if meta.collision and shared is not None:
            self._count("Ingress.sharing.collisions", shared.stats)
        if meta.drop_reason != c["TNA_NO_DROP"]:
            self._count("Ingress.drops", meta.drop_reason)
            tm.drop = True
        elif meta.resubmit:
            meta.resubmit_data.pass_ = c["TNA_PASS_SECOND"]
            tm.resubmit = True
        else:
            self._results(phv, bridge, tm, port)
            if meta.stat != c["STAT_RECEIVED"]:
                self._count("Ingress.ina_stats", meta.stat)
            if meta.shared_use and shared is not None:
                self._count("Ingress.sharing.shared_uses", shared.stats)
            if meta.from_fallback and fallback is not None:
                self._count("Ingress.sharing.from_fallback", fallback.stats)
            if meta.complete:
                self._count("Ingress.completed", 0)

    def _index(self, abs_slot: int, cell: int) -> int:
        """{abs_slot[15], abs_slot's slot bits XOR the resubmit data's cell}: the (set,
        slot) register index (seq.p4's XOR16 hash; cell is 0 but in a shared slot's
        pass 2, where it turns the job slot into its pool slot)."""
        return (abs_slot >> 15 & 1) * self.slots + ((abs_slot ^ cell) & (self.slots - 1))

    def _header_flags(self, phv: Phv) -> None:
        hdr, meta, c = phv.hdr, phv.meta, self.c
        ina = hdr.ina
        if ina is not None:
            meta.version_ok = int(ina.version == c["PROTOCOL_VERSION"])
            meta.is_data = int(ina.ptype == c["PTYPE_DATA"])
            meta.is_result = int(ina.ptype == c["PTYPE_RESULT"])
            meta.lanes_ok = int(ina.num_lanes == self.lanes)
        if hdr.lanes is not None and hdr.udp is not None and hdr.ipv4 is not None:
            udp_len = c["UDP_HEADER_BYTES"] + self.payload_bytes
            meta.length_ok = int(  # roce.p4 checked a RoCEv2 frame's (other) lengths
                meta.is_roce == 1
                or (
                    hdr.udp.length == udp_len
                    and hdr.ipv4.total_len == c["IPV4_HEADER_BYTES"] + udp_len
                )
            )

    def _upstream(self, phv: Phv) -> None:
        hdr, meta = phv.hdr, phv.meta
        up = self.tables.upstream.get(ina_or_zero(hdr).job_id)
        if up is None:
            return  # upstream_miss
        meta.has_upstream = 1
        meta.upstream = up
        meta.upstream_ip_diff = up.dst_ip ^ int.from_bytes(_ipv4(hdr).src)
        meta.upstream_port_diff = up.dst_port ^ _udp(hdr).src_port

    def _jobs(self, phv: Phv) -> None:
        ina, meta = ina_or_zero(phv.hdr), phv.meta
        job = self.tables.jobs.get(ina.job_id)
        if job is None:
            return  # job_miss
        meta.job_hit = 1
        meta.num_workers = job.num_workers
        meta.abs_slot = (job.slot_base + ina.pool_index) & 0xFFFF
        meta.slot_count = job.slot_count
        meta.slot = ina.pool_index & self.c["SLOT_MASK"]
        meta.mgid = job.mgid

    def _workers(self, phv: Phv) -> None:
        hdr = phv.hdr
        ina = ina_or_zero(hdr)
        key = (ina.job_id, ina.rank, int.from_bytes(_ipv4(hdr).src), _udp(hdr).src_port)
        phv.meta.worker_hit = int(key in self.tables.workers)

    def _masks(self, phv: Phv) -> None:
        meta = phv.meta
        keys = {"rank": ina_or_zero(phv.hdr).rank, "num_workers": meta.num_workers}
        entry = self.const_tables["Ingress.masks.masks"].apply(keys)
        if entry.action == "set_mask":
            meta.rank_ok = 1
            meta.not_bit, meta.others = entry.args
        elif entry.action != "mask_miss":
            raise TableError(f"masks: unknown action {entry.action}")

    def _checks(self, phv: Phv, state: PassState) -> None:
        hdr, meta, c = phv.hdr, phv.meta, self.c
        keys = {
            "second_pass": meta.second_pass, "sim_drop": meta.sim_drop,
            "ina_valid": int(hdr.ina is not None), "udp_length": _udp(hdr).length,
            "version_ok": meta.version_ok,
            "is_data": meta.is_data, "is_result": meta.is_result,
            "has_upstream": meta.has_upstream, "job_hit": meta.job_hit,
            "rank_ok": meta.rank_ok, "worker_hit": meta.worker_hit,
            "upstream_ip_diff": meta.upstream_ip_diff,
            "upstream_port_diff": meta.upstream_port_diff, "slot_diff": meta.slot_diff,
            "lanes_ok": meta.lanes_ok, "length_ok": meta.length_ok, "seq_diff": meta.seq_diff,
            "has_fallback": meta.has_fallback, "fallback_ip_diff": meta.fallback_ip_diff,
            "fallback_port_diff": meta.fallback_port_diff, "has_shared": meta.has_shared,
            "shared_pass": meta.shared_pass, "held": meta.resubmit_data.held & 3,
            "resend": ina_or_zero(hdr).flags & 1, "loose": meta.is_behind,
        }  # fmt: skip
        entry = self.const_tables["Ingress.checks.checks"].apply(keys)
        modes = {
            "join": ("MODE_JOIN", "missing_join"), "peek": ("MODE_PEEK", "missing_peek"),
            "start": ("MODE_START", "missing_start"), "take": ("MODE_RESULT", "missing_peek"),
            "restart": ("MODE_RESTART", "missing_restart"),
            "restart_shared": ("MODE_RESTART", "missing_restart"),
            "join_resend": ("MODE_JOIN", "missing_join"),
        }  # fmt: skip
        action = entry.action
        meta.mode = c["MODE_NONE"]
        if action in ("drop", "collide"):
            meta.drop_reason = entry.args[0] if action == "drop" else c["DROP_BAD_SLOT"]
        elif action in modes:
            mode, register_action = modes[action]
            meta.mode = c[mode]
            meta.missing = self._execute("Ingress.missing", register_action, phv, state)
        elif action not in _SHARING_CHECKS:
            raise TableError(f"checks: unknown action {action}")
        # sharing.p4's flags (checks.p4's actions set them as named)
        meta.shared_use |= int(action == "restart_shared")
        meta.resend_join |= int(action == "join_resend")
        meta.resubmit |= int(action in ("take_over", "place", "place_resend"))
        meta.place |= int(action in ("place", "place_resend"))
        meta.resubmit_data.shared |= int(action in ("place", "place_resend"))
        meta.resubmit_data.check |= int(action == "place_resend")
        meta.to_fallback |= int(action in ("to_fallback", "collide_fallback"))
        meta.collision |= int(action in ("collide", "collide_fallback"))
        meta.from_fallback |= int(action == "from_fallback")

    def _next_step(self, phv: Phv, state: PassState) -> None:
        meta = phv.meta
        keys = {
            "mode": meta.mode, "missing": meta.missing, "rank": ina_or_zero(phv.hdr).rank,
            "has_upstream": meta.has_upstream, "num_workers": meta.num_workers,
            "resend_join": meta.resend_join,
        }  # fmt: skip
        entry = self.const_tables["Ingress.next_step.next_step"].apply(keys)
        self._next_step_action(entry, phv, state)

    def _next_step_action(self, entry: Entry, phv: Phv, state: PassState) -> None:
        """next_step.p4's actions: the lane operation, the statistic, the fate flags and
        the `final` register's RegisterAction."""
        meta, c = phv.meta, self.c
        op = {"answer": "READ", "answer_upstream": "READ", "add": "ADD", "add_complete": "ADD",
              "first": "WRITE", "first_complete": "WRITE"}  # fmt: skip
        stat = {"answer": "RETRANSMITS_ANSWERED", "answer_upstream": "RETRANSMITS_ANSWERED",
                "duplicate": "DUPLICATES_IGNORED", "add": "AGGREGATED",
                "add_complete": "AGGREGATED", "first": "AGGREGATED",
                "first_complete": "AGGREGATED", "take_result": "RESULTS_FROM_UPSTREAM"}  # fmt: skip
        final = {"answer_upstream": "final_read", "first": "final_clear",
                 "first_complete": "final_clear"}  # fmt: skip
        action = entry.action
        others = ("duplicate", "duplicate_fallback", "resubmit", "stale", "take_result")
        if action not in op and action not in others:
            raise TableError(f"next_step: unknown action {action}")
        if action == "duplicate_fallback":
            meta.to_fallback = 1  # sharing.p4: counted here, to the fallback
            return
        if action in op:
            meta.lane_op = c["LANE_OP_" + op[action]]
        if action in stat:
            meta.stat = c["STAT_" + stat[action]]
        meta.answer = int(action in ("answer", "answer_upstream"))
        meta.complete = int(action in ("add_complete", "first_complete"))
        meta.take_result = int(action == "take_result")
        meta.resubmit = int(action == "resubmit")
        if action == "stale":
            meta.drop_reason = c["DROP_STALE"]
        if action in final:
            meta.was_final = self._execute("Ingress.final", final[action], phv, state)
        elif action == "take_result":
            meta.lane_op = self._execute("Ingress.final", "final_take", phv, state)

    def _values(self, phv: Phv, state: PassState) -> None:
        """TnaValues: the exponent's RegisterAction for the lane operation, then every
        lane's; the packet takes the slot's values."""
        hdr, meta, c = phv.hdr, phv.meta, self.c
        exponent = {
            c["LANE_OP_WRITE"]: "exponent_write", c["LANE_OP_ADD"]: "exponent_max",
            c["LANE_OP_READ"]: "exponent_read",
        }.get(meta.lane_op)  # fmt: skip
        if exponent is not None:
            ina = ina_or_zero(hdr)
            ina.exponent = self._execute("Ingress.exponents.exponent", exponent, phv, state)
        if meta.lane_op != c["LANE_OP_NONE"]:
            lanes = hdr.lanes
            if lanes is None:
                raise TofinoLimitError("a lane operation on a packet without lanes")
            for n in range(self.lanes):
                name = f"lane_{n:02d}"
                lanes[n] = self._execute(f"Ingress.values.{name}", f"{name}_op", phv, state)

    def _results(self, phv: Phv, bridge: Bridge, tm: _Tm, port: int) -> None:
        """TnaResults: where a packet that passed every check goes."""
        meta, c = phv.meta, self.c
        if meta.to_fallback:
            self._to_fallback(phv, bridge, tm)
        elif meta.from_fallback:
            self._to_group(phv, bridge, tm)  # the fallback's RESULT, as it came
        elif meta.answer:
            if meta.has_upstream and meta.was_final == 0:
                meta.stat = c["STAT_UPSTREAM_RESENT"]
                self._to_upstream(phv, bridge, tm)
            else:
                _swap_addresses(phv.hdr, bridge, c["PTYPE_RESULT"])
                tm.ucast_port = port
        elif meta.complete:
            if meta.has_upstream:
                self._to_upstream(phv, bridge, tm)
            else:
                self._to_group(phv, bridge, tm)
        elif meta.take_result:
            if meta.lane_op == c["LANE_OP_WRITE"]:
                self._to_group(phv, bridge, tm)
            else:
                meta.stat = c["STAT_DUPLICATES_IGNORED"]
                tm.drop = True
        else:
            tm.drop = True  # consume

    def _to_upstream(self, phv: Phv, bridge: Bridge, tm: _Tm) -> None:
        hdr, up = phv.hdr, phv.meta.upstream
        if up is None:
            raise TableError("to_upstream without an upstream entry")
        eth, ip, udp, ina = _eth(hdr), _ipv4(hdr), _udp(hdr), ina_or_zero(hdr)
        eth.src, eth.dst = eth.dst, up.dst_mac.to_bytes(6)
        ip.src, ip.dst = ip.dst, up.dst_ip.to_bytes(4)
        udp.src_port, udp.dst_port, udp.checksum = self.c["INA_UDP_PORT"], up.dst_port, 0
        ina.ptype, ina.rank = self.c["PTYPE_DATA"], up.rank
        tm.ucast_port = up.egress_port
        bridge.upward = 1

    def _to_fallback(self, phv: Phv, bridge: Bridge, tm: _Tm) -> None:
        """results.p4 to_fallback: the DATA packet, unchanged, to the job's fallback."""
        hdr, fb = phv.hdr, phv.meta.fallback
        if fb is None:
            raise TableError("to_fallback without a fallback entry")
        eth, ip, udp = _eth(hdr), _ipv4(hdr), _udp(hdr)
        eth.src, eth.dst = eth.dst, fb.dst_mac.to_bytes(6)
        ip.src, ip.dst = ip.dst, fb.dst_ip.to_bytes(4)
        udp.src_port, udp.dst_port, udp.checksum = self.c["INA_UDP_PORT"], fb.dst_port, 0
        tm.ucast_port = fb.egress_port
        bridge.upward, bridge.fallback, bridge.fallback_stats = 1, 1, fb.stats

    def _to_group(self, phv: Phv, bridge: Bridge, tm: _Tm) -> None:
        _swap_addresses(phv.hdr, bridge, self.c["PTYPE_RESULT"])
        tm.mcast_grp = phv.meta.mgid
        bridge.multicast = 1

    # ----------------------------------------------------------------- egress
    def _egress(self, bridge: Bridge, frame: bytes, port: int, rid: int) -> bytes | None:
        """One replica through InaEgress; its bytes, or None when egress drops it."""
        c = self.c
        if not (bridge.result or bridge.upward):
            if bridge.flooded and port == bridge.ingress_port:
                return None
            return frame
        hdr = parse(frame, None, None)
        phv = Phv(hdr, Meta())
        state = PassState(f"egress to port {port} rid {rid}")
        self.passes.append(state.name)
        if bridge.multicast:
            key = (ina_or_zero(hdr).job_id, rid, port)
            dest = self.tables.replicas.get(key)
            if dest is None:
                return None  # replica_miss: dropped uncounted
            _eth(hdr).dst = dest.dst_mac.to_bytes(6)
            _ipv4(hdr).dst = dest.dst_ip.to_bytes(4)
            _udp(hdr).dst_port = dest.dst_port
        if bridge.roce:
            rank = rid if bridge.multicast else ina_or_zero(hdr).rank
            if not self.roce.reply(phv, bridge.roce_shift, rank, state):
                return None  # roce_reply_miss: dropped uncounted, as a replica miss
        phv.meta.draw = self._random.getrandbits(31)
        register = "Egress.drop_simulator.probability"
        if self.registers[register].execute("below", 0, phv, state):
            self._count("Egress.drops", c["DROP_SIM_EGRESS"])
            return None
        if bridge.fallback:
            self._count("Egress.sharing.to_fallback", bridge.fallback_stats)
        else:
            stat = "STAT_SENT_UPSTREAM" if bridge.upward else "STAT_RESULTS_SENT"
            self._count("Egress.ina_stats", c[stat])
        ip = _ipv4(hdr)
        ip.hdr_checksum = ipv4_checksum(ip)
        return deparse(hdr)


_SHARING_CHECKS = frozenset(
    {"take_over", "place", "place_resend", "to_fallback", "collide_fallback", "from_fallback"}
)
"""checks.p4's actions that run no register (sharing.p4's, and a loose slot's take-over)."""


# --------------------------------------------------------------------- headers
def _swap_addresses(hdr: Headers, bridge: Bridge, ptype_result: int) -> None:
    eth, ip, udp = _eth(hdr), _ipv4(hdr), _udp(hdr)
    eth.src, eth.dst = eth.dst, eth.src
    ip.src, ip.dst = ip.dst, ip.src
    udp.src_port, udp.dst_port, udp.checksum = udp.dst_port, udp.src_port, 0
    ina_or_zero(hdr).ptype = ptype_result
    bridge.result = 1


def _eth(hdr: Headers) -> Ethernet:
    if hdr.ethernet is None:
        raise TableError("an INA packet without Ethernet")  # the parser guarantees it
    return hdr.ethernet


def _ipv4(hdr: Headers) -> Ipv4:
    if hdr.ipv4 is None:
        raise TableError("an INA packet without IPv4")
    return hdr.ipv4


def _udp(hdr: Headers) -> Udp:
    if hdr.udp is None:
        raise TableError("an INA packet without UDP")
    return hdr.udp
