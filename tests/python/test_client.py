"""kiln.Client against an in-process stand-in for kilnd's services: what it
sends, how it remembers keys, how errors and retries surface."""

import threading
import unittest
from concurrent import futures

import grpc
import torch

import kiln
from kiln.v1 import service_pb2, service_pb2_grpc


class FakeCompiler(service_pb2_grpc.CompilerServicer):
    """Answers Lookup with HIT for the one key it knows; records requests."""

    KEY = "ab" * 32

    def __init__(self):
        self.requests = []
        self.unavailable = 0  # how many calls to refuse with UNAVAILABLE first
        self.lock = threading.Lock()

    def _refuse(self, context):
        with self.lock:
            if self.unavailable > 0:
                self.unavailable -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")

    def Compile(self, request, context):
        self._refuse(context)
        self.requests.append(request)
        if request.frozen:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "frozen: full miss on key")
        return service_pb2.CompileResponse(key=self.KEY, digest="d1",
                                           outcome=service_pb2.FULL_MISS)

    def Lookup(self, request, context):
        self._refuse(context)
        self.requests.append(request)
        response = service_pb2.LookupResponse(key=self.KEY, outcome=service_pb2.HIT)
        if request.include_artifact:
            # An artifact past gRPC's default limit of 4 MiB, as a deep
            # model's is.
            response.artifact.backend = "kiln"
            response.artifact.trace["big.txt"] = "x" * (6 << 20)
        return response


class FakeAdmin(service_pb2_grpc.AdminServicer):

    def Stats(self, request, context):
        return service_pb2.StatsResponse(entries=3, frozen=True)

    def Evict(self, request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, f"no entry '{request.key}'")


class ClientTest(unittest.TestCase):

    def setUp(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.compiler = FakeCompiler()
        service_pb2_grpc.add_CompilerServicer_to_server(self.compiler, self.server)
        service_pb2_grpc.add_AdminServicer_to_server(FakeAdmin(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.client = kiln.Client(f"127.0.0.1:{port}", timeout=10)
        self.x = torch.randn(4, 8)
        self.graph = kiln.capture(torch.relu, self.x, name="relu")

    def tearDown(self):
        self.client.close()
        self.server.stop(None)

    def test_compile_sends_graph_and_options(self):
        response = self.client.compile(self.graph, backend="aot_eager", namespace="team")
        self.assertEqual(response.outcome, service_pb2.FULL_MISS)
        request = self.compiler.requests[-1]
        self.assertEqual(request.graph, self.graph)
        self.assertEqual(request.options.backend, "aot_eager")
        self.assertEqual(request.namespace, "team")
        self.assertFalse(request.HasField("guards"))
        self.assertFalse(request.frozen)

    def test_second_lookup_sends_only_key_and_signature(self):
        first = self.client.lookup(self.graph)
        self.assertEqual(first.outcome, service_pb2.HIT)
        self.assertEqual(self.compiler.requests[-1].WhichOneof("what"), "graph")
        self.assertEqual(self.compiler.requests[-1].options.backend, "eager")

        self.client.lookup(self.graph)
        request = self.compiler.requests[-1]
        self.assertEqual(request.WhichOneof("what"), "key")
        self.assertEqual(request.key, FakeCompiler.KEY)
        # The signature comes from the graph's input metadata.
        self.assertEqual(request.signature, kiln.signature(self.x))

        # Another backend is another key: the graph travels again.
        self.client.lookup(self.graph, backend="kiln")
        self.assertEqual(self.compiler.requests[-1].WhichOneof("what"), "graph")

    def test_compile_remembers_the_key(self):
        self.client.compile(self.graph)
        y = torch.randn(5, 8)
        self.client.lookup(self.graph, signature=kiln.signature(y))
        request = self.compiler.requests[-1]
        self.assertEqual(request.key, FakeCompiler.KEY)
        self.assertEqual(list(request.signature.inputs[0].sizes), [5, 8])

    def test_lookup_by_key(self):
        self.client.lookup(key="cd" * 32, signature=kiln.signature(self.x), include_artifact=True)
        request = self.compiler.requests[-1]
        self.assertEqual(request.key, "cd" * 32)
        self.assertTrue(request.include_artifact)
        with self.assertRaises(ValueError):
            self.client.lookup()
        with self.assertRaises(ValueError):
            self.client.lookup(graph=self.graph, key="cd" * 32)

    def test_artifacts_past_4_mib_are_received(self):
        found = self.client.lookup(key=FakeCompiler.KEY, signature=kiln.signature(self.x),
                                   include_artifact=True)
        self.assertEqual(found.artifact.backend, "kiln")
        self.assertEqual(len(found.artifact.trace["big.txt"]), 6 << 20)

    def test_errors_carry_code_and_message(self):
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.compile(self.graph, frozen=True)
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.assertIn("miss", cm.exception.message)
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.evict("ef" * 32)
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.freeze()  # not served by the stand-in
        self.assertEqual(cm.exception.code, "UNIMPLEMENTED")

    def test_unavailable_is_retried(self):
        self.compiler.unavailable = 2
        self.assertEqual(self.client.lookup(self.graph).outcome, service_pb2.HIT)
        self.compiler.unavailable = kiln.Client.RETRIES + 1
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.lookup(self.graph)
        self.assertEqual(cm.exception.code, "UNAVAILABLE")

    def test_compile_async_answers_as_compile_does(self):
        call = self.client.compile_async(self.graph, recompile_reason="new shape")
        arrived = threading.Event()
        call.add_done_callback(lambda c: arrived.set())
        response = call.result()
        self.assertTrue(arrived.wait(10))
        self.assertTrue(call.done())
        self.assertEqual(response.key, FakeCompiler.KEY)
        self.assertEqual(self.compiler.requests[-1].recompile_reason, "new shape")
        # The key is remembered as compile() remembers it.
        self.client.lookup(self.graph, signature=kiln.signature(self.x))
        self.assertEqual(self.compiler.requests[-1].key, FakeCompiler.KEY)
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.compile_async(self.graph, frozen=True).result()
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.compiler.unavailable = 2  # the call's own attempt and one retry
        self.assertEqual(self.client.compile_async(self.graph).result().key, FakeCompiler.KEY)
        self.compiler.unavailable = kiln.Client.RETRIES + 2
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.compile_async(self.graph).result()
        self.assertEqual(cm.exception.code, "UNAVAILABLE")

    def test_admin(self):
        stats = self.client.stats()
        self.assertEqual(stats.entries, 3)
        self.assertTrue(stats.frozen)


if __name__ == "__main__":
    unittest.main()
