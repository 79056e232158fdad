"""kiln.compile(): capture a function, compile it on kilnd, call the result.

    step = kiln.compile(model, x, client="127.0.0.1:7070")   # backend="aot_eager"
    loss = step(x).sum()
    loss.backward()                  # runs the backward graph kilnd built
    step.key, step.artifact          # the cache key and the kiln.v1.Artifact

The returned CompiledFunction takes the arguments the function takes (for a
module, its inputs only: the module's parameters and buffers are read from it
at every call, in capture order, see tracer.module_tensors) and returns what
the function returns, rebuilt from the graph's flat outputs: a tensor, or the
same tuple / list / dict structure.

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
    an input of the captured graph requires grad) it is trained exactly as
    `aot_eager`, with the compiled plans in place of the forward and
    backward graphs. With artifact.compiled alone it is an inference
    function: its outputs carry no grad_fn, so a call in which an input
    requires grad while gradients are enabled is a ValueError (capture with
    the inputs' requires_grad set to get a training artifact). Random ops
    the plan leaves to ATen (Extern steps) draw from torch's default
    generator, as above. The plans take the strides the graph was captured
    with: a tensor with other strides is a ValueError, never a silent copy.

The compiled function holds exactly what was compiled: an argument whose
dtype, sizes or device differ from the example's, a non-tensor argument that
differs from the example's (it was baked into the graph), or an input that
requires grad where the example did not (its gradient was not compiled) is a
ValueError: compile again for it.
"""

import torch
from torch.autograd.function import once_differentiable
from torch.utils._pytree import tree_unflatten

from kiln import tracer
from kiln.client import Client
from kiln.plan import PlanRunner
from kiln.runtime import Interpreter, torch_device, torch_dtype

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


def compile(fn, *example_inputs, client, backend="aot_eager", namespace=""):  # noqa: A001
    """Captures `fn` (a function of tensors or an nn.Module) on
    `example_inputs`, compiles it on kilnd with `backend` in `namespace`, and
    returns a CompiledFunction. `client` is a kiln.Client or an address
    ("host:port"). A failed compile raises kiln.KilnError."""
    captured = tracer.capture_with_structure(fn, *example_inputs)
    if isinstance(client, str):
        with Client(client) as owned:
            response = owned.compile(captured.graph, backend=backend, namespace=namespace)
    else:
        response = client.compile(captured.graph, backend=backend, namespace=namespace)
    return CompiledFunction(captured, response.artifact, response.key)


# CPU flags each x86-64 level needs (g++'s -march names), as /proc/cpuinfo
# spells them.
_ISA_FLAGS = {
    "x86-64": [],
    "x86-64-v2": ["ssse3", "sse4_2", "popcnt"],
    "x86-64-v3": ["ssse3", "sse4_2", "popcnt", "avx2", "fma", "bmi2"],
    "x86-64-v4": ["ssse3", "sse4_2", "popcnt", "avx2", "fma", "bmi2", "avx512f", "avx512bw",
                  "avx512vl", "avx512dq"],
}


def check_cpu_supports(isa, cpu_flags=None):
    """Raises RuntimeError when generated code for `isa` would not run on this
    CPU (instead of an illegal instruction). `cpu_flags` defaults to this CPU's
    /proc/cpuinfo flags; ISA names other than the x86-64 levels are not
    checked."""
    needed = _ISA_FLAGS.get(isa)
    if not needed:
        return
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo") as f:
                line = next((text for text in f if text.startswith("flags")), "")
        except OSError:
            return
        cpu_flags = set(line.split(":", 1)[-1].split())
    for flag in needed:
        if flag not in cpu_flags:
            raise RuntimeError(f"the artifact's code was compiled for {isa}, which needs {flag}; "
                               "this CPU lacks it: compile with options.target.cpu_isa set to a "
                               "level it has")


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


def _static(sym_ints):
    if any(s.WhichOneof("value") != "int_value" for s in sym_ints):
        return None
    return tuple(s.int_value for s in sym_ints)


