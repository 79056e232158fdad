"""A thin client for kilnd's Compiler and Admin gRPC services.

Every method sends one request and returns the reply message (kiln.v1.*
from service.proto). A failed call raises KilnError with the gRPC status code
name and the server's message; calls that find the server UNAVAILABLE are
retried a few times with exponential backoff first.

Lookup by graph: the server returns the graph's cache key, and the client
remembers it for that graph (by content, together with the backend and
namespace), so the next lookup of the same graph sends only the key and the
input signature. A Client may be shared between threads: its gRPC channel is,
and each call updates the keys it remembers in one step.
"""

import hashlib
import os
import time

import grpc

from kiln.v1 import guards_pb2, service_pb2, service_pb2_grpc

__all__ = ["Client", "KilnError", "PendingCall"]


class KilnError(Exception):
    """A failed call: `code` is the gRPC status code name ("FAILED_PRECONDITION"),
    `message` the server's details."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _signature_from_graph(graph):
    """The input signature that a graph's own input metadata describes."""
    sig = guards_pb2.InputSignature()
    for ph in graph.inputs:
        meta = ph.value.meta
        if any(s.WhichOneof("value") == "expr" for s in list(meta.sizes) + list(meta.strides)):
            raise ValueError(f"input '{ph.value.name}' has symbolic sizes or strides: "
                             "pass a signature")
        entry = sig.inputs.add(
            dtype=meta.dtype,
            sizes=[s.int_value for s in meta.sizes],
            strides=[s.int_value for s in meta.strides],
            requires_grad=meta.requires_grad,
            storage_offset=meta.storage_offset.int_value,
        )
        entry.device.CopyFrom(meta.device)
    return sig


class PendingCall:
    """A call under way (Client.compile_async): gRPC's C core sends the
    request and takes the reply on its own threads. result() waits for the
    reply and returns it; an UNAVAILABLE reply is retried as Client's calls
    are, any other failure raises KilnError."""

    def __init__(self, client, method, request, remembered):
        self._client = client
        self._method = method
        self._request = request
        self._remembered = remembered
        self._future = method.future(request, timeout=client.timeout,
                                     metadata=client._metadata)

    def done(self):
        return self._future.done()

    def add_done_callback(self, fn):
        """Calls fn(self) once the reply (or a failure) is in, on gRPC's
        thread, or at once if it is."""
        self._future.add_done_callback(lambda _: fn(self))

    def result(self):
        try:
            response = self._future.result()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise KilnError(e.code().name, e.details() or "") from None
            time.sleep(self._client.BACKOFF_S)
            response = self._client._call(self._method, self._request)
        if response.key:
            self._client._keys[self._remembered] = response.key
        return response


