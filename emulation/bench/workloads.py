"""Training workloads as traces: the collective calls of one training iteration, in order.

The bench's replay runner issues a :class:`Workload`'s calls one after another, as a
training step would, instead of a sweep of equal sizes. Shipped workloads are computed
here from published model shapes (no weights, no downloads); users write their own as
trace files. Pure data and the standard library: nothing here starts a process or
imports torch.

Trace file format (UTF-8 text, one item per line)::

    # comment: a line whose first non-blank character is '#'; blank lines are ignored
    name my-model                  # optional header lines, before the first call;
    description what it models     # name defaults to the file's stem,
    source where the shapes come from   # description and source to empty
    allreduce 25M float32 bucket 0
    all_gather 3145728 x12 layer weights
    reduce_scatter 1K int32

A call is ``COLLECTIVE SIZE [DTYPE] [xCOUNT] [LABEL...]``:

- ``COLLECTIVE``: ``allreduce``, ``reduce_scatter`` or ``all_gather``;
- ``SIZE``: the whole vector in bytes (an allreduce's input, a reduce_scatter's input,
  an all_gather's output), digits with an optional ``K``, ``M`` or ``G`` (powers of
  1024), positive and a multiple of 4 (whole elements);
- ``DTYPE``: ``float32`` (the default) or ``int32``, the types the INA wire format carries;
- ``xCOUNT``: the call ``COUNT`` times in a row (``x1`` to ``x100000``);
- ``LABEL``: the rest of the line, free text for tables and logs (runs of blanks become
  one space). A label whose first word is ``x`` and a digit needs an explicit ``x1``
  before it.

Only whole-line comments exist, so labels and header text may contain ``#``. Errors are
:class:`TraceError`, one line naming the file and line, e.g.
``trace.txt:7: unknown collective 'allredcue' (known: allreduce, reduce_scatter, all_gather)``.

The shipped workloads (``python -m emulation.bench.workloads`` lists them, and
``--write-traces DIR`` writes their trace files) are one iteration at real size;
:func:`default_scale` gives the factor that brings an iteration to about 32 MiB, so a
loopback replay takes seconds.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import NamedTuple

from dynamiccl.actions import ALL_COLLECTIVES
from emulation.bench.config import ELEMENT_BYTES
from hostlib.units import format_size, parse_size

__all__ = [
    "COLLECTIVES",
    "DDP_BUCKET_CAP_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
    "MAX_TRACE_CALLS",
    "TP_MICRO_BATCH",
    "TP_RANKS",
    "TP_SEQUENCE",
    "Bucket",
    "Call",
    "ParamShape",
    "TraceError",
    "Workload",
    "bert_base_parameters",
    "ddp_bert_base",
    "ddp_buckets",
    "ddp_gpt2",
    "ddp_resnet50",
    "default_scale",
    "format_trace",
    "gpt2_parameters",
    "load_workload",
    "main",
    "parse_trace",
    "resnet50_parameters",
    "shipped_workloads",
    "tp_dp_mix",
    "tp_gpt2",
    "zero3_gpt2",
]

COLLECTIVES = ALL_COLLECTIVES
"""The collectives a trace may call: hostlib's (NCCL's names, lower case)."""

DDP_BUCKET_CAP_BYTES = 25 << 20
"""DistributedDataParallel's default ``bucket_cap_mb=25`` (MiB)."""

DDP_FIRST_BUCKET_BYTES = 1 << 20
"""``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``: DDP's small first bucket, so the
first allreduce starts early in the backward pass."""

MAX_TRACE_CALLS = 100_000
"""Calls per trace at most (and the largest ``xCOUNT``): a bound on a typo's memory."""

_FP32 = 4
_DTYPE_LIKE = re.compile(r"^(?:u?int\d+|float\d+|bfloat\d+|fp\d+|bf\d+|half|double)$")
_COUNT_LIKE = re.compile(r"^x\d")
_COUNT = re.compile(r"^x(\d+)$")
_HEADERS = ("name", "description", "source")


class TraceError(ValueError):
    """A trace that cannot be read; for a file the message starts ``FILE:LINE: ``."""


