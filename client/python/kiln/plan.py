"""The plan runner: runs a graph compiled by the `kiln` backend.

    runner = kiln.PlanRunner(artifact.compiled)    # loads code, binds ops once
    outputs = runner.run([w, x])                   # ... then runs many times

A kiln.v1.CompiledGraph is an ExecutionPlan plus the modules of generated
code it launches (shared objects for "c++"). This is the Python counterpart
of the C++ client/runtime/plan_executor.h and follows the same contract:

  - Values are named tensors: the plan's inputs, then whatever Alloc, View
    and Extern steps define. No name is defined twice; a step reads only
    values that are defined and not yet freed.
  - Symbols: kernels receive one int64 per distinct symbol of plan.symbols,
    in order of first appearance; a symbol's value is size `dim` of input
    `input`, and every binding of a symbol must give the same value.
  - SymInt expressions (sizes, strides, offsets, symbolic Extern arguments)
    use those symbols only, in the syntax of kiln.runtime.SymExpr (+ - * //
    % Min Max, Python's floor semantics; parsed with ast, never eval'd).
  - Inputs must have the plan's dtype, rank and device type, every size its
    placeholder gives and, for sizes above 1, the strides it gives: the
    generated kernels address them with those strides, so an input with
    other strides is refused (ValueError), never silently copied.
  - Alloc: torch.empty_strided with exactly the sizes and strides given.
    With `reuse`, the new tensor is laid over the storage of that freed value
    when the storage is large enough and nothing else references it (see
    "Storage reuse" below); otherwise it is a fresh allocation, so reuse
    never changes results.
  - Launch: the module's function, with the kernel ABI of
    compiler/codegen/codegen.h,
        extern "C" void symbol(void* const* buffers, const int64_t* symbols);
    called through ctypes with the data pointers (tensor.data_ptr(), storage
    offset included) of the Launch's buffers and the symbol values. A cuda
    module's kernel is launched with the Launch's grid and block on torch's
    current stream (kiln.cuda), its buffers all on one GPU.
  - View: torch.as_strided(base, sizes, strides, storage_offset), never a
    copy. Extern: the ATen op through torch.ops, bound once with the
    reference runner's argument conversion (kiln.runtime.BoundNode); an
    output the kernel returns in another dtype than the graph gives it is
    converted to the graph's.
  - Free: the value is dead; it is dropped (or kept for the Alloc that
    reuses its storage).
  - Autograd is off while a plan runs (torch.no_grad()): outputs carry no
    grad_fn. Training goes through a compiled forward and backward
    (kiln.compiled).

Storage reuse. The C++ executor reuses a storage when its use count is 1;
torch 1.13's Python API does not expose that count, so the runner keeps its
own: the number of live values (and caller-held inputs) whose storage starts
at each address. A freed value's storage is reused only when that count is
zero and the freed tensor object has no other Python reference; whatever is
not provably unshared is allocated fresh.

Modules are loaded once per process, cached by the SHA-256 of their bytes
(ModuleLoader.shared()): a binary is written to an anonymous memory file
(os.memfd_create; a private temporary file where there is none) and opened
with ctypes.CDLL("/proc/self/fd/N"). Loaded modules are never unloaded, and
their descriptors stay open, so that the path names one object for the
process lifetime.

Errors: ValueError at construction when the plan breaks the contract (naming
the step and value), or when a module lacks a Launch's function or torch an
Extern's operator; at run time ValueError naming the input (and dim) for a
wrong input, naming the step for an expression that cannot be evaluated;
RuntimeError naming the step for an error inside ATen.

A PlanRunner is immutable after construction; run() keeps its state on the
stack and may be called from several threads at once.
"""

import _ctypes
import ctypes
import hashlib
import os
import sys
import tempfile
import threading
from collections import defaultdict

import torch

from kiln.cuda import CudaLaunch, CudaModule
from kiln.runtime import BoundNode, SymExpr, torch_device, torch_dtype

__all__ = ["PlanRunner", "ModuleLoader", "LoadedModule"]

# Names cache/guard_expr.h does not take as symbols.
_NOT_SYMBOLS = ("Min", "Max", "and", "or", "not", "True", "False")

