"""The TNA program's Python model (emulation.tnamodel): Tofino's limits, the pass
structure, and its tie to the compiled program.

The tie: the model's registers, the RegisterActions of each, its tables with their
actions (and the parameters of its table-writing methods) and its counters must equal
what p4c-barefoot made of p4/tna/ina_tna.p4: the P4Info (p4/tna/ina_tna.p4info.txtpb)
and the compiler's stateful ALU programs (p4/tna/ina_tna.stateful.txt: one line per
register, ``<register>: <control-instance>_<RegisterAction>[_N] ...``). The checks are
functions that return problems, fed mutated programs below so they can be seen to fail.
The data-plane vectors run on the model as the ``tna-model`` target
(tests/dataplane/tna_target.py).
"""

from __future__ import annotations

import inspect
import re
import struct
from collections.abc import Mapping

import pytest
from helpers import tna_frame

from controller.p4info import P4Info
from emulation.tnamodel import TableError, TnaModel, TofinoLimitError
from emulation.tnamodel.model import TABLE_ACTIONS, Meta, Phv
from emulation.tnamodel.packet import Headers, Ina
from emulation.tnamodel.program import TNA_DIR, load_constants
from emulation.tnamodel.stateful import PassState, Register, RegisterAction, Salu, SaluOut

P4INFO = TNA_DIR / "ina_tna.p4info.txtpb"
STATEFUL = TNA_DIR / "ina_tna.stateful.txt"

WRITERS = {
    "Ingress.jobs.set_job": "set_job",
    "Ingress.workers.worker_hit": "worker_hit",
    "Ingress.upstream.set_upstream": "set_upstream",
    "Egress.replicas.set_destination": "set_destination",
    "Ingress.forwarder.set_egress_port": "set_egress_port",
    "Ingress.forwarder.flood": "flood",
    "Ingress.roce.set_roce_qp": "set_roce_qp",
    "Ingress.roce.set_roce_job": "set_roce_job",
    "Egress.roce.set_roce_reply": "set_roce_reply",
    "Ingress.sharing.set_shared": "set_shared",
    "Ingress.sharing.set_fallback": "set_fallback",
    "Ingress.sharing.set_behind": "set_behind",
}
"""Table actions the control plane writes, and the model's method that writes each."""


# --------------------------------------------------------------------- helpers
def _phv(seq: int = 0) -> Phv:
    ina = Ina(1, 1, 0, 7, 0, 0, 28, 0, 0, seq)
    return Phv(Headers(ina=ina), Meta())


def _data(model: TnaModel, rank: int, seq: int, value: int) -> bytes:
    header = struct.pack("!BBHBbHHHI", 0x11, 0, 7, rank, 0, model.lanes, 0, 0, seq)
    return header + struct.pack(f"!{model.lanes}i", *([value] * model.lanes))


def _two_workers() -> TnaModel:
    model = TnaModel(lanes=4, slots=16)
    model.set_job(7, num_workers=2, slot_base=0, slot_count=2, mgid=1)
    model.set_group(1, [(1, 0), (2, 1)])
    for rank, port in ((0, 1), (1, 2)):
        ip, mac = f"10.0.0.{port}", f"02:00:00:00:00:{port:02x}"
        model.worker_hit(7, rank, ip, 40000 + port)
        model.set_destination(7, rank, port, mac, ip, 40000 + port)
    return model


# --------------------------------------------------------------------- limits
def test_a_register_runs_once_per_pass() -> None:
    model = TnaModel(lanes=4, slots=16)
    seq, state = model.registers["Ingress.seq"], PassState("ingress pass 1")
    assert seq.execute("check", 0, _phv(5), state) == 1  # an unused slot
    with pytest.raises(TofinoLimitError, match=r"Ingress\.seq executed twice"):
        seq.execute("advance", 0, _phv(5), state)
    # Another pass may run it again.
    assert seq.execute("advance", 0, _phv(5), PassState("ingress pass 2")) == 1
    assert seq.cells[0] == 5