def _check_text(what: str, text: str, *, empty_ok: bool) -> None:
    """Header text and labels must survive a trace file: one line, blanks normalised."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, not {type(text).__name__}")
    if text != " ".join(text.split()):
        raise ValueError(f"{what} {text!r} must be one line without extra blanks")
    if not text and not empty_ok:
        raise ValueError(f"{what} must not be empty")


@dataclass(frozen=True)
class Call:
    """One collective call of a training iteration.

    Raises:
        ValueError: an unknown collective or dtype, a size that is not a positive
            multiple of the element size, a label that is not one normalised line.
    """

    collective: str
    nbytes: int
    """The whole vector: allreduce input, reduce_scatter input, all_gather output."""
    dtype: str = "float32"
    label: str = ""

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(
                f"unknown collective {self.collective!r} (known: {', '.join(COLLECTIVES)})"
            )
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"unsupported dtype {self.dtype!r} (supported: {_dtypes()})")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int):
            raise ValueError(f"size must be an int, not {type(self.nbytes).__name__}")
        _check_size(self.nbytes, self.dtype)
        _check_text("label", self.label, empty_ok=True)


def _dtypes() -> str:
    return ", ".join(ELEMENT_BYTES)


def _check_size(nbytes: int, dtype: str) -> None:
    element = ELEMENT_BYTES[dtype]
    if nbytes <= 0:
        raise ValueError(f"size {nbytes} must be positive")
    if nbytes % element:
        raise ValueError(f"size {nbytes} is not a multiple of {element} bytes (a {dtype} element)")


@dataclass(frozen=True)
class Workload:
    """One training iteration's collective calls, in issue order.

    Raises:
        ValueError: no calls, an empty name, or a name, description or source that is
            not one normalised line.
    """

    name: str
    calls: tuple[Call, ...]
    description: str
    """One line: what the workload models and how it was scaled."""
    source: str
    """One line: where the shapes come from (paper, configuration)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "calls", tuple(self.calls))
        _check_text("name", self.name, empty_ok=False)
        _check_text("description", self.description, empty_ok=True)
        _check_text("source", self.source, empty_ok=True)
        if not self.calls:
            raise ValueError(f"workload {self.name!r} has no calls")
        for call in self.calls:
            if not isinstance(call, Call):
                raise ValueError(f"workload {self.name!r}: {call!r} is not a Call")

    @property
    def total_bytes(self) -> int:
        """The bytes of all calls' vectors, summed."""
        return sum(call.nbytes for call in self.calls)

    def scaled(self, factor: float) -> Workload:
        """Every call's size times ``factor``, rounded to a multiple of 4 and at least 4.

        Order, collectives, dtypes and labels are kept; the description says the factor.

        Raises:
            ValueError: ``factor`` is not a positive finite number.
        """
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be a positive number, not {factor!r}")
        if factor == 1:
            return self
        calls = tuple(
            Call(
                c.collective, max(_FP32, round(c.nbytes * factor / _FP32) * _FP32), c.dtype, c.label
            )
            for c in self.calls
        )
        note = f"[scaled x{factor:.6g}]"
        description = f"{self.description} {note}" if self.description else note
        return Workload(self.name, calls, description, self.source)


def default_scale(workload: Workload, target_bytes: int = 32 << 20) -> float:
    """The factor that makes one iteration of ``workload`` total about ``target_bytes``.

    Relative sizes are kept (:meth:`Workload.scaled` rounds each call to whole elements,
    so the total is ``target_bytes`` within 4 bytes per call). The default, 32 MiB per
    iteration, replays on loopback with a 2-core machine in seconds per iteration. The
    factor is above 1 for a workload smaller than the target.

    Raises:
        ValueError: ``target_bytes`` is not positive.
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, not {target_bytes}")
    return target_bytes / workload.total_bytes


# --- model shapes ----------------------------------------------------------------------


class ParamShape(NamedTuple):
    """A parameter tensor: its name in the PyTorch module and its shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _linear(name: str, d_in: int, d_out: int) -> list[ParamShape]:
    """``torch.nn.Linear``: weight (out, in), then bias."""
    return [ParamShape(f"{name}.weight", (d_out, d_in)), ParamShape(f"{name}.bias", (d_out,))]


