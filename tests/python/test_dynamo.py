"""torch.compile(..., backend=...) through a real kilnd: the kiln,
kiln_aot_eager and kiln_eager backends under torch 2's Dynamo, on CPU.

Every test starts from torch._dynamo.reset(), so Dynamo's own caches never
answer for kilnd. Counters come from the server (Stats) and from the backend
(KilnBackend.stats), so a test also proves where each graph was compiled.
"""

import contextlib
import copy
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import unittest.mock
import warnings

import torch
import torch.nn.functional as F

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "data"))
sys.path.insert(0, HERE)
import capture_graphs  # noqa: E402
from test_server import KILND, Kilnd, SharedKilnd, close  # noqa: E402

KILNCTL = os.environ.get("KILNCTL") or (
    os.path.join(os.path.dirname(KILND), "kilnctl") if KILND else None)

BACKENDS = {"kiln_eager": "eager", "kiln_aot_eager": "aot_eager", "kiln": "kiln"}


def counters(client):
    return client.stats().counters


def graph_break(x):
    y = torch.relu(x) * 2
    torch._dynamo.graph_break()
    return torch.tanh(y) + 1


@unittest.skipUnless(KILND, "KILND is not set")
class TorchCompileTest(SharedKilnd, unittest.TestCase):
    """The models of tests/data through each backend, inference and training."""

    def setUp(self):
        torch._dynamo.reset()

    def backend(self, name, **options):
        return kiln.backend(self.server.address, compiler=BACKENDS[name], **options)

    def check_model(self, name, make, inputs, train):
        torch.manual_seed(0)
        model = make()
        model.train(train)
        reference = copy.deepcopy(model)
        be = self.backend(name)
        compiled = torch.compile(model, backend=be)
        for step in range(2):
            args = [x.clone().requires_grad_(train and x.is_floating_point()) for x in inputs]
            ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
            torch.manual_seed(step)
            out = compiled(*args)
            torch.manual_seed(step)
            want = reference(*ref_args)
            close(self, out, want, f"{name} output, step {step}")
            if train:
                out.pow(2).sum().backward()
                want.pow(2).sum().backward()
                for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
                    close(self, p.grad, q.grad, f"{name} gradient of {pname}, step {step}")
                for a, b in zip(args, ref_args):
                    if a.requires_grad:
                        close(self, a.grad, b.grad, f"{name} input gradient, step {step}")
        for (bname, b), c in zip(model.named_buffers(), reference.buffers()):
            close(self, b.to(torch.float64), c.to(torch.float64), f"{name} buffer {bname}")
        self.assertEqual(be.stats["eager"], 0, f"{name}: a graph ran eagerly: {be.stats}")
        self.assertGreaterEqual(be.stats["graphs"], 1)

    def test_models(self):
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 16, 32) for _ in range(3))

        class Attention(torch.nn.Module):
            def forward(self, q, k, v):
                return capture_graphs.attention(q, k, v)

        cases = [
            ("mlp", capture_graphs.MLP, [torch.randn(8, 32)]),
            ("attention", Attention, [q, k, v]),
            ("conv_bn", capture_graphs.ConvBlock, [torch.randn(2, 3, 8, 8)]),
            ("transformer", lambda: capture_graphs.TransformerBlock(dropout=0.0),
             [torch.randn(2, 8, 32)]),
            # Lowered call by call (RepeatedCallsTest).
            ("stacked_transformers", lambda: torch.nn.Sequential(
                *[capture_graphs.TransformerBlock(dropout=0.0) for _ in range(3)]),
             [torch.randn(2, 8, 32)]),
        ]
        for name in BACKENDS:
            for case, make, inputs in cases:
                for train in (False, True):
                    with self.subTest(backend=name, model=case, train=train):
                        torch._dynamo.reset()
                        self.check_model(name, make, inputs, train)

    def test_batch_norm_statistics_are_copied_for_the_graph_only_where_autograd_keeps_them(self):
        # A graph that updates running statistics reads a copy of each only
        # where its backward may keep the original: ATen's autograd (the
        # eager backend) keeps batch norm's; kilnd's backward graph saves
        # none of them.
        model = capture_graphs.ConvBlock(3, 8).train()
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        for name, kept in (("kiln_eager", True), ("kiln", False)):
            torch._dynamo.reset()
            seen = []
            be = self.backend(name)

            def keep(gm, example_inputs, be=be):
                seen.append(be(gm, example_inputs))
                return seen[-1]

            compiled = torch.compile(copy.deepcopy(model), backend=keep, dynamic=False)
            compiled(x).sum().backward()
            # running_mean, running_var, num_batches_tracked
            self.assertEqual(len(seen[0].compiled._mutations), 3, name)
            self.assertEqual(len(seen[0].compiled._kept), 3 if kept else 0, name)

    def test_batch_norms_backward_sums_each_product_once(self):
        """A batch norm reaches kilnd decomposed, and the derivatives of its
        parts sum the output gradient, and its product with the centered
        input, twice each (the bias's and weight's gradients in two steps,
        over (H, W) and then N: six sums); kilnd's merge-sums pass
        (compiler/pipeline/merge_sums.h) leaves one sum of each. The
        gradients match eager."""
        self.check_model("kiln", capture_graphs.ConvBlock, [torch.randn(2, 3, 8, 8)], True)
        torch._dynamo.reset()
        be = self.backend("kiln")
        model = capture_graphs.ConvBlock().train()
        torch.compile(model, backend=be)(torch.randn(2, 3, 8, 8)).sum().backward()
        trace = be.loaded[0].artifact.trace
        self.assertIn("backward_merge_sums_graph.txt", trace, sorted(trace))
        before = trace["backward_graph.txt"].count("aten.sum.dim_IntList")
        after = trace["backward_merge_sums_graph.txt"].count("aten.sum.dim_IntList")
        self.assertEqual((before, after), (6, 2))

    def test_training_loop_matches_eager(self):
        for name in BACKENDS:
            with self.subTest(backend=name):
                torch._dynamo.reset()
                torch.manual_seed(0)
                model = capture_graphs.MLP()
                reference = copy.deepcopy(model)
                compiled = torch.compile(model, backend=self.backend(name))
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
                ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
                data = [(torch.randn(8, 32), torch.randn(8, 32)) for _ in range(5)]
                losses, ref_losses = [], []
                for x, y in data:
                    for m, o, out in ((compiled, opt, losses), (reference, ref_opt, ref_losses)):
                        o.zero_grad()
                        loss = F.mse_loss(m(x), y)
                        loss.backward()
                        o.step()
                        out.append(loss.item())
                for step, (a, b) in enumerate(zip(losses, ref_losses)):
                    self.assertAlmostEqual(a, b, delta=1e-4 * max(1.0, abs(b)),
                                           msg=f"loss of step {step}")
                self.assertLess(losses[-1], losses[0])

    def test_graph_break_gives_two_cached_graphs(self):
        be = self.backend("kiln")
        f = torch.compile(graph_break, backend=be)
        x = torch.randn(4, 8)
        close(self, f(x), graph_break(x), "output across a graph break")
        self.assertEqual(be.stats["graphs"], 2)
        self.assertEqual(be.stats["compiles"] + be.stats["hits"], 2)
        # A fresh Dynamo (a new process, as far as the cache knows): both hit.
        torch._dynamo.reset()
        again = self.backend("kiln")
        close(self, torch.compile(graph_break, backend=again)(x), graph_break(x), "again")
        self.assertEqual(again.stats, {"graphs": 2, "hits": 2, "compiles": 0, "quick": 0,
                                       "upgrades": 0, "eager": 0})

    def test_function_filter_gives_the_other_graphs_eager(self):
        # The graph break's two graphs: graph_break's own, then the graph of
        # the function Dynamo resumes in after the break.
        be = self.backend("kiln", namespace="filter", debug_function="^graph_break_")
        f = torch.compile(graph_break, backend=be)
        x = torch.randn(4, 8)
        close(self, f(x), graph_break(x), "output across a graph break")
        names = [r["graph"] for r in be.graph_times]
        self.assertEqual(len(names), 2, names)
        self.assertRegex(names[0], "^graph_break_")
        self.assertNotRegex(names[1], "^graph_break_")
        self.assertEqual([fn.artifact.backend for fn in be.loaded], ["kiln", "eager"])

    def test_max_autotune_asks_kilnd_to_tune_and_is_cached_apart(self):
        # mode="max-autotune-no-cudagraphs" sends autotune=on, which enters
        # the key; on a CPU target (no GPU to time on) the code is the same.
        x = torch.randn(4, 8)
        plain = self.backend("kiln")
        want = torch.compile(graph_break, backend=plain)(x)
        torch._dynamo.reset()
        tuned = self.backend("kiln")
        got = torch.compile(graph_break, backend=tuned, mode="max-autotune-no-cudagraphs")(x)
        close(self, got, want, "max-autotune output")
        self.assertEqual(tuned.stats["compiles"], 2, tuned.stats)  # nothing cached under its keys
        self.assertNotEqual([fn.key for fn in tuned.loaded], [fn.key for fn in plain.loaded])
        self.assertEqual(len(plain.loaded), 2)
        self.assertEqual(len(tuned.loaded), 2)

    def test_compile_times_per_graph_with_kilnds_phases(self):
        torch._dynamo.reset()
        be = self.backend("kiln")
        f = torch.compile(graph_break, backend=be)
        f(torch.randn(4, 8))
        records = [r for r in kiln.compile_times(repr="dict") if r in be.graph_times]
        self.assertEqual(len(records), 2)  # the graph break: two graphs
        for r in records:
            for phase in ("dynamo", "lower", "key", "lookup", "compile", "wait", "load"):
                self.assertGreaterEqual(r[phase], 0.0, phase)
            self.assertGreater(r["lower"], 0.0)
            self.assertGreater(r["dynamo"], 0.0)  # Dynamo traced the frame first
            self.assertGreater(r["compile"], 0.0)  # a graph the client has not met: Compile
            # The first call waited for no more than the round trips took.
            self.assertLessEqual(r["wait"], r["key"] + r["lookup"] + r["compile"] + 0.25)
            phases = [p for p, _ in r["server"]]
            self.assertIn("verify", phases)
            self.assertIn("native-compile", phases)
        table = kiln.compile_times()
        self.assertIn(records[0]["graph"], table)
        self.assertIn("native-compile", table)
        with self.assertRaises(ValueError):
            kiln.compile_times(repr="csv")

    def test_step_logs_leave_the_failing_step_begun_and_not_ended(self):
        # A graph the backend's client has not met goes to Compile (a hit or
        # a compile in one round trip); one it has met is looked up by key.
        be = self.backend("kiln")
        for first_step in ("compile", "lookup"):
            torch._dynamo.reset()
            with self.assertLogs("kiln", level="INFO") as logs:
                torch.compile(graph_break, backend=be)(torch.randn(4, 8))
            steps = [r.getMessage() for r in logs.records]
            for step in ("lower", first_step, "load"):
                self.assertEqual(sum(s.startswith(f"begin {step}") for s in steps), 2, steps)
                self.assertEqual(sum(s.startswith(f"end {step}") for s in steps), 2, steps)
            self.assertFalse(any(s.startswith("begin lookup") for s in steps)
                             if first_step == "compile" else
                             any(s.startswith("begin compile") for s in steps), steps)

        def refused(x):  # i1e has no derivative rule: kilnd refuses the gradient
            return torch.special.i1e(torch.cumprod(x, 0))

        torch._dynamo.reset()
        with self.assertLogs("kiln", level="INFO") as logs, self.assertRaises(Exception):
            torch.compile(refused, backend=self.backend("kiln"))(
                torch.randn(4, 3, requires_grad=True))
        self.assertRegex(logs.records[-1].getMessage(), r"^begin compile '\w+'$")

    def test_core_ops_without_a_rule_run_as_externs_and_refuse_gradients_by_name(self):
        # special_i1e is an ATen op the registry has no rule for; cumprod,
        # which the lowering decomposes, runs before it.
        def f(x):
            return torch.special.i1e(torch.cumprod(x, 0)) + x

        x = torch.randn(4, 3)
        for name in BACKENDS:
            with self.subTest(backend=name):
                torch._dynamo.reset()
                be = self.backend(name)
                close(self, torch.compile(f, backend=be)(x), f(x), f"{name}: inference")
                self.assertEqual(be.stats["eager"], 0)
        for name in ("kiln_aot_eager", "kiln"):
            with self.subTest(backend=name, train=True):
                torch._dynamo.reset()
                with self.assertRaises(Exception) as caught:
                    torch.compile(f, backend=self.backend(name))(x.clone().requires_grad_())
                self.assertRegex(str(caught.exception),
                                 r"INVALID_ARGUMENT: node '\w+': aten\.\w+\.default is not in "
                                 r"the op registry, and a gradient must flow through it")

    def test_stances_apply_to_kiln_graphs(self):
        be = self.backend("kiln")

        def f(x):
            return torch.tanh(x) * 3

        compiled = torch.compile(f, backend=be, dynamic=False)
        x = torch.randn(4, 8)
        close(self, compiled(x), f(x), "first call")
        with torch.compiler.set_stance("fail_on_recompile"):
            close(self, compiled(x), f(x), "same shape under fail_on_recompile")
            with self.assertRaises(Exception):
                compiled(torch.randn(5, 8))
        with torch.compiler.set_stance("eager_on_recompile"):
            y = torch.randn(6, 8)
            close(self, compiled(y), f(y), "new shape under eager_on_recompile")
        self.assertEqual(be.stats["graphs"], 1, "a stance let the backend compile again")

    def test_slices_of_symbolic_sizes_compile_once(self):
        """Slicing a tensor of symbolic size gives sizes such as Max(1, s0 - 1)
        and FloorDiv(s0 + 1, 2): one symbolic graph serves every shape."""
        fns = {
            "slice": lambda x: (x[:, 1:] * 2).sum(-1),
            "both_ends": lambda x: x[1:, :-1].exp() + x[:-1, 1:],
            "every_other": lambda x: x[:, ::2] + 1,
            "softmax_of_slice": lambda x: torch.softmax(x[:, 2:], -1),
        }
        for name, fn in fns.items():
            with self.subTest(fn=name):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(fn, backend=be, dynamic=True)
                for shape in ((8, 33), (5, 17), (12, 64)):
                    x = torch.randn(shape)
                    close(self, compiled(x), fn(x), f"{name} {shape}")
                self.assertEqual(be.stats["eager"], 0, be.stats)
                self.assertEqual(be.stats["compiles"], 1, be.stats)
                sizes = [s.expr for ph in be.last_lowered.graph.inputs
                         for s in ph.value.meta.sizes if s.expr]
                self.assertTrue(sizes, "the graph was not symbolic")
        # With gradients: the backward's gradient has x's size, which only
        # x binds; the partition saves x for it.
        for name, fn in fns.items():
            with self.subTest(fn=name, training=True):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(fn, backend=be, dynamic=True)
                for shape in ((8, 33), (5, 17), (12, 64)):
                    x = torch.randn(shape, requires_grad=True)
                    y = x.detach().clone().requires_grad_(True)
                    out, want = compiled(x), fn(y)
                    close(self, out, want, f"{name} {shape} with gradients")
                    out.pow(2).sum().backward()
                    want.pow(2).sum().backward()
                    close(self, x.grad, y.grad, f"{name} {shape} gradient")
                self.assertEqual(be.stats["eager"], 0, be.stats)
                self.assertEqual(be.stats["compiles"], 1, be.stats)
        # A size bound only by an int argument: no input tensor binds its
        # symbol for the plan (or the backward), so the graph runs eagerly
        # and says why; a guard on such an int (a branch on it) is
        # Dynamo's to check, and the graph compiles.
        def head(x, n):
            return x[:, :n] * 2

        def branch(x, n):
            return x * 2 if n > 3 else x - 1

        for training in (False, True):
            with self.subTest(training=training):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(head, backend=be, dynamic=True)
                for n in (5, 7):
                    x = torch.randn(6, 9, requires_grad=training)
                    with self.assertWarnsRegex(RuntimeWarning, r"s\d+ .*no input tensor's "
                                               r"dimension") if n == 5 else \
                            contextlib.nullcontext():
                        out = compiled(x, n)
                    close(self, out, head(x, n), f"head {n}")
                    if training:
                        out.sum().backward()
                        close(self, x.grad, (torch.arange(9) < n).float().expand(6, 9) * 2,
                              f"grad {n}")
                self.assertGreaterEqual(be.stats["eager"], 1, be.stats)
        torch._dynamo.reset()
        be = self.backend("kiln")
        compiled = torch.compile(branch, backend=be, dynamic=True)
        for n in (5, 7, 2):
            x = torch.randn(6, 9)
            close(self, compiled(x, n), branch(x, n), f"branch {n}")
        self.assertEqual(be.stats["eager"], 0, be.stats)
        self.assertGreaterEqual(be.stats["compiles"], 1, be.stats)

    def test_reductions_over_symbolic_sizes_train(self):
        """Their gradients divide by (or scale by) a count of elements that
        is symbolic: a mean pooled over the sequence, a loss's mean over the
        batch, a layer norm over a symbolic width, a variance."""
        fns = {
            "mean": lambda x: x.mean(1) * 2,
            "mse_loss": lambda x: F.mse_loss(x.tanh(), torch.zeros_like(x)),
            "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]) * x,
            "var": lambda x: x.var(1) + x.std(-1, keepdim=True).sum(),
        }
        for name, fn in fns.items():
            with self.subTest(fn=name):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(fn, backend=be, dynamic=True)
                for shape in ((2, 5, 6), (3, 7, 4), (2, 9, 11)):
                    x = torch.randn(shape, requires_grad=True)
                    y = x.detach().clone().requires_grad_(True)
                    out, want = compiled(x), fn(y)
                    close(self, out, want, f"{name} {shape}")
                    out.pow(2).sum().backward()
                    want.pow(2).sum().backward()
                    close(self, x.grad, y.grad, f"{name} {shape} gradient")
                self.assertEqual(be.stats["eager"], 0, be.stats)
                self.assertEqual(be.stats["compiles"], 1, be.stats)

    def test_sizes_used_as_numbers_compile_once(self):
        # x * x.shape[-1] and a division by a size over dynamic sizes: the
        # number is a 0-dim tensor the plan fills at each call.
        fns = {
            "scale": lambda x: x * x.shape[-1],
            "unbiased": lambda x: (x - x.mean(-1, keepdim=True)).pow(2).sum(-1) / (x.shape[-1] - 1),
        }
        for name, fn in fns.items():
            with self.subTest(fn=name):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(fn, backend=be, dynamic=True)
                for shape in ((2, 5), (3, 8), (4, 13)):
                    x = torch.randn(shape, requires_grad=True)
                    y = x.detach().clone().requires_grad_(True)
                    out, want = compiled(x), fn(y)
                    close(self, out, want, f"{name} {shape}")
                    out.sum().backward()
                    want.sum().backward()
                    close(self, x.grad, y.grad, f"{name} {shape} gradient")
                self.assertEqual(be.stats["eager"], 0, be.stats)
                self.assertEqual(be.stats["compiles"], 1, be.stats)

    def test_floats_of_sizes_compile_once(self):
        # x / sqrt(x.shape[-1]), and batch norm over a dynamic batch (its
        # running variance scaled by n / (n - 1), its momentum a float
        # Dynamo passes as a tensor): 0-dim float64 tensors of the sizes.
        torch._dynamo.reset()
        be = self.backend("kiln")
        scale = torch.compile(lambda x: x / math.sqrt(x.shape[-1]), backend=be, dynamic=True)
        for shape in ((2, 5), (3, 8)):
            x = torch.randn(shape)
            close(self, scale(x), x / math.sqrt(shape[-1]), f"scale {shape}")
        self.assertEqual((be.stats["compiles"], be.stats["eager"]), (1, 0), be.stats)

        torch._dynamo.reset()
        be = self.backend("kiln")
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        eager = copy.deepcopy(model)
        compiled = torch.compile(model, backend=be, dynamic=True)
        for shape in ((2, 3, 8, 8), (3, 3, 10, 9), (4, 3, 7, 12)):
            x = torch.randn(shape)
            out, want = compiled(x), eager(x)
            close(self, out, want, f"batch norm {shape}")
            out.square().sum().backward()
            want.square().sum().backward()
            for (name, b), ref in zip(model.named_buffers(), eager.buffers()):
                close(self, b, ref, f"batch norm {shape}: {name}")
        for (name, p), ref in zip(model.named_parameters(), eager.parameters()):
            close(self, p.grad, ref.grad, f"batch norm: grad of {name}")
        self.assertEqual(be.stats["eager"], 0, be.stats)

    def test_linear_over_a_dynamic_batch_and_sequence_compiles_once(self):
        # ATen's linear flattens a 3-d input by its concrete sizes, which
        # specialized both symbols: every new size compiled again.
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                    torch.nn.Linear(16, 8))
        for training in (False, True):
            with self.subTest(training=training):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(model, backend=be, dynamic=True)
                for shape in ((2, 5, 8), (3, 9, 8), (4, 12, 8)):
                    x = torch.randn(shape, requires_grad=training)
                    with torch.set_grad_enabled(training):
                        close(self, compiled(x), model(x), f"{shape}")
                self.assertEqual((be.stats["graphs"], be.stats["eager"]), (1, 0), be.stats)

    def test_gradients_of_permuted_views_over_symbolic_sizes(self):
        # q, k, v split from one projection as attention layers write it:
        # the view's gradient arrives permuted, and viewing it back as if it
        # were contiguous read the wrong elements.
        def heads(x, w):
            b, t, d = x.shape
            q, k, v = (x @ w).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
            return (q * 1 + k * 2 + v * 3).square()

        def pooled(x, w):
            b, t, d = x.shape
            return (x @ w).view(b, t, 3, 2, d // 2).sum(2).square()

        for name, fn in (("heads", heads), ("pooled", pooled)):
            with self.subTest(fn=name):
                torch._dynamo.reset()
                be = self.backend("kiln")
                compiled = torch.compile(fn, backend=be, dynamic=True)
                for t in (5, 7, 9):
                    x = torch.randn(2, t, 4)
                    w = torch.randn(4, 12, requires_grad=True)
                    w2 = w.detach().clone().requires_grad_(True)
                    out, want = compiled(x, w2), fn(x, w)
                    close(self, out, want, f"{name} t={t}")
                    out.sum().backward()
                    want.sum().backward()
                    close(self, w2.grad, w.grad, f"{name} t={t} gradient")
                self.assertEqual((be.stats["compiles"], be.stats["eager"]), (1, 0), be.stats)

    def test_an_empty_batch_trains(self):
        # Autograd's gradient of an output without elements comes with
        # strides of 0, which address nothing.
        def f(x, w):
            return F.layer_norm(x @ w, (4,)).softmax(-1)

        be = self.backend("kiln")
        torch._dynamo.reset()
        compiled = torch.compile(f, backend=be)
        x, w = torch.randn(0, 5, requires_grad=True), torch.randn(5, 4, requires_grad=True)
        out = compiled(x, w)
        self.assertEqual(tuple(out.shape), (0, 4))
        out.sum().backward()
        close(self, w.grad, torch.zeros(5, 4), "the weight's gradient")
        self.assertEqual(tuple(x.grad.shape), (0, 5))
        self.assertEqual(be.stats["eager"], 0, be.stats)

    def test_size_expressions_kilnd_reads(self):
        import sympy

        from kiln.lower import Unsupported, size_expr

        s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
        self.assertEqual(size_expr(sympy.Max(1, s0 - 1)), "Max(1, s0 - 1)")
        self.assertEqual(size_expr(2 * s0 * s1 + 3), "2*s0*s1 + 3")
        self.assertEqual(size_expr(s0**2), "s0**2")
        for bad in (s0 / 2, s0 ** -1, sympy.sqrt(s0)):
            with self.assertRaisesRegex(Unsupported, "which kilnd does not read"):
                size_expr(bad)

    def test_varying_batch_is_one_static_and_one_symbolic_variant(self):
        be = self.backend("kiln", namespace="varying")
        torch.manual_seed(0)
        model = capture_graphs.MLP()
        compiled = torch.compile(model, backend=be)
        with torch.no_grad():
            for batch in (4, 5, 6, 7, 9):
                x = torch.randn(batch, 32)
                close(self, compiled(x), model(x), f"batch {batch}")
        # Batch 4: static; batch 5: Dynamo's automatic dynamic, one symbolic
        # graph that serves every later size without calling the backend.
        self.assertEqual(be.stats["graphs"], 2, be.stats)
        symbolic = [ph for ph in be.last_lowered.graph.inputs
                    if any(s.WhichOneof("value") == "expr" for s in ph.value.meta.sizes)]
        self.assertEqual([ph.value.name for ph in symbolic], ["l_x_"])
        self.assertIn(f"{symbolic[0].value.meta.sizes[0].expr} >= 2",
                      list(be.last_lowered.guards.shape_guards))

        # kilnd recorded why: the guard of the static variant that batch 5
        # failed, and Dynamo's own words for it.
        reasons = [r for e in self.client.list_entries("varying").entries
                   for r in self.client.get_entry(e.key, "varying").entry.recompiles]
        self.assertEqual(len(reasons), 1, reasons)
        self.assertEqual(len(reasons[0].misses), 1, reasons)
        self.assertRegex(reasons[0].misses[0].failed_guard,
                         r"^input \d+ 'l_x_': size\[0\] is 5, guard expects 4$")
        self.assertIn("size mismatch at index 0. expected 4, actual 5", reasons[0].client_reason)
        shown = subprocess.run([KILNCTL, f"--server={self.server.address}", "--namespace=varying",
                                "recompiles"], capture_output=True, text=True, timeout=60)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn("size[0] is 5, guard expects 4", shown.stdout)
        self.assertIn("client: ", shown.stdout)


    def test_dynamic_false_keeps_sizes_static_in_kilnd_too(self):
        """Two processes (Dynamo reset between them) at batches 4 and 5:
        kilnd's automatic dynamic makes the second graph symbolic, unless
        torch.compile(dynamic=False) keeps sizes static."""
        torch.manual_seed(0)
        model = capture_graphs.MLP()

        def batch_sizes(dynamic, namespace):
            sizes = []
            for batch in (4, 5):
                torch._dynamo.reset()
                be = self.backend("kiln", namespace=namespace)
                compiled = torch.compile(model, backend=be, dynamic=dynamic)
                x = torch.randn(batch, 32)
                with torch.no_grad():
                    close(self, compiled(x), model(x), f"dynamic={dynamic}, batch {batch}")
                self.assertEqual(be.stats["compiles"], 1, be.stats)
                plan = be.loaded[-1].artifact.compiled.plan
                x_at = [ph.value.name for ph in be.last_lowered.graph.inputs].index("l_x_")
                size = plan.inputs[x_at].value.meta.sizes[0]
                sizes.append(size.int_value if size.WhichOneof("value") == "int_value"
                             else size.expr)
            return sizes

        automatic = batch_sizes(None, "automatic")
        self.assertEqual(automatic[0], 4)
        self.assertRegex(str(automatic[1]), r"^s\d+$")
        self.assertEqual(batch_sizes(False, "static"), [4, 5])


def dynamo_graph(model, x):
    """(Dynamo's static graph of model(x), its example inputs)."""
    seen = []

    def keep(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    torch.compile(model, backend=keep, dynamic=False)(x)
    return seen[0]


class LoweringCacheTest(unittest.TestCase):
    """kiln.lower's disk cache of static graphs (the warm start)."""

    def setUp(self):
        torch._dynamo.reset()
        self.dir = tempfile.mkdtemp(prefix="kiln_lower_cache_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.env = unittest.mock.patch.dict(os.environ, {"KILN_CACHE_DIR": self.dir})
        self.env.start()
        self.addCleanup(self.env.stop)

    def test_a_static_graph_is_lowered_once(self):
        from kiln import lower

        gm, inputs = dynamo_graph(capture_graphs.MLP(), torch.randn(4, 32))
        hits, misses = lower.cache_stats["hits"], lower.cache_stats["misses"]
        first = lower.lower(gm, inputs, name="first")
        second = lower.lower(gm, inputs, name="second")
        self.assertEqual((lower.cache_stats["hits"], lower.cache_stats["misses"]),
                         (hits + 1, misses + 1))
        self.assertEqual(second.graph.name, "second")
        second.graph.name = "first"
        self.assertEqual(second.graph, first.graph)
        self.assertEqual(second.guards, first.guards)
        self.assertEqual((second.tensor_args, second.num_outputs, second.mutations),
                         (first.tensor_args, first.num_outputs, first.mutations))
        # The grad mode is part of what was lowered: another entry.
        with torch.no_grad():
            lower.lower(gm, inputs)
        self.assertEqual(lower.cache_stats["misses"], misses + 2)
        # A damaged file is lowered again, and replaced.
        files = [os.path.join(root, f) for root, _, names in os.walk(self.dir) for f in names]
        self.assertEqual(len(files), 2, files)
        for path in files:
            with open(path, "w") as f:
                f.write("{not json")
        again = lower.lower(gm, inputs, name="first")
        self.assertEqual(again.graph, first.graph)
        self.assertEqual(lower.cache_stats["misses"], misses + 3)

    def test_a_graph_traced_again_hits_and_another_constant_misses(self):
        from kiln import lower

        def scaled(k):
            return lambda x: torch.relu(x * k + 1.0)

        x = torch.randn(4, 8)
        first = lower.lower(*dynamo_graph(scaled(2.0), x), name="g")
        hits, misses = lower.cache_stats["hits"], lower.cache_stats["misses"]
        torch._dynamo.reset()
        # A new GraphModule of the same graph.
        again = lower.lower(*dynamo_graph(scaled(2.0), x), name="g")
        self.assertEqual(lower.cache_stats["hits"], hits + 1)
        self.assertEqual(again.graph, first.graph)
        torch._dynamo.reset()
        other = lower.lower(*dynamo_graph(scaled(3.0), x), name="g")
        self.assertEqual(lower.cache_stats["misses"], misses + 1)
        self.assertNotEqual(other.graph, first.graph)

    def test_batch_norm_mutations_survive_the_cache(self):
        from kiln import lower

        model = capture_graphs.ConvBlock(3, 8).train()
        gm, inputs = dynamo_graph(model, torch.randn(2, 3, 8, 8))
        first = lower.lower(gm, inputs)
        second = lower.lower(gm, inputs)
        self.assertTrue(first.mutations)
        self.assertEqual(second.mutations, first.mutations)


class RepeatedCallsTest(unittest.TestCase):
    """kiln.lower (kiln.tracing) traces each distinct call of a graph of
    repeated blocks once, and gives the graph that tracing it whole gives."""

    def setUp(self):
        torch._dynamo.reset()
        self.env = unittest.mock.patch.dict(os.environ, {"KILN_LOWER_CACHE": "0"})
        self.env.start()
        self.addCleanup(self.env.stop)

    def lowerings(self, model, x):
        """(lowered call by call where it may be, lowered whole, calls
        traced alone, Dynamo's calls)."""
        from kiln import lower, tracing

        gm, inputs = dynamo_graph(model, x)
        with unittest.mock.patch.object(tracing, "_trace_call", wraps=tracing._trace_call) as alone:
            by_call = lower.lower(gm, inputs, name="g")
        with unittest.mock.patch.object(tracing, "_trace_repeated_calls", return_value=None):
            whole = lower.lower(gm, inputs, name="g")
        self.assertEqual(by_call.graph, whole.graph)
        self.assertEqual(by_call.guards, whole.guards)
        self.assertEqual((by_call.tensor_args, by_call.num_outputs, by_call.mutations),
                         (whole.tensor_args, whole.num_outputs, whole.mutations))
        calls = sum(n.op in ("call_function", "call_method") for n in gm.graph.nodes)
        return by_call, whole, alone.call_count, calls

    def test_repeated_blocks_trace_each_distinct_call_once(self):
        model = torch.nn.Sequential(
            *[capture_graphs.TransformerBlock(dropout=0.0) for _ in range(4)])
        for grad in (True, False):
            with self.subTest(grad=grad), torch.set_grad_enabled(grad):
                torch._dynamo.reset()
                _, whole, alone, calls = self.lowerings(model, torch.randn(2, 8, 32))
                self.assertGreater(alone, 0)
                self.assertLessEqual(4 * alone, calls + 4)  # one block's calls, about
                self.assertGreater(len(whole.graph.nodes), 100)

    def test_a_graph_of_distinct_calls_is_traced_whole(self):
        _, _, alone, _ = self.lowerings(capture_graphs.TransformerBlock(dropout=0.0),
                                        torch.randn(2, 8, 32))
        self.assertEqual(alone, 0)

    def test_blocks_that_write_in_place_are_traced_whole(self):
        # Zeroing a view's columns writes to its base: only the whole
        # graph's functionalization sees the base change.
        class Zeroes(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 8)

            def forward(self, x):
                y = torch.relu(self.linear(x))
                y[:, :2].mul_(0)
                return y + 1

        model = torch.nn.Sequential(*[Zeroes() for _ in range(4)])
        by_call, _, alone, _ = self.lowerings(model, torch.randn(4, 8))
        self.assertGreater(alone, 0)  # tried, and found the write
        self.assertIn("aten.slice_scatter.default", [n.target for n in by_call.graph.nodes])

    def test_blocks_that_switch_the_grad_mode_are_traced_whole(self):
        class Detached(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 8)

            def forward(self, x):
                with torch.no_grad():
                    scale = x.abs().mean()
                return torch.tanh(self.linear(x)) * scale

        model = torch.nn.Sequential(*[Detached() for _ in range(4)])
        _, _, alone, _ = self.lowerings(model, torch.randn(4, 8, requires_grad=True))
        self.assertEqual(alone, 0)


@unittest.skipUnless(KILND, "KILND is not set")
class TorchCompileServerTest(unittest.TestCase):
    """Across processes and restarts; frozen servers; no server."""

    def setUp(self):
        torch._dynamo.reset()
        self.tmp = tempfile.mkdtemp(prefix="kiln_dynamo_test_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.data_dir = os.path.join(self.tmp, "data")
        self.server = Kilnd(self.data_dir)
        self.client = kiln.Client(self.server.address, timeout=60)

    def tearDown(self):
        self.client.close()
        if self.server is not None:
            self.assertEqual(self.server.stop(), 0, self.server.log_tail())

    def restart(self):
        self.client.close()
        self.assertEqual(self.server.stop(), 0, self.server.log_tail())
        self.server = Kilnd(self.data_dir)
        self.client = kiln.Client(self.server.address, timeout=60)

    def run_other_process(self, backend="kiln", job=None):
        """Runs the MLP (training step) and the graph-break function in a new
        process through torch.compile; returns its backend's counters."""
        script = textwrap.dedent(f"""
            import sys, json, torch, kiln
            sys.path.insert(0, {os.path.join(HERE, os.pardir, "data")!r})
            sys.path.insert(0, {HERE!r})
            import capture_graphs
            from test_dynamo import graph_break
            be = kiln.backend({self.server.address!r}, compiler={BACKENDS[backend]!r},
                              job={job!r})
            torch.manual_seed(0)
            model = capture_graphs.MLP()
            out = torch.compile(model, backend=be)(torch.randn(8, 32))
            out.sum().backward()
            torch.compile(graph_break, backend=be)(torch.randn(4, 8))
            print(json.dumps(be.stats))
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=600)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        import json
        return json.loads(done.stdout.strip().splitlines()[-1])

    def test_second_process_hits_and_compiles_nothing_even_after_a_restart(self):
        first = self.run_other_process()
        self.assertEqual(first["compiles"], 3, first)  # the MLP, two graph-break graphs
        compiles = counters(self.client).compiles
        self.assertEqual(compiles, 3)
        second = self.run_other_process()
        self.assertEqual(second, {"graphs": 3, "hits": 3, "compiles": 0, "quick": 0,
                                  "upgrades": 0, "eager": 0})
        self.restart()
        third = self.run_other_process()
        self.assertEqual(third, {"graphs": 3, "hits": 3, "compiles": 0, "quick": 0,
                                 "upgrades": 0, "eager": 0})
        self.assertEqual(counters(self.client).compiles, 3)

    def test_graph_breaks_gathered_from_two_processes(self):
        for _ in range(2):
            self.run_other_process(job="two-processes")
        shown = subprocess.run([KILNCTL, f"--server={self.server.address}", "breaks",
                                "two-processes", "--json"],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        from google.protobuf import json_format
        from kiln.v1 import service_pb2
        reply = json_format.Parse(shown.stdout, service_pb2.GraphBreaksResponse())
        self.assertEqual([j.job for j in reply.jobs], ["two-processes"])
        graphs = reply.jobs[0].graphs
        # The MLP's graph, graph_break's graph up to the break, and the graph
        # of the function Dynamo resumes in: each reported by both processes.
        self.assertEqual(len(graphs), 3, graphs)
        self.assertEqual([g.reports for g in graphs], [2, 2, 2])
        broken = [g for g in graphs if g.graph_break]
        self.assertEqual(len(broken), 1, graphs)
        self.assertEqual(broken[0].function, "graph_break")
        self.assertTrue(broken[0].reason)
        self.assertRegex(broken[0].user_frames[-1], r"^test_dynamo\.py:\d+ in graph_break$")
        text = subprocess.run([KILNCTL, f"--server={self.server.address}", "breaks"],
                              capture_output=True, text=True, timeout=60).stdout
        self.assertIn("job two-processes (namespace (default)): 3 graphs from 3 functions, "
                      "1 graph break", text)

    def test_frozen_server_raises_or_runs_eagerly(self):
        self.client.freeze()
        x = torch.randn(4, 8)
        raising = kiln.backend(self.server.address, on_frozen="raise")
        with self.assertRaises(Exception) as caught:
            torch.compile(graph_break, backend=raising)(x)
        self.assertIn("frozen", str(caught.exception))
        torch._dynamo.reset()
        lenient = kiln.backend(self.server.address, on_frozen="eager")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            close(self, torch.compile(graph_break, backend=lenient)(x), graph_break(x), "eager")
        frozen_warnings = [w for w in seen if "frozen" in str(w.message)]
        self.assertEqual(len(frozen_warnings), 1, [str(w.message) for w in seen])
        self.assertEqual(lenient.stats["eager"], 2)
        self.assertEqual(counters(self.client).compiles, 0)
        self.assertGreaterEqual(counters(self.client).frozen_misses, 1)

    def test_a_graph_whose_first_call_raised_asks_kilnd_again(self):
        # The backend returns before kilnd answers, and the first call waits
        # for the answer: a refusal raises there, and leaves nothing behind,
        # so that the next call asks again (as Dynamo calls a backend that
        # raised again on the frame's next run).
        def f(x):
            return torch.tanh(x) * 3 + 1

        x = torch.randn(4, 8)
        be = kiln.backend(self.server.address, on_frozen="raise", namespace="asks-again")
        compiled = torch.compile(f, backend=be, dynamic=False)
        self.client.freeze()
        try:
            for _ in range(2):
                with self.assertRaises(kiln.KilnError) as caught:
                    compiled(x)
                self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
                self.assertIn("frozen", caught.exception.message)
        finally:
            self.client.thaw()
        close(self, compiled(x), f(x), "after the thaw")
        self.assertEqual(be.stats["graphs"], 1, "Dynamo compiled the frame again")
        self.assertEqual(be.stats["compiles"], 1, be.stats)
        self.assertEqual(len(be.loaded), 1)

    def test_suppress_errors_runs_a_refused_graph_eagerly(self):
        def f(x):  # i1e has no derivative rule: kilnd refuses the gradient
            return torch.special.i1e(torch.cumprod(x, 0))

        x = torch.randn(4, 3, requires_grad=True)
        be = kiln.backend(self.server.address)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(suppress_errors=True), \
                warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = torch.compile(f, backend=be)(x)
        close(self, out, f(x), "eager")
        said = [str(w.message) for w in seen if "suppress_errors" in str(w.message)]
        self.assertEqual(len(said), 1, [str(w.message) for w in seen])
        self.assertIn("a gradient must flow through it", said[0])
        self.assertEqual(be.stats["eager"], 1)

    def test_writes_autograd_does_not_see_run_eagerly(self):
        # Eager differentiates as if these writes had not happened (no_grad
        # scaling a weight, Embedding's max_norm renormalizing its own);
        # the graph cannot say so, and it runs eagerly with eager's
        # gradients.
        def scaled(x, w):
            with torch.no_grad():
                w.mul_(2)
            return (w * x).sum()

        ids = torch.tensor([[1, 2, 7], [7, 3, 1]])
        for name, fn, examples in [
                ("no_grad write", scaled, (torch.randn(5), torch.randn(5))),
                ("max_norm", lambda e, i: F.embedding(i, e, max_norm=1.0).sum(),
                 (torch.randn(10, 4) * 3, ids))]:
            torch._dynamo.reset()
            be = kiln.backend(self.server.address)
            args, eager_args = ([a.clone().requires_grad_(a.is_floating_point()) for a in examples]
                                for _ in range(2))
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                out = torch.compile(fn, backend=be)(*args)
            expected = fn(*eager_args)
            out.backward()
            expected.backward()
            close(self, out, expected, name)
            for a, e in zip(args, eager_args):
                close(self, a, e, f"{name}: the written tensor")
                if e.requires_grad:
                    close(self, a.grad, e.grad, f"{name}: gradient")
            said = [str(w.message) for w in seen if "runs eagerly" in str(w.message)]
            self.assertEqual(len(said), 1, [str(w.message) for w in seen])
            self.assertIn("where autograd does not see the write", said[0])
            self.assertEqual(be.stats["eager"], 1, name)

    def test_custom_autograd_functions_train_eagerly_and_infer_compiled(self):
        class Reverse(torch.autograd.Function):  # gradient reversal
            @staticmethod
            def forward(ctx, x):
                return x * 1.0

            @staticmethod
            def backward(ctx, g):
                return -0.5 * g

        def f(x, w):
            return Reverse.apply(x @ w).tanh()

        x, w = torch.randn(4, 5), torch.randn(5, 3)
        torch._dynamo.reset()
        be = kiln.backend(self.server.address)
        with torch.no_grad():
            close(self, torch.compile(f, backend=be)(x, w), f(x, w), "inference")
        self.assertEqual((be.stats["compiles"], be.stats["eager"]), (1, 0), be.stats)

        torch._dynamo.reset()
        be = kiln.backend(self.server.address)
        args, eager_args = ([x.clone().requires_grad_(), w.clone().requires_grad_()]
                            for _ in range(2))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.compile(f, backend=be)(*args).sum().backward()
        f(*eager_args).sum().backward()
        for a, e in zip(args, eager_args):
            close(self, a.grad, e.grad, "the Function's own backward")
        said = [str(m.message) for m in seen if "runs eagerly" in str(m.message)]
        self.assertEqual(len(said), 1, [str(m.message) for m in seen])
        self.assertIn("custom autograd.Function", said[0])
        self.assertEqual(be.stats["eager"], 1)

    def test_server_down_warns_and_runs_eagerly_or_raises(self):
        address = self.server.address
        self.assertEqual(self.server.stop(), 0)
        self.server = None
        x = torch.randn(4, 8)
        lenient = kiln.backend(address, timeout=5)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            close(self, torch.compile(graph_break, backend=lenient)(x), graph_break(x), "eager")
        self.assertEqual(len([w for w in seen if "did not answer" in str(w.message)]), 1)
        self.assertEqual(lenient.stats["eager"], 2)
        # The second graph did not ask again: the server is left alone a while.
        self.assertGreater(lenient._down_until, time.monotonic())
        torch._dynamo.reset()
        strict = kiln.backend(address, timeout=5, on_unavailable="raise")
        with self.assertRaises(Exception) as caught:
            torch.compile(graph_break, backend=strict)(x)
        self.assertIn("UNAVAILABLE", str(caught.exception))


@unittest.skipUnless(KILND, "KILND is not set")
class TokenTest(unittest.TestCase):
    """The backend and kiln.Client send a bearer token; kilnd checks it."""

    def test_backend_with_and_without_a_token(self):
        tmp = tempfile.mkdtemp(prefix="kiln_token_test_")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            f.write("trainer-token-0123456789 compiler - trainer\n")
        server = Kilnd(os.path.join(tmp, "data"), ["--tokens_file=" + tokens])
        try:
            x = torch.randn(4, 8)
            torch._dynamo.reset()
            anonymous = kiln.backend(server.address)
            with self.assertRaises(Exception) as caught:
                torch.compile(graph_break, backend=anonymous)(x)
            self.assertIn("UNAUTHENTICATED", str(caught.exception))
            torch._dynamo.reset()
            trainer = kiln.backend(server.address, token="trainer-token-0123456789")
            close(self, torch.compile(graph_break, backend=trainer)(x), graph_break(x), "token")
            self.assertEqual(trainer.stats["compiles"], 2)
            with kiln.Client(server.address, token="trainer-token-0123456789") as c:
                with self.assertRaises(kiln.KilnError) as denied:
                    c.freeze()
                self.assertEqual(denied.exception.code, "PERMISSION_DENIED")
        finally:
            self.assertEqual(server.stop(), 0, server.log_tail())


@unittest.skipUnless(KILND, "KILND is not set")
class SignedArtifactTest(unittest.TestCase):
    """kilnd signs artifact digests; a backend with the public key loads only
    artifacts whose bytes and signature check out."""

    def test_only_signed_artifacts_load(self):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from kiln.compiled import SignatureError, verify_artifact

        def pem_pair():
            key = Ed25519PrivateKey.generate()
            private = key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
            public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
            return private, public

        private, public = pem_pair()
        _, other_public = pem_pair()
        tmp = tempfile.mkdtemp(prefix="kiln_signing_test_")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        with open(os.path.join(tmp, "key.pem"), "wb") as f:
            f.write(private)
        x = torch.randn(4, 8)
        signed = Kilnd(os.path.join(tmp, "signed"), ["--signing_key_file=" + f.name])
        unsigned = Kilnd(os.path.join(tmp, "unsigned"))
        try:
            torch._dynamo.reset()
            be = kiln.backend(signed.address, public_key=public)
            close(self, torch.compile(graph_break, backend=be)(x), graph_break(x), "signed")
            self.assertEqual(be.stats["compiles"], 2)
            torch._dynamo.reset()
            again = kiln.backend(signed.address, public_key=public)
            torch.compile(graph_break, backend=again)(x)
            self.assertEqual(again.stats["hits"], 2)  # hits are verified too
            for address, key, says in ((signed.address, other_public, "does not verify"),
                                       (unsigned.address, public, "is not signed")):
                torch._dynamo.reset()
                with self.assertRaises(Exception) as caught:
                    torch.compile(graph_break, backend=kiln.backend(address, public_key=key))(x)
                self.assertIn(says, str(caught.exception))
            # An artifact changed after signing fails before its code loads.
            with kiln.Client(signed.address) as c:
                got = c.lookup(graph=be.last_lowered.graph, include_artifact=True,
                               backend="kiln")
                self.assertTrue(got.signature)
                got.artifact.trace["planted"] = "code"
                with self.assertRaisesRegex(SignatureError, "hash to"):
                    verify_artifact(got.artifact, got.digest, got.signature, public)
        finally:
            self.assertEqual(signed.stop(), 0, signed.log_tail())
            self.assertEqual(unsigned.stop(), 0, unsigned.log_tail())


class RegistrationTest(unittest.TestCase):
    def test_core_opset_list_is_this_torchs(self):
        import core_aten_ops

        with open(core_aten_ops.OUT) as f:
            listed = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        self.assertEqual(listed, core_aten_ops.core_ops(),
                         "compiler/ops/core_aten_ops.txt is stale: run "
                         "tests/data/core_aten_ops.py, then kiln_ops_doc")

    def test_backends_are_registered(self):
        names = torch._dynamo.list_backends(exclude_tags=())
        for name in BACKENDS:
            self.assertIn(name, names)

    def test_server_address_from_the_environment(self):
        os.environ["KILN_SERVER"] = "10.1.2.3:4567"
        try:
            self.assertEqual(kiln.backend().server, "10.1.2.3:4567")
        finally:
            del os.environ["KILN_SERVER"]
        self.assertEqual(kiln.backend().server, "127.0.0.1:50051")
        self.assertEqual(kiln.backend("h:1").server, "h:1")


if __name__ == "__main__":
    unittest.main()
