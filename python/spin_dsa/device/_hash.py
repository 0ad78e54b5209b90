"""The library's counter-based RNG (include/spin/rng.h) on int64 tensors, bit for bit.

torch has no usable uint64 arithmetic on every device, so the uint64 words live in int64 tensors:
addition and multiplication wrap modulo 2^64 to the same bits, and the logical right shift is an
arithmetic shift masked to the bits the shift brought in. Host-side values (a request's key) are
plain Python ints folded with the same mixer.
"""

import numpy as np
import torch

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def as_int64(u: int) -> int:
    """A uint64 value as the int64 with the same bits."""
    u &= _MASK64
    return u - (1 << 64) if u >= 1 << 63 else u


def mix64_int(x: int) -> int:
    """SplitMix64's finaliser on a Python int (uint64 semantics): spin::mix64."""
    x &= _MASK64
    x ^= x >> 30
    x = (x * _MIX1) & _MASK64
    x ^= x >> 27
    x = (x * _MIX2) & _MASK64
    x ^= x >> 31
    return x


def request_key(seed: int, request_id: int) -> int:
    """stream_key(seed, request_id, ...)'s first fold, kept per slot: mix64(seed + G) ^ request."""
    return as_int64(mix64_int((seed + _GOLDEN) & _MASK64) ^ (request_id & _MASK64))


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """spin::mix64 on an int64 tensor (uint64 bits)."""
    x = x ^ _srl(x, 30)
    x = x * as_int64(_MIX1)
    x = x ^ _srl(x, 27)
    x = x * as_int64(_MIX2)
    return x ^ _srl(x, 31)


def step_key(req_key: torch.Tensor, layer: int, step: torch.Tensor) -> torch.Tensor:
    """stream_key(seed, request, layer, step) from the per-slot request_key(): two more folds and
    the final mix, as the library's variadic stream_key does them."""
    k = mix64(req_key + as_int64(_GOLDEN)) ^ layer
    k = mix64(k + as_int64(_GOLDEN)) ^ step
    return mix64(k ^ as_int64(_GOLDEN))


def counter_offsets(n: int, device) -> torch.Tensor:
    """(b + 1)·G mod 2^64 for b in [0, n): CounterRng::at(b) = mix64(key + that)."""
    with np.errstate(over="ignore"):
        u = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN)  # wraps modulo 2^64
    return torch.from_numpy(u.view(np.int64)).to(device)


def draws(key: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """CounterRng(key).at(b) for every key (shape [...]) and block b: shape [..., n]."""
    return mix64(key.unsqueeze(-1) + offsets)


def high32(x: torch.Tensor) -> torch.Tensor:
    """The top 32 bits of each uint64 word, as 0..2^32-1."""
    return _srl(x, 32)
