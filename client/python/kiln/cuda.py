"""Launching kiln's CUDA kernels: CUBINs loaded through the CUDA driver API.

The CUDA backend's modules (language "cuda") hold a CUBIN for one SM arch
(artifact.target.sm_arch). This module loads them with cuModuleLoadData into
the primary context of the device a launch runs on (torch's own context),
once per (module, device), and launches with the kernel ABI of
compiler/codegen/codegen.h: one parameter buffer holding the buffers' data
pointers and then the plan's symbol values, 8 bytes each, on torch's current
stream of that device. The driver library is opened with ctypes
("libcuda.so.1", the driver's own; never a stub), so nothing here needs to
be built and a machine without a GPU can import it.

An artifact whose arch the device cannot run (a CUBIN runs on its own major
version, at its minor version or above) is refused naming both.
"""

import ctypes
import hashlib
import threading

import torch

__all__ = ["CudaModule", "CudaGraphed", "check_arch"]

_PARAM_BUFFER_POINTER = ctypes.c_void_p(1)
_PARAM_BUFFER_SIZE = ctypes.c_void_p(2)
_PARAM_END = ctypes.c_void_p(0)
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76


class _Driver:
    _instance = None
    _lock = threading.Lock()

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._instance is None:
                cls._instance = _Driver()
            return cls._instance

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(f"cannot load the CUDA driver (libcuda.so.1): {e}") from None
        self.lib = lib
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                            ctypes.c_char_p]
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                             ctypes.c_int]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.check(lib.cuInit(0), "cuInit")

    def check(self, rc, what):
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else f"error {rc}"
            raise RuntimeError(f"{what}: {text}")

    def capability(self, index):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, index),
                   "cuDeviceGetAttribute")
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, index),
                   "cuDeviceGetAttribute")
        return major.value, minor.value


def check_arch(sm_arch, device):
    """Raises ValueError naming both when `device` (a torch.device) cannot run
    a CUBIN built for `sm_arch` ("sm_90")."""
    digits = sm_arch[3:].rstrip("a") if sm_arch.startswith("sm_") else ""
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"the artifact's sm_arch '{sm_arch}' is not an SM arch like sm_90")
    want = (int(digits[:-1]), int(digits[-1]))
    index = device.index if device.index is not None else torch.cuda.current_device()
    have = _Driver.get().capability(index)
    exact = sm_arch.endswith("a")
    if have[0] != want[0] or have[1] < want[1] or (exact and have != want):
        raise ValueError(f"the artifact was compiled for {sm_arch}, but {device} is "
                         f"sm_{have[0]}{have[1]} ({torch.cuda.get_device_name(index)}): "
                         f"compile with options.target.sm_arch = 'sm_{have[0]}{have[1]}'")


class CudaModule:
    """One CUBIN, loaded lazily into each device's primary context.
    CudaModule.shared() gives one object per distinct binary in the process
    (artifacts compiled again, or served again after a recompile, load
    nothing new); loaded modules are never unloaded."""

    _shared = {}  # (SHA-256 of the binary, sm_arch) -> CudaModule
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, binary, sm_arch):
        key = (hashlib.sha256(binary).hexdigest(), sm_arch)
        with cls._shared_lock:
            module = cls._shared.get(key)
            if module is None:
                module = cls._shared[key] = cls(binary, sm_arch)
            return module

    def __init__(self, binary, sm_arch):
        self._binary = bytes(binary)
        self.sm_arch = sm_arch
        self._modules = {}  # device index -> CUmodule
        self._functions = {}  # (device index, name) -> CUfunction
        self._checked = set()
        self._lock = threading.Lock()

    def _module(self, index):
        module = self._modules.get(index)
        if module is not None:
            return module
        driver = _Driver.get()
        handle = ctypes.c_void_p()
        with torch.cuda.device(index):
            torch.cuda.init()
            ctx = ctypes.c_void_p()
            driver.lib.cuCtxGetCurrent(ctypes.byref(ctx))
            if not ctx.value:
                torch.zeros(1, device=f"cuda:{index}")  # makes torch's context current
            driver.check(driver.lib.cuModuleLoadData(ctypes.byref(handle), self._binary),
                         "cuModuleLoadData")
        self._modules[index] = handle
        return handle

    def function(self, name, device):
        """The CUfunction `name` on `device`; ValueError when the module does
        not define it or the device cannot run it."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, name)
        with self._lock:
            fn = self._functions.get(key)
            if fn is not None:
                return fn
            if index not in self._checked:
                check_arch(self.sm_arch, torch.device("cuda", index))
                self._checked.add(index)
            module = self._module(index)
            fn = ctypes.c_void_p()
            rc = _Driver.get().lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode())
            if rc != 0:
                raise ValueError(f"the CUDA module defines no kernel '{name}'")
            self._functions[key] = fn
            return fn


def _raw_stream(index):
    """torch's current stream of device `index`, as a CUstream handle."""
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter(index)
    return torch.cuda.current_stream(index).cuda_stream