def _conv1d(name: str, d_in: int, d_out: int) -> list[ParamShape]:
    """HF GPT-2's ``Conv1D``: a linear layer whose weight is stored (in, out)."""
    return [ParamShape(f"{name}.weight", (d_in, d_out)), ParamShape(f"{name}.bias", (d_out,))]


def _norm(name: str, d: int) -> list[ParamShape]:
    """LayerNorm or BatchNorm2d: weight, bias (running statistics are buffers)."""
    return [ParamShape(f"{name}.weight", (d,)), ParamShape(f"{name}.bias", (d,))]


def resnet50_parameters() -> list[ParamShape]:
    """``torchvision.models.resnet50()``'s parameters in registration order (25,557,032).

    ResNet-50 v1.5 (stride in the 3x3 convolution), bias-free convolutions each followed by
    a BatchNorm, bottleneck blocks of [3, 4, 6, 3], 1000 classes.
    """
    params = [ParamShape("conv1.weight", (64, 3, 7, 7)), *_norm("bn1", 64)]
    inplanes = 64
    for stage, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], 1):
        out = planes * 4
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            params += [
                ParamShape(f"{p}.conv1.weight", (planes, inplanes, 1, 1)),
                *_norm(f"{p}.bn1", planes),
                ParamShape(f"{p}.conv2.weight", (planes, planes, 3, 3)),
                *_norm(f"{p}.bn2", planes),
                ParamShape(f"{p}.conv3.weight", (out, planes, 1, 1)),
                *_norm(f"{p}.bn3", out),
            ]
            if block == 0:  # stride 2 or a change of width: a projection shortcut
                params += [
                    ParamShape(f"{p}.downsample.0.weight", (out, inplanes, 1, 1)),
                    *_norm(f"{p}.downsample.1", out),
                ]
            inplanes = out
    return params + _linear("fc", 2048, 1000)


_BERT = {"layers": 12, "hidden": 768, "ffn": 3072, "vocab": 30522, "positions": 512, "types": 2}
_GPT2 = {"layers": 12, "hidden": 768, "vocab": 50257, "positions": 1024}


def bert_base_parameters() -> list[ParamShape]:
    """HF ``BertModel`` (bert-base-uncased, with pooler) in registration order (109,482,240).

    12 layers, hidden 768, 12 heads (heads share the hidden-size projections, so they do
    not change shapes), FFN 3072, vocabulary 30522, 512 positions, 2 token types.
    """
    h, ffn = _BERT["hidden"], _BERT["ffn"]
    params = [
        ParamShape("embeddings.word_embeddings.weight", (_BERT["vocab"], h)),
        ParamShape("embeddings.position_embeddings.weight", (_BERT["positions"], h)),
        ParamShape("embeddings.token_type_embeddings.weight", (_BERT["types"], h)),
        *_norm("embeddings.LayerNorm", h),
    ]
    for i in range(_BERT["layers"]):
        p = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            params += _linear(f"{p}.attention.self.{proj}", h, h)
        params += _linear(f"{p}.attention.output.dense", h, h)
        params += _norm(f"{p}.attention.output.LayerNorm", h)
        params += _linear(f"{p}.intermediate.dense", h, ffn)
        params += _linear(f"{p}.output.dense", ffn, h)
        params += _norm(f"{p}.output.LayerNorm", h)
    return params + _linear("pooler.dense", h, h)


def _gpt2_block(i: int) -> list[ParamShape]:
    h = _GPT2["hidden"]
    p = f"h.{i}"
    return [
        *_norm(f"{p}.ln_1", h),
        *_conv1d(f"{p}.attn.c_attn", h, 3 * h),
        *_conv1d(f"{p}.attn.c_proj", h, h),
        *_norm(f"{p}.ln_2", h),
        *_conv1d(f"{p}.mlp.c_fc", h, 4 * h),
        *_conv1d(f"{p}.mlp.c_proj", 4 * h, h),
    ]


