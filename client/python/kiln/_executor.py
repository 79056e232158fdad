"""kiln's runtime library: the C++ plan executor (client/runtime/plan_executor.h)
as a torch library, kiln_executor.so beside this file.

The package's install builds it against the installed torch (setup.py);
KILN_EXECUTOR_LIBRARY names another copy. It uses no Python C API, so one
build serves every Python version of that torch. It is loaded with
torch.ops.load_library on first use and registers torch.classes.kiln_runtime
and torch.ops.kiln_runtime (client/runtime/torch_library.cc).
"""

import os
import threading

import torch

__all__ = ["plan_executor", "check_artifact", "module_loads", "library_path", "sym_expr"]

_lock = threading.Lock()
_loaded = False


def library_path():
    return os.environ.get("KILN_EXECUTOR_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "kiln_executor.so")


def _load():
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        path = library_path()
        if not os.path.exists(path):
            raise RuntimeError(f"kiln's runtime library {path} is missing: install the package "
                               "with ./setup.sh build, which builds it against the installed "
                               "torch")
        torch.ops.load_library(path)
        _loaded = True


def plan_executor(data, sm_arch):
    """A torch.classes.kiln_runtime.PlanExecutor of the serialized
    CompiledGraph `data` (bytes)."""
    _load()
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
              else torch.empty(0, dtype=torch.uint8))
    return torch.classes.kiln_runtime.PlanExecutor(buffer, sm_arch)


def sym_expr(text):
    """A torch.classes.kiln_runtime.SymExpr of `text`; ValueError when it is
    malformed."""
    _load()
    return torch.classes.kiln_runtime.SymExpr(text)


def check_artifact(artifact):
    """Raises (NotImplementedError, a RuntimeError) unless this runtime can run
    `artifact` (a kiln.v1.Artifact): a format version it reads, and for a cpu
    artifact code for an ISA level this CPU has."""
    _load()
    target = artifact.target
    torch.ops.kiln_runtime.check_artifact(artifact.format_version, target.device_type,
                                          target.cpu_isa)


def module_loads():
    """The c++ modules this process has loaded (a cached one does not count)."""
    _load()
    return torch.ops.kiln_runtime.module_loads()
