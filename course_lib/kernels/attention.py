"""Lesson 10: flash attention, o = softmax(q·kᵀ·scale)·v, forward and backward in Triton.

The forward gives each program a block of queries of one (batch, head) and streams the
keys and values past it in blocks: lesson 04's online softmax, applied to a block of
scores at a time, keeps each query's running max m and running sum l, rescales the
accumulator by exp2(m_old - m_new) whenever the max grows, and divides by l once at the
end. The scale is folded into the base-2 exponent (scale · log2(e)), so each score costs
one multiply before exp2. The natural-log logsumexp, lse = m + log(l), is saved: all the
backward needs to recompute the softmax, P = exp(S·scale - lse). Causal attention (SDPA's
top-left diagonal, query i sees keys j <= i) skips the key blocks above the diagonal and
masks only the blocks the diagonal crosses.

The backward first computes D = rowsum(dO · O) per query, then dK and dV with one program
per block of keys (looping over the queries, and over the query heads that share a kv
head in grouped-query attention), and dQ with one program per block of queries. Each
gradient is summed by one program in a fixed order: the same on every run, with no
atomics. Memory is O(N): o, lse and D besides the inputs and gradients, never the
[Nq, Nk] scores.

`attention` follows torch.nn.functional.scaled_dot_product_attention. What a call works
out once (the checks, each kernel's tile and launch) and the autograd Function are in
attention_plans.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.gpu_timer import autotune_timer
from course_lib.kernels import attention_plans as plans
from course_lib.kernels._launch import LeanLauncher

DTYPES, HEAD_DIMS = plans.DTYPES, plans.HEAD_DIMS  # what attention takes
check_arguments = plans.check_arguments  # course_lib.ops checks before it traces
# base-2 and natural logarithms: the kernels keep their running statistics in base 2
LOG2E: tl.constexpr = tl.constexpr(plans.LOG2E)  # the host folds it into the scale too
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _key_blocks(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(end, unmasked) for the queries from start_m: their key blocks are [0, end), causal
    stopping at the diagonal; those before `unmasked` every query sees in full and need no
    mask, the rest (the partial last block, the blocks the diagonal crosses) do."""
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, N_K)
        unmasked = tl.minimum(start_m + 1, N_K) // BLOCK_N * BLOCK_N
    else:
        end = N_K
        unmasked = N_K // BLOCK_N * BLOCK_N
    return end, unmasked


