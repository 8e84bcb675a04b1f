"""Shared pytest setup for the whole suite.

pytest's default (prepend) import mode puts this file's directory on ``sys.path``, which
is what lets test modules ``import helpers`` (tests/ is deliberately not a package).

Capability markers (declared in pyproject.toml) are honoured here: a test marked
``root``, ``mininet``, ``bmv2``, ``tofino``, ``ebpf``, ``gpu`` or ``rdma`` is skipped, with the
reason, when a probe of this machine finds the capability missing, unless
``INALAB_REQUIRE`` names it: then the session stops (CI must not pass by skipping).
``slow`` tests always run unless deselected with ``-m "not slow"``.

Temporary files go under pytest's base temporary directory (``TMPDIR`` is pointed there
for the session, subprocesses included), so a run that makes its own (``inalab bench``
without ``--run-dir``) leaves nothing in the system's temporary directory; pytest
keeps the last three base directories. A test that must see every temporary directory a
run makes asks for its own (the ``own_tmpdir`` fixture).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _is_root() -> bool:
    return os.geteuid() == 0


def _has_mininet() -> bool:
    return _is_root() and shutil.which("mnexec") is not None


def _has_tofino_compiler() -> bool:
    return shutil.which("p4c-barefoot") is not None


def _has_bmv2() -> bool:
    # Every bmv2 test compiles p4/ first: the switch without the compiler is no use.
    return all(shutil.which(tool) for tool in ("simple_switch_grpc", "p4c-bm2-ss"))


def _has_ebpf() -> bool:
    from emulation.softswitch.ebpf import ebpf_unavailable

    return ebpf_unavailable() is None


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _has_rdma() -> bool:
    from hostlib.transport.verbs import verbs_unavailable

    return verbs_unavailable() is None


def _skip_reason(marker: str) -> str:
    """Why tests marked ``marker`` skip here: the probe's own words where it has them."""
    if marker == "rdma":
        from hostlib.transport.verbs import verbs_unavailable

        return f"needs an RDMA device: {verbs_unavailable()}"
    return PROBES[marker][1]


PROBES: dict[str, tuple[Callable[[], bool], str]] = {
    "root": (_is_root, "needs root"),
    "mininet": (_has_mininet, "needs root and Mininet's mnexec"),
    "bmv2": (_has_bmv2, "needs simple_switch_grpc and p4c-bm2-ss on PATH"),
    "tofino": (_has_tofino_compiler, "needs p4c-barefoot (p4c's Tofino backend) on PATH"),
    "ebpf": (_has_ebpf, "needs root, clang and libbpf (the eBPF data plane)"),
    "gpu": (_has_gpu, "needs a CUDA GPU"),
    "rdma": (_has_rdma, "needs an RDMA device (hostlib.transport.verbs.verbs_unavailable)"),
}


@functools.cache
def capability(marker: str) -> bool:
    """Whether this machine has what tests marked ``marker`` need (probed once)."""
    probe, _ = PROBES[marker]
    return probe()


REQUIRE_ENV = "INALAB_REQUIRE"
"""Comma list of capabilities a run must have (``.ci/run`` sets it): a missing one stops
the session instead of quietly skipping its tests."""


def required_missing(value: str) -> list[str]:
    """The capabilities named in ``value`` (an :data:`REQUIRE_ENV` value) that this machine
    lacks, as the reasons their tests would skip with.

    Raises:
        pytest.UsageError: a name that is not a capability marker.
    """
    missing = []
    for name in filter(None, (part.strip() for part in value.split(","))):
        if name not in PROBES:
            raise pytest.UsageError(f"{REQUIRE_ENV}: {name!r} is not one of {sorted(PROBES)}")
        if not capability(name):
            missing.append(f"{name}: {PROBES[name][1]}")
    return missing


def pytest_configure(config: pytest.Config) -> None:
    missing = required_missing(os.environ.get(REQUIRE_ENV, ""))
    if missing:
        raise pytest.UsageError(f"{REQUIRE_ENV} asks for what is missing: {'; '.join(missing)}")


# Host-library modules whose code is the same whichever engine runs: a test importing
# only these gains nothing from the Python-engine run.
_ENGINE_FREE = frozenset({"protocol", "scapy_layer", "units", "quantize"})


@functools.cache
def _imports_hostlib(path: Path) -> bool:
    """Whether the file imports a host-library module an engine runs (``hostlib.ina``,
    ``.session``, ``.ring``, ``.transport``...; the package itself, ``""``, exports the
    sessions), not just the wire format's."""
    modules = re.findall(r"^\s*(?:from|import) hostlib\.?(\w*)", path.read_text(), re.MULTILINE)
    return bool(set(modules) - _ENGINE_FREE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _imports_hostlib(Path(item.path)) and item.get_closest_marker("engine_neutral") is None:
            # The host-library tests, which CI runs again on the Python engine
            # (INALAB_HOST_ENGINE=python), the specification the native one is held to.
            item.add_marker(pytest.mark.hostlib)
        for marker in PROBES:
            if item.get_closest_marker(marker) is not None and not capability(marker):
                item.add_marker(pytest.mark.skip(reason=_skip_reason(marker)))


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point ``TMPDIR`` (this process's and its children's) into pytest's base temporary
    directory for the session; a short path, for the Unix sockets made there."""
    tmp = tmp_path_factory.getbasetemp() / "tmp"
    tmp.mkdir(exist_ok=True)
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None  # re-read TMPDIR
    yield
    if saved is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None


@pytest.fixture
def own_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private TMPDIR, so a test sees every temporary directory a run makes."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    yield tmp
