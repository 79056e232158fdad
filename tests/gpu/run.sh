#!/usr/bin/env bash
# Runs the GPU suite on a machine with a CUDA GPU, in one go (what
# tests/gpu/prepare.sh made must be here):
#   - kilnd from .gpu/bundle on loopback, with a fresh RocksDB;
#   - tests/gpu/test_cuda.py: every lowered op family, the models, inference
#     and training, against eager CUDA;
#   - with --bench, tests/bench/cuda_bench.py against Inductor (--bench="ARGS"
#     passes ARGS to it, e.g. --bench="--dtypes float32");
#   - the float32 op-family tests under compute-sanitizer's memcheck;
#   - with --run="COMMAND", COMMAND (e.g. python3 tests/gpu/dynamic_rows.py)
#     against the same kilnd, its output in OUT/run.log.
# Logs and results go to OUT (default /tmp/kiln-gpu). --kilnd="FLAGS" passes
# FLAGS to kilnd (e.g. --kilnd=--autotune=off).
#
#   tests/gpu/run.sh [--bench[=ARGS]] [--run=COMMAND] [--kilnd=FLAGS] [--no-tests]
#                    [--no-sanitizer] [OUT] [-- PYTEST ARGS]
set -uo pipefail
cd "$(dirname "$0")/../.."
bench=0 sanitizer=1 out=/tmp/kiln-gpu bench_args="" tests=1 run="" kilnd_flags=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1 ;;
    --bench=*) bench=1; bench_args="${1#--bench=}" ;;
    --no-tests) tests=0 ;;
    --run=*) run="${1#--run=}" ;;
    --kilnd=*) kilnd_flags="${1#--kilnd=}" ;;
    --no-sanitizer) sanitizer=0 ;;
    --) shift; break ;;
    *) out="$1" ;;
  esac
  shift
done
mkdir -p "$out"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kiln-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/kiln-site
fi
export PYTHONPATH="$PWD/.gpu/py:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$PWD/.gpu/bundle/lib"
nvidia-smi -L
data=$(mktemp -d)
port=50151
# shellcheck disable=SC2086 # the flags are words
.gpu/bundle/bin/kilnd --listen=127.0.0.1:$port --data_dir="$data/db" $kilnd_flags \
  > "$out/kilnd.log" 2>&1 &
kilnd=$!
trap 'kill $kilnd 2>/dev/null' EXIT
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.1
done
export KILN_SERVER=127.0.0.1:$port
# torch's own CUDA libraries for the tests; Protocol Buffers and Abseil for
# the runtime library (tests/gpu/prepare.sh).
export LD_LIBRARY_PATH="$PWD/.gpu/extlib"
status=0
if [ $tests -eq 1 ]; then
  # The CUDA backend's C++ tests, the tuner's on this GPU among them.
  LD_LIBRARY_PATH="$PWD/.gpu/bundle/lib" .gpu/bundle/bin/kiln_cuda_codegen_test 2>&1 |
    tail -25 | tee "$out/cuda_codegen_test.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  python3 -m pytest tests/gpu/test_cuda.py -q -p no:cacheprovider -rf "$@" 2>&1 | tee "$out/pytest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ $bench -eq 1 ]; then
  python3 tests/bench/cuda_bench.py $bench_args --out "$out/bench.md" 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ -n "$run" ]; then
  bash -c "$run" 2>&1 | tee "$out/run.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ $sanitizer -eq 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    python3 -m pytest tests/gpu/test_cuda.py -q -p no:cacheprovider -x \
    -k "reduction_row_lengths or (test_views) or (float32 and (test_unary or test_binary or test_reduction or test_split_reduction or test_ordered_pointwise))" \
    > "$out/memcheck.log" 2>&1
  rc=$?
  tail -5 "$out/memcheck.log"
  echo "memcheck exit status $rc"
  [ $rc -eq 0 ] || status=1
fi
exit $status