class CudaLaunch:
    """Launches one kernel of a CudaModule: `run(pointers, symbols, grid,
    block, device)` on torch's current stream of `device`."""

    def __init__(self, module, name):
        self.module = module
        self.name = name
        self._functions = {}  # device index -> CUfunction
        self._driver = _Driver.get()

    def run(self, pointers, symbols, grid, block, device):
        if grid <= 0:
            return  # nothing to compute (an empty tensor)
        index = device.index if device.index is not None else torch.cuda.current_device()
        fn = self._functions.get(index)
        if fn is None:
            fn = self._functions[index] = self.module.function(self.name, device)
        count = len(pointers) + len(symbols)
        params = (ctypes.c_uint64 * max(count, 1))(*pointers, *symbols)
        size = ctypes.c_size_t(8 * count)
        extra = (ctypes.c_void_p * 5)(_PARAM_BUFFER_POINTER, ctypes.addressof(params),
                                      _PARAM_BUFFER_SIZE, ctypes.addressof(size), _PARAM_END)
        rc = self._driver.lib.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0,
                                             _raw_stream(index), None, ctypes.addressof(extra))
        if rc != 0:
            self._driver.check(rc, f"cuLaunchKernel({self.name})")


class CudaGraphed:
    """Replays `fn` (a list of CUDA tensors -> a tuple of tensors) as one CUDA
    graph: torch.compile's mode="reduce-overhead" for kiln's plans, whose
    host-side cost (a Python step per kernel) then becomes one launch.

    The first call with given input metadata runs `fn` as it is (modules
    load, the caching allocator warms up); the second captures it with
    torch.cuda.graph and every later one replays. Inputs whose storage is
    the same at both calls (parameters, buffers) are read in place; the
    others are copied into the graph's own input buffers. Outputs are
    cloned, so a result stays valid after the next call. A call that could
    not replay runs `fn`: inputs of other sizes, strides, dtypes or devices,
    a stable input that moved, a tensor that requires grad while grad is
    enabled (training runs the plans as they are)."""

    def __init__(self, fn):
        self.fn = fn
        self.replays = 0
        self._meta = None
        self._first_ptrs = None
        self._graph = None

    @staticmethod
    def _metadata(primals):
        return [(tuple(t.shape), t.stride(), t.dtype, t.device) for t in primals]

    def __call__(self, primals):
        if (torch.is_grad_enabled() and any(t.requires_grad for t in primals)) or not all(
                isinstance(t, torch.Tensor) and t.is_cuda for t in primals):
            return self.fn(primals)
        meta = self._metadata(primals)
        if meta != self._meta:
            # New metadata: warm up with it, capture on the next call.
            self._meta, self._graph = meta, None
            self._first_ptrs = [t.data_ptr() for t in primals]
            return self.fn(primals)
        if self._graph is None:
            self._capture(primals)
        for i, t in enumerate(primals):
            if i in self._stable:
                if t.data_ptr() != self._stable[i]:
                    return self.fn(primals)  # a parameter was replaced: run as it is
            else:
                self._static[i].copy_(t)
        self._graph.replay()
        self.replays += 1
        return tuple(o.clone() for o in self._outputs)

    def _capture(self, primals):
        self._stable = {i: t.data_ptr() for i, t in enumerate(primals)
                        if t.data_ptr() == self._first_ptrs[i]}
        self._static = [t if i in self._stable else t.clone() for i, t in enumerate(primals)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.fn(self._static)  # warm-up on the capture's own stream, as torch asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._outputs = self.fn(self._static)
        self._graph = graph
