#!/usr/bin/env bash
# The one command of a GPU window (bench/gpu/README.md): on a GPU machine with python3, torch,
# Triton and nvcc but no registry, installs what scripts/gpu-wheels.sh put in .whl/ (carried with
# the working tree) and runs bench/gpu/run.py; arguments go to run.py. The package's Python comes
# from this checkout (PYTHONPATH=python), only its compiled _core from the wheel, so the code
# measured is the code committed. Results: $OUT/NAME.json and $OUT/NAME.log (NAME: $SPIN_GPU_RUN,
# default gpu; $OUT defaults to build/gpu-out). Exit status: run.py's.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-build/gpu-out}"
name="${SPIN_GPU_RUN:-gpu}"
mkdir -p "$out"
site=/tmp/spin-gpu-site
if ls .whl/sgl_deep_gemm-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .whl/sgl_deep_gemm-*.whl || echo "device-run: DeepGEMM's wheel did not install (the run goes on without it)"
fi
python3 - <<'PY' || echo "device-run: no spin_dsa wheel in .whl/: Serving runs only with its _core (scripts/gpu-wheels.sh)"
import glob, zipfile
wheel = glob.glob(".whl/spin_dsa-*-cp312-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("spin_dsa/_core") and name.endswith(".so"):
            open("python/" + name, "wb").write(z.read(name))
            print("device-run: _core from", wheel)
PY
export LD_LIBRARY_PATH="$PWD/.whl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD/python:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 bench/gpu/run.py --out "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
exit "${PIPESTATUS[0]}"
