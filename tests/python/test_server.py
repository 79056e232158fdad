"""The Python client against a real kilnd (the binary named by $KILND).

Each test starts its own kilnd on a free port with a fresh data directory and
stops it with SIGTERM, expecting a clean exit. Skipped when KILND is unset;
a KILND that names no file is a failure.
"""

import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

import torch
from google.protobuf import json_format

import kiln
from kiln.compiled import ArtifactFunction
from kiln.v1 import service_pb2

KILND = os.environ.get("KILND")
GRAPHS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data",
                          "graphs")
sys.path.insert(0, os.path.join(GRAPHS_DIR, os.pardir))
import capture_graphs  # noqa: E402

LISTENING = re.compile(r"kilnd listening on (127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60


def close(test, got, want, what, tol=2e-4):
    """Asserts that tensor `got` has `want`'s shape and values (to `tol`)."""
    test.assertEqual(got.shape, want.shape, what)
    test.assertTrue(torch.allclose(got, want, rtol=tol, atol=tol),
                    f"{what}: max difference {(got - want).abs().max().item()}")


def load_graph(file_name):
    with open(os.path.join(GRAPHS_DIR, file_name)) as f:
        return json_format.Parse(f.read(), service_pb2.GraphFile()).graph


def outcome(value):
    return service_pb2.LookupOutcome.Name(value)


class Kilnd:
    """One kilnd process on 127.0.0.1 with a given data directory."""

    def __init__(self, data_dir, extra_args=()):
        self.data_dir = data_dir
        self.log_path = data_dir + ".log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [KILND, "--listen=127.0.0.1:0", f"--data_dir={data_dir}", *extra_args],
                stdout=subprocess.PIPE, stderr=log)
        lines = queue.Queue()
        # Drains stdout for the server's whole life, so it never blocks on a
        # full pipe.
        self.reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self.reader.start()
        self.address = None
        try:
            while self.address is None:
                line = lines.get(timeout=START_TIMEOUT_S)
                if line is None:
                    raise AssertionError(f"kilnd exited with {self.process.wait()} before "
                                         f"listening:\n{self.log_tail()}")
                match = LISTENING.search(line)
                if match:
                    self.address = match.group(1)
        except queue.Empty:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"kilnd did not print 'kilnd listening on' within "
                                 f"{START_TIMEOUT_S} s:\n{self.log_tail()}") from None

    def _read(self, lines):
        with self.process.stdout:
            for raw in self.process.stdout:
                lines.put(raw.decode(errors="replace"))
        lines.put(None)

    def log_tail(self):
        """The end of the server's stderr."""
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def stop(self):
        """SIGTERMs the server; returns its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return "still running after SIGTERM"
        finally:
            self.reader.join(timeout=10)


class SharedKilnd:
    """A test class mixin: one kilnd (in a temporary directory) and a client
    of it for all of the class's tests, stopped with SIGTERM at the end,
    which must exit cleanly."""

    @classmethod
    def setUpClass(cls):
        assert os.path.isfile(KILND), f"KILND={KILND} does not exist"
        cls.tmp = tempfile.mkdtemp(prefix=f"kiln_{cls.__name__}_")
        cls.server = Kilnd(os.path.join(cls.tmp, "data"))
        cls.client = kiln.Client(cls.server.address, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        status = cls.server.stop()
        log = cls.server.log_tail()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert status == 0, f"kilnd exit status after SIGTERM: {status}\n{log}"


@unittest.skipUnless(KILND, "KILND is not set")
class ServerTest(unittest.TestCase):

    def setUp(self):
        self.assertTrue(os.path.isfile(KILND), f"KILND={KILND} does not exist")
        self.tmp = tempfile.mkdtemp(prefix="kiln_server_test_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.data_dir = os.path.join(self.tmp, "data")
        self.server = None
        self.client = None
        self.start()

    def tearDown(self):
        self.stop()

    def start(self):
        self.server = Kilnd(self.data_dir)
        self.client = kiln.Client(self.server.address, timeout=60)

    def stop(self):
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            server, self.server = self.server, None
            status = server.stop()
            self.assertEqual(status, 0, f"kilnd exit status after SIGTERM:\n{server.log_tail()}")

    def restart(self):
        self.stop()
        self.start()

    def lookup_in_another_process(self, file_name):
        """Looks up a graph file from a fresh Python process; returns (outcome, key)."""
        script = textwrap.dedent(f"""
            import sys
            from google.protobuf import json_format
            import kiln
            from kiln.v1 import service_pb2
            with open({os.path.join(GRAPHS_DIR, file_name)!r}) as f:
                graph = json_format.Parse(f.read(), service_pb2.GraphFile()).graph
            reply = kiln.Client({self.server.address!r}).lookup(graph)
            print(service_pb2.LookupOutcome.Name(reply.outcome), reply.key)
        """)
        # The child finds kiln and kiln.v1 where this process found them.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(os.path.dirname(p) for p in kiln.__path__)
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        found, key = done.stdout.split()
        return found, key

    def test_compile_then_hit_from_another_process(self):
        graph = load_graph("mlp.json")
        compiled = self.client.compile(graph, backend="eager")
        self.assertEqual(outcome(compiled.outcome), "FULL_MISS")
        self.assertTrue(compiled.key)
        self.assertTrue(compiled.digest)
        self.assertEqual(compiled.artifact.backend, "eager")
        self.assertEqual(len(compiled.artifact.graph.nodes), len(graph.nodes))

        found, key = self.lookup_in_another_process("mlp.json")
        self.assertEqual(found, "HIT")
        self.assertEqual(key, compiled.key)

        # Compiling again is served from the cache.
        again = self.client.compile(graph, backend="eager")
        self.assertEqual(outcome(again.outcome), "HIT")
        self.assertEqual(again.digest, compiled.digest)
        fetched = self.client.get_artifact(compiled.digest)
        self.assertEqual(fetched.artifact.backend, "eager")

    def test_cache_and_stats_survive_a_restart(self):
        graph = load_graph("mlp.json")
        compiled = self.client.compile(graph)
        self.assertEqual(outcome(self.client.lookup(graph).outcome), "HIT")
        hits = self.client.stats().counters.hits
        self.assertGreaterEqual(hits, 1)

        self.restart()
        self.assertGreaterEqual(self.client.stats().counters.hits, hits)
        reply = self.client.lookup(graph)
        self.assertEqual(outcome(reply.outcome), "HIT", reply.reason)
        self.assertEqual(reply.key, compiled.key)
        self.assertGreaterEqual(self.client.stats().counters.hits, hits + 1)

    def test_frozen_server_serves_hits_and_refuses_misses(self):
        cached = load_graph("mlp.json")
        other = load_graph("rmsnorm.json")
        self.client.compile(cached)

        self.assertTrue(self.client.freeze().frozen)
        self.assertTrue(self.client.stats().frozen)
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.compile(other)
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.assertRegex(cm.exception.message.lower(), "miss")
        self.assertEqual(outcome(self.client.lookup(cached).outcome), "HIT")
        self.assertGreaterEqual(self.client.stats().counters.frozen_misses, 1)

        self.assertFalse(self.client.thaw().frozen)
        compiled = self.client.compile(other)
        self.assertEqual(outcome(compiled.outcome), "FULL_MISS")
        self.assertEqual(len(compiled.artifact.graph.nodes), len(other.nodes))

    def test_live_capture_hits_by_key_and_guard_misses_on_batch(self):
        rng = random.Random()
        batch, dim = rng.randint(2, 16), rng.choice([8, 24, 64, 96])
        model = capture_graphs.RMSNorm(dim)
        x = torch.randn(batch, dim)
        graph = kiln.capture(model, x)
        msg = f"batch {batch}, dim {dim}"

        compiled = self.client.compile(graph)
        self.assertEqual(outcome(compiled.outcome), "FULL_MISS", msg)
        same = kiln.signature(*kiln.module_tensors(model), torch.randn(batch, dim))
        reply = self.client.lookup(key=compiled.key, signature=same)
        self.assertEqual(outcome(reply.outcome), "HIT", f"{msg}: {reply.reason}")
        self.assertEqual(reply.digest, compiled.digest)

        wider = kiln.signature(*kiln.module_tensors(model), torch.randn(batch + 1, dim))
        reply = self.client.lookup(key=compiled.key, signature=wider)
        self.assertEqual(outcome(reply.outcome), "GUARD_MISS", f"{msg}: {reply.reason}")
        self.assertGreaterEqual(len(reply.misses), 1)
        self.assertIn("size[0]", reply.misses[0].failed_guard)

    def test_automatic_dynamic_serves_later_sizes_from_one_symbolic_variant(self):
        """Static graphs of one program at batches 2 and 3 make kilnd compile
        one symbolic variant; later batches are served by it without a
        compile, and its code computes what eager does at each size."""
        torch.manual_seed(0)
        block = capture_graphs.TransformerBlock().eval()
        cases = [("kiln", capture_graphs.MLP(), lambda b: torch.randn(b, 32)),
                 ("eager", capture_graphs.MLP(), lambda b: torch.randn(b, 32)),
                 ("kiln", block, lambda b: torch.randn(b, 16, 32))]
        for backend, model, make in cases:
            ns = f"auto-{backend}-{type(model).__name__}"
            with self.subTest(backend=backend, model=type(model).__name__):
                first = self.client.compile(kiln.capture(model, make(2)), backend=backend,
                                            namespace=ns)
                second = self.client.compile(kiln.capture(model, make(3)), backend=backend,
                                             namespace=ns)
                self.assertEqual([m.key for m in second.misses], [first.key])
                entry = self.client.get_entry(second.key, ns).entry
                self.assertEqual(entry.recompiles[0].automatic_dynamic,
                                 f"s0: input {len(kiln.module_tensors(model))} 'x' size[0]")
                compiles = self.client.stats().counters.compiles
                for batch in (5, 11):
                    x = make(batch)
                    graph = kiln.capture(model, x)
                    served = self.client.compile(graph, backend=backend, namespace=ns)
                    self.assertEqual(outcome(served.outcome), "HIT", f"batch {batch}")
                    self.assertEqual(served.digest, second.digest, f"batch {batch}")
                    fn = ArtifactFunction(served.artifact, graph)
                    with torch.no_grad():
                        got = fn(list(kiln.module_tensors(model)) + [x])[0]
                        want = model(x)
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4,
                                               msg=f"batch {batch}")
                self.assertEqual(self.client.stats().counters.compiles, compiles)

    def test_every_graph_file_compiles(self):
        for path in sorted(os.listdir(GRAPHS_DIR)):
            with self.subTest(file=path):
                graph = load_graph(path)
                compiled = self.client.compile(graph, backend="eager")
                self.assertEqual(outcome(compiled.outcome), "FULL_MISS")
                self.assertEqual(len(compiled.artifact.graph.nodes), len(graph.nodes))
                self.assertEqual(len(compiled.artifact.graph.outputs), len(graph.outputs))

    def test_entries_and_eviction(self):
        graph = load_graph("conv_block.json")
        compiled = self.client.compile(graph)
        listed = self.client.list_entries()
        self.assertIn(compiled.key, [e.key for e in listed.entries])
        entry = self.client.get_entry(compiled.key).entry
        self.assertEqual(len(entry.variants), 1)
        self.assertEqual(entry.variants[0].digest, compiled.digest)

        evicted = self.client.evict(compiled.key)
        self.assertEqual(evicted.variants, 1)
        reply = self.client.lookup(graph)
        self.assertEqual(outcome(reply.outcome), "FULL_MISS", reply.reason)


if __name__ == "__main__":
    unittest.main()