# The kernel ABI (compiler/codegen/codegen.h).
_KERNEL_ARGTYPES = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]


# Loading modules.

class LoadedModule:
    """One shared object opened with ctypes. `digest` is the hex SHA-256 of
    its bytes, `path` what it was opened as."""

    def __init__(self, lib, path, digest, fd):
        self.digest = digest
        self.path = path
        self._lib = lib
        self._fd = fd  # the memfd it was opened from, or None; never closed

    def kernel(self, name):
        """A new ctypes function for the kernel `name`, with the kernel ABI's
        argument types; ValueError naming the symbol when the module does
        not define it."""
        try:
            fn = self._lib[name]
        except (AttributeError, ValueError):
            raise ValueError(f"module {self.digest[:12]} defines no function '{name}'") from None
        fn.argtypes = _KERNEL_ARGTYPES
        fn.restype = None
        return fn


def _path_is_loaded(path):
    """Whether the dynamic linker already has an object opened as `path` (it
    recognizes objects by path: another one must not be opened under it)."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_NOLOAD)
    except OSError:
        return False
    _ctypes.dlclose(lib._handle)
    return True


class ModuleLoader:
    """Loads CompiledModule binaries into this process, once per loader per
    distinct binary. Thread-safe. ModuleLoader.shared() is the process-wide
    loader PlanRunner uses by default."""

    _shared = None
    _shared_lock = threading.Lock()

    def __init__(self):
        self._lock = threading.Lock()
        self._modules = {}  # hex sha256 -> LoadedModule
        self.loads = 0      # binaries actually opened

    @classmethod
    def shared(cls):
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def load(self, binary):
        """The LoadedModule of `binary` (bytes of a shared object); RuntimeError
        when it cannot be loaded."""
        digest = hashlib.sha256(binary).hexdigest()
        with self._lock:
            module = self._modules.get(digest)
            if module is None:
                module = self._open(binary, digest)
                self._modules[digest] = module
                self.loads += 1
            return module

    @staticmethod
    def _open(binary, digest):
        memfd_create = getattr(os, "memfd_create", None)
        if memfd_create is None:
            return ModuleLoader._open_temp_file(binary, digest)
        fd = memfd_create("kiln-module", os.MFD_CLOEXEC)
        try:
            _write_all(fd, binary)
            # Someone else's object may hold this descriptor's path: move to
            # another number (keeping the taken ones open meanwhile).
            taken = []
            while _path_is_loaded(f"/proc/self/fd/{fd}") and len(taken) < 16:
                taken.append(fd)
                fd = os.dup(fd)
            for t in taken:
                os.close(t)
            path = f"/proc/self/fd/{fd}"
            if _path_is_loaded(path):
                raise RuntimeError(f"no free /proc/self/fd path to load module {digest[:12]}")
            lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            os.close(fd)
            raise RuntimeError(f"loading module {digest[:12]}: {e}") from None
        except BaseException:
            os.close(fd)
            raise
        return LoadedModule(lib, path, digest, fd)

    @staticmethod
    def _open_temp_file(binary, digest):
        fd, path = tempfile.mkstemp(prefix=f"kiln-module-{digest[:12]}-", suffix=".so")
        try:
            _write_all(fd, binary)
            os.close(fd)
            lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            raise RuntimeError(f"loading module {digest[:12]}: {e}") from None
        finally:
            os.unlink(path)  # the mapping outlives the name
        return LoadedModule(lib, path, digest, None)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# Sizes, strides and offsets.

def _dim(sym_int, symbols, where):
    """An int, or a SymExpr over `symbols` (names bound by plan.symbols)."""
    if sym_int.WhichOneof("value") != "expr":
        return sym_int.int_value
    try:
        expr = SymExpr(sym_int.expr)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    _check_bound(expr, symbols, where)
    return expr


def _check_bound(expr, symbols, where):
    for s in expr.symbols:
        if s not in symbols:
            raise ValueError(f"{where}: '{expr.text}' uses the symbol '{s}', which no "
                             "plan.symbols binding defines")


class _Dims:
    """A list of SymInts; a tuple of ints when none is symbolic."""

    __slots__ = ("static", "dims")

    def __init__(self, sym_ints, symbols, where, field):
        self.dims = [_dim(s, symbols, f"{where}: {field}[{k}]") for k, s in enumerate(sym_ints)]
        self.static = (tuple(self.dims)
                       if not any(isinstance(d, SymExpr) for d in self.dims) else None)

    def __len__(self):
        return len(self.dims)

    def evaluate(self, values, sizes):
        """The values; ValueError for a negative size when `sizes`."""
        if self.static is not None:
            out = self.static
        else:
            out = tuple(d.evaluate(values) if isinstance(d, SymExpr) else d for d in self.dims)
        if sizes:
            for k, v in enumerate(out):
                if v < 0:
                    raise ValueError(f"size {k} evaluates to {v}")
        return out


def _evaluate(dim, values):
    return dim.evaluate(values) if isinstance(dim, SymExpr) else dim


# Steps. Each runs on a _RunState; `label` names it in errors.

class _RunState:
    __slots__ = ("env", "dead", "values", "symbol_array", "symbol_list", "storage_users")

    def __init__(self, env, values, symbol_array, track_storage, symbol_list=()):
        self.env = env                      # value name -> tensor
        self.dead = {}                      # freed values kept for reuse
        self.values = values                # symbol name -> int
        self.symbol_array = symbol_array    # the kernels' int64 symbols
        self.symbol_list = symbol_list      # the same as a list (cuda launches)
        # storage address -> live values using it (only when a plan reuses)
        self.storage_users = defaultdict(int) if track_storage else None

    def define(self, name, tensor):
        self.env[name] = tensor
        if self.storage_users is not None and tensor is not None:
            self.storage_users[_storage_key(tensor)] += 1


def _storage_key(t):
    """The address the storage of tensor `t` starts at (unique among live
    storages with bytes)."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _untyped_storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t._storage()


