"""e4m3 codes with UE8M0 per-row scales, bit-exact with spin/numerics.h.

The same functions as examples/record_trace.py (numpy only), kept here so that the recorder does
not import from examples/: scale = 2^ceil(log2(fl32(max(amax, 1e-4) * fl32(1/448)))) computed on
the exponent bits as DeepSeek's act_quant does, codes = e4m3_rne(clamp(x / scale, ±448)).
"""

import numpy as np

HEAD_DIM = 128


def _e4m3_table():
    """Values of the positive finite e4m3 codes 0x00..0x7E (increasing with the code)."""
    codes = np.arange(0x7F)
    exp, man = codes >> 3, codes & 7
    sub = man * 2.0 ** -9
    norm = (1 + man / 8.0) * 2.0 ** (exp - 7)
    return np.where(exp == 0, sub, norm)


E4M3 = _e4m3_table()


def e4m3_encode(x):
    """float array -> uint8 e4m3 codes: round to nearest, ties to even, saturate at 448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(E4M3, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def e4m3_decode(codes):
    """uint8 e4m3 codes -> float32 values (NaN codes 0x7F / 0xFF give NaN)."""
    c = np.asarray(codes, np.uint8)
    mag = np.concatenate([E4M3, [np.nan]])[c & 0x7F]
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


def ue8m0_scale(amax):
    """2^ceil(log2(fl32(max(amax, 1e-4) * fl32(1/448)))), by exponent bits as act_quant does."""
    s = np.maximum(np.asarray(amax, np.float32), np.float32(1e-4)) * np.float32(1.0 / 448.0)
    bits = s.astype(np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
    return (exp.astype(np.uint32) << 23).view(np.float32)


def quantize_rows(x):
    """[..., 128] float -> (e4m3 codes [..., 128], fp32 scale [...]) with one scale per row."""
    x = np.asarray(x, np.float32)
    scale = ue8m0_scale(np.abs(x).max(axis=-1))
    codes = e4m3_encode(np.clip(x / scale[..., None], -448.0, 448.0))
    return codes, scale


def hadamard(n=HEAD_DIM):
    """Sylvester (natural order) Hadamard matrix scaled by n^-1/2: orthogonal and symmetric, as
    DeepSeek's rotate_activation applies it before quantising q and k (q.k is unchanged)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != n:
        raise ValueError(f"hadamard: {n} is not a power of two")
    return (h / np.sqrt(n)).astype(np.float32)
