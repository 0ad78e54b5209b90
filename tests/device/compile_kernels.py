"""Compiles every variant of the fused Triton kernels for a Hopper GPU (sm_90) without one, with
the ptxas Triton ships, and reads the PTX for what bitwise agreement with the library needs: no
fused multiply-add where the library rounds twice, IEEE-rounded float64 division in the pooling.
Run by test_compile.py in a child interpreter (the tests' conftest turns Triton into its
interpreter, which cannot compile). Exit 0: all compiled and checked; 77: this install cannot
compile for CUDA (no backend or ptxas); anything else: a failure, printed."""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as e:  # another Triton layout: nothing to check here
    print(f"cannot compile ahead of time with this Triton: {e}")
    sys.exit(77)

from spin_dsa.device import _commit_kernel, _observe_kernel, _paging_kernel, _select_kernel  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)

SELECT_POINTERS = dict(
    SLOT="*i64", LAYER="*i64", SEQ_LENS="*i32", SLOT_EMA="*fp16", LAST_SEEN="*i32",
    OFFSET_EMA="*fp32", OFFSET_COUNT="*i32", PREV_HITS="*u8", REQ_KEY="*i64", STEP="*i64",
    N_EXPLORE="*i64", N_HISTORY="*i64", KEEP_ALL="*i32", BUCKET="*i64", COUNTER="*i64",
    SHARE="*fp64", BUDGET="*i64", LEFT="*i64", OUT="*i32", COUNTS="*i32", SELECTED="*u8",
    OPEN_NEXT_N="*i64", OPENED="*i64", VISIBLE="*i64", PENDING_X="*fp16",
    PENDING_HITS="*u8", ROW0_SUM="*i64", ROW0_COUNT="*i32", ADDITIONS_GAIN="*fp64",
    GAIN_STEPS="*i32", GAIN="*fp64", EXPLORE_YIELD="*i64", w="fp32", one_minus_w="fp32")
# The last replayed row's inputs: an engine's int32 lengths, its int64 query lengths.
ROWS_POINTERS = dict(SLOT="*i64", ACCEPTED="*i32", SEQ_LENS="*i32", QUERY_LENS="*i64",
                     OPENED="*i64", OPEN_NEXT_N="*i64")
OBSERVE_POINTERS = dict(
    SCORED="*fp32", TOPK="*i32", SEL_VISIBLE="*i64", SLOT="*i64", RANK="*i32",
    PENDING_X="*fp16", PENDING_HITS="*u8", HIT_WORDS="*i32", PENDING_NEWEST="*i64", POSITIONS="*i32",
    ROW_BLOCKS="*i32", SLOT_EMA="*fp16", LAST_SEEN="*i32", STEP="*i64", BUCKET="*i64",
    ROW0_SUM="*i64", ROW0_COUNT="*i32", OFFSET_EMA="*fp32", OFFSET_COUNT="*i32", PREV_HITS="*u8",
    REQ_KEY="*i64", COUNTER="*i64", SHARE="*fp64", BUDGET="*i64", LEFT="*i64",
    ADDITIONS_GAIN="*fp64", GAIN_STEPS="*i32", GAIN="*fp64", EXPLORE_YIELD="*i64", alpha="fp32",
    one_minus_alpha="fp32", w="fp32", one_minus_w="fp32")
COMMIT_POINTERS = dict(
    ROWS_POINTERS, SELECTED="*u8", ROW0_SUM="*i64", ROW0_COUNT="*i32", STEP="*i64", PENDING_X="*fp16",
    PENDING_NEWEST="*i64", SLOT_EMA="*fp16", LAST_SEEN="*i32", OFFSET_EMA="*fp32",
    OFFSET_COUNT="*i32", DIST_LO="*i64", DIST_HI="*i64", alpha="fp32", one_minus_alpha="fp32",
    beta="fp32", one_minus_beta="fp32")

# The constexpr flags _select_kernel.launch passes for each device predictor.
PREDICTORS = {
    "spin": dict(RANKED=True, RANDOM=False, EXPLORES=True, USE_SLOT=True, USE_OFFSET=True,
                 STEP_REUSE=False, TOPK_FIRST=True, ADAPT=True),
    "spin (adapt=0)": dict(RANKED=True, RANDOM=False, EXPLORES=True, USE_SLOT=True,
                           USE_OFFSET=True, STEP_REUSE=False, TOPK_FIRST=True,
                           EXPLORE_CHURN=True),
    "spin (paper's defaults)": dict(RANKED=True, RANDOM=False, EXPLORES=True, USE_SLOT=True,
                                    USE_OFFSET=True, STEP_REUSE=False),
    "prev-iter": dict(RANKED=True, RANDOM=False, EXPLORES=False, USE_SLOT=True,
                      USE_OFFSET=False, STEP_REUSE=False),
    "ema-offset": dict(RANKED=True, RANDOM=False, EXPLORES=False, USE_SLOT=False,
                       USE_OFFSET=True, STEP_REUSE=False),
    "step-reuse": dict(RANKED=True, RANDOM=False, EXPLORES=False, USE_SLOT=False,
                       USE_OFFSET=False, STEP_REUSE=True),
    "random": dict(RANKED=False, RANDOM=True, EXPLORES=False, USE_SLOT=False,
                   USE_OFFSET=False, STEP_REUSE=False),
    "all-keep": dict(RANKED=False, RANDOM=False, EXPLORES=False, USE_SLOT=False,
                     USE_OFFSET=False, STEP_REUSE=False),
}