@triton.jit
def _forward_blocks(
    acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, start, end, N_K,
    QK_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """The online softmax over the key blocks [start, end): each block's scores, in log2
    units, update the running max m_i, the running sum l_i and the accumulator acc."""
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=offs_n[:, None] < N_K, other=0.0)  # fmt: skip
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=offs_n[:, None] < N_K, other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * QK_SCALE  # [BM, BN]
        if MASKED:  # keys past N_K, and above the diagonal: -inf, so exp2 gives them 0
            visible = offs_n[None, :] < N_K
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)  # what the sums so far are worth on the new max's scale
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om,
    B, H, N_Q, N_K, GROUP,
    QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, ACC_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """o [B, H, N_Q, d] and lse [B, H, N_Q] for one block of BLOCK_M queries of one
    (batch, head): program_id(0) the block, program_id(1) = batch * H + head. Query head h
    reads kv head h // GROUP. B is unused here: it is passed so that the grid a lean launch
    keeps for the autotuner's choice is keyed by it."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), bh % H
    kv_h = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < N_Q, other=0.0)  # fmt: skip
    k_base = k_ptr + b * stride_kb + kv_h * stride_kh
    v_base = v_ptr + b * stride_vb + kv_h * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), ACC_DTYPE)
    l_i = tl.zeros([BLOCK_M], ACC_DTYPE)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], ACC_DTYPE)
    end, unmasked = _key_blocks(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _forward_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
        offs_d, 0, unmasked, N_K, QK_SCALE, BLOCK_N, False, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _forward_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
        offs_d, unmasked, end, N_K, QK_SCALE, BLOCK_N, True, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip
    o = acc / l_i[:, None]  # normalised once, at the end
    o_base = o_ptr + b * stride_ob + h * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < N_Q)  # fmt: skip
    lse = (m_i + tl.log2(l_i)) * LN2  # base 2 to natural log
    tl.store(lse_ptr + bh.to(tl.int64) * N_Q + offs_m, lse.to(lse_ptr.dtype.element_ty),
             mask=offs_m < N_Q)  # fmt: skip


@triton.jit
def attention_bwd_delta_kernel(
    o_ptr, do_ptr, delta_ptr, stride_ob, stride_oh, stride_om, stride_dob, stride_doh,
    stride_dom, stride_dod, H, N_Q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """D = rowsum(dO · O) [B, H, N_Q] (float32, float64 for float64 inputs), for BLOCK_M
    queries of one (batch, head)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = offs_m[:, None] < N_Q
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om
                + offs_d[None, :], mask=mask, other=0.0)  # fmt: skip
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0)  # fmt: skip
    delta = tl.sum(o.to(ACC_DTYPE) * do.to(ACC_DTYPE), axis=1)
    tl.store(delta_ptr + bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _dkdv_blocks(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom,
    stride_dod, offs_n, offs_d, start, end, N_Q,
    QK_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV's sums over the query blocks [start, end) of one query head, with Pᵀ
    recomputed from the lse; MASKED: the blocks the causal diagonal crosses."""
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m[None, :] < N_Q
        q_t = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                      mask=rows, other=0.0)  # [HEAD_DIM, BLOCK_M]  # fmt: skip
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=offs_m[:, None] < N_Q, other=0.0)  # fmt: skip
        # queries past N_Q get lse = inf, so their P is 0
        lse = tl.load(lse_base + offs_m, mask=offs_m < N_Q, other=float("inf"))
        lse = lse * LOG2E  # natural log to base 2
        s_t = tl.dot(k, q_t, input_precision=INPUT_PRECISION) * QK_SCALE  # [BLOCK_N, BLOCK_M]
        p_t = tl.exp2(s_t - lse[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=INPUT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, H_KV, N_Q, N_K, GROUP,
    SCALE: tl.constexpr, QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, ACC_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV [B, H_KV, N_K, d] for one block of BLOCK_N keys of one (batch, kv head),
    summed over the GROUP query heads that read it, one after the other."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, kv_h = (bh // H_KV).to(tl.int64), (bh % H_KV).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < N_K
    k = tl.load(k_ptr + b * stride_kb + kv_h * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=keys, other=0.0)  # fmt: skip
    v = tl.load(v_ptr + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=keys, other=0.0)  # fmt: skip
    dk = tl.zeros([BLOCK_N, HEAD_DIM], ACC_DTYPE)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], ACC_DTYPE)
    # causal: the queries from the block holding query start_n on see these keys; those
    # before the first block that sees all of them are masked
    start = start_n // BLOCK_M * BLOCK_M if CAUSAL else 0
    unmasked = tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M if CAUSAL else 0
    unmasked = tl.minimum(unmasked, N_Q)
    for g in range(0, GROUP):  # the query heads of this kv head, in a fixed order
        h = kv_h * GROUP + g
        q_base = q_ptr + b * stride_qb + h * stride_qh
        do_base = do_ptr + b * stride_dob + h * stride_doh
        rows = (b * H_KV * GROUP + h) * N_Q
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, lse_ptr + rows, delta_ptr + rows, stride_qm,
            stride_qd, stride_dom, stride_dod, offs_n, offs_d, start, unmasked, N_Q, QK_SCALE,
            BLOCK_M, True, INPUT_PRECISION,
        )  # fmt: skip
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, lse_ptr + rows, delta_ptr + rows, stride_qm,
            stride_qd, stride_dom, stride_dod, offs_n, offs_d, tl.maximum(start, unmasked),
            N_Q, N_Q, QK_SCALE, BLOCK_M, False, INPUT_PRECISION,
        )  # fmt: skip
    out = b * stride_dkb + kv_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :]
    tl.store(dk_ptr + out, (dk * SCALE).to(dk_ptr.dtype.element_ty), mask=keys)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=keys)


@triton.jit
def _dq_blocks(
    dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, start, end, N_K,
    QK_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ's sum over the key blocks [start, end) for one block of queries, with P
    recomputed from the lse; MASKED: the partial last block and the blocks the causal
    diagonal crosses."""
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=offs_n[:, None] < N_K, other=0.0)  # fmt: skip
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=offs_n[:, None] < N_K, other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * QK_SCALE
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            # keys past N_K score 0, not -inf: where every real score is far below 0, their
            # p overflows, and inf times their k of 0 would put NaN into dq
            seen = offs_n[None, :] < N_K
            if CAUSAL:
                seen &= offs_n[None, :] <= offs_m[:, None]
            p = tl.where(seen, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, H, N_Q, N_K, GROUP,
    SCALE: tl.constexpr, QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, ACC_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ [B, H, N_Q, d] for one block of BLOCK_M queries of one (batch, head). When causal,
    program 0 takes the last block: the last blocks see the most keys, and programs usually
    start in the order of their ids (axis 0 fastest), so within each head the long ones start
    first and the short ones fill in at the end."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    start_m = pid_m * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), bh % H
    kv_h = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < N_Q
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=rows, other=0.0)  # fmt: skip
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=rows, other=0.0)  # fmt: skip
    lse = tl.load(lse_ptr + bh.to(tl.int64) * N_Q + offs_m, mask=offs_m < N_Q, other=0.0)
    lse = lse * LOG2E  # natural log to base 2
    delta = tl.load(delta_ptr + bh.to(tl.int64) * N_Q + offs_m, mask=offs_m < N_Q, other=0.0)
    k_base = k_ptr + b * stride_kb + kv_h * stride_kh
    v_base = v_ptr + b * stride_vb + kv_h * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], ACC_DTYPE)
    end, unmasked = _key_blocks(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_blocks(
        dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, 0, unmasked, N_K, QK_SCALE, BLOCK_N, False, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip
    dq = _dq_blocks(
        dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, unmasked, end, N_K, QK_SCALE, BLOCK_N, True, CAUSAL, INPUT_PRECISION,
    )  # fmt: skip
    out = b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
    tl.store(dq_ptr + out, (dq * SCALE).to(dq_ptr.dtype.element_ty), mask=rows)


# --- the tiles ---------------------------------------------------------------------------------
# (BLOCK_M, BLOCK_N, num_warps, num_stages) by head dimension, for 2-byte inputs on a GPU;
# the backward's for its dK/dV kernel (few queries a step, many keys kept) and its dQ kernel
# (the reverse). Wider heads hold more registers per row: smaller tiles. Timed on an H200 at
# N = 4096, causal and not, the backward's tiles at d = 128 came within 2% of the best of 16
# (dK/dV) and 13 (dQ) tried, d = 64's within 3% of the best of 10 and 8.
FORWARD_TILES = {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 4, 3),
                 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}  # fmt: skip
DKDV_TILES = {16: (32, 128, 4, 3), 32: (32, 128, 4, 3), 64: (32, 128, 4, 3),
              128: (64, 128, 8, 3), 256: (32, 64, 8, 1)}  # fmt: skip
DQ_TILES = {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 3),
            128: (128, 64, 8, 3), 256: (64, 32, 8, 1)}  # fmt: skip
