"""p4c's Tofino backend through p4/compile_tna.py: a program breaking Tofino's rules fails.

``.ci/run`` compiles the real program (``p4/compile_tna.py``: no error, 12 stages, the
committed P4Info, RegisterAction list and stage table current); tests/unit/test_p4_tna.py
holds those committed files to the budget. Here ``compile_tna()`` refuses deliberate
violations, so a check that passed everything would fail. The violations are edits of
a small self-contained TNA program (:data:`TINY_TNA`: one register, the exponent's as in
p4/tna/values.p4), not of a copy of p4/tna/: p4c takes a few seconds on it, where on the
full program its table placement ran for a minute before failing. The unedited small
program compiles, so each failure is its edit's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import load_script

pytestmark = [pytest.mark.tofino]

P4_DIR = Path(__file__).resolve().parents[2] / "p4"


compile_tna = load_script(P4_DIR / "compile_tna.py", "p4_compile_tna")

TINY_TNA = r"""
#include <core.p4>
#include <tna.p4>

const bit<8> OP_WRITE = 1;
const bit<8> OP_ADD = 2;

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ina_h {
    bit<8> op;
    bit<8> exponent;
    bit<16> index;
}

struct headers_t {
    ethernet_h ethernet;
    ina_h ina;
}

struct metadata_t {}

parser TinyIngressParser(packet_in pkt, out headers_t hdr, out metadata_t meta,
                         out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ina);
        transition accept;
    }
}

control TinyIngress(inout headers_t hdr, inout metadata_t meta,
                    in ingress_intrinsic_metadata_t ig_intr_md,
                    in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                    inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                    inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    @name(".Ingress.exponent")
    Register<bit<8>, bit<10>>(1024, 0) exponent;
    RegisterAction<bit<8>, bit<10>, bit<8>>(exponent) exponent_max = {
        void apply(inout bit<8> value, out bit<8> result) {
            if ((int<8>)value < (int<8>)hdr.ina.exponent) {
                value = hdr.ina.exponent;
            }
            result = value;
        }
    };
    RegisterAction<bit<8>, bit<10>, bit<8>>(exponent) exponent_read = {
        void apply(inout bit<8> value, out bit<8> result) {
            result = value;
        }
    };

    apply {
        if (hdr.ina.op == OP_ADD) {
            hdr.ina.exponent = exponent_max.execute(hdr.ina.index[9:0]);
        } else {
            hdr.ina.exponent = exponent_read.execute(hdr.ina.index[9:0]);
        }
        ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
    }
}

control TinyIngressDeparser(packet_out pkt, inout headers_t hdr, in metadata_t meta,
                            in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

parser TinyEgressParser(packet_in pkt, out headers_t hdr, out metadata_t meta,
                        out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        transition accept;
    }
}

control TinyEgress(inout headers_t hdr, inout metadata_t meta,
                   in egress_intrinsic_metadata_t eg_intr_md,
                   in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                   inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                   inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    apply {}
}

control TinyEgressDeparser(packet_out pkt, inout headers_t hdr, in metadata_t meta,
                           in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

Pipeline(TinyIngressParser(), TinyIngress(), TinyIngressDeparser(),
         TinyEgressParser(), TinyEgress(), TinyEgressDeparser()) pipe;

Switch(pipe) main;
"""
"""A self-contained TNA program: one register, the exponent's max and read RegisterActions
(two comparisons at most), each packet executing one of them once."""


def _program(tmp_path: Path, old: str = "", new: str = "") -> Path:
    """:data:`TINY_TNA` with ``old`` (once in it) replaced by ``new``, in ``tmp_path``."""
    text = TINY_TNA
    if old:
        assert text.count(old) == 1, f"the edit's anchor {old!r} is not once in TINY_TNA"
        text = text.replace(old, new)
    path = tmp_path / "tiny_tna.p4"
    path.write_text(text)
    return path


def test_the_unedited_program_compiles(tmp_path: Path) -> None:
    compiled = compile_tna.compile_tna(tmp_path / "out", _program(tmp_path))
    # The register and both its RegisterActions made it into the assembly.
    actions = compile_tna.stateful_actions(compiled.assembly.read_text())
    assert list(actions) == ["Ingress.exponent"]
    assert len(actions["Ingress.exponent"]) == 2


_READ = "hdr.ina.exponent = exponent_read.execute(hdr.ina.index[9:0]);\n        }"


def test_a_register_executed_twice_in_one_pass_fails(tmp_path: Path) -> None:
    # The register once more, after its execute: two reads of one register a pass (as
    # p4/tna/seq.p4's check would be after its check or advance). This p4c places one
    # RegisterAction executed twice in two stages without an error; a register with two
    # RegisterActions, as here, it cannot place twice.
    program = _program(
        tmp_path,
        _READ,
        _READ + "\n        hdr.ina.exponent = hdr.ina.exponent"
        " + exponent_read.execute(hdr.ina.index[9:0]);",
    )
    with pytest.raises(compile_tna.CompileFailed, match="error: Table placement cannot make"):
        compile_tna.compile_tna(tmp_path / "out", program)


def test_a_register_action_with_three_comparisons_fails(tmp_path: Path) -> None:
    # The exponent's write and max in one RegisterAction: the operation's two comparisons
    # and the signed max's third.
    program = _program(
        tmp_path,
        "            if ((int<8>)value < (int<8>)hdr.ina.exponent) {",
        "            if (hdr.ina.op == OP_WRITE"
        " || (hdr.ina.op == OP_ADD && (int<8>)value < (int<8>)hdr.ina.exponent)) {",
    )
    with pytest.raises(compile_tna.CompileFailed, match="comparisons"):
        compile_tna.compile_tna(tmp_path / "out", program)
