"""Compacted paging (spin_dsa.device._paging): compact, topk over the compact width, remap.

- compact / remap / topk against plain Python loops and a sort-based reference, on hostile
  inputs: page sizes 16/64, block_pages 1/2 (the newest block half past the context), next_n 1–3,
  compress_ratio 4, empty requests, garbage past `counts`, ties everywhere, NaN/±inf/-0.0, k past
  the width;
- the end-to-end check: compact + the torch reference logits (and the Triton kernel)
  + topk + remap give the same top-k SET (and order) as spin_dsa.indexer_scores +
  spin_dsa.topk with the same blocks, on a random paged cache (pages scattered by a random
  permutation), plain and MTP;
- compact / remap / topk never touch the host: every sync entry point raises while they run.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
spin_dsa = pytest.importorskip("spin_dsa", reason="spin_dsa (its compiled _core) is not importable")
P = pytest.importorskip("spin_dsa.device._paging")

from host_sync import no_host_sync  # noqa: E402
from paged_cases import choose_blocks, queries, scatter_cache, visible  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _triton():
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


HAVE_TRITON = _triton()


# --------------------------------------------------------------------------------------------
# visible_entries: the device's tensor form of the library's rule
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_visible_entries_is_the_library_rule(dtype):
    """Every device-path visibility goes through P.visible_entries (tensor ops, no host sync);
    it must give what the library's spin_dsa.visible_entries gives, row for row."""
    ctx = np.array(list(range(0, 260)) + [4095, 4096, 4097, 2 ** 31 - 1], np.int64)
    if dtype == torch.int64:
        ctx = np.concatenate([ctx, [2 ** 31 + 3, 2 ** 40]])
    for next_n in range(1, 5):
        for cr in (1, 2, 3, 4, 7, 64):
            want = spin_dsa.visible_entries(ctx, next_n, cr)
            got = P.visible_entries(torch.from_numpy(ctx).to(dtype).to(DEV), next_n, cr)
            assert got.dtype == torch.int64
            np.testing.assert_array_equal(got.cpu().numpy(), want, err_msg=f"next_n={next_n} cr={cr}")


# --------------------------------------------------------------------------------------------
# compact
# --------------------------------------------------------------------------------------------

def compact_loops(blocks, counts, block_table, seq_lens, next_n, bp, ps, cr):
    """The definition, request by request."""
    batch = len(seq_lens)
    E = ps * bp
    width = blocks.shape[1]
    table = np.zeros((batch, width * bp), np.int32)
    lengths = np.zeros(batch * next_n, np.int32)
    for b in range(batch):
        ids = [int(x) for x in blocks[b * next_n, :int(counts[b * next_n])]]
        newest = visible(int(seq_lens[b]), next_n, next_n - 1, cr)
        for c, blk in enumerate(ids):
            for p in range(bp):
                lp = blk * bp + p
                if lp * ps < newest:
                    table[b, c * bp + p] = block_table[b, lp]
        for j in range(next_n):
            v = visible(int(seq_lens[b]), next_n, j, cr)
            lengths[b * next_n + j] = sum(min(E, max(0, v - blk * E)) for blk in ids)
    return table, lengths


@pytest.mark.parametrize("ps,bp,next_n,cr", [(16, 1, 1, 1), (16, 2, 2, 1), (64, 1, 3, 1), (16, 2, 3, 4),
                                             (64, 2, 1, 1)])
