"""The kiln backend on a GPU: every lowered op family, the models of the
torch 2 tests, inference and training, against eager CUDA.

Runs on a machine with a CUDA GPU and a kilnd (with NVRTC) at $KILN_SERVER;
tests/gpu/run.sh starts one and runs this file. Skipped where there is no
GPU. Each case compiles with torch.compile(backend=kiln.backend(...)) and
asserts that Dynamo's graphs were compiled by kilnd (no eager fallback), that
the artifacts hold generated CUDA kernels, and that outputs (and gradients)
match eager within a tolerance computed for the dtype.
"""

import os

import pytest
import torch
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEVICE = "cuda"
TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2)}


def _backend(**options):
    # The optimized kernels from the first call (no tiered compile), which
    # every test checks; test_tiered_compile checks the quick ones.
    options.setdefault("tiered", False)
    return kiln.backend(os.environ.get("KILN_SERVER"), on_unavailable="raise", **options)


def _kernels(backend):
    """Generated kernels in the artifacts `backend` loaded."""
    total = 0
    for fn in backend.loaded:
        art = fn.artifact
        for g in (art.compiled, art.compiled_forward, art.compiled_backward):
            total += g.plan.kernels
            for m in g.modules:
                assert m.language == "cuda", m.language
    return total


def _close(got, want, dtype, what):
    rtol, atol = TOL[dtype]
    scale = want.detach().abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol * max(scale, 1.0),
                               msg=lambda m: f"{what}: {m}")


