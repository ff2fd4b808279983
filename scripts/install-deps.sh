#!/usr/bin/env bash
# Installs graph-autofusion's build and test dependencies from Debian 12's packages.
# Idempotent: does nothing (and needs no network) when everything is already installed.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler     # ONNX protobuf classes, checker, shape inference
  libdnnl-dev                                       # oneDNN: matrix products, convolutions
  ocl-icd-opencl-dev                                # oneDNN's CMake config requires OpenCL (only Recommended by libdnnl-dev)
  libopenblas-dev libopenblas0-pthread
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libonnx-testdata                                  # ONNX backend conformance tests
  python3 python3-onnx python3-numpy                # fixture generation scripts, the Python package
  python3-dev pybind11-dev python3-pybind11 python3-pytest   # the Python package (python/) and its tests
  python3-torch                                     # PyTorch models in (torch.onnx.export), examples, tests
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
