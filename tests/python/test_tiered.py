"""Tiered compiles through torch.compile (kiln.backend(tiered=True)): the
first calls run kilnd's quick artifact, the graph run through ATen (its
forward and backward graphs, in training), later ones the optimized kernels
that replace it, and every call matches eager. A real kilnd ($KILND) on
loopback, compiling for the CPU."""

import copy
import os
import sys
import unittest

import torch

import kiln
from kiln.v1 import service_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_server import KILND, SharedKilnd, close  # noqa: E402


def commands(function):
    """The native compile commands of an ArtifactFunction's modules."""
    a = function.artifact
    return [m.compile_command for g in (a.compiled, a.compiled_forward, a.compiled_backward)
            for m in g.modules]


class Block(torch.nn.Module):
    """Linear, batch norm (its running statistics written back), GELU and
    layer norm: reductions, pointwise chains and a buffer update."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(24, 48)
        self.bn = torch.nn.BatchNorm1d(48)
        self.norm = torch.nn.LayerNorm(48)
        self.out = torch.nn.Linear(48, 6)

    def forward(self, x):
        return self.out(self.norm(torch.nn.functional.gelu(self.bn(self.fc(x)))))


@unittest.skipUnless(KILND, "KILND is not set")
class TieredTest(SharedKilnd, unittest.TestCase):

    def setUp(self):
        torch._dynamo.reset()

    def train_steps(self, backend, steps, wait_after_first):
        torch.manual_seed(0)
        model = Block()
        reference = copy.deepcopy(model)
        compiled = torch.compile(model, backend=backend)
        for step in range(steps):
            x = torch.randn(16, 24, requires_grad=True)
            x_ref = x.detach().clone().requires_grad_()
            out, want = compiled(x), reference(x_ref)
            close(self, out, want, f"output, step {step}")
            out.pow(2).sum().backward()
            want.pow(2).sum().backward()
            close(self, x.grad, x_ref.grad, f"input gradient, step {step}")
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                close(self, p.grad, q.grad, f"gradient of {name}, step {step}")
                p.grad = q.grad = None
            if step == 0 and wait_after_first:
                self.assertTrue(backend.wait_for_upgrades(timeout=300))
        for (name, b), c in zip(model.named_buffers(), reference.buffers()):
            close(self, b.float(), c.float(), f"buffer {name}")
        self.assertEqual(backend.stats["eager"], 0, backend.stats)

    def test_quick_kernels_first_then_the_optimized_ones(self):
        before = self.client.stats().counters
        be = kiln.backend(self.server.address, tiered=True, job="tiered")
        self.train_steps(be, steps=3, wait_after_first=True)
        graphs = be.stats["graphs"]
        self.assertGreaterEqual(graphs, 1)
        self.assertEqual(be.stats["quick"], graphs, be.stats)
        self.assertEqual(be.stats["upgrades"], graphs, be.stats)
        # The quick artifacts were loaded first, the optimized ones after.
        quick, optimized = be.loaded[:graphs], be.loaded[graphs:]
        self.assertEqual(len(optimized), graphs)
        for f in quick:
            self.assertEqual(f.backend, "aot_eager")
            self.assertTrue(f.has_backward)
            self.assertEqual(commands(f), [])
        for f in optimized:
            self.assertTrue(commands(f) and all(" -O3 " in c for c in commands(f)), commands(f))
        for record in be.graph_times:
            self.assertTrue(record["quick"])
            self.assertGreater(record["optimized"], 0.0)
        self.assertIn("(quick artifact; optimized after ", kiln.compile_times())
        after = self.client.stats().counters
        self.assertEqual(after.quick_compiles - before.quick_compiles, graphs)
        # The request for the optimized artifact is not a second report of
        # the graph: one process met it once.
        reply = self.client._admin.GraphBreaks(
            service_pb2.GraphBreaksRequest(namespace="", job="tiered"))
        self.assertEqual([g.reports for j in reply.jobs for g in j.graphs], [1] * graphs)

        # A warm start finds only the optimized artifacts cached: no quick
        # compile, nothing to replace.
        torch._dynamo.reset()
        warm = kiln.backend(self.server.address, tiered=True)
        self.train_steps(warm, steps=1, wait_after_first=False)
        self.assertEqual(warm.stats["hits"], warm.stats["graphs"], warm.stats)
        self.assertEqual(warm.stats["quick"], 0, warm.stats)
        self.assertEqual(self.client.stats().counters.quick_compiles, after.quick_compiles)

    def test_calls_before_the_optimized_kernels_arrive_run_the_quick_artifact(self):
        # No waiting: the steps run whichever kernels are loaded, and match.
        be = kiln.backend(self.server.address, tiered=True, namespace="no-wait")
        self.train_steps(be, steps=4, wait_after_first=False)
        self.assertEqual(be.stats["quick"], be.stats["graphs"], be.stats)
        self.assertTrue(be.wait_for_upgrades(timeout=300))

    def test_off_on_the_cpu_by_default(self):
        be = kiln.backend(self.server.address, namespace="default")
        self.train_steps(be, steps=1, wait_after_first=False)
        self.assertEqual(be.stats["quick"], 0, be.stats)
        self.assertEqual(be.stats["compiles"], be.stats["graphs"], be.stats)


if __name__ == "__main__":
    unittest.main()