def gpt2_parameters() -> list[ParamShape]:
    """HF GPT-2 small (``GPT2LMHeadModel``) in registration order (124,439,808).

    12 layers, d_model 768, vocabulary 50257, n_ctx 1024; the LM head is tied to ``wte``,
    so DDP sees that tensor once, where the embedding registers it.
    """
    h = _GPT2["hidden"]
    params = [
        ParamShape("wte.weight", (_GPT2["vocab"], h)),
        ParamShape("wpe.weight", (_GPT2["positions"], h)),
    ]
    for i in range(_GPT2["layers"]):
        params += _gpt2_block(i)
    return params + _norm("ln_f", h)


# --- DDP -------------------------------------------------------------------------------


class Bucket(NamedTuple):
    """A DDP gradient bucket: its parameters in gradient-ready order and its bytes."""

    params: tuple[ParamShape, ...]
    nbytes: int


def ddp_buckets(
    params: Sequence[ParamShape],
    *,
    cap_bytes: int = DDP_BUCKET_CAP_BYTES,
    first_cap_bytes: int = DDP_FIRST_BUCKET_BYTES,
    element_bytes: int = _FP32,
) -> list[Bucket]:
    """DDP's gradient buckets for ``params`` given in registration order, in allreduce order.

    After its first iteration DDP rebuilds its buckets in the order gradients became
    ready. That is about the reverse of registration (exactly so for a chain of Linear
    layers; a LayerNorm's weight may come before its bias, which moves a boundary by one
    small tensor at most); this takes the reverse. The rule is the reducer's
    (``compute_bucket_assignment_by_size``): a parameter joins the open bucket, and the
    bucket closes once its size reaches the limit, the first limit being
    ``first_cap_bytes`` and every later one ``cap_bytes``. The defaults are DDP's with
    ``bucket_cap_mb`` unset; torch 2.13 drops the small first bucket (the first limit is
    the cap) when ``bucket_cap_mb`` is given.

    Raises:
        ValueError: a cap that is not positive, or no parameters.
    """
    if cap_bytes <= 0 or first_cap_bytes <= 0:
        raise ValueError("bucket caps must be positive")
    if not params:
        raise ValueError("no parameters to bucket")
    buckets: list[Bucket] = []
    open_params: list[ParamShape] = []
    size = 0
    for param in reversed(params):
        open_params.append(param)
        size += param.numel * element_bytes
        if size >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(Bucket(tuple(open_params), size))
            open_params, size = [], 0
    if open_params:
        buckets.append(Bucket(tuple(open_params), size))
    return buckets


def _bucket_label(i: int, bucket: Bucket, prefix: str = "") -> str:
    first, last = bucket.params[0].name, bucket.params[-1].name
    span = first if first == last else f"{first} .. {last}"
    return f"{prefix}bucket {i} ({span})"


def _ddp_calls(params: Sequence[ParamShape], prefix: str = "") -> list[Call]:
    return [
        Call("allreduce", b.nbytes, "float32", _bucket_label(i, b, prefix))
        for i, b in enumerate(ddp_buckets(params))
    ]


_DDP_HOW = "fp32 gradients in DDP buckets (25 MiB, first 1 MiB, reverse registration order)"
_DDP_SOURCE = (
    "bucketing: torch DistributedDataParallel, bucket_cap_mb=25, _DEFAULT_FIRST_BUCKET_BYTES"
)


def _count(params: Sequence[ParamShape]) -> str:
    return f"{sum(p.numel for p in params):,}"


def ddp_resnet50() -> Workload:
    """Data parallel ResNet-50: one allreduce per DDP gradient bucket."""
    params = resnet50_parameters()
    return Workload(
        "ddp-resnet50",
        tuple(_ddp_calls(params)),
        f"data-parallel ResNet-50 ({_count(params)} params): {_DDP_HOW}",
        f"torchvision.models.resnet50 (He et al. 2016, v1.5); {_DDP_SOURCE}",
    )


def ddp_bert_base() -> Workload:
    """Data parallel BERT-base: one allreduce per DDP gradient bucket."""
    params = bert_base_parameters()
    return Workload(
        "ddp-bert-base",
        tuple(_ddp_calls(params)),
        f"data-parallel BERT-base uncased ({_count(params)} params, with pooler): {_DDP_HOW}",
        "bert-base-uncased config (Devlin et al. 2019): 12 layers, hidden 768, 12 heads, "
        f"FFN 3072, vocab 30522, 512 positions, 2 types; {_DDP_SOURCE}",
    )


