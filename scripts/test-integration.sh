#!/usr/bin/env bash
# The slower suites that run after ./scripts/test.sh (kept out of it to keep it fast):
#   the Python package — a fresh virtualenv, one `pip install ".[test]"` from the repository,
#   pytest over python/tests (scripts/test-python.sh). Cold: ~3–3.5 min on a busy 2-core machine
#   (~85 s of CPU, most of it compiling the library once more as position-independent code);
#   a rerun reuses build/python/ and takes under a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
echo "=== spin tests: python ==="
./scripts/test-python.sh
