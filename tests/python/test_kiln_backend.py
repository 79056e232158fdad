"""The `kiln` backend from Python: generated kernels and execution plans run
by kiln.plan.PlanRunner, and kiln.compile(..., backend="kiln").

PlanRunnerTest needs no server: it runs hand-written plans
whose steps are views, allocations and ATen ops (no generated code).
KilnBackendTest compiles through a real kilnd (the binary named by $KILND,
started once for the class, as test_server.py starts it) and is skipped when
KILND is unset; its trace test also runs kilnctl ($KILNCTL, or kilnctl beside
kilnd).

Inputs and parameters are fresh random values on every run, drawn from a
generator whose seed every failure message names; integer inputs get random
integers, and batch-norm statistics (buffers) positive values. Dropout masks
agree between eager and compiled calls because the plan leaves
aten.native_dropout to ATen, which draws from torch's default generator as
eager dropout does: both are seeded the same way just before the call.
"""

import concurrent.futures
import copy
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F
from google.protobuf import json_format

import kiln
from kiln.plan import ModuleLoader, PlanRunner
from kiln.v1 import artifact_pb2, graph_pb2, service_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, os.pardir, "data")
GRAPHS_DIR = os.path.join(DATA_DIR, "graphs")
sys.path.insert(0, DATA_DIR)
sys.path.insert(0, HERE)
import capture_graphs  # noqa: E402
# Imported as modules, so that their tests are not collected twice.
import test_server  # noqa: E402
import test_training  # noqa: E402
import training_op_cases  # noqa: E402

KILND = os.environ.get("KILND")
KILNCTL = os.environ.get("KILNCTL") or (
    os.path.join(os.path.dirname(KILND), "kilnctl") if KILND else None)

Random = test_training.Random
assert_close = test_training.assert_close
load_graph = test_training.load_graph
case = test_training.case
has_dropout = test_training.has_dropout


def graph_files():
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(GRAPHS_DIR, "*.json")))


def random_input(rng, ph, like):
    """A value for placeholder `ph` shaped as tensor `like`: random integers
    for an integer input, random positive values for a buffer (batch-norm
    statistics must be), normal values for an input. A parameter keeps the
    module's value (`like`): weights of the scale its initialization gives,
    where normal weights would make the deeper graphs ill-conditioned enough
    that float32 rounding alone exceeds the tolerance."""
    if not like.is_floating_point():
        return torch.randint(0, 100, like.shape, generator=rng.generator, dtype=like.dtype)
    if ph.kind == graph_pb2.Placeholder.BUFFER:
        return torch.rand(like.shape, generator=rng.generator, dtype=like.dtype) + 0.5
    if ph.kind == graph_pb2.Placeholder.PARAMETER:
        return like.detach().clone()
    return rng.like(like)


def steps_of(compiled_graph, kind):
    return [s for s in compiled_graph.plan.steps if s.WhichOneof("kind") == kind]


def sym(value):
    """A kiln.v1.SymInt from an int or an expression."""
    return graph_pb2.SymInt(expr=value) if isinstance(value, str) else graph_pb2.SymInt(
        int_value=value)


def placeholder(name, sizes, strides=None, dtype=graph_pb2.FLOAT32):
    meta = graph_pb2.TensorMeta(dtype=dtype, sizes=[sym(s) for s in sizes],
                                strides=[sym(s) for s in strides or []],
                                device=graph_pb2.Device(type="cpu", index=-1))
    return graph_pb2.Placeholder(value=graph_pb2.Value(name=name, meta=meta),
                                 kind=graph_pb2.Placeholder.USER_INPUT)


def alloc(value, sizes, strides, reuse=""):
    return artifact_pb2.PlanStep(alloc=artifact_pb2.PlanStep.Alloc(
        value=value, dtype=graph_pb2.FLOAT32, sizes=[sym(s) for s in sizes],
        strides=[sym(s) for s in strides], device=graph_pb2.Device(type="cpu", index=-1),
        reuse=reuse))


def view(value, base, sizes, strides, offset=0):
    return artifact_pb2.PlanStep(view=artifact_pb2.PlanStep.View(
        value=value, base=base, sizes=[sym(s) for s in sizes],
        strides=[sym(s) for s in strides], storage_offset=sym(offset)))


