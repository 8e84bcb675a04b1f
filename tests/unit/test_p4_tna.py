"""The Tofino (TNA) program's sources and committed compile outputs, without the compiler.

``p4/compile_tna.py`` (run by ``.ci/run`` where p4c-barefoot is) holds the committed
P4Info, RegisterAction list and stage table to the compiler's output; these tests hold
those files, and the generated sources, to the budget, to the v1model program's control
interface and to the host library's constants. tests/integration/test_p4c_tna.py runs the
compiler itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import text_format
from helpers import load_script
from p4.config.v1 import p4info_pb2

from emulation.softswitch.pipeline import DropReason
from hostlib.protocol import MAX_WORKERS, SLOT_MASK, TNA_LANES_PER_PACKET, TNA_SWITCH_SLOTS

P4_DIR = Path(__file__).resolve().parents[2] / "p4"
TNA_DIR = P4_DIR / "tna"


compile_tna = load_script(P4_DIR / "compile_tna.py", "p4_compile_tna")
gen_tna = load_script(TNA_DIR / "gen_tna.py", "p4_gen_tna")


def _p4info(path: Path) -> p4info_pb2.P4Info:
    info = p4info_pb2.P4Info()
    # p4c-barefoot's P4Info carries a barefoot.PortMetadata extension protobuf lacks.
    text_format.Parse(path.read_text(), info, allow_unknown_field=True)
    return info


def _const(name: str) -> int:
    text = (TNA_DIR / "configuration.p4").read_text()
    match = re.search(rf"const\s+bit<\d+>\s+{name}\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*;", text)
    assert match is not None, f"tna/configuration.p4 declares no {name}"
    return int(match.group(1), 0)


def test_generated_files_are_current() -> None:
    assert gen_tna.stale() == []


def test_gen_check_notices_an_edit(tmp_path: Path) -> None:
    (tmp_path / "configuration.p4").write_text((TNA_DIR / "configuration.p4").read_text())
    for path, text in gen_tna.outputs(TNA_DIR).items():
        (tmp_path / path.name).write_text(text)
    assert gen_tna.stale(tmp_path) == []
    values = tmp_path / "values.p4"
    values.write_text(values.read_text().replace("value + hdr", "value - hdr", 1))
    assert gen_tna.stale(tmp_path) == [values]


def test_constants_are_the_host_librarys() -> None:
    assert _const("TNA_LANES_PER_PACKET") == TNA_LANES_PER_PACKET == gen_tna.lane_count()
    assert _const("TNA_SWITCH_SLOTS") == TNA_SWITCH_SLOTS
    assert _const("TNA_REGISTER_SIZE") == 2 * TNA_SWITCH_SLOTS
    # The register index is {set, abs_slot[12:0]}: 13 bits of slot.
    assert TNA_SWITCH_SLOTS == 1 << 13
    assert _const("SLOT_MASK") == SLOT_MASK
    assert gen_tna.MAX_WORKERS == MAX_WORKERS


def test_the_committed_placement_is_within_the_stage_budget() -> None:
    text = compile_tna.COMMITTED_RESOURCES.read_text()
    match = re.search(r"^stages (\d+) of (\d+);", text, re.MULTILINE)
    assert match is not None, text
    assert int(match.group(2)) == compile_tna.STAGE_BUDGET == 12
    assert int(match.group(1)) <= compile_tna.STAGE_BUDGET
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\d+$", text, re.MULTILINE)
    assert len(rows) == int(match.group(1))
    assert all(int(salus) <= 4 for _, salus in rows)
    # One stateful ALU per lane, one each for seq, missing, final, exponent and the two
    # drop simulators, RoCEv2's five queue-pair registers (roce.p4) and its reply PSN,
    # and sharing's owner register (sharing.p4).
    assert sum(int(salus) for _, salus in rows) == TNA_LANES_PER_PACKET + 6 + 6 + 1


def _resources(stages: dict[int, list[str]]) -> dict[str, object]:
    """A resources.json with these stages' tables (one stateful ALU each)."""
    return {
        "resources": {
            "mau": {
                "mau_stages": [
                    {
                        "stage_number": n,
                        "logical_tables": {"ids": [{"table_name": t} for t in tables]},
                        "meter_alus": {"meters": [{"row": 0}]},
                    }
                    for n, tables in stages.items()
                ]
            }
        }
    }


