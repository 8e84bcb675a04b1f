"""Training workloads as traces: model shapes, DDP buckets against torch, the trace format."""

from __future__ import annotations

import importlib.resources
import itertools
import re
from pathlib import Path

import pytest

from emulation.bench.workloads import (
    COLLECTIVES,
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    MAX_TRACE_CALLS,
    Call,
    ParamShape,
    TraceError,
    Workload,
    bert_base_parameters,
    ddp_bert_base,
    ddp_buckets,
    ddp_gpt2,
    ddp_resnet50,
    default_scale,
    format_trace,
    gpt2_parameters,
    load_workload,
    main,
    parse_trace,
    resnet50_parameters,
    shipped_workloads,
    tp_dp_mix,
    tp_gpt2,
    zero3_gpt2,
)

SHIPPED = {
    "ddp-resnet50": ddp_resnet50,
    "ddp-bert-base": ddp_bert_base,
    "ddp-gpt2": ddp_gpt2,
    "tp-gpt2": tp_gpt2,
    "zero3-gpt2": zero3_gpt2,
    "tp-dp-mix": tp_dp_mix,
}
MODELS = {
    "resnet50": resnet50_parameters,
    "bert-base": bert_base_parameters,
    "gpt2": gpt2_parameters,
}
TRACES = importlib.resources.files("emulation.bench") / "traces"
GPT2_PARAMS = 124_439_808
GPT2_BLOCK_BYTES = 7_087_872 * 4
ACTIVATION_BYTES = 8 * 1024 * 768 * 4  # tp-gpt2: b*s*h fp32


def _numel(params: list[ParamShape]) -> int:
    return sum(p.numel for p in params)


# --- model shapes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "params", "tensors"),
    [
        # torchvision resnet50(); HF BertModel(bert-base-uncased); HF GPT2LMHeadModel (tied).
        ("resnet50", 25_557_032, 161),
        ("bert-base", 109_482_240, 199),
        ("gpt2", GPT2_PARAMS, 148),
    ],
)
def test_parameter_counts_are_the_published_models(model: str, params: int, tensors: int) -> None:
    shapes = MODELS[model]()
    assert _numel(shapes) == params
    assert len(shapes) == tensors
    assert len({p.name for p in shapes}) == tensors


def test_shapes_follow_the_pytorch_modules() -> None:
    resnet = dict(resnet50_parameters())
    assert resnet["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert resnet["layer3.5.conv2.weight"] == (256, 256, 3, 3)
    assert resnet["fc.weight"] == (1000, 2048)
    bert = dict(bert_base_parameters())
    assert bert["encoder.layer.11.intermediate.dense.weight"] == (3072, 768)
    assert bert["embeddings.token_type_embeddings.weight"] == (2, 768)
    gpt2 = dict(gpt2_parameters())
    assert gpt2["h.0.attn.c_attn.weight"] == (768, 2304)  # Conv1D stores (in, out)
    assert gpt2["wpe.weight"] == (1024, 768)
    # registration order: the embeddings first, the head (or final norm) last
    assert resnet50_parameters()[0].name == "conv1.weight"
    assert gpt2_parameters()[-1].name == "ln_f.bias"


# --- DDP buckets -----------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(MODELS))
def test_ddp_buckets_agree_with_torchs_reducer(model: str) -> None:
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == DDP_FIRST_BUCKET_BYTES
    params = MODELS[model]()
    ready_order = list(reversed(params))  # DDP's rebuilt buckets: gradient-ready order
    tensors = [torch.empty(p.shape, device="meta") for p in ready_order]
    indices, _ = dist._compute_bucket_assignment_by_size(
        tensors, [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES]
    )
    expected = [
        ([ready_order[i].name for i in bucket], sum(ready_order[i].numel * 4 for i in bucket))
        for bucket in indices
    ]
    ours = [([p.name for p in b.params], b.nbytes) for b in ddp_buckets(params)]
    assert ours == expected
    assert len(ours) > 2


def test_ddp_buckets_agree_with_a_real_ddp_model(tmp_path: Path) -> None:
    # DDP with its defaults (bucket_cap_mb unset: 25 MiB, first bucket 1 MiB), after it
    # rebuilt its buckets in the order gradients became ready.
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("a default process group is already initialised in this process")
    widths = [256, 512, 2048, 2048, 1024, 300, 200]
    model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in itertools.pairwise(widths)))
    names = [n for n, _ in model.named_parameters()]
    shapes = [ParamShape(n, tuple(p.shape)) for n, p in model.named_parameters()]
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for _ in range(3):  # records the ready order, rebuilds, then logs the rebuilt buckets
            ddp(torch.randn(2, widths[0])).sum().backward()
        logged = ddp._get_ddp_logging_data()
    finally:
        dist.destroy_process_group()
    ours = ddp_buckets(shapes)
    assert len(ours) == 3
    assert ours != ddp_buckets(shapes, first_cap_bytes=DDP_BUCKET_CAP_BYTES)
    assert logged["rebuilt_bucket_sizes"] == ", ".join(str(b.nbytes) for b in ours)
    assert logged["rebuilt_per_bucket_param_indices"] == ", ".join(
        " ".join(str(names.index(p.name)) for p in b.params) for b in ours
    )


