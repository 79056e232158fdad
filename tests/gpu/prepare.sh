#!/usr/bin/env bash
# Prepares what tests/gpu/run.sh needs on the GPU machine, which has torch,
# CUDA and Python but no gRPC, RocksDB or Debian packages: kilnd, kilnctl and
# kiln_nvrtc with their shared libraries (deploy/bundle.sh) in .gpu/bundle,
# and the installed kiln package (with its generated protocol modules) in
# .gpu/py. Run after ./setup.sh build; carry .gpu (and .whl: the grpcio and
# protobuf wheels the package was generated for) to the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/bundle.sh .gpu/bundle kilnd kilnctl kiln_nvrtc
site=$(.venv/bin/python -c 'import kiln, os; print(os.path.dirname(kiln.__file__))')
rm -rf .gpu/py && mkdir -p .gpu/py && cp -r "$site" .gpu/py/
find .gpu/py -name __pycache__ -prune -exec rm -rf {} +
du -sh .gpu
