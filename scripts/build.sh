#!/usr/bin/env bash
# Configures and builds graph-autofusion into build/ (Release, Ninja).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j"$(nproc)"
