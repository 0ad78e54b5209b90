"""vLLM serving a tiny randomly initialised DeepSeek-V4 (dummy weights) on a CPU, greedy, one
request; prints one JSON line: the output tokens and, with spin on, the plugin's counters.
Run by test_vllm_v4_serving.py in a subprocess (one engine per process):

    python serve_tiny_v4.py MODEL_DIR '{"spin": {...}}'|'{}'
"""
import json
import os
import sys

CONFIG = dict(
    architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", vocab_size=512,
    hidden_size=256, moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
    num_key_value_heads=1, head_dim=128, q_lora_rank=64, qk_rope_head_dim=64,
    num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1, scoring_func="sqrtsoftplus",
    norm_topk_prob=True, routed_scaling_factor=1.5, max_position_embeddings=8192,
    rope_theta=10000.0, compress_rope_theta=160000.0, compress_ratios=[4, 4], num_hash_layers=0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, sliding_window=128,
    o_groups=2, o_lora_rank=64, index_n_heads=64, index_head_dim=128, index_topk=512,
    num_nextn_predict_layers=0, rms_norm_eps=1e-6, hidden_act="silu", torch_dtype="bfloat16",
    bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)


def main():
    model_dir, additional = sys.argv[1], json.loads(sys.argv[2])
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model_dir, skip_tokenizer_init=True, load_format="dummy", enforce_eager=True,
              max_model_len=8192, max_num_seqs=2, max_num_batched_tokens=8192, dtype="bfloat16",
              additional_config=additional, seed=0)
    prompt = TokensPrompt(prompt_token_ids=[(7 * i) % 500 + 2 for i in range(6000)])
    out = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, detokenize=False,
                                                ignore_eos=True))
    from spin_dsa.vllm import state
    rt = state.runtime_or_none()
    print(json.dumps({"tokens": list(out[0].outputs[0].token_ids),
                      "spin": rt.stats() if rt is not None else None}))


if __name__ == "__main__":
    main()