def test_a_value_wider_than_its_register_is_refused() -> None:
    def unmasked_add(salu: Salu, value: int, phv: Phv) -> SaluOut:
        return SaluOut(value + 1, 0)

    def wide_output(salu: Salu, value: int, phv: Phv) -> SaluOut:
        return SaluOut(value, 0x100)

    reg = Register("r", 8, 1, [RegisterAction("add", unmasked_add, 8),
                               RegisterAction("out", wide_output, 8)])  # fmt: skip
    reg.cells[0] = 0xFF
    with pytest.raises(TofinoLimitError, match="new value 0x100 does not fit 8 bits"):
        reg.execute("add", 0, _phv(), PassState("p"))
    assert reg.cells[0] == 0xFF  # refused: nothing written
    with pytest.raises(TofinoLimitError, match="output 0x100 does not fit 8 bits"):
        reg.execute("out", 0, _phv(), PassState("p"))


def test_a_register_action_computes_a_value_and_one_output_with_two_comparisons() -> None:
    def two_outputs(salu: Salu, value: int, phv: Phv) -> SaluOut:
        return (value, 1, 2)  # type: ignore[return-value]

    def three_tests(salu: Salu, value: int, phv: Phv) -> SaluOut:
        if salu.cond(value == 1) or salu.cond(value == 2) or salu.cond(value == 3):
            return SaluOut(value, 1)
        return SaluOut(value, 0)

    reg = Register("r", 32, 1, [RegisterAction("two", two_outputs, 32),
                                RegisterAction("three", three_tests, 32)])  # fmt: skip
    with pytest.raises(TofinoLimitError, match="a new value and one output"):
        reg.execute("two", 0, _phv(), PassState("p"))
    with pytest.raises(TofinoLimitError, match="at most 2 comparisons"):
        reg.execute("three", 0, _phv(), PassState("p"))
    reg.cells[0] = 1  # the first comparison holds: two are never evaluated
    assert reg.execute("three", 0, _phv(), PassState("q")) == 1


def test_lanes_add_wrapping_within_32_bits() -> None:
    model = _two_workers()
    model.process(1, tna_frame(1, _data(model, 0, 1, 0x7FFFFFFF)))
    out = model.process(2, tna_frame(2, _data(model, 1, 1, 1)))
    assert [port for port, _ in out] == [1, 2]
    lanes = struct.unpack_from("!4i", out[0][1], 42 + 16)
    assert lanes == (-(2**31),) * 4


# --------------------------------------------------------------------- passes
def test_a_uses_first_packet_takes_two_passes_and_the_others_one() -> None:
    model = _two_workers()
    assert model.process(1, tna_frame(1, _data(model, 0, 1, 3))) == []
    assert model.passes == ["ingress pass 1", "ingress pass 2"]
    out = model.process(2, tna_frame(2, _data(model, 1, 1, 4)))
    assert model.passes == ["ingress pass 1", "egress to port 1 rid 0", "egress to port 2 rid 1"]
    assert struct.unpack_from("!4i", out[1][1], 42 + 16) == (7, 7, 7, 7)
    # The next use of the slot (a newer seq) starts with two passes again; a duplicate
    # of it is ignored in one.
    model.process(1, tna_frame(1, _data(model, 0, 2, 1)))
    assert model.passes == ["ingress pass 1", "ingress pass 2"]
    model.process(1, tna_frame(1, _data(model, 0, 2, 1)))
    assert model.passes == ["ingress pass 1"]
    stats = model.statistics()
    assert (stats["received"], stats["aggregated"], stats["duplicates_ignored"]) == (4, 3, 1)
    assert (stats["completed"], stats["results_sent"]) == (1, 2)


def test_set_drops_writes_round_p_times_2_31() -> None:
    model = TnaModel(lanes=4, slots=16)
    model.set_drops(0.25, 1.0)
    assert model.registers["Ingress.drop_simulator.probability"].cells == [2**29]
    assert model.registers["Egress.drop_simulator.probability"].cells == [2**31]
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        model.set_drops(1.5, 0)


def test_bad_table_writes_are_refused() -> None:
    model = TnaModel(lanes=4, slots=16)
    with pytest.raises(TableError, match="leave the set"):
        model.set_job(1, num_workers=2, slot_base=10, slot_count=7, mgid=1)
    with pytest.raises(TableError, match="multicast group 0"):
        model.set_group(0, [(1, 0)])


def test_defaults_are_the_programs() -> None:
    constants = load_constants(TNA_DIR.parent / "configuration.p4", TNA_DIR / "configuration.p4")
    model = TnaModel()
    assert model.lanes == constants["TNA_LANES_PER_PACKET"]
    assert len(model.registers["Ingress.seq"].cells) == constants["TNA_REGISTER_SIZE"]


