"""Topology files, loaded and validated into :class:`~emulation.topology.model.Topology`.

A :class:`Topology` says what a network is, never how it runs: it imports neither
Mininet nor a switch, so it is built and checked without root, and the emulator (and
later ``dynamiccl``) read the same object. Files are YAML in inalab's schema
(``topologies/README.md``) or p4lang/tutorials' ``topology.json``; both load through
:func:`load_topology`, and every error names the file and the place in it.

Conventions, so a file can stay short:

- a switch's ports are numbered 1, 2, ... in the order its links are listed, unless a
  link names the port (``s1-p3`` in tutorials files, ``ports: [1, 3]`` in ours);
- a host without ``ip`` gets 10.0.0.N/24 and without ``mac`` 00:00:00:00:HH:LL (N in
  hex), N its position among the hosts (from 1);
- a link's ``bw`` is in Mbit/s, ``delay`` and ``jitter`` in ms (a number, or text such
  as ``"250us"`` or ``"2ms"``), ``loss``, ``dup`` and ``reorder`` a probability per
  packet; ``defaults`` give values to links that do not set them.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from emulation.argtypes import parse_delay_ms
from emulation.topology.model import (
    SWITCH_DATAPATHS,
    SWITCH_KINDS,
    SWITCH_ROLES,
    Host,
    Link,
    Switch,
    Topology,
    TopologyError,
    TopologyJob,
)
from hostlib.protocol import MAX_WORKERS

__all__ = ["load_topology", "parse_topology"]

_PORT = re.compile(r"^(?P<node>.+)-p(?P<port>[0-9]+)$")


def load_topology(path: str | Path) -> Topology:
    """Read a topology file: YAML in inalab's schema, or tutorials-style JSON.

    A ``.json`` file with a ``links`` list of lists is read as p4lang/tutorials'
    ``topology.json``; anything else as inalab's schema (YAML is a superset of JSON).
    Every error is one line that starts ``FILE:LINE:COLUMN:`` where the place is known
    (a syntax error, or a value of a YAML file that the schema refuses), else ``FILE:``.

    Raises:
        TopologyError: the file cannot be read or parsed, or describes no valid network.
    """
    import yaml

    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise TopologyError(f"cannot read topology {file}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Everything before the bad byte decoded: count lines and columns in characters.
        before = data[: exc.start].decode("utf-8")
        line, column = _line_column(before, len(before))
        raise TopologyError(
            f"{file}:{line}:{column}: not UTF-8 text (byte {data[exc.start]:#04x})"
        ) from None
    try:
        doc = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{file}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(_yaml_syntax_error(file, text, exc)) from None
    if _is_tutorials(doc):
        return parse_topology(_from_tutorials(doc, file), name=file.stem, source=str(file))
    try:
        return parse_topology(doc, name=file.stem, source=str(file))
    except TopologyError as exc:
        if file.suffix == ".json":
            raise  # json keeps no places; the message has the path in the document
        raise TopologyError(_placed(exc, file, text), exc.path) from None


def _line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of ``offset`` in ``text``."""
    before = text[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _yaml_syntax_error(file: Path, text: str, exc: Exception) -> str:
    """PyYAML's several-line report as one ``FILE:LINE:COLUMN: not YAML: ...`` line: the
    problem where it was found, and what the parser was reading, where that started."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"{mark.line + 1}:{mark.column + 1}"
        problem = exc.problem or "syntax error"
        started = exc.context_mark
        if exc.context and started is not None and started.line != mark.line:
            problem += f" ({exc.context} that starts at {started.line + 1}:{started.column + 1})"
        elif exc.context:
            problem += f" ({exc.context})"
        return f"{file}:{where}: not YAML: {problem}"
    if isinstance(exc, yaml.reader.ReaderError):
        line, column = _line_column(text, exc.position)
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        what = f"unacceptable character #x{char:04x}: {exc.reason}"
        return f"{file}:{line}:{column}: not YAML: {what}"
    return f"{file}: not YAML: {' '.join(str(exc).split())}"


def _placed(exc: TopologyError, file: Path, text: str) -> str:
    """``exc``'s message with the line and column of its place in ``text`` (the YAML
    node at ``exc.path``, or the deepest one of it the file has) after the file name."""
    import yaml

    message = str(exc)
    prefix = f"{file}: "
    if not exc.path or not message.startswith(prefix):
        return message  # the document as a whole: no one place to show
    node = yaml.compose(text)  # the same text parsed before: no error here
    for part in exc.path:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode):
            index = {"a": 0, "b": 1}.get(str(part), part)  # a link written [a, b]
            if isinstance(index, int) and index < len(node.value):
                child = node.value[index]
        if child is None:
            break
        node = child
    if node is None:
        return message
    mark = node.start_mark
    return f"{file}:{mark.line + 1}:{mark.column + 1}: {message[len(prefix) :]}"


def _is_tutorials(doc: Any) -> bool:
    links = doc.get("links") if isinstance(doc, dict) else None
    return (
        isinstance(links, list)
        and all(isinstance(item, list) for item in links)
        and (isinstance(doc.get("hosts"), dict) and "jobs" not in doc and "defaults" not in doc)
        and any(isinstance(e, str) and _PORT.match(e) for item in links for e in item[:2])
    )


def _from_tutorials(doc: dict[str, Any], file: Path) -> dict[str, Any]:
    """p4lang/tutorials' topology.json as inalab's schema: hosts with ip and mac,
    switches (bmv2, forwarding: tutorials programs are not INA), links ``[a, b,
    delay?, bw?]`` with ``sN-pK`` naming a switch port."""
    links = []
    for i, item in enumerate(doc["links"]):
        if len(item) < 2:
            raise TopologyError(f"{file}: links[{i}]: needs two endpoints")
        entry: dict[str, Any] = {"a": item[0], "b": item[1]}
        if len(item) > 2 and str(item[2]) not in ("", "0"):
            entry["delay"] = item[2]
        if len(item) > 3 and item[3] is not None:
            entry["bw"] = item[3]
        links.append(entry)
    hosts = {
        name: {k: v for k, v in spec.items() if k in ("ip", "mac")}
        for name, spec in doc["hosts"].items()
    }
    switches = {name: {"kind": "bmv2", "role": "forward"} for name in doc.get("switches", {})}
    return {"hosts": hosts, "switches": switches, "links": links}


# --------------------------------------------------------------------- validation


class _At:
    """Where in the document a value sits, for error messages."""

    def __init__(self, source: str, path: str = "", parts: tuple[str | int, ...] = ()) -> None:
        self.source, self.path, self.parts = source, path, parts

    def __truediv__(self, part: str | int) -> _At:
        step = f"[{part}]" if isinstance(part, int) else (f".{part}" if self.path else part)
        return _At(self.source, self.path + step, (*self.parts, part))

    def error(self, message: str) -> TopologyError:
        where = f"{self.source}: {self.path}" if self.path else self.source
        return TopologyError(f"{where}: {message}", self.parts)


def _mapping(value: Any, at: _At, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise at.error(f"expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(map(str, value)) - allowed)
    if unknown:
        raise at.error(
            f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )
    return {str(k): v for k, v in value.items()}


def _int(value: Any, at: _At, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise at.error(f"expected an integer {lo}..{hi}, got {value!r}")
    return value


def _number(
    value: Any, at: _At, lo: float, hi: float | None = None, *, open_hi: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise at.error(f"expected a number, got {value!r}")
    v = float(value)
    too_high = hi is not None and (v >= hi if open_hi else v > hi)
    if v < lo or too_high:
        bound = "" if hi is None else (f" and below {hi}" if open_hi else f" and at most {hi}")
        raise at.error(f"expected at least {lo}{bound}, got {value!r}")
    return v


def _delay(value: Any, at: _At) -> float:
    if isinstance(value, str):
        try:
            return parse_delay_ms(value)
        except ValueError:
            raise at.error(f"expected a delay such as 2ms or 250us, got {value!r}") from None
    return _number(value, at, 0.0)


def _name(value: Any, at: _At) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,9}", value):
        # Mininet makes interfaces <node>-eth<N>; Linux allows 15 characters.
        raise at.error(f"{value!r} is not a node name (a letter, then up to 9 letters, digits, _)")
    return value


_LINK_KEYS = {"a", "b", "ports", "bw", "delay", "loss", "queue", "jitter", "dup", "reorder"}
_LINK_VALUES = ("bw", "delay", "loss", "queue", "jitter", "dup", "reorder")


def parse_topology(doc: Any, name: str = "topology", source: str = "<topology>") -> Topology:
    """Validate a topology document (the YAML's data) and build the :class:`Topology`.

    Raises:
        TopologyError: the first problem found, with its place in the document.
    """
    at = _At(source)
    top = _mapping(doc, at, {"name", "defaults", "hosts", "switches", "links", "jobs"})
    name = str(top.get("name", name))
    defaults = _mapping(top.get("defaults"), at / "defaults", set(_LINK_VALUES))
    switches = _switches(top.get("switches"), at / "switches")
    hosts = _hosts(top.get("hosts"), at / "hosts")
    clash = sorted({s.name for s in switches} & {h.name for h in hosts})
    if clash:
        raise at.error(f"names used by a host and a switch: {', '.join(clash)}")
    kinds = {h.name: "host" for h in hosts} | {s.name: "switch" for s in switches}
    links = _links(top.get("links"), at / "links", kinds, defaults, at / "defaults")
    for h in hosts:
        count = sum(h.name in (link.a, link.b) for link in links)
        if count != 1:
            raise at.error(f"host {h.name} has {count} links; a host has exactly one")
    _fallbacks(switches, links, at / "switches")
    jobs = _jobs(top.get("jobs"), at / "jobs", hosts, switches)
    return Topology(name, tuple(hosts), tuple(switches), tuple(links), tuple(jobs))


def _switches(value: Any, at: _At) -> list[Switch]:
    if not value:
        raise at.error("a topology needs at least one switch")
    out = []
    for key, spec in _mapping(value, at, set(map(str, value))).items():
        where = at / key
        _name(key, where)
        s = _mapping(spec, where, {"kind", "role", "lanes", "datapath", "fallback"})
        kind, role = s.get("kind", "soft"), s.get("role", "aggregate")
        if kind not in SWITCH_KINDS:
            raise (where / "kind").error(f"{kind!r} is not one of {', '.join(SWITCH_KINDS)}")
        if role not in SWITCH_ROLES:
            raise (where / "role").error(f"{role!r} is not one of {', '.join(SWITCH_ROLES)}")
        if role == "fallback" and kind != "soft":
            raise (where / "kind").error(
                f"a fallback is inalab's soft switch on a server, not {kind}"
            )
        fallback = s.get("fallback")
        if fallback is not None:
            if role != "aggregate":
                raise (where / "fallback").error(
                    f"only an aggregate switch has a fallback, not a {role} switch"
                )
            if not isinstance(fallback, str):
                raise (where / "fallback").error(f"expected a switch name, got {fallback!r}")
        datapath = s.get("datapath", "auto")
        if datapath not in SWITCH_DATAPATHS:
            raise (where / "datapath").error(
                f"{datapath!r} is not one of {', '.join(SWITCH_DATAPATHS)}"
            )
        if kind != "soft" and "datapath" in s:
            raise (where / "datapath").error(f"only a soft switch has a datapath, not {kind}")
        lanes = _int(s.get("lanes", 64), where / "lanes", 1, 2048)
        out.append(Switch(key, kind, role, lanes, datapath, fallback))
    return out


def _fallbacks(switches: Sequence[Switch], links: Sequence[Link], at: _At) -> None:
    """Each ``fallback`` a switch names is a switch of role ``fallback`` with one link, to
    the switch naming it, and every fallback is named by one switch.

    Raises:
        TopologyError: the first that is not.
    """
    by_name = {s.name: s for s in switches}
    named: dict[str, str] = {}
    for s in switches:
        if s.fallback is None:
            continue
        where = at / s.name / "fallback"
        other = by_name.get(s.fallback)
        if other is None:
            raise where.error(f"{s.fallback!r} is not a switch (a fallback is a switch of "
                              "role fallback)")  # fmt: skip
        if other.role != "fallback":
            raise where.error(f"{s.fallback} has role {other.role}; a fallback has role fallback")
        if s.fallback in named:
            raise where.error(f"{s.fallback} is the fallback of {named[s.fallback]} already:"
                              " one switch a fallback")  # fmt: skip
        named[s.fallback] = s.name
    for f in switches:
        if f.role != "fallback":
            continue
        if f.name not in named:
            raise (at / f.name).error(f"fallback {f.name} is no switch's: name it on the"
                                      " aggregating switch it is linked to (fallback:"
                                      f" {f.name})")  # fmt: skip
        front = named[f.name]
        ends = [link.b if link.a == f.name else link.a for link in links
                if f.name in (link.a, link.b)]  # fmt: skip
        if ends != [front]:
            shown = ", ".join(ends) or "nothing"
            raise (at / f.name).error(f"fallback {f.name} is linked to {shown}; a fallback has"
                                      f" one link, to {front}, which names it")  # fmt: skip


def _hosts(value: Any, at: _At) -> list[Host]:
    if not value:
        raise at.error("a topology needs at least one host")
    out = []
    seen_ip: dict[str, str] = {}
    seen_mac: dict[str, str] = {}
    for n, (key, spec) in enumerate(_mapping(value, at, set(map(str, value))).items(), 1):
        where = at / key
        _name(key, where)
        h = _mapping(spec, where, {"ip", "mac", "ranks"})
        ip = str(h.get("ip", f"10.0.0.{n}/24"))
        try:
            iface = ipaddress.IPv4Interface(ip if "/" in ip else ip + "/24")
        except ValueError:
            raise (where / "ip").error(f"{ip!r} is not an IPv4 address") from None
        mac = str(h.get("mac", f"00:00:00:00:{n >> 8:02x}:{n & 0xFF:02x}"))
        if not re.fullmatch(r"([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}", mac):
            raise (where / "mac").error(f"{mac!r} is not a MAC address")
        ranks = _int(h.get("ranks", 1), where / "ranks", 1, MAX_WORKERS)
        for table, v in ((seen_ip, str(iface.ip)), (seen_mac, mac.lower())):
            if v in table:
                raise where.error(f"{v} is also {table[v]}'s")
            table[v] = key
        out.append(Host(key, str(iface), mac.lower(), ranks))
    return out


def _endpoint(value: Any, at: _At, kinds: dict[str, str]) -> tuple[str, int | None]:
    if not isinstance(value, str):
        raise at.error(f"expected a node name, got {value!r}")
    node, port = value, None
    m = _PORT.match(value)
    if value not in kinds and m:
        node, port = m.group("node"), int(m.group("port"))
    if node not in kinds:
        raise at.error(f"unknown node {node!r}")
    if port is not None and kinds[node] != "switch":
        raise at.error(f"{node} is a host: only switch ports are numbered")
    return node, port


def _links(
    value: Any, at: _At, kinds: dict[str, str], defaults: dict[str, Any], defaults_at: _At
) -> list[Link]:
    if not isinstance(value, list) or not value:
        raise at.error("expected a non-empty list of links")
    next_port: dict[str, int] = {}
    used: dict[str, set[int]] = {}
    pairs: set[frozenset[str]] = set()
    out = []
    for i, item in enumerate(value):
        where = at / i
        spec = {"a": item[0], "b": item[1]} if isinstance(item, list) and len(item) == 2 else item
        s = _mapping(spec, where, _LINK_KEYS)
        if "a" not in s or "b" not in s:
            raise where.error("a link names both ends: [a, b] or {a: ..., b: ...}")
        a, a_port = _endpoint(s["a"], where / "a", kinds)
        b, b_port = _endpoint(s["b"], where / "b", kinds)
        if a == b:
            raise where.error(f"a link from {a} to itself")
        if kinds[a] == kinds[b] == "host":
            raise where.error(f"{a} and {b} are hosts: a link has a switch at one end at least")
        if frozenset((a, b)) in pairs:
            raise where.error(f"a second link between {a} and {b}")
        pairs.add(frozenset((a, b)))
        if "ports" in s:
            given = s["ports"]
            if not (isinstance(given, list) and len(given) == 2):
                raise (where / "ports").error("expected [port at a, port at b]")
            for node, port in zip((a, b), given, strict=True):
                if port is not None and kinds[node] == "host":
                    raise (where / "ports").error(
                        f"{node} is a host: only switch ports are numbered"
                    )
            a_port = a_port if given[0] is None else _int(given[0], where / "ports", 1, 511)
            b_port = b_port if given[1] is None else _int(given[1], where / "ports", 1, 511)
        ports: list[int | None] = []
        for node, port in ((a, a_port), (b, b_port)):
            if kinds[node] == "host":
                ports.append(None)
                continue
            if port is None:
                port = next_port.get(node, 1)
                while port in used.get(node, set()):
                    port += 1
            if port in used.setdefault(node, set()):
                raise where.error(f"port {port} of {node} is used twice")
            used[node].add(port)
            next_port[node] = port + 1
            ports.append(port)
        merged = {
            **defaults,
            **{k: v for k, v in s.items() if k in _LINK_VALUES},
        }
        # A bad value is reported where it is written: the link's own, or the defaults'.
        src = {k: where / k if k in s else defaults_at / k for k in _LINK_VALUES}
        bw = merged.get("bw")
        queue = merged.get("queue")
        out.append(
            Link(
                a, b, ports[0], ports[1],
                bw=None if bw is None else _number(bw, src["bw"], 0.001, 100_000.0),
                delay=_delay(merged.get("delay", 0.0), src["delay"]),
                loss=_number(merged.get("loss", 0.0), src["loss"], 0.0, 1.0, open_hi=True),
                queue=None if queue is None else _int(queue, src["queue"], 1, 1_000_000),
                jitter=_delay(merged.get("jitter", 0.0), src["jitter"]),
                dup=_number(merged.get("dup", 0.0), src["dup"], 0.0, 1.0, open_hi=True),
                reorder=_number(merged.get("reorder", 0.0), src["reorder"], 0.0, 1.0,
                                open_hi=True),
            )
        )  # fmt: skip
    return out


def _jobs(
    value: Any, at: _At, hosts: Sequence[Host], switches: Sequence[Switch]
) -> list[TopologyJob]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise at.error("expected a list of jobs")
    host_names = {h.name for h in hosts}
    aggregators = {s.name for s in switches if s.role == "aggregate"}
    out: list[TopologyJob] = []
    for i, spec in enumerate(value):
        where = at / i
        j = _mapping(spec, where, {"id", "workers", "switch"})
        job_id = _int(j.get("id"), where / "id", 0, 0xFFFF)
        if any(o.job_id == job_id for o in out):
            raise (where / "id").error(f"job id {job_id} is used twice")
        workers = j.get("workers")
        if not isinstance(workers, list) or not 1 <= len(workers) <= MAX_WORKERS:
            raise (where / "workers").error(f"expected a list of 1..{MAX_WORKERS} hosts")
        for k, w in enumerate(workers):
            if w not in host_names:
                raise (where / "workers" / k).error(f"{w!r} is not a host")
        if len(set(workers)) != len(workers):
            raise (where / "workers").error("a host is listed twice")
        switch = j.get("switch")
        if switch not in aggregators:
            known = ", ".join(sorted(aggregators)) or "none"
            raise (where / "switch").error(
                f"{switch!r} is not a switch with role aggregate ({known})"
            )
        out.append(TopologyJob(job_id, tuple(workers), switch))
    return out
