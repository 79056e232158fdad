"""Builds the kiln package; the protocol modules (kiln.v1.*_pb2) are generated
here from proto/kiln/v1/*.proto with grpcio-tools' protoc, so that they match
the protobuf runtime that is installed beside them."""

import os
import pathlib

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


setup(cmdclass={"build_py": BuildWithProtocol})
