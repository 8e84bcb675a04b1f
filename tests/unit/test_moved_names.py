"""Names that moved in issue #39 still import from where they did: a name that moved
down a floor is re-exported as it was; one that moved up is served through its old
module's ``__getattr__`` with a DeprecationWarning naming its new home."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from emulation._moved import MOVED

MOVED_UP = [
    ("hostlib.p2p", "PeerCollective", "hostlib.peers"),
    ("hostlib.ring", "RingAllreduce", "hostlib.peers"),
    ("hostlib.tree", "TreeAllreduce", "hostlib.peers"),
    ("emulation.bmv2", "bmv2_switch_class", "emulation.mininet.nodes"),
]
RE_EXPORTED = [
    ("hostlib.ina", "InaError", "hostlib.errors"),
    ("hostlib.ina", "InaTimeoutError", "hostlib.errors"),
    ("hostlib.p2p", "P2pError", "hostlib.errors"),
    ("hostlib.p2p", "PeerSpec", "hostlib.p2pwire"),
    ("hostlib.p2p", "P2P_HEADER", "hostlib.p2pwire"),
    ("emulation.mininet.emulate", "apply_overrides", "emulation.mininet.overrides"),
    ("emulation.topology", "load_topology", "emulation.topology.load"),
    ("emulation.topology", "Topology", "emulation.topology.model"),
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


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_imports_from_its_old_path_with_a_warning(
    old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``emulation``'s loose modules went into ``mininet/`` and ``topology/``: the old
    path is the same module object, and says where it went."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"module {old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new


def test_the_old_paths_have_no_files_and_new_names_no_finder() -> None:
    import emulation

    root = emulation.__path__[0]
    for old in MOVED:
        assert not importlib.util.find_spec(old).has_location, old
        assert not (Path(root) / f"{old.split('.')[-1]}.py").exists(), old
    assert importlib.util.find_spec("emulation.nope") is None
