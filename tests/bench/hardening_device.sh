#!/usr/bin/env bash
# On a many-core machine (the GPU machine's 16 cores): the cost of TLS and
# tokens with kilnd on cores of its own, then the libFuzzer targets in
# parallel on the rest. Prepare here with
#   deploy/bundle.sh .hardening kilnd kiln_bench build-fuzz/bin/kiln_{request,guard,tokens,config}_fuzzer
#   tar czf .hardening.tgz .hardening
# and run there, from the repository root with .hardening.tgz carried:
#   tests/bench/hardening_device.sh OUT [FUZZ_SECONDS]
# OUT gets bench.txt and one log per fuzzer (with its final statistics).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: hardening_device.sh OUT [FUZZ_SECONDS]}"
fuzz_seconds="${2:-300}"
[ -d .hardening ] || tar xzf .hardening.tgz
b="$PWD/.hardening"
export LD_LIBRARY_PATH="$b/lib"
cores=$(nproc)
echo "cores: $cores" | tee "$out/bench.txt"

# kilnd on cores 0-3, the bench's clients on 4-11.
printf '#!/bin/sh\nexec taskset -c 0-3 %s/bin/kilnd "$@"\n' "$b" > "$b/pinned-kilnd"
chmod +x "$b/pinned-kilnd"
for run in 1 2 3; do
  KILND="$b/pinned-kilnd" taskset -c 4-11 "$b/bin/kiln_bench" --security --compiles=1 \
    --seconds=5 --clients=32 2>&1 | grep -E "lookup hit|openssl|rror" | tee -a "$out/bench.txt" || true
done

# Fuzzers: every core but two, shared among the four targets.
per=$(( (cores - 2) / 4 ))
[ "$per" -ge 1 ] || per=1
pids=()
for name in request guard tokens config; do
  mkdir -p "/tmp/fuzz_$name"
  ASAN_OPTIONS=detect_leaks=1 "$b/bin/kiln_${name}_fuzzer" -fork="$per" \
    -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/crash_${name}_" "/tmp/fuzz_$name" "tests/fuzz/corpus/$name" \
    > "$out/fuzz_$name.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for name in request guard tokens config; do
  echo "== $name: $per processes for $fuzz_seconds s" >> "$out/bench.txt"
  grep -E "^#[0-9]+: cov|DONE|ERROR|SUMMARY|crash|Test unit" "$out/fuzz_$name.log" | tail -n 3 \
    >> "$out/bench.txt" || true
done
cat "$out/bench.txt"
exit $status