def test_the_budget_check_fails_a_thirteenth_stage() -> None:
    twelve = {n: [f"t{n}"] for n in range(12)}
    compile_tna.check_stage_budget(compile_tna.stage_use(_resources(twelve)))
    thirteen = {**twelve, 12: ["tbl_values405"]}
    over = r"13 stages, budget 12.*tbl_values405"
    with pytest.raises(compile_tna.StageBudgetExceeded, match=over):
        compile_tna.check_stage_budget(compile_tna.stage_use(_resources(thirteen)))


def test_stateful_actions_are_read_from_the_assembly() -> None:
    assembly = """\
      - tbl_seq51$salu..Ingress.seq(seq_check, $hash_dist)
    stateful: tbl_drop_simulator26$salu..Ingress.drop_simulator.probability(meter_addr, $DEFAULT)
      - tbl_seq49$salu..Ingress.seq(seq_advance, $hash_dist)
      - _Ingress_checks_checks$salu..Ingress.missing(checks_missing_join, $hash_dist)
"""
    assert compile_tna.stateful_actions(assembly) == {
        "Ingress.missing": ["checks_missing_join"],
        "Ingress.seq": ["seq_advance", "seq_check"],
    }


def _source_register_actions() -> dict[str, set[str]]:
    """Each register's RegisterActions as the .p4 sources declare them: register @name ->
    RegisterAction identifiers (per control: both drop simulators name theirs alike)."""
    found: dict[str, set[str]] = {}
    for path in TNA_DIR.glob("*.p4"):
        for block in path.read_text().split("\ncontrol ")[1:]:
            names = dict(
                (ident, name)
                for name, ident in re.findall(
                    r'@name\("\.([\w.]+)"\)\s*Register<[\w<>, ]+>\([^)]*\)\s*(\w+);', block
                )
            )
            for register, ident in re.findall(
                r"RegisterAction<[\w<>, ]+>\((\w+)\)\s*(\w+)\s*=", block
            ):
                found.setdefault(names[register], set()).add(ident)
    return found


def test_every_register_action_is_placed() -> None:
    committed: dict[str, list[str]] = {}
    for line in compile_tna.COMMITTED_STATEFUL.read_text().splitlines():
        register, _, acts = line.partition(": ")
        committed[register] = acts.split()
    sources = _source_register_actions()
    info = _p4info(compile_tna.COMMITTED_P4INFO)
    registers = {r.preamble.name for r in info.registers}
    assert set(committed) == registers == set(sources)
    for register, idents in sources.items():
        # p4c names them <control instance>_<identifier>[_<n>] in the assembly.
        placed = {
            ident
            for ident in idents
            for name in committed[register]
            if re.fullmatch(rf"\w+?_{ident}(_\d+)?", name)
        }
        assert placed == idents, register
        assert len(committed[register]) == len(idents), register


def _actions(info: p4info_pb2.P4Info) -> dict[str, list[tuple[str, int]]]:
    return {
        a.preamble.name: [(p.name, p.bitwidth) for p in a.params] for a in info.actions
    }


def _keys(info: p4info_pb2.P4Info) -> dict[str, list[tuple[str, int, int]]]:
    return {
        t.preamble.name: [(f.name, f.bitwidth, f.match_type) for f in t.match_fields]
        for t in info.tables
    }


