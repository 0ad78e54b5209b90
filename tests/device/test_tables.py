"""The device path's tables and constants come from the library (spin_dsa._core.selection_tables,
selection_constants, hit_tie_level; include/spin/selection_tables.h). Checked here against a
direct computation of each rule — src/predict's formulas, restated in this test only — for
hostile configs, and through to the tensors spin_dsa.device.Serving builds from them."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
spin_dsa = pytest.importorskip("spin_dsa")
device = pytest.importorskip("spin_dsa.device")

from spin_dsa import _core  # noqa: E402
from spin_dsa.device import _select, _state  # noqa: E402

HOSTILE = [
    {},
    {"target_sparsity": 0.0},
    {"target_sparsity": 0.99, "explore_ratio": 0.5},  # llround's halves
    {"explicit_budget_blocks": 0, "sink_blocks": 0, "local_blocks": 0},
    {"explicit_budget_blocks": 9, "sink_blocks": 4, "local_blocks": 6, "pool_depth": 0.0},
    {"target_sparsity": 0.9, "block_pages": 4, "page_size": 16, "topk": 8, "pool_depth": 1.0,
     "explore_ratio": 1.0},
    {"page_size": 16, "topk": 2048, "sink_blocks": 40, "explore_ratio": 0.05},
]


def _llround(x):
    """std::llround for x ≥ 0: halves away from zero, exact in float64."""
    whole = math.floor(x)
    return int(whole) + (x - whole >= 0.5)


def _bucket(d):
    """offset_bucket: exact below 64, then four buckets per octave."""
    if d < 64:
        return d
    h = d.bit_length() - 1
    return 64 + (h - 6) * 4 + ((d >> (h - 2)) & 3)


def _bucket_range(k):
    if k < 64:
        return k, k + 1
    octave, quarter = 6 + (k - 64) // 4, (k - 64) % 4
    lo = (1 << octave) + quarter * (1 << (octave - 2))
    return lo, lo + (1 << (octave - 2))


def _direct(config, max_blocks):
    c = spin_dsa.check_config(config)
    E = int(c["page_size"]) * int(c["block_pages"])
    sink, local, topk = int(c["sink_blocks"]), int(c["local_blocks"]), int(c["topk"])
    out = {k: [] for k in ("budget", "forced", "explore", "history", "pool_rank")}
    for n in range(max_blocks + 1):
        if c["explicit_budget_blocks"] >= 0:
            b = int(c["explicit_budget_blocks"])
        else:
            b = math.ceil((1.0 - c["target_sparsity"]) * float(n) - 1e-9)
        b = 0 if n <= 0 else min(max(b, -(-topk // E), min(n, sink + local)), n)
        assert b == spin_dsa.budget_blocks(c, n)
        forced = min(sink, n) + n - max(max(0, n - local), min(sink, n))
        explore = min(_llround(c["explore_ratio"] * float(b)), b - forced)
        depth = float(c["pool_depth"])
        rank = 1 if b <= 0 or depth <= 0 else min(max(math.ceil(depth * topk / b), 1), E)
        for k, v in zip(out, (b, forced, explore, b - forced - explore, rank)):
            out[k].append(v)
    out["offset_bucket"] = [_bucket(d) for d in range(max(1, max_blocks))]
    buckets = _bucket(max(0, max_blocks - 1)) + 1
    out["bucket_lo"] = [_bucket_range(k)[0] for k in range(buckets)]
    out["bucket_hi"] = [_bucket_range(k)[1] for k in range(buckets)]
    return out


@pytest.mark.parametrize("config", HOSTILE)
@pytest.mark.parametrize("max_blocks", [0, 1, 2, 65, 300])
def test_tables_are_the_direct_computation(config, max_blocks):
    got = _core.selection_tables(config, max_blocks)
    want = _direct(config, max_blocks)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == np.int64, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_far_buckets():
    got = _core.selection_tables({"page_size": 1}, 1 << 21)
    d = np.array([0, 1, 63, 64, 79, 80, 127, 128, 159, 160, 255, 256, 2**20 - 1, 2**20, 2**21 - 1])
    np.testing.assert_array_equal(got["offset_bucket"][d], [_bucket(int(v)) for v in d])
    want = [_bucket_range(k) for k in range(len(got["bucket_lo"]))]
    np.testing.assert_array_equal(np.stack([got["bucket_lo"], got["bucket_hi"]], 1), want)


def test_refusals():
    with pytest.raises(spin_dsa.InvalidArgument):
        _core.selection_tables(None, -1)
    with pytest.raises(spin_dsa.InvalidArgument):
        _core.selection_tables(None, (1 << 31) + 1)
    with pytest.raises(spin_dsa.InvalidArgument):
        _core.selection_tables({"target_sparsity": 1.0}, 10)


@pytest.mark.parametrize("config", HOSTILE)
@pytest.mark.parametrize("predictor", device.PREDICTORS)
@pytest.mark.parametrize("dense_blocks", [0, 5])
def test_serving_builds_its_tensors_from_the_tables(config, predictor, dense_blocks):
    cfg = dict(config, budget_moves="none")
    c = spin_dsa.check_config(cfg)
    E = int(c["page_size"]) * int(c["block_pages"])
    max_blocks = 150
    s = device.Serving(2, 1, max_blocks * E, predictor, cfg, device="cpu", impl="torch",
                       dense_blocks=dense_blocks)
    t = _direct(cfg, max_blocks)
    fill, _, _, explores = _state.PARTS[predictor][:4]
    n = np.arange(max_blocks + 1)
    budget = np.array(t["budget"])
    keep_all = (budget >= n) | (fill == "all") | (n <= dense_blocks)
    left = np.where(keep_all, 0, budget - np.array(t["forced"]))
    explore = left if fill == "random" else \
        np.where(keep_all, 0, t["explore"]) if explores else np.zeros_like(left)
    rank = np.array(t["pool_rank"]) if explores else np.ones_like(budget)
    for name, tensor, want, dtype in (
            ("budget", s.tables.budget, budget, torch.int64),
            ("left", s.tables.left, left, torch.int64),
            ("n_explore", s.tables.n_explore, explore, torch.int64),
            ("n_history", s.tables.n_history, left - explore, torch.int64),
            ("keep_all", s.tables.keep_all, keep_all, torch.bool),
            ("pool_rank", s.tables.pool_rank, rank, torch.int32),
            ("bucket", s.tables.bucket, t["offset_bucket"], torch.int64),
            ("dist_lo", s.tables.dist_lo, t["bucket_lo"], torch.int64),
            ("dist_hi", s.tables.dist_hi, t["bucket_hi"], torch.int64)):
        assert tensor.dtype == dtype, name
        np.testing.assert_array_equal(tensor.numpy(), np.asarray(want), err_msg=name)
    assert s.spec.n_buckets == len(t["bucket_lo"])


def test_constants_are_the_librarys_and_the_kernels():
    """The Triton kernels (_select_kernel.py, _commit_kernel.py) compile these values in as
    literals: 2^30, 2^20, 2^20 - 1, 2^19, -2 and the bucket layout's 64."""
    k = _core.selection_constants()
    assert k == {"offset_mean_scale": 2.0 ** 30, "offset_exact_distances": 64,
                 "offset_buckets_per_octave": 4, "topk_first_base": 2.0 ** 20,
                 "topk_hits_cap": (1 << 20) - 1, "recent_base": 2.0 ** 19, "unknown_base": -2.0,
                 "churn_ema_keep": 0.8, "churn_ema_weight": 0.2, "explore_share_step": 0.5,
                 "explore_share_fall": 0.25, "explore_share_floor": 0.5,
                 "explore_share_ceiling": 4.0, "additions_gain_weight": 0.125,
                 "additions_gain_warmup": 8}
    # adapt's constants reach the kernels as float64 tensors, the ratio's products formed here.
    ratio = 0.07
    t = device.Serving(1, 1, 1024, "spin", {"explore_ratio": ratio}, impl="torch").tables
    assert t.adapt_constants.tolist() == [
        k["explore_share_step"] * ratio, k["explore_share_floor"] * ratio,
        k["explore_share_ceiling"] * ratio, k["explore_share_fall"], k["additions_gain_weight"]]
    assert (_state.OFFSET_SCALE, _state.TOPK_FIRST_BASE, _state.RECENT_BASE,
            _state.UNKNOWN_BASE, _state.TOPK_HITS_CAP, _state.CHURN_KEEP,
            _state.CHURN_WEIGHT) == (
        k["offset_mean_scale"], k["topk_first_base"], k["recent_base"], k["unknown_base"],
        k["topk_hits_cap"], k["churn_ema_keep"], k["churn_ema_weight"])


def test_hit_tie_level_is_the_librarys():
    edges = np.array([-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0], dtype=np.float32)
    p = np.concatenate([
        edges, np.nextafter(edges, np.float32(-np.inf)), np.nextafter(edges, np.float32(np.inf)),
        np.array([-np.inf, np.inf, np.nan, -3.0, 7.5, 1e30, -1e30, 1048576.0], dtype=np.float32),
        np.random.default_rng(5).uniform(-2, 2, 500).astype(np.float32)]).astype(np.float32)
    got = _select.hit_tie_level(torch.from_numpy(p)).numpy()
    want = np.array([_core.hit_tie_level(float(v)) for v in p], dtype=np.float32)
    np.testing.assert_array_equal(got, want)


def test_device_predictors_are_the_registrys():
    """_state.PARTS composes each device predictor from parts; the library's registry says which
    of them explore and which keep every block, and that the host serving API runs them all."""
    info = {row["name"]: row for row in spin_dsa.predictor_info()}
    for name, (fill, _, _, explores, _, _) in _state.PARTS.items():
        assert info[name]["can_serve"], name
        assert info[name]["explores"] == explores, name
        assert info[name]["keeps_all"] == (fill == "all"), name
