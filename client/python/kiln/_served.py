"""What the Dynamo backend (kiln.dynamo) returns for a graph kilnd served:
the callable Dynamo calls (_Compiled), and, for a graph served at kilnd's
quick level first (a tiered compile), the optimized artifact on its way
(_Upgrade)."""

import threading
import time

import torch

from kiln._steps import _step
from kiln.client import KilnError
from kiln.compiled import ArtifactFunction, SignatureError


class _Compiled:
    """What the backend returns to Dynamo: takes Dynamo's flat arguments,
    returns its outputs, and writes back the inputs the graph updates."""

    def __init__(self, lowered, fn, artifact=None):
        self.lowered = lowered
        self.fn = fn
        # With a quick artifact, the optimized one on its way (_Upgrade):
        # the first call after it arrived loads it and runs it from then on.
        self.upgrade = None
        self._tensor_args = lowered.tensor_args
        self._constants = list(lowered.constants)
        self._num_outputs = lowered.num_outputs
        self._mutations = lowered.mutations
        self._position = {arg: k for k, arg in enumerate(self._tensor_args)}
        self._kept = self._kept_by(artifact)

    def _kept_by(self, artifact):
        """The primals (by position) that autograd may keep for the
        backward, of those the graph writes: all of them unless the
        artifact's backward graph says which it saves (ATen's own autograd,
        as the eager backend's, keeps what each op saves: batch norm's
        backward the running statistics)."""
        written = {self._position[arg] for arg, _ in self._mutations}
        if artifact is None or not artifact.HasField("autograd"):
            return written
        saved = set(artifact.autograd.saved)
        return {k for k in written if artifact.autograd.forward.inputs[k].value.name in saved}

    def __call__(self, *args):
        if self.upgrade is not None and self.upgrade.done():
            self.upgrade, upgrade = None, self.upgrade
            self.fn = upgrade.function(self.fn)
            # Its partition may save other inputs than the quick artifact's
            # (which the earlier forwards saved copies of already).
            self._kept = self._kept_by(self.fn.artifact)
        primals = [args[i] for i in self._tensor_args] + self._constants
        if self._mutations and self._kept and torch.is_grad_enabled():
            # The graph reads a copy of each input it writes that autograd
            # may keep: the copy-back below must not change a saved tensor.
            for arg, _ in self._mutations:
                t = args[arg]
                if not t.requires_grad and self._position[arg] in self._kept:
                    primals[self._position[arg]] = t.detach().clone()
        outputs = self.fn(primals)
        if self._mutations:
            with torch.no_grad():
                _copy_back([args[arg] for arg, _ in self._mutations],
                           [outputs[out] for _, out in self._mutations])
        return list(outputs[:self._num_outputs])


class _Upgrade:
    """The optimized artifact of a graph served at kilnd's quick level: the
    same Compile without quick_first, begun at once, which joins the compile
    kilnd runs in the background (or finds it cached). function(quick)
    returns the optimized ArtifactFunction, or `quick` where kilnd failed
    (a warning says why), once: calls on several threads get the same one.
    A forward that ran on the quick artifact keeps it for its backward: the
    two never mix within a step."""

    def __init__(self, backend, request):
        self._backend = backend
        self._name = request["name"]
        self._lowered = request["lowered"]
        self._options = request["options"]
        self._start = time.perf_counter()
        self.arrived = None  # time.perf_counter() when the answer came
        self.record = None  # the graph's record in backend.graph_times
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._function = None
        # Without the graph report: kilnd counts the processes that met a
        # graph by the reports, and this one was counted.
        self._call = backend._compile_call(dict(request, report=None))
        self._call.add_done_callback(self._stamp)

    def _stamp(self, _):
        self.arrived = time.perf_counter()
        self._event.set()

    def done(self):
        return self._event.is_set()

    def wait(self, timeout=None):
        return self._event.wait(timeout)

    def function(self, quick):
        with self._lock:
            if self._function is None:
                self._function = self._load(quick)
            return self._function

    def _load(self, quick):
        backend = self._backend
        try:
            response = self._call.result()
            backend._verify(response)
            start = time.perf_counter()
            with _step("load", self._name):
                function = ArtifactFunction(response.artifact, self._lowered.graph)
        except (KilnError, SignatureError) as e:
            backend._warn_once(("upgrade", str(e)),
                               f"kiln: graph '{self._name}' keeps its quick artifact: {e}")
            return quick
        function.key = backend._key(self._lowered, self._options) or response.artifact.key
        quick.superseded = True
        backend.loaded.append(function)
        backend.stats["upgrades"] += 1
        if self.record is not None:
            self.record["optimized"] = self.arrived - self._start
            self.record["optimized_at"] = self.arrived
            self.record["upgrade_load"] = time.perf_counter() - start
        return function


def _copy_back(inputs, values):
    """inputs[k].copy_(values[k]) for every k: one multi-tensor copy for
    each group of the same device, dtype and shapes (a model's batch norm
    running statistics, two launches where there were six), tensor by
    tensor for the rest."""
    groups = {}
    multi = getattr(torch, "_foreach_copy_", None)
    for dst, src in zip(inputs, values):
        if (multi is not None and src.device == dst.device and src.dtype == dst.dtype
                and src.shape == dst.shape and dst.is_cuda):
            groups.setdefault((dst.device, dst.dtype), []).append((dst, src))
        else:
            dst.copy_(src)
    for pairs in groups.values():
        if len(pairs) == 1:
            pairs[0][0].copy_(pairs[0][1])
        else:
            multi([d for d, _ in pairs], [v for _, v in pairs])
