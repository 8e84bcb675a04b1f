"""The eBPF data plane's shared layout against the wire format and the P4Info.

The program's constants and map structs are generated from ``layout.py`` (itself reading
``hostlib/protocol.py``): these tests hold that module to the protocol, to the P4
program's table widths (p4/ina.p4info.txtpb) and to C's struct layout rules, without
clang or root.
"""

from __future__ import annotations

import ctypes
import re

import pytest

from controller.p4info import P4Info
from emulation.softswitch.ebpf import layout
from hostlib.protocol import SWITCH_DROPS, SWITCH_STATS


def test_counters_start_with_the_p4_counter_order() -> None:
    names = [*SWITCH_STATS, *(f"drop_{d}" for d in SWITCH_DROPS)]
    assert list(layout.COUNTERS[: len(names)]) == names
    assert layout.COUNTERS[len(names) :] == ("frames_in", "frames_out", "forwarded",
                                              "not_forwarded", "passed_to_host",
                                              "no_route")  # fmt: skip


def _bits(cls: type[ctypes.Structure], field: str) -> int:
    return 8 * ctypes.sizeof(dict(cls._fields_)[field])


def _match_width(info: P4Info, table: str, field: str) -> int:
    t = info.table(table)
    return next(int(f.bitwidth) for f in t.match_fields if f.name == field)


def _param_width(info: P4Info, action: str, param: str) -> int:
    a = info.action(action)
    return next(int(p.bitwidth) for p in a.params if p.name == param)


def test_map_fields_hold_every_value_the_p4_tables_can() -> None:
    info = P4Info.load()
    checks = [
        (layout.InaWorkerKey, "job", _match_width(info, "Ingress.workers.workers", "job_id")),
        (layout.InaWorkerKey, "rank", _match_width(info, "Ingress.workers.workers", "rank")),
        (layout.InaWorkerKey, "ip", _match_width(info, "Ingress.workers.workers", "ipv4_src")),
        (layout.InaWorkerKey, "udp_port",
         _match_width(info, "Ingress.workers.workers", "udp_src_port")),
        (layout.InaReplicaKey, "rid", _match_width(info, "Egress.replicas.replicas", "egress_rid")),
        (layout.InaReplicaKey, "port",
         _match_width(info, "Egress.replicas.replicas", "egress_port")),
        (layout.InaJob, "num_workers", _param_width(info, "Ingress.jobs.set_job", "num_workers")),
        (layout.InaJob, "slot_base", _param_width(info, "Ingress.jobs.set_job", "slot_base")),
        (layout.InaJob, "mgid", _param_width(info, "Ingress.jobs.set_job", "mgid")),
        (layout.InaUpstream, "rank", _param_width(info, "Ingress.upstream.set_upstream", "rank")),
        (layout.InaUpstream, "egress_port",
         _param_width(info, "Ingress.upstream.set_upstream", "egress_port")),
    ]  # fmt: skip
    for cls, field, p4_bits in checks:
        assert _bits(cls, field) >= p4_bits, (cls.__name__, field)


def test_the_header_declares_every_struct_with_its_size_asserted() -> None:
    text = layout.render_header(64)
    for cls in (layout.InaJob, layout.InaWorkerKey, layout.InaGroup, layout.InaPort):
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        assert f"struct {name} {{" in text
        assert f"sizeof(struct {name}) == {ctypes.sizeof(cls)}" in text
    assert "struct bpf_spin_lock lock;" in text and "__s32 values[2][64];" in text
    assert "#define INA_UDP_PORT 20033" in text and "#define C_DROP_SIM_EGRESS 19" in text


def test_slot_struct_puts_the_lock_first_and_both_sets_in_one_value() -> None:
    slot = layout.slot_struct(3)
    assert slot._fields_[0][0] == "lock" and ctypes.sizeof(slot) == 4 + 8 + 4 + 2 * 16 + 2 * 3 * 4
    with pytest.raises(ValueError, match="lanes 0 outside"):
        layout.slot_struct(0)


def test_network_order_helpers_round_trip() -> None:
    assert layout.from_be32_ip(layout.be32_ip("10.0.0.7")) == "10.0.0.7"
    assert layout.be32_ip("10.0.0.7").to_bytes(4, "little") == bytes([10, 0, 0, 7])
    assert layout.from_be16(layout.be16(40001)) == 40001
    assert layout.be16(0x1234).to_bytes(2, "little") == b"\x12\x34"


def test_probability_thresholds_cover_never_to_always() -> None:
    assert layout.probability_threshold(0.0) == 0
    assert layout.probability_threshold(1.0) == 1 << 32
    assert layout.probability_threshold(0.5) == 1 << 31
    with pytest.raises(ValueError):
        layout.probability_threshold(1.5)


def test_link_counter_indices_are_dense() -> None:
    n = len(layout.LINK_COUNTS)
    seen = {layout.link_index(p, d, c) for p in range(layout.MAX_PORTS) for d in (0, 1)
            for c in range(n)}  # fmt: skip
    assert seen == set(range(layout.MAX_PORTS * 2 * n))
    assert f"#define LINK_NUM_COUNTS {n}" in layout.render_header(64)
