"""spin's decode layers under a CUDA graph's rules, on CPU tensors (graph_capture.py): a 2-layer
step through vLLM's sparse_attn_indexer with spin on, kernels on their GPU paths (Triton under
the interpreter), captured once and replayed for the later steps with the new step's values
written into the captured inputs — as vLLM's FULL graphs replay a decode batch. The replayed
top-k must equal an eager run of the same steps, bit for bit. Run by test_device_path.py in a
child interpreter (Triton must be its interpreter before anything imports it); prints one JSON
object per next_n.

A negative control shows the comparison can fail: the same replay with one input left as the
capture's copy (a query tensor made per step, which a graph never sees) must differ.
"""
import contextlib
import json
import os
import pathlib
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "1"
HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402

import launch_count  # noqa: E402
import test_device_path as harness  # noqa: E402
from cases import write_tiny_v32_config  # noqa: E402
from graph_capture import Graph  # noqa: E402

LAYERS, REQUESTS = 2, ("a", "b")


class _Kernel:
    """vLLM's top-k dispatcher as one graph node (a CUDA kernel on a GPU); its other attributes
    (vLLM 0.34's takes_bf16_logits) are the dispatcher's."""

    def __init__(self, inner, graph):
        self.inner, self._call = inner, graph.kernel(inner.__call__)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def _copy_metadata(held, new):
    """The new step's decode metadata into the captured step's tensors (vLLM's persistent
    metadata buffers); its host fields are the same for every step of a captured batch size."""
    for name in ("seq_lens", "slot_mapping"):
        getattr(held, name).copy_(getattr(new, name))
    for name in ("seq_lens", "block_table", "decode_lens"):
        getattr(held.decode, name).copy_(getattr(new.decode, name))


def run(model_dir, next_n, graph=None, stale_query=False):
    """Every (step, layer)'s decode top-k. With a graph: step 0 eager (vLLM warms up before it
    captures), step 1 captured, every later step replayed."""
    import spin_dsa.vllm
    import vllm.model_executor.layers.sparse_attn_indexer as sai

    harness.state.DEVICE_PATH_ON = "cpu"
    world = harness.World(model_dir, next_n)
    rt = world.build(layers=LAYERS)
    stand_in = world.logits_stand_in if graph is None else graph.kernel(world.logits_stand_in)
    sai.fp8_fp4_paged_mqa_logits = stand_in
    fn = spin_dsa.vllm.wrap_indexer_function(sai.sparse_attn_indexer)
    bufs = [torch.full((16, harness.TOPK), -1, dtype=torch.int32) for _ in range(LAYERS)]
    rows = len(REQUESTS) * next_n
    held, out = None, []
    for s in range(harness.STEPS):
        order = (0, 1) if s % 2 == 0 else (1, 0)
        rt.begin_step([REQUESTS[i] for i in order], [next_n] * len(order), [])  # the runner hook
        fresh = [(world.metadata(order, s, l), *world.inputs(order, s, l)) for l in range(LAYERS)]
        if graph is not None and s >= 2:
            for (md, q, w), (md_new, q_new, w_new) in zip(held, fresh):
                _copy_metadata(md, md_new)
                w.copy_(w_new)
                if not stale_query:
                    q.copy_(q_new)
            graph.replay()
        else:
            if s == 1:
                held = fresh
            capture = graph.capture() if graph is not None and s == 1 else contextlib.nullcontext()
            with capture:
                for l, (md, q, w) in enumerate(fresh):
                    prefix = harness._prefix(l)
                    with set_current_vllm_config(world.vc), \
                            set_forward_context({prefix: md}, world.vc):
                        fn(torch.zeros(rows, 8), prefix, world.paged[l][0], q, None, None, w,
                           128, "ue8m0", harness.TOPK, 128, harness.MAX_LEN, harness.MAX_LEN,
                           bufs[l], True, False, False, "", topk_backend="torch")
        out.append(torch.stack([b[:rows] for b in bufs]).clone())
    harness.state.reset()
    return torch.stack(out)


def measure(model_dir, next_n):
    import spin_dsa.vllm.device_path as device_path
    eager = run(model_dir, next_n)
    results = {}
    for stale in (False, True):
        graph = Graph()
        original_run, original_tap = interpreter.InterpretedFunction.run, device_path.TopkTap.__init__
        interpreter.InterpretedFunction.run = graph.kernel(original_run)
        device_path.TopkTap.__init__ = lambda tap, inner: original_tap(tap, _Kernel(inner, graph))
        capturing, device_path._capturing = device_path._capturing, lambda device: graph.capturing
        try:
            replayed = run(model_dir, next_n, graph, stale_query=stale)
        finally:
            interpreter.InterpretedFunction.run = original_run
            device_path.TopkTap.__init__ = original_tap
            device_path._capturing = capturing
        results[stale] = (replayed, len(graph.nodes))
    replayed, nodes = results[False]
    return {"next_n": next_n, "steps": harness.STEPS, "replayed_steps": harness.STEPS - 2,
            "graph_nodes": nodes, "replay_equals_eager": bool(torch.equal(replayed, eager)),
            "rows_differing": int((replayed != eager).any(-1).sum()),
            "stale_query_differs": not torch.equal(results[True][0], eager)}


def main():
    launch_count.gpu_paths()
    harness.LAYERS = LAYERS
    with tempfile.TemporaryDirectory() as d:
        model_dir = write_tiny_v32_config(pathlib.Path(d), layers=LAYERS, topk=harness.TOPK,
                                          max_len=harness.MAX_LEN, draft_layers=1)
        print(json.dumps([measure(model_dir, n) for n in (1, 3)]))


if __name__ == "__main__":
    main()
