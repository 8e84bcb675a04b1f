"""Shared pytest setup for the whole suite.

pytest's default (prepend) import mode puts this file's directory on ``sys.path``, which
is what lets test modules ``import helpers`` (tests/ is deliberately not a package).

Capability markers (declared in pyproject.toml) are honoured here: a test marked
``root``, ``mininet``, ``bmv2``, ``gpu`` or ``rdma`` is skipped, with the reason, when a
probe of this machine finds the capability missing. ``slow`` tests always run unless
deselected with ``-m "not slow"``.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable

import pytest


def _is_root() -> bool:
    return os.geteuid() == 0


def _has_mininet() -> bool:
    return _is_root() and shutil.which("mnexec") is not None


def _has_bmv2() -> bool:
    return shutil.which("simple_switch_grpc") is not None


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _has_rdma() -> bool:
    try:
        from pyverbs.device import get_device_list
    except ImportError:
        return False
    try:
        return len(get_device_list()) > 0
    except Exception:  # pyverbs raises its own error types when no provider answers
        return False


PROBES: dict[str, tuple[Callable[[], bool], str]] = {
    "root": (_is_root, "needs root"),
    "mininet": (_has_mininet, "needs root and Mininet's mnexec"),
    "bmv2": (_has_bmv2, "needs simple_switch_grpc on PATH"),
    "gpu": (_has_gpu, "needs a CUDA GPU"),
    "rdma": (_has_rdma, "needs an RDMA device (pyverbs found none)"),
}


@functools.cache
def capability(marker: str) -> bool:
    """Whether this machine has what tests marked ``marker`` need (probed once)."""
    probe, _ = PROBES[marker]
    return probe()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, (_, reason) in PROBES.items():
            if item.get_closest_marker(marker) is not None and not capability(marker):
                item.add_marker(pytest.mark.skip(reason=reason))
