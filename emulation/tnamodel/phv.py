"""A packet in a pass of the TNA program: its headers and metadata, as RegisterActions read them.

Part of the executable TNA model (:mod:`emulation.tnamodel`), below both ``actions.py``
(the RegisterActions, which read a :class:`Phv`) and ``model.py`` (which makes one per
pass and re-exports these): :class:`Meta` (the program's ingress and egress metadata),
:class:`Upstream` (set_upstream's parameters, which the metadata carries once matched),
:class:`Shared` and :class:`Fallback` (the sharing tables' entries, carried alike; below
``sharing.py``, which runs them) and :class:`Phv`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from emulation.tnamodel.packet import Headers

__all__ = ["Fallback", "Meta", "Phv", "Resubmit", "RoceMeta", "Shared", "Upstream"]


@dataclass(frozen=True)
class Shared:
    """set_shared's parameters."""

    count: int
    base: int
    mask: int
    offset: int
    stats: int


class Fallback(NamedTuple):
    """set_fallback's parameters (addresses as the P4 fields' integers)."""

    dst_ip: int
    dst_port: int
    dst_mac: int
    egress_port: int
    stats: int


@dataclass
class Resubmit:
    """resubmit_h: what pass 1 tells pass 2 (zero in pass 1 until written)."""

    pass_: int = 0
    shared: int = 0  # a shared slot's pass 1 placed it (sharing.p4) ...
    check: int = 0  # ... a retransmission with a fallback: seq only checked
    cell: int = 0  # the pool slot XOR the job slot (seq.p4's XOR16 index)
    held: int = 0  # 0 this job slot's, 1 another's, 2 past the shared count


@dataclass
class Meta:
    """tna_ingress_metadata_t (and the egress metadata's fields), zeroed per pass as
    @pa_auto_init_metadata does."""

    second_pass: int = 0
    shared_pass: int = 0
    shared_check: int = 0
    resubmit_data: Resubmit = field(default_factory=Resubmit)
    version_ok: int = 0
    is_data: int = 0
    is_result: int = 0
    lanes_ok: int = 0
    length_ok: int = 0
    job_hit: int = 0
    num_workers: int = 0
    mgid: int = 0
    abs_slot: int = 0
    slot_count: int = 0
    slot: int = 0
    slot_diff: int = 0
    worker_hit: int = 0
    rank_ok: int = 0
    not_bit: int = 0
    others: int = 0
    has_upstream: int = 0
    upstream: Upstream | None = None
    upstream_ip_diff: int = 0
    upstream_port_diff: int = 0
    # sharing.p4
    has_shared: int = 0
    shared: Shared | None = None
    shared_rel: int = 0
    shared_wrap: int = 0
    shared_left: int = 0
    slot_next: int = 0
    owner_me: int = 0
    cell: int = 0
    has_fallback: int = 0
    fallback: Fallback | None = None
    fallback_ip_diff: int = 0
    fallback_port_diff: int = 0
    is_behind: int = 0
    place: int = 0
    to_fallback: int = 0
    from_fallback: int = 0
    collision: int = 0
    shared_use: int = 0
    resend_join: int = 0
    draw: int = 0
    sim_drop: int = 0
    seq_diff: int = 0
    drop_reason: int = 0
    mode: int = 0
    missing: int = 0
    lane_op: int = 0
    stat: int = 0
    complete: int = 0
    answer: int = 0
    resubmit: int = 0
    take_result: int = 0
    was_final: int = 0
    index: int = 0
    no_replica: int = 0
    is_roce: int = 0
    roce: RoceMeta | None = None
    roce_psn_offset: int = 0  # egress: (seq << ROCE_PSN_SEQ_SHIFT) + the reply's place


@dataclass
class RoceMeta:
    """A RoCEv2 frame in ingress (p4/tna/roce.p4): the headers the parser extracted (a
    missing RETH or ImmDt reads as zeros, ``reth``/``immdt`` say which were there) and
    the ``roce_*`` metadata of tna_ingress_metadata_t."""

    bth: bool = False
    opcode: int = 0
    dest_qp: int = 0
    psn: int = 0
    reth: bool = False
    va: int = 0
    rkey: int = 0
    dma_length: int = 0
    immdt: bool = False
    data: bool = False  # the lanes and the ICRC
    opcode_ok: int = 0
    first: int = 0
    last: int = 0
    imm: int = 0
    len_ok: int = 0
    short: int = 0
    missing: int = 0
    qp_miss: int = 0
    job_miss: int = 0
    bad_source: int = 0
    dropped: int = 0
    reason: int = 0
    job: int = 0
    rank: int = 0
    reg: int = 0
    src_diff: int = 0
    shift: int = 0
    first_bad: int = 0
    first_reason: int = 0
    mask: int = 0
    psn_open: int = 0
    next_open: int = 0
    opens: int = 0
    psn_ok: int = 0
    over: int = 0


class Upstream(NamedTuple):
    """set_upstream's parameters (addresses as the P4 fields' integers)."""

    rank: int
    dst_ip: int
    dst_port: int
    dst_mac: int
    egress_port: int


@dataclass
class Phv:
    """A packet in a pass: its headers and metadata (what a RegisterAction reads)."""

    hdr: Headers
    meta: Meta