# What the controller writes: the same names, keys and parameters on both programs.
_SHARED_TABLES = (
    "Ingress.jobs.jobs",
    "Ingress.workers.workers",
    "Ingress.upstream.upstream",
    "Ingress.forwarder.forward",
    "Egress.replicas.replicas",
    "Ingress.roce.roce_requests",  # RoCEv2: controller/roce.py writes both programs alike
    "Ingress.roce.roce_jobs",
    "Egress.roce.roce_replies",
)
_SHARED_ACTIONS = (
    "Ingress.jobs.set_job",
    "Ingress.workers.worker_hit",
    "Ingress.upstream.set_upstream",
    "Ingress.forwarder.set_egress_port",
    "Ingress.forwarder.flood",
    "Ingress.forwarder.forward_drop",
    "Egress.replicas.set_destination",
    "Ingress.roce.set_roce_qp",
    "Ingress.roce.set_roce_job",
    "Egress.roce.set_roce_reply",
)
_SHARED_STATE = (
    "Ingress.seq",
    "Ingress.final",
    "Ingress.exponents.exponent",
    "Ingress.drop_simulator.probability",
    "Egress.drop_simulator.probability",
    "Ingress.drops",
    "Ingress.ina_stats",
    "Egress.drops",
    "Egress.ina_stats",
    "Egress.roce.reply_psn",  # the controller starts each worker queue pair's PSN in it
)


def test_the_controllers_tables_are_the_v1model_programs() -> None:
    tna = _p4info(compile_tna.COMMITTED_P4INFO)
    v1 = _p4info(P4_DIR / "ina.p4info.txtpb")
    tna_keys, v1_keys = _keys(tna), _keys(v1)
    for table in _SHARED_TABLES:
        assert tna_keys[table] == v1_keys[table], table
    tna_actions, v1_actions = _actions(tna), _actions(v1)
    for action in _SHARED_ACTIONS:
        assert tna_actions[action] == v1_actions[action], action
    names = {x.preamble.name for x in [*tna.registers, *tna.counters]}
    assert set(_SHARED_STATE) <= names
    lanes = {r.preamble.name for r in tna.registers if ".values.lane_" in r.preamble.name}
    assert lanes == {f"Ingress.values.lane_{n:02d}" for n in range(TNA_LANES_PER_PACKET)}
    sizes = {r.preamble.name: r.size for r in tna.registers}
    assert sizes["Ingress.seq"] == sizes["Ingress.values.lane_00"] == 2 * TNA_SWITCH_SLOTS
    v1_sizes = {r.preamble.name: r.size for r in v1.registers}
    assert sizes["Egress.roce.reply_psn"] == v1_sizes["Egress.roce.reply_psn"]


def test_the_checks_run_in_the_soft_switchs_order() -> None:
    text = (TNA_DIR / "checks_entries.p4").read_text()
    seen: list[str] = []
    for reason in re.findall(r"drop\(\(bit<8>\)DROP_(\w+)\)", text):
        if reason not in seen:
            seen.append(reason)
    order = [r.name for r in DropReason]
    # The drop simulator first (as on bmv2), then every check in the soft switch's order;
    # stale is the default (an older seq), the egress simulator is egress's.
    # RoCEv2's own reasons come from roce.p4 before these checks (the RoCEv2 vectors on
    # tna-model hold their order).
    roce = ("UNKNOWN_QP", "BAD_PSN", "BAD_ICRC")
    checks = [r for r in order if r not in ("STALE", "SIM_INGRESS", "SIM_EGRESS", *roce)]
    assert seen == ["SIM_INGRESS", *checks]


def test_the_readme_shows_the_committed_resources() -> None:
    readme = (P4_DIR / "README.md").read_text()
    heading = "### Resources (`tna/ina_tna.resources.txt`, from `pipe/logs/resources.json`)"
    start = readme.index("```\n", readme.index(heading)) + len("```\n")
    shown = readme[start : readme.index("```", start)]
    assert shown == compile_tna.COMMITTED_RESOURCES.read_text()
