"""The curated public API: every module declares ``__all__`` and every name in it exists.

The wire format and the switch pipeline are final, so their ``__all__`` is pinned here: a
change to either is a change of what other layers (and the P4 program) rely on and must
show up in review as an edit of this file. The other packages are still growing.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

PACKAGES = ["controller", "dynamiccl", "emulation", "hostlib"]


def _modules(package: str) -> list[str]:
    """``package`` and every module below it (a new module is checked without an edit here)."""
    path = importlib.import_module(package).__path__
    return [package] + [m.name for m in pkgutil.walk_packages(path, package + ".")]


PUBLIC_MODULES = sorted(name for package in PACKAGES for name in _modules(package))

PINNED = {
    "hostlib.protocol": {
        "DEFAULT_SLOTS_PER_JOB",
        "EXPONENT_MAX",
        "EXPONENT_MIN",
        "FLAG_RESEND",
        "HEADER",
        "HEADER_SIZE",
        "INA_UDP_PORT",
        "LANES_PER_PACKET",
        "LANE_BYTES",
        "MAX_LANES",
        "MAX_SLOT",
        "MAX_WORKERS",
        "POOL_SET_BIT",
        "PROTOCOL_VERSION",
        "ROCE_BTH_SIZE",
        "ROCE_ICRC_SIZE",
        "ROCE_IMMDT_SIZE",
        "ROCE_MAX_MSG_PACKETS",
        "ROCE_PMTUS",
        "ROCE_PSN_SEQ_SHIFT",
        "ROCE_QP_REGISTERS",
        "ROCE_RETH_SIZE",
        "ROCE_UDP_PORT",
        "SLOT_MASK",
        "SWITCH_DROPS",
        "SWITCH_SLOTS",
        "SWITCH_STATS",
        "TNA_LANES_PER_PACKET",
        "TNA_SWITCH_SLOTS",
        "Header",
        "PacketType",
        "ProtocolError",
        "RoceOpcode",
        "make_pool_index",
        "pack_header",
        "packet_size",
        "split_pool_index",
        "unpack_header",
    },
    "emulation.softswitch.pipeline": {
        "REGISTER_ARRAYS",
        "SIGNED_REGISTERS",
        "RegisterCell",
        "Addr",
        "Dataplane",
        "DropReason",
        "DropSimulator",
        "Emit",
        "JobConfig",
        "JobTableError",
        "Pipeline",
        "SlotState",
        "Upstream",
    },
}


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_declared_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list | tuple), f"{name} declares no __all__"
    assert all(isinstance(n, str) for n in exported)
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def test_pinned_modules_are_checked() -> None:
    assert set(PINNED) <= set(PUBLIC_MODULES)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_final_modules_export_exactly_the_pinned_names(name: str) -> None:
    assert set(importlib.import_module(name).__all__) == PINNED[name]
