"""spin_dsa.device.Serving against the C++ library (spin_dsa.Serving): the same calls give the
same blocks, bit for bit, over generated traces — plain and MTP, requests added (with a prefill)
and dropped between steps, batches reordered — and no call touches the host."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
spin_dsa = pytest.importorskip("spin_dsa")
device = pytest.importorskip("spin_dsa.device")

from host_sync import no_host_sync  # noqa: E402
from spin_dsa.device._state import GAIN_WARMUP  # noqa: E402

E = 16  # small pages keep many blocks per request at test sizes


class Traffic:
    """A generated trace: requests with their own drifting block preferences per layer (so that
    history pays), recency, noise, and sudden shifts; MTP acceptance drawn per step."""

    def __init__(self, seed, layers, max_entries):
        self.rng = np.random.default_rng(seed)
        self.layers, self.max_entries = layers, max_entries
        self.pref = {}

    def start(self, rid, length):
        n = -(-self.max_entries // E)
        self.pref[rid] = self.rng.standard_normal((self.layers, n)).astype(np.float32) * 3

    def scores(self, rid, layer, visible):
        """float32 [visible] indexer logits of one row."""
        pref = self.pref[rid][layer]
        if self.rng.random() < 0.1:  # a shift: the focus jumps
            pref[:] = self.rng.standard_normal(pref.shape).astype(np.float32) * 3
        pref += self.rng.standard_normal(pref.shape).astype(np.float32) * 0.3
        pos = np.arange(visible)
        s = pref[pos // E] + self.rng.standard_normal(visible).astype(np.float32)
        s += 2.0 * np.exp(-(visible - 1 - pos) / 64.0)  # recency
        return s.astype(np.float32)


def topk_positions(row, k):
    """The top-k set of one row (score descending, position ascending), positions ascending, -1
    padded; -inf entries are not scored."""
    pos = np.flatnonzero(np.isfinite(row))
    order = np.lexsort((pos, -row[pos]))[:k]
    out = np.full(k, -1, dtype=np.int32)
    chosen = np.sort(pos[order])
    out[:chosen.size] = chosen
    return out


def run_both(predictor, config, *, seed, next_n, steps=14, layers=3, max_requests=6,
             max_entries=2048, compress_ratio=1, all_layers=False, impl="torch",
             kth_search="bitwise", on_step=None):
    """Drives the library and the device object with the same calls; asserts every select.
    on_step(dev): called after each step's commit."""
    config = dict(config, page_size=E)
    lib = spin_dsa.Serving(max_requests, layers, max_entries, predictor, config, next_n,
                           compress_ratio)
    dev = device.Serving(max_requests, layers, max_entries, predictor, config, next_n,
                         compress_ratio, device="cpu", impl=impl)
    assert dev.impl == impl
    dev.kth_search = kth_search
    dev.observe_chunk_blocks = 5  # several observe programs per row, at test sizes too
    k = int(dev.config["topk"])
    traffic = Traffic(seed, layers, max_entries)
    rng = np.random.default_rng(seed + 1000)
    live = {}  # slot -> [request id, seq_len]
    next_rid = 11
    selects = 0
    for step in range(steps):
        # Lifecycle between steps: drop a request now and then, fill free slots (with a prefill).
        if live and rng.random() < 0.3:
            slot = int(rng.choice(sorted(live)))
            lib.drop(slot)
            dev.drop(slot)
            del live[slot]
        free = [s for s in range(max_requests) if s not in live]
        new = []
        for slot in free[:int(rng.integers(0, len(free) + 1))]:
            length = int(rng.integers(next_n, max_entries * compress_ratio // 2))
            lib.add(slot, next_rid)
            dev.add(slot, next_rid)
            traffic.start(next_rid, length)
            live[slot] = [next_rid, length]
            new.append(slot)
            next_rid += 7
        if new:
            prefill(lib, dev, traffic, live, new, layers, compress_ratio)
        slots = np.array(sorted(live), dtype=np.int32)
        rng.shuffle(slots)  # a reordered batch every step
        if slots.size == 0:
            continue
        for i, s in enumerate(slots):  # the step's rows are appended to the cache
            live[s][1] += next_n
        seq = np.array([live[s][1] for s in slots], dtype=np.int64)
        assert (seq // compress_ratio <= max_entries).all()
        t_slots, t_seq = torch.from_numpy(slots), torch.from_numpy(seq)
        if all_layers:  # one batched select for the whole step
            every_blocks, every_counts = dev.select_layers(t_slots, t_seq, next_n)
        for layer in range(layers):
            want = lib.select(slots, layer, seq, next_n).copy()
            counts = lib.counts(len(slots) * next_n).copy()
            if all_layers:
                blocks, got_counts = every_blocks[layer], every_counts[layer]
            else:
                blocks, got_counts = dev.select(t_slots, layer, t_seq, next_n)
            assert (counts <= dev.width).all()
            assert (want[:, dev.width:] == -1).all()
            np.testing.assert_array_equal(blocks.numpy(), want[:, :dev.width],
                                          err_msg=f"step {step} layer {layer}")
            np.testing.assert_array_equal(got_counts.numpy(), counts)
            selects += 1
            observe(lib, dev, traffic, live, slots, seq, layer, want, counts, next_n, k,
                    compress_ratio)
        accepted = rng.integers(0, next_n, size=slots.size).astype(np.int32)
        lib.commit(slots, accepted)
        if step % 2:  # an engine's form: the next step's lengths say what was accepted
            query = rng.integers(1, 4, size=slots.size)
            cached = seq - next_n + 1 + accepted
            dev.commit(t_slots, seq_lens=torch.from_numpy(cached + query).to(torch.int32),
                       query_lens=torch.from_numpy(query))
        else:
            dev.commit(t_slots, torch.from_numpy(accepted))
        for s, a in zip(slots, accepted):  # rejected drafts leave the cache
            live[s][1] -= next_n - 1 - int(a)
        if on_step is not None:
            on_step(dev)
    assert selects >= steps  # the trace really ran
    return selects


def prefill(lib, dev, traffic, live, new, layers, compress_ratio):
    slots = np.array(new, dtype=np.int32)
    seq = np.array([live[s][1] for s in new], dtype=np.int64)
    width = int(seq.max()) // compress_ratio + 5
    for layer in range(layers):
        logits = np.full((len(new), width), -np.inf, dtype=np.float32)
        for i, s in enumerate(new):
            vis = int(seq[i]) // compress_ratio
            logits[i, :vis] = traffic.scores(live[s][0], layer, vis)
            logits[i, vis:] = 1e30  # past the row's view: must not be read
        lib.prefill(slots, layer, seq, logits)
        dev.prefill(torch.from_numpy(slots), layer, torch.from_numpy(seq),
                    torch.from_numpy(logits))
    lib.commit(slots)
    dev.commit(torch.from_numpy(slots))


def observe(lib, dev, traffic, live, slots, seq, layer, blocks, counts, next_n, k,
            compress_ratio):
    """Scores the selected blocks of every row, top-k over them; the library gets request
    positions, the device the compact columns of the same entries."""
    rows = len(slots) * next_n
    width, E = dev.width, dev.block_entries  # E: entries per block (block_pages pages)
    scored = np.full((rows, width * E), 7e29, dtype=np.float32)  # garbage where nothing is seen
    topk_pos = np.full((rows, k), -1, dtype=np.int32)
    topk_col = np.full((rows, k), -1, dtype=np.int32)
    for i, s in enumerate(slots):
        full = None
        for j in range(next_n):
            r = i * next_n + j
            vis = max(0, int(seq[i]) - next_n + j + 1) // compress_ratio
            if full is None or full.size < vis:
                full = traffic.scores(live[s][0], layer, vis)
            row = np.full(vis, -np.inf, dtype=np.float32)
            chosen = blocks[r, :counts[r]]
            for c, b in enumerate(chosen):
                lo, hi = b * E, min(b * E + E, vis)
                if hi > lo:
                    row[lo:hi] = full[lo:hi]
                    scored[r, c * E:c * E + hi - lo] = full[lo:hi]
            pos = topk_positions(row, k)
            topk_pos[r] = pos
            valid = pos >= 0
            col = np.searchsorted(chosen, pos[valid] // E) * E + pos[valid] % E
            topk_col[r, :valid.sum()] = col
    lib.observe_scored(slots, layer, scored, topk_pos)
    # The engine's top-k buffer filled by the same call (remap fused into observe).
    positions = torch.full((rows, k), 123, dtype=torch.int32)
    dev.observe_scored(torch.from_numpy(slots), layer, torch.from_numpy(scored),
                       torch.from_numpy(topk_col), positions=positions,
                       blocks=torch.from_numpy(np.ascontiguousarray(blocks[:, :dev.width])))
    np.testing.assert_array_equal(positions.numpy(), topk_pos)


# -- the same blocks as the library ---------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spin_plain_matches_the_library(seed):
    run_both("spin", {"target_sparsity": 0.5, "topk": 64}, seed=seed, next_n=1)


@pytest.mark.parametrize("predictor", ["spin", "step-reuse"])
def test_one_select_for_every_layer_matches_the_library(predictor):
    run_both(predictor, {"target_sparsity": 0.5, "topk": 48}, seed=9, next_n=2, layers=4,
             all_layers=True)


@pytest.mark.parametrize("next_n,seed", [(2, 4), (3, 5)])
def test_spin_mtp_matches_the_library(next_n, seed):
    run_both("spin", {"target_sparsity": 0.6, "topk": 48}, seed=seed, next_n=next_n)


@pytest.mark.parametrize("predictor", ["prev-iter", "ema-slot", "ema-offset", "step-reuse",
                                       "random", "all-keep"])
def test_every_device_predictor_matches_the_library(predictor):
    run_both(predictor, {"target_sparsity": 0.5, "topk": 64}, seed=6, next_n=2, steps=10)


@pytest.mark.parametrize("config", [
    {"explore_ratio": 0.0},  # spin without exploration
    {"explore_policy": "stalest", "explore_ratio": 0.3},
    {"combine": "max", "sink_blocks": 0, "local_blocks": 1},
    {"mtp_update": "row0"}, {"mtp_update": "all-rows"},
    {"pooling": "topk-hits", "alpha": 0.25, "beta": 0.5, "seed": 12345},
    {"explicit_budget_blocks": 9, "block_pages": 2},
    {"topk_first": 0, "explore_churn": 0.0, "recent_blocks": 0, "pool_depth": 0.0},  # the paper's
    {"preset": "paper"},  # the paper's, as the library's preset spells it (5 % exploration)
    {"recent_blocks": 40, "explore_churn": 0.5},
    {"pool_depth": 1.0},  # m up to E: every block observed by a deep entry
    {"adapt": 0},  # the fixed rule: explore_churn's share, the additions always
    {"adapt": 0, "explore_churn": 0.0},
    {"adapt": 1, "explore_policy": "stalest", "explore_ratio": 0.3},
    {"adapt": 1, "combine": "max", "topk_first": 0, "mtp_update": "all-rows"},
])
def test_spin_ablations_match_the_library(config):
    run_both("spin", dict({"target_sparsity": 0.7, "topk": 32}, **config), seed=7, next_n=3,
             steps=10)


def test_compressed_rows_match_the_library():
    """V4's CSA layers: compress_ratio 4, row j sees (t + 1) / 4 entries."""
    run_both("spin", {"target_sparsity": 0.5, "topk": 32}, seed=8, next_n=2, compress_ratio=4,
             max_entries=1024, steps=10)


# -- the fused Triton kernels, select and observe (under the interpreter on a CPU) ------------

@pytest.mark.parametrize("predictor,config,next_n", [
    ("spin", {}, 1),
    ("spin", {"explore_policy": "stalest", "explore_ratio": 0.3, "block_pages": 2}, 3),
    ("spin", {"combine": "max", "sink_blocks": 0, "local_blocks": 1}, 2),
    ("step-reuse", {}, 2), ("random", {}, 1), ("ema-offset", {}, 1), ("all-keep", {}, 2),
    ("spin", {"pooling": "topk-hits", "mtp_update": "all-rows"}, 2),
    ("spin", {"topk_first": 0, "explore_churn": 0.0, "recent_blocks": 0, "pool_depth": 0.0}, 1),
    ("spin", {"preset": "paper"}, 2),
    ("spin", {"pool_depth": 1.0}, 2),
    ("spin", {"adapt": 0}, 2),
    ("spin", {"adapt": 1, "explore_policy": "stalest", "explore_ratio": 0.3}, 3),
    ("spin", {"adapt": 1, "combine": "max", "topk_first": 0}, 2),
])
def test_the_triton_kernels_match_the_library(predictor, config, next_n):
    pytest.importorskip("triton")
    run_both(predictor, dict({"target_sparsity": 0.6, "topk": 32}, **config), seed=10,
             next_n=next_n, steps=4, layers=2, max_requests=3, max_entries=640,
             all_layers=True, impl="triton")


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_a_layer_drops_the_additions_when_the_library_does(impl):
    """adapt: past its warm-up a layer whose measured gain of spin's additions is negative ranks
    without them; the device switches where the library does (seed 28: two layers at step 7,
    selected without them at steps 8 and 9)."""
    if impl == "triton":
        pytest.importorskip("triton")
    switched = []

    def watch(dev):
        st = dev.state
        switched.append(int(((st.additions_gain < 0) & (st.gain_steps >= GAIN_WARMUP)).sum()))

    run_both("spin", {"target_sparsity": 0.6, "topk": 32}, seed=28, next_n=2, steps=10, layers=2,
             max_requests=3, max_entries=640, all_layers=True, impl=impl, on_step=watch)
    assert any(switched[:-1]), switched  # a later step selected with the switch


@pytest.mark.parametrize("predictor,config,next_n", [
    ("spin", {}, 1),
    ("spin", {"explore_policy": "stalest", "explore_ratio": 0.3}, 2),  # many equal ages: ties
    ("spin", {"adapt": 1, "topk_first": 0}, 2),
    ("step-reuse", {}, 1),
])
def test_the_radix_kth_search_selects_what_the_bitwise_one_does(predictor, config, next_n):
    """kth_search="radix" (four 8-bit histogram rounds) finds the same k-th value as the 32
    bitwise rounds: the library's blocks, ties included."""
    pytest.importorskip("triton")
    run_both(predictor, dict({"target_sparsity": 0.6, "topk": 32}, **config), seed=11,
             next_n=next_n, steps=4, layers=2, max_requests=3, max_entries=1280,
             all_layers=True, impl="triton", kth_search="radix")


@pytest.mark.parametrize("block_pages,topk,dtype", [(32, 300, torch.int16), (1, 16, torch.uint8)])
def test_hit_counts_in_a_wider_integer_match_the_library(block_pages, topk, dtype):
    """A block holding more than 255 of the top-k (512-entry blocks, top-k 300) keeps its hits
    in int16, two lanes to each 32-bit atomic word of the observe kernel; the default's uint8
    takes four."""
    pytest.importorskip("triton")
    entries = 24 * E * block_pages
    config = {"target_sparsity": 0.5, "topk": topk, "block_pages": block_pages}
    dev = device.Serving(2, 1, entries, "spin", dict(config, page_size=E), 2, impl="triton")
    assert dev.state.prev_hits.dtype == dev.state.pending_hits.dtype == dtype
    assert dev.state.pending_hits.shape[-1] % 4 == 0
    run_both("spin", config, seed=12, next_n=2, steps=4, layers=1, max_requests=2,
             max_entries=entries, all_layers=True, impl="triton")


# -- the host is never touched --------------------------------------------------------------

def test_a_decode_step_never_touches_the_host():
    dev = device.Serving(4, 2, 1024, "spin", {"page_size": E, "topk": 32,
                                              "target_sparsity": 0.5}, 3)
    for slot, rid in ((0, 5), (2, 9), (3, 1)):
        dev.add(slot, rid)
    slots = torch.tensor([3, 0, 2], dtype=torch.int32)
    seq = torch.tensor([700, 301, 999], dtype=torch.int64)
    logits = torch.randn(3, 1000)
    with no_host_sync():
        for layer in range(2):
            dev.prefill(slots, layer, seq, logits)
        dev.commit(slots)
        for step in range(3):
            for layer in range(2):
                blocks, counts = dev.select(slots, layer, seq + step, 3)
                scored = torch.randn(blocks.shape[0], dev.width * E)
                topk = torch.topk(scored, 32, dim=1).indices.to(torch.int32)
                # Layer 1 without a top-k: the k-th score is found on the device.
                dev.observe_scored(slots, layer, scored, topk if layer == 0 else None,
                                   blocks=blocks)
            dev.commit(slots, torch.tensor([2, 0, 1], dtype=torch.int32))
        every, _ = dev.select_layers(slots, seq + 3, 3)
        for layer in range(2):
            dev.observe_scored(slots, layer, torch.randn(9, dev.width * E), blocks=every[layer])
        dev.commit(slots, torch.tensor([0, 1, 2], dtype=torch.int32))
    assert blocks.shape == (9, dev.width) and counts.shape == (9,)
    assert every.shape == (2, 9, dev.width)


def test_padded_rows_use_the_pad_slot_and_leave_every_request_alone():
    """An engine pads a batch to a captured graph's size: the padding rows (pad_slot, repeated)
    must not change what the real requests select."""
    cfg = {"page_size": E, "topk": 32, "target_sparsity": 0.5}
    plain = device.Serving(3, 1, 1024, "spin", cfg)
    padded = device.Serving(3, 1, 1024, "spin", cfg)
    assert padded.pad_slot == 3
    for s in (plain, padded):
        s.add(0, 7)
        s.add(2, 8)
    real, seq = torch.tensor([2, 0]), torch.tensor([600, 900])
    pad = torch.tensor([2, 0, padded.pad_slot, padded.pad_slot])
    pad_seq = torch.tensor([600, 900, 1024, 5])
    gen = torch.Generator().manual_seed(3)
    for step in range(4):
        want, _ = plain.select(real, 0, seq + step)
        got, _ = padded.select(pad, 0, pad_seq + step)
        assert torch.equal(got[:2], want)
        scored = torch.randn(4, padded.width * E, generator=gen)
        plain.observe_scored(real, 0, scored[:2].contiguous(), blocks=want)
        padded.observe_scored(pad, 0, scored, blocks=got)
        plain.commit(real)
        padded.commit(pad)
    with pytest.raises(spin_dsa.OutOfRange):
        padded.add(padded.pad_slot, 1)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_commit_leaves_a_slot_without_an_open_step_alone(impl):
    """An engine commits its whole batch at the start of a step (the vLLM plugin: accepted drafts
    from the seq_len delta) without knowing which rows opened a step: a slot that did not — a
    request added this step, or one routed through vLLM's prefill branch — must keep its state
    and its step number, where the library refuses."""
    cfg = {"page_size": E, "topk": 32, "target_sparsity": 0.5}
    dev = device.Serving(3, 2, 1024, "spin", cfg, impl=impl)
    dev.add(0, 7)
    dev.add(1, 8)
    S, seq = torch.tensor([0]), torch.tensor([700])
    for layer in range(2):
        blocks, _ = dev.select(S, layer, seq)
        dev.observe_scored(S, layer, torch.randn(1, dev.width * E,
                                                 generator=torch.Generator().manual_seed(layer)),
                           blocks=blocks)
    dev.commit(S)
    before = {n: getattr(dev.state, n).clone() for n in ("slot_ema", "last_seen", "offset_ema",
                                                         "offset_count", "step", "prev_hits",
                                                         "churn_ema", "explore_share")}
    dev.commit(torch.tensor([0, 1]), torch.tensor([0, 0]))  # neither has an open step
    for name, t in before.items():  # (the slot EMA is NaN where never observed)
        torch.testing.assert_close(getattr(dev.state, name), t, rtol=0, atol=0, equal_nan=True,
                                   msg=name)
    assert dev.state.step.tolist()[:2] == [1, 0]


@pytest.mark.parametrize("config", [
    {"topk": 32},
    {"topk": 300, "block_pages": 32},  # 512-entry blocks: hits in int16, two to an atomic word
    {"topk": 32, "adapt": 0},
    {"topk": 32, "adapt": 1, "topk_first": 0, "explore_policy": "stalest"},
])
def test_the_kernels_keep_the_state_the_torch_path_keeps(config):
    """select_layers', observe's and commit's launches do the step's bookkeeping inside the
    kernels (the pending rows emptied, flags, each slot's rows and visibility, the hits counted
    in lanes of 32-bit atomic words, row 0 applied at observe with its offset sums kept for
    commit, acceptance read off the lengths): every state tensor equals the torch path's after
    each call, pad rows included."""
    pytest.importorskip("triton")
    cfg = dict({"page_size": E, "target_sparsity": 0.5}, **config)
    entries = 64 * E * cfg.get("block_pages", 1)
    pair = [device.Serving(3, 3, entries, "spin", cfg, 2, impl=impl) for impl in ("torch", "triton")]
    k, width, bE = int(pair[0].config["topk"]), pair[0].width, pair[0].block_entries
    gen = torch.Generator().manual_seed(5)
    for dev in pair:
        dev.add(0, 7)
        dev.add(2, 8)
    slots = torch.tensor([2, 0, pair[0].pad_slot, pair[0].pad_slot])
    seq = torch.tensor([entries * 5 // 8, entries * 7 // 8, entries, 5], dtype=torch.int32)

    def same_state(when):
        a, b = pair
        for name in vars(a.state):  # every tensor of the state
            if name in ("visible", "pending_newest", "req_key"):
                continue  # (visible: below; the others are written and read per open row)
            x, y = getattr(a.state, name)[:3], getattr(b.state, name)[:3]  # the pad slot's rows race
            assert torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0)), f"{name} after {when}"
        assert torch.equal(a.state.visible[[0, 2]], b.state.visible[[0, 2]]), "visible"

    # The requests' prompts first (a prefill of every layer, a pad row beside them).
    prompts, prompt_lens = slots[[0, 1, 2]], seq[[0, 1, 2]] - 7
    for layer in range(3):
        logits = torch.randn(3, entries, generator=gen)
        for dev in pair:
            dev.prefill(prompts, layer, prompt_lens, logits.clone())
        same_state(f"prefill {layer}")
    for dev in pair:
        dev.commit(prompts)
    same_state("the prompts' commit")
    for step in range(3):
        got = [dev.select_layers(slots, seq + 2 * step, 2) for dev in pair]
        assert all(torch.equal(x, y) for x, y in zip(*got))
        same_state(f"select {step}")
        # Each row's compact length: its blocks' entries up to what it sees (the last block
        # partly), as an engine's per-row lengths bound its top-k.
        visible = device.visible_entries(seq + 2 * step, 2)
        for layer in range(3):
            blocks, counts = got[0][0][layer], got[0][1][layer]
            last = blocks.long().gather(1, (counts.long() - 1).clamp(min=0).unsqueeze(1))[:, 0]
            lengths = (counts.long() - 1) * bE + (visible - last * bE).clamp(max=bE)
            scored = torch.randn(8, width * bE, generator=gen)
            cols = device.topk(scored, lengths, k)
            for dev in pair:
                dev.observe_scored(slots, layer, scored.clone(), cols, blocks=blocks)
            same_state(f"observe {step}.{layer}")
        if pair[1].spec.needs_hits:
            assert int(pair[1].state.pending_hits.sum()) > 0  # the hits were counted
        if pair[1].spec.adapt:  # something was measured (and compared above)
            assert int(pair[1].state.explore_yield[:3].sum()) > 0
        query = torch.tensor([2, 2, 1, 1])
        lengths = dict(seq_lens=seq + 2 * step + 1 + query, query_lens=query)  # 1 accepted
        for dev in pair:
            dev.commit(slots, **lengths)
        same_state(f"commit {step}")
    assert pair[1].state.step.tolist()[:3] == [4, 0, 4]


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_two_prefills_of_a_layer_before_the_commit_match_the_library(impl):
    """The library applies a prefill's row at once (a second prefill of the layer in the same
    step builds on the first): the device's offsets too, not only its slot EMA."""
    if impl == "triton":
        pytest.importorskip("triton")
    cfg = {"target_sparsity": 0.5, "topk": 64, "recent_blocks": 0, "page_size": E}
    entries = E * 512
    lib = spin_dsa.Serving(2, 1, entries, "spin", cfg, 1)
    dev = device.Serving(2, 1, entries, "spin", cfg, 1, device="cpu", impl=impl)
    for s in range(2):
        lib.add(s, 10 + s)
        dev.add(s, 10 + s)
    rng = np.random.default_rng(1)
    slots, seq = np.arange(2, dtype=np.int32), np.array([entries - 100, entries * 3 // 4])
    for _ in range(2):
        logits = rng.standard_normal((2, entries)).astype(np.float32)
        lib.prefill(slots, 0, seq, logits)
        dev.prefill(torch.from_numpy(slots), 0, torch.from_numpy(seq), torch.from_numpy(logits))
    lib.commit(slots)
    dev.commit(torch.from_numpy(slots))
    want = lib.select(slots, 0, seq + 1, 1).copy()
    got, _ = dev.select(torch.from_numpy(slots), 0, torch.from_numpy(seq + 1), 1)
    np.testing.assert_array_equal(got.numpy(), want[:, :dev.width])


def test_strided_slots_and_lengths_select_and_commit_as_contiguous_ones():
    """A view with a stride (every second row of a larger buffer) reaches the kernels as the
    rows it shows, not as memory in order."""
    pytest.importorskip("triton")
    cfg = {"page_size": 64, "target_sparsity": 0.5, "topk": 32}
    pair = [device.Serving(4, 2, 64 * 64, "spin", cfg, 1, impl=i) for i in ("torch", "triton")]
    for d in pair:
        for s in range(4):
            d.add(s, 5 + s)
    slots = torch.tensor([0, 9, 2, 9, 3, 9])[::2]
    seq = torch.tensor([1000, 1, 3000, 1, 2000, 1])[::2]
    got = [d.select_layers(slots, seq, 1) for d in pair]
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    for d in pair:
        d.commit(slots, seq_lens=(seq + 2)[::1], query_lens=torch.tensor([1, 7, 1, 7, 1, 7])[::2])
    assert torch.equal(pair[0].state.step, pair[1].state.step)
    assert pair[1].state.step.tolist()[:4] == [1, 0, 1, 1]


def test_commit_takes_accepted_or_lengths_not_both():
    dev = device.Serving(2, 1, 1024, "spin", {"page_size": E, "topk": 32})
    S, n = torch.tensor([0]), torch.tensor([5])
    for kwargs in (dict(seq_lens=n), dict(query_lens=n), dict(accepted=n, seq_lens=n, query_lens=n)):
        with pytest.raises(spin_dsa.InvalidArgument, match="accepted, or seq_lens and query_lens"):
            dev.commit(S, **kwargs)
    with pytest.raises(ValueError, match="query_lens: expected 1 rows"):
        dev.commit(S, seq_lens=n, query_lens=torch.tensor([1, 2]))


def test_dense_blocks_keeps_short_rows_whole_and_leaves_long_rows_to_the_budget():
    """An engine's short-context threshold: rows that see at most dense_blocks blocks keep every
    block; longer rows select exactly as without it; the output width covers both."""
    cfg = {"page_size": E, "topk": 32, "target_sparsity": 0.5}
    plain = device.Serving(2, 1, 8192, "spin", cfg)
    dense = device.Serving(2, 1, 8192, "spin", cfg, dense_blocks=40)
    assert dense.width >= 40 and dense.dense_blocks == 40
    for s in (plain, dense):
        s.add(0, 5)
        s.add(1, 6)
    S, seq = torch.tensor([0, 1]), torch.tensor([40 * E, 3000])
    want, want_counts = plain.select(S, 0, seq)
    got, counts = dense.select(S, 0, seq)
    assert counts[0] == 40 and torch.equal(got[0, :40], torch.arange(40, dtype=torch.int32))
    assert want_counts[0] < 40  # the budget rule alone would have skipped some
    assert counts[1] == want_counts[1]
    assert torch.equal(got[1, :int(counts[1])], want[1, :int(want_counts[1])])
    with pytest.raises(spin_dsa.InvalidArgument):
        device.Serving(2, 1, 8192, "spin", cfg, dense_blocks=-1)


def test_output_shapes_are_fixed_at_construction():
    dev = device.Serving(3, 1, 4096, "spin", {"page_size": 64, "topk": 256,
                                              "target_sparsity": 0.5}, 2)
    assert dev.width == min(dev.max_blocks, 2 * spin_dsa.budget_blocks(dev.config, 64))
    dev.add(1, 3)
    for seq in (2, 70, 4096):
        blocks, counts = dev.select(torch.tensor([1]), 0, torch.tensor([seq]), 2)
        assert blocks.shape == (2, dev.width) and blocks.dtype == torch.int32
        dev.observe_scored(torch.tensor([1]), 0, torch.zeros(2, dev.width * 64), blocks=blocks)
        dev.commit(torch.tensor([1]))


# (the tables built at construction: tests/device/test_tables.py)


# -- refusals -------------------------------------------------------------------------------

def test_host_only_predictors_and_options_are_refused_by_name():
    for name in ("hisa", "oracle", "spin-hybrid", "prev-layer", "indexcache-2"):
        with pytest.raises(spin_dsa.InvalidArgument, match=name):
            device.Serving(2, 1, 1024, name)
    with pytest.raises(spin_dsa.InvalidArgument, match="pooling=mean"):
        device.Serving(2, 1, 1024, "spin", {"pooling": "mean"})
    with pytest.raises(spin_dsa.InvalidArgument, match="budget_moves"):
        device.Serving(2, 1, 1024, "spin", {"budget_moves": "layers"})
    with pytest.raises(spin_dsa.SpinError):
        device.Serving(2, 1, 0, "spin")  # the library's own size check
    with pytest.raises(spin_dsa.SpinError):
        device.Serving(2, 1, 1024, "spin", {"target_sparsity": 1.5})


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_pad_rows_remap_through_their_own_blocks_and_leave_the_pad_state_alone(impl):
    """An engine's pad rows (several a batch, one shared pad_slot) each get positions from the
    blocks select returned for them, and the pad slot never opens a step: its state stays as it
    was (racy updates from several rows would make it differ run to run and rank to rank)."""
    cfg = {"page_size": E, "topk": 16, "target_sparsity": 0.5}
    dev = device.Serving(2, 1, 4096, "spin", cfg, impl=impl)
    dev.add(0, 7)
    pad = dev.pad_slot
    S, seq = torch.tensor([0, pad, pad]), torch.tensor([4000, 3000, 1500])
    before = {n: getattr(dev.state, n)[pad].clone() for n in ("slot_ema", "last_seen", "step",
                                                              "prev_hits")}
    blocks, counts = dev.select(S, 0, seq)
    scored = torch.randn(3, dev.width * E, generator=torch.Generator().manual_seed(3))
    lengths = torch.minimum(counts.long() * E, torch.tensor(dev.width * E))
    cols = device.topk(scored, lengths, 16)
    positions = torch.full((3, 16), 99, dtype=torch.int32)
    dev.observe_scored(S, 0, scored, cols, positions=positions, blocks=blocks)
    assert torch.equal(positions, device.remap(cols, blocks, dev.block_entries))
    dev.commit(S)
    for name, t in before.items():
        torch.testing.assert_close(getattr(dev.state, name)[pad], t, rtol=0, atol=0, equal_nan=True,
                                   msg=name)
    assert int(dev.state.step[0]) == 1


def test_observe_positions_are_checked():
    dev = device.Serving(2, 1, 512, "spin", {"page_size": E, "topk": 8}, 1, device="cpu")
    slots, seq = torch.tensor([0, 1]), torch.tensor([300, 200])
    dev.add(0, 5)
    dev.add(1, 6)
    blocks, _ = dev.select(slots, 0, seq)
    scored = torch.zeros(2, dev.width * E)
    cols = torch.zeros(2, 8, dtype=torch.int32)
    for positions, topk, match in ((torch.zeros(2, 8, dtype=torch.int64), cols, "int32"),
                                   (torch.zeros(2, 9, dtype=torch.int32), cols, "topk = 8"),
                                   (cols, cols, "shares memory"),
                                   (torch.zeros(2, 8, dtype=torch.int32), None, "needs topk")):
        with pytest.raises((TypeError, spin_dsa.InvalidArgument), match=match):
            dev.observe_scored(slots, 0, scored, topk, positions=positions, blocks=blocks)
    for bad, match in ((blocks.long(), "int32"), (blocks[:, :-1], "width"), (blocks[:1], "rows")):
        with pytest.raises((ValueError, spin_dsa.InvalidArgument), match=match):
            dev.observe_scored(slots, 0, scored, cols, blocks=bad)


def test_bad_arguments_get_one_line_errors():
    dev = device.Serving(2, 2, 1024, "spin", {"page_size": 64, "topk": 64})
    dev.add(0, 1)
    with pytest.raises(spin_dsa.FailedPrecondition, match="slot 0 holds"):
        dev.add(0, 2)
    with pytest.raises(spin_dsa.OutOfRange, match="slot 5"):
        dev.add(5, 2)
    with pytest.raises(spin_dsa.InvalidType, match="slots"):  # the package's errors
        dev.select([0], 0, torch.tensor([10]))
    with pytest.raises(TypeError, match="integer"):
        dev.select(torch.tensor([0.0]), 0, torch.tensor([10]))
    with pytest.raises(spin_dsa.InvalidArgument, match="seq_lens"):
        dev.select(torch.tensor([0]), 0, torch.tensor([10, 11]))
    with pytest.raises(spin_dsa.OutOfRange, match="layer 2"):
        dev.select(torch.tensor([0]), 2, torch.tensor([10]))
    with pytest.raises(spin_dsa.InvalidArgument, match="next_n"):
        dev.select(torch.tensor([0]), 0, torch.tensor([10]), 2)
    blocks, _ = dev.select(torch.tensor([0]), 0, torch.tensor([10]))
    with pytest.raises(spin_dsa.InvalidArgument, match="columns"):
        dev.observe_scored(torch.tensor([0]), 0, torch.zeros(1, 3), blocks=blocks)
    with pytest.raises(TypeError, match="float32"):
        dev.observe_scored(torch.tensor([0]), 0, torch.zeros(1, dev.width * 64,
                                                             dtype=torch.float64), blocks=blocks)
    with pytest.raises(spin_dsa.FailedPrecondition, match="already free"):
        dev.drop(1)


def test_the_radix_and_bitwise_kth_searches_find_the_kth_smallest_value():
    """Both k-th searches of the select kernel return the k-th smallest uint32 of the row (0 for
    k = 0) on hostile rows: heavy ties, values at the top of the range, one value, every k."""
    pytest.importorskip("triton")
    from kth_probe import probe

    rng = np.random.default_rng(4)
    rows = [rng.integers(0, 1 << 32, 64), rng.integers(0, 4, 64) * 0x01010101,
            rng.integers(0xFFFFFFF0, 1 << 32, 64), np.full(64, 0x80000000),
            rng.choice([0, 0xFFFFFFFF, 0x00FF00FF, 0x00FF0100], 64)]
    for row in rows:
        values = np.sort(row.astype(np.uint32))
        for k in range(0, 65):
            out = torch.zeros(2, dtype=torch.int32)
            probe[(1,)](torch.from_numpy(row.astype(np.uint32).view(np.int32)),
                        torch.tensor([k], dtype=torch.int32), out, BLOCK=64)
            got = out.numpy().view(np.uint32)
            want = values[k - 1] if k else 0
            assert got[0] == want and got[1] == want, (k, got, want)


@pytest.mark.parametrize("next_n", [1, 2])
def test_the_state_fits_one_mib_per_request_at_128k(next_n):
    # Issue 32's goal: DeepSeek-V3.2's 61 indexer layers, 128K entries, spin's defaults, MTP
    # included (the pad slot's row counted in). Binary16 slot EMA with NaN for never observed,
    # uint8 hits, the draft row's observations in binary16: 0.59 / 0.95 MiB.
    dev = device.Serving(64, 61, 131072, "spin", {}, next_n, device="cpu", impl="torch")
    assert dev.state.slot_ema.dtype == torch.float16 and dev.state.last_seen.numel() == 0
    assert dev.memory_bytes / 64 <= (0.6 if next_n == 1 else 0.96) * 2**20
