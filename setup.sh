#!/usr/bin/env bash
# Set-up for a fresh Debian 12 machine: installs the Debian packages that are
# missing, builds everything into build/, then
#   ./setup.sh serve [kilnd flags]   starts kilnd (default 127.0.0.1:50051,
#                                    data in ~/.local/share/kiln)
#   ./setup.sh test                  runs every C++ and Python test
#   ./setup.sh build                 only builds
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-}"
case "$mode" in
  serve|test|build) shift ;;
  *) echo "usage: $0 serve [kilnd flags] | test | build" >&2; exit 2 ;;
esac

packages=(
  cmake ninja-build g++ ccache mold pkg-config
  libssl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libtorch-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch python3-grpcio python3-protobuf python3-numpy
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs="${KILN_BUILD_JOBS:-2}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"

case "$mode" in
  serve) exec build/bin/kilnd "$@" ;;
  test) cd build && exec ctest --output-on-failure -j "$jobs" ;;
  build) ;;
esac