class ArtifactFunction:
    """Runs a kiln.v1.Artifact on the graph's inputs (primals, in graph order)
    and returns the graph's outputs as a tuple: through an autograd function
    when the artifact has a backward and a primal that needs a gradient
    requires one, else its forward alone.

    `graph` is the kiln.v1.Graph the artifact was compiled from."""

    def __init__(self, artifact, graph):
        self.artifact = artifact
        self.backend = artifact.backend
        self.graph = graph
        self._inputs = list(graph.inputs)
        self._num_primals = len(self._inputs)
        # Whether the artifact has no backward because kilnd compiled for
        # inference (a `kiln` artifact with `compiled` alone).
        self.inference_only = False

        arch = artifact.target.sm_arch if artifact.target.device_type == "cuda" else ""
        if (artifact.HasField("compiled") or artifact.HasField("compiled_forward")) and not arch:
            check_cpu_supports(artifact.target.cpu_isa)
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
    """A captured function compiled by kilnd; call it like the function.

    Attributes: `key` (hex cache key), `artifact` (kiln.v1.Artifact),
    `graph` (the captured kiln.v1.Graph), `backend` (the artifact's)."""

    def __init__(self, captured, artifact, key):
        self.graph = captured.graph
        self.artifact = artifact
        self.key = key
        self.backend = artifact.backend
        self._module = captured.module
        self._positions = list(captured.tensor_positions)
        # Per argument: None for a tensor, else the constant baked into the
        # graph (the example tensors themselves are not kept alive).
        self._constants = [None if isinstance(x, torch.Tensor) else (x,)
                           for x in captured.example_inputs]
        self._out_spec = captured.out_spec
        self._inputs = list(self.graph.inputs)
        self._num_primals = len(self._inputs)
        self._input_requires_grad = [ph.value.meta.requires_grad for ph in self._inputs]
        self._fn = ArtifactFunction(artifact, self.graph)

    def _primals(self, args):
        """The graph's inputs for a call with `args`, checked against the
        example inputs the graph was compiled for."""
        if len(args) != len(self._constants):
            raise ValueError(f"{self.graph.name} was compiled for {len(self._constants)} "
                             f"arguments, got {len(args)}")
        for i, (arg, constant) in enumerate(zip(args, self._constants)):
            if constant is None:
                if not isinstance(arg, torch.Tensor):
                    raise ValueError(f"argument {i} must be a tensor, got {type(arg).__name__}")
            elif (isinstance(arg, torch.Tensor) or type(arg) is not type(constant[0])
                    or arg != constant[0]):
                raise ValueError(f"argument {i} is {arg!r}; the graph was compiled with "
                                 f"{constant[0]!r} baked in")
        state = tracer.module_tensors(self._module) if self._module is not None else []
        primals = list(state) + [args[i] for i in self._positions]
        if len(primals) != self._num_primals:
            raise ValueError(f"{self.graph.name} takes {self._num_primals} tensors (module "
                             f"parameters and buffers, then inputs), got {len(primals)}")
        for t, ph, compiled_with_grad in zip(primals, self._inputs, self._input_requires_grad):
            meta, name = ph.value.meta, ph.value.name
            sizes = _static(meta.sizes)
            if (t.dtype != torch_dtype(meta.dtype) or t.device != torch_device(meta.device)
                    or (sizes is not None and tuple(t.shape) != sizes)
                    or (sizes is None and t.dim() != len(meta.sizes))):
                raise ValueError(f"input '{name}' is {t.dtype} {list(t.shape)} on {t.device}; "
                                 f"{self.graph.name} was compiled for "
                                 f"{torch_dtype(meta.dtype)} {list(sizes or [])} on "
                                 f"{torch_device(meta.device)}")
            if (t.requires_grad and not compiled_with_grad and self._fn.has_backward
                    and t.is_floating_point() and torch.is_grad_enabled()):
                raise ValueError(f"input '{name}' requires grad, but {self.graph.name} was "
                                 "compiled for an input that does not: its gradient was not "
                                 "compiled")
        return primals

    def __call__(self, *args):
        outputs = self._fn(self._primals(args))
        return tree_unflatten(list(outputs), self._out_spec)

    def __repr__(self):
        return (f"<kiln.CompiledFunction {self.graph.name} backend={self.backend} "
                f"key={self.key[:12]}>")

