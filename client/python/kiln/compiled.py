"""kiln.compile(): torch.compile with a kiln backend, compiled on the spot.

    step = kiln.compile(model, x, client="127.0.0.1:7070")   # backend="aot_eager"
    loss = step(x).sum()
    loss.backward()                  # runs the backward graph kilnd built
    step.key, step.artifact          # the cache key and the kiln.v1.Artifact

kiln.compile(fn, *example_inputs, client=..., backend=..., namespace=...,
**options) is

    torch.compile(fn, backend=kiln.backend(client, compiler=backend,
                  namespace=namespace, on_frozen="raise",
                  on_unavailable="raise", **options),
                  fullgraph=True, dynamic=False)

called once on `example_inputs`: the path of torch.compile(backend="kiln")
(kiln.dynamo), with no eager fallback. Dynamo captures `fn` (a function, an
nn.Module, any callable; a module's parameters and buffers are graph inputs
read at every call), kiln.lower lowers the graph, and kilnd serves it from
its cache or compiles it. What goes wrong raises from kiln.compile: a graph
break (Dynamo's error, as fullgraph=True makes it), a graph with no
kiln.v1.Graph form (kiln.lower.Unsupported), a failed compile, a frozen or
unreachable server (kiln.KilnError), an artifact without kilnd's valid
signature (SignatureError, with `public_key`). That first call runs `fn` as
any call does (random ops draw, inputs written in place are written), but a
module's buffers are restored afterwards: compiling leaves the module as it
was.

The returned CompiledFunction is called like `fn` and returns what `fn`
returns (a tensor, or the same tuple / list / dict structure). Dynamo's
guards decide which compiled graph serves a call: an argument of another
dtype, shape, stride or device, another non-tensor argument, an input that
requires grad where the compiled graph's did not, or another grad mode
compiles another static graph on kilnd (a recompile, as torch.compile does;
Dynamo's recompile limit, torch._dynamo.config.recompile_limit, applies per
CompiledFunction). A graph that would run eagerly on such a call is an error
too (kiln.lower.Unsupported, raised after that call). `key`, `artifact`,
`graph` and `backend` are those of the latest graph kilnd served it;
`kiln_backend` is its kiln.dynamo.KilnBackend (stats, the
ArtifactFunction of every graph in `loaded`).

Artifacts:
  - `aot_eager` (artifact.autograd set): when gradients are enabled and an
    input that needs one requires grad, the call goes through a
    torch.autograd.Function whose forward runs the forward graph (keeping the
    saved values with ctx.save_for_backward) and whose backward runs the
    backward graph on the saved values and one tangent per output that
    receives a gradient. Otherwise only the forward graph runs and its saved
    values are dropped.
  - `eager`: the graph runs op by op; autograd records through the ATen ops as
    it would in eager PyTorch.
Both run through the reference runner (kiln.runtime), so a graph's random ops
draw from torch's default generator as eager would: seeding torch the same
way gives the same dropout masks.
  - `kiln`: generated kernels and an execution plan, run by the plan runner
    (kiln.plan.PlanRunner). With artifact.compiled_forward,
    artifact.compiled_backward and artifact.autograd (kilnd builds them when
    an input of the graph requires grad) it is trained exactly as
    `aot_eager`, with the compiled plans in place of the forward and
    backward graphs. With artifact.compiled alone it is an inference
    function: its outputs carry no grad_fn (through a CompiledFunction, an
    input that requires grad compiles a training graph; an ArtifactFunction
    called directly raises ValueError). Random ops the plan leaves to ATen
    (Extern steps) draw from torch's default generator, as above. The plans
    take the strides the graph was compiled for (ArtifactFunction: other
    strides are a ValueError, never a silent copy).
"""

import types

import torch
from torch.autograd.function import once_differentiable

from kiln._executor import check_artifact
from kiln.plan import PlanRunner
from kiln.runtime import Interpreter

__all__ = ["compile", "CompiledFunction", "ArtifactFunction", "verify_artifact",
           "SignatureError"]


class SignatureError(ValueError):
    """An artifact that is unsigned, wrongly signed, or not what its digest
    says: its native code is never loaded."""


