"""One tensor-parallel rank of test_device_path.py's verify_ranks test, in its own process: the
plugin over vLLM's CUDA indexer on CPU tensors (the shared World harness), verify_ranks on, its
check over a gloo process group of two. `diverge`: this rank's predictor state is perturbed after
the second step (what a rank whose top-k broke a tie differently would carry). Prints "ok" or the
error the plugin raised."""
import sys

import torch
import torch.distributed as dist


def main(rank, init_file, model_dir, diverge):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    import vllm.model_executor.layers.sparse_attn_indexer as sai

    import spin_dsa.vllm
    import test_device_path as harness
    harness.state.DEVICE_PATH_ON = "cpu"
    world = harness.World(model_dir, 3, spin=dict(harness.SPIN, verify_ranks=True))
    rt = world.build()
    rt._rank_group = dist.group.WORLD
    sai.fp8_fp4_paged_mqa_logits = world.logits_stand_in
    fn = spin_dsa.vllm.wrap_indexer_function(sai.sparse_attn_indexer)
    try:
        for s in range(harness.STEPS):
            if diverge and rank == 1 and s == 2:
                # The EMA perturbed, the last top-k forgotten (its blocks otherwise rank first and
                # fill this small budget), the exploration draw keyed differently.
                st = rt.serving.state
                st.slot_ema.add_(torch.rand(st.slot_ema.shape, generator=torch.Generator().manual_seed(5)))
                st.prev_hits.zero_()
                st.req_key.add_(1)
            order = (0, 1) if s % 3 else (1, 0)
            rt.begin_step([("a", "b")[i] for i in order], [3, 3], [])
            for l in range(harness.LAYERS):
                world.call(fn, order, s, l)
        print("ok")
    except RuntimeError as e:
        print(f"raised: {e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "diverge")
