"""Names that moved in issue #39 still import from where they did: a name that moved
down a floor is re-exported as it was; one that moved up is served through its old
module's ``__getattr__`` with a DeprecationWarning naming its new home."""

from __future__ import annotations

import importlib

import pytest

MOVED_UP = [
    ("hostlib.p2p", "PeerCollective", "hostlib.peers"),
    ("hostlib.ring", "RingAllreduce", "hostlib.peers"),
    ("hostlib.tree", "TreeAllreduce", "hostlib.peers"),
]
RE_EXPORTED = [
    ("hostlib.ina", "InaError", "hostlib.errors"),
    ("hostlib.ina", "InaTimeoutError", "hostlib.errors"),
    ("hostlib.p2p", "P2pError", "hostlib.errors"),
    ("hostlib.p2p", "PeerSpec", "hostlib.p2pwire"),
    ("hostlib.p2p", "P2P_HEADER", "hostlib.p2pwire"),
    ("emulation.emulate", "apply_overrides", "emulation.overrides"),
    ("emulation.bench.report", "Row", "emulation.bench.rows"),
    ("emulation.tnamodel.model", "Phv", "emulation.tnamodel.phv"),
    ("emulation.argtypes", "parse_delay_ms", "emulation.softswitch.argtypes"),
    ("emulation.bmv2", "compile_command", "controller.p4c"),
    ("dynamiccl.torch_backend", "InaProcessGroup", "dynamiccl.torchbackend.group"),
    ("dynamiccl.torch_backend", "InaOptions", "dynamiccl.torchbackend.options"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED_UP)
def test_a_name_moved_up_resolves_with_a_warning(old: str, name: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)
    assert name not in importlib.import_module(old).__all__


@pytest.mark.parametrize(("old", "name", "new"), RE_EXPORTED)
def test_a_name_moved_down_is_the_same_object_where_it_was(old: str, name: str, new: str) -> None:
    here, there = importlib.import_module(old), importlib.import_module(new)
    assert getattr(here, name) is getattr(there, name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        importlib.import_module("hostlib.p2p").Nope  # noqa: B018
