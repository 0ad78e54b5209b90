"""The Triton block-sparse paged fp8 logits kernel (spin_dsa.device._logits) against its torch
reference and against the C++ indexer, on hostile shapes: page sizes 16/64, heads 1/4/64, next_n
1–3, ragged batches with empty rows, one page, tiles that cross pages, widths past the table,
scattered pages, signed weights, both the fp8-dot and the fp16-decode paths, several programs per
request. Without a GPU it runs under TRITON_INTERPRET=1 (tests/device/conftest.py): small shapes.

Tolerance: the reference computes in float64, where each 128-term e4m3 dot is exact; the kernel
sums in fp32. Its error is at most the fp32 summation bound (γ_128 + γ_64 ≈ 1.2e-5) times
B = k_scale · Σ_h |w_h| · Σ_d |q_d k_d|, so the tests require |kernel - reference| ≤ 2e-5 · B,
and -inf exactly where a row's length (or the table) ends."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the Triton kernel tests need triton")
spin_dsa = pytest.importorskip("spin_dsa", reason="spin_dsa (its compiled _core) is not importable")
_logits = pytest.importorskip("spin_dsa.device._logits")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from paged_cases import abs_bound_inputs, queries, scatter_cache  # noqa: E402
from spin_dsa.device._logits_kernel import _e4m3_to_f32  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def check_close(out, ref, bound, rel=2e-5):
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf), "the -inf pattern differs"
    assert torch.equal(out[inf], ref[inf])
    err = (out[~inf] - ref[~inf]).abs()
    lim = rel * bound[~inf] + 1e-30
    assert bool((err <= lim).all()), f"max error {float((err / lim).max()):.3g}× the bound"


def run_case(rng, page_size, heads, next_n, pages_per_req, lengths, fp8_dot=None, width=None,
             signed=True, tiles=None, cols_per_table=None):
    """Random cache and a random (compacted-like) table per request; kernel vs reference."""
    batch = len(pages_per_req)
    cache, _, _ = scatter_cache([page_size * 4] * 3, page_size, rng, spare=2)
    cols = cols_per_table or max(pages_per_req)
    table = torch.zeros((batch, cols), dtype=torch.int32)
    for b, n in enumerate(pages_per_req):
        table[b, :n] = torch.from_numpy(rng.integers(0, cache.shape[0], n).astype(np.int32))
    q, w = queries(batch * next_n, heads, rng, signed=signed)
    lengths = torch.tensor(lengths, dtype=torch.int32)
    args = [t.to(DEV) for t in (q, w, cache, table, lengths)]
    kw = dict(next_n=next_n, page_size=page_size, width=width)
    config = None
    if tiles is not None:
        c = _logits.launch_config(batch, next_n, heads, width or cols * page_size, torch.device(DEV), fp8_dot)
        config = _logits.LaunchConfig(c.nn, c.hp, c.block_n, tiles, c.num_warps, c.num_stages, c.fp8_dot)
    out = _logits.paged_logits(*args, fp8_dot=fp8_dot, config=config, **kw).cpu()
    ref = _logits.paged_logits_reference(q, w, cache, table, lengths, **kw)
    bound = _logits.paged_logits_reference(*abs_bound_inputs(q, w, cache, page_size), table, lengths, **kw)
    check_close(out, ref, bound)
    return out, ref


CASES = [
    # page, heads, next_n, pages per request, per-row lengths, fp8_dot
    pytest.param(16, 1, 1, [3, 1, 2], [40, 0, 17], True, id="p16-h1-ragged-empty-row"),
    pytest.param(16, 4, 2, [5, 2], [70, 71, 3, 20], True, id="p16-h4-mtp2"),
    pytest.param(64, 4, 1, [1], [64], True, id="p64-one-full-page"),
    pytest.param(64, 4, 3, [2, 1], [100, 101, 102, 0, 1, 2], True, id="p64-h4-mtp3-short"),
    pytest.param(16, 64, 3, [2, 3], [30, 31, 32, 45, 46, 47], True, id="p16-h64-mtp3"),
    pytest.param(64, 64, 1, [2, 1, 2], [128, 5, 65], True, id="p64-h64-ragged"),
    pytest.param(16, 4, 1, [4, 2], [63, 20], False, id="p16-h4-fp16-decode"),
    pytest.param(64, 64, 2, [2], [99, 100], False, id="p64-h64-mtp2-fp16-decode"),
    pytest.param(16, 1, 3, [1, 2], [0, 0, 0, 9, 10, 11], False, id="p16-h1-mtp3-empty-request"),
    pytest.param(16, 3, 2, [3, 1], [40, 41, 16, 16], True, id="p16-h3-padded-heads"),
]


def test_kernel_entry_is_the_library_entry():
    """The kernel's page layout restates spin_dsa.INDEXER_ENTRY_BYTES (it loads without spin_dsa)."""
    from spin_dsa.device import _logits_kernel
    assert _logits_kernel.ENTRY_BYTES.value == spin_dsa.INDEXER_ENTRY_BYTES


