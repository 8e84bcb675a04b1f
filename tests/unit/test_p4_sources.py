"""The P4 program's sources against the wire format, the soft switch and the P4Info.

p4c and bmv2 are not needed: the .p4 files and p4/ina.p4info.txtpb are parsed here with
small regex and text-format parsers (p4runtime is not a dependency of the project). The
checks are functions that return a list of problems, so the tests below also feed them
broken text and expect them to complain.
"""

from __future__ import annotations

import ast
import re
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import load_script

from emulation.softswitch.pipeline import DropReason, Pipeline
from emulation.softswitch.sharing import STATS_CELLS
from hostlib.protocol import (
    FLAG_RESEND,
    HEADER,
    HEADER_SIZE,
    INA_UDP_PORT,
    LANE_BYTES,
    LANES_PER_PACKET,
    MAX_WORKERS,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_PSN_SEQ_SHIFT,
    ROCE_QP_REGISTERS,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    SLOT_MASK,
    SWITCH_DROPS,
    SWITCH_SLOTS,
    SWITCH_STATS,
    PacketType,
    RoceOpcode,
    packet_size,
)

P4_DIR = Path(__file__).resolve().parents[2] / "p4"
P4INFO = P4_DIR / "ina.p4info.txtpb"

# P4Runtime resource-type prefix (top byte of an id) per P4Info section.
PREFIX = {"table": 0x02, "action": 0x01, "counter": 0x12, "register": 0x16}
SECTION = {"table": "tables", "action": "actions", "counter": "counters", "register": "registers"}

# The INA header as hostlib.protocol.HEADER lays it out, split into bit fields.
INA_FIELDS = [
    ("version", 4),
    ("ptype", 4),
    ("flags", 8),
    ("job_id", 16),
    ("rank", 8),
    ("exponent", 8),
    ("num_lanes", 16),
    ("pool_set", 1),
    ("slot", 15),
    ("reserved", 16),
    ("seq", 32),
]

STANDARD_METADATA_WIDTHS = {"ingress_port": 9, "egress_port": 9, "egress_rid": 16}


# ---------------------------------------------------------------------------- P4 parsing