def check(fn, *inputs, training=False, dynamic=None, min_kernels=1, dtype=None, mode=None):
    dtype = dtype or next(t.dtype for t in inputs if t.is_floating_point())
    torch._dynamo.reset()  # the test lambdas share code objects: Dynamo's cache would serve them
    backend = _backend()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic, mode=mode)
    args = [t.detach().clone().requires_grad_(training and t.is_floating_point()) for t in inputs]
    ref_args = [t.detach().clone().requires_grad_(training and t.is_floating_point())
                for t in inputs]
    got = compiled(*args)
    want = fn(*ref_args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for k, (g, w) in enumerate(zip(got, want)):
        _close(g, w, dtype, f"output {k}")
    if training:
        seeds = [torch.randn_like(w) for w in want]
        torch.autograd.backward(got, seeds)
        torch.autograd.backward(want, seeds)
        for k, (a, r) in enumerate(zip(args, ref_args)):
            if r.grad is not None:
                _close(a.grad, r.grad, dtype, f"grad of input {k}")
    torch.cuda.synchronize()
    assert backend.stats["eager"] == 0, backend.stats
    assert backend.stats["graphs"] >= 1, backend.stats
    assert _kernels(backend) >= min_kernels, "no generated CUDA kernel ran"
    return backend


def rand(*shape, dtype=torch.float32, low=None):
    t = torch.randn(*shape, device=DEVICE, dtype=torch.float32)
    if low is not None:
        t = t.abs() + low
    return t.to(dtype)


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _dtype_id(dtype):
    return str(dtype).split(".")[-1]

UNARY = {
    "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 0.5), "sqrt": lambda x: x.abs().sqrt(),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1), "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "relu": F.relu, "abs_neg": lambda x: -x.abs(), "erf": torch.erf, "sin_cos": lambda x:
    torch.sin(x) + torch.cos(x), "floor_ceil": lambda x: torch.floor(x * 4) + torch.ceil(x),
    "reciprocal": lambda x: 1.0 / (x.abs() + 0.5), "log1p_expm1": lambda x:
    torch.log1p(x.abs()) + torch.expm1(x * 0.1), "sign": torch.sign,
    # The exponents computed without pow.
    "pow_special": lambda x: x.pow(1) + x.pow(3) + (x.abs() + 0.5).pow(0.5)
    + (x.abs() + 0.5).pow(-0.5) + (x.abs() + 0.5).pow(-1) + (x.abs() + 0.5).pow(-2),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    op = UNARY[name]
    check(lambda x: op(x) * 2.0 + 1.0, rand(64, 1000, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("name", ["exp", "sigmoid", "gelu", "silu"])
def test_sixteen_bit_approximations_stay_within_an_ulp(name, dtype):
    """16-bit results take kiln_fast's exp, reciprocal and GELU: over the
    whole range that matters (large negative inputs included, where the
    sigmoid's reciprocal nears the float32 underflow), each element is
    within one unit in the last place of eager's, or below the dtype's
    smallest normal."""
    op = UNARY[name]
    x = torch.linspace(-30, 12, 200003, device=DEVICE).to(dtype)
    torch._dynamo.reset()
    got = torch.compile(op, backend=_backend())(x).float()
    want = op(x).float()
    info = torch.finfo(dtype)
    bound = info.eps * want.abs() + info.tiny
    over = (got - want).abs() > bound
    assert not over.any(), (x[over][:5], got[over][:5], want[over][:5])


BINARY = {
    "add_bcast_row": lambda x, y: x + y[0],
    "mul_bcast_col": lambda x, y: x * y[:, :1],
    "div": lambda x, y: x / (y.abs() + 1.0),
    "sub_max_min": lambda x, y: torch.maximum(x, y) - torch.minimum(x, y * 0.5),
    "pow": lambda x, y: torch.pow(x.abs() + 0.1, 1.5) + y,
    "where_cmp": lambda x, y: torch.where(x > y, x, y * 2) + (x <= 0).to(x.dtype),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    op = BINARY[name]
    check(op, rand(128, 513, dtype=dtype), rand(128, 513, dtype=dtype))


REDUCTIONS = {
    "sum_last": lambda x: x.sum(-1),
    "sum_first": lambda x: x.sum(0),
    "sum_middle": lambda x: x.view(16, 32, -1).sum(1),
    "sum_all": lambda x: x.sum(),
    "mean_keepdim": lambda x: x - x.mean(-1, keepdim=True),
    "amax_amin": lambda x: x.amax(-1) - x.amin(-1),
    "var_std": lambda x: x.var(-1) + x.std(0, correction=0).sum(),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x * 2, -1),
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "rms_norm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction(name, dtype):
    check(REDUCTIONS[name], rand(512, 768, dtype=dtype))


@pytest.mark.parametrize("row", [1, 7, 32, 1000, 4096, 30000])
def test_reduction_row_lengths(row):
    check(lambda x: torch.softmax(x, -1) * x.sum(-1, keepdim=True), rand(64, row))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
def test_slices_of_symbolic_sizes(dtype):
    """x[:, 1:] under dynamic=True: sizes Max(1, s - 1) in a symbolic plan."""
    def fn(x):
        return torch.softmax(x[:, 1:] * 2, -1) + x[:, :-1].exp()
    backend = check(fn, rand(64, 1000, dtype=dtype), dynamic=True)
    assert backend.stats["compiles"] == 1, backend.stats


VIEWS = {
    "transpose": lambda x: x.t() * 2 + 1,
    "permute": lambda x: x.view(8, 64, 768).permute(2, 0, 1).exp(),
    "expand": lambda x: x[:1].expand(512, 768) + x,
    "slice": lambda x: x[::2, 10:500].sigmoid(),
    "cat_like": lambda x: (x.view(512, 2, 384)[:, 0] * x.view(512, 2, 384)[:, 1]).sum(-1),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views(name):
    check(VIEWS[name], rand(512, 768))


# Pointwise kernels whose output keeps a transposed input's memory order
# (eager's layout for x.t() * 2 + b): vectors along the output's fastest
# dimension, which is not the kernel's last one.
ORDERED = {
    "transpose_bcast": (lambda x, b: x.t() * 2.0 + b, (512, 256), (512,)),
    "transpose_odd": (lambda x, b: x.t() * 2.0 + b, (96, 130), (96,)),
    "permute3_bcast": (lambda x, b: x.permute(1, 0, 2) * b + 1.0, (64, 32, 48), (48,)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(ORDERED))
def test_ordered_pointwise(name, dtype):
    fn, xs, bs = ORDERED[name]
    check(fn, rand(*xs, dtype=dtype), rand(*bs, dtype=dtype))


SYMBOLIC_ROWS = {
    "softmax": lambda x: torch.softmax(x * 1.5, -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]) * 2.0,
    "sum": lambda x: x.sum(-1),
    "var_mean": lambda x: torch.var_mean(x, -1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(SYMBOLIC_ROWS))
def test_rows_of_symbolic_length(name, dtype):
    # Rows of symbolic length are swept in vectors with a tail: a length the
    # vector width divides, and one it does not (rows that start unaligned:
    # element accesses, checked as the kernel runs).
    fn = SYMBOLIC_ROWS[name]
    check(fn, rand(48, 1024, dtype=dtype), dynamic=True)
    check(fn, rand(48, 1027, dtype=dtype), dynamic=True)


@pytest.mark.parametrize("name", sorted(ORDERED))
def test_ordered_pointwise_symbolic(name):
    # Symbolic sizes: the output's dimension of stride 1 still goes fastest.
    fn, xs, bs = ORDERED[name]
    check(fn, rand(*xs), rand(*bs), dynamic=True)


def test_dynamic_batch():
    torch._dynamo.reset()
    backend = _backend()
    fn = torch.compile(lambda x, w: F.layer_norm(x, (x.shape[-1],), w) * torch.sigmoid(x),
                       backend=backend, dynamic=True)
    w = rand(256)
    for batch in (3, 17, 64, 1000):
        x = rand(batch, 256)
        _close(fn(x, w), F.layer_norm(x, (256,), w) * torch.sigmoid(x), torch.float32,
               f"batch {batch}")
    assert backend.stats["eager"] == 0


def _offset_by_one(shape, dtype):
    """A tensor of `shape` that starts one element into its storage: no
    vector access of 16 bytes is aligned in it."""
    n = 1
    for d in shape:
        n *= d
    return rand(n + 1, dtype=dtype)[1:].view(shape)


MISALIGNED = {
    "pointwise": (lambda x, b: torch.relu(x) * 2.0 + b, (256, 1024)),
    "layer_norm": (lambda x, b: F.layer_norm(x, x.shape[-1:], b) * 2.0, (256, 1024)),
    "softmax": (lambda x, b: torch.softmax(x + b, -1), (256, 1024)),
    "column_sum": (lambda x, b: (x * b).sum(0), (8192, 1024)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(MISALIGNED))
def test_inputs_that_start_unaligned(name, dtype):
    # Kernels read and write 16-byte vectors on the assumption that every
    # buffer starts aligned; a graph compiled on aligned inputs is given
    # inputs one element into their storage, which the launcher copies.
    fn, shape = MISALIGNED[name]
    torch._dynamo.reset()
    backend = _backend()
    compiled = torch.compile(fn, backend=backend)
    for x, b in ((rand(*shape, dtype=dtype), rand(shape[-1], dtype=dtype)),
                 (_offset_by_one(shape, dtype), _offset_by_one((shape[-1],), dtype))):
        assert x.storage_offset() == 0 or x.data_ptr() % 16 != 0
        _close(compiled(x, b), fn(x, b), dtype, f"storage offset {x.storage_offset()}")
    assert backend.stats["eager"] == 0, backend.stats
    assert _kernels(backend) >= 1


def test_a_kernel_writes_an_unaligned_buffer_through_a_copy():
    # A plan made by hand from a compiled one: the kernel's output, which
    # the plan allocated, becomes a second input, one element into its
    # storage. The launcher runs the kernel on an aligned copy of it and
    # copies the kernel's writes back; the element before it is kept.
    from kiln.v1 import artifact_pb2

    def fn(x):
        return x * 2.0 + 1.0
    torch._dynamo.reset()
    backend = _backend()
    x = rand(256, 1024)
    torch.compile(fn, backend=backend)(x)
    artifact = backend.loaded[-1].artifact
    graph = artifact_pb2.CompiledGraph()
    graph.CopyFrom(artifact.compiled)
    plan = graph.plan
    allocs = [k for k, step in enumerate(plan.steps) if step.WhichOneof("kind") == "alloc"]
    launches = [step.launch for step in plan.steps if step.WhichOneof("kind") == "launch"]
    assert len(allocs) == 1 and len(launches) == 1, plan
    alloc, launch = plan.steps[allocs[0]].alloc, launches[0]
    out = list(launch.buffers).index(alloc.value)
    assert launch.alignment[out] == 16 and launch.written[out], launch
    given = plan.inputs.add()
    given.value.name = alloc.value
    given.value.meta.dtype = alloc.dtype
    given.value.meta.sizes.extend(alloc.sizes)
    given.value.meta.strides.extend(alloc.strides)
    given.value.meta.device.CopyFrom(alloc.device)
    del plan.steps[allocs[0]]
    runner = kiln.PlanRunner(graph, artifact.target.sm_arch)
    base = torch.full((256 * 1024 + 1,), -7.0, device=DEVICE)
    y = base[1:].view(256, 1024)
    assert y.data_ptr() % 16 != 0
    runner.run([x, y])
    torch.cuda.synchronize()
    torch.testing.assert_close(y, fn(x))
    assert base[0].item() == -7.0


def test_unaligned_input_mutated_in_place():
    # An input one element into its storage, written in place: the graph's
    # new value is copied back into it (by the backend's wrapper), and the
    # element before it is kept.
    def fn(x):
        x.mul_(2.0).add_(1.0)
        return x.sum(-1)
    torch._dynamo.reset()
    backend = _backend()
    compiled = torch.compile(fn, backend=backend)
    base = rand(256 * 1024 + 1)
    want_base = base.clone()
    got = compiled(base[1:].view(256, 1024))
    want = fn(want_base[1:].view(256, 1024))
    _close(got, want, torch.float32, "sums")
    _close(base, want_base, torch.float32, "the mutated input")
    assert base[0].item() == want_base[0].item()
    assert backend.stats["eager"] == 0, backend.stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
def test_training_layernorm_gelu(dtype):
    def fn(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)).sum(-1)
    check(fn, rand(256, 512, dtype=dtype), rand(512, dtype=dtype), rand(512, dtype=dtype),
          training=True)


def test_training_softmax_cross_entropy():
    def fn(x, target_onehot):
        return -(torch.log_softmax(x, -1) * target_onehot).sum(-1).mean()
    onehot = F.one_hot(torch.randint(0, 1000, (128,), device=DEVICE), 1000).float()
    check(fn, rand(128, 1000), onehot, training=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((8, 4096), -1), ((4, 40000), -1),
                                       ((300, 24), 0)], ids=["odd", "registers", "long", "dim0"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_backward_is_generated(log, shape, dim, dtype):
    """Softmax's and log-softmax's backward run as generated kernels, not
    ATen's: rows kept in registers, long rows swept in a loop, odd lengths,
    and a softmax over the first dim."""
    op = torch.log_softmax if log else torch.softmax

    def fn(x):
        return op(x * 1.5, dim) * 2.0

    backend = check(fn, rand(*shape, dtype=dtype), training=True)
    traces = [text for f in backend.loaded for name, text in f.artifact.trace.items()
              if name.endswith("ir_after_fusion.txt")]
    assert traces and not any("softmax_backward_data.default) runs through ATen" in t
                              for t in traces), traces


def _splits(backend):
    """Reduction kernels the loaded artifacts split (compiler/loop/split_reductions.h)."""
    return sum(text.count("\nsplit: ") for fn in backend.loaded
               for name, text in fn.artifact.trace.items()
               if name.endswith("ir_after_fusion.txt"))


def _tune_lines(backend):
    """The autotuner's decisions in the loaded artifacts (compiler/codegen/cuda_tuner.h)."""
    return [line for fn in backend.loaded for name, text in fn.artifact.trace.items()
            if name.endswith("ir_after_fusion.txt")
            for line in text.splitlines() if line.startswith("tune: ")]


def test_autotuning_times_block_sizes_once_per_kernel():
    # mode="max-autotune" asks kilnd on the GPU machine (--autotune=auto) to
    # tune: every candidate is timed, the result is right, and the same
    # kernel in another graph (a different function, the same sizes) takes
    # the choice without timing. The default mode tunes nothing.
    def softmax(x):
        return torch.softmax(x * 1.5, -1)
    plain = check(softmax, rand(2048, 4096))
    assert _tune_lines(plain) == [], _tune_lines(plain)
    backend = check(softmax, rand(2048, 4096), mode="max-autotune-no-cudagraphs")
    lines = _tune_lines(backend)
    assert any(" ms" in line and "1024: " in line for line in lines), lines
    tuned = [line for line in lines if "block " in line and "(tuned before)" not in line]
    assert tuned, lines
    assert backend.loaded[0].key != plain.loaded[0].key  # cached apart

    def softmax_and_matmul(y, w):
        return torch.softmax(y * 1.5, -1), y @ w
    again = check(softmax_and_matmul, rand(2048, 4096), rand(4096, 64),
                  mode="max-autotune-no-cudagraphs")
    assert any("(tuned before)" in line for line in _tune_lines(again)), _tune_lines(again)


SPLIT = {
    "column_sum": (lambda x: x.sum(0) * 2.0, (32768, 256)),
    "channel_sum": (lambda x: x.sum((0, 2, 3)), (64, 8, 32, 32)),
    "column_amax_amin": (lambda x: x.amax(0) - x.amin(0), (32768, 128)),
    "column_mean_epilogue": (lambda x: torch.sqrt(x.mean(0).abs() + 1.0), (16384, 64)),
    # Columns that leave the last block's groups of 32 partly idle.
    "column_sum_ragged": (lambda x: x.sum(0) + x.amax(0), (8192, 1000)),
    "column_var_ragged": (lambda x: x.var(0) + x.mean(0), (8192, 999)),
    # Columns read as vectors beside a per-row value read per element, and
    # through a view 4 elements into each row (a float32 vector's boundary,
    # not a bfloat16 one's).
    "column_sum_row_scaled": (lambda x: (x * x.mean(1, keepdim=True)).sum(0), (16384, 512)),
    "column_sum_offset_view": (lambda x: x[:, 4:].sum(0), (16384, 516)),
    "welford_rows": (lambda x: x.var(-1) + x.mean(-1), (8, 65536)),
    "batch_norm_normalize": (lambda x: (x - x.mean((0, 2, 3), keepdim=True)) * torch.rsqrt(
        x.var((0, 2, 3), correction=0, keepdim=True) + 1e-5), (64, 8, 64, 64)),
    "row_sum_then_divide": (lambda x: x.exp() / x.exp().sum(-1, keepdim=True), (16, 65536)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(SPLIT))
def test_split_reduction(name, dtype):
    fn, shape = SPLIT[name]
    backend = check(fn, rand(*shape, dtype=dtype))
    assert _splits(backend) >= 1, "the reduction was not split"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("channels", [8, 32, 48, 64])
def test_channels_last_mean_over_pixels(channels, dtype):
    """A mean over H and W of a channels-last tensor (a conv net's pooling):
    narrow rows, a pixel's channels and then the next pixel's, where they
    make a power of two of 16-byte chunks (not 48 channels); an odd batch
    and odd sizes, with a per-channel scale in the sweep."""
    x = rand(5, channels, 33, 31, dtype=dtype).to(memory_format=torch.channels_last)
    scale = rand(1, channels, 1, 1, dtype=dtype)
    backend = check(lambda t, w: (t * w).mean((2, 3)), x, scale, dynamic=False)
    sources = [m.source for fn in backend.loaded for m in fn.artifact.compiled.modules]
    narrow = any("kiln_narrow_column_reduce<" in text for text in sources)
    assert narrow == (channels != 48), sources


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
def test_split_reduction_rmsnorm_weight_gradient(dtype):
    """The weight's gradient sums over 16384 rows of 512 columns: split."""
    def fn(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    backend = check(fn, rand(16384, 512, dtype=dtype), rand(512, dtype=dtype), training=True)
    assert _splits(backend) >= 1, "the weight gradient was not split"


# Models (the torch 2 tests' kinds), on the GPU.

def _extern_targets(backend):
    """The ops the loaded artifacts' plans run through ATen."""
    targets = []
    for fn in backend.loaded:
        art = fn.artifact
        for g in (art.compiled, art.compiled_forward, art.compiled_backward):
            targets += [p.extern_call.node.target for p in g.plan.steps
                        if p.WhichOneof("kind") == "extern_call"]
    return targets


def _reversed(backend):
    """The sweep-order pass's decisions in the loaded artifacts' traces."""
    return [line for fn in backend.loaded for part, text in fn.artifact.trace.items()
            if part.endswith("ir_after_fusion.txt")
            for line in text.splitlines() if line.startswith("reverse: ")]


# A kernel right after the matmul or convolution whose output it reads
# sweeps its rows from the last to the first (compiler/loop/sweep_order.h):
# one case per layout, at sizes that leave partial chunks and tiles.
AFTER_EXTERN = {
    "pointwise": (lambda a, b: F.gelu(a @ b), [(257, 96), (96, 130)]),
    "rows": (lambda a, b: torch.softmax(a @ b, -1), [(1000, 64), (64, 1030)]),
    "columns": (lambda a, b: (a @ b).sum(0), [(999, 64), (64, 130)]),
    "column_groups": (lambda a, b: (a @ b).sum(0), [(4096, 64), (64, 1000)]),
    "narrow_columns": (lambda x, w: F.conv2d(x, w, padding=1).mean((2, 3)),
                       [(5, 8, 33, 31), (32, 8, 3, 3)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("name", sorted(AFTER_EXTERN))
def test_kernels_after_an_extern_sweep_in_reverse(name, dtype):
    fn, shapes = AFTER_EXTERN[name]
    inputs = [rand(*shape, dtype=dtype) for shape in shapes]
    if name == "narrow_columns":
        inputs = [t.to(memory_format=torch.channels_last) for t in inputs]
    backend = check(fn, *inputs, dynamic=False)
    assert _reversed(backend), "no kernel was reversed"


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("activation", ["gelu_tanh", "relu"])
def test_a_linear_layers_activation_is_its_gemms_epilogue(activation, dtype, training):
    """Without gradients, a linear layer's tanh GELU (through the view back
    to [B, L, N]) runs as cuBLASLt's epilogue of the 16-bit GEMM
    (aten._addmm_activation); a training graph keeps the product, which
    the GELU's gradient reads. A ReLU stays a kernel of its own (NaN stays
    NaN), and so does a float32 GELU (cuBLASLt's float32 epilogue is a
    kernel of its own)."""
    def fn(x, w, b):
        y = F.linear(x, w, b)
        return (F.gelu(y, approximate="tanh") if activation == "gelu_tanh" else F.relu(y)) * 2

    x, w, b = rand(4, 33, 96, dtype=dtype), rand(200, 96, dtype=dtype), rand(200, dtype=dtype)
    backend = check(fn, x, w, b, training=training, min_kernels=0)
    targets = _extern_targets(backend)
    fused = activation == "gelu_tanh" and not training and dtype != torch.float32
    assert ("aten._addmm_activation.default" in targets) == fused, targets


def _softmax_attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("shape", [(2, 4, 128, 64), (3, 96, 32)], ids=["heads", "batched"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_softmax_attention_is_one_fused_kernel(dtype, shape):
    q, k, v = (rand(*shape, dtype=dtype) for _ in range(3))
    backend = check(_softmax_attention, q, k, v, min_kernels=0)
    targets = _extern_targets(backend)
    fused = ("aten._scaled_dot_product_efficient_attention.default" if dtype == torch.float32
             else "aten.scaled_dot_product_attention.default")
    assert targets.count(fused) == 1, targets
    assert "aten.bmm.default" not in targets, targets


@pytest.mark.parametrize("shape", [(2, 4, 100, 32), (2, 4, 96, 128), (3, 80, 64)],
                         ids=["heads", "head_dim_128", "batched"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_softmax_attention_training_is_fused_both_ways(dtype, shape):
    """Training: flash attention in 16-bit, with ATen's backward of it;
    float32 keeps the matmuls (memory-efficient attention and the copies its
    layouts take are slower there); gradients of q, k and v against
    eager's."""
    q, k, v = (rand(*shape, dtype=dtype) for _ in range(3))
    backend = check(_softmax_attention, q, k, v, training=True, min_kernels=0)
    targets = _extern_targets(backend)
    if dtype == torch.float32:
        assert not any("attention" in t for t in targets), targets
        assert "aten.bmm.default" in targets, targets
        return
    assert targets.count("aten._flash_attention_forward.default") == 1, targets
    assert targets.count("aten._flash_attention_backward.default") == 1, targets
    assert "aten.bmm.default" not in targets, targets


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_wide_heads_stay_matmuls_over_a_transposed_view(training):
    """float32 heads of 192 (Attention(768) has 4): no memory-efficient
    attention, whose one kernel for them is slower than the matmuls; k^T is
    copied along memory and read by bmm as a transposed view."""
    torch.manual_seed(0)
    model = Attention(768).to(DEVICE)
    backend = check(model, rand(2, 128, 768), training=training)
    targets = _extern_targets(backend)
    assert "aten.bmm.default" in targets, targets
    assert not any("attention" in t for t in targets), targets
    traces = [part for fn in backend.loaded for part in fn.artifact.trace]
    assert any(part.endswith("matmul_layouts_graph.txt") for part in traces), traces


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_attention_output_is_read_where_the_kernel_wrote_it(dtype):
    """Inference: the fused attention kernel's output is copied neither into
    the [B, H, L, D] layout of the matmul it replaced nor back into
    [B, L, H, D] for the output projection; the projection reads it as the
    kernel wrote it. Output against eager's."""
    torch.manual_seed(0)
    model = Attention(256).to(DEVICE, dtype).eval().requires_grad_(False)
    x = rand(4, 64, 256, dtype=dtype)
    backend = check(model, x, min_kernels=0)
    graphs = [text for fn in backend.loaded for part, text in fn.artifact.trace.items()
              if part.endswith("elide_copies_graph.txt")]
    assert len(graphs) == 1, [part for fn in backend.loaded for part in fn.artifact.trace]
    assert "aten.clone.default" not in graphs[0], graphs[0]
    assert any("attention" in t for t in _extern_targets(backend))


class MLP(torch.nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class RMSNorm(torch.nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    """A GPT-2 block."""

    def __init__(self, d=256):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.attn = Attention(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(approximate="tanh"),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ConvNet(torch.nn.Module):
    """ResNet-18-style: conv, batch norm, relu, a residual block, pooling."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(32)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(32)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(y + self.bn2(self.conv2(y)))
        return self.fc(y.mean((2, 3)))


class CausalLM(torch.nn.Module):
    """A language model's step: RMSNorm (nn.RMSNorm), causal SDPA, a SiLU
    MLP, and the per-token cross-entropy with label smoothing against
    targets of its own (cross_entropy's gather and in-place copy)."""

    def __init__(self, d=128, heads=4, vocab=500, tokens=4 * 32):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.heads = heads
        self.register_buffer("target", torch.randint(0, vocab, (tokens,)))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        x = x + self.down(F.silu(self.up(self.norm2(x))))
        logits = self.head(x).reshape(b * t, -1)
        return F.cross_entropy(logits, self.target, reduction="none", label_smoothing=0.1)


class UpsampleNet(torch.nn.Module):
    """Group norm, nearest upsampling (index with two index tensors),
    instance norm, ELU and Mish, adaptive average and max pooling to sizes
    that do not divide the input's, and a cumulative sum."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.group = torch.nn.GroupNorm(4, 16)
        self.fc = torch.nn.Linear(16 * 3 * 5 + 16 * 2 * 2, 10)

    def forward(self, x):
        y = F.elu(self.group(self.conv(x)))
        y = F.instance_norm(F.interpolate(y, scale_factor=2, mode="nearest"))
        y = F.mish(y)
        avg = F.adaptive_avg_pool2d(y, (3, 5)).flatten(1)
        top = F.adaptive_max_pool2d(y, (2, 2)).flatten(1)
        return torch.cumsum(self.fc(torch.cat([avg, top], 1)), 1)


MODELS = {
    "causal_lm": (CausalLM, (4, 32, 128)),
    "upsample_net": (UpsampleNet, (4, 3, 15, 17)),
    "mlp": (MLP, (64, 256)),
    "rmsnorm": (RMSNorm, (256, 512)),
    "attention": (Attention, (4, 64, 256)),
    "gpt2_block": (Block, (4, 64, 256)),
    "convnet": (ConvNet, (8, 3, 32, 32)),
}


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model(name, training):
    cls, shape = MODELS[name]
    _check_model(name, cls, shape, training)


def _check_model(name, cls, shape, training):
    """`cls` compiled by kiln against eager: outputs, and in training the
    parameters' gradients and the buffers. Returns the backend."""
    torch.manual_seed(0)
    model = cls().to(DEVICE)
    ref = cls().to(DEVICE)
    ref.load_state_dict(model.state_dict())
    if not training:
        model.eval()
        ref.eval()
    torch._dynamo.reset()
    backend = _backend()
    compiled = torch.compile(model, backend=backend)
    _step_against_eager(compiled, model, ref, shape, training, name)
    if training:
        for (bname, b), (_, c) in zip(model.named_buffers(), ref.named_buffers()):
            _close(b.float(), c.float(), torch.float32, f"{name} buffer {bname}")
    torch.cuda.synchronize()
    assert backend.stats["eager"] == 0, backend.stats
    # Attention's inference graph is matmuls and the fused attention kernel
    # through ATen alone: nothing is left to generate.
    assert _kernels(backend) >= (0 if name == "attention" and not training else 1)
    return backend


def _step_against_eager(compiled, model, ref, shape, training, what):
    """One call of `compiled` (of `model`) and of `ref` on fresh inputs of
    `shape`: the outputs, and in training the parameters' gradients after a
    backward of the same random seed, compared."""
    x = rand(*shape)
    with torch.set_grad_enabled(training):
        got, want = compiled(x), ref(x)
    _close(got, want, torch.float32, f"{what} output")
    if training:
        seed = torch.randn_like(want)
        got.backward(seed)
        want.backward(seed)
        for (pname, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            _close(p.grad, q.grad, torch.float32, f"{what} grad of {pname}")


def _nvrtc_commands(function):
    a = function.artifact
    return [m.compile_command for g in (a.compiled, a.compiled_forward, a.compiled_backward)
            for m in g.modules]


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", ["gpt2_block", "convnet", "rmsnorm"])
def test_tiered_compile(name, training):
    """The default on CUDA: the first step runs the graphs through ATen
    (kilnd's quick artifact compiles no kernel), the next ones the optimized
    kernels that replace them; every step matches eager, in a namespace of
    its own so that nothing is cached yet."""
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model, ref = cls().to(DEVICE), cls().to(DEVICE)
    ref.load_state_dict(model.state_dict())
    model.train(training)
    ref.train(training)
    torch._dynamo.reset()
    backend = kiln.backend(os.environ.get("KILN_SERVER"), on_unavailable="raise",
                           namespace=f"tiered-{name}-{training}")
    compiled = torch.compile(model, backend=backend)
    for step in range(3):
        _step_against_eager(compiled, model, ref, shape, training, f"{name}, step {step}")
        for p, q in zip(model.parameters(), ref.parameters()):
            p.grad = q.grad = None
        if step == 0:
            assert backend.wait_for_upgrades(timeout=300)
    torch.cuda.synchronize()
    graphs = backend.stats["graphs"]
    assert backend.stats["quick"] == graphs and backend.stats["upgrades"] == graphs, backend.stats
    quick = [f for f in backend.loaded if getattr(f, "superseded", False)]
    optimized = [f for f in backend.loaded if not getattr(f, "superseded", False)]
    assert len(quick) == len(optimized) == graphs
    for f in quick:
        assert f.backend == ("aot_eager" if training else "eager"), f.backend
        assert not _nvrtc_commands(f)
    assert any(_nvrtc_commands(f) for f in optimized)
    for f in optimized:
        assert f.backend == "kiln"
        assert not any("--fast-compile" in c for c in _nvrtc_commands(f)), _nvrtc_commands(f)


class Stack(torch.nn.Module):
    """Six GPT-2 blocks: the middle ones share their kernels."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block(128) for _ in range(6)])

    def forward(self, x):
        return self.blocks(x)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_identical_blocks_share_kernels(training):
    """Kernels of the same code compiled once and launched once per block,
    each launch on its own tensors: outputs and gradients as eager's."""
    backend = _check_model("stack", Stack, (2, 64, 128), training)
    launched = compiled_kernels = 0
    for fn in backend.loaded:
        art = fn.artifact
        for g in (art.compiled, art.compiled_forward, art.compiled_backward):
            symbols = [(s.launch.module, s.launch.symbol) for s in g.plan.steps
                       if s.WhichOneof("kind") == "launch"]
            launched += len(symbols)
            compiled_kernels += len(set(symbols))
    assert 0 < compiled_kernels < launched, (compiled_kernels, launched)


def test_arch_mismatch_is_refused():
    """The runtime refuses CUBINs for an arch this GPU cannot run, naming
    both, when they would load (the first run on the device)."""
    backend = _backend()
    x = rand(64, 32)
    torch.compile(lambda t: (t * 2).relu(), backend=backend)(x)
    compiled = backend.loaded[-1].artifact.compiled
    assert compiled.modules and compiled.modules[0].language == "cuda"
    major, minor = torch.cuda.get_device_capability()
    runner = kiln.PlanRunner(compiled, sm_arch=f"sm_{major + 1}0")
    with pytest.raises(NotImplementedError,
                       match=f"compiled for sm_{major + 1}0, but cuda:0 is sm_{major}{minor}"):
        runner.run([x])
    with pytest.raises(ValueError, match="not an SM arch"):
        kiln.PlanRunner(compiled, sm_arch="gfx90a")


def test_convnet_bfloat16_training():
    """Batch norm over bfloat16: torch computes the new running statistics in
    float32 and copies them back into the bfloat16 buffers."""
    torch.manual_seed(0)
    model = ConvNet().to(DEVICE, torch.bfloat16)
    ref = ConvNet().to(DEVICE, torch.bfloat16)
    ref.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    backend = _backend()
    x = rand(8, 3, 32, 32, dtype=torch.bfloat16)
    got = torch.compile(model, backend=backend)(x)
    want = ref(x)
    _close(got, want, torch.bfloat16, "output")
    got.float().sum().backward()
    want.float().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        _close(p.grad, q.grad, torch.bfloat16, f"grad of {name}")
    for (name, b), (_, c) in zip(model.named_buffers(), ref.named_buffers()):
        _close(b.float(), c.float(), torch.bfloat16, f"buffer {name}")
    assert backend.stats["eager"] == 0, backend.stats


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_dtype_id)
def test_convnet_16bit_inference_runs_channels_last(dtype):
    """kilnd's conv-layouts pass: the first convolution's input and both
    convolutions' weights are copied channels-last by the plan's kernels,
    so that both convolutions and the kernels between them run NHWC; the
    output (contiguous, as eager's) matches eager's, also for a batch of
    another size (a second graph, of a symbolic batch)."""
    torch.manual_seed(0)
    model = ConvNet().to(DEVICE, dtype).eval()
    torch._dynamo.reset()
    backend = _backend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for shape in ((8, 3, 32, 32), (5, 3, 32, 32)):
            x = rand(*shape, dtype=dtype)
            _close(compiled(x), model(x), dtype, f"output of {shape}")
    assert backend.stats["eager"] == 0, backend.stats
    assert backend.loaded
    for fn in backend.loaded:
        rewritten = fn.artifact.trace["conv_layouts_graph.txt"]
        assert rewritten.count("memory_format=torch.channels_last") == 3, rewritten


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reduce_overhead_replays_cuda_graphs(name):
    """mode="reduce-overhead": the plan runs once, is captured on the next
    call and replayed after; every call matches eager, results stay valid
    after later calls, and a parameter changed in place is seen."""
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().to(DEVICE).eval()
    torch._dynamo.reset()
    backend = _backend()
    compiled = torch.compile(model, backend=backend, mode="reduce-overhead")
    results = []
    with torch.no_grad():
        for _ in range(5):
            x = rand(*shape)
            results.append((compiled(x), model(x)))
        for i, (got, want) in enumerate(results):
            _close(got, want, torch.float32, f"{name} call {i}")
        p = next(model.parameters())
        p.mul_(0.5)
        x = rand(*shape)
        _close(compiled(x), model(x), torch.float32, f"{name} after a parameter changed")
    torch.cuda.synchronize()
    assert backend.stats["eager"] == 0, backend.stats
    assert backend.cuda_graphed, "no graph was replayed"
    assert sum(g.replays for g in backend.cuda_graphed) >= 4 * len(backend.cuda_graphed)


def test_accuracy_minifier_on_cuda():
    """kiln.minify_accuracy where the CUDA runtime runs: an injected wrong
    value in relu's generated code, found among the graph's nodes."""
    from kiln.v1 import service_pb2

    x = rand(64, 32)
    graph = kiln.capture(lambda x: torch.relu(torch.tanh(x) * 2 - 0.5) * 3 + torch.sigmoid(x),
                         x, name="cuda_chain")
    options = service_pb2.CompileOptions(backend="kiln")
    options.options.add(name="inject_fault", value="accuracy:aten.relu.default")
    with kiln.Client(os.environ.get("KILN_SERVER")) as client:
        small = kiln.minify_accuracy(graph, None, client, options)
    targets = [n.target for n in small.graph.nodes]
    assert "aten.relu.default" in targets and len(targets) <= 3, targets
    assert small.inputs[0].is_cuda