class Client:
    """Connects to kilnd at `address` ("host:port"); `timeout` is the deadline,
    in seconds, of each call. `token` (default $KILN_TOKEN) is sent as
    "authorization: Bearer <token>"; `root_certificates` (PEM bytes) makes
    the channel TLS, with `certificate_chain` and `private_key` for mutual
    TLS."""

    RETRIES = 4          # further attempts after an UNAVAILABLE reply
    BACKOFF_S = 0.1      # first wait; doubled on every retry

    # The largest message sent or received, as the C++ client's default:
    # gRPC's own default (4 MiB) is less than a deep model's artifact.
    MAX_MESSAGE_BYTES = 256 << 20

    def __init__(self, address, timeout=30.0, token=None, root_certificates=None,
                 certificate_chain=None, private_key=None, max_message_bytes=MAX_MESSAGE_BYTES):
        self.address = address
        self.timeout = timeout
        token = token if token is not None else os.environ.get("KILN_TOKEN")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        if root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates, private_key=private_key,
                certificate_chain=certificate_chain)
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._compiler = service_pb2_grpc.CompilerStub(self._channel)
        self._admin = service_pb2_grpc.AdminStub(self._channel)
        self._keys = {}  # (graph digest, options, namespace) -> key
        self._ready = None  # connect()'s future

    def close(self):
        self._channel.close()

    def connect(self):
        """Starts connecting to kilnd, on gRPC's own threads, and returns at
        once: a first call made after some other work (a graph's lowering)
        then finds the connection made rather than making it."""
        if self._ready is None:
            self._ready = grpc.channel_ready_future(self._channel)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request):
        wait = self.BACKOFF_S
        for attempt in range(self.RETRIES + 1):
            try:
                return method(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.UNAVAILABLE and attempt < self.RETRIES:
                    time.sleep(wait)
                    wait *= 2
                    continue
                raise KilnError(code.name, e.details() or "") from None

    @staticmethod
    def _options(backend, target=None):
        options = service_pb2.CompileOptions(backend=backend)
        if target is not None:
            options.target.CopyFrom(target)
        return options

    def _graph_id(self, graph, options, namespace):
        digest = hashlib.sha256(graph.SerializeToString(deterministic=True)).digest()
        return (digest, options.SerializeToString(deterministic=True), namespace)

    # Compiler service.

    def compile(self, graph, guards=None, backend="eager", namespace="", frozen=False,
                target=None, signature=None, recompile_reason="", options=None,
                bypass_cache=False, report=None, static_shapes=False, quick_first=False):
        """Compiles `graph` (kiln.v1.Graph) unless a cached variant admits it.

        `guards` (kiln.v1.GuardSet) defaults, on the server, to guards that
        hold every input's size, stride, dtype and device exact. With
        `frozen`, a miss fails with FAILED_PRECONDITION instead of compiling.
        `target` (kiln.v1.Target) names what the `kiln` backend generates code
        for; by default kilnd picks the device of the graph's inputs (cpu at
        x86-64-v3, or cuda at sm_90). `signature` (kiln.v1.InputSignature)
        is what the call that needs the graph passes, and `recompile_reason`
        why the client compiles again in its own words: kilnd records both
        with the recompile reasons. `options` (kiln.v1.CompileOptions, as a
        graph file holds them) replaces `backend` and `target`, with its
        backend options (inject_fault, debug_function); `bypass_cache`
        compiles without reading or writing the cache. `report`
        (kiln.v1.GraphReport) tells kilnd where the graph came from, for
        `kilnctl breaks`. With `static_shapes` kilnd compiles the graph as
        sent, never as a symbolic variant of its shape family (automatic
        dynamic shapes). With `quick_first` a miss is answered with an
        artifact compiled at the backend's quick level (the response's
        `quick`), not cached, while kilnd compiles the optimized one, which
        the same request without quick_first then waits for or finds cached.
        Returns the kiln.v1.CompileResponse.
        """
        request, remembered = self._compile_request(
            graph, guards, backend, namespace, frozen, target, signature, recompile_reason,
            options, bypass_cache, report, static_shapes, quick_first)
        response = self._call(self._compiler.Compile, request)
        if response.key:
            self._keys[remembered] = response.key
        return response

    def compile_async(self, graph, guards=None, backend="eager", namespace="", frozen=False,
                      target=None, signature=None, recompile_reason="", options=None,
                      bypass_cache=False, report=None, static_shapes=False, quick_first=False):
        """compile() begun: the request leaves before this returns, and
        kilnd answers while the caller goes on. Returns a PendingCall whose
        result() is what compile() returns (or raises)."""
        request, remembered = self._compile_request(
            graph, guards, backend, namespace, frozen, target, signature, recompile_reason,
            options, bypass_cache, report, static_shapes, quick_first)
        return PendingCall(self, self._compiler.Compile, request, remembered)

    def _compile_request(self, graph, guards, backend, namespace, frozen, target, signature,
                         recompile_reason, options, bypass_cache, report, static_shapes,
                         quick_first=False):
        if options is None:
            options = self._options(backend, target)
        request = service_pb2.CompileRequest(graph=graph, options=options,
                                             namespace=namespace, frozen=frozen,
                                             recompile_reason=recompile_reason,
                                             bypass_cache=bypass_cache,
                                             static_shapes=static_shapes,
                                             quick_first=quick_first)
        if guards is not None:
            request.guards.CopyFrom(guards)
        if signature is not None:
            request.signature.CopyFrom(signature)
        if report is not None:
            request.report.CopyFrom(report)
        return request, self._graph_id(graph, options, namespace)

    def lookup(self, graph=None, key=None, signature=None, backend="eager", namespace="",
               include_artifact=False, target=None, options=None, report=None):
        """Asks whether a cached variant admits `signature` (kiln.v1.InputSignature).

        Give either `graph` or `key` (hex). With a graph and no signature, the
        signature is the graph's own input metadata. Returns the
        kiln.v1.LookupResponse, whose outcome is HIT, GUARD_MISS (with the
        failed guard of every variant) or FULL_MISS. `options`
        (kiln.v1.CompileOptions) replaces `backend` and `target`, and
        `report` is sent along, as in compile().
        """
        if (graph is None) == (key is None):
            raise ValueError("lookup() takes exactly one of graph and key")
        if options is None:
            options = self._options(backend, target)
        request = service_pb2.LookupRequest(options=options, namespace=namespace,
                                            include_artifact=include_artifact)
        if report is not None:
            request.report.CopyFrom(report)
        remembered = None
        if graph is not None:
            remembered = self._graph_id(graph, options, namespace)
            key = self._keys.get(remembered)
            if key is not None and signature is None:
                signature = _signature_from_graph(graph)
        if key is not None:
            request.key = key
        else:
            request.graph.CopyFrom(graph)
        if signature is not None:
            request.signature.CopyFrom(signature)
        response = self._call(self._compiler.Lookup, request)
        if remembered is not None and response.key:
            self._keys[remembered] = response.key
        return response

    def get_artifact(self, digest, namespace=""):
        """Returns the kiln.v1.GetArtifactResponse for an artifact digest that
        a variant in `namespace` names."""
        return self._call(self._compiler.GetArtifact,
                          service_pb2.GetArtifactRequest(digest=digest, namespace=namespace))

    # Admin service.

    def stats(self):
        """Returns the kiln.v1.StatsResponse: counters, per-phase times, sizes."""
        return self._call(self._admin.Stats, service_pb2.StatsRequest())

    def freeze(self):
        """Stops all compilation: misses fail with FAILED_PRECONDITION."""
        return self._call(self._admin.Freeze, service_pb2.FreezeRequest())

    def thaw(self):
        """Allows compilation again after freeze()."""
        return self._call(self._admin.Thaw, service_pb2.ThawRequest())

    def list_entries(self, namespace="*"):
        """Returns the kiln.v1.ListEntriesResponse; "*" lists every namespace."""
        return self._call(self._admin.ListEntries,
                          service_pb2.ListEntriesRequest(namespace=namespace))

    def get_entry(self, key, namespace=""):
        """Returns the kiln.v1.GetEntryResponse: variants, guards, recompiles."""
        return self._call(self._admin.GetEntry,
                          service_pb2.GetEntryRequest(key=key, namespace=namespace))

    def evict(self, key, namespace=""):
        """Drops every variant of `key`; returns the kiln.v1.EvictResponse."""
        return self._call(self._admin.Evict,
                          service_pb2.EvictRequest(key=key, namespace=namespace))