# The observe kernel's adapt flags off (spin's fixed rule and the other predictors).
OBSERVE_FLAGS = dict(ADAPT=False, WIDTH_PAD=2048, STALEST=False, USE_SLOT=True, USE_OFFSET=True,
                     COMBINE_MAX=False, TOPK_FIRST=True, RADIX=False)


def compile_ptx(fn, pointers, constexprs, **options):
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32")
                 for n in fn.arg_names}
    try:
        k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                           target=HOPPER, options=options)
    except RuntimeError as e:
        if "ptxas" in str(e) or "backend" in str(e).lower():
            print(f"cannot compile for CUDA here: {e}")
            sys.exit(77)
        raise
    assert k.asm["cubin"], "no cubin"
    return k.asm["ptx"]


def _rounds_to_half_as_the_library(ptx):
    """The slot EMA's float32 → binary16 conversions round to nearest even (cvt.rn, as
    half_from_float in src/core/numerics.cpp), never toward zero."""
    return "cvt.rn.f16.f32" in ptx and "cvt.rz.f16" not in ptx


def main():
    compiled = 0
    for name, flags in PREDICTORS.items():
        for stalest, combine_max, next_n, block, radix in ((False, False, 1, 2048, False),
                                                           (True, True, 3, 8192, name == "spin")):
            ptx = compile_ptx(_select_kernel.select_kernel, SELECT_POINTERS,
                              dict(dict(TOPK_FIRST=False, EXPLORE_CHURN=False, ADAPT=False),
                                   **flags,
                                   STALEST=stalest, COMBINE_MAX=combine_max, NEXT_N=next_n,
                                   BLOCK=block, HITS=flags["STEP_REUSE"] or
                                   flags.get("TOPK_FIRST", False), RADIX=radix),
                              num_warps=8, enable_fp_fusion=False)
            assert "fma.rn.f32" not in ptx and "fma.rn.f64" not in ptx, \
                f"select ({name}): a fused multiply-add"
            compiled += 1
    for hits, topk_hits, topk_type, deep, remap in ((False, False, "*i32", False, False),
                                                    (True, False, "*i64", False, False),
                                                    (True, False, "*i32", True, True),  # pool_depth
                                                    (True, True, "*i32", False, True)):
        ptx = compile_ptx(_observe_kernel.observe_kernel, dict(OBSERVE_POINTERS, TOPK=topk_type),
                          dict(OBSERVE_FLAGS, E=64, BLOCK_C=64, BLOCK_K=2048, HITS=hits,
                               TOPK_HITS=topk_hits, DEEP=deep, REMAP=remap, LANES=4,
                               AGES=False),
                          num_warps=4, enable_fp_fusion=False)
        assert "div.rn.f64" in ptx and "div.approx" not in ptx, "observe: not IEEE division"
        assert "fma.rn.f64" not in ptx and "fma.rn.f32" not in ptx, "observe: a fused multiply-add"
        assert _rounds_to_half_as_the_library(ptx), "observe: binary16 not rounded to nearest even"
        compiled += 1
    # Row 0's slot EMA with stalest exploration's int32 last-seen steps.
    ptx = compile_ptx(_observe_kernel.observe_kernel, OBSERVE_POINTERS,
                      dict(OBSERVE_FLAGS, E=64, BLOCK_C=64, BLOCK_K=2048, HITS=True,
                           TOPK_HITS=False, DEEP=False, REMAP=True, LANES=4, AGES=True),
                      num_warps=4, enable_fp_fusion=False)
    assert "fma.rn.f32" not in ptx, "observe (ages): a fused multiply-add"
    compiled += 1
    # adapt (spin's default): the row-0 program measures the rows over the selected blocks —
    # 2,048 of them at 128K, 8,192 at 512K (8 warps, as observe launches it).
    for width_pad, warps, stalest, combine_max, topk_first, radix in (
            (2048, 8, False, False, True, False), (8192, 8, True, True, False, True)):
        ptx = compile_ptx(_observe_kernel.observe_kernel, OBSERVE_POINTERS,
                          dict(OBSERVE_FLAGS, E=64, BLOCK_C=64, BLOCK_K=2048, HITS=True,
                               TOPK_HITS=False, DEEP=True, REMAP=True, LANES=4, AGES=stalest,
                               ADAPT=True, WIDTH_PAD=width_pad, STALEST=stalest,
                               COMBINE_MAX=combine_max, TOPK_FIRST=topk_first, RADIX=radix),
                          num_warps=warps, enable_fp_fusion=False)
        assert "fma.rn.f32" not in ptx and "fma.rn.f64" not in ptx, "observe (adapt): an FMA"
        assert "div.rn.f64" in ptx and "div.approx" not in ptx, "observe (adapt): not IEEE"
        compiled += 1
    for next_n, bp in ((1, 1), (4, 2)):  # compaction, the engine's int32 tables, int64 seq_lens
        compile_ptx(_paging_kernel._compact_kernel,
                    dict(BLOCKS="*i32", COUNTS="*i32", TABLE_IN="*i32", SEQ="*i64", TABLE="*i32",
                         LENGTHS="*i32", COUNTERS="*i64"),
                    dict(NEXT_N=next_n, BP=bp, PAD=0, TILE=_paging_kernel.TILE, COUNT=next_n > 1),
                    num_warps=4)
        compiled += 1
    compile_ptx(_paging_kernel._remap_kernel, dict(TOPK="*i32", BLOCKS="*i32", OUT="*i32"),
                dict(TILE=_paging_kernel.REMAP_TILE), num_warps=4)
    compiled += 1
    for churn, adapt in ((False, True), (True, False)):
        ptx = compile_ptx(_commit_kernel.close_kernel,
                          dict(ROWS_POINTERS, SELECTED="*u8", PREFILL_OPEN="*u8",
                               PENDING_HITS="*u8", PREV_HITS="*u8", CHURN_EMA="*fp64",
                               EXPLORE_SHARE="*fp64", CONSTANTS="*fp64", ADDITIONS_GAIN="*fp64",
                               GAIN_STEPS="*i32", GAIN="*fp64", EXPLORE_YIELD="*i64", ADAPT_CONSTANTS="*fp64"),
                          dict(KEEPS_TOPK=True, EXPLORE_CHURN=churn, ADAPT=adapt, BLOCK=1024,
                               MODE=0, FROM_LENGTHS=churn),
                          num_warps=4, enable_fp_fusion=False)
        assert "fma.rn.f64" not in ptx and "div.approx" not in ptx, "close: FMA or approximate division"
        compiled += 1
    compile_ptx(_commit_kernel.finish_kernel, dict(SLOT="*i64", SELECTED="*u8", PREFILL_OPEN="*u8",
                                                   STEP="*i64"), dict(L_PAD=64), num_warps=1)
    compiled += 1
    ptx = compile_ptx(_commit_kernel.commit_kernel, COMMIT_POINTERS,
                      dict(BLOCK=1024, MODE=0, FROM_LENGTHS=True, AGES=False, K_PAD=128),
                      num_warps=4,
                      enable_fp_fusion=False)
    assert "fma.rn.f32" not in ptx and "fma.rn.f64" not in ptx, "commit: a fused multiply-add"
    assert "div.rn.f64" in ptx and "div.approx" not in ptx, "commit: not IEEE division"
    assert _rounds_to_half_as_the_library(ptx), "commit: binary16 not rounded to nearest even"
    compiled += 1
    compile_ptx(_commit_kernel.prefill_open_kernel,
                dict(SLOT="*i64", SEQ_LENS="*i64", SELECTED="*u8", PREFILL_OPEN="*u8",
                     OPEN_NEXT_N="*i64", OPENED="*i64", VISIBLE="*i64", PENDING_X="*fp16",
                     PENDING_HITS="*u8", ROW0_SUM="*i64", ROW0_COUNT="*i32", GAIN="*fp64",
                     EXPLORE_YIELD="*i64"),
                dict(BLOCK=2048, HITS=True, ADAPT=True), num_warps=4)
    ptx = compile_ptx(_commit_kernel.prefill_offsets_kernel,
                      dict(SLOT="*i64", ROW0_SUM="*i64", ROW0_COUNT="*i32", OFFSET_EMA="*fp32",
                           OFFSET_COUNT="*i32", beta="fp32", one_minus_beta="fp32"),
                      dict(K_PAD=128), num_warps=1, enable_fp_fusion=False)
    assert "fma.rn.f32" not in ptx and "div.rn.f64" in ptx, "prefill offsets: FMA or not IEEE"
    compiled += 2
    print(f"compiled {compiled} kernel variants for sm_90")


if __name__ == "__main__":
    main()
