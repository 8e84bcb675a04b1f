"""The eBPF data plane's sharing maps (``sharing.bpf.h``) against the P4Info and the
reference's constants: every value the P4 program's sharing tables, owner register and
per-job counters can hold fits, without clang or root."""

from __future__ import annotations

import ctypes

from controller.p4info import P4Info
from controller.sharing import JOB_COUNTERS, OWNER
from emulation.softswitch.ebpf import layout
from emulation.softswitch.sharing import JOB_STATS, STATS_CELLS


def _bits(cls: type[ctypes.Structure], field: str) -> int:
    return 8 * int(getattr(cls, field).size)


def test_the_sharing_value_holds_every_value_the_p4_tables_can() -> None:
    info = P4Info.load()
    shared = info.action("Ingress.sharing.set_shared")
    fallback = info.action("Ingress.sharing.set_fallback")
    checks = [
        *((field, shared.param(field).bitwidth) for field in ("count", "base", "mask", "offset")),
        ("stats", shared.param("stats").bitwidth),
        ("ip", fallback.param("dst_ip").bitwidth),
        ("udp_port", fallback.param("dst_port").bitwidth),
        ("mac", fallback.param("dst_mac").bitwidth),
        ("egress_port", fallback.param("egress_port").bitwidth),
        ("fb_stats", fallback.param("stats").bitwidth),
    ]
    for field, p4_bits in checks:
        assert _bits(layout.InaSharing, field) >= p4_bits, field
    for table in ("shared", "fallback", "behind"):
        key = info.table(f"Ingress.sharing.{table}").match_field("job_id")
        assert key.bitwidth <= 32  # the maps' u32 key


def test_the_counter_cells_and_owner_cells_are_the_p4_programs() -> None:
    info = P4Info.load()
    for name, stat in JOB_COUNTERS.items():
        assert info.counter(name).size == STATS_CELLS, name
        assert stat in JOB_STATS
    assert [f[0] for f in layout.InaJobStats._fields_] == list(JOB_STATS)
    assert info.register(OWNER).bitwidth == 32  # the owner map's u32 value
    text = layout.render_header(64)
    assert f"#define INA_STATS_CELLS {STATS_CELLS}" in text
    for i, stat in enumerate(JOB_STATS):
        assert f"#define JS_{stat.upper()} {i}\n" in text
    flags = (layout.SHARE_SHARED, layout.SHARE_FALLBACK, layout.SHARE_BEHIND)
    assert sorted(flags) == [1, 2, 4]
    assert "struct ina_sharing {" in text and "struct ina_job_stats {" in text
