"""The troubleshooting toolkit end to end against a real kilnd ($KILND, with
kilnctl beside it or $KILNCTL): injected faults, the compile-error minifier
and its repro script, record and replay of failed compiles."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
from google.protobuf import json_format

import kiln
from kiln.compiled import ArtifactFunction
from kiln.v1 import service_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_server import KILND, Kilnd, SharedKilnd  # noqa: E402

KILNCTL = os.environ.get("KILNCTL") or (
    os.path.join(os.path.dirname(KILND), "kilnctl") if KILND else None)


def long_chain(x):
    """121 nodes; one relu, near the end (what follows it shrinks any error
    in it: the tail of the chain is a contraction)."""
    for i in range(30):
        x = torch.tanh(x) * 1.5 + torch.sigmoid(x)
        if i == 27:
            x = torch.relu(x)
    return x


def options(backend, fault=None):
    o = service_pb2.CompileOptions(backend=backend)
    if fault:
        o.options.add(name="inject_fault", value=fault)
    return o


@unittest.skipUnless(KILND, "KILND is not set")
class ToolkitTest(SharedKilnd, unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kiln_toolkit_test_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def kilnctl(self, *args, check=True):
        done = subprocess.run([KILNCTL, f"--server={self.server.address}", *args],
                              capture_output=True, text=True, timeout=600)
        if check:
            self.assertEqual(done.returncode, 0, f"kilnctl {' '.join(args)}:\n{done.stderr}")
        return done

    def graph_file(self, graph, opts):
        path = os.path.join(self.tmp, f"{graph.name}.json")
        with open(path, "w") as f:
            f.write(json_format.MessageToJson(service_pb2.GraphFile(graph=graph, options=opts)))
        return path

    def test_minify_an_injected_compile_error_and_run_its_repro(self):
        graph = kiln.capture(long_chain, torch.randn(4, 8), name="long_chain")
        self.assertGreater(len(graph.nodes), 100)
        path = self.graph_file(graph, options("kiln", "compile_error:aten.relu.default"))
        out = os.path.join(self.tmp, "minified")
        shown = self.kilnctl("minify", path, "-o", out)
        self.assertIn(f"from {len(graph.nodes)} to ", shown.stdout)

        with open(os.path.join(out, "minified.json")) as f:
            minified = json_format.Parse(f.read(), service_pb2.GraphFile())
        targets = [n.target for n in minified.graph.nodes]
        self.assertLessEqual(len(targets), 3, targets)
        self.assertIn("aten.relu.default", targets)

        repro = subprocess.run([sys.executable, os.path.join(out, "repro.py")],
                               capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, KILN_SERVER=self.server.address))
        self.assertNotEqual(repro.returncode, 0, repro.stdout)
        self.assertIn("injected compile error (inject_fault=compile_error:aten.relu.default)",
                      repro.stderr)

        # The failed compile was kept: listed, and replayed.
        listed = self.kilnctl("failures").stdout
        self.assertIn("long_chain", listed)
        failure = next(f for f in self.client_failures() if f.graph_name == "long_chain"
                       and len(f.key) == 64)
        replayed = self.kilnctl("replay", failure.id).stdout
        self.assertIn("replay: still fails, the same way", replayed)

    def client_failures(self):
        done = self.kilnctl("failures", "--json")
        return json_format.Parse(done.stdout, service_pb2.ListFailuresResponse()).failures

    def test_minify_after_aot_finds_the_backward_graph(self):
        x = torch.randn(4, 8, requires_grad=True)
        graph = kiln.capture(lambda x: torch.relu(torch.tanh(x) * 2).sum(dim=1), x,
                             name="relu_train")
        # masked_fill (the gradient zeroed where relu's result is <= 0) is in
        # relu's backward alone.
        fault = "compile_error:aten.masked_fill.Scalar"
        path = self.graph_file(graph, options("kiln", fault))
        failed = self.kilnctl("compile", path, check=False)
        self.assertNotEqual(failed.returncode, 0)
        self.assertIn("injected compile error", failed.stderr)
        out = os.path.join(self.tmp, "aot")
        shown = self.kilnctl("minify", path, "--after=aot", "-o", out)
        self.assertRegex(shown.stdout, r"minified the backward graph from \d+ to [123] nodes")
        with open(os.path.join(out, "minified.json")) as f:
            minified = json_format.Parse(f.read(), service_pb2.GraphFile())
        self.assertIn("aten.masked_fill.Scalar", [n.target for n in minified.graph.nodes])

    def test_minify_an_injected_accuracy_bug(self):
        graph = kiln.capture(long_chain, torch.randn(4, 8), name="long_chain")
        with kiln.Client(self.server.address) as client:
            small = kiln.minify_accuracy(graph, None, client,
                                         options("kiln", "accuracy:aten.relu.default"))
            targets = [n.target for n in small.graph.nodes]
            self.assertLessEqual(len(targets), 3, targets)
            self.assertIn("aten.relu.default", targets)
            self.assertGreater(small.error, 0.5)
            self.assertEqual(len(small.inputs), len(small.graph.inputs))
            # Without the fault, the code is as accurate as eager.
            with self.assertRaisesRegex(ValueError, "is accurate"):
                kiln.minify_accuracy(graph, None, client, options("kiln"))
        path = self.graph_file(graph, options("kiln", "accuracy:aten.relu.default"))
        out = os.path.join(self.tmp, "accuracy")
        done = subprocess.run([sys.executable, "-m", "kiln", "minify", "--accuracy", path,
                               f"--server={self.server.address}", "-o", out],
                              capture_output=True, text=True, timeout=600)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn(f"minified from {len(graph.nodes)} to ", done.stdout)
        with open(os.path.join(out, "minified.json")) as f:
            minified = json_format.Parse(f.read(), service_pb2.GraphFile())
        self.assertIn("aten.relu.default", [n.target for n in minified.graph.nodes])

    def test_minify_a_wrong_gradient(self):
        # The fault is in relu's derivative (its masked_fill): the outputs are
        # right, the input's gradient is not.
        x = torch.randn(4, 8, requires_grad=True)
        graph = kiln.capture(lambda x: torch.relu(torch.tanh(x) * 2 - 0.5).sum(dim=1) * 3, x,
                             name="relu_train")
        fault = options("kiln", "accuracy:aten.masked_fill.Scalar")
        with kiln.Client(self.server.address) as client:
            small = kiln.minify_accuracy(graph, None, client, fault)
            with self.assertRaisesRegex(ValueError, "is accurate"):
                kiln.minify_accuracy(graph, None, client, options("kiln"))
        targets = [n.target for n in small.graph.nodes]
        self.assertLessEqual(len(targets), 3, targets)
        self.assertIn("aten.relu.default", targets)
        self.assertGreater(small.error, 0.05)

    def test_injected_runtime_error_fails_when_the_code_runs(self):
        x = torch.randn(64, 16)
        graph = kiln.capture(lambda x: torch.relu(x) * 2, x, name="relu_twice")
        with kiln.Client(self.server.address) as client:
            compiled = client.compile(graph,
                                      options=options("kiln", "runtime_error:aten.relu.default"))
        fn = ArtifactFunction(compiled.artifact, graph)  # loads: the fault waits for a run
        with self.assertRaisesRegex(RuntimeError, r"injected runtime error "
                                    r"\(inject_fault=runtime_error:aten.relu.default\) at node "
                                    r"'relu'"):
            fn([x])

    def test_injected_accuracy_fault_computes_a_wrong_value(self):
        x = torch.randn(64, 16)
        graph = kiln.capture(lambda x: torch.relu(x) * 2, x, name="relu_twice")
        with kiln.Client(self.server.address) as client:
            right = client.compile(graph, backend="kiln")
            wrong = client.compile(graph, options=options("kiln", "accuracy:aten.relu.default"))
        self.assertNotEqual(right.key, wrong.key)
        want = torch.relu(x) * 2
        torch.testing.assert_close(ArtifactFunction(right.artifact, graph)([x])[0], want)
        # relu(x) + 1, then * 2: off by exactly 2 everywhere.
        torch.testing.assert_close(ArtifactFunction(wrong.artifact, graph)([x])[0], want + 2)


@unittest.skipUnless(KILND, "KILND is not set")
class BackgroundMinifyTest(unittest.TestCase):

    def test_kilnctl_show_points_to_the_background_result(self):
        import time

        tmp = tempfile.mkdtemp(prefix="kiln_bg_minify_")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        server = Kilnd(os.path.join(tmp, "data"), ["--minify_failures"])
        self.addCleanup(server.stop)
        graph = kiln.capture(long_chain, torch.randn(4, 8), name="long_chain")
        with kiln.Client(server.address) as client:
            with self.assertRaisesRegex(kiln.KilnError, "injected compile error"):
                client.compile(graph, options=options("kiln", "compile_error:aten.relu.default"))

        def kilnctl(*args):
            done = subprocess.run([KILNCTL, f"--server={server.address}", *args],
                                  capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
            return done.stdout

        deadline = time.monotonic() + 120
        while "1 nodes" not in kilnctl("failures") and time.monotonic() < deadline:
            time.sleep(0.2)
        listed = kilnctl("failures")
        self.assertIn("1 nodes", listed)
        key = next(line.split()[6] for line in listed.splitlines()[1:])
        shown = kilnctl("show", key)
        self.assertRegex(shown, r"minified in the background to 1 nodes: kilnctl minify "
                                r"[0-9a-f]{16} -o DIR")


if __name__ == "__main__":
    unittest.main()
