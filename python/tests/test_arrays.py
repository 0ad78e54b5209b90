"""Zero-copy arrays (numpy views, in-place outputs, torch CPU tensors when torch is installed), the
kernels, traces built from arrays, and the workload generator."""
import numpy as np
import pytest

import spin_dsa


def test_trace_views_share_the_mapping(small_trace_path):
    r = spin_dsa.open_trace(small_trace_path)
    k1, k2 = r.k(0), r.k(0)
    assert np.shares_memory(k1, k2)  # both views of the same mapped bytes
    assert not k1.flags.writeable
    assert k1.shape == (r.entries(0), 128) and k1.dtype == np.uint8
    assert r.q(1).shape == (r.steps, 1, 64, 128) and r.w(1).dtype == np.float32
    assert r.ctx_len.dtype == np.int64 and r.ctx_len.size == r.steps
    del r  # the views keep the reader (and the mapping) alive
    assert int(k1.sum()) >= 0
    with pytest.raises(spin_dsa.OutOfRange):
        spin_dsa.open_trace(small_trace_path).k(5)


def test_bad_trace_file_is_an_exception(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}     ")
    with pytest.raises(spin_dsa.SpinError):
        spin_dsa.open_trace(str(bad))
    with pytest.raises(spin_dsa.SpinError):
        spin_dsa.open_trace(str(tmp_path / "missing.safetensors"))


def test_make_trace_roundtrip(tmp_path, small_trace_path):
    r = spin_dsa.open_trace(small_trace_path)
    layers = [{"k": r.k(l), "k_scale": r.k_scale(l), "q": r.q(l), "w": r.w(l)} for l in range(2)]
    t = spin_dsa.make_trace(r.meta, r.ctx_len, layers)
    out = tmp_path / "copy.safetensors"
    t.write(str(out))
    r2 = spin_dsa.open_trace(str(out))
    np.testing.assert_array_equal(r2.k(1), r.k(1))
    np.testing.assert_array_equal(r2.w(0), r.w(0))
    with pytest.raises(spin_dsa.SpinError, match="ctx_len"):
        spin_dsa.make_trace(r.meta, r.ctx_len[::-1].copy(), layers)  # ctx_len must increase


def test_indexer_and_topk_in_place(small_trace_path):
    from test_predictor import paged_cache
    r = spin_dsa.open_trace(small_trace_path)
    cache, table = paged_cache(r.k(0), r.k_scale(0), 64)
    ctx = np.array([int(r.ctx_len[3])], np.int64)
    q, w = r.q(0)[3][None], r.w(0)[3][None]
    full = spin_dsa.indexer_scores(cache, table, ctx, q, w)
    assert full.shape == (1, ctx[0]) and np.isfinite(full).all()
    out = np.empty_like(full)
    res = spin_dsa.indexer_scores(cache, table, ctx, q, w, out=out, impl="reference")
    assert res is out
    np.testing.assert_allclose(out, full, rtol=1e-5, atol=1e-5)
    # Block-masked: only blocks 0, 5, 7 scored, -inf elsewhere.
    ids, offs = np.array([0, 5, 7], np.int32), np.array([0, 3], np.int32)
    masked = spin_dsa.indexer_scores(cache, table, ctx, q, w, block_ids=ids, block_offsets=offs)
    keep = np.zeros(ctx[0], bool)
    for b in ids:
        keep[b * 64:(b + 1) * 64] = True
    np.testing.assert_array_equal(masked[0, keep], full[0, keep])
    assert np.all(masked[0, ~keep] == -np.inf)
    top = spin_dsa.topk(full, 2048)
    assert top.shape == (1, 2048) and np.all(np.diff(top[0]) > 0)
    top_m = spin_dsa.topk(masked, 2048, block_ids=ids, block_offsets=offs, block_entries=64)
    assert set(top_m[0][top_m[0] >= 0]) <= set(np.nonzero(keep)[0])
    with pytest.raises(TypeError, match="C-contiguous"):
        spin_dsa.topk(np.asfortranarray(np.zeros((3, 5), np.float32)), 2)
    with pytest.raises(spin_dsa.InvalidArgument):
        spin_dsa.indexer_scores(cache[:, :100].copy(), table, ctx, q, w)


