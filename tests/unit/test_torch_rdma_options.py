"""``INALAB_TRANSPORT=rdma`` for the ``"ina"`` torch backend: what the options refuse, in
one line each, before any rank binds or dials; the verbs device refused with the probe's
reason where there is none; and rank 0's refusal of ranks that failed or share an
address (dynamiccl.torchbackend.options, .rdma)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from dynamiccl.torchbackend import rdma
from dynamiccl.torchbackend.options import InaOptions, InaSetupError
from hostlib.transport.verbs import verbs_unavailable

BASE = {
    "INALAB_SWITCH": "127.0.0.1:20033",
    "INALAB_P4RUNTIME": "127.0.0.1:9559",
    "INALAB_JOB": "3",
    "INALAB_TRANSPORT": "rdma",
}


def test_rdma_options_from_the_environment() -> None:
    options = InaOptions.from_env({**BASE, "INALAB_MSG_PACKETS": "4", "INALAB_SLOTS": "64"})
    assert (options.transport, options.msg_packets, options.rdma_device) == ("rdma", 4, None)
    assert InaOptions.from_env({**BASE, "INALAB_TRANSPORT": "UDP "}).transport == "udp"
    assert InaOptions.from_env({**BASE, "INALAB_TRANSPORT": ""}).transport == "udp"
    assert (
        options.check_icrc and not InaOptions.from_env({**BASE, "INALAB_RDMA_ICRC": "0"}).check_icrc
    )


def test_the_emulated_rnic_checks_the_icrc_as_told() -> None:
    for flag, on in (("1", True), ("0", False)):
        options = InaOptions.from_env(
            {**BASE, "INALAB_RDMA_ICRC": flag, "INALAB_BIND": "127.0.7.1"}
        )
        nic = rdma.open_device(options, 1024, 2048)
        try:
            assert nic.check_icrc is on
        finally:
            nic.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"INALAB_TRANSPORT": "roce"}, "INALAB_TRANSPORT='roce': expected udp or rdma"),
        ({"INALAB_MSG_PACKETS": "3"}, "INALAB_MSG_PACKETS=3: a power of two up to 32"),
        ({"INALAB_MSG_PACKETS": "64"}, "INALAB_MSG_PACKETS=64: a power of two up to 32"),
        ({"INALAB_SLOTS": "6", "INALAB_MSG_PACKETS": "4"},
         "INALAB_SLOTS=6: a multiple of INALAB_MSG_PACKETS=4"),
        ({"INALAB_LANES": "100"}, "lanes 100: over RDMA a packet is a path MTU (64, 128,"),
        ({"INALAB_LANES": "1024", "INALAB_MSG_PACKETS": "4"},
         "INALAB_MSG_PACKETS=4 x lanes 1024 above 2048"),
        ({"INALAB_P4RUNTIME": "", "INALAB_LANES": "256"},
         "INALAB_TRANSPORT=rdma needs INALAB_P4RUNTIME"),
        ({"INALAB_SWITCH": "127.0.0.1:20033,127.0.0.2:20033",
          "INALAB_P4RUNTIME": "127.0.0.1:9559,127.0.0.2:9559"}, "rdma runs on one aggregator"),
        ({"INALAB_TRANSPORT": "udp", "INALAB_RDMA_DEVICE": "mlx5_0"},
         "INALAB_RDMA_DEVICE needs INALAB_TRANSPORT=rdma"),
        ({"INALAB_RDMA_ICRC": "no"}, "INALAB_RDMA_ICRC='no': give 0 or 1"),
    ],
)  # fmt: skip
def test_bad_rdma_settings_are_one_clear_error(extra: dict[str, str], message: str) -> None:
    with pytest.raises(InaSetupError) as info:
        InaOptions.from_env({**BASE, **extra})
    text = str(info.value)
    assert message in text and "\n" not in text, text


def test_a_named_device_without_verbs_fails_with_the_probes_reason() -> None:
    why = verbs_unavailable()
    if why is None:
        pytest.skip("this machine has an RDMA device: the probe gives no reason")
    options = InaOptions.from_env({**BASE, "INALAB_RDMA_DEVICE": "mlx5_0",
                                   "INALAB_BIND": "127.0.0.1"})  # fmt: skip
    with pytest.raises(InaSetupError) as info:
        rdma.open_device(options, 1024, 2048)
    assert str(info.value) == f"INALAB_RDMA_DEVICE=mlx5_0: {why}"


def test_rank_0_refuses_ranks_that_failed_or_share_an_address() -> None:
    options = InaOptions.from_env(BASE)
    ok = json.dumps({"ip": "10.0.0.1", "endpoints": [[1, 2, 3, 4]]})
    failed = json.dumps({"error": "RoCEv2 bind 10.0.0.2:4791: taken"})
    info = json.loads(rdma._install(options, [ok, failed]))
    assert info == {"error": "rank 1: RoCEv2 bind 10.0.0.2:4791: taken"}
    info = json.loads(rdma._install(options, [ok, ok]))
    assert info == {"error": "ranks share 10.0.0.1 (one rank an address: set INALAB_BIND)"}
