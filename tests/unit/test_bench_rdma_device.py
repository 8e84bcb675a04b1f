"""``inalab bench --transport rdma --rdma-device DEV`` (emulation.bench.rdma_device): the
flag refused in one line where verbs cannot run (this machine: the probe's reason), and
the ranks' addresses read from a copy of the kernel's GID tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import gid_table

from emulation.bench import rdma_device
from emulation.bench.rdma_device import RdmaDeviceError, check_rdma_device, roce_addresses
from hostlib.transport.verbs import verbs_unavailable

V4 = "0000:0000:0000:0000:0000:ffff:0a00:00{:02x}"


def _table(tmp_path: Path) -> Path:
    return gid_table(tmp_path, [
        ("rxe0", 1, 0, "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),  # not IPv4
        ("rxe0", 1, 1, V4.format(1), "IB/RoCE v1"),
        ("rxe0", 1, 2, V4.format(1), "RoCE v2"),
        ("rxe0", 1, 3, V4.format(2), "RoCE v2"),
        ("rxe0", 1, 4, V4.format(2), "RoCE v2"),  # the same address again
        ("mlx5_0", 1, 1, V4.format(9), "RoCE v2"),
    ])  # fmt: skip


def test_a_devices_roce_v2_ipv4_addresses_each_once(tmp_path: Path) -> None:
    root = _table(tmp_path)
    assert roce_addresses("rxe0", root) == ["10.0.0.1", "10.0.0.2"]
    assert roce_addresses("mlx5_0", root) == ["10.0.0.9"]
    assert roce_addresses("nothing", root) == []


def test_a_device_needs_an_address_per_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _table(tmp_path)
    monkeypatch.setattr(rdma_device, "verbs_unavailable", lambda: None)
    assert check_rdma_device("rxe0", 2, root) == ["10.0.0.1", "10.0.0.2"]
    with pytest.raises(RdmaDeviceError, match=r"2 RoCEv2 IPv4 address\(es\) .* for 3 ranks"):
        check_rdma_device("rxe0", 3, root)
    with pytest.raises(RdmaDeviceError, match=r"no such device \(here: mlx5_0, rxe0\)"):
        check_rdma_device("mlx5_1", 1, root)


def test_without_verbs_the_device_is_refused_with_the_probes_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rdma_device, "verbs_unavailable", lambda: "no RDMA device (empty)")
    with pytest.raises(RdmaDeviceError, match=r"^--rdma-device rxe0: no RDMA device \(empty\)$"):
        check_rdma_device("rxe0", 1, _table(tmp_path))


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "bench", "-b", "4K", "-e", "4K", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_cli_exits_2_with_the_probes_one_line() -> None:
    why = verbs_unavailable()
    if why is None:
        pytest.skip("this machine has an RDMA device: the probe gives no reason")
    proc = _bench("--transport", "rdma", "--rdma-device", "mlx5_0")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"inalab bench: error: --rdma-device mlx5_0: {why}"


def test_the_device_belongs_to_rdma() -> None:
    proc = _bench("--rdma-device", "mlx5_0")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "inalab bench: error: --rdma-device mlx5_0: with --transport rdma only"
    )
