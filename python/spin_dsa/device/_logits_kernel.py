"""The Triton kernel of :mod:`spin_dsa.device._logits` (its docstring describes it), apart so
that the rest of that module — the launch shapes and the torch reference — imports with torch
alone; :func:`spin_dsa.device._logits.paged_logits` imports this on first use."""
import triton
import triton.language as tl

# Bytes of one entry of an indexer cache page: D = 128 e4m3 codes and one fp32 scale. The library's
# spin_dsa.INDEXER_ENTRY_BYTES, restated because this module also loads without the compiled
# library (bench/gpu/run.py on a bare GPU machine); tests/device/test_logits.py holds them equal.
ENTRY_BYTES = tl.constexpr(128 + 4)


@triton.jit
def _e4m3_to_f32(u8):
    """Decode e4m3fn bytes (sign, 4 exponent bits biased by 7, 3 mantissa bits; 0x7F/0xFF NaN,
    no infinities) to fp32 by bit arithmetic: for GPUs without fp8 conversions."""
    u = u8.to(tl.int32)
    e = (u >> 3) & 0xF
    m = u & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)   # (1 + m/8) · 2^(e-7)
    sub = m.to(tl.float32) * 0.001953125                                      # m · 2^-9
    mag = tl.where(e == 0, sub, normal)
    mag = tl.where((u & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where((u & 0x80) != 0, -mag, mag)


@triton.jit
def _paged_logits_kernel(Q, W, CACHE, CACHE_F32, TABLE, stride_tb, table_cols, LENGTHS, OUT, stride_o,
                         width, next_n, heads, tiles,
                         PAGE_SIZE: tl.constexpr, NN: tl.constexpr, HP: tl.constexpr,
                         BLOCK_N: tl.constexpr, FP8_DOT: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    D: tl.constexpr = 128
    M: tl.constexpr = NN * HP

    # q rows of this request: m = j·HP + h (row j, head h), padding rows load 0 and weigh 0.
    m = tl.arange(0, M)
    j_of_m = m // HP
    h_of_m = m % HP
    m_ok = (j_of_m < next_n) & (h_of_m < heads)
    q_row = (b * next_n + j_of_m) * heads + h_of_m
    d = tl.arange(0, D)
    q = tl.load(Q + q_row[:, None] * D + d[None, :], mask=m_ok[:, None], other=0)
    w = tl.load(W + q_row, mask=m_ok, other=0.0)
    if FP8_DOT:
        qd = q.to(tl.float8e4nv, bitcast=True)
    else:
        qd = _e4m3_to_f32(q).to(tl.float16)

    jr = tl.arange(0, NN)
    row_ok = jr < next_n
    len_j = tl.load(LENGTHS + b * next_n + jr, mask=row_ok, other=0)
    len_j = tl.minimum(len_j, table_cols * PAGE_SIZE)                    # never read past the table
    req_len = tl.max(len_j, axis=0)
    out_rows = OUT + (b * next_n + jr)[None, :] * stride_o                # [1, NN]

    n = tl.arange(0, BLOCK_N)
    col0 = chunk * tiles * BLOCK_N
    live_tiles = tl.minimum(tl.maximum(tl.cdiv(req_len - col0, BLOCK_N), 0), tiles)
    # The page ids of tile t+1 are loaded in iteration t, so that the key loads' addresses come
    # from the loop carry, not from a load of the same iteration: the software pipeliner then
    # keeps several key tiles in flight (num_stages) instead of one behind a dependent load.
    table_row = TABLE + b * stride_tb
    next_cols = col0 + n
    next_page = tl.load(table_row + next_cols // PAGE_SIZE, mask=next_cols < req_len, other=0)
    for t in range(0, live_tiles):
        cols = col0 + t * BLOCK_N + n
        live = cols < req_len
        page = next_page.to(tl.int64)
        next_cols = cols + BLOCK_N
        next_page = tl.load(table_row + next_cols // PAGE_SIZE, mask=next_cols < req_len, other=0)
        slot = cols % PAGE_SIZE
        k_off = (page * (PAGE_SIZE * ENTRY_BYTES) + slot * D)[:, None] + d[None, :]
        # The page in fp32 words: its PAGE_SIZE scales follow PAGE_SIZE · D code bytes.
        k_scale = tl.load(CACHE_F32 + page * (PAGE_SIZE * ENTRY_BYTES // 4) + PAGE_SIZE * D // 4 + slot,
                          mask=live, other=0.0)
        if FP8_DOT:
            # Loaded as e4m3 through an e4m3 pointer: the tile goes from the async copy's shared
            # memory straight into the MMA (no register round trip for a bitcast).
            kd = tl.load(CACHE.to(tl.pointer_type(tl.float8e4nv)) + k_off, mask=live[:, None], other=0.0)
        else:
            kd = _e4m3_to_f32(tl.load(CACHE + k_off, mask=live[:, None], other=0)).to(tl.float16)
        # Keys as the MMA's M side, heads as N: the head sum below then stays inside each warp's
        # rows (shuffles, no shared-memory round trip), and a row's logits leave contiguous.
        s = tl.dot(kd, tl.trans(qd), out_dtype=tl.float32)                 # [BLOCK_N, M]
        s = tl.maximum(s, 0.0) * w[None, :]
        if NN == 1:
            res = tl.where(live, tl.sum(s, axis=1) * k_scale, float("-inf"))
            tl.store(OUT + b * stride_o + cols, res, mask=cols < width)
        else:
            per_row = tl.sum(tl.reshape(s, (BLOCK_N, NN, HP)), axis=2)    # [BLOCK_N, NN]
            res = tl.where(cols[:, None] < len_j[None, :], per_row * k_scale[:, None], float("-inf"))
            tl.store(out_rows + cols[:, None], res, mask=row_ok[None, :] & (cols < width)[:, None])
    # Tiles past the request's longest row: -inf, no loads.
    for t in range(live_tiles, tiles):
        cols = col0 + t * BLOCK_N + n
        tl.store(out_rows + cols[:, None], tl.full((BLOCK_N, NN), float("-inf"), tl.float32),
                 mask=row_ok[None, :] & (cols < width)[:, None])
