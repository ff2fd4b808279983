#!/usr/bin/env bash
# Configures and builds graph-autofusion into build/ (Release, Ninja), then makes the Python
# package importable by Debian's /usr/bin/python3: a graph_autofusion.pth file in its site folder
# pointing at build/python (like an editable install; the last build made wins). GAF_INSTALL_PYTHON=0
# skips that step (CI's throwaway clones); without write access it says how to use PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j"$(nproc)"
if [ "${GAF_INSTALL_PYTHON:-1}" != 0 ] && compgen -G "build/python/graph_autofusion/_core*.so" >/dev/null; then
  pkg="$(pwd)/build/python"
  site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
  if mkdir -p "$site" 2>/dev/null && echo "$pkg" >"$site/graph_autofusion.pth.tmp" 2>/dev/null; then
    mv "$site/graph_autofusion.pth.tmp" "$site/graph_autofusion.pth"
  else
    echo "note: $site is not writable; use the Python package with PYTHONPATH=$pkg /usr/bin/python3"
  fi
fi