def _storage_nbytes(sizes, strides, element_size):
    if any(s == 0 for s in sizes):
        return 0
    return element_size * (1 + sum((s - 1) * st for s, st in zip(sizes, strides)))


def _same_device(a, b):
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class _Alloc:
    __slots__ = ("label", "value", "dtype", "device", "sizes", "strides", "reuse")

    def run(self, state):
        sizes = self.sizes.evaluate(state.values, sizes=True)
        strides = self.strides.evaluate(state.values, sizes=False)
        if self.reuse is not None:
            old = state.dead.pop(self.reuse, None)
            # Only when no live value (a view, the caller's input) shares the
            # storage and no other Python reference holds the tensor: the
            # local name and getrefcount's argument are the two counted.
            if (old is not None and sys.getrefcount(old) == 2
                    and state.storage_users[_storage_key(old)] == 0
                    and _same_device(old.device, self.device)):
                storage = _untyped_storage(old)
                needed = _storage_nbytes(sizes, strides, _element_size(self.dtype))
                if 0 < needed <= storage.nbytes():
                    t = torch.empty(0, dtype=self.dtype, device=self.device)
                    t.set_(storage, 0, sizes, strides)
                    state.define(self.value, t)
                    return
            del old
        state.define(self.value, torch.empty_strided(sizes, strides, dtype=self.dtype,
                                                     device=self.device))


_ELEMENT_SIZES = {}


def _element_size(dtype):
    size = _ELEMENT_SIZES.get(dtype)
    if size is None:
        size = _ELEMENT_SIZES[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


class _Launch:
    __slots__ = ("label", "fn", "buffers")

    def run(self, state):
        env = state.env
        pointers = (ctypes.c_void_p * max(len(self.buffers), 1))()
        for k, name in enumerate(self.buffers):
            t = env[name]
            if t is None or t.device.type != "cpu":
                where = "undefined" if t is None else f"on {t.device}"
                raise ValueError(f"buffer '{name}' is {where}; a c++ kernel needs a defined "
                                 "tensor in host memory")
            pointers[k] = t.data_ptr()
        self.fn(pointers, state.symbol_array)


class _CudaLaunch:
    __slots__ = ("label", "launch", "buffers", "grid", "block")

    def run(self, state):
        env = state.env
        pointers = []
        device = None
        for name in self.buffers:
            t = env[name]
            if t is None or t.device.type != "cuda" or (device is not None and t.device != device):
                where = "undefined" if t is None else f"on {t.device}"
                raise ValueError(f"buffer '{name}' is {where}; a cuda kernel needs defined "
                                 f"tensors on one GPU{f' ({device})' if device else ''}")
            device = t.device
            pointers.append(t.data_ptr())
        grid = self.grid.evaluate(state.values, sizes=True)[0]
        self.launch.run(pointers, state.symbol_list, grid, self.block, device)


class _View:
    __slots__ = ("label", "value", "base", "sizes", "strides", "offset")

    def run(self, state):
        sizes = self.sizes.evaluate(state.values, sizes=True)
        strides = self.strides.evaluate(state.values, sizes=False)
        offset = _evaluate(self.offset, state.values)
        state.define(self.value, torch.as_strided(state.env[self.base], sizes, strides, offset))


def _layout_differs(t, strides):
    """Whether tensor `t` is laid out other than `strides` say (dimensions of
    size 0 or 1 have no layout)."""
    return any(size > 1 and got != want for size, got, want in zip(t.shape, t.stride(), strides))


class _Extern:
    __slots__ = ("label", "node", "dtypes", "layouts")

    def run(self, state):
        env = state.env
        self.node.call(env, state.values)
        for name, dtype in self.dtypes:
            t = env[name]
            if t is not None and t.dtype != dtype:
                env[name] = t.to(dtype)
        # Kernels read an extern's result by the strides of its metadata: a
        # result ATen laid out otherwise (an op whose kernel choice depends on
        # the device, such as fused attention's math fallback) is copied.
        for name, dims in self.layouts:
            t = env[name]
            if t is None:
                continue
            strides = dims.evaluate(state.values, False)
            if _layout_differs(t, strides):
                env[name] = torch.empty_strided(t.shape, strides, dtype=t.dtype,
                                                device=t.device).copy_(t)
        if state.storage_users is not None:
            for name in self.node.outputs:
                t = env[name]  # None for an output the op does not compute
                if t is not None:
                    state.storage_users[_storage_key(t)] += 1


class _Free:
    __slots__ = ("label", "value", "keep")

    def run(self, state):
        t = state.env.pop(self.value)
        if state.storage_users is not None and t is not None:
            state.storage_users[_storage_key(t)] -= 1
        if self.keep and t is not None:
            state.dead[self.value] = t


class _PlanBuilder:
    """Turns the plan's steps into step objects, tracking the state of every
    value along the plan: this is where every plan error is found."""

    _LIVE, _FREED, _REUSED = "live", "freed", "reused"

    def __init__(self, plan, symbols, modules):
        self.plan = plan
        self.symbols = symbols
        self.modules = modules
        self.state = {}       # value name -> _LIVE / _FREED / _REUSED
        self.inputs = set()
        self.freed_by = {}    # value name -> its _Free step
        self.read = set()     # values a step or the plan's outputs read

    def define_inputs(self):
        for i, ph in enumerate(self.plan.inputs):
            self._define(ph.value.name, f"plan.inputs[{i}]")
            self.inputs.add(ph.value.name)

    def _define(self, name, where):
        if not name:
            raise ValueError(f"{where}: a value has no name")
        if name in self.state:
            raise ValueError(f"{where}: the value '{name}' is defined twice")
        self.state[name] = self._LIVE

    def _use(self, name, where, read=True):
        if read:
            self.read.add(name)
        state = self.state.get(name)
        if state is None:
            raise ValueError(f"{where}: the value '{name}' is not defined before it")
        if state != self._LIVE:
            raise ValueError(f"{where}: the value '{name}' was freed before it")

    def build_steps(self):
        steps = []
        for i, p in enumerate(self.plan.steps):
            kind = p.WhichOneof("kind")
            if kind == "alloc":
                step = self._alloc(p.alloc, f"step {i} (alloc '{p.alloc.value}')")
            elif kind == "launch":
                step = self._launch(p.launch, f"step {i} (launch '{p.launch.symbol}')")
            elif kind == "extern_call":
                step = self._extern(p.extern_call.node,
                                    f"step {i} (extern '{p.extern_call.node.name}')")
            elif kind == "view":
                step = self._view(p.view, f"step {i} (view '{p.view.value}')")
            elif kind == "free":
                step = _Free()
                step.label = f"step {i} (free '{p.free.value}')"
                self._use(p.free.value, step.label, read=False)
                step.value = p.free.value
                step.keep = False
                self.state[step.value] = self._FREED
                self.freed_by[step.value] = step
            else:
                raise ValueError(f"step {i} has no kind")
            steps.append(step)
        return steps

    def outputs(self):
        for i, name in enumerate(self.plan.outputs):
            self._use(name, f"plan.outputs[{i}]")
        return list(self.plan.outputs)

    def _alloc(self, p, where):
        s = _Alloc()
        s.label = where
        try:
            s.dtype = torch_dtype(p.dtype)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        s.device = torch.device("cpu")
        if p.HasField("device") and p.device.type:
            try:
                s.device = torch_device(p.device)
            except RuntimeError:
                raise ValueError(f"{where}: unknown device '{p.device.type}'") from None
        s.sizes = _Dims(p.sizes, self.symbols, where, "sizes")
        s.strides = _Dims(p.strides, self.symbols, where, "strides")
        if len(s.sizes) != len(s.strides):
            raise ValueError(f"{where}: {len(s.sizes)} sizes but {len(s.strides)} strides")
        s.reuse = None
        if p.reuse:
            if self.state.get(p.reuse) != self._FREED or p.reuse in self.inputs:
                raise ValueError(f"{where}: reuse names '{p.reuse}', which is not a freed value "
                                 "the plan allocated (or it was reused already)")
            s.reuse = p.reuse
            self.state[p.reuse] = self._REUSED
            self.freed_by[p.reuse].keep = True
        self._define(p.value, where)
        s.value = p.value
        return s

    def _launch(self, p, where):
        if not 0 <= p.module < len(self.modules):
            raise ValueError(f"{where}: module {p.module} out of range (the graph has "
                             f"{len(self.modules)} modules)")
        module = self.modules[p.module]
        if isinstance(module, CudaModule):
            s = _CudaLaunch()
            s.launch = CudaLaunch(module, p.symbol)
            if len(p.grid) != 1 or len(p.block) != 1 or not p.block[0].HasField("int_value"):
                raise ValueError(f"{where}: a cuda launch needs one grid size and one constant "
                                 "block size")
            s.grid = _Dims(p.grid, self.symbols, where, "grid")
            s.block = p.block[0].int_value
            if not 1 <= s.block <= 1024:
                raise ValueError(f"{where}: block size {s.block} is outside [1, 1024]")
        else:
            s = _Launch()
            try:
                s.fn = module.kernel(p.symbol)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        s.label = where
        for name in p.buffers:
            self._use(name, where)
        s.buffers = list(p.buffers)
        return s

    def _view(self, p, where):
        s = _View()
        s.label = where
        self._use(p.base, where)
        s.base = p.base
        s.sizes = _Dims(p.sizes, self.symbols, where, "sizes")
        s.strides = _Dims(p.strides, self.symbols, where, "strides")
        if len(s.sizes) != len(s.strides):
            raise ValueError(f"{where}: {len(s.sizes)} sizes but {len(s.strides)} strides")
        s.offset = _dim(p.storage_offset, self.symbols, f"{where}: storage_offset")
        self._define(p.value, where)
        s.value = p.value
        return s

    def _extern(self, node, where):
        s = _Extern()
        s.label = where
        try:
            s.node = BoundNode(node)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        for name in s.node.reads():
            self._use(name, where)
        for expr in s.node.exprs():
            _check_bound(expr, self.symbols, where)
        for name in s.node.outputs:
            self._define(name, where)
        # The dtypes the graph gives the outputs: a few ATen kernels disagree
        # with torch's own meta functions (batch norm's new running statistics
        # of bfloat16 buffers are bfloat16 on CUDA, float32 by its meta).
        s.dtypes = []
        s.layouts = []
        for out in node.outputs:
            if out.name and out.meta.dtype:
                try:
                    s.dtypes.append((out.name, torch_dtype(out.meta.dtype)))
                except ValueError:
                    pass
            if out.name and len(out.meta.strides) == len(out.meta.sizes) and out.meta.strides:
                try:
                    s.layouts.append((out.name, _Dims(out.meta.strides, self.symbols, where,
                                                      f"output '{out.name}' strides")))
                except ValueError:
                    pass  # strides of symbols the plan does not bind: not checked
        return s


class _Input:
    __slots__ = ("name", "dtype", "device_type", "sizes", "strides")


class PlanRunner:
    """Runs one kiln.v1.CompiledGraph; see the module's docstring.

    Construction does all the work that does not depend on the inputs: it
    checks the plan, loads the modules (through `loader`, by default
    ModuleLoader.shared()), resolves every Launch's function, binds every
    Extern node to its operator and parses every expression. run() only
    evaluates sizes and executes the steps.

    Attributes: `input_names`, `output_names`, `kernels` (plan.kernels)."""

    _MAX_CHECKED = 64  # input signatures whose checks run() remembers

    def __init__(self, compiled_graph, loader=None, sm_arch=""):
        loader = loader or ModuleLoader.shared()
        plan = compiled_graph.plan
        self.kernels = plan.kernels
        self._modules = []
        for m, module in enumerate(compiled_graph.modules):
            if module.language == "cuda":
                if not sm_arch:
                    raise ValueError(f"modules[{m}]: a cuda module needs the artifact's "
                                     "target.sm_arch")
                self._modules.append(CudaModule.shared(module.binary, sm_arch))
                continue
            if module.language != "c++":
                raise ValueError(f"modules[{m}]: language '{module.language}': this runtime "
                                 "loads c++ and cuda")
            try:
                self._modules.append(loader.load(module.binary))
            except RuntimeError as e:
                raise RuntimeError(f"modules[{m}]: {e}") from None

        # Distinct symbols in kernel order, and every binding of each.
        self._symbols = []
        self._bindings = []  # (symbol, input, dim)
        for i, b in enumerate(plan.symbols):
            where = f"plan.symbols[{i}] ('{b.symbol}')"
            if not (b.symbol.isascii() and b.symbol.isidentifier()) or b.symbol in _NOT_SYMBOLS:
                raise ValueError(f"{where}: not a symbol name")
            if not 0 <= b.input < len(plan.inputs):
                raise ValueError(f"{where}: input {b.input} out of range")
            rank = len(plan.inputs[b.input].value.meta.sizes)
            if not 0 <= b.dim < rank:
                raise ValueError(f"{where}: dim {b.dim} out of range (input {b.input} has rank "
                                 f"{rank})")
            if b.symbol not in self._symbols:
                self._symbols.append(b.symbol)
            self._bindings.append((b.symbol, b.input, b.dim))
        symbols = set(self._symbols)

        self._inputs = []
        for i, ph in enumerate(plan.inputs):
            v = ph.value
            where = f"plan.inputs[{i}] ('{v.name}')"
            spec = _Input()
            spec.name = v.name
            try:
                spec.dtype = torch_dtype(v.meta.dtype)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            spec.device_type = v.meta.device.type
            spec.sizes = _Dims(v.meta.sizes, symbols, where, "sizes")
            spec.strides = (_Dims(v.meta.strides, symbols, where, "strides")
                            if len(v.meta.strides) == len(v.meta.sizes) else None)
            self._inputs.append(spec)
        self.input_names = [spec.name for spec in self._inputs]

        builder = _PlanBuilder(plan, symbols, self._modules)
        builder.define_inputs()
        self._steps = builder.build_steps()
        self.output_names = builder.outputs()
        # An extern's results that nothing reads (fused attention's random
        # state) are neither converted nor copied.
        for step in self._steps:
            if isinstance(step, _Extern):
                step.dtypes = [(n, d) for n, d in step.dtypes if n in builder.read]
                step.layouts = [(n, st) for n, st in step.layouts if n in builder.read]
        self._reuses = any(isinstance(s, _Alloc) and s.reuse is not None for s in self._steps)
        self._checked = {}  # (shape, stride, dtype, device) per input -> run() inputs

    @property
    def num_inputs(self):
        return len(self._inputs)

    @property
    def num_outputs(self):
        return len(self.output_names)

    def _check_inputs(self, inputs):
        if len(inputs) != len(self._inputs):
            raise ValueError(f"the plan takes {len(self._inputs)} inputs, got {len(inputs)}")
        for i, (t, want) in enumerate(zip(inputs, self._inputs)):
            label = f"input {i} ('{want.name}')"
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{label} is {type(t).__name__}, not a tensor")
            if t.dtype != want.dtype:
                raise ValueError(f"{label} is {t.dtype}; the plan expects {want.dtype}")
            if t.dim() != len(want.sizes):
                raise ValueError(f"{label} has rank {t.dim()}; the plan expects "
                                 f"{len(want.sizes)}")
            if want.device_type and t.device.type != want.device_type:
                raise ValueError(f"{label} is on {t.device}; the plan expects "
                                 f"{want.device_type}")

    def _resolve_symbols(self, inputs):
        values = {}
        bound_by = {}
        for symbol, i, d in self._bindings:
            size = inputs[i].shape[d]
            if symbol not in values:
                values[symbol] = size
                bound_by[symbol] = (i, d)
            elif values[symbol] != size:
                fi, fd = bound_by[symbol]
                raise ValueError(f"input {i} ('{self._inputs[i].name}') dim {d} is {size}, but "
                                 f"symbol {symbol} is {values[symbol]} from input {fi} "
                                 f"('{self._inputs[fi].name}') dim {fd}")
        return values

    def _check_sizes(self, inputs, values):
        for i, (t, want) in enumerate(zip(inputs, self._inputs)):
            label = f"input {i} ('{want.name}')"
            try:
                sizes = want.sizes.evaluate(values, sizes=True)
                strides = (want.strides.evaluate(values, sizes=False)
                           if want.strides is not None else None)
            except ValueError as e:
                raise ValueError(f"{label}: {e}") from None
            for d, size in enumerate(sizes):
                if t.shape[d] != size:
                    raise ValueError(f"{label} dim {d} is {t.shape[d]}; the plan expects {size} "
                                     f"(sizes {list(t.shape)})")
            if strides is None:
                continue
            for d, stride in enumerate(strides):
                # The stride of a dim of size 0 or 1 never moves an address.
                if t.shape[d] > 1 and t.stride(d) != stride:
                    raise ValueError(f"{label} dim {d} has stride {t.stride(d)}; the plan "
                                     f"expects {stride} (strides {list(t.stride())}): the "
                                     "compiled kernels address it with the plan's strides")

    def run(self, inputs):
        """Runs the plan on `inputs` (one tensor per plan input, in order) and
        returns the list of its outputs."""
        inputs = list(inputs)
        # Inputs of sizes, strides, dtypes and devices checked before reuse
        # that check, its symbol values and the kernels' symbol array (both
        # only read by the steps).
        try:
            key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in inputs)
        except (AttributeError, TypeError):
            key = None
        checked = self._checked.get(key) if key is not None else None
        if checked is None:
            self._check_inputs(inputs)
            values = self._resolve_symbols(inputs)
            self._check_sizes(inputs, values)
            symbol_list = [values[s] for s in self._symbols]
            symbol_array = (ctypes.c_int64 * max(len(symbol_list), 1))(*symbol_list)
            checked = (values, symbol_array, symbol_list)
            if key is not None and len(self._checked) < self._MAX_CHECKED:
                self._checked[key] = checked
        values, symbol_array, symbol_list = checked
        state = _RunState({}, values, symbol_array, self._reuses, symbol_list)
        for t, spec in zip(inputs, self._inputs):
            state.define(spec.name, t)
            if self._reuses:
                state.storage_users[_storage_key(t)] += 1  # the caller holds it too
        with torch.no_grad():
            for step in self._steps:
                try:
                    step.run(state)
                except ValueError as e:
                    raise ValueError(f"{step.label}: {e}") from None
                except Exception as e:
                    raise RuntimeError(f"{step.label}: {e}") from e
        env = state.env
        return [env[name] for name in self.output_names]

    def __repr__(self):
        return (f"<kiln.PlanRunner {len(self._inputs)} inputs, {len(self._steps)} steps, "
                f"{self.kernels} kernels>")
