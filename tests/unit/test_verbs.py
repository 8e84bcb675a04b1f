"""The verbs device (hostlib.transport.verbs) as far as this machine allows: the probe's
one-line reason, the RoCEv2 GID found in the kernel's GID tables (a copy of their
layout), and, where an RDMA device exists (marked ``rdma``), a WRITE with immediate
between two of its queue pairs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import gid_table

from hostlib.transport.base import TransportError
from hostlib.transport.verbs import SYSFS, VerbsDevice, roce_gid, verbs_unavailable


def _devices_in_sysfs() -> bool:
    return SYSFS.is_dir() and any(SYSFS.iterdir())


def test_the_probe_says_in_one_line_why_verbs_cannot_run() -> None:
    why = verbs_unavailable()
    if why is None:  # pyverbs and a device: the sysfs tables must show the device too
        assert _devices_in_sysfs()
        return
    assert "\n" not in why and ("pyverbs" in why or "RDMA device" in why), why
    with pytest.raises(TransportError, match=r"pyverbs|RDMA device"):
        VerbsDevice("10.0.0.1")


def test_the_roce_v2_gid_of_an_address_is_found(tmp_path: Path) -> None:
    v4 = "0000:0000:0000:0000:0000:ffff:0a00:0005"  # ::ffff:10.0.0.5
    root = gid_table(tmp_path, [
        ("rxe0", 1, 0, "fe80:0000:0000:0000:0200:00ff:fe00:0005", "IB/RoCE v1"),
        ("rxe0", 1, 1, v4, "IB/RoCE v1"),
        ("rxe0", 1, 2, v4, "RoCE v2"),
        ("mlx5_0", 1, 3, "0000:0000:0000:0000:0000:ffff:0a00:0009", "RoCE v2"),
    ])  # fmt: skip
    assert roce_gid("10.0.0.5", root) == ("rxe0", 1, 2)
    assert roce_gid("10.0.0.9", root) == ("mlx5_0", 1, 3)


def test_no_roce_v2_gid_is_one_clear_error(tmp_path: Path) -> None:
    v4 = "0000:0000:0000:0000:0000:ffff:0a00:0005"
    root = gid_table(tmp_path, [("rxe0", 1, 1, v4, "IB/RoCE v1")])
    with pytest.raises(TransportError, match=r"found rxe0 port 1 index 1: IB/RoCE v1"):
        roce_gid("10.0.0.5", root)
    with pytest.raises(TransportError, match="no device under"):
        roce_gid("10.0.0.6", root)


@pytest.mark.rdma
def test_a_write_with_immediate_between_two_queue_pairs_of_the_device() -> None:
    """On a machine with an RDMA device (Soft-RoCE included): every verb the transport
    uses, one queue pair writing into the other's region through the device's own GID."""
    address = _first_roce_v2_address()
    dev = VerbsDevice(address, pmtu=256)
    try:
        region = dev.register(4096)
        a, b = dev.create_qp(), dev.create_qp()
        dev.connect(a, address, b.qpn, b.send_psn)
        dev.connect(b, address, a.qpn, a.send_psn)
        data = bytes(range(256)) * 3
        dev.post_write(a, data, region.va + 512, region.rkey, 0xABCDEF01)
        done = dev.poll(5.0)
        assert [(c.qpn, c.imm, c.byte_len) for c in done] == [(b.qpn, 0xABCDEF01, len(data))]
        assert region.read(512, len(data)) == data
    finally:
        dev.close()


def _first_roce_v2_address() -> str:
    import ipaddress

    for kind in sorted(SYSFS.glob("*/ports/*/gid_attrs/types/*")):
        if kind.read_text().strip().lower() == "roce v2":
            gid_file = kind.parents[2] / "gids" / kind.name
            gid = ipaddress.IPv6Address(gid_file.read_text().strip())
            if gid.ipv4_mapped is not None:
                return str(gid.ipv4_mapped)
    pytest.fail("an RDMA device without a RoCEv2 IPv4 GID")


def _pyverbs() -> None:
    """Skip, in pyverbs' own words, where it does not import (CI installs Debian's)."""
    why = verbs_unavailable()
    if why is not None and "pyverbs does not import" in why:
        pytest.skip(why)


def test_the_requests_are_rdma_cores() -> None:
    """Without a device, every request the device posts is still built by pyverbs: a
    WRITE with immediate (network-order immediate, INA's R_Key and VA in the RETH), a
    WRITE, a receive request, and the RTR/RTS attributes toward a RoCEv2 GID."""
    _pyverbs()
    import socket

    import pyverbs.enums as e

    from hostlib.transport.verbs import recv_wr, rts_attr, write_wr

    wr = write_wr(0x1000, 768, 7, va=(5 << 32) | (3 << 24), rkey=0x8004, imm=0xABCDEF01)
    assert (wr.opcode, wr.num_sge, wr.imm_data) == (
        e.IBV_WR_RDMA_WRITE_WITH_IMM, 1, socket.htonl(0xABCDEF01)
    )  # fmt: skip
    assert write_wr(0x1000, 4, 7, va=0, rkey=1, imm=None).opcode == e.IBV_WR_RDMA_WRITE
    assert recv_wr(0x2000, 9).num_sge == 1
    attr = rts_attr(1, 3, 1024, "10.0.0.9", 0x800001, 0x123, 0x456)
    assert (attr.path_mtu, attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (
        3,
        0x800001,
        0x123,
        0x456,
    )
    assert str(attr.ah_attr.dgid) == "0000:0000:0000:0000:0000:ffff:0a00:0009"
    with pytest.raises(ValueError, match="outside 24 bits"):
        rts_attr(1, 3, 1024, "10.0.0.9", 1 << 24, 0, 0)
    with pytest.raises(ValueError, match="path MTU"):
        rts_attr(1, 3, 300, "10.0.0.9", 1, 0, 0)