def verify_artifact(artifact, digest, signature, public_key_pem):
    """Checks, before any of its code is loaded, that `artifact`
    (kiln.v1.Artifact) is the one kilnd signed: its deterministic bytes hash
    to `digest` (hex SHA-256) and `signature` is the Ed25519 signature of
    `digest` by the key whose PEM public key is `public_key_pem`. Raises
    SignatureError."""
    import hashlib

    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(public_key_pem if isinstance(public_key_pem, bytes)
                              else public_key_pem.encode())
    actual = hashlib.sha256(artifact.SerializeToString(deterministic=True)).hexdigest()
    if actual != digest:
        raise SignatureError(f"the artifact's bytes hash to {actual}, not to its digest {digest}")
    if not signature:
        raise SignatureError(f"artifact {digest} is not signed, and a signature is required")
    try:
        key.verify(signature, digest.encode())
    except InvalidSignature:
        raise SignatureError(f"artifact {digest}: its signature does not verify with the "
                             "configured public key") from None


def compile(fn, *example_inputs, client, backend="aot_eager", namespace="",  # noqa: A001
            **options):
    """Compiles `fn` (a function of tensors, an nn.Module or another callable)
    through torch.compile with a kiln.dynamo.KilnBackend and calls it once on
    `example_inputs`; returns the CompiledFunction. `client` is a kiln.Client
    or an address ("host:port"); `backend` the kilnd backend (aot_eager,
    eager, kiln); `namespace` the cache namespace; `options` KilnBackend's
    (timeout, frozen, token, root_certificates, public_key). Never runs a
    graph eagerly: see the module's documentation for what raises."""
    from kiln.dynamo import KilnBackend  # kiln.dynamo imports this module

    for policy in ("on_frozen", "on_unavailable"):
        if policy in options:
            raise TypeError(f"kiln.compile never runs a graph eagerly, so it takes no "
                            f"{policy}: torch.compile(fn, backend=kiln.backend(..., "
                            f"{policy}=...)) does")
    kiln_backend = KilnBackend(client, compiler=backend, namespace=namespace,
                               on_frozen="raise", on_unavailable="raise", **options)
    compiled = CompiledFunction(fn, kiln_backend)
    buffers = list(fn.buffers()) if isinstance(fn, torch.nn.Module) else []
    saved = [b.detach().clone() for b in buffers]
    try:
        compiled(*example_inputs)
    finally:
        with torch.no_grad():
            for b, before in zip(buffers, saved):
                b.copy_(before)
    if not kiln_backend.loaded:
        raise ValueError(f"Dynamo found nothing to compile in {_name(fn)} on these inputs "
                         "(no tensor operation): kilnd was not asked")
    return compiled


def _name(fn):
    return getattr(fn, "__name__", type(fn).__name__)


