"""The eBPF data plane behind the :class:`~emulation.softswitch.pipeline.Pipeline` API.

:class:`EbpfDataplane` is a :class:`Pipeline` whose packets never reach Python: the
program ``ina.bpf.c`` runs on every switch port (a TC classifier), and the Python object
keeps the control plane's view. Every table write goes through the pipeline's own
table API first (its checks and errors, :class:`JobTableError`, are the reference
switch's) and is then written to the map of the same table, so the P4Runtime server and
the controller see the same switch whichever data plane runs. Registers (the slots) and
counters live only in the kernel: reads and writes of them go to the maps, the slots
under their spin lock (``BPF_F_LOCK``).

Sharing (#41, ``sharing.bpf.h``): the shared, fallback and behind tables of a job are one
value of the ``sharing`` map, rewritten from the control plane's view
(:attr:`Pipeline.sharing`) at every write of any of them; the owner register is the
``owner`` map and the per-job counters the ``share_stats`` map's cells, both only in the
kernel (``self.sharing.owner`` is empty, and ``self.sharing.stats`` counts nothing).

Map layouts: :mod:`emulation.softswitch.ebpf.layout`. Loading and attaching:
:mod:`emulation.softswitch.ebpf.libbpf`.
"""

from __future__ import annotations

import ctypes
import logging
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from emulation.softswitch.ebpf import layout
from emulation.softswitch.ebpf.build import build_program
from emulation.softswitch.ebpf.lanes import has_lanes
from emulation.softswitch.ebpf.layout import (
    COUNTERS,
    DIRECTIONS,
    LINK_COUNTS,
    MAX_PORTS,
    MAX_REPLICAS,
    SHARE_BEHIND,
    SHARE_FALLBACK,
    SHARE_SHARED,
    FwdKind,
    be16,
    be32_ip,
    link_index,
    probability_threshold,
)
from emulation.softswitch.ebpf.libbpf import (
    BPF_F_LOCK,
    BpfMap,
    BpfObject,
    LibbpfError,
    ProgramRun,
    TcAttachment,
    possible_cpus,
    run_program,
)
from emulation.softswitch.ebpf.roce_maps import ROCE_MAPS, EbpfRoceTables, roce_map_sizes
from emulation.softswitch.links import LinkSpec
from emulation.softswitch.pipeline import (
    Addr,
    DropSimulator,
    Emit,
    JobTableError,
    Pipeline,
    RegisterCell,
    SlotState,
)
from emulation.softswitch.roce_tables import ROCE_ARRAYS, RoceTableError, qp_registers
from emulation.softswitch.sharing import JOB_STATS, STATS_CELLS, Fallback, SharedEntry
from hostlib.protocol import (
    EXPONENT_MIN,
    LANE_BYTES,
    LANES_PER_PACKET,
    ROCE_PMTUS,
    SWITCH_SLOTS,
)

__all__ = ["EbpfDataplane"]

log = logging.getLogger(__name__)

_PROGRAM = "ina_port"
_FWD_KINDS = {"drop": FwdKind.DROP, "port": FwdKind.PORT, "flood": FwdKind.FLOOD}
_U32 = ctypes.c_uint32
_U64 = ctypes.c_uint64


def _mac_bytes(mac: int) -> Any:
    return (ctypes.c_uint8 * 6)(*mac.to_bytes(6, "big"))