@pytest.mark.parametrize("page_size,heads,next_n,pages,lengths,fp8", CASES)
def test_kernel_matches_reference(page_size, heads, next_n, pages, lengths, fp8):
    rng = np.random.default_rng(hash((page_size, heads, next_n, fp8)) % 2**32)
    run_case(rng, page_size, heads, next_n, pages, lengths, fp8_dot=fp8)


def test_several_programs_per_request_and_width_past_the_table():
    """tiles=1: one program per 128 columns (the CUDA grid shape), some wholly past a row's length
    (they only write -inf); width past the table's columns is -inf too."""
    rng = np.random.default_rng(5)
    out, _ = run_case(rng, 16, 4, 2, [20, 3], [300, 301, 0, 33], tiles=1, width=20 * 16 + 50)
    assert bool(torch.isinf(out[:, 320:]).all())


def test_input_forms_and_narrow_width():
    """q as float8_e4m3fn, the cache in DeepGEMM's 4-D shape [pages, page_size, 1, 132], and a
    width below the table's columns (the output is cut there)."""
    rng = np.random.default_rng(13)
    page = 16
    cache, table, _ = scatter_cache([64, 40], page, rng)
    q, w = queries(2, 4, rng)
    lengths = torch.tensor([64, 40], dtype=torch.int32)
    want = _logits.paged_logits_reference(q, w, cache, table, lengths, page_size=page)[:, :50]
    got = _logits.paged_logits(q.view(torch.float8_e4m3fn).to(DEV), w.to(DEV),
                               cache.view(-1, page, 1, 132).to(DEV), table.to(DEV), lengths.to(DEV),
                               page_size=page, width=50).cpu()
    bound = _logits.paged_logits_reference(*abs_bound_inputs(q, w, cache, page), table, lengths,
                                           page_size=page)[:, :50]
    assert tuple(got.shape) == (2, 50)
    check_close(got, want, bound)


def test_unsigned_weights_and_out_buffer():
    """Positive weights (many exact-zero ties from the ReLU with one head), written into a wider
    caller buffer: the columns past width are left alone."""
    rng = np.random.default_rng(6)
    cache, _, _ = scatter_cache([128], 64, rng)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    q, w = queries(1, 1, rng, signed=False)
    lengths = torch.tensor([100], dtype=torch.int32)
    out = torch.full((1, 200), 7.0)
    res = _logits.paged_logits(*(t.to(DEV) for t in (q, w, cache, table, lengths)), page_size=64,
                               out=out.to(DEV)).cpu()
    ref = _logits.paged_logits_reference(q, w, cache, table, lengths, page_size=64)
    bound = _logits.paged_logits_reference(*abs_bound_inputs(q, w, cache, 64), table, lengths, page_size=64)
    check_close(res[:, :128], ref, bound)
    assert bool((res[:, 128:] == 7.0).all())
    assert int((ref[0, :100] == 0).sum()) > 10  # the ties are really there