def extern(name, target, args, outputs):
    node = graph_pb2.Node(name=name, target=target, args=args,
                          outputs=[graph_pb2.Value(name=o) for o in outputs])
    return artifact_pb2.PlanStep(extern_call=artifact_pb2.PlanStep.Extern(node=node))


def free(value):
    return artifact_pb2.PlanStep(free=artifact_pb2.PlanStep.Free(value=value))


def tensor_arg(name):
    return graph_pb2.Argument(tensor=name)


class PlanRunnerTest(unittest.TestCase):
    """Hand-written plans without generated code: symbols, views, externs,
    allocation and storage reuse, and the checks of a plan and its inputs."""

    def symbolic_plan(self):
        # x: [s0, 4] -> flat = view(x, [4*s0]); out = relu(flat);
        # scratch: an Alloc sized by an expression.
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.append(placeholder("x", ["s0", 4], [4, 1]))
        p.symbols.add(symbol="s0", input=0, dim=0)
        p.steps.extend([
            view("flat", "x", ["4*s0"], [1]),
            extern("relu", "aten.relu.default", [tensor_arg("flat")], ["out"]),
            alloc("scratch", ["Max(s0 - 1, 1)", 2], [2, 1]),
        ])
        p.outputs.extend(["out", "scratch", "flat"])
        return g

    def test_symbols_views_and_externs(self):
        runner = PlanRunner(self.symbolic_plan())
        self.assertEqual(runner.input_names, ["x"])
        for rows in (1, 3, 5):
            x = torch.randn(rows, 4)
            out, scratch, flat = runner.run([x])
            self.assertTrue(torch.equal(out, x.reshape(-1).relu()))
            self.assertEqual(list(scratch.shape), [max(rows - 1, 1), 2])
            self.assertEqual(flat.data_ptr(), x.data_ptr(), "a view is never a copy")
            self.assertIsNone(out.grad_fn)
        x = torch.randn(3, 4, requires_grad=True)
        out = runner.run([x])[0]
        self.assertIsNone(out.grad_fn, "plans run without autograd")

    def test_input_checks_name_the_input(self):
        runner = PlanRunner(self.symbolic_plan())
        cases = [
            ([], "takes 1 inputs, got 0"),
            ([torch.randn(3, 4, dtype=torch.float64)], r"input 0 \('x'\) is torch.float64"),
            ([torch.randn(12)], r"input 0 \('x'\) has rank 1; the plan expects 2"),
            ([torch.randn(3, 5)], r"input 0 \('x'\) dim 1 is 5; the plan expects 4"),
            ([torch.randn(4, 3).t()], r"input 0 \('x'\) dim 0 has stride 1; the plan expects 4"),
            ([torch.randn(3, 8)[:, :4]], r"input 0 \('x'\) dim 0 has stride 8"),
            (["x"], r"input 0 \('x'\) is str"),
        ]
        for inputs, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                runner.run(inputs)
        # A dim of size 1 may have any stride: it never moves an address.
        runner.run([torch.randn(4, 1).t()[:, :4].reshape(1, 4)])
        runner.run([torch.randn(4, 4)[:1]])

    def test_a_symbol_bound_twice_must_agree(self):
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.extend([placeholder("a", ["s0"], [1]), placeholder("b", ["s0"], [1])])
        p.symbols.add(symbol="s0", input=0, dim=0)
        p.symbols.add(symbol="s0", input=1, dim=0)
        p.steps.append(extern("add", "aten.add.Tensor", [tensor_arg("a"), tensor_arg("b")],
                              ["sum"]))
        p.outputs.append("sum")
        runner = PlanRunner(g)
        self.assertEqual(runner.run([torch.ones(3), torch.ones(3)])[0].tolist(), [2.0] * 3)
        with self.assertRaisesRegex(ValueError, r"input 1 \('b'\) dim 0 is 4, but symbol s0 is 3 "
                                                r"from input 0 \('a'\) dim 0"):
            runner.run([torch.ones(3), torch.ones(4)])

    def test_plan_errors_name_the_step(self):
        def plan_with(*steps, outputs=()):
            g = artifact_pb2.CompiledGraph()
            g.plan.inputs.append(placeholder("x", [4], [1]))
            g.plan.steps.extend(steps)
            g.plan.outputs.extend(outputs)
            return g

        cases = [
            (plan_with(view("v", "nope", [4], [1])), r"step 0 \(view 'v'\).*'nope' is not defined"),
            (plan_with(free("x"), view("v", "x", [4], [1])), r"step 1 \(view 'v'\).*freed"),
            (plan_with(alloc("x", [4], [1])), "'x' is defined twice"),
            (plan_with(alloc("a", [4], [1]), alloc("b", [4], [1], reuse="a")),
             r"step 1 \(alloc 'b'\): reuse names 'a'"),
            (plan_with(view("v", "x", ["s0"], [1])), "uses the symbol 's0'"),
            (plan_with(view("v", "x", ["s0 +"], [1])), r"step 0 \(view 'v'\): sizes\[0\]"),
            (plan_with(extern("n", "aten.no_such_op.default", [tensor_arg("x")], ["y"])),
             r"step 0 \(extern 'n'\).*no_such_op"),
            (plan_with(artifact_pb2.PlanStep(launch=artifact_pb2.PlanStep.Launch(
                module=0, symbol="kernel_0", buffers=["x"]))), "module 0 out of range"),
            (plan_with(outputs=["y"]), r"plan.outputs\[0\]: the value 'y' is not defined"),
        ]
        for graph, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                PlanRunner(graph)

    def test_run_time_errors_name_the_step(self):
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.append(placeholder("x", ["s0"], [1]))
        p.symbols.add(symbol="s0", input=0, dim=0)
        p.steps.append(alloc("a", ["8 // (s0 - 2)"], [1]))
        p.steps.append(alloc("b", ["s0 - 4"], [1]))
        p.outputs.extend(["a", "b"])
        runner = PlanRunner(g)
        self.assertEqual(list(runner.run([torch.ones(6)])[0].shape), [2])
        with self.assertRaisesRegex(ValueError, r"step 0 \(alloc 'a'\): .*division by zero"):
            runner.run([torch.ones(2)])
        with self.assertRaisesRegex(ValueError, r"step 1 \(alloc 'b'\): size 0 evaluates to -1"):
            runner.run([torch.ones(3)])

        g = artifact_pb2.CompiledGraph()
        g.plan.inputs.append(placeholder("x", [4], [1]))
        g.plan.steps.append(extern("v", "aten.view.default",
                                   [tensor_arg("x"), graph_pb2.Argument(ints=graph_pb2.IntList(
                                       values=[3]))], ["y"]))
        g.plan.outputs.append("y")
        with self.assertRaisesRegex(RuntimeError, r"step 0 \(extern 'v'\): node 'v'"):
            PlanRunner(g).run([torch.ones(4)])

    def test_storage_reuse_only_when_nothing_shares_it(self):
        # A freed 8-float allocation is reused for a 4-float one: the new
        # tensor keeps the 32-byte storage.
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.append(placeholder("x", [4], [1]))
        p.steps.extend([alloc("a", [8], [1]), free("a"), alloc("b", [4], [1], reuse="a")])
        p.outputs.append("b")
        b = PlanRunner(g).run([torch.ones(4)])[0]
        self.assertEqual(b.untyped_storage().nbytes(), 32, "the storage of 'a' was not reused")

        # A view of it is alive: a fresh allocation, never an alias.
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.append(placeholder("x", [4], [1]))
        p.steps.extend([alloc("a", [8], [1]), view("va", "a", [8], [1]), free("a"),
                        alloc("b", [4], [1], reuse="a")])
        p.outputs.extend(["va", "b"])
        va, b = PlanRunner(g).run([torch.ones(4)])
        self.assertEqual(b.storage().nbytes(), 16)
        self.assertNotEqual(b.data_ptr(), va.data_ptr())

        # An extern's output that aliases an input, freed: the caller's
        # tensor shares the storage, so it is not reused.
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.append(placeholder("x", [8], [1]))
        p.steps.extend([extern("a", "aten.alias.default", [tensor_arg("x")], ["a"]), free("a"),
                        alloc("b", [4], [1], reuse="a")])
        p.outputs.append("b")
        x = torch.ones(8)
        b = PlanRunner(g).run([x])[0]
        self.assertNotEqual(b.data_ptr(), x.data_ptr())

        # Too small: a fresh allocation.
        g = artifact_pb2.CompiledGraph()
        p = g.plan
        p.inputs.append(placeholder("x", [4], [1]))
        p.steps.extend([alloc("a", [2], [1]), free("a"), alloc("b", [4], [1], reuse="a")])
        p.outputs.append("b")
        self.assertEqual(PlanRunner(g).run([torch.ones(4)])[0].storage().nbytes(), 16)


