"""Random programs through the `kiln` backend against eager PyTorch.

A program is a chain of pointwise ops, broadcasting binary ops, reductions
(sum, mean, amax, var, softmax, log_softmax over any dim, kept or not; layer
norm) and views (transpose, reshape, unsqueeze, strided slice, expand, cat,
a reversed permute), each reading any earlier value. The programs come from
fixed seeds, so a failure names one that can be built again; their inputs
are fresh random values on every run, from a generator whose seed the
failure names too. Shapes include rows of one element, rows longer than the
kernels' fold blocks, and broadcasting partners.

Every program is compiled with kiln.compile (torch.compile with a kiln
backend) through a real kilnd (the binary named by $KILND, started once for
the class) and compared with eager on the same values: a call with other
values of the example's shapes runs the graph compiled for it.
For inference, programs also convert between dtypes and do integer and
boolean arithmetic, and eager runs in float32 as the program says. For
training, eager runs in float64 and the gradients of a randomly weighted
sum of the output are compared too (float64, because eager float32 is not
always right here: this libtorch's float32 gelu_backward is wrong when its
grad is strided and its input is not, as for gelu(x).transpose(-1, -2)).
"""

import os
import random
import sys
import unittest

import torch
import torch.nn.functional as F

import kiln
from kiln import tracer
from kiln.v1 import artifact_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_server  # noqa: E402
import test_training  # noqa: E402

KILND = os.environ.get("KILND")
PROGRAMS = 24  # per mode; each compile runs g++ once or twice
RTOL, ATOL = 1e-3, 1e-3  # chains of ops amplify float32 rounding differences

UNARY = {
    "exp": lambda t: torch.exp(t.clamp(-10, 10)),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "neg": torch.neg,
    "clamp": lambda t: t.clamp(-0.5, 0.7),
    "affine": lambda t: t * 2.5 + 1.0,
    "sin": torch.sin,
    "rsqrt": lambda t: torch.rsqrt(t.abs() + 1),
    "square": lambda t: t.pow(2),
    "leaky": lambda t: torch.where(t > 0, t, t * 0.1),
    "log": lambda t: torch.log(t.abs() + 1),
}
# Conversions and integer and boolean arithmetic, of the inputs: inference
# only (they have no gradient), compared with eager in float32, which rounds
# and truncates exactly as the compiled code must.
CASTS = {
    "to_double": lambda t: t.double() * 1.5,
    "bfloat16_round_trip": lambda t: t.bfloat16().float(),
    "half_round_trip": lambda t: t.half().float(),
    "truncate": lambda t: (t * 3).long().float(),
    "mask": lambda t: (t > 0.1).float() + t,
    "integer_ops": lambda t: ((t * 10).long() % 7 - (t * 10).long() // 3).float(),
    "boolean_ops": lambda t: ((t > 0) & (t < 0.5) | (t < -1)).float(),
    "floor_divide": lambda t: torch.div(t * 4, 1.5, rounding_mode="floor"),
    "round": lambda t: torch.round(t * 3),
}
BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "sub": torch.sub,
    "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda a, b: torch.where(a > b, a, b * 2),
}
SHAPES = [
    [(4, 6, 8)], [(4, 6, 8), (8,)], [(4, 6, 8), (6, 1)], [(12, 16), (16,)],
    [(3, 5, 7), (3, 5, 1)], [(2, 3, 4, 5)], [(64, 40)], [(3, 5000)],
    [(2, 3000), (3000,)], [(40, 33)], [(6, 1), (1, 7)],
]


