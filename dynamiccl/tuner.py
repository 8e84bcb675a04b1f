"""Decisions as an NCCL tuner rule file: the CSV the NCCL example tuner plugin reads.

NCCL's ``plugins/tuner/example`` loads ``NCCL_TUNER_CONFIG_FILE`` (default
``nccl_tuner.conf``): one rule a line,
``collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks``, sizes
inclusive, ``-1`` meaning "any" (nNodes, nRanks) or "NCCL's default" (channels), ``#``
starting a comment. The rules here come from :func:`~dynamiccl.policy.choose` at each
power-of-two step of a size range; adjacent steps with the same choice merge into one
rule. INA maps to ``collnet_direct``, NCCL's in-network (SHARP) algorithm, which NCCL
only considers with ``NCCL_COLLNET_ENABLE=1`` and a CollNet plugin; the protocol is
``simple`` (the only one NCCL models for CollNet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynamiccl.policy import Decision

__all__ = [
    "NCCL_ALGORITHM",
    "NCCL_MAX_BYTES",
    "TunerRule",
    "format_rules",
    "parse_rules",
    "tuner_rules",
    "write_rules",
]

NCCL_ALGORITHM = {"ina": "collnet_direct", "ring": "ring", "tree": "tree"}
"""inalab's algorithm -> the example plugin's algorithm name."""

NCCL_MAX_BYTES = 4294967295
"""The example plugin's "every size" upper bound (its README's value)."""

HEADER = "collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"


@dataclass(frozen=True)
class TunerRule:
    """One line of the rule file (sizes inclusive; -1: any / NCCL's default)."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str = "simple"
    channels: int = -1
    n_nodes: int = -1
    n_ranks: int = -1

    def line(self) -> str:
        return ",".join(
            str(v)
            for v in (
                self.collective,
                self.min_bytes,
                self.max_bytes,
                self.algorithm,
                self.protocol,
                self.channels,
                self.n_nodes,
                self.n_ranks,
            )
        )


def tuner_rules(
    decide: Callable[[int], Decision],
    collective: str,
    min_bytes: int,
    max_bytes: int,
    *,
    n_nodes: int = -1,
    n_ranks: int = -1,
) -> list[TunerRule]:
    """Rules covering ``min_bytes..max_bytes``: ``decide`` at ``min_bytes * 2**k``, each
    choice holding up to the next step, adjacent equal choices merged.

    Args:
        decide: size -> decision, e.g. ``lambda s: choose("allreduce", s, ...)``.
        collective: the NCCL collective name written in each rule.
        min_bytes, max_bytes: the range covered (inclusive).
        n_nodes, n_ranks: what the rules match (-1: any).

    Raises:
        ValueError: ``min_bytes`` not positive or above ``max_bytes``.
    """
    if min_bytes <= 0 or min_bytes > max_bytes:
        raise ValueError(f"need 0 < min_bytes <= max_bytes, got {min_bytes}..{max_bytes}")
    rules: list[TunerRule] = []
    size = min_bytes
    while size <= max_bytes:
        upper = min(size * 2 - 1, max_bytes)
        algo = NCCL_ALGORITHM[decide(size).algorithm]
        if rules and rules[-1].algorithm == algo:
            last = rules[-1]
            rules[-1] = TunerRule(
                last.collective, last.min_bytes, upper, algo, n_nodes=n_nodes, n_ranks=n_ranks
            )
        else:
            rules.append(TunerRule(collective, size, upper, algo, n_nodes=n_nodes, n_ranks=n_ranks))
        size *= 2
    return rules


def format_rules(rules: Sequence[TunerRule], comment: str = "") -> str:
    """The rule file's text: comment lines, the column header as a comment, one rule a line."""
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines.append("# " + HEADER)
    lines.extend(rule.line() for rule in rules)
    return "\n".join(lines) + "\n"


def write_rules(path: str | Path, rules: Sequence[TunerRule], comment: str = "") -> None:
    """Write :func:`format_rules` to ``path``.

    Raises:
        OSError: the file cannot be written.
    """
    Path(path).write_text(format_rules(rules, comment), encoding="utf-8")


def parse_rules(text: str) -> list[TunerRule]:
    """Read a rule file (8 columns; comments and blank lines skipped), e.g. to check one.

    Raises:
        ValueError: a line without 8 comma-separated fields or with a non-integer number.
    """
    rules = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(",")
        if len(parts) != 8:
            raise ValueError(f"line {n}: expected 8 fields, got {len(parts)}: {line!r}")
        coll, lo, hi, algo, proto, ch, nodes, ranks = parts
        try:
            rules.append(
                TunerRule(coll, int(lo), int(hi), algo, proto, int(ch), int(nodes), int(ranks))
            )
        except ValueError:
            raise ValueError(f"line {n}: a size or count is not an integer: {line!r}") from None
    return rules