def strip_comments(text: str) -> str:
    """Remove /* */ and // comments, keeping line breaks (no P4 string holds either)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def p4_sources() -> dict[str, str]:
    """Every p4/*.p4 file, comments stripped, by file name."""
    return {p.name: strip_comments(p.read_text()) for p in sorted(P4_DIR.glob("*.p4"))}


@dataclass
class Decl:
    """A table, action, register or counter declaration and its annotations."""

    kind: str
    ident: str
    file: str
    annotations: dict[str, str]
    args: str = ""  # constructor arguments, action parameters or table body
    type_args: str = ""  # register<...>


_ANNOS = r"(?P<annos>(?:@\w+\s*(?:\([^()]*\))?\s*)*)"
_DECL_RES = {
    "table": re.compile(_ANNOS + r"\btable\s+(?P<ident>\w+)\s*\{"),
    "action": re.compile(_ANNOS + r"\baction\s+(?P<ident>\w+)\s*\((?P<args>[^()]*)\)"),
    "register": re.compile(
        _ANNOS
        + r"\bregister\s*<(?P<type_args>[^;()]*)>\s*\((?P<args>[^()]*)\)\s*(?P<ident>\w+)\s*;"
    ),
    "counter": re.compile(_ANNOS + r"\bcounter\s*\((?P<args>[^()]*)\)\s*(?P<ident>\w+)\s*;"),
}
_ANNO_RE = re.compile(r"@(\w+)\s*(?:\(([^()]*)\))?")


def _block(text: str, start: int) -> str:
    """The text between the brace at or after ``start`` and its matching brace."""
    open_at = text.index("{", start)
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1 : i]
    raise ValueError(f"unbalanced braces after offset {start}")


def declarations(sources: dict[str, str]) -> list[Decl]:
    """Every table, action, register and counter declared in ``sources``."""
    found = []
    for file, text in sources.items():
        for kind, regex in _DECL_RES.items():
            for m in regex.finditer(text):
                annotations = {
                    a.group(1): (a.group(2) or "") for a in _ANNO_RE.finditer(m["annos"])
                }
                groups = m.groupdict()
                args = groups.get("args") or ""
                if kind == "table":
                    args = _block(text, m.end() - 1)
                found.append(
                    Decl(kind, m["ident"], file, annotations, args, groups.get("type_args") or "")
                )
    return found


def annotated_name(decl: Decl) -> str:
    """The control-plane name of ``decl``: its @name without the leading dot."""
    return decl.annotations.get("name", "").strip().strip('"').removeprefix(".")


def annotation_problems(decls: list[Decl]) -> list[str]:
    """Declarations without @id/@name, with a relative @name, or a name not ending in
    the declared identifier."""
    problems = []
    for d in decls:
        where = f"{d.file}: {d.kind} {d.ident}"
        if "id" not in d.annotations or "name" not in d.annotations:
            problems.append(f"{where} lacks @id or @name")
            continue
        raw = d.annotations["name"].strip().strip('"')
        if not raw.startswith("."):
            problems.append(f"{where}: @name({raw!r}) is not absolute (leading '.')")
        if raw.rsplit(".", 1)[-1] != d.ident:
            problems.append(f"{where}: @name({raw!r}) does not end in {d.ident!r}")
    return problems


_CONST_RE = re.compile(r"\bconst\s+(?:bit|int)<(\d+)>\s+(\w+)\s*=\s*([^;]+);")
_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitAnd: lambda a, b: a & b,
}


def evaluate(expr: str, env: dict[str, int]) -> int:
    """Evaluate a constant P4 expression of integers, names in ``env`` and + - * << >> | &.

    Raises:
        ValueError: anything else (a cast, a width-prefixed literal, an unknown name).
    """

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"cannot evaluate {ast.unparse(node)!r} in {expr!r}")

    return walk(ast.parse(expr.strip(), mode="eval").body)


def constants(sources: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Every ``const bit<W> NAME = EXPR;`` in ``sources``: NAME -> (width, value).

    Raises:
        ValueError: an expression :func:`evaluate` cannot handle, or a value that does not
            fit its width.
    """
    values: dict[str, int] = {}
    result = {}
    for text in sources.values():
        for m in _CONST_RE.finditer(text):
            width, name = int(m.group(1)), m.group(2)
            value = evaluate(m.group(3), values)
            if not 0 <= value < 2**width:
                raise ValueError(f"{name} = {value} does not fit bit<{width}>")
            values[name] = value
            result[name] = (width, value)
    return result


def header_fields(sources: dict[str, str], header: str) -> list[tuple[str, int]]:
    """``(name, width)`` of each field of ``header`` (bit<W> or a bit<W> typedef).

    Raises:
        ValueError: no such header, or a field of another type.
    """
    typedefs = typedef_widths(sources)
    for text in sources.values():
        m = re.search(rf"\bheader\s+{header}\s*\{{", text)
        if m is None:
            continue
        fields = []
        for line in _block(text, m.end() - 1).split(";"):
            if not line.strip():
                continue
            ftype, fname = line.split()
            fields.append((fname, type_width(ftype, typedefs)))
        return fields
    raise ValueError(f"no header {header}")


def typedef_widths(sources: dict[str, str]) -> dict[str, int]:
    """``typedef bit<W> name;`` -> {name: W}."""
    return {
        m.group(2): int(m.group(1))
        for text in sources.values()
        for m in re.finditer(r"\btypedef\s+bit<(\d+)>\s+(\w+)\s*;", text)
    }


def type_width(ftype: str, typedefs: dict[str, int]) -> int:
    """Width of ``bit<W>`` or of a typedef of it.

    Raises:
        ValueError: another type.
    """
    m = re.fullmatch(r"bit<(\d+)>", ftype.strip())
    if m:
        return int(m.group(1))
    if ftype.strip() in typedefs:
        return typedefs[ftype.strip()]
    raise ValueError(f"unknown type {ftype!r}")


# ---------------------------------------------------------------------------- P4Info parsing

Message = list[tuple[str, Any]]

_TOKEN_RE = re.compile(r'\s+|#[^\n]*|(?P<tok>"(?:[^"\\]|\\.)*"|[{}:]|[^\s{}:"#]+)')


def _tokens(text: str) -> Iterator[str]:
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read text format at offset {pos}: {text[pos : pos + 20]!r}")
        pos = m.end()
        if m["tok"] is not None:
            yield m["tok"]


def parse_text_format(text: str) -> Message:
    """Parse protobuf text format into nested ``[(field, value)]`` lists.

    Scalars stay strings (quotes removed from string literals); messages are lists.

    Raises:
        ValueError: unbalanced braces or a field without a value.
    """
    tokens = list(_tokens(text))
    pos = 0

    def message(closing: bool) -> Message:
        nonlocal pos
        out: Message = []
        while pos < len(tokens):
            tok = tokens[pos]
            if tok == "}":
                if not closing:
                    raise ValueError("unexpected '}'")
                pos += 1
                return out
            name = tok
            pos += 1
            if pos < len(tokens) and tokens[pos] == ":":
                pos += 1
            if pos >= len(tokens):
                raise ValueError(f"field {name} has no value")
            if tokens[pos] == "{":
                pos += 1
                out.append((name, message(True)))
            else:
                value = tokens[pos]
                out.append((name, value[1:-1] if value.startswith('"') else value))
                pos += 1
        if closing:
            raise ValueError("missing '}'")
        return out

    return message(False)


def get(msg: Message, name: str) -> Any:
    """The single value of field ``name`` in ``msg``, or None."""
    values = get_all(msg, name)
    return values[0] if values else None


def get_all(msg: Message, name: str) -> list[Any]:
    return [v for k, v in msg if k == name]


def p4info_entities(info: Message) -> dict[str, list[Message]]:
    """P4Info sections by declaration kind (table, action, counter, register)."""
    return {kind: get_all(info, section) for kind, section in SECTION.items()}


def id_problems(decls: list[Decl], info: Message) -> list[str]:
    """Differences of (name, id) per kind between the sources and the P4Info; duplicate
    ids; ids without their kind's prefix."""
    problems = []
    all_ids: list[int] = []
    entities = p4info_entities(info)
    for kind, prefix in PREFIX.items():
        in_p4 = {
            (annotated_name(d), int(d.annotations["id"], 0))
            for d in decls
            if d.kind == kind and "id" in d.annotations  # else annotation_problems says so
        }
        in_info = {
            (get(get(e, "preamble"), "name"), int(get(get(e, "preamble"), "id"), 0))
            for e in entities[kind]
        }
        problems += [f"{kind} {n} {i:#010x} only in the .p4 sources" for n, i in in_p4 - in_info]
        problems += [f"{kind} {n} {i:#010x} only in the P4Info" for n, i in in_info - in_p4]
        for name, ident in in_p4 | in_info:
            if ident >> 24 != prefix:
                problems.append(f"{kind} {name}: id {ident:#010x} lacks prefix {prefix:#04x}")
        all_ids += [i for _, i in in_p4]
    duplicates = {i for i in all_ids if all_ids.count(i) > 1}
    problems += [f"id {i:#010x} declared more than once" for i in sorted(duplicates)]
    return problems


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return p4_sources()


@pytest.fixture(scope="module")
def decls(sources: dict[str, str]) -> list[Decl]:
    return declarations(sources)


@pytest.fixture(scope="module")
def info() -> Message:
    return parse_text_format(P4INFO.read_text())


@pytest.fixture(scope="module")
def consts(sources: dict[str, str]) -> dict[str, tuple[int, int]]:
    return constants(sources)


def const(consts: dict[str, tuple[int, int]], name: str) -> int:
    return consts[name][1]


def load_gen_lanes() -> ModuleType:
    """Import p4/gen_lanes.py by path (p4/ is not a package)."""
    return load_script(P4_DIR / "gen_lanes.py", "gen_lanes")


# ---------------------------------------------------------------------------- (1) annotations


def test_every_object_is_declared_somewhere(decls: list[Decl]) -> None:
    kinds = {d.kind for d in decls}
    assert kinds == set(PREFIX), kinds
    assert sum(d.kind == "register" and d.file == "values.p4" for d in decls) == LANES_PER_PACKET


def test_every_declaration_has_id_and_absolute_name(decls: list[Decl]) -> None:
    assert annotation_problems(decls) == []


def test_annotation_check_finds_a_missing_id() -> None:
    text = '@name(".Ingress.t.a") action a() { }\n@id(0x02000001) table t { key = { } }\n'
    problems = annotation_problems(declarations({"x.p4": text}))
    assert sorted(problems) == [
        "x.p4: action a lacks @id or @name",
        "x.p4: table t lacks @id or @name",
    ]


def test_annotation_check_finds_relative_and_mismatched_names() -> None:
    text = '@id(0x16000001) @name("r") register<bit<32>>(4) r;\n'
    text += '@id(0x12000001) @name(".Ingress.other") counter(2, CounterType.packets) c;\n'
    problems = annotation_problems(declarations({"x.p4": text}))
    assert any("not absolute" in p for p in problems)
    assert any("does not end in 'c'" in p for p in problems)


# ---------------------------------------------------------------------------- (2) P4Info


def test_p4info_names_and_ids_match_the_sources(decls: list[Decl], info: Message) -> None:
    assert id_problems(decls, info) == []


def test_p4info_arch_is_v1model(info: Message) -> None:
    assert get(get(info, "pkg_info"), "arch") == "v1model"


def test_p4info_check_finds_a_changed_id(decls: list[Decl]) -> None:
    text = P4INFO.read_text()
    changed = text.replace("id: 33751041", "id: 33751042", 1)  # Ingress.jobs.jobs
    assert changed != text
    problems = id_problems(decls, parse_text_format(changed))
    assert any("Ingress.jobs.jobs" in p and "only in the .p4" in p for p in problems)


def test_p4info_check_finds_a_wrong_prefix_and_duplicates() -> None:
    text = (
        '@id(0x01000001) @name(".C.t") table t { }\n@id(0x01000001) @name(".C.a") action a() { }\n'
    )
    info = parse_text_format(
        'tables { preamble { id: 0x01000001 name: "C.t" } }\n'
        'actions { preamble { id: 0x01000001 name: "C.a" } }\n'
    )
    problems = id_problems(declarations({"x.p4": text}), info)
    assert any("lacks prefix 0x02" in p for p in problems)
    assert any("declared more than once" in p for p in problems)


def _by_name(info: Message, kind: str) -> dict[str, Message]:
    return {get(get(e, "preamble"), "name"): e for e in p4info_entities(info)[kind]}


def test_p4info_aliases_are_unique(info: Message) -> None:
    aliases = [
        get(get(e, "preamble"), "alias") for es in p4info_entities(info).values() for e in es
    ]
    assert None not in aliases
    assert len(aliases) == len(set(aliases))


def test_p4info_action_params_match_the_sources(
    sources: dict[str, str], decls: list[Decl], info: Message
) -> None:
    typedefs = typedef_widths(sources)
    actions = _by_name(info, "action")
    for d in (d for d in decls if d.kind == "action"):
        declared = [
            (p.split()[-1], type_width(" ".join(p.split()[:-1]), typedefs))
            for p in d.args.split(",")
            if p.strip()
        ]
        params = get_all(actions[annotated_name(d)], "params")
        in_info = [(get(p, "name"), int(get(p, "bitwidth"))) for p in params]
        assert [int(get(p, "id")) for p in params] == list(range(1, len(params) + 1))
        assert in_info == declared, d.ident


def _field_width(expr: str, sources: dict[str, str]) -> int:
    """Width of a key expression: hdr.<header>.<field>, meta.<field> (a ``bit<N>`` of
    types.p4's metadata_t) or standard_metadata.<field>."""
    parts = expr.split(".")
    if parts[0] == "standard_metadata":
        return STANDARD_METADATA_WIDTHS[parts[1]]
    if parts[0] == "meta":
        struct = _block(sources["types.p4"], sources["types.p4"].index("struct metadata_t"))
        return dict((n, int(w)) for w, n in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", struct))[
            parts[1]
        ]
    members = dict(
        (name, htype)
        for htype, name in re.findall(
            r"(\w+)\s+(\w+)\s*;",
            _block(sources["headers.p4"], sources["headers.p4"].index("struct headers_t")),
        )
    )
    return dict(header_fields(sources, members[parts[1]]))[parts[2]]


def test_p4info_tables_match_the_sources(
    sources: dict[str, str],
    decls: list[Decl],
    info: Message,
    consts: dict[str, tuple[int, int]],
) -> None:
    tables = _by_name(info, "table")
    action_ids = {
        annotated_name(d): int(d.annotations["id"], 0) for d in decls if d.kind == "action"
    }
    local_actions = {d.ident: annotated_name(d) for d in decls if d.kind == "action"}
    for d in (d for d in decls if d.kind == "table"):
        table = tables[annotated_name(d)]
        keys = re.findall(
            r'([\w.]+)\s*:\s*(\w+)\s*@name\("(\w+)"\)\s*;', _block(d.args, d.args.index("key"))
        )
        fields = get_all(table, "match_fields")
        assert [
            (get(f, "name"), int(get(f, "bitwidth")), get(f, "match_type")) for f in fields
        ] == [(name, _field_width(expr, sources), kind.upper()) for expr, kind, name in keys], (
            d.ident
        )
        assert [int(get(f, "id")) for f in fields] == list(range(1, len(fields) + 1))
        listed = re.findall(r"(@defaultonly\s+)?(\w+)\s*;", _block(d.args, d.args.index("actions")))
        refs = get_all(table, "action_refs")
        assert [int(get(r, "id"), 0) for r in refs] == [
            action_ids[local_actions[a]] for _, a in listed
        ], d.ident
        assert [get(r, "scope") == "DEFAULT_ONLY" for r in refs] == [bool(o) for o, _ in listed]
        const_default = re.search(r"const\s+default_action\s*=\s*(\w+)", d.args)
        expected = action_ids[local_actions[const_default.group(1)]] if const_default else None
        found = get(table, "const_default_action_id")
        assert (int(found, 0) if found else None) == expected, d.ident
        size = re.search(r"\bsize\s*=\s*(\w+)\s*;", d.args)
        assert size is not None, d.ident
        assert int(get(table, "size")) == const(consts, size.group(1)), d.ident


def test_p4info_registers_and_counters_match_the_sources(
    sources: dict[str, str],
    decls: list[Decl],
    info: Message,
    consts: dict[str, tuple[int, int]],
) -> None:
    typedefs = typedef_widths(sources)
    registers = _by_name(info, "register")
    counters = _by_name(info, "counter")
    env = {k: v for k, (_, v) in consts.items()}
    for d in decls:
        if d.kind == "register":
            entry = registers[annotated_name(d)]
            width = get(get(get(get(entry, "type_spec"), "bitstring"), "bit"), "bitwidth")
            assert int(width) == type_width(d.type_args, typedefs), d.ident
            assert int(get(entry, "size")) == evaluate(d.args, env), d.ident
        elif d.kind == "counter":
            size, counter_type = (a.strip() for a in d.args.split(","))
            entry = counters[annotated_name(d)]
            assert counter_type == "CounterType.packets"
            assert get(get(entry, "spec"), "unit") == "PACKETS"
            assert int(get(entry, "size")) == evaluate(size, env), d.ident


def test_text_format_parser_rejects_broken_text() -> None:
    with pytest.raises(ValueError):
        parse_text_format("tables { preamble { id: 1 }")
    with pytest.raises(ValueError):
        parse_text_format("tables { } }")
    assert parse_text_format('a { b: "x y" # c\n c: 0x10 }') == [
        ("a", [("b", "x y"), ("c", "0x10")])
    ]


# ---------------------------------------------------------------------------- (3) constants


def test_protocol_constants_match_hostlib(consts: dict[str, tuple[int, int]]) -> None:
    expected = {
        "INA_UDP_PORT": INA_UDP_PORT,
        "LANES_PER_PACKET": LANES_PER_PACKET,
        "LANE_BYTES": LANE_BYTES,
        "SWITCH_SLOTS": SWITCH_SLOTS,
        "MAX_WORKERS": MAX_WORKERS,
        "PROTOCOL_VERSION": PROTOCOL_VERSION,
        "HEADER_SIZE": HEADER_SIZE,
        "PTYPE_DATA": PacketType.DATA,
        "PTYPE_RESULT": PacketType.RESULT,
        "INA_PAYLOAD_BYTES": packet_size(LANES_PER_PACKET),
        "REGISTER_SIZE": 2 * SWITCH_SLOTS,
        "BITMAP_SIZE": SWITCH_SLOTS,
        "SEQ_OLDER_BIT": 1 << 31,
        "ROCE_UDP_PORT": ROCE_UDP_PORT,
        "ROCE_QP_REGISTERS": ROCE_QP_REGISTERS,
        "ROCE_PSN_SEQ_SHIFT": ROCE_PSN_SEQ_SHIFT,
        "ROCE_BTH_BYTES": ROCE_BTH_SIZE,
        "ROCE_RETH_BYTES": ROCE_RETH_SIZE,
        "ROCE_IMMDT_BYTES": ROCE_IMMDT_SIZE,
        "ROCE_ICRC_BYTES": ROCE_ICRC_SIZE,
        "ROCE_PAYLOAD_BYTES": LANES_PER_PACKET * LANE_BYTES,
        "FLAG_RESEND": FLAG_RESEND,
        "SHARING_STATS_SIZE": STATS_CELLS,
        **{f"ROCE_WRITE_{op.name[len('UC_WRITE_'):]}": int(op) for op in RoceOpcode},
    }
    assert {name: const(consts, name) for name in expected} == expected


def test_bitmap_is_wide_enough_for_max_workers(sources: dict[str, str]) -> None:
    widths = re.findall(r"register<bit<(\d+)>>\(BITMAP_SIZE\)", sources["bitmap.p4"])
    assert widths == [str(MAX_WORKERS)] * 2


def test_ina_header_is_the_wire_layout(sources: dict[str, str]) -> None:
    fields = header_fields(sources, "ina_h")
    assert fields == INA_FIELDS
    assert sum(w for _, w in fields) == 8 * HEADER_SIZE
    # The bit fields partition hostlib's struct items in order; only exponent is signed.
    items = HEADER.format.lstrip("!")
    item_of = {}
    names = iter(fields)
    for item in items:
        total = 0
        while total < 8 * struct.calcsize("!" + item):
            name, width = next(names)
            item_of[name] = item
            total += width
        assert total == 8 * struct.calcsize("!" + item)
    assert [n for n, item in item_of.items() if item.islower()] == ["exponent"]
    # pool_index: one set bit on top of a 15-bit slot.
    assert dict(fields)["pool_set"] == 1 and POOL_SET_BIT == 1 << 15
    assert dict(fields)["slot"] == SLOT_MASK.bit_length()


def test_exponent_max_is_signed(sources: dict[str, str]) -> None:
    assert "(int<8>)stored > (int<8>)hdr.ina.exponent" in sources["exponents.p4"]


def test_data_header_has_one_bit32_field_per_lane(sources: dict[str, str]) -> None:
    fields = header_fields(sources, "ina_data_h")
    assert fields == [(f"lane_{i:02d}", 8 * LANE_BYTES) for i in range(LANES_PER_PACKET)]


def _ordered(consts: dict[str, tuple[int, int]], prefix: str) -> list[str]:
    named = [(v, k) for k, (_, v) in consts.items() if k.startswith(prefix)]
    return [k.removeprefix(prefix).lower() for _, k in sorted(named)]


def test_drop_reasons_are_in_pipeline_order(consts: dict[str, tuple[int, int]]) -> None:
    assert _ordered(consts, "DROP_") == [r.value for r in DropReason] == list(SWITCH_DROPS)
    assert const(consts, "NUM_DROP_REASONS") == len(DropReason)
    assert sorted(v for k, (_, v) in consts.items() if k.startswith("DROP_")) == list(
        range(len(DropReason))
    )


def test_stats_are_the_soft_switch_statistics(consts: dict[str, tuple[int, int]]) -> None:
    stats = [k for k in Pipeline(lanes=1, slots=1).counters() if not k.startswith("drop_")]
    assert _ordered(consts, "STAT_") == stats == list(SWITCH_STATS)
    assert const(consts, "NUM_STATS") == len(stats)


def test_constants_reject_what_they_cannot_read() -> None:
    with pytest.raises(ValueError):
        constants({"x.p4": "const bit<4> TOO_BIG = 16;"})
    with pytest.raises(ValueError):
        constants({"x.p4": "const bit<32> UNKNOWN = OTHER + 1;"})


# ---------------------------------------------------------------------------- (4) generated


def test_generated_lane_files_are_up_to_date() -> None:
    gen_lanes = load_gen_lanes()
    assert gen_lanes.stale() == []
    assert gen_lanes.main(["--check"]) == 0
    assert gen_lanes.lane_count() == LANES_PER_PACKET


def test_gen_lanes_check_notices_an_edit(tmp_path: Path) -> None:
    gen_lanes = load_gen_lanes()
    for name in ("configuration.p4", "values.p4", "data_header.p4"):
        shutil.copy(P4_DIR / name, tmp_path / name)
    assert gen_lanes.stale(tmp_path) == []
    values = tmp_path / "values.p4"
    values.write_text(values.read_text().replace("sum + hdr", "sum - hdr", 1))
    assert gen_lanes.stale(tmp_path) == [values]
    config = tmp_path / "configuration.p4"
    config.write_text(config.read_text().replace("LANES_PER_PACKET = 64", "LANES_PER_PACKET = 32"))
    assert sorted(gen_lanes.stale(tmp_path)) == sorted([values, tmp_path / "data_header.p4"])


# ---------------------------------------------------------------------------- (5) constructs


def forbidden_constructs(sources: dict[str, str]) -> list[str]:
    """``for`` loops and indexing by anything but an integer literal or a bit slice."""
    problems = []
    for file, text in sources.items():
        if re.search(r"\bfor\s*\(", text):
            problems.append(f"{file}: for loop")
        for m in re.finditer(r"\[([^\[\]]*)\]", text):
            index = m.group(1).strip()
            if ":" not in index and not re.fullmatch(r"\d+", index):
                problems.append(f"{file}: index [{index}]")
    return problems


def test_no_loops_or_variable_indexing(sources: dict[str, str]) -> None:
    assert forbidden_constructs(sources) == []


def test_construct_check_finds_loops_and_variable_indices() -> None:
    text = "apply { for (bit<8> i = 0; i < 4; i = i + 1) { } hdr.s[meta.i].f = 1; x = y[7:0]; }"
    assert forbidden_constructs({"x.p4": text}) == ["x.p4: for loop", "x.p4: index [meta.i]"]


def test_every_source_is_included_from_ina_p4(sources: dict[str, str]) -> None:
    reached: set[str] = set()
    todo = ["ina.p4"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += re.findall(r'#include\s+"([\w.]+)"', sources[name])
    assert reached == set(sources)


# ---------------------------------------------------------------------------- (6) layout

# The id group (0xPPGGNNNN: GG) of each file, as p4/README.md and the P4Info header list
# them; ina.p4 has one per pipeline control.
ID_GROUPS = {
    "jobs.p4": 0x03,
    "workers.p4": 0x04,
    "bitmap.p4": 0x05,
    "exponents.p4": 0x06,
    "values.p4": 0x07,
    "drop_simulator.p4": 0x08,
    "forwarder.p4": 0x09,
    "replicas.p4": 0x0A,
    "upstream.p4": 0x0B,
    "roce.p4": 0x0C,
    "roce_replies.p4": 0x0D,
    "sharing.p4": 0x10,
}

# Files that hold two controls (or a parser and a control) because they are a pair.
PAIRS = {"ina.p4", "parsers.p4", "checksums.p4", "drop_simulator.p4"}


def group_problems(decls: list[Decl]) -> list[str]:
    """Declarations whose id's group byte is not their file's."""
    problems = []
    for d in decls:
        if "id" not in d.annotations:
            continue  # annotation_problems reports it
        ident = int(d.annotations["id"], 0)
        if d.file == "ina.p4":
            want = 0x01 if annotated_name(d).startswith("Ingress.") else 0x02
        else:
            want = ID_GROUPS.get(d.file, -1)
        if (ident >> 16) & 0xFF != want:
            problems.append(f"{d.file}: {d.kind} {d.ident} id {ident:#010x} not in group {want}")
    return problems


def test_ids_are_grouped_by_file(decls: list[Decl]) -> None:
    assert group_problems(decls) == []
    assert {d.file for d in decls} - {"ina.p4"} <= set(ID_GROUPS)


def test_group_check_finds_an_id_in_another_files_group() -> None:
    text = '@id(0x02030001) @name(".Ingress.upstream.upstream") table upstream { }\n'
    assert group_problems(declarations({"upstream.p4": text})) == [
        "upstream.p4: table upstream id 0x02030001 not in group 11"
    ]


def test_one_control_per_file_except_pairs(sources: dict[str, str]) -> None:
    for file, text in sources.items():
        blocks = re.findall(r"^\s*(?:control|parser)\s+(\w+)\s*\(", text, flags=re.M)
        assert len(blocks) <= (2 if file in PAIRS else 1), (file, blocks)


# v1model.p4 declares these as the pipeline's parser and control types: a program's own
# control of the same name is a duplicate declaration to p4c (--Werror=duplicate).
V1MODEL_TYPES = frozenset(
    ["Parser", "VerifyChecksum", "Ingress", "Egress", "ComputeChecksum", "Deparser", "V1Switch"]
)


def type_name_problems(sources: dict[str, str]) -> list[str]:
    """Parsers and controls named like one of v1model.p4's own types."""
    return [
        f"{file}: {kind} {name} has the name of v1model's {name}"
        for file, text in sources.items()
        for kind, name in re.findall(r"^\s*(control|parser)\s+(\w+)\s*\(", text, flags=re.M)
        if name in V1MODEL_TYPES
    ]


def test_no_control_takes_a_v1model_type_name(sources: dict[str, str]) -> None:
    assert type_name_problems(sources) == []
    clash = {"x.p4": "control Deparser(packet_out p, in headers_t h) { apply { } }\n"}
    want = "x.p4: control Deparser has the name of v1model's Deparser"
    assert type_name_problems(clash) == [want]


def _counted(sources: dict[str, str], control: str, counter: str) -> set[str]:
    """Constant indices ``control`` counts in ``counter`` (``ina_stats.count(STAT_X)``)."""
    text = sources["ina.p4"]
    start = re.search(rf"\bcontrol\s+{control}\s*\(", text)
    assert start is not None, control
    body = _block(text, start.end())
    return set(re.findall(rf"\b{counter}\.count\((\w+)\)", body))


def test_ingress_and_egress_count_what_the_soft_switch_server_says() -> None:
    from emulation.softswitch import p4runtime

    sources = p4_sources()
    egress = {s.removeprefix("STAT_").lower() for s in _counted(sources, "InaEgress", "ina_stats")}
    ingress = {
        s.removeprefix("STAT_").lower() for s in _counted(sources, "InaIngress", "ina_stats")
    }
    assert egress == p4runtime._EGRESS_STATS == {"results_sent", "sent_upstream"}
    assert ingress == set(SWITCH_STATS) - egress
    assert _counted(sources, "InaEgress", "drops") == {"DROP_SIM_EGRESS"}


def test_the_upstream_table_and_final_register(sources: dict[str, str], info: Message) -> None:
    upstream = _by_name(info, "table")["Ingress.upstream.upstream"]
    assert [get(f, "name") for f in get_all(upstream, "match_fields")] == ["job_id"]
    params = get_all(_by_name(info, "action")["Ingress.upstream.set_upstream"], "params")
    assert [(get(p, "name"), int(get(p, "bitwidth"))) for p in params] == [
        ("rank", 8),
        ("dst_ip", 32),
        ("dst_port", 16),
        ("dst_mac", 48),
        ("egress_port", 9),
    ]
    # The destination parameters mean what the replicas' do.
    replica = get_all(_by_name(info, "action")["Egress.replicas.set_destination"], "params")
    widths = {get(p, "name"): get(p, "bitwidth") for p in replica}
    assert all(
        widths[get(p, "name")] == get(p, "bitwidth") for p in params if get(p, "name") in widths
    )
    # final: cleared by a use's first contribution, set by the upstream's result.
    ina = sources["ina.p4"]
    assert "final.write(meta.index, 0);" in ina and "final.write(meta.index, 1);" in ina
    assert "final.read(meta.is_final, meta.index);" in ina


def test_softswitch_p4info_sizes_every_per_slot_register(decls: list[Decl]) -> None:
    from controller.p4info import P4Info
    from emulation.softswitch.p4runtime import softswitch_p4info

    sized = softswitch_p4info(P4Info.load(), 2, 8)
    for d in decls:
        if d.kind == "register" and d.file != "values.p4":
            want = {"REGISTER_SIZE": 16, "BITMAP_SIZE": 8}.get(d.args.strip())
            if want is not None:
                assert sized.register(annotated_name(d)).size == want, d.ident