def _entry(fn):
    """A function that calls `fn`, with a code object of its own. Dynamo
    keeps compiled graphs, and counts recompiles against its limit, per code
    object: compiling `fn` itself would share them with every other
    torch.compile of `fn` (or of any instance of its class), and the ninth
    compile of one function would fail. It bears `fn`'s name, which names
    the graphs (kiln.dynamo names a graph after the frame it comes from)."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    name = _name(fn)
    renamed = {"co_name": name}
    if hasattr(call.__code__, "co_qualname"):
        renamed["co_qualname"] = name
    return types.FunctionType(call.__code__.replace(**renamed), call.__globals__, name, None,
                              call.__closure__)


class _AutogradGraphs(torch.autograd.Function):
    """The forward and backward graphs of a training artifact as one autograd
    function: apply(fn, *primals) -> forward outputs, `fn` an ArtifactFunction."""

    @staticmethod
    def forward(ctx, fn, *primals):
        results = fn._forward.run(primals)
        n = fn._num_outputs
        outputs, saved = results[:n], results[n:]
        ctx.fn = fn
        ctx.save_for_backward(*saved)
        ctx.output_layouts = [(o.shape, o.dtype, o.device) if receives else None
                              for o, receives in zip(outputs, fn._outputs_receive_grad)]
        ctx.mark_non_differentiable(
            *[o for o, receives in zip(outputs, fn._outputs_receive_grad) if not receives])
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        fn = ctx.fn
        tangents = []
        for grad, layout in zip(grad_outputs, ctx.output_layouts):
            if layout is not None:
                tangents.append(_tangent(grad, layout))
        grads = fn._backward.run(list(ctx.saved_tensors) + tangents)
        by_primal = [None] * fn._num_primals
        for grad, primal in zip(grads, fn._grad_input_index):
            if ctx.needs_input_grad[1 + primal]:
                by_primal[primal] = grad
        return (None, *by_primal)


def _tangent(grad, layout):
    """The gradient of one output as the backward graph expects it: zeros for
    None, else contiguous in the output's dtype, as the joint graph traced
    the tangents (and as AOTAutograd does). Autograd hands over whatever
    layout it made: out.sum() gives an expanded gradient, whose zero strides
    a view in the backward graph could not take, and a transposed output
    may get a contiguous one or a transposed one."""
    sizes, dtype, device = layout
    if grad is None:
        return torch.zeros(sizes, dtype=dtype, device=device)
    return grad.to(dtype).contiguous()


class ArtifactFunction:
    """Runs a kiln.v1.Artifact on the graph's inputs (primals, in graph order)
    and returns the graph's outputs as a tuple: through an autograd function
    when the artifact has a backward and a primal that needs a gradient
    requires one, else its forward alone.

    `graph` is the kiln.v1.Graph the artifact was compiled from; `key` the
    cache key kilnd served it under (the artifact's own, unless the caller
    knows better: kiln.dynamo.KilnBackend sets its reply's)."""

    def __init__(self, artifact, graph):
        self.artifact = artifact
        self.backend = artifact.backend
        self.graph = graph
        self.key = artifact.key
        self._inputs = list(graph.inputs)
        self._num_primals = len(self._inputs)
        # Whether the artifact has no backward because kilnd compiled for
        # inference (a `kiln` artifact with `compiled` alone).
        self.inference_only = False

        arch = artifact.target.sm_arch if artifact.target.device_type == "cuda" else ""
        if artifact.HasField("compiled") or artifact.HasField("compiled_forward"):
            check_artifact(artifact)
        if artifact.HasField("compiled_forward") or artifact.HasField("compiled_backward"):
            if not (artifact.HasField("compiled_forward") and artifact.HasField("compiled_backward")
                    and artifact.HasField("autograd")):
                raise ValueError(f"artifact of backend '{artifact.backend}' lacks one of "
                                 "compiled_forward, compiled_backward and autograd")
            self._init_training(artifact.autograd,
                                PlanRunner(artifact.compiled_forward, sm_arch=arch),
                                PlanRunner(artifact.compiled_backward, sm_arch=arch))
        elif artifact.HasField("compiled"):
            self._forward = PlanRunner(artifact.compiled, sm_arch=arch)
            self._backward = None
            self._num_outputs = len(self._forward.output_names)
            self._inputs_need_grad = [False] * self._num_primals
            self.inference_only = True
        elif artifact.HasField("autograd"):
            graphs = artifact.autograd
            self._init_training(graphs, Interpreter(graphs.forward), Interpreter(graphs.backward))
        elif artifact.HasField("graph"):
            self._forward = Interpreter(artifact.graph)
            self._backward = None
            self._num_outputs = len(artifact.graph.outputs)
            self._inputs_need_grad = [False] * self._num_primals
        else:
            raise ValueError(f"artifact of backend '{artifact.backend}' carries neither a graph, "
                             "autograd graphs nor compiled graphs: this runtime cannot run it")
        if len(self._forward.input_names) != self._num_primals:
            raise ValueError(f"the artifact's graph takes {len(self._forward.input_names)} "
                             f"inputs; the captured graph has {self._num_primals}")

    @property
    def has_backward(self):
        return self._backward is not None

    def _init_training(self, graphs, forward, backward):
        """Trains with `forward` and `backward` (runners of the forward and
        backward graphs, or of their compiled plans) by the conventions of
        artifact.autograd, `graphs`."""
        self._forward = forward
        self._backward = backward
        self._num_outputs = graphs.num_forward_outputs
        self._outputs_receive_grad = list(graphs.outputs_receive_grad)
        self._grad_input_index = list(graphs.grad_input_index)
        self._inputs_need_grad = list(graphs.inputs_need_grad)
        self._check_autograd(graphs)

    def _check_autograd(self, graphs):
        where = "artifact.autograd"
        forward_outputs = len(self._forward.output_names)
        if forward_outputs != self._num_outputs + len(graphs.saved):
            raise ValueError(f"{where}: the forward graph has {forward_outputs} "
                             f"outputs for {self._num_outputs} outputs and "
                             f"{len(graphs.saved)} saved values")
        if len(self._outputs_receive_grad) != self._num_outputs:
            raise ValueError(f"{where}: outputs_receive_grad has "
                             f"{len(self._outputs_receive_grad)} entries for "
                             f"{self._num_outputs} outputs")
        tangents = sum(self._outputs_receive_grad)
        backward_inputs = len(self._backward.input_names)
        if backward_inputs != len(graphs.saved) + tangents:
            raise ValueError(f"{where}: the backward graph takes {backward_inputs} "
                             f"inputs for {len(graphs.saved)} saved values and {tangents} "
                             "tangents")
        if len(self._grad_input_index) != len(self._backward.output_names):
            raise ValueError(f"{where}: grad_input_index has {len(self._grad_input_index)} "
                             f"entries for {len(self._backward.output_names)} gradients")
        for i in self._grad_input_index:
            if not 0 <= i < self._num_primals:
                raise ValueError(f"{where}: grad_input_index names input {i} of "
                                 f"{self._num_primals}")

    def __call__(self, primals):
        if self.inference_only and torch.is_grad_enabled():
            for t, ph in zip(primals, self._inputs):
                if t.requires_grad:
                    raise ValueError(
                        f"input '{ph.value.name}' requires grad, but {self.graph.name} was "
                        f"compiled by '{self.backend}' for inference only (no input required "
                        "grad when it was captured), so its outputs cannot carry gradients: "
                        "compile it with the inputs' requires_grad set as they are now, which "
                        "builds a training artifact, or call it under torch.no_grad()")
        if self._backward is not None and torch.is_grad_enabled() and any(
                need and t.requires_grad for need, t in zip(self._inputs_need_grad, primals)):
            return _AutogradGraphs.apply(self, *primals)
        return tuple(self._forward.run(primals)[:self._num_outputs])


class CompiledFunction:
    """`fn` through torch.compile with the kiln.dynamo.KilnBackend
    `kiln_backend` (fullgraph, static shapes); call it like `fn`. Made by
    kiln.compile, which calls it once.

    Attributes, of the latest graph kilnd served (the example's, until a
    call recompiles): `key` (hex cache key), `artifact` (kiln.v1.Artifact),
    `graph` (the kiln.v1.Graph kilnd compiled), `backend` (the
    artifact's); and `fn`, the function compiled."""

    def __init__(self, fn, kiln_backend):
        self.fn = fn
        self.kiln_backend = kiln_backend
        self._compiled = torch.compile(_entry(fn), backend=kiln_backend, fullgraph=True,
                                       dynamic=False)

    def __call__(self, *args, **kwargs):
        from torch._dynamo.exc import BackendCompilerFailed

        try:
            result = self._compiled(*args, **kwargs)
        except BackendCompilerFailed as e:
            # The backend's own error (kiln.KilnError, SignatureError...).
            raise e.inner_exception from None
        if self.kiln_backend.stats["eager"]:
            self._refuse_eager()
        return result

    def _refuse_eager(self):
        from kiln.lower import Unsupported

        reasons = "; ".join(f"graph '{name}': {why}"
                            for name, why in self.kiln_backend.unsupported)
        raise Unsupported(f"{_name(self.fn)}: {self.kiln_backend.stats['eager']} graph(s) ran "
                          f"eagerly ({reasons or 'see the warnings'}); a CompiledFunction "
                          "runs only what kilnd compiled (torch.compile with kiln.backend() "
                          "runs such graphs eagerly)")

    @property
    def _latest(self):
        return self.kiln_backend.loaded[-1]

    @property
    def key(self):
        return self._latest.key

    @property
    def artifact(self):
        return self._latest.artifact

    @property
    def graph(self):
        return self._latest.graph

    @property
    def backend(self):
        return self._latest.backend

    def __repr__(self):
        if not self.kiln_backend.loaded:
            return f"<kiln.CompiledFunction {_name(self.fn)} (not compiled)>"
        return (f"<kiln.CompiledFunction {self.graph.name} backend={self.backend} "
                f"key={self.key[:12]} graphs={len(self.kiln_backend.loaded)}>")