WIDE_TILES = (32, 32, 4, 1)  # 4- and 8-byte inputs: half the elements fit the same memory
INTERPRETER_TILES = (32, 32, 4, 1)  # few, cheap steps: the interpreter pays per operation
TUNED_FROM = 1 << 20  # Nq·Nk from which the forward's tile is autotuned on a GPU

# the forward's candidates on a GPU, for head dimensions up to 128
FORWARD_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st)
    for m, n, w, st in [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3),
                        (128, 128, 8, 2), (128, 64, 4, 4)]
]  # fmt: skip
attention_fwd_autotuned = triton.autotune(
    configs=FORWARD_CONFIGS, key=["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "INPUT_PRECISION"],
    do_bench=autotune_timer,
)(attention_fwd_kernel)  # fmt: skip

# each kernel[grid], lean (see _launch.py), handed with the tiles to the plans that bind
# them once per signature of a call (see attention_plans.py)
forward_launcher = LeanLauncher(attention_fwd_kernel)
forward_autotuned_launcher = LeanLauncher(attention_fwd_autotuned)
delta_launcher = LeanLauncher(attention_bwd_delta_kernel)
dkdv_launcher = LeanLauncher(attention_bwd_dkdv_kernel)
dq_launcher = LeanLauncher(attention_bwd_dq_kernel)
KERNELS = plans.Kernels(
    forward_launcher, forward_autotuned_launcher, delta_launcher, dkdv_launcher, dq_launcher,
    FORWARD_TILES, DKDV_TILES, DQ_TILES, WIDE_TILES, INTERPRETER_TILES, TUNED_FROM,
)  # fmt: skip


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """softmax(q·kᵀ·scale)·v as torch.nn.functional.scaled_dot_product_attention (with
    enable_gqa), differentiable: q [B, H, Nq, d], k and v [B, Hkv, Nk, d] with H a multiple
    of Hkv, any strides; d in 16, 32, 64, 128, 256; float16, bfloat16 (GPU), float32,
    float64. `causal` as SDPA's is_causal: query i sees keys j <= i. scale defaults to
    1/sqrt(d). float32 uses TF32 where torch's matmuls would (allow_tf32, or the newer
    fp32_precision settings)."""
    # the checks, the tile, the grid and the bound launch, worked out on the first call with
    # tensors laid out like these; each call allocates o and lse and launches
    plan = plans.forward_plan(q, k, v, causal, scale, KERNELS)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return plan(q, k, v)[0]  # nothing to differentiate: no autograd bookkeeping, no lse kept
    return plans.AttentionFunction.apply(q, k, v, causal, scale, plan)


# the forward and the backward apart, for course_lib.ops's operators


def forward(q, k, v, causal: bool = False, scale: float | None = None):
    """(o, lse): attention's output, like q, and the natural-log logsumexp of each query's
    scaled scores, [B, H, Nq] float32 (float64 for float64 inputs)."""
    return plans.forward_plan(q, k, v, causal, scale, KERNELS)(q, k, v)


def backward(do, q, k, v, o, lse, causal: bool = False, scale: float | None = None):
    """(dq, dk, dv) for the output's gradient do, from the forward's o and lse; dk and dv
    [B, Hkv, Nk, d], summed over the query heads that share a kv head."""
    return plans.backward(do, q, k, v, o, lse, causal, scale, KERNELS)
