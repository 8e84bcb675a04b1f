"""RDMA through the kernel's verbs (rdma-core's pyverbs): the device an
:class:`~hostlib.transport.rdma.RdmaTransport` drives on a real RNIC or on Soft-RoCE
(``rdma_rxe``), with the verbs the emulated RNIC (``rnic.py``) stands in for elsewhere.

- ``register``: ``ibv_reg_mr`` with local and remote write; replies land there.
- ``create_qp``: a UC queue pair (``IBV_QPT_UC``) on the device's port, with a random
  first PSN, and receive requests posted for the WRITEs with immediate it will take.
- ``connect``: INIT -> RTR -> RTS toward the switch's queue pair, through the GID that
  holds this address as RoCEv2 (:func:`roce_gid`), at the path MTU of the packets.
- ``post_write``: ``IBV_WR_RDMA_WRITE_WITH_IMM`` of the message, from a send buffer; the
  R_Key and remote address are INA's (the pool index; seq and exponent), put in the RETH
  by the NIC as given.
- ``poll``: ``ibv_poll_cq`` until a receive completes or the timeout passes; each receive
  request used is posted again.

pyverbs is Debian's ``python3-pyverbs`` (PyPI's does not build against bookworm's
rdma-core). It is built for the system's CPython 3.11, so a virtual environment of the
same Python can import it from the system's dist-packages, which :func:`verbs_unavailable`
puts on the path for that import alone when ``pyverbs`` is not importable otherwise.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostlib.protocol import ROCE_PMTUS
from hostlib.transport.base import TransportError
from hostlib.transport.rnic import Completion

__all__ = [
    "SYSFS",
    "VerbsDevice",
    "VerbsRegion",
    "recv_wr",
    "roce_gid",
    "rts_attr",
    "verbs_unavailable",
    "write_wr",
]

SYSFS = Path("/sys/class/infiniband")
"""Where the kernel lists RDMA devices, their ports and GID tables."""

_DEBIAN_DIST = "/usr/lib/python3/dist-packages"
_MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}  # IBV_MTU_*
_RECVS_PER_QP = 4


def verbs_unavailable() -> str | None:
    """Why verbs cannot run here, in one line (None: pyverbs imports and sees a device)."""
    try:
        device = _import_device()
    except ImportError as exc:
        return (
            f"pyverbs does not import ({exc}): apt install python3-pyverbs (Debian's; "
            "PyPI's does not build against bookworm's rdma-core)"
        )
    hint = "an RNIC, or Soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE"
    try:
        names = [d.name.decode() for d in device.get_device_list()]
    except Exception as exc:  # pyverbs raises its own types when no provider answers
        return f"no RDMA device: ibv_get_device_list failed ({exc}); {hint}"
    if not names:
        return f"no RDMA device (ibv_get_device_list is empty); {hint}"
    return None


def _import_device() -> Any:
    """``pyverbs.device``, from Debian's dist-packages if the environment lacks it.

    Debian's directory is on the path only while ``pyverbs`` is imported: its other
    modules then come through the package's own path, and nothing else of Debian's
    shadows or fills in for the environment's packages.

    Raises:
        ImportError: neither has it.
    """
    try:
        import pyverbs.device as device
    except ImportError:
        if not Path(_DEBIAN_DIST, "pyverbs").is_dir():
            raise
        sys.path.append(_DEBIAN_DIST)
        try:
            import pyverbs.device as device
        finally:
            sys.path.remove(_DEBIAN_DIST)
    return device


def roce_gid(address: str, sysfs: Path = SYSFS) -> tuple[str, int, int]:
    """(device, port, GID index) of the RoCEv2 GID that holds IPv4 ``address``, read from
    the kernel's GID tables (``ports/P/gids/I``, ``gid_attrs/types/I``).

    Raises:
        TransportError: no device has a RoCEv2 GID for the address (the message lists
            what was found, e.g. a RoCE v1 one).
    """
    want = ipaddress.IPv6Address(f"::ffff:{address}").exploded
    seen = []
    for gid_file in sorted(sysfs.glob("*/ports/*/gids/*")):
        try:
            gid = ipaddress.IPv6Address(gid_file.read_text().strip()).exploded
        except (OSError, ValueError):
            continue  # an unpopulated entry reads as an error
        if gid != want:
            continue
        port_dir = gid_file.parent.parent
        kind_file = port_dir / "gid_attrs" / "types" / gid_file.name
        kind = kind_file.read_text().strip() if kind_file.exists() else "?"
        device, port, index = port_dir.parent.parent.name, int(port_dir.name), int(gid_file.name)
        if kind.lower() == "roce v2":
            return device, port, index
        seen.append(f"{device} port {port} index {index}: {kind}")
    raise TransportError(
        f"no RoCEv2 GID holds {address}"
        + (f" (found {'; '.join(seen)})" if seen else f" (no device under {sysfs} has it)")
    )


@dataclass
class VerbsRegion:
    """A registered region: its address and R_Key as the NIC knows them."""

    mr: Any
    va: int
    rkey: int

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.mr.read(length, offset))


@dataclass
class VerbsQueuePair:
    """A UC queue pair and its send buffer (one message at a time)."""

    qp: Any
    qpn: int
    send_psn: int
    send_mr: Any = None
    scratch: Any = None
    recv_psn: int = 0
    peer: tuple[str, int] | None = None


class VerbsDevice:
    """An RDMA device through pyverbs, for INA's transport.

    Args:
        address: this host's IPv4 address on the RDMA netdev (its RoCEv2 GID).
        pmtu: the path MTU, the payload of every packet of a message but its last.
        max_message: the largest message posted (its send buffer).
        sysfs: the kernel's RDMA device directory (tests give a copy).

    Raises:
        ValueError: ``pmtu`` is not an RDMA MTU.
        TransportError: pyverbs or a device is missing (:func:`verbs_unavailable`'s
            reason), or no RoCEv2 GID holds ``address``.
    """

    def __init__(
        self, address: str, pmtu: int = 256, max_message: int = 1 << 16, sysfs: Path = SYSFS
    ) -> None:
        if pmtu not in ROCE_PMTUS:
            raise ValueError(f"path MTU {pmtu} is not one of {ROCE_PMTUS}")
        why = verbs_unavailable()
        if why is not None:
            raise TransportError(why)
        self.address, self.pmtu, self.max_message = address, pmtu, max_message
        self.device, self.port, self.gid_index = roce_gid(address, sysfs)
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self._ctx = Context(name=self.device)
        self._pd = PD(self._ctx)
        self._cq = CQ(self._ctx, 4096, None, None, 0)
        self._qps: list[VerbsQueuePair] = []
        self._rng = random.Random()

    def register(self, size: int) -> VerbsRegion:
        """Register ``size`` bytes that the switch may write (``ibv_reg_mr``)."""
        import pyverbs.enums as e
        from pyverbs.mr import MR

        mr = MR(self._pd, size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        return VerbsRegion(mr, int(mr.buf), int(mr.rkey))

    def create_qp(self) -> VerbsQueuePair:
        """A UC queue pair in INIT, its receive requests posted."""
        import pyverbs.enums as e
        from pyverbs.mr import MR
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=4, max_recv_wr=_RECVS_PER_QP, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_UC, scq=self._cq, rcq=self._cq, cap=cap)
        attr = QPAttr(port_num=self.port)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        qp = QP(self._pd, init, attr)
        send_mr = MR(self._pd, self.max_message, e.IBV_ACCESS_LOCAL_WRITE)
        # A WRITE with immediate takes a receive request but writes nothing into it;
        # pyverbs wants one scatter entry all the same.
        scratch = MR(self._pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        entry = VerbsQueuePair(qp, int(qp.qp_num), self._rng.getrandbits(24), send_mr, scratch)
        for _ in range(_RECVS_PER_QP):
            self._post_recv(entry)
        self._qps.append(entry)
        return entry

    def connect(self, qp: VerbsQueuePair, peer_ip: str, peer_qpn: int, recv_psn: int) -> None:
        """RTR and RTS toward the peer's queue pair over RoCEv2, at the path MTU.

        Raises:
            ValueError: a queue pair number or PSN outside 24 bits.
        """
        attr = rts_attr(self.port, self.gid_index, self.pmtu, peer_ip, peer_qpn, recv_psn,
                        qp.send_psn)  # fmt: skip
        qp.qp.to_rts(attr)
        qp.peer, qp.recv_psn = (peer_ip, peer_qpn), recv_psn

    def post_write(
        self, qp: VerbsQueuePair, data: bytes | memoryview, va: int, rkey: int, imm: int | None
    ) -> None:
        """One RDMA WRITE (with immediate unless ``imm`` is None) of ``data``.

        Raises:
            TransportError: not connected, a message larger than the send buffer, or the
                device refused the request.
        """
        if qp.peer is None:
            raise TransportError(f"queue pair {qp.qpn:#x} is not connected")
        if len(data) > self.max_message:
            raise TransportError(f"a {len(data)}-byte message; the buffer has {self.max_message}")
        qp.send_mr.write(bytes(data), len(data), 0)
        wr = write_wr(int(qp.send_mr.buf), len(data), int(qp.send_mr.lkey), va, rkey, imm)
        try:
            qp.qp.post_send(wr)
        except Exception as exc:
            raise TransportError(f"post_send on queue pair {qp.qpn:#x}: {exc}") from None

    def poll(self, timeout: float) -> list[Completion]:
        """The WRITEs with immediate received, waiting up to ``timeout`` for the first.

        Raises:
            TransportError: a completion with an error status.
        """
        import pyverbs.enums as e

        deadline, out = time.monotonic() + max(timeout, 0.0), []
        while True:
            _, wcs = self._cq.poll(64)
            for wc in wcs:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise TransportError(f"completion status {wc.status} on qp {wc.qp_num:#x}")
                if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
                    out.append(Completion(wc.qp_num, socket.ntohl(wc.imm_data), wc.byte_len))
                    self._post_recv(self._qp(wc.qp_num))
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(20e-6)

    def close(self) -> None:
        for entry in self._qps:
            entry.qp.close()
        self._cq.close()
        self._pd.close()
        self._ctx.close()

    def _qp(self, qpn: int) -> VerbsQueuePair:
        return next(q for q in self._qps if q.qpn == qpn)

    @staticmethod
    def _post_recv(entry: VerbsQueuePair) -> None:
        entry.qp.post_recv(recv_wr(int(entry.scratch.buf), int(entry.scratch.lkey)))


# ------------------------------------------------------------------ requests, built alone
# What the device posts and sets, built without a device: the tests build them here.


def write_wr(addr: int, length: int, lkey: int, va: int, rkey: int, imm: int | None) -> Any:
    """The send request of one RDMA WRITE (with immediate unless ``imm`` is None) of
    ``length`` bytes at ``addr``; the NIC puts ``va`` and ``rkey`` in the RETH."""
    import pyverbs.enums as e
    from pyverbs.wr import SGE, SendWR

    opcode = e.IBV_WR_RDMA_WRITE if imm is None else e.IBV_WR_RDMA_WRITE_WITH_IMM
    wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(addr, length, lkey)],
                imm_data=socket.htonl(imm or 0), send_flags=e.IBV_SEND_SIGNALED)  # fmt: skip
    wr.set_wr_rdma(rkey, va)
    return wr


def recv_wr(addr: int, lkey: int) -> Any:
    """A receive request for one WRITE with immediate (its scatter entry stays unused)."""
    from pyverbs.wr import SGE, RecvWR

    return RecvWR(num_sge=1, sg=[SGE(addr, 64, lkey)])


def rts_attr(
    port: int, gid_index: int, pmtu: int, peer_ip: str, peer_qpn: int, recv_psn: int,
    send_psn: int,
) -> Any:  # fmt: skip
    """The attributes of INIT -> RTR -> RTS toward ``peer_qpn`` at ``peer_ip``'s RoCEv2
    GID, through this host's GID ``gid_index``.

    Raises:
        ValueError: a queue pair number or PSN outside 24 bits, or not an RDMA MTU.
    """
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.qp import QPAttr

    if not 0 <= peer_qpn < 1 << 24 or not 0 <= recv_psn < 1 << 24 or not 0 <= send_psn < 1 << 24:
        raise ValueError(f"queue pair {peer_qpn} or PSNs {recv_psn}, {send_psn} outside 24 bits")
    if pmtu not in _MTU_ENUM:
        raise ValueError(f"path MTU {pmtu} is not one of {ROCE_PMTUS}")
    dgid = GID(ipaddress.IPv6Address(f"::ffff:{peer_ip}").exploded)
    attr = QPAttr(port_num=port)
    attr.path_mtu = _MTU_ENUM[pmtu]
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=dgid, sgid_index=gid_index), is_global=1,
                          port_num=port)  # fmt: skip
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = peer_qpn, recv_psn, send_psn
    return attr