def ddp_gpt2() -> Workload:
    """Data parallel GPT-2 small: one allreduce per DDP gradient bucket."""
    params = gpt2_parameters()
    return Workload(
        "ddp-gpt2",
        tuple(_ddp_calls(params)),
        f"data-parallel GPT-2 small ({_count(params)} params, tied LM head): {_DDP_HOW}",
        "GPT-2 small config (Radford et al. 2019; HF gpt2): 12 layers, d 768, vocab 50257, "
        f"n_ctx 1024; {_DDP_SOURCE}",
    )


# --- tensor parallel and ZeRO-3 --------------------------------------------------------

TP_RANKS = 4
TP_MICRO_BATCH = 8
TP_SEQUENCE = 1024


def _tp_calls(prefix: str = "") -> list[Call]:
    """Megatron-LM's per-layer allreduces of b*s*h activations (their size is the same
    on every rank and for any TP degree): g after attention and after the MLP forward,
    then in the backward pass, layers in reverse, the conjugate f before the MLP and
    before attention."""
    nbytes = TP_MICRO_BATCH * TP_SEQUENCE * _GPT2["hidden"] * _FP32
    layers = range(_GPT2["layers"])
    forward = [
        Call("allreduce", nbytes, "float32", f"{prefix}layer {i} fwd {part}")
        for i in layers
        for part in ("attn", "mlp")
    ]
    backward = [
        Call("allreduce", nbytes, "float32", f"{prefix}layer {i} bwd {part}")
        for i in reversed(layers)
        for part in ("mlp", "attn")
    ]
    return forward + backward


_TP_DESCRIPTION = (
    f"Megatron-LM tensor parallelism over {TP_RANKS} ranks, GPT-2 small: per layer 2 "
    f"allreduces forward, 2 backward, of b*s*h = {TP_MICRO_BATCH}*{TP_SEQUENCE}*768 "
    "activations in fp32 (Megatron would use fp16/bf16: half the bytes); "
    "embedding and loss collectives left out"
)
_TP_SOURCE = (
    "Shoeybi et al. 2019 (Megatron-LM), f/g operators of Fig. 3; GPT-2 small config "
    "(12 layers, d 768)"
)


def tp_gpt2() -> Workload:
    """Tensor-parallel GPT-2 small: 12 layers x 4 allreduces of 24 MiB."""
    return Workload("tp-gpt2", tuple(_tp_calls()), _TP_DESCRIPTION, _TP_SOURCE)


def zero3_gpt2() -> Workload:
    """FSDP / ZeRO-3 GPT-2 small, one FSDP unit per transformer block and a root unit.

    The root unit holds what no block does (``wte`` (tied LM head), ``wpe``, ``ln_f``).
    Forward gathers the root, then each block; backward, blocks in reverse, gathers a
    block again and reduce-scatters its gradients; the root, which FSDP keeps gathered
    after forward, only reduce-scatters its gradients at the end.
    """
    params = gpt2_parameters()
    blocks = [_gpt2_block(i) for i in range(_GPT2["layers"])]
    in_blocks = {p.name for block in blocks for p in block}
    root = [p for p in params if p.name not in in_blocks]

    def nbytes(unit: Iterable[ParamShape]) -> int:
        return sum(p.numel for p in unit) * _FP32

    calls = [Call("all_gather", nbytes(root), "float32", "root fwd params (wte wpe ln_f)")]
    calls += [
        Call("all_gather", nbytes(b), "float32", f"layer {i} fwd params")
        for i, b in enumerate(blocks)
    ]
    for i in reversed(range(len(blocks))):
        calls.append(Call("all_gather", nbytes(blocks[i]), "float32", f"layer {i} bwd params"))
        calls.append(Call("reduce_scatter", nbytes(blocks[i]), "float32", f"layer {i} grads"))
    calls.append(Call("reduce_scatter", nbytes(root), "float32", "root grads (wte wpe ln_f)"))
    return Workload(
        "zero3-gpt2",
        tuple(calls),
        "FSDP/ZeRO-3 GPT-2 small, fp32, a unit per transformer block plus the root "
        "(embeddings, ln_f): all_gather per unit forward, all_gather and reduce_scatter "
        "per block backward, the root kept gathered (no padding to the world size)",
        "Rajbhandari et al. 2020 (ZeRO-3); PyTorch FSDP with a GPT2Block auto-wrap policy; "
        "GPT-2 small config (12 layers, d 768, vocab 50257, n_ctx 1024)",
    )


