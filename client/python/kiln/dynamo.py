"""torch.compile backends served by kilnd.

    import torch, kiln
    fast = torch.compile(model, backend="kiln")             # KILN_SERVER or 127.0.0.1:50051
    fast = torch.compile(model, backend=kiln.backend("10.0.0.5:50051", on_frozen="eager"))

Three backends are registered with Dynamo (on `import kiln`, and through the
package's `torch_dynamo_backends` entry point): `kiln` (generated code),
`kiln_aot_eager` (kilnd's joint graph and min-cut partition, run op by op) and
`kiln_eager` (the verified graph, op by op): the bisecting procedure, each on
the server backend of the same name.

For every graph Dynamo hands over, the backend lowers it to a functional
core-ATen graph (kiln.lower) and returns at once a callable whose first call
waits for kilnd's artifact and then runs it (an autograd function when it
has a backward): the request leaves before the backend returns, and kilnd
serves the graph from its cache or compiles it while Dynamo finishes the
frame (its guards and bytecode). Dynamo keeps its own
guards and calls the backend again when they fail (a new shape, a new dtype);
after the second size, its automatic dynamic marks the dimension symbolic,
and kilnd compiles one symbolic variant that serves every later size.
Across processes kilnd does the same for the graphs of one program at two
sizes, unless the sizes are static for good: under
torch.compile(dynamic=False) the backend asks kilnd for static shapes.

Failure policies (kiln.backend(..., on_frozen=, on_unavailable=)):
  - a frozen server refuses a miss: "raise" (as
    torch.compiler.set_stance("fail_on_recompile")) or "eager" (one warning,
    then the graph runs eagerly, as "eager_on_recompile");
  - the server is unreachable or past the deadline: "eager" (default, one
    warning) or "raise";
  - a graph with no kiln.v1.Graph form (kiln.lower.Unsupported) runs eagerly,
    with one warning.
A compile error (INVALID_ARGUMENT, INTERNAL...) raises, unless
torch._dynamo.config.suppress_errors is set (the graph then runs eagerly, with
one warning). kilnd's answer reaches the graph's first call, so its errors
raise there (a KilnError, not Dynamo's BackendCompilerFailed), and a call
that raised leaves nothing behind: the next call asks kilnd again.
"""

import os
import sys
import threading
import time
import warnings
import weakref

import torch

from kiln import lower as lowering
from kiln._served import _Compiled, _Upgrade
from kiln._steps import _log, _step
from kiln.client import Client, KilnError
from kiln.compiled import ArtifactFunction, SignatureError, verify_artifact
from kiln.cuda import CudaGraphed
from kiln.v1 import artifact_pb2, service_pb2

__all__ = ["backend", "KilnBackend", "register_backends", "compile_times", "DEFAULT_SERVER"]

DEFAULT_SERVER = "127.0.0.1:50051"

# Registered Dynamo backend name -> kilnd backend.
BACKENDS = {"kiln": "kiln", "kiln_aot_eager": "aot_eager", "kiln_eager": "eager"}

_POLICIES = ("raise", "eager")


