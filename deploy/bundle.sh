#!/usr/bin/env bash
# Makes a relocatable bundle of kiln binaries: OUT/bin/<binaries> and OUT/lib/
# with the shared libraries they need, except those every Linux host brings
# (libc, libm, libstdc++, ...; the host's own are used). Run the binaries with
# LD_LIBRARY_PATH=OUT/lib.
#
#   deploy/bundle.sh OUT [binary ...]     (default: kilnd kilnctl kiln_nvrtc)
#
# A binary named by a path (with a '/') is taken from there, any other from
# build/bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: deploy/bundle.sh OUT [binary ...]}"
shift
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(kilnd kilnctl kiln_nvrtc)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libstdc\+\+|libgcc_s)'
for b in "${bins[@]}"; do
  [[ "$b" == */* ]] || b="build/bin/$b"
  cp "$b" "$out/bin/"
  ldd "$b" | awk '/=>/ {print $1, $3}' | while read -r name path; do
    if [[ ! "$name" =~ $skip ]] && [ -f "$path" ]; then cp -n "$path" "$out/lib/"; fi
  done
done
# Debug info is for the build tree; the bundle travels.
strip --strip-debug "$out"/bin/* "$out"/lib/* 2>/dev/null || true
du -sh "$out"