def test_dense_equals_the_cpp_indexer():
    """Dense = every block listed: the engine's own block table and each row's visible entries.
    Against spin_dsa.indexer_scores (the C++ kernel, double-accumulating reference path)."""
    rng = np.random.default_rng(7)
    page, next_n, heads = 16, 2, 4
    seq_lens = [50, 17, 2]
    cache, table, _ = scatter_cache(seq_lens, page, rng)
    q, w = queries(len(seq_lens) * next_n, heads, rng)
    vis = [max(0, s - next_n + j + 1) for s in seq_lens for j in range(next_n)]
    lengths = torch.tensor(vis, dtype=torch.int32)
    out = _logits.paged_logits(*(t.to(DEV) for t in (q, w, cache, table, lengths)), next_n=next_n,
                               page_size=page).cpu()
    cpp = spin_dsa.indexer_scores(cache.numpy(), table.numpy(), np.array(seq_lens, np.int64),
                                  q.numpy().reshape(len(seq_lens), next_n, heads, 128),
                                  w.numpy().reshape(len(seq_lens), next_n, heads), page_size=page,
                                  logits_cols=out.shape[1], impl="reference")
    bound = _logits.paged_logits_reference(*abs_bound_inputs(q, w, cache, page), table, lengths,
                                           next_n=next_n, page_size=page)
    check_close(out, torch.from_numpy(cpp), bound)


@triton.jit
def _decode_all(X, O):
    i = tl.arange(0, 256)
    tl.store(O + i, _e4m3_to_f32(tl.load(X + i)))


def test_e4m3_bit_decode_is_exact():
    """The fp16-decode path's bit arithmetic gives torch's e4m3fn values for all 256 bytes (NaN
    for 0x7F/0xFF)."""
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    o = torch.empty(256)
    xd, od = x.to(DEV), o.to(DEV)
    _decode_all[(1,)](xd, od)
    o = od.cpu()
    ref = x.view(torch.float8_e4m3fn).float()
    assert torch.equal(o.isnan(), ref.isnan())
    assert torch.equal(o[~ref.isnan()], ref[~ref.isnan()])


def test_launch_config_is_static():
    """Shapes alone decide the launch: tl.dot needs ≥ 16 rows, MTP rows pad to a power of two."""
    cpu = torch.device("cpu")
    c = _logits.launch_config(4, 1, 1, 1000, cpu)
    assert c.nn * c.hp >= 16 and c.hp >= 1
    c = _logits.launch_config(4, 3, 64, 1000, cpu)
    assert (c.nn, c.hp, c.block_n) == (4, 64, 64)
    assert _logits.launch_config(4, 3, 64, 1000, cpu) == c


@pytest.mark.parametrize("mutate,err,match", [
    (lambda a: a.update(q=a["q"].float()), TypeError, "q:"),
    (lambda a: a.update(q=a["q"][:, :, :64]), ValueError, "q:"),
    (lambda a: a.update(weights=a["weights"].double()), ValueError, "weights:"),
    (lambda a: a.update(table=a["table"].long()), TypeError, "table:"),
    (lambda a: a.update(lengths=a["lengths"][:1]), ValueError, "lengths"),
    (lambda a: a.update(kv_cache=a["kv_cache"][:, :100]), ValueError, "kv_cache:"),
])
def test_bad_arguments_name_the_argument(mutate, err, match):
    rng = np.random.default_rng(8)
    cache, table, _ = scatter_cache([40, 20], 16, rng)
    q, w = queries(2, 4, rng)
    a = dict(q=q, weights=w, kv_cache=cache, table=table, lengths=torch.tensor([40, 20], dtype=torch.int32))
    mutate(a)
    with pytest.raises(err, match=match):
        _logits.paged_logits_reference(a["q"], a["weights"], a["kv_cache"], a["table"], a["lengths"], page_size=16)


