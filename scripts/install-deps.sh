#!/usr/bin/env bash
# Installs the Debian packages spin builds against, only when one is missing.
set -euo pipefail
pkgs=(g++ cmake ninja-build libgtest-dev libomp-dev libfmt-dev nlohmann-json3-dev libcli11-dev
      gnuplot-nox python3-numpy clang libclang-rt-14-dev
      python3-venv python3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "spin: installing missing packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
