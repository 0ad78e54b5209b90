#!/usr/bin/env bash
# Creates or reuses the virtualenv in which the CUDA-path tests run against the real Python of
# each CUDA vLLM release spin supports (tests/integration/cuda_path.py; docs/vllm.md "Versions").
# The CUDA `vllm` wheel imports on a machine without a GPU (its compiled ops fail to load, vLLM
# logs that and goes on): its indexer, metadata builders and runner state are plain Python, which
# is what the harness runs, with the kernels stood in.
#
# One venv for all of them (${SPIN_CUDA_VENV:-$HOME/.cache/spin/venv-vllm-cuda}), because every
# release here pins the same torch (2.14.0): torch from PyPI (its CUDA build runs on a CPU), then
# the releases' own requirements minus torch* and the GPU-only kernel packages, then each release
# with --no-deps into its own folder, $venv/vllm-<version>, which a test run puts first on
# PYTHONPATH. A stamp of the pins marks a finished install, so one cut off half way is redone.
# Prints "<version> <folder>" per release, then the venv's python on the last line of stdout.
set -euo pipefail
venv="${SPIN_CUDA_VENV:-$HOME/.cache/spin/venv-vllm-cuda}"
py="${PYTHON:-python3}"
versions=(0.33.0 0.34.0)  # the CUDA releases spin serves (state.SUPPORTED_VLLM), newest last
torch_pin="torch==2.14.0"  # what both pin (their METADATA: Requires-Dist: torch==2.14.0)
# Kernel packages only a GPU uses (their imports in vLLM are lazy or guarded); left out to keep the
# install small and CPU-only.
gpu_only='^(torch|torchaudio|torchvision|torchcodec|flashinfer-python|nvidia-.*|quack-kernels|tokenspeed-mla|humming-kernels|pynvvideocodec|tilelang|apache-tvm-ffi|nvtx|fastsafetensors|instanttensor|numba)$'  # canonical names
pins="$torch_pin ${versions[*]} transformers==5.19.0 pytest"
# The stamp: the pins, this script and the interpreter (an edit here rebuilds the venv).
want="$( (echo "$pins"; cat "$0"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
report() {
  local v
  for v in "${versions[@]}"; do echo "$v $venv/vllm-$v"; done
  echo "$venv/bin/python"
}
if [[ -x "$venv/bin/python" && -f "$venv/.spin-stamp" && "$(cat "$venv/.spin-stamp")" == "$want" ]]; then
  report
  exit 0
fi
pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2; }
echo "vllm-cuda-env: creating $venv ($pins); a cold install downloads ~3 GB" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv"
pip_install --upgrade pip
pip_install "$torch_pin"
for v in "${versions[@]}"; do
  pip_install --no-deps --only-binary=:all: --target "$venv/vllm-$v" "vllm==$v"
done
# The releases' requirements (markers evaluated for this interpreter, no extras), less torch* and
# the GPU-only packages; where two releases differ the later one's line is kept.
req="$venv/vllm-requirements.txt"
"$venv/bin/python" - "$gpu_only" "$req" "${versions[@]/#/$venv/vllm-}" <<'PY'
import re, sys
from importlib.metadata import PathDistribution
from pathlib import Path
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
skip, out_path, roots = re.compile(sys.argv[1], re.I), sys.argv[2], sys.argv[3:]
lines = {}
for root in roots:
    dist = PathDistribution(next(Path(root).glob("vllm-*.dist-info")))
    for line in dist.requires or []:
        r = Requirement(line)
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(r.name)
        if skip.match(name):
            continue
        lines[name] = str(r).split(";")[0].strip()
lines.pop("transformers", None)  # pinned by the caller, within every release's range
Path(out_path).write_text("\n".join(lines.values()) + "\n")
PY
echo "$torch_pin" > "$venv/constraints.txt"  # no requirement may move torch
pip_install -r "$req" -c "$venv/constraints.txt" transformers==5.19.0 pytest
for v in "${versions[@]}"; do
  PYTHONPATH="$venv/vllm-$v" "$venv/bin/python" -c \
    "import vllm, torch, vllm.model_executor.layers.sparse_attn_indexer; assert vllm.__version__ == '$v', vllm.__version__" >&2
done
echo "$want" > "$venv/.spin-stamp"
report