class EbpfDataplane(Pipeline):
    """The INA pipeline as an eBPF program on the switch's ports.

    Args:
        lanes: int32 lanes per packet (the program is compiled for it).
        slots: slots per set in the pool (the ``slots`` map's size).
        drops: the drop simulator's initial rates (its seed is not used: the kernel's
            random numbers cannot be seeded, as bmv2's cannot).
        forward_only: forward INA packets like any frame.
        one_armed: this host's IPv4 address: be a reduction server on one NIC (the
            program's one-armed mode): aggregate INA packets to this address, answer
            each worker at the MAC its own packets came from (else through the kernel's
            route, where the interface forwards), and leave every other frame to the
            host.
        roce: aggregate INA over RoCEv2 too (``roce.bpf.h``): every frame to UDP port
            4791 on a switch's ports, those to the one-armed address on its NIC.
        program: a compiled object; by default built (and cached) for ``lanes``.

    Raises:
        ValueError: lanes or slots out of range, or ``roce`` with more lanes than a RoCEv2
            packet holds (4,096 B).
        EbpfUnavailable, EbpfBuildError: no clang, or it refused the program.
        LibbpfError: no libbpf, or the kernel refused the program or a map.
    """

    SHARING = True  # the shared region, the fallback, behind jobs: sharing.bpf.h (#41)

    def __init__(
        self,
        lanes: int = LANES_PER_PACKET,
        slots: int = SWITCH_SLOTS,
        drops: DropSimulator | None = None,
        *,
        forward_only: bool = False,
        one_armed: str | None = None,
        roce: bool = False,
        program: Path | None = None,
    ) -> None:
        super().__init__(lanes, slots, drops)
        self.forward_only = forward_only
        self.one_armed = one_armed
        self.roce_enabled = roce
        self._slot_type = layout.slot_struct(lanes)
        if roce and lanes * LANE_BYTES > max(ROCE_PMTUS):
            raise ValueError(f"--roce: {lanes} lanes are {lanes * LANE_BYTES} B a packet, more "
                             f"than RoCEv2's largest path MTU ({max(ROCE_PMTUS)} B)")  # fmt: skip
        # The RoCEv2 path is compiled in only when asked for: it doubles the verifier's
        # work (a second caller of the lane loops), which a 2,048-lane program cannot bear.
        path = program or build_program(lanes, defines=("INA_ROCE",) if roce else ())
        registers = qp_registers(slots)
        self.object = BpfObject(path, {"slots": slots, "owner": slots, "roce_qps": registers})
        self._maps = self._open_maps()
        self.sharing.owner = np.zeros(0, dtype=np.uint32)  # the kernel's: the owner map
        self._owner_cells: set[int] = set()
        """Owner cells that may be held: those of every region an entry has named, and
        any written non-zero (the program takes no other), since the last reset."""
        self._roce = EbpfRoceTables(lanes, registers, {n: self._maps[n] for n in ROCE_MAPS})
        self.roce = self._roce  # what the P4Runtime server's RoCEv2 writes reach
        self._cpus = possible_cpus()
        self._attached: list[TcAttachment] = []
        self._ports: dict[int, str] = {}
        self._links: dict[int, LinkSpec] = {}
        self._write_cfg()
        self._clear(0, slots)

    def _alloc_registers(self, slots: int, lanes: int) -> None:
        """The registers live in the kernel's ``slots`` map, not in numpy arrays."""

    def _open_maps(self) -> dict[str, BpfMap]:
        sizes = {
            "cfg": (4, ctypes.sizeof(layout.InaCfg)),
            "jobs": (4, ctypes.sizeof(layout.InaJob)),
            "workers": (ctypes.sizeof(layout.InaWorkerKey), 4),
            "groups": (4, ctypes.sizeof(layout.InaGroup)),
            "replicas": (ctypes.sizeof(layout.InaReplicaKey), ctypes.sizeof(layout.InaDest)),
            "upstream": (4, ctypes.sizeof(layout.InaUpstream)),
            "forward": (8, ctypes.sizeof(layout.InaFwd)),
            "ports": (4, ctypes.sizeof(layout.InaPort)),
            "ifports": (4, 4),
            "worker_ranks": (ctypes.sizeof(layout.InaRankKey), 4),
            **roce_map_sizes(),
            "slots": (4, ctypes.sizeof(self._slot_type)),
            "sharing": (4, ctypes.sizeof(layout.InaSharing)),
            "owner": (4, 4),
            "share_stats": (4, ctypes.sizeof(layout.InaJobStats)),
            "stats": (4, 8),
            "links": (4, 8),
        }
        return {name: self.object.map(name, k, v) for name, (k, v) in sizes.items()}

    # ----------------------------------------------------------------- ports
    def attach(self, interfaces: Mapping[int, str], links: Mapping[int, LinkSpec]) -> None:
        """Put the program on each port's interface, with the port's link loss,
        duplication and reordering.

        Raises:
            ValueError: a port outside 0..511, a link with a delay (the kernel cannot
                delay in TC without netem: the Python data plane has a delay line), or a
                link that reorders on a port without its lanes (:mod:`~emulation.
                softswitch.ebpf.lanes`).
            OSError: an interface does not exist, or attaching failed (not root).
        """
        for port, spec in links.items():
            if spec.delay:
                raise ValueError(
                    f"port {port}: the eBPF data plane cannot delay frames (no netem): "
                    "use the Python data plane (--datapath python) for a link with delay"
                )
            if spec.reorder and port in interfaces and not has_lanes(interfaces[port]):
                raise ValueError(
                    f"port {port}: reordering holds frames back in the lanes of the link's "
                    f"shaper, and {interfaces[port]} has none: HTB classes 5:3 and 5:4 under "
                    "5:1 (inalab emulate makes them: emulation.softswitch.ebpf.lanes)"
                )
        prog = self.object.program_fd(_PROGRAM)
        for port, name in sorted(interfaces.items()):
            ifindex = socket.if_nametoindex(name)
            self.set_port(port, ifindex, links.get(port))
            self._attached.append(TcAttachment(ifindex, prog))
            self._ports[port] = name
        self._links = dict(links)

    def set_port(self, port: int, ifindex: int, link: LinkSpec | None = None) -> None:
        """Make interface ``ifindex`` the switch's port ``port`` (with its link's loss,
        duplication and reordering) in the program's maps, without attaching anything
        (:meth:`attach` does both; a test run hands frames to the program directly).

        Raises:
            ValueError: a port outside 0..511.
        """
        if not 0 <= port < MAX_PORTS:
            raise ValueError(f"port {port} outside 0..{MAX_PORTS - 1}")
        entry = layout.InaPort(ifindex=ifindex)
        if link is not None:
            entry.link = 1 | (2 if link.ingress else 0) | (4 if link.reorder else 0)
            for field, p in (("loss", link.loss), ("dup", link.dup)):
                setattr(entry, f"{field}_eg", probability_threshold(p))
                setattr(entry, f"{field}_in", probability_threshold(p) if link.ingress else 0)
            entry.reorder_eg = probability_threshold(link.reorder)
        self._maps["ports"].update(_U32(port), entry)
        self._maps["ifports"].update(_U32(ifindex), _U32(port))

    def run(self, frame: bytes, ifindex: int = 1) -> ProgramRun:
        """Hand ``frame`` to the program as if it arrived on ``ifindex`` (the kernel's test
        runner: the program's own time is measured; :meth:`set_port` first).

        Raises:
            LibbpfError: the kernel refused the run.
        """
        return run_program(self.object.program_fd(_PROGRAM), frame, ifindex)

    def detach(self) -> None:
        """Take the program off every port it was put on; idempotent."""
        while self._attached:
            attachment = self._attached.pop()
            try:
                attachment.detach()
            except LibbpfError as exc:  # the switch is stopping: say so, go on
                log.warning("detaching from ifindex %d: %s", attachment.ifindex, exc)

    def close(self) -> None:
        """Detach, then release the program and its maps."""
        self.detach()
        self.object.close()

    # ----------------------------------------------------------------- table API
    def insert_job(
        self, job_id: int, num_workers: int, slot_base: int, slot_count: int, mgid: int
    ) -> None:
        super().insert_job(job_id, num_workers, slot_base, slot_count, mgid)
        self._put_job(job_id)

    def modify_job(
        self, job_id: int, num_workers: int, slot_base: int, slot_count: int, mgid: int
    ) -> None:
        super().modify_job(job_id, num_workers, slot_base, slot_count, mgid)
        self._put_job(job_id)

    def delete_job(self, job_id: int) -> None:
        super().delete_job(job_id)
        self._maps["jobs"].delete(_U32(job_id))

    def insert_worker(self, job_id: int, rank: int, addr: Addr) -> None:
        super().insert_worker(job_id, rank, addr)
        self._maps["workers"].update(self._worker_key(job_id, rank, addr), _U32(1))
        self._put_rank(job_id, addr)

    def delete_worker(self, job_id: int, rank: int, addr: Addr) -> None:
        super().delete_worker(job_id, rank, addr)
        self._maps["workers"].delete(self._worker_key(job_id, rank, addr))
        self._put_rank(job_id, addr)

    def set_group(self, mgid: int, replicas: Sequence[tuple[int, int]]) -> None:
        if len(replicas) > MAX_REPLICAS:
            raise JobTableError(f"multicast group {mgid}: {len(replicas)} replicas, at most "
                                f"{MAX_REPLICAS} on the eBPF data plane")  # fmt: skip
        super().set_group(mgid, replicas)
        group = layout.InaGroup(count=len(replicas))
        for i, (port, rid) in enumerate(replicas):
            group.replicas[i] = layout.InaReplica(port=port, rid=rid)
        self._maps["groups"].update(_U32(mgid), group)

    def delete_group(self, mgid: int) -> None:
        super().delete_group(mgid)
        self._maps["groups"].delete(_U32(mgid))

    def set_replica(self, job_id: int, rid: int, port: int, addr: Addr, mac: int = 0) -> None:
        super().set_replica(job_id, rid, port, addr, mac)
        dest = layout.InaDest(ip=be32_ip(addr[0]), udp_port=be16(addr[1]), mac=_mac_bytes(mac))
        self._maps["replicas"].update(layout.InaReplicaKey(job=job_id, rid=rid, port=port), dest)

    def delete_replica(self, job_id: int, rid: int, port: int) -> None:
        super().delete_replica(job_id, rid, port)
        self._maps["replicas"].delete(layout.InaReplicaKey(job=job_id, rid=rid, port=port))

    def set_upstream(self, job_id: int, rank: int, addr: Addr, mac: int = 0, port: int = 0) -> None:
        super().set_upstream(job_id, rank, addr, mac, port)
        entry = layout.InaUpstream(ip=be32_ip(addr[0]), udp_port=be16(addr[1]),
                                   mac=_mac_bytes(mac), rank=rank, egress_port=port)  # fmt: skip
        self._maps["upstream"].update(_U32(job_id), entry)

    def delete_upstream(self, job_id: int) -> None:
        super().delete_upstream(job_id)
        self._maps["upstream"].delete(_U32(job_id))

    def remove_job(self, job_id: int) -> None:
        """As :meth:`Pipeline.remove_job`; the owner cells the job holds are cleared
        (both sets) before they are freed, so that no job takes one with a use left in
        it."""
        mgid = self._job(job_id).mgid
        held = self._held(job_id)
        cells = {e.stats for e in (self.sharing.shared.get(job_id),
                                   self.sharing.fallback.get(job_id)) if e is not None}  # fmt: skip
        super().remove_job(job_id)  # its table deletes are synced; these are not
        self._maps["upstream"].delete(_U32(job_id))
        self._maps["groups"].delete(_U32(mgid))
        self._maps["sharing"].delete(_U32(job_id))
        for x in held:
            self._clear(x, 1)
            self._maps["owner"].update(_U32(x), _U32(0))
        for cell in cells:  # its counters are zeroed, as Sharing.forget drops them
            self._maps["share_stats"].update(_U32(cell), self._stats_cell())
        self._write_cfg()

    def set_forward(self, mac: int, action: tuple[str, int]) -> None:
        super().set_forward(mac, action)
        self._maps["forward"].update(_U64(mac), layout.InaFwd(_FWD_KINDS[action[0]], action[1]))

    def delete_forward(self, mac: int) -> None:
        super().delete_forward(mac)
        self._maps["forward"].delete(_U64(mac))

    def set_forward_default(self, action: tuple[str, int]) -> None:
        super().set_forward_default(action)
        self._write_cfg()

    def set_drop_rates(self, ingress: float | None = None, egress: float | None = None) -> None:
        super().set_drop_rates(ingress, egress)
        self._write_cfg()

    def reset(self) -> None:
        """Empty every table map, clear the slots, owner cells, counters and link
        counters."""
        super().reset()
        for name, key_type in (("jobs", _U32), ("workers", layout.InaWorkerKey),
                               ("worker_ranks", layout.InaRankKey),
                               ("groups", _U32), ("replicas", layout.InaReplicaKey),
                               ("upstream", _U32), ("forward", _U64),
                               ("sharing", _U32)):  # fmt: skip
            table = self._maps[name]
            for key in list(table.keys(key_type)):
                table.delete(key)
        zero = (_U64 * self._cpus)()
        for name, size in (("stats", len(COUNTERS)), ("links", layout.link_index(MAX_PORTS, 0, 0))):
            for i in range(size):
                self._maps[name].update(_U32(i), zero)
        for cell in range(STATS_CELLS):
            self._maps["share_stats"].update(_U32(cell), self._stats_cell())
        for x in self._owner_cells:
            self._maps["owner"].update(_U32(x), _U32(0))
        self._owner_cells.clear()
        self._write_cfg()

    def _put_job(self, job_id: int) -> None:
        j = self._job(job_id)
        entry = layout.InaJob(j.num_workers, j.slot_base, j.slot_count, j.mgid)
        self._maps["jobs"].update(_U32(job_id), entry)

    def _put_rank(self, job_id: int, addr: Addr) -> None:
        """``worker_ranks``: the rank ``worker_rank`` finds at ``addr`` now, if any."""
        key = layout.InaRankKey(ip=be32_ip(addr[0]), udp_port=be16(addr[1]), job=job_id)
        rank = self.worker_rank(job_id, addr)
        if rank is None:
            self._maps["worker_ranks"].delete(key)
        else:
            self._maps["worker_ranks"].update(key, _U32(rank))

    @staticmethod
    def _worker_key(job_id: int, rank: int, addr: Addr) -> Any:
        return layout.InaWorkerKey(ip=be32_ip(addr[0]), udp_port=be16(addr[1]), job=job_id,
                                   rank=rank)  # fmt: skip

    def _write_cfg(self) -> None:
        kind, value = self.forward_default
        cfg = layout.InaCfg(
            drop_in=probability_threshold(self.drops.ingress),
            drop_eg=probability_threshold(self.drops.egress),
            forward_only=int(self.forward_only), fwd_kind=_FWD_KINDS[kind], fwd_value=value,
            slots=self.slots, one_armed=int(self.one_armed is not None),
            own_ip=be32_ip(self.one_armed) if self.one_armed else 0,
            sharing=int(bool(self.sharing.shared or self.sharing.fallback or self.sharing.behind)),
        )  # fmt: skip
        self._maps["cfg"].update(_U32(0), cfg)

    # ----------------------------------------------------------------- sharing (#41)
    def set_shared(self, job_id: int, entry: SharedEntry) -> None:
        super().set_shared(job_id, entry)
        self._owner_cells.update(range(entry.base, entry.base + entry.size))
        self._put_sharing(job_id)

    def set_fallback(self, job_id: int, entry: Fallback) -> None:
        super().set_fallback(job_id, entry)
        self._put_sharing(job_id)

    def set_behind(self, job_id: int) -> None:
        super().set_behind(job_id)
        self._put_sharing(job_id)

    def delete_sharing(self, table: str, job_id: int) -> None:
        super().delete_sharing(table, job_id)
        self._put_sharing(job_id)

    def _put_sharing(self, job_id: int) -> None:
        """Write the job's ``sharing`` value from the control plane's view of its three
        entries (delete it when it has none), and ``cfg.sharing``."""
        shared = self.sharing.shared.get(job_id)
        fallback = self.sharing.fallback.get(job_id)
        value = layout.InaSharing()
        if shared is not None:
            value.flags |= SHARE_SHARED
            value.count, value.base, value.mask = shared.count, shared.base, shared.size - 1
            value.offset, value.stats = shared.offset, shared.stats
        if fallback is not None:
            value.flags |= SHARE_FALLBACK
            value.ip, value.udp_port = be32_ip(fallback.addr[0]), be16(fallback.addr[1])
            value.mac, value.egress_port = _mac_bytes(fallback.mac), fallback.port
            value.fb_stats = fallback.stats
        if job_id in self.sharing.behind:
            value.flags |= SHARE_BEHIND
        if value.flags:
            self._maps["sharing"].update(_U32(job_id), value)
        else:
            self._maps["sharing"].delete(_U32(job_id))
        self._write_cfg()

    def _held(self, job_id: int) -> list[int]:
        """The owner cells ``job_id`` holds now (``Sharing.release``'s, in the kernel)."""
        held, value = [], _U32()
        for x in sorted(self._owner_cells):
            self._maps["owner"].lookup(_U32(x), value)
            if value.value and value.value >> 16 == job_id:
                held.append(x)
        return held

    def _stats_cell(self) -> Any:
        """A ``share_stats`` cell's value on every CPU, zeros."""
        return (layout.InaJobStats * self._cpus)()

    def stats_cell(self, cell: int) -> dict[str, int]:
        """As :meth:`Pipeline.stats_cell`, summed over CPUs."""
        values = self._stats_cell()
        if not 0 <= cell < STATS_CELLS or not self._maps["share_stats"].lookup(_U32(cell), values):
            return dict.fromkeys(JOB_STATS, 0)
        return {name: sum(int(getattr(v, name)) for v in values) for name in JOB_STATS}

    def set_stats_cell(self, name: str, cells: Sequence[int], value: int) -> None:
        """As :meth:`Pipeline.set_stats_cell`: ``value`` on CPU 0, 0 on the others (see
        :meth:`set_counter`).

        Raises:
            ValueError: no such counter.
        """
        if name not in JOB_STATS:
            raise ValueError(f"no sharing counter {name!r}")
        table = self._maps["share_stats"]
        for cell in cells:
            if not 0 <= cell < STATS_CELLS:
                continue
            values = self._stats_cell()
            table.lookup(_U32(cell), values)
            for cpu, v in enumerate(values):
                setattr(v, name, value if cpu == 0 else 0)
            table.update(_U32(cell), values)

    # ----------------------------------------------------------------- registers
    def _slot(self, s: int) -> Any:
        entry = self._slot_type()
        if not self._maps["slots"].lookup(_U32(s), entry, BPF_F_LOCK):
            raise JobTableError(f"slot {s} outside the pool of {self.slots}")
        return entry

    def _put_slot(self, s: int, entry: Any) -> None:
        self._maps["slots"].update(_U32(s), entry, BPF_F_LOCK)

    def _clear(self, base: int, count: int) -> None:
        empty = self._slot_type()
        for pool_set in (0, 1):
            empty.sets[pool_set].exponent = EXPONENT_MIN
        for s in range(base, base + count):
            self._put_slot(s, empty)

    def read_slot(self, job_id: int, slot: int, pool_set: int) -> SlotState:
        job = self._job(job_id)
        if not 0 <= slot < job.slot_count or pool_set not in (0, 1):
            raise JobTableError(f"slot {slot} set {pool_set} outside job {job_id}")
        e = self._slot(job.slot_base + slot)
        st = e.sets[pool_set]
        values = np.frombuffer(e.values[pool_set], dtype=np.int32).copy()
        return SlotState(int(e.bitmap[pool_set]), int(e.bitmap[1 - pool_set]),
                         int(st.remaining), int(st.exponent), values)  # fmt: skip

    def register_read(self, cells: Sequence[RegisterCell]) -> list[int]:
        entries: dict[int, Any] = {}
        out = []
        for cell in cells:
            if cell.array in ROCE_ARRAYS:
                out.append(self._roce_register(cell))
                continue
            if cell.array == "owner":
                out.append(self._owner(cell))
                continue
            s, pool_set = self._locate(cell)
            if s not in entries:
                entries[s] = self._slot(s)
            out.append(self._get(entries[s], cell, pool_set))
        return out

    def register_write(self, cell: RegisterCell, value: int) -> None:
        # Read, change one field, write back (both under the slot's lock, not between:
        # the controller writes registers of slots no packet uses, as bmv2's Thrift does).
        if cell.array in ROCE_ARRAYS:
            self._roce_register(cell, value)
            return
        if cell.array == "owner":
            self._owner(cell, value)
            return
        s, pool_set = self._locate(cell)
        entry = self._slot(s)
        st = entry.sets[pool_set]
        if cell.array.startswith("bitmap_set"):
            entry.bitmap[int(cell.array[-1])] = value
        elif cell.array == "values":
            entry.values[pool_set][cell.lane] = value
        else:
            setattr(st, _SET_FIELDS[cell.array], value)
        self._put_slot(s, entry)

    def _roce_register(self, cell: RegisterCell, value: int | None = None) -> int:
        """Read (``value`` None) or write a RoCEv2 register cell; what it holds.

        Raises:
            JobTableError: the index outside the queue pair registers.
        """
        try:
            if value is None:
                return self._roce.register_read(cell.array, cell.index)
            self._roce.register_write(cell.array, cell.index, value)
            return value
        except RoceTableError as exc:
            raise JobTableError(str(exc)) from None

    def _owner(self, cell: RegisterCell, value: int | None = None) -> int:
        """Read (``value`` None) or write an owner cell (sharing.bpf.h); what it holds.

        Raises:
            JobTableError: the index outside the pool.
        """
        if not 0 <= cell.index < self.slots:
            raise JobTableError(f"owner[{cell.index}] outside 0..{self.slots - 1}")
        key = _U32(cell.index)
        if value is None:
            held = _U32()
            self._maps["owner"].lookup(key, held)
            return int(held.value)
        self._maps["owner"].update(key, _U32(value))
        if value:
            self._owner_cells.add(cell.index)
        return value

    def _locate(self, cell: RegisterCell) -> tuple[int, int]:
        """(slot, set) of a register cell; raises JobTableError out of range."""
        if cell.array.startswith("bitmap_set") and cell.array in ("bitmap_set0", "bitmap_set1"):
            size, s, pool_set = self.slots, cell.index, int(cell.array[-1])
        elif cell.array in _SET_FIELDS or cell.array == "values":
            size, s, pool_set = 2 * self.slots, cell.index % self.slots, cell.index // self.slots
        else:
            raise JobTableError(f"no register array {cell.array!r}")
        if not 0 <= cell.index < size:
            raise JobTableError(f"{cell.array}[{cell.index}] outside 0..{size - 1}")
        if cell.array == "values" and not 0 <= cell.lane < self.lanes:
            raise JobTableError(f"lane {cell.lane} outside 0..{self.lanes - 1}")
        return s, pool_set

    @staticmethod
    def _get(entry: Any, cell: RegisterCell, pool_set: int) -> int:
        if cell.array.startswith("bitmap_set"):
            return int(entry.bitmap[pool_set])
        if cell.array == "values":
            return int(entry.values[pool_set][cell.lane])
        return int(getattr(entry.sets[pool_set], _SET_FIELDS[cell.array]))

    # ----------------------------------------------------------------- counters
    def _percpu(self, name: str, index: int) -> int:
        values = (_U64 * self._cpus)()
        self._maps[name].lookup(_U32(index), values)
        return int(sum(values))

    def counters(self) -> dict[str, int]:
        """The program's counters, summed over CPUs (the protocol's statistics and drop
        reasons, then frames_in, frames_out, forwarded, not_forwarded)."""
        return {name: self._percpu("stats", i) for i, name in enumerate(COUNTERS)}

    def set_counter(self, name: str, value: int) -> None:
        """Write counter ``name`` (one of :meth:`counters`): ``value`` on CPU 0, 0 on the
        others, so their sum is ``value``. A packet counted on another CPU during the
        write may be lost from the count, as on a switch whose counter is being reset.

        Raises:
            ValueError: no such counter, or a negative value.
        """
        if name not in COUNTERS:
            raise ValueError(f"no counter {name!r}")
        if value < 0:
            raise ValueError(f"counter {name}: negative value {value}")
        cells = (_U64 * self._cpus)(value)  # the rest stay 0
        self._maps["stats"].update(_U32(COUNTERS.index(name)), cells)

    def link_stats(self) -> dict[str, Any]:
        """``links.LinkEmulator.stats``'s shape for the ports with a link, plus
        ``duplicated`` (extra copies sent) and ``reordered`` (frames held back behind later
        ones) of the frames ``delivered``: nothing waits in a delay line here
        (``queue_dropped``, ``in_flight``: 0)."""
        ports: dict[str, Any] = {}
        for port, spec in sorted(self._links.items()):
            entry = {}
            for d, direction in enumerate(DIRECTIONS):
                if direction == "ingress" and not spec.ingress:
                    continue
                counts = {k: self._percpu("links", link_index(port, d, c))
                          for c, k in enumerate(LINK_COUNTS)}  # fmt: skip
                entry[direction] = {**counts, "queue_dropped": 0, "in_flight": 0}
            ports[str(port)] = entry
        return {"ports": ports}

    def process(self, data: memoryview, src: Addr) -> Emit | None:
        raise RuntimeError("the eBPF data plane processes packets in the kernel, not here")


_SET_FIELDS = {"seq": "seq", "remaining": "remaining", "final": "final", "exponent": "exponent"}
"""Register arrays held per set in the slot struct -> its field."""
