"""``inalab bench --transport rdma --rdma-device DEV``: the ranks on a verbs device
(:class:`hostlib.transport.verbs.VerbsDevice`) instead of emulated RNICs.

The switch tells RoCEv2 workers apart by their address (docs/protocol.md, "INA over
RoCEv2"), so each rank takes one IPv4 address of the device's RoCEv2 GIDs, read from the
kernel's GID tables: a device with fewer such addresses than ranks is refused before
anything starts, as is a machine where verbs cannot run (the probe's one-line reason).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from hostlib.transport.verbs import SYSFS, verbs_unavailable

__all__ = [
    "RdmaDeviceError",
    "check_rdma_device",
    "open_rdma_device",
    "roce_addresses",
]


class RdmaDeviceError(ValueError):
    """The device cannot carry the bench's ranks (the message says why, in one line)."""


def roce_addresses(device: str, sysfs: Path = SYSFS) -> list[str]:
    """The IPv4 addresses of ``device``'s RoCEv2 GIDs, in GID table order, each once
    (``ports/P/gids/I`` whose ``gid_attrs/types/I`` is ``RoCE v2``; an unreadable or
    unpopulated entry is not one)."""
    out: list[str] = []
    for gid_file in sorted((sysfs / device).glob("ports/*/gids/*")):
        kind_file = gid_file.parent.parent / "gid_attrs" / "types" / gid_file.name
        try:
            gid = ipaddress.IPv6Address(gid_file.read_text().strip())
            kind = kind_file.read_text().strip().lower()
        except (OSError, ValueError):
            continue  # the kernel reads an unpopulated entry as an error
        v4 = gid.ipv4_mapped
        if kind == "roce v2" and v4 is not None and str(v4) not in out:
            out.append(str(v4))
    return out


def check_rdma_device(device: str, workers: int, sysfs: Path = SYSFS) -> list[str]:
    """The address of each of ``workers`` ranks on ``device`` (index = rank).

    Raises:
        RdmaDeviceError: verbs cannot run here (:func:`verbs_unavailable`'s reason), no
            such device, or fewer RoCEv2 IPv4 addresses on it than ranks.
    """
    why = verbs_unavailable()
    if why is not None:
        raise RdmaDeviceError(f"--rdma-device {device}: {why}")
    if not (sysfs / device).is_dir():
        have = ", ".join(sorted(p.name for p in sysfs.glob("*"))) or "none"
        raise RdmaDeviceError(f"--rdma-device {device}: no such device (here: {have})")
    addresses = roce_addresses(device, sysfs)
    if len(addresses) < workers:
        raise RdmaDeviceError(
            f"--rdma-device {device}: {len(addresses)} RoCEv2 IPv4 address(es)"
            f" ({', '.join(addresses) or 'none'}) for {workers} ranks: the switch knows a"
            " rank by its address (add addresses to the netdev, or fewer --workers)"
        )
    return addresses[:workers]


def open_rdma_device(
    device: str | None, rank: int, address: str, pmtu: int, max_message: int
) -> Any:
    """Rank ``rank``'s RDMA device: an emulated RNIC on ``address`` (``device`` None; the
    host engine's, :func:`hostlib.native.emulated_rnic`), else a
    :class:`~hostlib.transport.verbs.VerbsDevice` on ``device``'s rank-th RoCEv2 address.

    Raises:
        ValueError: ``pmtu`` is not an RDMA MTU.
        TransportError: the address's UDP 4791 is taken, or verbs cannot open the device.
        RdmaDeviceError: the device has no address for this rank.
    """
    if device is None:
        from hostlib.native import emulated_rnic

        return emulated_rnic(address, pmtu)
    from hostlib.transport.verbs import VerbsDevice

    addresses = roce_addresses(device)
    if rank >= len(addresses):
        raise RdmaDeviceError(f"--rdma-device {device}: no RoCEv2 address for rank {rank}")
    return VerbsDevice(addresses[rank], pmtu=pmtu, max_message=max_message)