def test_ddp_workloads_allreduce_every_gradient_once_per_bucket() -> None:
    w = ddp_gpt2()
    buckets = ddp_buckets(gpt2_parameters())
    assert [c.nbytes for c in w.calls] == [b.nbytes for b in buckets]
    assert {c.collective for c in w.calls} == {"allreduce"}
    assert w.total_bytes == GPT2_PARAMS * 4
    assert w.calls[0].label == "bucket 0 (ln_f.bias .. h.11.mlp.c_proj.weight)"
    assert ddp_resnet50().total_bytes == 25_557_032 * 4
    assert ddp_bert_base().total_bytes == 109_482_240 * 4


def test_ddp_buckets_close_when_the_limit_is_reached() -> None:
    params = [ParamShape(f"p{i}", (n,)) for i, n in enumerate([1, 2, 3, 4, 5])]
    # 20, 16, 12, 8, 4 bytes in ready order; limits 12 then 16: 20 >= 12 closes, 16 >= 16
    # closes, 12 < 16 stays open until 12 + 8 >= 16, and the last 4 bytes are a bucket
    buckets = ddp_buckets(params, first_cap_bytes=12, cap_bytes=16)
    assert [[p.name for p in b.params] for b in buckets] == [["p4"], ["p3"], ["p2", "p1"], ["p0"]]
    assert [b.nbytes for b in buckets] == [20, 16, 20, 4]
    with pytest.raises(ValueError, match="no parameters"):
        ddp_buckets([])


# --- tensor parallel, ZeRO-3, the mix ----------------------------------------------------


def test_tp_gpt2_is_four_activation_allreduces_per_layer() -> None:
    w = tp_gpt2()
    assert len(w.calls) == 12 * 4
    assert {(c.collective, c.nbytes, c.dtype) for c in w.calls} == {
        ("allreduce", ACTIVATION_BYTES, "float32")
    }
    labels = [c.label for c in w.calls]
    assert labels[:3] == ["layer 0 fwd attn", "layer 0 fwd mlp", "layer 1 fwd attn"]
    assert labels[24:26] == ["layer 11 bwd mlp", "layer 11 bwd attn"]
    assert labels[-1] == "layer 0 bwd attn"
    assert "fp32" in w.description


def test_zero3_gpt2_gathers_and_reduce_scatters_every_unit() -> None:
    w = zero3_gpt2()
    kinds = [c.collective for c in w.calls]
    assert len(w.calls) == 1 + 12 + 12 * 2 + 1
    assert kinds.count("all_gather") == 25 and kinds.count("reduce_scatter") == 13
    # every parameter is gathered once forward and its gradient reduce-scattered once
    forward = w.calls[:13]
    grads = [c for c in w.calls if c.collective == "reduce_scatter"]
    assert sum(c.nbytes for c in forward) == GPT2_PARAMS * 4
    assert sum(c.nbytes for c in grads) == GPT2_PARAMS * 4
    assert [c.nbytes for c in w.calls[1:37]] == [GPT2_BLOCK_BYTES] * 36
    assert [(c.collective, c.label) for c in w.calls[13:15]] == [
        ("all_gather", "layer 11 bwd params"),
        ("reduce_scatter", "layer 11 grads"),
    ]
    assert w.calls[-1].label.startswith("root grads")


def test_tp_dp_mix_is_tp_then_ddp() -> None:
    mix = tp_dp_mix().calls
    tp, dp = tp_gpt2().calls, ddp_gpt2().calls
    assert len(mix) == len(tp) + len(dp)
    strip = [(c.collective, c.nbytes, c.label.split(" ", 1)[1]) for c in mix]
    assert strip == [(c.collective, c.nbytes, c.label) for c in (*tp, *dp)]
    assert mix[0].label.startswith("tp ") and mix[-1].label.startswith("dp ")


# --- the trace format ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_trace_files_are_the_generators_output(name: str) -> None:
    text = (TRACES / f"{name}.trace").read_text(encoding="utf-8")
    assert text == format_trace(SHIPPED[name]())
    assert parse_trace(text, f"{name}.trace") == SHIPPED[name]()