@pytest.mark.parametrize("garbage", [False, True])
@pytest.mark.parametrize("use_triton", [False, True] if HAVE_TRITON else [False])
def test_compact_matches_loops(ps, bp, next_n, cr, garbage, use_triton):
    rng = np.random.default_rng(ps * 7 + bp * 3 + next_n + cr + garbage)
    seq_lens = [1, 700, ps * bp * 3, ps * bp * 3 + 1, 0 + next_n, 257]
    entries = [visible(s, next_n, next_n - 1, cr) for s in seq_lens]
    _, table, _ = scatter_cache([max(e, 1) for e in entries], ps, rng, extra_cols=0)
    # The block table covers the context only: a half-visible block's second page has no column.
    width = 1 + max(-(-e // (ps * bp)) for e in entries)  # room for padding after the longest set
    blocks, counts, _ = choose_blocks(seq_lens, next_n, ps * bp, rng, keep=0.4, compress_ratio=cr,
                                      width=width, garbage_padding=garbage)
    sl = torch.tensor(seq_lens, dtype=torch.int64)
    t, lengths = P.compact(blocks.to(DEV), counts.to(DEV), table.to(DEV), sl.to(DEV), next_n,
                           block_pages=bp, page_size=ps, compress_ratio=cr, use_triton=use_triton)
    assert t.dtype == torch.int32 and lengths.dtype == torch.int32
    assert tuple(t.shape) == (len(seq_lens), blocks.shape[1] * bp)
    rt, rl = compact_loops(blocks.numpy(), counts.numpy(), table.numpy(), seq_lens, next_n, bp, ps, cr)
    np.testing.assert_array_equal(t.cpu().numpy(), rt)
    np.testing.assert_array_equal(lengths.cpu().numpy(), rl)


@pytest.mark.skipif(not HAVE_TRITON, reason="the Triton compact kernel needs triton")
@pytest.mark.parametrize("next_n,bp,cr,width,dtype", [(1, 1, 1, 1300, torch.int32), (4, 2, 1, 700, torch.int64),
                                                      (3, 1, 4, 517, torch.int32), (2, 2, 1, 1, torch.int64)])
def test_compact_kernel_equals_the_torch_reference(next_n, bp, cr, width, dtype):
    """The one-launch kernel against the torch ops bit for bit: widths across several tiles of the
    kernel (TILE = 512 blocks) and a single block, garbage after counts and -1 inside them, empty
    requests, rows past the table, int32 and int64 inputs."""
    rng = np.random.default_rng(width + next_n)
    ps, batch = 16, 5
    E = ps * bp
    max_pages = width * bp + 3
    seq_lens = torch.tensor([0, 1, width * E * cr // 2, width * E * cr, 37], dtype=dtype)
    blocks = torch.from_numpy(np.sort(rng.integers(-1, width + 5, (batch * next_n, width)), axis=1)).to(dtype)
    counts = torch.from_numpy(rng.integers(0, width + 1, batch * next_n)).to(dtype)
    table = torch.from_numpy(rng.permutation(batch * max_pages).reshape(batch, max_pages)).to(dtype)
    args = [t.to(DEV) for t in (blocks, counts, table, seq_lens)]
    kw = dict(block_pages=bp, page_size=ps, compress_ratio=cr)
    counted = [torch.tensor([5, 6, 7], dtype=torch.int64, device=DEV) for _ in range(2)]
    want = P.compact(*args, next_n, use_triton=False, counters=counted[0], **kw)
    got = P.compact(*args, next_n, use_triton=True, counters=counted[1], **kw)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu())
    E = ps * bp
    newest = [max(int(x), 0) // cr for x in seq_lens]
    assert counted[0].tolist() == [5 + batch * next_n, 6 + int(counts[::next_n].sum()),
                                   7 + sum(-(-v // E) for v in newest)]
    assert torch.equal(counted[0], counted[1])  # the kernel's atomics add the same


def test_compact_of_an_empty_batch_still_counts():
    """No rows (or no width) take the torch path whatever use_triton says; the counters stay right."""
    counters = torch.zeros(3, dtype=torch.int64, device=DEV)
    empty = torch.zeros((0, 4), dtype=torch.int32, device=DEV)
    t, n = P.compact(empty, torch.zeros(0, dtype=torch.int32, device=DEV),
                     torch.zeros((0, 8), dtype=torch.int32, device=DEV),
                     torch.zeros(0, dtype=torch.int64, device=DEV), 1, page_size=16,
                     use_triton=HAVE_TRITON, counters=counters)
    assert t.shape == (0, 4) and n.shape == (0,) and counters.tolist() == [0, 0, 0]


def test_compact_lengths_are_a_prefix_of_the_compact_columns():
    """What row j sees is exactly the first lengths[j] compact columns (blocks ascend)."""
    rng = np.random.default_rng(3)
    ps, bp, next_n = 16, 2, 3
    seq_lens = [300, 95, 33]
    _, table, _ = scatter_cache(seq_lens, ps, rng)
    blocks, counts, sets = choose_blocks(seq_lens, next_n, ps * bp, rng, keep=0.5)
    _, lengths = P.compact(blocks, counts, table, torch.tensor(seq_lens), next_n, block_pages=bp, page_size=ps)
    E = ps * bp
    for b, chosen in enumerate(sets):
        pos = [blk * E + o for blk in chosen for o in range(E)]
        for j in range(next_n):
            v = visible(seq_lens[b], next_n, j)
            seen = [c for c, p in enumerate(pos) if p < v]
            assert seen == list(range(int(lengths[b * next_n + j])))


def test_deepgemm_context_lens():
    lengths = torch.tensor([5, 6, 7, 0, 1, 2], dtype=torch.int32)
    two = P.deepgemm_context_lens(lengths, 3)
    assert two.tolist() == [[5, 6, 7], [0, 1, 2]] and two.dtype == torch.int32
    assert P.deepgemm_context_lens(lengths, 3, two_d=False).tolist() == [7, 2]
    with pytest.raises(ValueError, match="next_n"):
        P.deepgemm_context_lens(lengths, 4)


@pytest.mark.parametrize("next_n,bp", [(2, 1), (3, 2), (4, 1)])
def test_deepgemm_1d_form_holds_when_the_newest_blocks_are_chosen(next_n, bp):
    """DeepGEMM's 1-D context_lens (it applies row j's causal offset itself) describes the same
    rows as the per-row compacted lengths whenever every row's newest block is chosen (what
    local_blocks >= 1 guarantees) and a request has >= next_n entries — including rows whose
    newest entries straddle a block boundary."""
    rng = np.random.default_rng(next_n * 10 + bp)
    ps = 16
    E = ps * bp
    seq_lens = [next_n, E, E + 1, E + next_n - 1, 5 * E + 2, 333]
    _, table, _ = scatter_cache(seq_lens, ps, rng)
    blocks, counts, _ = choose_blocks(seq_lens, next_n, E, rng, keep=0.3, local=1)
    _, lengths = P.compact(blocks, counts, table, torch.tensor(seq_lens), next_n, block_pages=bp, page_size=ps)
    one = P.deepgemm_context_lens(lengths, next_n, two_d=False)
    j = torch.arange(next_n)
    implied = one[:, None] - next_n + 1 + j[None, :]
    assert torch.equal(implied.to(torch.int32), P.deepgemm_context_lens(lengths, next_n))


# --------------------------------------------------------------------------------------------
# remap
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_triton", [False, True] if HAVE_TRITON else [False])
def test_remap_matches_loops(use_triton):
    rng = np.random.default_rng(4)
    E = 32
    blocks = torch.tensor([[0, 3, 9, -1], [2, 5, -1, -1]], dtype=torch.int32)
    cols = torch.from_numpy(rng.integers(-1, 3 * E, (2, 20)).astype(np.int32))
    cols[1, 5] = 2 * E + 1  # a column in a padding slot: -1
    got = P.remap(cols.to(DEV), blocks.to(DEV), E, use_triton=use_triton).cpu()
    for r in range(2):
        for i, c in enumerate(cols[r].tolist()):
            blk = int(blocks[r, c // E]) if c >= 0 else -1
            want = -1 if c < 0 or blk < 0 else blk * E + c % E
            assert int(got[r, i]) == want
    assert got.dtype == torch.int32


@pytest.mark.skipif(not HAVE_TRITON, reason="the Triton remap kernel needs triton")
@pytest.mark.parametrize("rows,k,width,dtype", [(3, 2500, 40, torch.int64), (2, 1, 1, torch.int32), (4, 7, 9, torch.int32)])
def test_remap_kernel_equals_the_torch_reference_and_writes_out(rows, k, width, dtype):
    """Across several remap tiles (1024 columns), -1 slots inside the blocks, columns past the
    width, int32 and int64; `out` is the buffer written (an engine's top-k buffer, strided)."""
    rng = np.random.default_rng(rows * k)
    E = 64
    blocks = torch.from_numpy(np.sort(rng.integers(-1, 5000, (rows, width)), axis=1)).to(dtype)
    cols = torch.from_numpy(rng.integers(-1, (width + 2) * E, (rows, k))).to(dtype)
    want = P.remap(cols.to(DEV), blocks.to(DEV), E, use_triton=False)
    buf = torch.full((rows, k + 5), 77, dtype=torch.int32, device=DEV)
    got = P.remap(cols.to(DEV), blocks.to(DEV), E, use_triton=True, out=buf[:, :k])
    assert torch.equal(got.cpu(), want.cpu()) and got.data_ptr() == buf.data_ptr()
    assert (buf[:, k:] == 77).all()
    with pytest.raises(ValueError, match="out: shape"):
        P.remap(cols.to(DEV), blocks.to(DEV), E, out=buf)


# --------------------------------------------------------------------------------------------
# topk over the compact width
# --------------------------------------------------------------------------------------------

def hostile_scores(rng, rows, width):
    """Integer scores (ties everywhere), NaN, ±inf, -0.0 next to +0.0."""
    x = torch.from_numpy(rng.integers(-3, 4, (rows, width)).astype(np.float32))
    x[0, ::7] = float("nan")
    x[min(1, rows - 1), ::5] = float("-inf")
    x[min(2, rows - 1), ::11] = float("inf")
    x[-1, 1::3] = -0.0
    return x


EMITS = [False] + ([True] if HAVE_TRITON else [])


@pytest.mark.parametrize("use_triton", EMITS)
@pytest.mark.parametrize("rows,width,k", [(4, 300, 17), (3, 50, 64), (5, 1500, 100), (2, 1, 3),
                                          (3, 20000, 300)])  # the last: 3 segments of the Triton emit
def test_topk_matches_the_sort_reference_and_the_cpp_topk(use_triton, rows, width, k):
    rng = np.random.default_rng(rows * 1000 + width + k)
    x = hostile_scores(rng, rows, width)
    lengths = torch.from_numpy(rng.integers(0, width + 1, rows).astype(np.int32))
    lengths[0] = width
    got = P.topk(x.to(DEV), lengths.to(DEV), k, use_triton=use_triton).cpu()
    ref = P.topk_reference(x, lengths, k)
    assert got.dtype == torch.int32 and tuple(got.shape) == (rows, k)
    assert torch.equal(got, ref)
    # spin_dsa.topk reads the first visible_entries columns: the same definition, in C++.
    cpp = spin_dsa.topk(x.numpy(), k, visible_entries=lengths.numpy().astype(np.int64))
    np.testing.assert_array_equal(got.numpy(), cpp)


@pytest.mark.parametrize("use_triton", EMITS)
def test_topk_clean_skips_the_mask_and_agrees(use_triton):
    """clean=True (the logits kernel's own output: -inf past each length, no NaN/+inf) gives the
    same ids as the masking default, ties included."""
    rng = np.random.default_rng(12)
    rows, width, k = 4, 9000, 200
    x = torch.from_numpy(rng.integers(-2, 3, (rows, width)).astype(np.float32))
    lengths = torch.tensor([9000, 0, 4000, 123], dtype=torch.int32)
    col = torch.arange(width)
    x = torch.where(col[None, :] < lengths[:, None].long(), x, float("-inf"))
    x[0, 5::9] = -0.0
    got = P.topk(x.to(DEV), lengths.to(DEV), k, use_triton=use_triton, clean=True).cpu()
    assert torch.equal(got, P.topk_reference(x, lengths, k))


def test_topk_errors():
    x = torch.zeros(2, 8)
    with pytest.raises(TypeError, match="logits"):
        P.topk(x.double(), torch.zeros(2, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="lengths"):
        P.topk(x, torch.zeros(3, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="k"):
        P.topk(x, torch.zeros(2, dtype=torch.int32), 0)
    with pytest.raises(TypeError, match="blocks"):
        P.compact(torch.zeros(2, 2), torch.zeros(2, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32),
                  torch.zeros(1, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="rows"):
        P.compact(torch.zeros(3, 2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
                  torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), 2)


# --------------------------------------------------------------------------------------------
# End to end: compact + logits + topk + remap == spin_dsa.indexer_scores + spin_dsa.topk
# --------------------------------------------------------------------------------------------

def cpp_topk(cache, table, seq_lens, q, w, next_n, ps, bp, sets, k, cr=1):
    batch = len(seq_lens)
    heads = q.shape[1]
    ids = np.array([b for s in sets for b in s], np.int32)
    offs = np.cumsum([0] + [len(s) for s in sets]).astype(np.int32)
    scores = spin_dsa.indexer_scores(cache.numpy(), table.numpy(), np.array(seq_lens, np.int64),
                                     q.numpy().reshape(batch, next_n, heads, 128),
                                     w.numpy().reshape(batch, next_n, heads), page_size=ps,
                                     compress_ratio=cr, block_ids=ids, block_offsets=offs,
                                     block_pages=bp, impl="reference")
    return spin_dsa.topk(scores, k)


def device_topk(cache, table, seq_lens, q, w, next_n, ps, bp, blocks, counts, k, kernel, cr=1):
    """compact → logits → topk → remap: all torch (the reference logits, the torch emit, masked
    top-k), or all Triton (the kernel, the Triton emit, top-k trusting the kernel's clean output).
    Also returns the compact logits and columns (what Serving.observe_scored takes)."""
    from spin_dsa.device import _logits
    t, lengths = P.compact(blocks, counts, table, torch.as_tensor(seq_lens), next_n, block_pages=bp,
                           page_size=ps, compress_ratio=cr)
    if kernel == "triton":
        logits = _logits.paged_logits(*(x.to(DEV) for x in (q, w, cache, t, lengths)), next_n=next_n,
                                      page_size=ps).cpu()
    else:
        logits = _logits.paged_logits_reference(q, w, cache, t, lengths, next_n=next_n, page_size=ps)
    cols = P.topk(logits, lengths, k, use_triton=kernel == "triton", clean=kernel == "triton")
    return P.remap(cols, blocks, ps * bp), logits, cols


def assert_same_topk(got, want):
    for r in range(got.shape[0]):  # sets equal, row by row (the order is the same: ascending)
        assert set(got[r].tolist()) == set(want[r].tolist()), f"row {r}"
    np.testing.assert_array_equal(got.numpy(), want)


E2E = [
    # page, block_pages, next_n, heads, k, seq_lens, compress_ratio
    pytest.param(16, 1, 1, 4, 40, [400, 37, 1, 160], 1, id="p16-plain"),
    pytest.param(16, 2, 2, 4, 50, [333, 64, 2, 97], 1, id="p16-bp2-mtp2"),
    pytest.param(64, 1, 3, 4, 100, [900, 130, 3], 1, id="p64-mtp3"),
    pytest.param(64, 2, 1, 1, 64, [700, 129], 1, id="p64-bp2-h1-ties"),
    pytest.param(16, 1, 2, 4, 30, [1203, 300, 9, 66], 4, id="p16-v4-compress4-mtp2"),
]


@pytest.mark.parametrize("kernel", ["reference"] + (["triton"] if HAVE_TRITON else []))
@pytest.mark.parametrize("ps,bp,next_n,heads,k,seq_lens,cr", E2E)
def test_end_to_end_equals_the_cpp_indexer_and_topk(kernel, ps, bp, next_n, heads, k, seq_lens, cr):
    rng = np.random.default_rng(ps + bp * 10 + next_n * 100 + heads + cr)
    entries = [max(1, visible(s, next_n, next_n - 1, cr)) for s in seq_lens]
    cache, table, _ = scatter_cache(entries, ps, rng, spare=4)
    q, w = queries(len(seq_lens) * next_n, heads, rng, signed=heads > 1)
    blocks, counts, sets = choose_blocks(seq_lens, next_n, ps * bp, rng, keep=0.45, compress_ratio=cr)
    want = cpp_topk(cache, table, seq_lens, q, w, next_n, ps, bp, sets, k, cr)
    got, _, _ = device_topk(cache, table, seq_lens, q, w, next_n, ps, bp, blocks, counts, k, kernel, cr)
    assert_same_topk(got, want)


@pytest.mark.parametrize("next_n,bp", [(1, 1), (2, 2)])
def test_end_to_end_with_the_device_serving(next_n, bp):
    """The whole device step as an engine runs it: spin_dsa.device.Serving selects, compact +
    logits + topk + remap score the selection, observe_scored takes the compact logits and
    columns, commit closes the step — over several steps, so later selections come from history.
    Each step's top-k equals the C++ indexer + top-k over the blocks Serving chose."""
    device = pytest.importorskip("spin_dsa.device")
    rng = np.random.default_rng(11 + next_n)
    ps, heads, k = 16, 4, 24
    start = [500, 230, 90]
    steps = 4
    cache, table, _ = scatter_cache([s + steps * next_n for s in start], ps, rng, spare=4)
    cfg = {"page_size": ps, "block_pages": bp, "topk": k, "target_sparsity": 0.5}
    serving = device.Serving(len(start), 1, 1024, predictor="spin", config=cfg, max_next_n=next_n, device=DEV)
    slots = torch.arange(len(start), device=DEV)
    for i in range(len(start)):
        serving.add(i, 100 + i)
    for step in range(steps):
        seq_lens = [s + (step + 1) * next_n for s in start]
        q, w = queries(len(start) * next_n, heads, rng)
        blocks, counts = serving.select(slots, 0, torch.tensor(seq_lens, device=DEV), next_n)
        blocks, counts = blocks.cpu(), counts.cpu()
        sets = [blocks[b * next_n, :int(counts[b * next_n])].tolist() for b in range(len(start))]
        assert all(s == sorted(s) for s in sets)
        n_vis = sum(-(-visible(s, next_n, next_n - 1) // (ps * bp)) for s in seq_lens)
        assert sum(len(s) for s in sets) < n_vis  # really sparse
        want = cpp_topk(cache, table, seq_lens, q, w, next_n, ps, bp, sets, k)
        got, logits, cols = device_topk(cache, table, seq_lens, q, w, next_n, ps, bp, blocks, counts, k,
                                        "reference")
        assert_same_topk(got, want)
        serving.observe_scored(slots, 0, logits.to(DEV), cols.to(DEV), blocks=blocks.to(DEV))
        serving.commit(slots, torch.zeros(len(start), dtype=torch.int64, device=DEV))


# --------------------------------------------------------------------------------------------
# No host synchronisation
# --------------------------------------------------------------------------------------------

def test_no_host_synchronisation():
    """compact, topk (torch emit) and remap run with every sync entry point refusing. The Triton
    emit is left out: the interpreter itself copies tensors to the host (on a GPU a Triton launch
    never does); the GPU bench captures the whole pipeline in a CUDA graph, which fails on a sync."""
    rng = np.random.default_rng(9)
    seq_lens = [300, 40, 2]
    next_n, ps, bp, k = 2, 16, 2, 30
    _, table, _ = scatter_cache(seq_lens, ps, rng)
    blocks, counts, _ = choose_blocks(seq_lens, next_n, ps * bp, rng)
    args = [t.to(DEV) for t in (blocks, counts, table, torch.tensor(seq_lens))]
    logits = torch.randn(len(seq_lens) * next_n, blocks.shape[1] * ps * bp, device=DEV)
    with no_host_sync():
        t, lengths = P.compact(*args, next_n, block_pages=bp, page_size=ps)
        P.deepgemm_context_lens(lengths, next_n)
        cols = P.topk(logits, lengths, k, use_triton=False)
        pos = P.remap(cols, args[0], ps * bp)
    assert tuple(pos.shape) == (len(seq_lens) * next_n, k)
    with pytest.raises(AssertionError, match="host synchronisation"):
        with no_host_sync():
            torch.ones(1).item()
