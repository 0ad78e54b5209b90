#!/usr/bin/env bash
# Prepares what the GPU run (bench/gpu/device-run.sh) carries to a GPU machine that cannot reach a
# registry, into the ignored folder .whl/ (carried with the working tree, 64 MiB at most):
#   - spin_dsa built here as a CPython 3.12 wheel (the GPU image's interpreter), with its compiled
#     _core; the shared library it needs beyond glibc, libstdc++ and libgomp (libfmt.so.9, from
#     Debian's libfmt9) is copied to .whl/lib for LD_LIBRARY_PATH;
#   - DeepGEMM as the sgl-deep-gemm wheel from PyPI (pure Python + one torch extension; its
#     kernels JIT-compile through nvcc on the GPU machine).
# Why a wheel and not a build there: the GPU image has cmake, nanobind and scikit-build-core but
# not Debian's fmt and nlohmann-json that the library's CMake finds. Needs a CPython 3.12
# (${PYTHON312:-python3.12}; pyenv provides one on the dev machines) and the build dependencies
# of scripts/install-deps.sh. Prints the folder's contents and size.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON312:-python3.12}"
deepgemm="${SPIN_DEEPGEMM:-sgl-deep-gemm==0.2.5}"
if ! "$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  echo "gpu-wheels: needs CPython 3.12 as \$PYTHON312 or python3.12 (the GPU image runs 3.12)" >&2
  exit 2
fi
./scripts/install-deps.sh >&2
out=.whl
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$tmp/spin" . >&2
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$tmp/dg" "$deepgemm" >&2
mkdir -p "$tmp/lib"
cp -L "$(/sbin/ldconfig -p | awk '/libfmt\.so\.9 .*x86-64/ {print $NF; exit}')" "$tmp/lib/libfmt.so.9"
# Replace the folder whole (a half-written .whl/ never travels): build beside it, then swap.
rm -rf "$out.new"
mkdir -p "$out.new"
cp "$tmp"/spin/*.whl "$tmp"/dg/*.whl "$out.new/"
cp -r "$tmp/lib" "$out.new/lib"
rm -rf "$out"
mv "$out.new" "$out"
ls -la "$out" "$out/lib" >&2
du -sh "$out"
