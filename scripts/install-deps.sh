#!/usr/bin/env bash
# Installs the Debian packages a purpose needs, only those missing:
#   main   (default) the native build and the main job: compiler, cmake, the libraries spin links,
#          gnuplot (plots), the Python headers and venv (the recorder, the package)
#   test   + clang and libFuzzer (the fuzz test of ./scripts/test.sh)
#   cross  + the aarch64 cross build (scripts/test-integration.sh aarch64): Debian's cross
#          compiler, qemu-user to run its tests, the arm64 builds of the two compiled libraries
#          (multiarch; the header-only ones are shared with the native build)
#   qemu   + qemu-user alone (scripts/test-integration.sh x86_caps: an emulated Zen 3)
# e.g. `./scripts/install-deps.sh main test`. The first command installs `main` only.
set -euo pipefail
declare -A purpose=(
  [main]="g++ cmake ninja-build libgtest-dev libomp-dev libfmt-dev nlohmann-json3-dev
          libcli11-dev gnuplot-nox python3-numpy python3-venv python3-dev"
  [test]="clang libclang-rt-14-dev"
  [cross]="g++-aarch64-linux-gnu qemu-user-static libfmt-dev:arm64 libgtest-dev:arm64
           libgomp1:arm64"
  [qemu]="qemu-user-static"
)
pkgs=()
for p in "${@:-main}"; do
  [[ -n "${purpose[$p]:-}" ]] || { echo "install-deps: unknown purpose '$p' (main, test, cross, qemu)" >&2; exit 2; }
  read -r -a more <<< "$(echo ${purpose[$p]})"
  pkgs+=("${more[@]}")
done
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
if [[ " ${pkgs[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo_cmd dpkg --add-architecture arm64  # the :arm64 packages below; apt-get update follows
  need_update=1
fi
# Installed for this machine's architecture (or arch-independent); `pkg:arch` names another. Not
# `dpkg -s`: once a package is installed for two architectures (libgtest-dev and :arm64) its plain
# name is ambiguous there, and every run would reinstall.
installed() {
  local name="${1%%:*}" arch="${1#*:}"
  [[ "$1" == *:* ]] || arch="$(dpkg --print-architecture)"
  dpkg-query -W -f='${db:Status-Abbrev} ${Architecture}\n' "$name" 2>/dev/null | grep -Eq "^ii +(${arch}|all)$"
}
missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done
if ((${#missing[@]})) || [ -n "${need_update:-}" ]; then
  echo "spin: installing missing packages: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi
