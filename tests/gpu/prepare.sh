#!/usr/bin/env bash
# Prepares what tests/gpu/run.sh needs on the GPU machine, which has torch,
# CUDA and Python but no gRPC, RocksDB or Debian packages: kilnd, kilnctl and
# kiln_nvrtc with their shared libraries (deploy/bundle.sh) in .gpu/bundle,
# the installed kiln package (with its generated protocol modules and its
# runtime library, built here against the same torch 2.11 as the GPU
# machine's) in .gpu/py, and the Debian libraries that runtime library needs
# (Protocol Buffers, Abseil) in .gpu/extlib. Run after ./setup.sh build;
# carry .gpu (and .whl: the grpcio and protobuf wheels the package was
# generated for) to the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/bundle.sh .gpu/bundle kilnd kilnctl kiln_nvrtc kiln_cuda_codegen_test
site=$(.venv/bin/python -c 'import kiln, os; print(os.path.dirname(kiln.__file__))')
rm -rf .gpu/py && mkdir -p .gpu/py && cp -r "$site" .gpu/py/
find .gpu/py -name __pycache__ -prune -exec rm -rf {} +
lib=.gpu/py/kiln/kiln_executor.so
strip --strip-debug "$lib"
rm -rf .gpu/extlib && mkdir -p .gpu/extlib
# torch's own libraries are in the process already; the host brings the rest.
ldd "$lib" | awk '/=> \// {print $1, $3}' | while read -r name path; do
  if [[ "$name" =~ ^lib(protobuf|absl_) ]]; then cp "$path" .gpu/extlib/; fi
done
strip --strip-debug .gpu/extlib/* 2>/dev/null || true
du -sh .gpu