def test_every_shipped_workload_has_a_file_and_a_description() -> None:
    files = {p.name for p in TRACES.iterdir() if p.name.endswith(".trace")}
    assert files == {f"{name}.trace" for name in SHIPPED}
    listed = shipped_workloads()
    assert list(listed) == list(SHIPPED)
    assert all(d and "\n" not in d for d in listed.values())
    assert all(SHIPPED[n]().source for n in SHIPPED)


def test_write_traces_writes_the_shipped_files(tmp_path: Path) -> None:
    assert main(["--write-traces", str(tmp_path / "out")]) == 0
    for name in SHIPPED:
        written = (tmp_path / "out" / f"{name}.trace").read_text(encoding="utf-8")
        assert written == (TRACES / f"{name}.trace").read_text(encoding="utf-8")


TRICKY = Workload(
    "tricky one",
    (
        Call("allreduce", 4, "int32", "x86 build"),
        Call("allreduce", 4, "int32", "x86 build"),
        Call("reduce_scatter", 3 << 20, "float32", "float32 first # not a comment"),
        Call("all_gather", 12),
        Call("all_gather", 12),
        Call("all_gather", 12),
        Call("all_gather", 1000, "float32", "xylophone"),
    ),
    "a description with # inside",
    "",
)


@pytest.mark.parametrize("w", [TRICKY, *(f() for f in SHIPPED.values())], ids=lambda w: w.name)
def test_parse_of_format_is_the_workload(w: Workload) -> None:
    assert parse_trace(format_trace(w), "x.trace") == w


def test_format_writes_runs_as_counts() -> None:
    lines = [ln for ln in format_trace(TRICKY).splitlines() if ln and ln[0] != "#"]
    assert lines[:2] == ["name tricky one", "description a description with # inside"]
    assert lines[2:] == [
        "allreduce 4 int32 x2 x86 build",
        "reduce_scatter 3M float32 float32 first # not a comment",
        "all_gather 12 float32 x3",
        "all_gather 1000 float32 xylophone",
    ]


def test_parse_the_documented_example() -> None:
    text = """
    # comment
    name my-model
    description what it models
    source where the shapes come from

    allreduce 25M float32 bucket 0
    all_gather 3145728 x12 layer   weights
    reduce_scatter 1K int32
    """
    w = parse_trace(text, "dir/ignored.trace")
    assert (w.name, w.description, w.source) == (
        "my-model",
        "what it models",
        "where the shapes come from",
    )
    assert w.calls[0] == Call("allreduce", 25 << 20, "float32", "bucket 0")
    assert w.calls[1:13] == (Call("all_gather", 3 << 20, "float32", "layer weights"),) * 12
    assert w.calls[13] == Call("reduce_scatter", 1024, "int32", "")
    assert len(w.calls) == 14


