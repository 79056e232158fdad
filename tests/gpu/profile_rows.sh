#!/usr/bin/env bash
# ncu over the kernels of a few bench rows, kiln's and Inductor's:
#   tests/gpu/profile_rows.sh OUT ROW:DTYPE:MODE...
set -uo pipefail
out=$1; shift
for spec in "$@"; do
  IFS=: read -r row dtype mode <<< "$spec"
  for which in kiln inductor; do
    echo "=== $row $dtype $mode $which"
    ncu --clock-control none -k 'regex:^(kernel_|triton_)' --launch-count 16 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      python3 tests/gpu/profile_rows.py "$row" "$dtype" "$mode" "$which" \
      > "$out/ncu_${row}_${dtype}_${mode}_${which}.txt" 2>&1
    grep -E '^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size|Warp Cycles Per Issued' \
      "$out/ncu_${row}_${dtype}_${mode}_${which}.txt" | head -120
  done
done
