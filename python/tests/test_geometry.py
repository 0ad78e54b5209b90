"""The cache geometry spin_dsa exports from the library (include/spin/geometry.h): the visibility
rule, visible_entries, and INDEXER_ENTRY_BYTES, one key of an indexer cache page."""
import numpy as np
import pytest

import spin_dsa


def rule(context_len, next_n, row, compress_ratio):
    """geometry.h's rule, written out: row `row` sees the tokens up to its own position."""
    return max(0, context_len - next_n + row + 1) // compress_ratio


def test_visible_entries_rows_in_kernel_order():
    v = spin_dsa.visible_entries(np.array([100, 2, 40], np.int64), 4)
    assert v.dtype == np.int64 and v.shape == (12,)
    assert v.tolist() == [97, 98, 99, 100, 0, 0, 1, 2, 37, 38, 39, 40]  # row j of request i at i·4 + j
    assert spin_dsa.visible_entries([40], 3, compress_ratio=4).tolist() == [9, 9, 10]  # V4: (t + 1) // 4
    assert spin_dsa.visible_entries(np.zeros(0, np.int64), 2).shape == (0,)


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("compress_ratio", [1, 2, 4, 7, 64])
def test_visible_entries_is_the_rule(next_n, compress_ratio):
    ctx = list(range(0, 300)) + [2 ** 31 + 3, 2 ** 62]
    got = spin_dsa.visible_entries(ctx, next_n, compress_ratio).reshape(len(ctx), next_n)
    want = [[rule(c, next_n, j, compress_ratio) for j in range(next_n)] for c in ctx]
    assert got.tolist() == want


def test_visible_entries_refuses_bad_input():
    with pytest.raises(spin_dsa.InvalidArgument, match="next_n"):
        spin_dsa.visible_entries([10], 0)
    with pytest.raises(spin_dsa.InvalidArgument, match="next_n"):
        spin_dsa.visible_entries([10], 5)
    with pytest.raises(spin_dsa.InvalidArgument, match="compress_ratio"):
        spin_dsa.visible_entries([10], 1, 0)
    with pytest.raises(spin_dsa.InvalidArgument, match=r"context_lens\[1\]"):
        spin_dsa.visible_entries([10, -1], 1)
    with pytest.raises(spin_dsa.InvalidType, match="context_lens"):
        spin_dsa.visible_entries(np.array([1.5]), 1)
    with pytest.raises(spin_dsa.InvalidArgument, match="context_lens"):
        spin_dsa.visible_entries(np.zeros((2, 2), np.int64), 1)


def test_indexer_entry_bytes_is_the_cache_layout():
    assert spin_dsa.INDEXER_ENTRY_BYTES == 128 + 4  # 128 e4m3 codes and one fp32 scale
    page, heads = 16, 2
    q = np.zeros((1, 1, heads, 128), np.uint8)
    w = np.ones((1, 1, heads), np.float32)
    table = np.zeros((1, 1), np.int32)
    cache = np.zeros((1, page * spin_dsa.INDEXER_ENTRY_BYTES), np.uint8)
    out = spin_dsa.indexer_scores(cache, table, [page], q, w, page_size=page)
    assert out.shape == (1, page)
    with pytest.raises(spin_dsa.InvalidArgument, match="pages"):
        spin_dsa.indexer_scores(cache[:, :-4], table, [page], q, w, page_size=page)
