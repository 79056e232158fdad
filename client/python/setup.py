"""Builds the kiln package; the protocol modules (kiln.v1.*_pb2) are generated
here from proto/kiln/v1/*.proto with grpcio-tools' protoc, so that they match
the protobuf runtime that is installed beside them.

With torch installed, the runtime library (kiln/kiln_executor.so: the C++
plan executor as a torch library, kiln/_executor.py) is built against that
torch by the project's CMake build, in KILN_BUILD_DIR (default: the
project's build/, configured for this torch when it does not exist yet); it
needs the project's build dependencies (./setup.sh installs them). pip must
see the installed torch: install with --no-build-isolation, as ./setup.sh
does. Without torch, or when the build fails, the package installs without
the library and says why: the gRPC client works, and running a `kiln` plan
says the library is missing. KILN_REQUIRE_EXECUTOR=1 makes a failed build
fail the install."""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTOS = ["graph", "guards", "artifact", "service", "config", "store"]


class BuildWithProtocol(build_py):
    """build_py that first writes kiln/v1/*_pb2.py into the build directory."""

    def run(self):
        super().run()
        from grpc_tools import protoc  # noqa: PLC0415 (a build requirement)

        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        out = pathlib.Path(self.build_lib)
        (out / "kiln" / "v1").mkdir(parents=True, exist_ok=True)
        (out / "kiln" / "v1" / "__init__.py").touch()
        for name in PROTOS:
            source = PROTO_ROOT / "kiln" / "v1" / f"{name}.proto"
            args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}"]
            if name == "service":
                args.append(f"--grpc_python_out={out}")
            if protoc.main([*args, str(source)]) != 0:
                raise RuntimeError(f"protoc failed on {source}")
        try:
            library = _build_executor_library()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
            if os.environ.get("KILN_REQUIRE_EXECUTOR") == "1":
                raise
            print(f"kiln: WARNING: the runtime library was not built ({e}); the package "
                  "installs without it", file=sys.stderr)
            library = None
        if library is not None:
            shutil.copy2(library, out / "kiln" / "kiln_executor.so")


def _build_executor_library():
    """The path of kiln_executor.so built against the installed torch, or None
    without torch."""
    if importlib.util.find_spec("torch") is None:
        print("kiln: torch is not installed; the runtime library is not built")
        return None
    import torch.utils  # noqa: PLC0415 (only with torch)

    prefix = torch.utils.cmake_prefix_path
    build = pathlib.Path(os.environ.get("KILN_BUILD_DIR", HERE.parent.parent / "build"))
    cache = build / "CMakeCache.txt"
    if not cache.exists():
        subprocess.run(["cmake", "-S", str(HERE.parent.parent), "-B", str(build), "-G", "Ninja",
                        f"-DCMAKE_PREFIX_PATH={prefix}", f"-DKILN_PYTHON={sys.executable}"],
                       check=True, stdout=subprocess.DEVNULL)
    torch_dir = re.search(r"^Torch_DIR:PATH=(.*)$", cache.read_text(), re.M)
    if not torch_dir or not pathlib.Path(torch_dir.group(1)).resolve().is_relative_to(
            pathlib.Path(prefix).resolve()):
        raise RuntimeError(f"{build} is configured for the torch at "
                           f"{torch_dir.group(1) if torch_dir else 'none'}, not the installed one "
                           f"({prefix}): set KILN_BUILD_DIR to another build directory")
    jobs = os.environ.get("KILN_BUILD_JOBS", "2")
    subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", "kiln_executor"],
                   check=True)
    return build / "lib" / "kiln_executor.so"


setup(cmdclass={"build_py": BuildWithProtocol})