class DLPackOnly:
    """An array seen only through DLPack (no buffer protocol): the path torch tensors take."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_inputs_and_outputs_in_place():
    scores = np.random.default_rng(1).standard_normal((2, 100)).astype(np.float32)
    out = np.full((2, 4), 7, np.int32)
    res = spin_dsa.topk(DLPackOnly(scores), 4, out=DLPackOnly(out))
    assert isinstance(res, DLPackOnly) and res.a is out
    np.testing.assert_array_equal(out, spin_dsa.topk(scores, 4))


def test_torch_tensors_without_copies(small_trace_path):
    torch = pytest.importorskip("torch")
    p = spin_dsa.make_predictor("spin", {"page_size": 16, "topk": 32}, 1, 0)
    blocks = p.select(0, 0, 500)
    scores = torch.zeros(500, dtype=torch.float32)
    p.observe(0, 0, scores)  # through DLPack
    p.commit(0)
    full = torch.zeros((2, 100), dtype=torch.float32)
    out = torch.full((2, 4), 7, dtype=torch.int32)
    res = spin_dsa.topk(full, 4, out=out)
    assert res is out and out[0].tolist() == [0, 1, 2, 3]
    assert torch.from_numpy(blocks).data_ptr() == blocks.ctypes.data


def test_workload_generator():
    assert "doc-qa-10k" in spin_dsa.scenario_names()
    t = spin_dsa.generate_workload("needle-shift", prompt_tokens=2000, steps=4, layers=1, seed=2)
    assert t.steps == 4 and t.num_layers == 1 and t.meta["topk"] == 2048
    assert "prompt_tokens" in spin_dsa.workload_params("agentic")
    with pytest.raises(spin_dsa.InvalidArgument):
        spin_dsa.generate_workload("doc-qa-10k", no_such_field=1)
    with pytest.raises(spin_dsa.SpinError):
        spin_dsa.generate_workload("no-such-scenario")


def test_diagnose():
    d = spin_dsa.diagnose(gpu="h200", context=65536, batch=64, sparsities=[0.0, 0.5])
    assert abs(d["all_keep"]["indexer_ms"] / 61 - 0.149) < 0.002
    assert d["sparsity"][1]["gain_scored"] > d["sparsity"][1]["gain_full"] > 1.0
    assert d["sources"]
    with pytest.raises(spin_dsa.InvalidArgument):
        spin_dsa.diagnose(gpu="a100")


def _in_child(code, spin_cpu):
    """Runs `code` in a fresh interpreter with SPIN_CPU set (it is read once per process)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, SPIN_CPU=spin_cpu)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_spin_cpu_caps_the_kernels_and_is_named():
    import platform
    level = "avx2" if platform.machine() in ("x86_64", "AMD64") else "neon"
    r = _in_child("import spin_dsa; print(spin_dsa.cpu_summary()); print(spin_dsa.indexer_impls())", level)
    assert r.returncode == 0, r.stderr
    summary, impls = r.stdout.splitlines()
    assert f"SPIN_CPU={level}" in summary
    wider = {"avx2": ("avx512bf16", "avx512f"), "neon": ("neon_bf16",)}[level]
    assert not any(f"'{w}'" in impls for w in wider), impls
    # An unknown level is refused by every kernel call, naming the variable.
    code = ("import numpy as np, spin_dsa\n"
            "try:\n"
            "    spin_dsa.indexer_scores(np.zeros((1, 64 * 132), np.uint8), np.zeros((1, 1), np.int32),\n"
            "                            np.array([8]), np.zeros((1, 1, 2, 128), np.uint8), np.ones((1, 1, 2), np.float32))\n"
            "except spin_dsa.InvalidArgument as e:\n"
            "    print(e)\n")
    r = _in_child(code, "avx3")
    assert r.returncode == 0, r.stderr
    assert "SPIN_CPU=avx3: unknown level" in r.stdout, r.stdout


def test_indexer_impls_lists_this_cpus_paths():
    impls = spin_dsa.indexer_impls()
    assert isinstance(impls, list) and impls[-2:] == ["portable", "reference"], impls
