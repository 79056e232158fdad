"""Python client for kilnd, the Kiln compile server.

    import kiln
    graph = kiln.capture(model, x)              # kiln.v1.Graph of core ATen ops
    client = kiln.Client("127.0.0.1:7070")
    client.compile(graph, backend="eager")      # kiln.v1.CompileResponse
    client.lookup(graph, signature=kiln.signature(*kiln.module_tensors(model), x))

    step = kiln.compile(model, x, client=client)  # backend="aot_eager", compiled now
    step(x).sum().backward()                      # forward and backward graphs
    kiln.run_graph(graph, [*kiln.module_tensors(model), x])  # reference runner

    fast = kiln.compile(model, x, client=client, backend="kiln")  # generated code
    opt = torch.compile(model, backend="kiln")      # Dynamo; kilnd at $KILN_SERVER
    kiln.PlanRunner(fast.artifact.compiled).run([...])  # a CompiledGraph directly

kiln.compile(fn, *example_inputs, client=...) is torch.compile(fn) with a
kiln.backend() for that client, fullgraph and static shapes, called once on
the example inputs, which never runs a graph eagerly: what fails raises from
it, and a call with other shapes compiles another graph (kiln.compiled).

The generated protocol modules live in the subpackage kiln.v1 (graph_pb2,
guards_pb2, artifact_pb2, service_pb2, service_pb2_grpc), which may sit in
another directory on sys.path (a build tree): this package's __path__ is
extended to find it. capture(), signature(), module_tensors(),
tensor_meta(), compile(), run_graph() and PlanRunner import torch on first
use; the client does not need it.
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from kiln.client import Client, KilnError  # noqa: E402

__all__ = ["Client", "KilnError", "backend", "KilnBackend", "capture", "signature",
           "module_tensors", "tensor_meta", "compile", "CompiledFunction", "run_graph",
           "Interpreter", "PlanRunner", "compile_times", "minify_accuracy"]

# Names imported from the submodule that defines them on first use.
_LAZY = {
    "capture": "tracer",
    "signature": "tracer",
    "module_tensors": "tracer",
    "tensor_meta": "tracer",
    "compile": "compiled",
    "CompiledFunction": "compiled",
    "run_graph": "runtime",
    "Interpreter": "runtime",
    "PlanRunner": "plan",
    "backend": "dynamo",
    "KilnBackend": "dynamo",
    "compile_times": "dynamo",
    "minify_accuracy": "minify",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"kiln.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def _register_dynamo_backends():
    """`import kiln` makes torch.compile(backend="kiln") work (when torch is
    installed): registers kiln, kiln_aot_eager and kiln_eager with Dynamo."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from kiln.dynamo import register_backends
    register_backends()


_register_dynamo_backends()