def tp_dp_mix() -> Workload:
    """DynamICCL's motivating mix: tp-gpt2's many mid-size calls, then ddp-gpt2's buckets."""
    calls = _tp_calls("tp ") + _ddp_calls(gpt2_parameters(), "dp ")
    return Workload(
        "tp-dp-mix",
        tuple(calls),
        "one iteration of tp-gpt2 (48 allreduces of 24 MiB) followed by the ddp-gpt2 "
        "gradient buckets: many mid-size then few large calls",
        "DynamICCL's motivation (mixed collective sizes in one job); tp-gpt2 and ddp-gpt2 here",
    )


_GENERATORS: dict[str, Callable[[], Workload]] = {
    "ddp-resnet50": ddp_resnet50,
    "ddp-bert-base": ddp_bert_base,
    "ddp-gpt2": ddp_gpt2,
    "tp-gpt2": tp_gpt2,
    "zero3-gpt2": zero3_gpt2,
    "tp-dp-mix": tp_dp_mix,
}


@functools.cache
def _shipped(name: str) -> Workload:
    return _GENERATORS[name]()


def shipped_workloads() -> dict[str, str]:
    """The shipped workloads' names and one-line descriptions."""
    return {name: _shipped(name).description for name in _GENERATORS}


# --- trace files ------------------------------------------------------------------------


