"""Sharing in the TNA model (p4/tna/sharing.p4), where the data-plane vector
tests/dataplane/vectors/sharing.json does not reach: the passes a shared slot takes, the
owner cell's value, a job without a fallback, and a job served behind another switch,
whose slots are loose (docs/sharing.md).
"""

from __future__ import annotations

import struct

from helpers import tna_frame

from emulation.tnamodel import TnaModel

LANES = 4
SLOTS = 16
FALLBACK_PORT = 5


def _data(job: int, rank: int, slot: int, seq: int, value: int, resend: bool = False) -> bytes:
    header = struct.pack("!BBHBbHHHI", 0x11, int(resend), job, rank, 0, LANES, slot, 0, seq)
    return header + struct.pack(f"!{LANES}i", *([value] * LANES))


def _values(frame: bytes) -> list[int]:
    return list(struct.unpack(f"!{LANES}i", frame[-4 * LANES :]))


def _model(job: int, slot_count: int, workers: int = 2) -> TnaModel:
    model = TnaModel(lanes=LANES, slots=SLOTS)
    model.set_job(job, num_workers=workers, slot_base=0, slot_count=slot_count, mgid=1)
    model.set_group(1, [(port, port - 1) for port in range(1, workers + 1)])
    for port in range(1, workers + 1):
        ip, mac = f"10.0.0.{port}", f"02:00:00:00:00:{port:02x}"
        model.worker_hit(job, port - 1, ip, 40000 + port)
        model.set_destination(job, port - 1, port, mac, ip, 40000 + port)
    return model


def test_a_shared_slot_takes_two_passes_and_its_owner_cell() -> None:
    model = _model(3, slot_count=1)
    model.set_shared(3, count=2, base=12, mask=3, offset=1, stats=0)
    assert model.process(1, tna_frame(1, _data(3, 0, 1, 1, 10))) == []
    assert model.passes == ["ingress pass 1", "ingress pass 2"]
    # job slot 1 is t = 0: pool slot 12 + ((1 + 0) & 3) = 13, held as 3 << 16 | 2
    assert model.registers["Ingress.sharing.owner"].cells[13] == 3 << 16 | 2
    out = model.process(2, tna_frame(2, _data(3, 1, 1, 1, 5)))
    assert [port for port, _ in out] == [1, 2]
    assert _values(out[0][1]) == [15] * LANES
    assert model.registers["Ingress.seq"].cells[13] == 1  # set 0, pool slot 13
    assert model.counters["Ingress.sharing.shared_uses"][0] == 1


def test_without_a_fallback_a_collision_and_a_slot_past_the_count_are_bad_slot() -> None:
    model = _model(3, slot_count=0)
    model.set_shared(3, count=1, base=12, mask=3, offset=0, stats=2)
    model.registers["Ingress.sharing.owner"].cells[12] = 9 << 16 | 1  # job 9's
    assert model.process(1, tna_frame(1, _data(3, 0, 0, 1, 1))) == []
    assert model.process(1, tna_frame(1, _data(3, 0, 1, 1, 1))) == []
    stats = model.statistics()
    assert (stats["drop_bad_slot"], stats["aggregated"]) == (2, 0)
    assert model.counters["Ingress.sharing.collisions"][2] == 1  # the collision only
    assert model.registers["Ingress.sharing.owner"].cells[12] == 9 << 16 | 1


def test_a_retransmission_without_a_fallback_starts_its_use_here() -> None:
    model = _model(3, slot_count=0)
    model.set_shared(3, count=1, base=12, mask=3, offset=0, stats=0)
    model.process(1, tna_frame(1, _data(3, 0, 0, 4, 2, resend=True)))
    out = model.process(2, tna_frame(2, _data(3, 1, 0, 4, 3)))
    assert [_values(f) for _, f in out] == [[5] * LANES] * 2


def test_a_job_behind_a_switch_lets_a_newer_use_take_a_running_one_over() -> None:
    model = _model(8, slot_count=2)
    model.set_behind(8)
    model.process(1, tna_frame(1, _data(8, 0, 0, 1, 100)))  # seq 1 runs: rank 1 missing
    # seq 3 means seq 1 finished at the other place: it takes the slot over, anew
    assert model.process(2, tna_frame(2, _data(8, 1, 0, 3, 5))) == []
    assert model.passes == ["ingress pass 1", "ingress pass 2"]
    out = model.process(1, tna_frame(1, _data(8, 0, 0, 3, 6)))
    assert [_values(f) for _, f in out] == [[11] * LANES] * 2
    assert model.process(2, tna_frame(2, _data(8, 1, 0, 1, 5))) == []
    assert model.statistics()["drop_stale"] == 1


def test_without_the_behind_entry_a_running_use_makes_a_newer_one_stale() -> None:
    model = _model(8, slot_count=2)
    model.process(1, tna_frame(1, _data(8, 0, 0, 1, 100)))
    assert model.process(2, tna_frame(2, _data(8, 1, 0, 3, 5))) == []
    assert model.statistics()["drop_stale"] == 1
