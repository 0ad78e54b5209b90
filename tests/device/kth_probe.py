"""A probe kernel for the select kernel's two k-th searches (test_serving.py): one row of uint32
values (as int32 bits) and k in, each search's k-th smallest out."""
import triton
import triton.language as tl

from spin_dsa.device import _select_kernel as sk


@triton.jit
def probe(V, K, OUT, BLOCK: tl.constexpr):
    v = tl.load(V + tl.arange(0, BLOCK)).to(tl.uint32, bitcast=True)
    k = tl.load(K)
    tl.store(OUT, sk._kth_bitwise(v, k).to(tl.int32, bitcast=True))
    tl.store(OUT + 1, sk._kth_radix(v, k).to(tl.int32, bitcast=True))
