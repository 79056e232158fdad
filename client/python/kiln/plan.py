"""The plan runner: runs a graph compiled by the `kiln` backend.

    runner = kiln.PlanRunner(artifact.compiled)    # loads code, binds ops once
    outputs = runner.run([w, x])                   # ... then runs many times

A kiln.v1.CompiledGraph is an ExecutionPlan plus the modules of generated
code it launches: shared objects ("c++") or CUBINs ("cuda"). The runner is
the C++ plan executor (client/runtime/plan_executor.h, the one
implementation of the plan contract, documented there) reached through the
package's torch library (kiln._executor). Construction checks the plan,
loads its modules and binds its ATen ops; run() checks the inputs, evaluates
the sizes and executes the steps in C++, launching CUDA kernels on torch's
current stream.

Errors: ValueError when the plan breaks the contract (naming the step and
value), when a module lacks a Launch's function (a c++ module at
construction, a cuda module at the first run on a device, when its CUBIN
loads) or torch an Extern's operator, or when an input does not fit the plan
(naming the input and dim); NotImplementedError for a module this runtime or
GPU cannot run (an arch the device lacks, naming both); torch.OutOfMemoryError
when the device is out of memory; RuntimeError naming the step for an error
inside ATen or the CUDA driver.

A PlanRunner is immutable after construction; run() may be called from
several threads at once.
"""

import torch

from kiln import _executor

__all__ = ["PlanRunner", "ModuleLoader"]


class ModuleLoader:
    """The process-wide loader of c++ modules (the executor's): a binary is
    loaded once per process, however many plans use it."""

    _shared = None

    @classmethod
    def shared(cls):
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    @property
    def loads(self):
        """Binaries opened so far (a cache hit does not count)."""
        return _executor.module_loads()


class PlanRunner:
    """Runs one kiln.v1.CompiledGraph; see the module's docstring. `sm_arch`
    is the artifact's target.sm_arch, which cuda modules need.

    Attributes: `input_names`, `output_names`, `kernels` (plan.kernels)."""

    def __init__(self, compiled_graph, sm_arch=""):
        plan = compiled_graph.plan
        self.kernels = plan.kernels
        self.input_names = [ph.value.name for ph in plan.inputs]
        self.output_names = list(plan.outputs)
        self._executor = _executor.plan_executor(compiled_graph.SerializeToString(), sm_arch)
        self._run = self._executor.run

    @property
    def num_inputs(self):
        return len(self.input_names)

    @property
    def num_outputs(self):
        return len(self.output_names)

    def run(self, inputs):
        """Runs the plan on `inputs` (one tensor per plan input, in order) and
        returns the list of its outputs."""
        inputs = list(inputs)
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                name = self.input_names[i] if i < len(self.input_names) else "?"
                raise ValueError(f"input {i} ('{name}') is {type(t).__name__}, not a tensor")
        return self._run(inputs)

    def __repr__(self):
        return (f"<kiln.PlanRunner {self.num_inputs} inputs, {self.num_outputs} outputs, "
                f"{self.kernels} kernels>")