# --------------------------------------------------------------------- tie to the program
def object_problems(model: TnaModel, p4info: P4Info) -> list[str]:
    """How the model's registers, tables (with their actions), counters and table-writing
    methods differ from the P4Info's."""
    problems = []
    registers = {r.name: (r.size, r.bitwidth) for r in p4info.registers}
    ours = {r.name: (len(r.cells), r.width) for r in model.registers.values()}
    if registers != ours:
        problems.append(f"registers: P4Info {_diff(registers, ours)}")
    tables = {
        t.name: sorted(p4info.action(a.id).name for a in t.action_refs) for t in p4info.tables
    }
    ours_t = {
        t: sorted(f"{t.rsplit('.', 1)[0]}.{a}" for a in actions)
        for t, actions in TABLE_ACTIONS.items()
    }
    if tables != ours_t:
        problems.append(f"tables: P4Info {_diff(tables, ours_t)}")
    counters = {c.name: c.size for c in p4info.counters}
    ours_c = {name: len(cells) for name, cells in model.counters.items()}
    if counters != ours_c:
        problems.append(f"counters: P4Info {_diff(counters, ours_c)}")
    for action, method in WRITERS.items():
        problems += _writer_problems(model, p4info, action, method)
    return problems


def _writer_problems(model: TnaModel, p4info: P4Info, action: str, method: str) -> list[str]:
    table = next(
        (
            t
            for t in p4info.tables
            if any(p4info.action(a.id).name == action for a in t.action_refs)
        ),
        None,
    )
    if table is None:
        return [f"{action}: in no table of the P4Info"]
    wanted = [f.name for f in table.match_fields] + [p.name for p in p4info.action(action).params]
    have = list(inspect.signature(getattr(model, method)).parameters)
    return [] if have == wanted else [f"{method}{tuple(have)}: P4Info {table.name} {wanted}"]


def _diff(theirs: Mapping[str, object], ours: Mapping[str, object]) -> str:
    only_theirs = {k: v for k, v in theirs.items() if ours.get(k) != v}
    only_ours = {k: v for k, v in ours.items() if theirs.get(k) != v}
    return f"has {only_theirs}, the model {only_ours}"


def control_instances() -> list[str]:
    """The control instances of ina_tna.p4 (``TnaSeq() seq;``): the prefixes of the
    compiler's RegisterAction names."""
    text = (TNA_DIR / "ina_tna.p4").read_text()
    return re.findall(r"^\s*Tna\w+\(\)\s+(\w+)\s*;", text, re.MULTILINE)


def stateful_problems(model: TnaModel, text: str, instances: list[str]) -> list[str]:
    """How the model's RegisterActions per register differ from the compiler's
    (``text``: lines ``<register>: <instance>_<RegisterAction>[_N] ...``)."""
    compiled: dict[str, set[str]] = {}
    by_length = sorted(instances, key=len, reverse=True)
    for line in text.splitlines():
        if not line.strip():
            continue
        register, _, names = line.partition(":")
        ours = set(model.registers[register].actions) if register in model.registers else set()
        compiled[register] = {_action_name(n, by_length, ours) for n in names.split()}
    declared = {name: set(r.actions) for name, r in model.registers.items()}
    if compiled == declared:
        return []
    return [
        f"{name}: compiled {sorted(compiled.get(name, ()))}, model {sorted(declared.get(name, ()))}"
        for name in sorted(compiled.keys() | declared.keys())
        if compiled.get(name) != declared.get(name)
    ]


def _action_name(compiled: str, instances: list[str], ours: set[str]) -> str:
    """``<instance>_<RegisterAction>[_N]`` -> the RegisterAction (N: the compiler's
    suffix for a second instance of one control, e.g. the egress drop simulator's)."""
    instance = next((i for i in instances if compiled.startswith(i + "_")), None)
    name = compiled if instance is None else compiled[len(instance) + 1 :]
    if name not in ours:
        name = re.sub(r"_\d+$", "", name)
    return name


@pytest.fixture(scope="module")
def model() -> TnaModel:
    return TnaModel()  # the program's lane count, as compiled


@pytest.fixture(scope="module")
def p4info() -> P4Info:
    if not P4INFO.exists():
        pytest.skip(f"{P4INFO} not there (p4/compile_tna.py writes it)")
    return P4Info.load(P4INFO)