def reduction(rng, t):
    """A reduction of t over one random dim, and its name."""
    dim = rng.randrange(t.dim()) - t.dim()
    keep = rng.random() < 0.5
    kind = rng.choice(["sum", "mean", "amax", "var", "softmax", "log_softmax", "layer_norm"])
    if kind == "var" and t.shape[dim] < 2:
        kind = "sum"  # no degrees of freedom: NaN
    ops = {
        "sum": lambda t: t.sum(dim, keepdim=keep),
        "mean": lambda t: t.mean(dim, keepdim=keep),
        "amax": lambda t: t.amax(dim, keepdim=keep),
        "var": lambda t: t.var(dim, keepdim=keep),
        "softmax": lambda t: torch.softmax(t, dim),
        "log_softmax": lambda t: torch.log_softmax(t, dim),
        "layer_norm": lambda t: F.layer_norm(t, t.shape[-1:]),
    }
    return ops[kind], f"{kind}(dim={dim}, keepdim={keep})"


def view(rng, t):
    """A view (or copy) of t that reorders, regroups or repeats it."""
    sizes = list(t.shape)
    choices = ["unsqueeze", "expand", "cat"]
    if t.dim() >= 2:
        choices += ["transpose", "flatten", "permute"]
        if sizes[-2] % 2 == 0:
            choices.append("regroup")
    if sizes[-1] > 1:
        choices.append("slice")
    kind = rng.choice(choices)
    ops = {
        "unsqueeze": lambda t: t.unsqueeze(0),
        "expand": lambda t: t.expand(2, *t.shape) * 1.5,
        "cat": lambda t: torch.cat([t, t * 2], dim=-1),
        "transpose": lambda t: t.transpose(-1, -2),
        "flatten": lambda t: t.reshape(-1, t.shape[-1]),
        "permute": lambda t: t.permute(*reversed(range(t.dim()))).contiguous(),
        "regroup": lambda t: t.reshape(*t.shape[:-2], t.shape[-2] // 2, 2 * t.shape[-1]),
        "slice": lambda t: t[..., ::2],
    }
    return ops[kind], kind


class Program:
    """Steps (fn, operand indices) over the inputs and the values before."""

    def __init__(self, seed, casts=False):
        rng = random.Random(seed)
        unary = {**UNARY, **CASTS} if casts else UNARY
        self.seed = seed
        self.shapes = rng.choice(SHAPES)
        self.steps = []
        values = [torch.randn(s) for s in self.shapes]
        self.names = [f"x{i}{list(s)}" for i, s in enumerate(self.shapes)]
        for _ in range(rng.randrange(2, 8)):
            a = rng.randrange(len(values))
            kind = rng.choice(["unary", "unary", "binary", "reduction", "view"])
            if values[a].dim() == 0 and kind in ("reduction", "view"):
                kind = "unary"
            if kind == "binary":
                partners = [b for b, v in enumerate(values) if _broadcasts(values[a], v)]
                b = rng.choice(partners)
                name = rng.choice(sorted(BINARY))
                fn, args, label = BINARY[name], (a, b), name
            elif kind == "unary":
                name = rng.choice(sorted(unary))
                if name in CASTS:
                    # Of an input: a value one ulp off eager's (a kernel's
                    # erf against ATen's) may round or truncate the other way.
                    a = rng.randrange(len(self.shapes))
                fn, args, label = unary[name], (a,), name
            else:
                fn, label = (reduction if kind == "reduction" else view)(rng, values[a])
                args = (a,)
            values.append(fn(*(values[i] for i in args)))
            self.steps.append((fn, args))
            self.names.append(f"{label}({', '.join(f'v{i}' for i in args)})")

    def __call__(self, *inputs):
        values = list(inputs)
        for fn, args in self.steps:
            values.append(fn(*(values[i] for i in args)))
        return values[-1]

    def __str__(self):
        return f"program {self.seed}: " + "; ".join(
            f"v{i} = {name}" for i, name in enumerate(self.names))


def _broadcasts(a, b):
    try:
        return torch.broadcast_shapes(a.shape, b.shape) == a.shape
    except RuntimeError:
        return False


@unittest.skipUnless(KILND, "KILND is not set")
class RandomProgramsTest(test_server.SharedKilnd, unittest.TestCase):

    def check(self, actual, expected, what):
        torch.testing.assert_close(actual.double(), expected, rtol=RTOL, atol=ATOL,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}")

    def test_inference(self):
        for seed in range(PROGRAMS):
            program = Program(seed, casts=True)
            with self.subTest(program=seed):
                rng = test_training.Random()
                what = f"{program}; inputs seed {rng.seed}"
                inputs = [torch.randn(s, generator=rng.generator) for s in program.shapes]
                compiled = kiln.compile(program, *inputs, client=self.client, backend="kiln")
                inputs = [torch.randn(s, generator=rng.generator) for s in program.shapes]
                out, expected = compiled(*inputs), program(*inputs)
                self.assertEqual(compiled.kiln_backend.stats["graphs"], 1, what)
                self.assertEqual(out.dtype, expected.dtype, what)
                self.check(out, expected.double(), what)

    def test_training(self):
        for seed in range(1000, 1000 + PROGRAMS):
            program = Program(seed)
            with self.subTest(program=seed):
                rng = test_training.Random()
                what = f"{program}; inputs seed {rng.seed}"
                inputs = [torch.randn(s, generator=rng.generator).requires_grad_()
                          for s in program.shapes]
                compiled = kiln.compile(program, *inputs, client=self.client, backend="kiln")
                doubles = [x.detach().double().requires_grad_() for x in inputs]
                expected = program(*doubles)
                out = compiled(*inputs)
                self.assertEqual(compiled.kiln_backend.stats["graphs"], 1, what)
                self.check(out, expected, f"{what}: output")
                weight = torch.randn(expected.shape, generator=rng.generator)
                want = torch.autograd.grad(expected, doubles, weight.double(), allow_unused=True)
                got = torch.autograd.grad(out, inputs, weight, allow_unused=True)
                for i, (g, w) in enumerate(zip(got, want)):
                    if w is None:
                        self.assertIsNone(g, f"{what}: grad of input {i}")
                    else:
                        self.check(g, w, f"{what}: grad of input {i}")

    def test_cuda_kernels_compile(self):
        """Every program, as if captured on a GPU, compiled for the cuda
        target: kilnd generates CUDA C++ and NVRTC builds a CUBIN for sm_90
        (no GPU needed; tests/gpu runs the kernels)."""
        target = artifact_pb2.Target(device_type="cuda", sm_arch="sm_90")
        for seed in list(range(PROGRAMS)) + list(range(1000, 1000 + PROGRAMS)):
            program = Program(seed, casts=seed < 1000)
            with self.subTest(program=seed):
                inputs = [torch.randn(s).requires_grad_(seed >= 1000) for s in program.shapes]
                graph = tracer.capture(program, *inputs)
                _move_to_cuda(graph)
                response = self.client.compile(graph, backend="kiln", target=target)
                art = response.artifact
                self.assertEqual(art.target.device_type, "cuda")
                self.assertEqual(art.target.sm_arch, "sm_90")
                compiled = [g for g in (art.compiled, art.compiled_forward, art.compiled_backward)
                            if g.plan.steps]
                self.assertTrue(compiled, f"{program}: nothing compiled")
                for g in compiled:
                    for m in g.modules:
                        self.assertEqual(m.language, "cuda")
                        self.assertEqual(m.binary[:4], b"\x7fELF", f"{program}: not a CUBIN")
                    for step in g.plan.steps:
                        if step.HasField("launch"):
                            self.assertEqual(len(step.launch.grid), 1)
                            self.assertGreater(step.launch.block[0].int_value, 0)


def _move_to_cuda(graph):
    """Every tensor of `graph` (a kiln.v1.Graph) on cuda:0."""
    metas = [ph.value.meta for ph in graph.inputs]
    metas += [out.meta for node in graph.nodes for out in node.outputs]
    for meta in metas:
        meta.device.type = "cuda"
        meta.device.index = 0
    for node in graph.nodes:
        for arg in list(node.args) + list(node.kwargs):
            if arg.HasField("device"):
                arg.device.type = "cuda"
                arg.device.index = 0


if __name__ == "__main__":
    unittest.main()
