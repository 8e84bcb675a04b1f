"""A scapy dissector for the INA header, for pcaps, tcpdump-style inspection and tests.

This module is tooling around the wire format, not part of the data path: hosts and the
soft switch pack headers with :mod:`hostlib.protocol` and never import scapy. Importing
this module imports scapy (about half a second) and binds :class:`INA` to UDP on
:data:`~hostlib.protocol.INA_UDP_PORT`, so ``IP(raw_bytes)`` and ``rdpcap`` dissect INA
frames; ``hostlib/__init__`` must never import it, which keeps that cost out of workers.

The fields mirror ``hostlib.protocol.HEADER`` one for one, with ``pool_index`` split into
its two parts (``pool_set``: 1 bit, ``slot``: 15 bits) as a P4 parser would declare it.
"""

from __future__ import annotations

from typing import Any

from scapy.fields import (
    BitEnumField,
    BitField,
    ByteField,
    FieldLenField,
    FieldListField,
    FlagsField,
    IntField,
    ShortField,
    SignedByteField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_bottom_up, bind_layers

from hostlib.protocol import (
    EXPONENT_MIN,
    FLAG_RESEND,
    INA_UDP_PORT,
    MAX_LANES,
    PROTOCOL_VERSION,
    PacketType,
)

__all__ = ["INA", "bind_port"]

# FlagsField names bits from the least significant one up.
_FLAG_NAMES = [f"bit{i}" for i in range(8)]
_FLAG_NAMES[FLAG_RESEND.bit_length() - 1] = "RESEND"


class INA(Packet):
    """The 16-byte INA header followed by ``num_lanes`` big-endian int32 lanes.

    ``num_lanes`` is computed from ``lanes`` when left unset, so
    ``INA(ptype="DATA", job_id=1, lanes=[1, 2, 3])`` builds a consistent packet. Bytes
    after the lanes (Ethernet padding of a short frame) are kept as padding, not payload.
    """

    name = "INA"
    fields_desc = [  # noqa: RUF012 - scapy reads the layout from this class attribute
        BitField("version", PROTOCOL_VERSION, 4),
        BitEnumField("ptype", PacketType.DATA, 4, {int(t): t.name for t in PacketType}),
        FlagsField("flags", 0, 8, _FLAG_NAMES),
        ShortField("job_id", 0),
        ByteField("rank", 0),
        SignedByteField("exponent", EXPONENT_MIN),
        FieldLenField("num_lanes", None, count_of="lanes", fmt="!H"),
        BitField("pool_set", 0, 1),
        BitField("slot", 0, 15),
        ShortField("reserved", 0),
        IntField("seq", 0),
        # max_count: scapy stops at conf.max_list_count (100) items otherwise.
        FieldListField(
            "lanes",
            [],
            SignedIntField("", 0),
            count_from=lambda pkt: pkt.num_lanes,
            max_count=MAX_LANES,
        ),
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        # Nothing is carried inside INA: whatever follows the lanes is link padding.
        return b"", s

    def mysummary(self) -> Any:
        return self.sprintf(
            "INA %ptype% job=%job_id% rank=%rank% slot=%slot%/%pool_set% seq=%seq% "
            "exp=%exponent% lanes=%num_lanes%"
        )


# Workers send to the switch's INA port; results come back from it, so both directions
# dissect. Building UDP()/INA() fills in the destination port only.
bind_layers(UDP, INA, dport=INA_UDP_PORT)
bind_bottom_up(UDP, INA, sport=INA_UDP_PORT)


def bind_port(port: int) -> None:
    """Also dissect UDP datagrams to or from ``port`` as INA, e.g. for the pcap of a soft
    switch started on a free port (``inalab switch --listen 127.0.0.1:0 --pcap ...``).

    Raises:
        ValueError: port outside 1..65535.
    """
    if not 1 <= port <= 0xFFFF:
        raise ValueError(f"port {port} outside 1..65535")
    bind_bottom_up(UDP, INA, dport=port)
    bind_bottom_up(UDP, INA, sport=port)
