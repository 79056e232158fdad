#!/usr/bin/env bash
# Set-up for a fresh Debian 12 machine: installs the Debian packages that are
# missing, builds everything into build/, then
#   ./setup.sh serve [kilnd flags]   starts kilnd (default 127.0.0.1:50051,
#                                    data in ~/.local/share/kiln)
#   ./setup.sh test                  runs every C++ and Python test
#   ./setup.sh build                 only builds
# serve builds kilnd, kilnctl and kiln_nvrtc only and installs no torch. build
# and test also make the Python environment .venv/ (requirements.txt: torch 2.11 from
# PyPI, grpcio, ...), build the runtime and its tests against its torch and
# install the client package (client/python) into it.
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-}"
case "$mode" in
  serve|test|build) shift ;;
  *) echo "usage: $0 serve [kilnd flags] | test | build" >&2; exit 2 ;;
esac

packages=(
  cmake ninja-build g++ ccache mold pkg-config clang-format clang libclang-rt-14-dev
  libssl-dev libgrpc++-dev libre2-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-dev
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
venv=.venv
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [ "$mode" != serve ]; then
  # The venv is kept between runs; pip runs again only when
  # requirements.txt changed since it last succeeded.
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  stamp="$venv/.requirements.sha256"
  if ! sha256sum --status -c "$stamp" 2>/dev/null; then
    echo "setup: installing requirements.txt into $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r requirements.txt
    sha256sum requirements.txt > "$stamp"
  fi
  torch_prefix="$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$torch_prefix" -DKILN_PYTHON="$PWD/$venv/bin/python")
fi
cmake -S . -B build -G Ninja "${cmake_args[@]}" >/dev/null
if [ "$mode" = serve ]; then
  cmake --build build -j "$jobs" --target kilnd kilnctl kiln_nvrtc
else
  cmake --build build -j "$jobs"
  KILN_REQUIRE_EXECUTOR=1 "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --force-reinstall ./client/python
fi

case "$mode" in
  serve) exec build/bin/kilnd "$@" ;;
  test) cd build && exec ctest --output-on-failure -j "$jobs" ;;
  build) ;;
esac