def test_name_defaults_to_the_file_stem() -> None:
    w = parse_trace("allreduce 4K\n", "some/dir/my run.trace")
    assert (w.name, w.description, w.source) == ("my run", "", "")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "allreduce 4K\n\n# c\nallredcue 4K\n",
            4,
            "unknown collective 'allredcue' (known: allreduce, reduce_scatter, all_gather)",
        ),
        ("allreduce\n", 1, "allreduce needs a size"),
        ("allreduce 6\n", 1, "size 6 is not a multiple of 4 bytes (a float32 element)"),
        ("allreduce 6 int32\n", 1, "not a multiple of 4 bytes (a int32 element)"),
        ("allreduce 0\n", 1, "bad size '0'"),
        ("allreduce 4T\n", 1, "bad size '4T'"),
        ("allreduce -4\n", 1, "bad size '-4'"),
        ("allreduce 4K float16\n", 1, "unsupported dtype 'float16' (supported: float32, int32)"),
        ("allreduce 4K bf16 grads\n", 1, "unsupported dtype 'bf16'"),
        ("allreduce 4K x0\n", 1, "bad count 'x0'"),
        ("allreduce 4K x1.5\n", 1, "bad count 'x1.5'"),
        (f"allreduce 4K x{MAX_TRACE_CALLS + 1}\n", 1, "bad count"),
        (f"allreduce 4K x{MAX_TRACE_CALLS}\nallreduce 4K\n", 2, "more than"),
        ("# only comments\n\n", 2, "empty trace: no calls"),
        ("", 1, "empty trace: no calls"),
        ("name a\ndescription d\n", 2, "empty trace: no calls"),
        ("allreduce 4K\nname late\n", 2, "'name' line after the first call"),
        ("name a\nname b\nallreduce 4K\n", 2, "duplicate 'name' line (first on line 1)"),
        ("source\nallreduce 4K\n", 1, "'source' line without text"),
    ],
)
def test_errors_are_one_line_naming_file_and_line(text: str, line: int, message: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(text, "trace.txt")
    error = str(info.value)
    assert "\n" not in error
    assert error.startswith(f"trace.txt:{line}: ")
    assert message in error


def test_load_a_user_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.trace"
    path.write_text("\ufeff# mine\nallreduce 1M x3 grads\nall_gather 64K\n", encoding="utf-8")
    w = load_workload(str(path))
    assert w.name == "mine"
    assert [c.nbytes for c in w.calls] == [1 << 20] * 3 + [64 << 10]
    half = load_workload(str(path), scale=0.5)
    assert [c.nbytes for c in half.calls] == [1 << 19] * 3 + [32 << 10]


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"^nope: no such workload .*shipped: ddp-resnet50, "):
        load_workload("nope")
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"allreduce 4K\nallreduce 4K caf\xe9\n")
    with pytest.raises(TraceError, match=rf"^{re.escape(str(bad))}:2: not UTF-8 text"):
        load_workload(str(bad))
    typo = tmp_path / "typo.trace"
    typo.write_text("allreduce 4K\nallreduce 5\n", encoding="utf-8")
    with pytest.raises(
        TraceError, match=rf"^{re.escape(str(typo))}:2: size 5 is not a multiple of 4"
    ):
        load_workload(str(typo))
    with pytest.raises(TraceError, match=rf"^{re.escape(str(tmp_path))}: cannot read"):
        load_workload(str(tmp_path))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_load_every_shipped_name(name: str) -> None:
    assert load_workload(name) == SHIPPED[name]()
    small = load_workload(name, scale=default_scale(SHIPPED[name]()))
    assert [c.label for c in small.calls] == [c.label for c in SHIPPED[name]().calls]


# --- scaling ---------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [0.001, 0.0278, 0.5, 3.0])
def test_scaled_keeps_whole_elements_and_order(factor: float) -> None:
    w = tp_dp_mix()
    s = w.scaled(factor)
    assert all(c.nbytes % 4 == 0 and c.nbytes >= 4 for c in s.calls)
    assert [(c.collective, c.dtype, c.label) for c in s.calls] == [
        (c.collective, c.dtype, c.label) for c in w.calls
    ]
    for old, new in zip(w.calls, s.calls, strict=True):
        assert abs(new.nbytes - old.nbytes * factor) <= 2
    assert (s.name, s.source) == (w.name, w.source)
    assert f"x{factor:g}" in s.description


def test_scaled_never_goes_below_one_element() -> None:
    w = Workload("w", (Call("allreduce", 4), Call("allreduce", 4 << 20)), "", "")
    assert [c.nbytes for c in w.scaled(1e-9).calls] == [4, 4]
    assert w.scaled(1.0) == w
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale factor"):
            w.scaled(bad)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_default_scale_brings_an_iteration_to_the_target(name: str) -> None:
    w = SHIPPED[name]()
    s = w.scaled(default_scale(w))
    assert abs(s.total_bytes - (32 << 20)) <= 4 * len(w.calls)
    assert abs(w.scaled(default_scale(w, 1 << 20)).total_bytes - (1 << 20)) <= 4 * len(w.calls)
    with pytest.raises(ValueError, match="target_bytes"):
        default_scale(w, 0)


# --- validation of constructed values ----------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"collective": "broadcast"}, "unknown collective"),
        ({"nbytes": 0}, "must be positive"),
        ({"nbytes": 10}, "not a multiple of 4"),
        ({"nbytes": 4.0}, "must be an int"),
        ({"nbytes": True}, "must be an int"),
        ({"dtype": "float16"}, "unsupported dtype"),
        ({"label": "two\nlines"}, "one line"),
        ({"label": " padded"}, "one line"),
    ],
)
def test_a_bad_call_is_refused(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"collective": "allreduce", "nbytes": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        Call(**fields)  # type: ignore[arg-type]


def test_a_bad_workload_is_refused() -> None:
    call = Call("allreduce", 8)
    with pytest.raises(ValueError, match="no calls"):
        Workload("w", (), "", "")
    with pytest.raises(ValueError, match="name must not be empty"):
        Workload("", (call,), "", "")
    with pytest.raises(ValueError, match="one line"):
        Workload("w", (call,), "a\nb", "")
    assert COLLECTIVES == ("allreduce", "reduce_scatter", "all_gather")