def load_workload(name_or_path: str, *, scale: float = 1.0) -> Workload:
    """A shipped workload by name, or a trace file by path, its sizes times ``scale``.

    A shipped name wins over a file of the same name in the working directory (write
    ``./NAME`` for the file).

    Raises:
        TraceError: an unknown name (the message lists the shipped ones), a file that
            cannot be read or parsed.
        ValueError: ``scale`` is not a positive finite number.
    """
    if name_or_path in _GENERATORS:
        return _shipped(name_or_path).scaled(scale)
    path = Path(name_or_path)
    if not path.exists():
        raise TraceError(
            f"{name_or_path}: no such workload or trace file (shipped: {', '.join(_GENERATORS)})"
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{name_or_path}: cannot read: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TraceError(f"{name_or_path}:{line}: not UTF-8 text ({e.reason})") from None
    return parse_trace(text, name_or_path).scaled(scale)


def _parse_call(tokens: list[str]) -> tuple[Call, int]:
    """A call line's tokens: the call and its repeat count. Raises ValueError."""
    collective = tokens[0]
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
    if len(tokens) < 2:
        raise ValueError(f"{collective} needs a size (bytes, K, M or G)")
    try:
        nbytes = parse_size(tokens[1])
    except ValueError:
        raise ValueError(
            f"bad size {tokens[1]!r}: expected positive bytes like 4096, 4K, 25M or 1G"
        ) from None
    rest = tokens[2:]
    dtype = "float32"
    if rest and (rest[0] in ELEMENT_BYTES or _DTYPE_LIKE.match(rest[0])):
        dtype = rest.pop(0)
        if dtype not in ELEMENT_BYTES:
            raise ValueError(f"unsupported dtype {dtype!r} (supported: {_dtypes()})")
    _check_size(nbytes, dtype)
    count = 1
    if rest and _COUNT_LIKE.match(rest[0]):
        m = _COUNT.match(rest[0])
        count = int(m.group(1)) if m else 0
        if not 1 <= count <= MAX_TRACE_CALLS:
            raise ValueError(f"bad count {rest[0]!r}: expected x1 to x{MAX_TRACE_CALLS}")
        rest.pop(0)
    return Call(collective, nbytes, dtype, " ".join(rest)), count


def _parse_header(
    key: str, value: str, headers: dict[str, tuple[str, int]], lineno: int, seen_call: bool
) -> None:
    if seen_call:
        raise ValueError(f"'{key}' line after the first call: headers come first")
    if key in headers:
        raise ValueError(f"duplicate '{key}' line (first on line {headers[key][1]})")
    if not value:
        raise ValueError(f"'{key}' line without text")
    headers[key] = (value, lineno)


def parse_trace(text: str, where: str) -> Workload:
    """Parse a trace file's text (the format is in this module's docstring).

    Args:
        text: the file's contents.
        where: the file's name, for messages; its stem is the default workload name.

    Raises:
        TraceError: ``WHERE:LINE: what is wrong``, for the first bad line, or for a
            trace without calls.
    """
    headers: dict[str, tuple[str, int]] = {}
    calls: list[Call] = []
    lines = text.splitlines()
    for lineno, raw in enumerate(lines, 1):
        tokens = raw.split()
        if not tokens or tokens[0].startswith("#"):
            continue
        try:
            if tokens[0] in _HEADERS:
                value = " ".join(tokens[1:])
                _parse_header(tokens[0], value, headers, lineno, bool(calls))
                continue
            call, count = _parse_call(tokens)
        except ValueError as e:
            raise TraceError(f"{where}:{lineno}: {e}") from None
        if len(calls) + count > MAX_TRACE_CALLS:
            raise TraceError(f"{where}:{lineno}: more than {MAX_TRACE_CALLS} calls")
        calls += [call] * count
    if not calls:
        raise TraceError(f"{where}:{max(1, len(lines))}: empty trace: no calls")
    name = headers["name"][0] if "name" in headers else " ".join(PurePath(where).stem.split())
    return Workload(
        name or "trace",
        tuple(calls),
        headers.get("description", ("", 0))[0],
        headers.get("source", ("", 0))[0],
    )


def _format_call(call: Call, count: int) -> str:
    words = [call.collective, format_size(call.nbytes), call.dtype]
    if count > 1 or _COUNT_LIKE.match(call.label):
        words.append(f"x{count}")
    if call.label:
        words.append(call.label)
    return " ".join(words)


def format_trace(w: Workload) -> str:
    """``w`` as a trace file; runs of equal calls become one line with ``xCOUNT``.

    ``parse_trace(format_trace(w), ...) == w`` for every workload.
    """
    mib = w.total_bytes / (1 << 20)
    lines = [
        "# inalab workload trace: one training iteration's collective calls, in issue order.",
        "# COLLECTIVE SIZE [DTYPE] [xCOUNT] [LABEL...]; SIZE in bytes, K/M/G = 2^10/2^20/2^30.",
        f"# {len(w.calls)} calls, {mib:.1f} MiB ({w.total_bytes} bytes) per iteration.",
        f"name {w.name}",
    ]
    if w.description:
        lines.append(f"description {w.description}")
    if w.source:
        lines.append(f"source {w.source}")
    lines.append("")
    i = 0
    while i < len(w.calls):
        run = 1
        while i + run < len(w.calls) and w.calls[i + run] == w.calls[i] and run < MAX_TRACE_CALLS:
            run += 1
        lines.append(_format_call(w.calls[i], run))
        i += run
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m emulation.bench.workloads [--write-traces DIR]``: list or write traces."""
    parser = argparse.ArgumentParser(
        prog="python -m emulation.bench.workloads",
        description="List the shipped workloads, or write their trace files.",
    )
    parser.add_argument(
        "--write-traces",
        metavar="DIR",
        type=Path,
        help="write NAME.trace for every shipped workload into DIR",
    )
    args = parser.parse_args(argv)
    for name in _GENERATORS:
        w = _shipped(name)
        if args.write_traces is not None:
            args.write_traces.mkdir(parents=True, exist_ok=True)
            path = args.write_traces / f"{name}.trace"
            path.write_text(format_trace(w), encoding="utf-8")
            print(f"wrote {path}")
        else:
            print(
                f"{name:15} {len(w.calls):3} calls {w.total_bytes / (1 << 20):8.1f} MiB  "
                f"{w.description}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
