#!/usr/bin/env bash
# Creates or refreshes build/quality-venv: the recorder's pinned requirements
# (recorder/requirements.txt) plus this tree's spin_dsa (`pip install --no-deps .`, incremental),
# for what runs the C++ predictors from the recorder (the distilled-indexer quality table, the
# recorder's binding tests). The recorder's own .venv builds no C++. Prints the venv's python on
# the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
qvenv=build/quality-venv
want="$( (sha256sum recorder/requirements.txt; "${PYTHON:-python3}" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$qvenv/bin/python" || "$(cat "$qvenv/.spin-stamp" 2>/dev/null)" != "$want" ]]; then
  ./scripts/python-env.sh >/dev/null  # installs python3-venv where Debian split it out
  rm -rf "$qvenv"
  "${PYTHON:-python3}" -m venv "$qvenv"
  "$qvenv/bin/python" -m pip install --quiet --disable-pip-version-check -r recorder/requirements.txt >&2
  echo "$want" > "$qvenv/.spin-stamp"
fi
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$qvenv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps . >&2
echo "$qvenv/bin/python"