def test_the_models_objects_are_the_programs(model: TnaModel, p4info: P4Info) -> None:
    assert object_problems(model, p4info) == []


def test_the_models_register_actions_are_the_compilers(model: TnaModel) -> None:
    if not STATEFUL.exists():
        pytest.skip(f"{STATEFUL} not there")
    instances = control_instances()
    assert {"seq", "checks", "next_step", "values", "drop_simulator"} <= set(instances)
    assert stateful_problems(model, STATEFUL.read_text(), instances) == []


def test_the_object_check_fails_on_another_program(model: TnaModel, p4info: P4Info) -> None:
    message = type(p4info.message)()
    message.CopyFrom(p4info.message)
    message.registers[0].preamble.name = "Ingress.renamed"
    message.counters[0].size = 2
    table = next(t for t in message.tables if t.preamble.name == "Ingress.jobs.jobs")
    del table.action_refs[-1]
    action = next(a for a in message.actions if a.preamble.name == "Ingress.jobs.set_job")
    action.params[0].name = "workers"
    problems = object_problems(model, P4Info(message))
    assert [p.split(":")[0] for p in problems] == [
        "registers", "tables", "counters", "set_job('job_id', 'num_workers', 'slot_base', "
        "'slot_count', 'mgid')",
    ]  # fmt: skip


def test_the_stateful_check_fails_on_another_program(model: TnaModel) -> None:
    instances = ["seq", "values", "drop_simulator"]
    lines = [
        "Ingress.seq: seq_advance seq_check",
        "Ingress.drop_simulator.probability: drop_simulator_below",
        "Egress.drop_simulator.probability: drop_simulator_below_0",
    ]
    lanes = [f"Ingress.values.lane_{n:02d}: values_lane_{n:02d}_op" for n in range(model.lanes)]
    rest = [
        "Ingress.missing: checks_missing_join checks_missing_peek checks_missing_restart "
        "checks_missing_start",
        "Ingress.final: next_step_final_clear next_step_final_read next_step_final_take",
        "Ingress.exponents.exponent: values_exponent_max values_exponent_read "
        "values_exponent_write",
        "Ingress.roce.expect_psn: roce_step_psn_close roce_step_psn_first roce_step_psn_next "
        "roce_step_psn_next_close",
        "Ingress.roce.place: roce_step_place_first roce_step_place_next",
        "Ingress.roce.base: roce_step_base_first roce_step_base_next roce_step_base_peek",
        "Ingress.roce.seq: roce_step_seq_first roce_step_seq_read",
        "Ingress.roce.exponent: roce_step_exponent_first roce_step_exponent_read",
        "Egress.roce.reply_psn: roce_read_psn",
        "Ingress.sharing.owner: owner_take",
    ]
    good = "\n".join(lines + lanes + rest)
    instances += ["checks", "next_step", "roce_step", "roce", "owner"]
    assert stateful_problems(model, good, instances) == []
    no_advance = good.replace("seq_advance ", "")
    assert stateful_problems(model, no_advance, instances) == [
        "Ingress.seq: compiled ['check'], model ['advance', 'check']"
    ]
    one_lane_less = "\n".join(lines + lanes[:-1] + rest)
    assert len(stateful_problems(model, one_lane_less, instances)) == 1


def test_process_never_leaves_the_vectors_ports() -> None:
    # A job's multicast group names the ports of its replicas: a miss in the replicas
    # table drops the replica uncounted, as replicas.p4 does.
    model = _two_workers()
    model.set_group(1, [(1, 0), (2, 1), (9, 5)])
    model.process(1, tna_frame(1, _data(model, 0, 1, 1)))
    out = model.process(2, tna_frame(2, _data(model, 1, 1, 1)))
    assert [p for p, _ in out] == [1, 2]
    assert model.statistics()["results_sent"] == 2


def test_a_truncated_header_in_a_padded_frame_is_truncated() -> None:
    model = TnaModel(lanes=4, slots=16, min_frame=60)
    model.set_job(4, num_workers=1, slot_base=0, slot_count=1, mgid=1)
    fifteen = bytes.fromhex("11 00 0004 00 80 0004 0000 0000 000000")
    assert model.process(1, tna_frame(1, fifteen)) == []
    assert model.statistics()["drop_truncated"] == 1
