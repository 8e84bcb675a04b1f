"""The soft switch's own capture: what it received and sent, dissected by scapy."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import bound_udp_sockets, worker_addresses
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from emulation.softswitch import SoftSwitchProcess
from emulation.softswitch.pcap import PcapWriter
from hostlib.protocol import HEADER_SIZE, Header, PacketType, pack_header
from hostlib.scapy_layer import INA, bind_port

LANES = 4
JOB = 5


@pytest.fixture
def workers() -> Iterator[list[socket.socket]]:
    with bound_udp_sockets(2) as socks:
        yield socks


def _contribute(sw: SoftSwitchProcess, sock: socket.socket, rank: int) -> None:
    header = Header(PacketType.DATA, JOB, rank, 0, 0, 7, LANES, rank)
    sock.sendto(pack_header(header) + np.arange(LANES, dtype=">i4").tobytes(), sw.data_addr)


def _run_switch(run_dir: Path, workers: list[socket.socket], *options: str) -> None:
    with SoftSwitchProcess(run_dir, lanes=LANES, slots=8, extra_args=options) as sw:
        bind_port(sw.data_addr[1])  # the switch runs on a free port, not INA_UDP_PORT
        with sw.controller() as ctl:
            ctl.add_job(JOB, worker_addresses(s.getsockname() for s in workers), 4)
        for rank, sock in enumerate(workers):
            _contribute(sw, sock, rank)
        for sock in workers:
            sock.recv(2048)  # the multicast result
        _contribute(sw, workers[0], 0)  # a retransmission: answered by unicast
        workers[0].recv(2048)
    assert sw.returncode == 0


def test_capture_holds_every_datagram_in_and_out(
    tmp_path: Path, workers: list[socket.socket]
) -> None:
    pcap = tmp_path / "switch.pcap"
    _run_switch(tmp_path, workers, "--pcap", str(pcap))
    packets = rdpcap(str(pcap))
    # 2 contributions, 2 multicast replicas, 1 retransmission, its unicast answer.
    kinds = [(p[INA].ptype, p[IP].dst) for p in packets]
    assert [k for k, _ in kinds] == [1, 1, 2, 2, 1, 2]
    first = packets[0]
    assert first[UDP].sport == workers[0].getsockname()[1]
    assert first[INA].job_id == JOB and first[INA].num_lanes == LANES
    result = packets[2][INA]
    assert list(result.lanes) == [0, 2, 4, 6]  # 0..3 from each of the two workers
    assert result.exponent == 1  # max of the ranks' exponents
    for p in packets:
        assert IP(bytes(p[IP])).chksum == p[IP].chksum  # scapy recomputes: header is valid
        assert len(p[UDP].payload) == HEADER_SIZE + 4 * LANES


def test_capture_stops_at_its_count(tmp_path: Path, workers: list[socket.socket]) -> None:
    pcap = tmp_path / "few.pcap"
    _run_switch(tmp_path, workers, "--pcap", str(pcap), "--pcap-count", "3")
    assert len(rdpcap(str(pcap))) == 3


def test_writer_rejects_a_negative_limit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_packets"):
        PcapWriter(tmp_path / "x.pcap", -1)


@pytest.mark.parametrize("port", [0, 65536])
def test_bind_port_rejects_bad_ports(port: int) -> None:
    with pytest.raises(ValueError, match="port"):
        bind_port(port)
