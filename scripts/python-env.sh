#!/usr/bin/env bash
# Creates or refreshes the recorder's virtualenv at .venv (gitignored) from the pinned
# recorder/requirements.txt. Idempotent and fast when present: a stamp holding the hash of the
# requirements and of the interpreter is checked first, and nothing runs when it matches.
# Prints the venv's python path on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
req=recorder/requirements.txt
py="${PYTHON:-python3}"
want="$( (sha256sum "$req" | cut -d' ' -f1; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$venv/.spin-stamp" && "$(cat "$venv/.spin-stamp")" == "$want" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  # Debian splits venv/ensurepip out of python3 (package python3-venv).
  echo "python-env: installing python3-venv" >&2
  if [[ "$(id -u)" == 0 ]]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >&2
fi
echo "python-env: creating $venv from $req" >&2
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
echo "$want" > "$venv/.spin-stamp"
echo "$venv/bin/python"