class KilnBackend:
    """A Dynamo backend: backend(gm, example_inputs) -> callable.

    `server` is "host:port" (default: $KILN_SERVER, else DEFAULT_SERVER)
    or a kiln.Client, used as it is (its own deadline and credentials);
    `compiler` the kilnd backend (kiln, aot_eager, eager); `namespace` the
    cache namespace; `timeout` the deadline of each call in seconds;
    `frozen` asks kilnd never to compile for this client; `token` (default
    $KILN_TOKEN) and `root_certificates` (PEM, for TLS) are kiln.Client's.
    With `public_key` (PEM Ed25519, default the file $KILN_PUBLIC_KEY_FILE
    names) every artifact must carry kilnd's valid signature before its
    code is loaded (kiln.compiled.verify_artifact); one that does not
    raises SignatureError. `debug_function` (a regular expression: graphs
    whose name it does not match compile with kilnd's eager backend) and
    `inject_fault` ("compile_error:OP", "accuracy:OP" or "runtime_error:OP",
    for testing the troubleshooting tools) become kilnd's backend options of the same
    names (docs/troubleshooting.md). `cuda_graphs` (or torch.compile's
    mode="reduce-overhead") replays each static CUDA graph's plan as one
    CUDA graph once it has run (kiln.cuda.CudaGraphed); inference only.
    `autotune` (or torch.compile's mode="max-autotune") asks kilnd to time
    the block sizes of the large CUDA kernels on its GPU (kilnd
    --autotune); without it, as in Inductor's default mode, the schedule's
    heuristics stand and no compile waits for timing.

    `tiered` (default: on for graphs on a GPU, off on the CPU) makes a compile
    two: on a miss kilnd answers at once with its quick artifact, the graph
    run op by op through ATen (its forward and backward graphs, in
    training), unfused and so slower, while it compiles the optimized
    kernels; the first call after those arrive runs them, and so does every
    call after it (`stats["upgrades"]`; wait_for_upgrades() waits for them).
    kilnd caches only the optimized artifact, so a warm start gets it at
    once. Off with `cuda_graphs` and `autotune`, whose calls want the final
    kernels from the start.

    Counters (`stats`): graphs, hits, compiles, quick (of the compiles,
    those answered at the quick level first), upgrades (quick artifacts
    replaced by the optimized ones), eager (graphs run eagerly by
    a policy or because they have no kiln form; `unsupported` lists
    (graph name, reason) of the latter). `loaded` holds the
    kiln.compiled.ArtifactFunction of every graph served, in order, each
    with the cache key kilnd serves it under as `key`; a quick one that an
    optimized one replaced has `superseded` set."""

    RETRY_AFTER_S = 30.0  # how long an unanswering server is left alone

    def __init__(self, server=None, *, compiler="kiln", namespace="", on_frozen="raise",
                 on_unavailable="eager", timeout=30.0, frozen=False, token=None,
                 root_certificates=None, public_key=None, debug_function=None,
                 inject_fault=None, job=None, cuda_graphs=False, autotune=False,
                 tiered=None):
        if on_frozen not in _POLICIES or on_unavailable not in _POLICIES:
            raise ValueError(f"on_frozen and on_unavailable take one of {_POLICIES}")
        given = server if isinstance(server, Client) else None
        if given is not None:
            server = given.address
        self.server = server or os.environ.get("KILN_SERVER") or DEFAULT_SERVER
        self.compiler = compiler
        self.namespace = namespace
        self.on_frozen = on_frozen
        self.on_unavailable = on_unavailable
        self.timeout = timeout
        self.frozen = frozen
        self._credentials = {"token": token, "root_certificates": root_certificates}
        if public_key is None and os.environ.get("KILN_PUBLIC_KEY_FILE"):
            with open(os.environ["KILN_PUBLIC_KEY_FILE"], "rb") as f:
                public_key = f.read()
        self.public_key = public_key
        # kilnd's backend options (docs/troubleshooting.md): the function
        # filter and, for testing the tools, an injected fault.
        self.backend_options = {name: value for name, value in
                                (("debug_function", debug_function),
                                 ("inject_fault", inject_fault)) if value}
        # The model or job the graphs belong to, for kilnctl breaks.
        self.job = (job or os.environ.get("KILN_JOB")
                    or os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "")
                    or "python")
        self.cuda_graphs = cuda_graphs
        self.autotune = autotune
        self.tiered = tiered
        self.cuda_graphed = []  # the kiln.cuda.CudaGraphed of every graph replayed
        self.stats = {"graphs": 0, "hits": 0, "compiles": 0, "quick": 0, "upgrades": 0,
                      "eager": 0}
        # Per graph served at the quick level, its optimized artifact on the
        # way (`arrived`: time.perf_counter() when kilnd's answer came).
        self.upgrades = []
        self.unsupported = []  # (graph name, why it has no kiln form)
        # Seconds spent per phase, over every graph: dynamo (Dynamo's
        # tracing of the frame before it called the backend), lower (Dynamo's
        # graph to kiln.v1.Graph), key (kilnd's verification and key of it,
        # inside the lookup), lookup (the rest of the round trip), compile
        # (on kilnd, with the round trip), wait (of those three, what the
        # graph's first call waited for: the rest ran while Dynamo finished
        # the frame), load (the artifact into runners).
        self.times = {"dynamo": 0.0, "lower": 0.0, "key": 0.0, "lookup": 0.0, "compile": 0.0,
                      "wait": 0.0, "load": 0.0}
        self.last_lowered = None  # the kiln.lower.Lowered of the latest graph
        self.loaded = []  # every kiln.compiled.ArtifactFunction built, in order
        # Per graph served: its name, the client's phases (seconds) and
        # kilnd's phases of its compile (kiln.compile_times() shows them).
        self.graph_times = []
        _BACKENDS.add(self)
        self._client = given
        self._lock = threading.Lock()
        self._warned = set()
        # After the server failed to answer, graphs run eagerly without
        # asking it again until this time (time.monotonic()).
        self._down_until = 0.0

    def _get_client(self):
        with self._lock:
            if self._client is None:
                self._client = Client(self.server, timeout=self.timeout, **self._credentials)
            return self._client

    def _warn_once(self, kind, message):
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def __call__(self, gm, example_inputs, mode=None, options=None):
        """Dynamo's call. torch.compile passes `mode` and `options` when it
        was given them: mode="reduce-overhead" (or options={"cuda_graphs":
        True}) replays static CUDA graphs as cuda_graphs=True does;
        mode="max-autotune" (or options={"max_autotune": True}) asks kilnd
        to time the kernels' block sizes as autotune=True does, and replays
        CUDA graphs too; mode="max-autotune-no-cudagraphs" only tunes."""
        options = options or {}
        graphs = self.cuda_graphs or mode in ("reduce-overhead", "max-autotune") or bool(
            options.get("cuda_graphs"))
        autotune = self.autotune or mode in ("max-autotune", "max-autotune-no-cudagraphs") or \
            bool(options.get("max_autotune"))
        return self._compile(gm, example_inputs, graphs, autotune)

    def _compile(self, gm, example_inputs, cuda_graphs, autotune=False):
        self.stats["graphs"] += 1
        function = _graph_function(gm)
        name = _graph_name(function)
        reason = _new_guard_failures()
        times = dict.fromkeys(self.times, 0.0)
        times["dynamo"] = _dynamo_elapsed()
        start = time.perf_counter()
        if time.monotonic() >= self._down_until:
            # The connection is made while the graph is lowered.
            self._get_client().connect()
        try:
            with _step("lower", name):
                lowered = lowering.lower(gm, example_inputs, name=name)
        except lowering.Unsupported as e:
            self.stats["eager"] += 1
            self.unsupported.append((name, str(e)))
            self._warn_once(("unsupported", str(e)), f"kiln: graph '{name}' runs eagerly: {e}")
            self._add_times(times)
            return gm.forward
        self.last_lowered = lowered
        times["lower"] = time.perf_counter() - start
        if time.monotonic() < self._down_until:
            self.stats["eager"] += 1
            self._add_times(times)
            return gm.forward
        # The request leaves now, and kilnd compiles while Dynamo finishes
        # the frame (its guards and bytecode); the graph's first call waits
        # for the answer.
        request = {"lowered": lowered, "name": name, "reason": reason,
                   "signature": _signature(lowered, example_inputs),
                   "options": self._compile_options(example_inputs, autotune),
                   "quick_first": self._quick_first(example_inputs, cuda_graphs, autotune),
                   "static_shapes": _static_shapes(),
                   "report": _graph_report(gm, function, name, self.job)}
        self._add_times(times)

        def finish(answer):
            return self._finish(answer, gm, request, cuda_graphs, times)

        return _Deferred(lambda: self._ask(request), finish)

    def _add_times(self, times):
        for phase, seconds in times.items():
            self.times[phase] += seconds

    def _finish(self, answer, gm, request, cuda_graphs, times):
        """The graph's callable once kilnd answered (`answer`): the artifact
        loaded, or gm.forward where a policy runs the graph eagerly."""
        lowered, name = request["lowered"], request["name"]
        start = time.perf_counter()
        try:
            artifact, served, rpc_times, quick = answer.result()
        except KilnError as e:
            if e.code == "FAILED_PRECONDITION" and "frozen" in e.message:
                if self.on_frozen == "raise":
                    raise
                self._warn_once("frozen", f"kiln: the server is frozen and '{name}' is not "
                                          f"cached: it runs eagerly ({e.message})")
            elif e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                if self.on_unavailable == "raise":
                    raise
                self._down_until = time.monotonic() + self.RETRY_AFTER_S
                self._warn_once("unavailable", f"kiln: the server at {self.server} did not "
                                               f"answer ({e.code}); graphs run eagerly, and "
                                               f"the server is asked again in "
                                               f"{self.RETRY_AFTER_S:.0f} s")
            else:
                return self._unless_suppressed(e, gm, name)
            self.stats["eager"] += 1
            return gm.forward
        except SignatureError as e:
            return self._unless_suppressed(e, gm, name)
        self.stats[served] += 1
        times = dict(times, **rpc_times)
        times["wait"] = time.perf_counter() - start
        start = time.perf_counter()
        with _step("load", name):
            function = ArtifactFunction(artifact, lowered.graph)
        function.key = self._key(lowered, request["options"]) or artifact.key
        self.loaded.append(function)
        static = all(s.WhichOneof("value") == "int_value"
                     for ph in lowered.graph.inputs for s in ph.value.meta.sizes)
        if cuda_graphs and static and artifact.target.device_type == "cuda":
            function = CudaGraphed(function)
            self.cuda_graphed.append(function)
        compiled = _Compiled(lowered, function, artifact)
        times["load"] = time.perf_counter() - start
        if quick:
            self.stats["quick"] += 1
            compiled.upgrade = _Upgrade(self, request)
            self.upgrades.append(compiled.upgrade)
        for phase in ("key", "lookup", "compile", "wait", "load"):
            self.times[phase] += times[phase]
        record = dict(times)
        record["graph"] = name
        record["server"] = [(t.phase, t.micros / 1e6) for t in artifact.compile_times]
        record["quick"] = quick
        self.graph_times.append(record)
        if quick:
            compiled.upgrade.record = record
        return compiled

    def _unless_suppressed(self, error, gm, name):
        """Raises `error`, unless Dynamo's suppress_errors is set: Dynamo runs
        a frame whose backend raised eagerly then, and a failure of kilnd's
        now surfaces at the graph's first call, where the same setting
        decides."""
        import torch._dynamo.config as dynamo_config

        if not dynamo_config.suppress_errors:
            raise error
        self._warn_once(("suppressed", name), f"kiln: graph '{name}' runs eagerly "
                                              f"(torch._dynamo.config.suppress_errors): {error}")
        self.stats["eager"] += 1
        return gm.forward

    def _ask(self, request):
        """Asks kilnd for the artifact of `request` (see _compile); returns
        an _Answer, whose result() waits for it.

        A graph this client met before (its key remembered) is looked up by
        key first, which sends no graph. Any other goes to Compile, which
        serves a cached variant as a lookup would (outcome HIT) and
        compiles on a miss, in one round trip: its request leaves before
        this returns, and kilnd works while Dynamo finishes the frame."""
        client = self._get_client()
        lowered, name = request["lowered"], request["name"]
        times = {"key": 0.0, "lookup": 0.0, "compile": 0.0}
        if self._key(lowered, request["options"]):
            start = time.perf_counter()
            with _step("lookup", name):
                found = client.lookup(graph=lowered.graph, signature=request["signature"],
                                      namespace=self.namespace, include_artifact=True,
                                      options=request["options"], report=request["report"])
            times["key"] = found.key_micros / 1e6
            times["lookup"] = time.perf_counter() - start - times["key"]
            if found.HasField("artifact") and found.artifact.backend:
                return _Answer(self, name, times, found=found)
        # The report goes with the first request for the graph, which every
        # process makes: kilnd counts the processes that met it.
        _log.info("begin compile '%s'", name)
        call = self._compile_call(request, quick_first=request["quick_first"])
        return _Answer(self, name, times, call=call)

    def _compile_call(self, request, quick_first=False):
        """kilnd's Compile of `request` (see _compile), begun."""
        return self._get_client().compile_async(
            request["lowered"].graph, guards=request["lowered"].guards,
            namespace=self.namespace, frozen=self.frozen, options=request["options"],
            signature=request["signature"], recompile_reason=request["reason"],
            static_shapes=request["static_shapes"], report=request["report"],
            quick_first=quick_first)

    def _quick_first(self, example_inputs, cuda_graphs, autotune):
        """Whether a miss of this graph is answered at kilnd's quick level
        first (`tiered`)."""
        if cuda_graphs or autotune or self.frozen:
            return False
        if self.tiered is not None:
            return bool(self.tiered)
        return _target(example_inputs) is not None  # a cuda target

    def wait_for_upgrades(self, timeout=None):
        """Waits until kilnd answered for the optimized artifact of every
        graph served at the quick level; each graph runs it from its next
        call. Returns whether all answered within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for upgrade in list(self.upgrades):
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not upgrade.wait(left):
                return False
        return True

    def _key(self, lowered, options):
        """The cache key of the graph's lookup or compile reply under
        `options`, which the client remembers for the graph, or ""."""
        client = self._get_client()
        return client._keys.get(client._graph_id(lowered.graph, options, self.namespace), "")

    def _compile_options(self, example_inputs, autotune=False):
        """The kiln.v1.CompileOptions of this backend for a graph of these
        inputs: kilnd's backend, the target, the backend options (with
        autotune=on when asked: it enters the key, so tuned and untuned
        artifacts are cached apart)."""
        options = Client._options(self.compiler, _target(example_inputs))
        backend_options = dict(self.backend_options)
        if autotune:
            backend_options["autotune"] = "on"
        for name in sorted(backend_options):
            options.options.add(name=name, value=backend_options[name])
        return options

    def _verify(self, response):
        if self.public_key is not None:
            verify_artifact(response.artifact, response.digest, response.signature,
                            self.public_key)


class _Answer:
    """kilnd's answer for one graph: a lookup's reply already here
    (`found`), or a Compile under way (`call`, a kiln.client.PendingCall).
    result() waits for it and returns (artifact, "hits" or "compiles", the
    seconds of the key, lookup and compile phases, whether the artifact is
    at kilnd's quick level); the compile's are from the request to the
    reply's arrival."""

    def __init__(self, backend, name, times, found=None, call=None):
        self._backend = backend
        self._name = name
        self._times = times
        self._found = found
        self._call = call
        self._start = time.perf_counter()
        self._arrived = None
        if call is not None:
            call.add_done_callback(self._stamp)

    def _stamp(self, _):
        self._arrived = time.perf_counter()

    def result(self):
        if self._found is not None:
            self._backend._verify(self._found)
            return self._found.artifact, "hits", self._times, False
        response = self._call.result()
        arrived = self._arrived or time.perf_counter()
        _log.info("end compile '%s' (%.1f ms)", self._name, (arrived - self._start) * 1e3)
        times = dict(self._times, compile=arrived - self._start)
        self._backend._verify(response)
        served = "hits" if response.outcome == service_pb2.HIT else "compiles"
        return response.artifact, served, times, response.quick


class _Failed:
    """An answer that is an error: result() raises it."""

    def __init__(self, error):
        self._error = error

    def result(self):
        raise self._error


class _Deferred:
    """What the backend returns to Dynamo while kilnd answers: `start()`
    asks kilnd (an _Answer; what it raises is raised by the first call),
    and the first call (or the first look at `compiled`) waits for the
    answer and calls `finish(answer)` for the graph's callable. Nothing
    else waits: Dynamo looks at the attributes of what a backend returns
    (_torchdynamo_orig_callable, __name__) as it finishes the frame. A first
    call that raises leaves nothing behind: the next call asks kilnd again,
    as Dynamo would call a backend that raised again on the frame's next
    run."""

    def __init__(self, start, finish):
        self._start = start
        self._finish = finish
        self._pending = self._begin()
        self._fn = None
        self._lock = threading.Lock()

    def _ready(self):
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    answer, self._pending = self._pending or self._begin(), None
                    self._fn = self._finish(answer)
                    # What asking and finishing kept (Dynamo's graph, the
                    # request) is not needed again.
                    self._start = self._finish = None
        return self._fn

    def _begin(self):
        try:
            return self._start()
        except Exception as e:  # noqa: BLE001 (raised by the answer's result())
            return _Failed(e)

    def __call__(self, *args):
        return self._ready()(*args)

    @property
    def compiled(self):
        """The graph's callable (a _Compiled, or the graph's own forward
        where it runs eagerly), once kilnd answered."""
        return self._ready()


_BACKENDS = weakref.WeakSet()  # every KilnBackend alive, for compile_times()


def compile_times(repr="str"):  # noqa: A002 (the name torch._dynamo.utils uses)
    """Compile times per graph, over every kiln backend of this process, as
    torch._dynamo.utils.compile_times() gives Dynamo's: the client's phases
    (dynamo: Dynamo's tracing of the frame up to the backend; lower:
    Dynamo's graph to a kiln graph; key: kilnd's verification and key of
    it, in a lookup; lookup; compile: kilnd's, with the round trip; wait:
    what the first call waited for those, which run while Dynamo finishes
    the frame; load) and kilnd's own
    phases of the graph's compile (verify, key, lower, fuse, plan, codegen,
    native-compile, ...), in seconds. A graph served at kilnd's quick level
    first (a tiered compile) says so, with the seconds from its request
    until the optimized artifact arrived once a call loaded it. repr="str"
    gives a table, "dict" a list of records."""
    records = [r for backend in list(_BACKENDS) for r in backend.graph_times]
    if repr == "dict":
        return records
    if repr != "str":
        raise ValueError(f"repr takes 'str' or 'dict', not {repr!r}")
    phases = ("dynamo", "lower", "key", "lookup", "compile", "wait", "load")
    lines = ["graph  " + "  ".join(phases) + "  (seconds)  kilnd's phases"]
    for r in records:
        server = ", ".join(f"{phase} {sec:.4f}" for phase, sec in r["server"])
        tier = ""
        if r.get("quick"):
            tier = (f"  (quick artifact; optimized after {r['optimized']:.4f})"
                    if "optimized" in r else "  (quick artifact)")
        lines.append(f"{r['graph']}  " + "  ".join(f"{r[p]:.4f}" for p in phases)
                     + f"  {server}{tier}")
    return "\n".join(lines)


def _dynamo_elapsed():
    """Seconds since Dynamo began compiling the current frame (its metrics
    context opened), or 0.0 when torch does not say."""
    try:
        from torch._dynamo.utils import get_metrics_context

        context = get_metrics_context()
        if not context.in_progress():
            return 0.0
        return max(0.0, (time.time_ns() - context._start_time_ns) / 1e9)
    except Exception:  # noqa: BLE001 (another torch: no such context)
        return 0.0


# Code object -> how many of Dynamo's guard failures for it were reported.
_failures_seen = weakref.WeakKeyDictionary()
_TORCH_DIR = os.path.dirname(torch.__file__)


def _new_guard_failures():
    """Dynamo's words for why it compiles the current frame again ("0/0:
    tensor 'x' size mismatch at index 0. expected 4, actual 8"): the guard
    failures it recorded since the backend was last called, "" for a first
    compile."""
    from torch._dynamo.utils import guard_failures

    new = []
    for code, reasons in list(guard_failures.items()):
        seen = _failures_seen.get(code, 0)
        if len(reasons) < seen:  # torch._dynamo.reset() cleared them
            seen = 0
        if len(reasons) > seen:
            new.extend(str(r) for r in reasons[seen:])
        _failures_seen[code] = len(reasons)
    return "; ".join(new)[-4096:]


def _graph_report(gm, function, name, job):
    """The kiln.v1.GraphReport of Dynamo's graph `gm`, from `function`, named
    `name`: why Dynamo ended the graph there (a graph break's reason and the
    user frames, innermost last), cut to what kilnd keeps."""
    why = getattr(gm, "compile_subgraph_reason", None)
    report = service_pb2.GraphReport(job=job[:128], function=function[:256], graph=name[:256])
    if why is not None:
        report.graph_break = bool(getattr(why, "graph_break", False))
        report.reason = str(getattr(why, "reason", ""))[:512]
        frames = list(getattr(why, "user_stack", None) or [])[-8:]
        report.user_frames.extend(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
                                  for f in frames)
    return report


def _static_shapes():
    """Whether Dynamo keeps this graph's sizes static for good:
    torch.compile(dynamic=False) turns its automatic dynamic shapes off, and
    kilnd must then not make them symbolic either."""
    import torch._dynamo.config as dynamo_config

    return not dynamo_config.automatic_dynamic_shapes


def _target(example_inputs):
    """The target of a graph whose inputs are on a GPU: cuda for that GPU's
    SM arch (kilnd compiles for it without having one). None otherwise: kilnd
    then targets the CPU."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(t.device)
            return artifact_pb2.Target(device_type="cuda", sm_arch=f"sm_{major}{minor}")
    return None


def _graph_function(gm):
    """The function the graph came from: the frame Dynamo is compiling when
    it is user code, else the innermost user frame of the graph's first
    node, else "graph"."""
    name = "graph"
    trace = next((n.meta["stack_trace"] for n in gm.graph.nodes if n.meta.get("stack_trace")), "")
    frames = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    if frames and ", in " in frames[-1]:
        name = frames[-1].rsplit(", in ", 1)[1]
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        if not code.co_filename.startswith(_TORCH_DIR):
            name = code.co_name
    except Exception:  # noqa: BLE001 (no frame being compiled: keep the trace's)
        pass
    return name


def _graph_name(function):
    """`function` and Dynamo's compile id: "forward_0_1"."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is None:
        return function
    return f"{function}_{compile_id.frame_id}_{compile_id.frame_compile_id}"


def _signature(lowered, example_inputs):
    """The kiln.v1.InputSignature of the graph's inputs among `example_inputs`."""
    from kiln.v1 import guards_pb2

    sig = guards_pb2.InputSignature(client_guard_digest=lowered.guards.client_guard_digest)
    values = [example_inputs[pos] for pos in lowered.tensor_args] + list(lowered.constants)
    for t, ph in zip(values, lowered.graph.inputs):
        entry = sig.inputs.add(dtype=ph.value.meta.dtype,
                               sizes=[_hint(s, lowered.shape_env) for s in t.shape],
                               strides=[_hint(s, lowered.shape_env) for s in t.stride()],
                               requires_grad=ph.value.meta.requires_grad,
                               storage_offset=_hint(t.storage_offset(), lowered.shape_env))
        entry.device.CopyFrom(ph.value.meta.device)
    return sig


def _hint(value, shape_env):
    if isinstance(value, torch.SymInt):
        return int(shape_env.size_hint(value.node.expr)) if shape_env else int(value)
    return int(value)


def backend(server=None, **options):
    """A configured Dynamo backend: torch.compile(model, backend=kiln.backend(...)).
    `options` are KilnBackend's (compiler="kiln" by default)."""
    return KilnBackend(server, **options)


_shared = {}  # kilnd backend -> the KilnBackend its registered name uses


def _registered(compiler):
    def compile_graph(gm, example_inputs, **kwargs):
        if compiler not in _shared:
            _shared[compiler] = KilnBackend(compiler=compiler)
        return _shared[compiler](gm, example_inputs, **kwargs)

    compile_graph.__name__ = f"kiln_{compiler}"
    return compile_graph


def register_backends():
    """Registers kiln, kiln_aot_eager and kiln_eager with Dynamo (idempotent)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    for name, compiler in BACKENDS.items():
        if name not in _BACKENDS or _BACKENDS[name] is None:
            register_backend(name=name)(_registered(compiler))


# Entry points named in pyproject.toml (group torch_dynamo_backends).
kiln = _registered("kiln")
kiln_aot_eager = _registered("aot_eager")
kiln_eager = _registered("eager")