_AOT = r'''
import importlib, json, re, subprocess, sys, types, pathlib
root, cfgs = sys.argv[1], json.loads(sys.argv[2])
pkg = types.ModuleType("spin_aot"); pkg.__path__ = [root]; sys.modules["spin_aot"] = pkg
L = importlib.import_module("spin_aot._logits")
K = importlib.import_module("spin_aot._logits_kernel")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
sig = {"Q": "*u8", "W": "*fp32", "CACHE": "*u8", "CACHE_F32": "*fp32", "TABLE": "*i32", "stride_tb": "i32",
       "table_cols": "i32", "LENGTHS": "*i32", "OUT": "*fp32", "stride_o": "i32", "width": "i32",
       "next_n": "i32", "heads": "i32", "tiles": "i32", "PAGE_SIZE": "constexpr", "NN": "constexpr",
       "HP": "constexpr", "BLOCK_N": "constexpr", "FP8_DOT": "constexpr"}
out = []
for next_n, fp8 in cfgs:
    nn, hp, block_n, warps, stages = L.tile_shape(next_n, 64)
    const = {"PAGE_SIZE": 64, "NN": nn, "HP": hp, "BLOCK_N": block_n, "FP8_DOT": fp8}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 7, 8)}
    k = triton.compile(ASTSource(fn=K._paged_logits_kernel, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    ptx = pathlib.Path(sys.argv[3]) / f"k{next_n}{int(fp8)}.ptx"
    ptx.write_text(k.asm["ptx"])
    r = subprocess.run([str(ptxas), "--gpu-name", "sm_90a", "-v", str(ptx), "-o", str(ptx) + ".cubin"],
                       capture_output=True, text=True).stderr
    out.append({"next_n": next_n, "fp8": fp8, "wgmma": k.asm["ptx"].count("wgmma.mma_async"),
                "e4m3": "e4m3" in k.asm["ptx"], "cp_async": "cp.async" in k.asm["ptx"],
                "spill": int(re.search(r"(\d+) bytes spill stores", r).group(1)),
                "regs": int(re.search(r"Used (\d+) registers", r).group(1)),
                "smem": k.metadata.shared})
E = importlib.import_module("spin_aot._topk_emit")
esig = {"X": "*fp32", "stride_x": "i32", "width": "i32", "T": "*fp32"}
for fn, more, const in ((E._count_kernel, {"COUNTS": "*i32", "n_seg": "i32"}, {}),
                        (E._emit_kernel, {"NEED": "*i32", "COUNTS": "*i32", "n_seg": "i32", "OUT": "*i32",
                                          "stride_o": "i32", "k": "i32"}, {"S_PAD": 16})):
    sig2 = dict(esig, **more, SEG="constexpr", BLOCK="constexpr", **{c: "constexpr" for c in const})
    kk = triton.compile(ASTSource(fn=fn, signature=sig2, constexprs=dict(SEG=E.SEGMENT, BLOCK=E.BLOCK, **const)),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    out.append({"kernel": fn.__name__, "ptx": len(kk.asm["ptx"])})
print(json.dumps(out))
'''


def test_compiles_for_hopper_with_fp8_mma_and_no_spills(tmp_path):
    """Without a GPU, Triton still compiles for sm_90 (its bundled ptxas): the kernel the GPU
    will run uses Hopper's async MMA on e4m3 operands, asynchronous copies, and no spills, for
    every launch shape (plain decode and MTP, fp8 and fp16-decode paths); top-k's emit kernels
    compile too."""
    import json
    import os
    import pathlib
    import subprocess
    import sys
    ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("triton's bundled ptxas is missing")
    root = pathlib.Path(_logits.__file__).parent
    cfgs = [[1, True], [2, True], [3, True], [1, False]]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _AOT, str(root), json.dumps(cfgs), str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    kernels = json.loads(r.stdout.strip().splitlines()[-1])
    assert [k["kernel"] for k in kernels[-2:]] == ["_count_kernel", "_emit_kernel"]  # top-k's emit compiles
    for k in kernels[:-2]:
        assert k["wgmma"] > 0 and k["cp_async"] and k["spill"] == 0, k
        assert k["e4m3"] == k["fp8"] and k["smem"] <= 227 * 1024, k