@unittest.skipUnless(KILND, "KILND is not set")
class KilnBackendTest(test_server.SharedKilnd, test_training.TrainingGraphCases,
                      training_op_cases.OpTrainingCases, unittest.TestCase):
    """kiln.compile and PlanRunner through a real kilnd, against eager
    PyTorch and the reference runner."""

    def compile_graph(self, graph):
        artifact = self.client.compile(graph, backend="kiln").artifact
        self.assertEqual(artifact.backend, "kiln")
        return artifact

    # (a) Inference: every graph file.

    def test_inference_plans_match_the_reference_runner_on_every_graph_file(self):
        cases = {name: (fn, inputs) for name, fn, inputs in capture_graphs.cases()}
        files = graph_files()
        self.assertEqual(len(files), 6)
        for file_name in files:
            with self.subTest(file=file_name):
                rng = Random()
                msg = f"{file_name}, seed {rng.seed}"
                graph = load_graph(file_name)
                for ph in graph.inputs:  # an inference compile
                    ph.value.meta.requires_grad = False
                artifact = self.compile_graph(graph)
                self.assertTrue(artifact.HasField("compiled"), msg)
                self.assertFalse(artifact.HasField("compiled_forward"), msg)
                self.assertGreaterEqual(artifact.compiled.plan.kernels, 1, msg)
                runner = PlanRunner(artifact.compiled)

                fn, examples = cases[file_name]
                state = list(kiln.module_tensors(fn)) if isinstance(fn, nn.Module) else []
                inputs = [random_input(rng, ph, t)
                          for ph, t in zip(graph.inputs, state + list(examples))]
                reference_inputs = [t.clone() for t in inputs]
                seed = rng.int(2 ** 31)
                for run in range(2):  # a runner runs many times
                    what = f"{msg}, run {run}"
                    torch.manual_seed(seed)
                    outputs = runner.run(inputs)
                    with torch.no_grad():
                        torch.manual_seed(seed)
                        expected = kiln.run_graph(graph, reference_inputs)
                    self.assertEqual(len(outputs), len(expected), what)
                    for i, (out, ref) in enumerate(zip(outputs, expected)):
                        self.assertEqual(out.dtype, ref.dtype, f"{what}: output {i}")
                        assert_close(self, out, ref, f"{what}: output {i}")
                    # Training-mode batch norm updates the statistics it is
                    # given, in the plan as in the reference.
                    for ph, t, ref in zip(graph.inputs, inputs, reference_inputs):
                        assert_close(self, t, ref, f"{what}: input {ph.value.name} afterwards")

    def test_inference_compile_matches_eager_on_every_case(self):
        for file_name, fn, examples in capture_graphs.cases():
            with self.subTest(file=file_name):
                rng = Random()
                msg = f"{file_name}, seed {rng.seed}"
                is_module = isinstance(fn, nn.Module)
                if is_module:
                    fn.requires_grad_(False)
                    eager_fn = copy.deepcopy(fn)
                else:
                    eager_fn = fn
                inputs = [rng.like(x) for x in examples]
                compiled = kiln.compile(fn, *inputs, client=self.client, backend="kiln")
                self.assertTrue(compiled.artifact.HasField("compiled"), msg)
                inputs = [rng.like(x) for x in examples]
                seed = rng.int(2 ** 31)
                torch.manual_seed(seed)
                out = compiled(*inputs)
                with torch.no_grad():
                    torch.manual_seed(seed)
                    expected = eager_fn(*inputs)
                self.assertIsNone(out.grad_fn, msg)
                assert_close(self, out, expected, f"{msg}: output")
                if is_module:
                    for (name, b), ref in zip(fn.named_buffers(), eager_fn.buffers()):
                        if not name.endswith("num_batches_tracked"):
                            assert_close(self, b, ref, f"{msg}: buffer {name}")

    def test_inference_artifact_and_inputs_that_require_grad(self):
        rng = Random()
        x = rng.like(torch.empty(4, 8))
        compiled = kiln.compile(lambda x: torch.tanh(x) * 2, x, client=self.client,
                                backend="kiln")
        self.assertTrue(compiled.artifact.HasField("compiled"))
        self.assertFalse(compiled.artifact.HasField("compiled_forward"))
        inference = compiled.kiln_backend.loaded[0]
        self.assertTrue(inference.inference_only)
        # The artifact's runner refuses an input that requires grad...
        x.requires_grad_()
        with self.assertRaisesRegex(ValueError, r"input '\w+' requires grad.*inference only.*"
                                                "requires_grad set"):
            inference([x])
        with torch.no_grad():
            assert_close(self, inference([x])[0], torch.tanh(x) * 2, f"seed {rng.seed}: no_grad")
        # ... and the strides it was compiled for.
        with self.assertRaisesRegex(ValueError, r"input 0 \('\w+'\) dim 0 has stride 1"):
            inference([torch.randn(8, 4).t()])

        # Through the compiled function, Dynamo's guards see both: each
        # compiles another graph, a training one for the input that requires
        # grad, which computes what eager PyTorch does.
        out = compiled(x)
        self.assertEqual(compiled.kiln_backend.stats["graphs"], 2)
        self.assertTrue(compiled.artifact.HasField("compiled_forward"))
        self.assertIsNotNone(out.grad_fn)
        x_eager = x.detach().clone().requires_grad_()
        expected = torch.tanh(x_eager) * 2
        assert_close(self, out, expected, f"seed {rng.seed}: requires grad")
        out.sum().backward()
        expected.sum().backward()
        assert_close(self, x.grad, x_eager.grad, f"seed {rng.seed}: grad of x")
        transposed = rng.like(torch.empty(8, 4)).t()
        assert_close(self, compiled(transposed), torch.tanh(transposed) * 2,
                     f"seed {rng.seed}: transposed")
        self.assertEqual(compiled.kiln_backend.stats["graphs"], 3)
        strides = [s.int_value for s in compiled.graph.inputs[0].value.meta.strides]
        self.assertEqual(strides, [1, 4])
        self.assertEqual(compiled.kiln_backend.stats["eager"], 0)

    def test_modules_are_loaded_once_per_process(self):
        graph = load_graph("rmsnorm.json")
        for ph in graph.inputs:
            ph.value.meta.requires_grad = False
        artifact = self.compile_graph(graph)
        loader = ModuleLoader.shared()
        PlanRunner(artifact.compiled)
        loads = loader.loads
        runners = [PlanRunner(artifact.compiled) for _ in range(3)]
        self.assertEqual(loader.loads, loads)
        x, w = torch.randn(8, 32), torch.randn(32)
        expected = kiln.run_graph(graph, [w, x])[0]
        for r in runners:
            assert_close(self, r.run([w, x])[0], expected, "rmsnorm")

        # One runner, several threads at once, each with its own inputs.
        inputs = [(torch.randn(32), torch.randn(8, 32)) for _ in range(8)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outputs = list(pool.map(lambda wx: runners[0].run(list(wx))[0], inputs * 8))
        for (w, x), out in zip(inputs * 8, outputs):
            assert_close(self, out, kiln.run_graph(graph, [w, x])[0], "rmsnorm, threads")

    # (b) Training.

    def check_training(self, name, fn, examples):
        def compiled_for_training(test, artifact, msg):
            for field in ("autograd", "compiled_forward", "compiled_backward"):
                test.assertTrue(artifact.HasField(field), f"{msg}: {field}")
            test.assertFalse(artifact.HasField("compiled"), msg)
            test.assertGreaterEqual(artifact.compiled_forward.plan.kernels, 1, msg)

        return test_training.check_training(self, "kiln", compiled_for_training, name, fn,
                                            examples)

    def test_training_artifact_without_grad_runs_the_forward_plan(self):
        model, examples = case("mlp.json")
        rng = Random()
        x = rng.like(examples[0])
        compiled = kiln.compile(model, x, client=self.client, backend="kiln")
        self.assertTrue(compiled.artifact.HasField("compiled_forward"))
        with torch.no_grad():
            out = compiled(x)
            expected = model(x)
        self.assertIsNone(out.grad_fn)
        assert_close(self, out, expected, f"seed {rng.seed}: no_grad")

    # (c) Fusion.

    def check_fused(self, name, fn, args, kernels, externs):
        """Compiles `fn` for inference; checks its plan's kernel count and
        Extern targets (`externs`: a list of allowed target lists) and its
        result against eager. Returns the artifact."""
        rng = Random()
        args = [rng.like(a) for a in args]
        compiled = kiln.compile(fn, *args, client=self.client, backend="kiln")
        plan = compiled.artifact.compiled
        targets = [s.extern_call.node.target for s in steps_of(plan, "extern_call")]
        self.assertIn(targets, externs, f"{name}: extern steps")
        self.assertLessEqual(plan.plan.kernels, kernels, f"{name}: kernels")
        self.assertEqual(len(steps_of(plan, "launch")), plan.plan.kernels, name)
        assert_close(self, compiled(*args), fn(*args), f"{name}, seed {rng.seed}")
        return compiled.artifact

    def test_layer_norm_is_one_kernel(self):
        artifact = self.check_fused(
            "layer_norm", lambda x, w, b: F.layer_norm(x, (32,), w, b),
            [torch.empty(8, 32), torch.empty(32), torch.empty(32)], kernels=1, externs=[[]])
        self.assertEqual(artifact.compiled.plan.kernels, 1)
        # Training: the forward plan is one kernel too (output, mean, rstd).
        x, w, b = (torch.randn(s, requires_grad=True) for s in ((8, 32), (32,), (32,)))
        compiled = kiln.compile(lambda x, w, b: F.layer_norm(x, (32,), w, b), x, w, b,
                                client=self.client, backend="kiln")
        forward = compiled.artifact.compiled_forward
        self.assertEqual(forward.plan.kernels, 1)
        self.assertEqual(steps_of(forward, "extern_call"), [])

    def test_softmax_is_one_kernel(self):
        artifact = self.check_fused("softmax", lambda x: torch.softmax(x, -1),
                                    [torch.empty(8, 32)], kernels=1, externs=[[]])
        self.assertEqual(artifact.compiled.plan.kernels, 1)

    def test_powers_that_aten_computes_without_pow(self):
        """x.pow(e) for the exponents ATen computes by products, sqrt or a
        reciprocal (x.pow(1) is what the derivative of x.pow(2) asks for):
        no pow call in the generated code, and ATen's results; other
        exponents (and two products in 16 bits) still call pow."""
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            special = (1, 2, 0.5, -0.5, -1) + ((3, -2) if dtype != torch.bfloat16 else ())
            for e in (1, 2, 3, 0.5, -0.5, -1, -2, 1.5, 4):
                with self.subTest(dtype=dtype, exponent=e):
                    x = torch.rand(8, 32, dtype=dtype) + 0.5
                    compiled = kiln.compile(lambda x, e=e: x.pow(e) * 2, x,
                                            client=self.client, backend="kiln")
                    source = "".join(m.source for m in compiled.artifact.compiled.modules)
                    body = source[source.index("kernel_0"):]
                    self.assertEqual("pow(" in body, e not in special, f"pow({e}) in {body}")
                    x = torch.rand(8, 32, dtype=dtype) + 0.5
                    if dtype == torch.bfloat16:
                        # ATen's CPU kernel rounds x * x of x.pow(3) to 16
                        # bits, pow does not: a bfloat16 step apart.
                        torch.testing.assert_close(compiled(x), x.pow(e) * 2)
                    else:
                        assert_close(self, compiled(x), x.pow(e) * 2, f"{dtype} pow {e}")
        # Integers: x.pow(1) is a copy; a float exponent makes floats.
        for e in (1, 1.0, 3):
            with self.subTest(dtype=torch.int64, exponent=e):
                x = torch.randint(-5, 5, (8, 32))
                compiled = kiln.compile(lambda x, e=e: x.pow(e) + 1, x, client=self.client,
                                        backend="kiln")
                out = compiled(x)
                self.assertEqual(out.dtype, (x.pow(e) + 1).dtype)
                torch.testing.assert_close(out, x.pow(e) + 1, rtol=0, atol=0)

    def test_identical_layers_share_their_kernels(self):
        """Six identical layers: the kernels of the middle layers (the first
        and last fuse with what is around them) are generated and compiled
        once and launched once per layer, each launch on its own tensors;
        inference and training match eager."""
        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(32)
                self.fc = nn.Linear(32, 32)

            def forward(self, x):
                return x + torch.tanh(self.fc(self.norm(x)))

        torch.manual_seed(0)
        model = nn.Sequential(*[Layer() for _ in range(6)])
        x = torch.randn(16, 32)
        with torch.no_grad():
            compiled = kiln.compile(copy.deepcopy(model).requires_grad_(False), x,
                                    client=self.client, backend="kiln")
            plan = compiled.artifact.compiled
            launches = [s.launch.symbol for s in steps_of(plan, "launch")]
            defined = "".join(m.source for m in plan.modules).count("void kernel_")
            self.assertLess(len(set(launches)), len(launches), launches)
            self.assertEqual(defined, len(set(launches)), launches)
            assert_close(self, compiled(x), model(x), "inference")
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        twin = copy.deepcopy(model)
        compiled = kiln.compile(model, xs[0], client=self.client, backend="kiln")
        backward = compiled.artifact.compiled_backward
        launches = [s.launch.symbol for s in steps_of(backward, "launch")]
        self.assertLess(len(set(launches)), len(launches), launches)
        compiled(xs[0]).pow(2).sum().backward()
        twin(xs[1]).pow(2).sum().backward()
        assert_close(self, xs[0].grad, xs[1].grad, "input gradient")
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            assert_close(self, p.grad, q.grad, f"gradient of {name}")

    def test_gelu_of_a_linear_layer_is_a_matmul_and_one_kernel(self):
        # x @ w + b captures as mm then add: the add and the gelu fuse into
        # one kernel after the mm. (Were it captured as addmm, the addmm
        # would be the extern and the gelu at most one kernel.)
        artifact = self.check_fused(
            "gelu(x @ w + b)", lambda x, w, b: F.gelu(x @ w + b),
            [torch.empty(8, 32), torch.empty(32, 16), torch.empty(16)], kernels=1,
            externs=[["aten.mm.default"], ["aten.addmm.default"]])
        externs = [s.extern_call.node.target for s in steps_of(artifact.compiled, "extern_call")]
        if externs == ["aten.mm.default"]:
            self.assertEqual(artifact.compiled.plan.kernels, 1)

    # (d) The debug trace.

    def test_kilnctl_trace_writes_generated_code_and_fusion_decisions(self):
        self.assertTrue(KILNCTL and os.path.isfile(KILNCTL), f"no kilnctl: KILNCTL={KILNCTL}")
        tmp = tempfile.mkdtemp(prefix="kiln_trace_test_")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        for name, requires_grad, code_file, fusion_file in [
                ("inference", False, "generated_code.cc", "ir_after_fusion.txt"),
                ("training", True, "forward_generated_code.cc", "forward_ir_after_fusion.txt")]:
            with self.subTest(artifact=name):
                graph = kiln.capture(lambda x, w, b: F.gelu(F.layer_norm(x, (16,), w, b)),
                                     *(torch.randn(s, requires_grad=requires_grad)
                                       for s in ((4, 16), (16,), (16,))))
                graph_file = os.path.join(tmp, f"{name}.json")
                with open(graph_file, "w") as f:
                    f.write(json_format.MessageToJson(service_pb2.GraphFile(graph=graph)))
                compiled = self.kilnctl("compile", graph_file, "--backend=kiln", "--json")
                key = json.loads(compiled)["key"]
                out_dir = os.path.join(tmp, f"trace_{name}")
                listing = self.kilnctl("trace", key, "-o", out_dir)
                files = os.listdir(out_dir)
                self.assertIn(code_file, files, listing)
                self.assertIn(fusion_file, files, listing)
                with open(os.path.join(out_dir, code_file)) as f:
                    self.assertIn('extern "C"', f.read())
                with open(os.path.join(out_dir, fusion_file)) as f:
                    self.assertIn("fusion decisions", f.read())

    def kilnctl(self, *args):
        result = subprocess.run([KILNCTL, f"--server={self.server.address}", *args],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, f"kilnctl {' '.join(args)}:\n{result.stderr}")
        return result.stdout


if __name__ == "__main__":
    unittest.main()


class CpuCheckTest(unittest.TestCase):
    """The runtime refuses an artifact it cannot run before any code loads
    (the feature table per ISA level is the C++ runtime's, tested there)."""

    def test_artifact_header_is_checked(self):
        from kiln._executor import check_artifact
        artifact = artifact_pb2.Artifact(format_version=1)
        artifact.target.device_type = "cpu"
        artifact.target.cpu_isa = "x86-64-v2"
        check_artifact(artifact)  # this machine ran every kiln test above
        artifact.target.cpu_isa = "native"
        check_artifact(artifact)
        artifact.format_version = 99
        with self.assertRaisesRegex(RuntimeError, "format_version 99 is newer"):
            check_artifact(artifact)
