"""Lesson 10's flash forward on Hopper GPUs, with q, k, v and o moved by the TMA unit
(appendix 10b): attention's forward plans (attention_plans.py) launch it where it suits.

The kernel is attention_fwd_kernel's, step for step: one program per block of queries of
one (batch, head), the keys and values streamed past in blocks, the online softmax in
base-2 units, o divided by the running sum once at the end and the natural-log lse
saved. What changes is how tiles move. Each input is read through a 4-D tensor
descriptor over [B, heads, N, d]: a block of keys is one request to the TMA unit, which
copies it into shared memory on its own, while the warps compute, and fills the rows past N
with zeros, where the lesson's kernel computes an address and a mask per element and holds
the addresses in registers. Measured on an H200 (bf16, d = 128, N = 4096), the forward ran
13-18% faster than the lesson's kernel at the same tile, and 11-17% causal, where the
lesson's kernel runs a 128 x 64 one (three runs); at smaller heads it gained nothing, and is
not taken (figures in appendix 10b).

The backward's dK/dV and dQ kernels are attention.py's likewise, with q, k, v and dO read
and dK, dV and dQ written through descriptors; each is taken at the head dimensions where it
measured faster than the lesson's (TMA_DKDV_TILES, TMA_DQ_TILES).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import into_graph
from course_lib.kernels.hopper import TMA_GPUS, capability, descriptor

# (BLOCK_M, BLOCK_N, num_warps, num_stages) by head dimension, for the head dimensions this
# kernel takes: measured on an H200 (bf16, N of 1024 and 4096), it ran 10-16% faster than
# the lesson's kernel at d = 128, but level with it causal at N = 1024; at d = 64 and 32 the
# best of four tiles tried ran within 5% of the lesson's kernel either way, so the lesson's
# kernel keeps those (and d = 256, whose rows need its smaller tiles)
TMA_TILES = {128: (128, 128, 8, 3)}
# the backward's, likewise, timed alone on an H200 (bf16, N = 4096) against the lesson's
# kernels at the same tiles: dK/dV 1.05x at d = 128 (1.03x causal), level at d = 64, where
# the lesson's kernel keeps it; dQ 1.09x at d = 128 (1.02x causal) and 1.11x at d = 64
# (1.13x causal)
TMA_DKDV_TILES = {128: (64, 128, 8, 3)}
TMA_DQ_TILES = {128: (128, 64, 8, 3), 64: (64, 64, 4, 3)}
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
LOG2E: tl.constexpr = tl.constexpr(math.log2(math.e))


@triton.jit
def _key_blocks(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """attention._key_blocks, written out: attention.py reaches this module through its
    plans, and importing it from here would close a circle. (end, unmasked): the key blocks
    a block of queries from start_m sees end at `end`; those from `unmasked` on need masks."""
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, N_K)
        unmasked = tl.minimum(start_m + 1, N_K) // BLOCK_N * BLOCK_N
    else:
        end = N_K
        unmasked = N_K // BLOCK_N * BLOCK_N
    return end, unmasked


@triton.jit
def _tma_blocks(
    acc, l_i, m_i, q, k_desc, v_desc, b, kv_h, offs_m, start, end, N_K,
    QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """attention._forward_blocks with each block of keys and values one TMA copy; with
    WARP_SPECIALIZE, some warps only issue the copies while the others compute."""
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * QK_SCALE  # [BLOCK_M, BLOCK_N], log2 units
        if MASKED:  # keys past N_K, and above the diagonal: -inf, so exp2 gives them 0
            offs_n = start_n + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] < N_K
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_fwd_tma_kernel(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N_Q, N_K, GROUP,
    QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """o and lse for one block of BLOCK_M queries of one (batch, head), as
    attention_fwd_kernel computes them: program_id(0) the block, program_id(1) = batch * H
    + head; query head h reads kv head h // GROUP. WARP_SPECIALIZE: the unmasked blocks'
    loop warp-specialised (appendix 10b measures it)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kv_h = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end, unmasked = _key_blocks(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _tma_blocks(
        acc, l_i, m_i, q, k_desc, v_desc, b, kv_h, offs_m, 0, unmasked, N_K, QK_SCALE,
        HEAD_DIM, BLOCK_N, False, CAUSAL, WARP_SPECIALIZE,
    )  # fmt: skip
    acc, l_i, m_i = _tma_blocks(
        acc, l_i, m_i, q, k_desc, v_desc, b, kv_h, offs_m, unmasked, end, N_K, QK_SCALE,
        HEAD_DIM, BLOCK_N, True, CAUSAL, False,
    )  # fmt: skip
    o = (acc / l_i[:, None]).to(o_desc.dtype)  # rows past N_Q: the unit clips the store
    o_desc.store([b, h, start_m, 0], o.reshape(1, 1, BLOCK_M, HEAD_DIM))
    lse = (m_i + tl.log2(l_i)) * LN2
    tl.store(lse_ptr + bh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)


forward_tma_launcher = LeanLauncher(attention_fwd_tma_kernel)


# --- the backward ------------------------------------------------------------------------------


@triton.jit
def _dkdv_tma_blocks(
    dk, dv, k, v, q_desc, do_desc, lse_base, delta_base, b, h, offs_n, start, end, N_Q,
    QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
):  # fmt: skip
    """attention._dkdv_blocks with each block of q and dO one TMA copy. Queries past N_Q
    come zero-filled, and their lse of +inf makes their P 0."""
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        lse = tl.load(lse_base + offs_m, mask=offs_m < N_Q, other=float("inf")) * LOG2E
        p_t = tl.exp2(tl.dot(k, tl.trans(q)) * QK_SCALE - lse[None, :])  # P^T [keys, queries]
        if MASKED:  # the causal diagonal: key n sees queries m >= n
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do)
        delta = tl.load(delta_base + offs_m, mask=offs_m < N_Q, other=0.0)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def attention_dkdv_tma_kernel(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, H_KV, N_Q, GROUP,
    SCALE: tl.constexpr, QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """dK and dV for one block of BLOCK_N keys of one (batch, kv head), summed over the
    GROUP query heads that read it, as attention_bwd_dkdv_kernel computes them; rows past
    N_K the unit clips on the stores."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, kv_h = bh // H_KV, bh % H_KV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = k_desc.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    v = v_desc.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    start = start_n // BLOCK_M * BLOCK_M if CAUSAL else 0
    unmasked = tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M if CAUSAL else 0
    unmasked = tl.minimum(unmasked, N_Q)
    for g in range(0, GROUP):
        h = kv_h * GROUP + g
        rows = (b * H_KV * GROUP + h).to(tl.int64) * N_Q
        dk, dv = _dkdv_tma_blocks(
            dk, dv, k, v, q_desc, do_desc, lse_ptr + rows, delta_ptr + rows, b, h, offs_n,
            start, unmasked, N_Q, QK_SCALE, HEAD_DIM, BLOCK_M, True,
        )  # fmt: skip
        dk, dv = _dkdv_tma_blocks(
            dk, dv, k, v, q_desc, do_desc, lse_ptr + rows, delta_ptr + rows, b, h, offs_n,
            tl.maximum(start, unmasked), N_Q, N_Q, QK_SCALE, HEAD_DIM, BLOCK_M, False,
        )  # fmt: skip
    dk = (dk * SCALE).to(dk_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM)
    dk_desc.store([b, kv_h, start_n, 0], dk)
    dv_desc.store([b, kv_h, start_n, 0], dv.to(dv_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))


@triton.jit
def _dq_tma_blocks(
    dq, q, do, lse, delta, k_desc, v_desc, b, kv_h, offs_m, start, end, N_K,
    QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """attention._dq_blocks with each block of k and v one TMA copy."""
    for start_n in range(start, end, BLOCK_N):
        k = k_desc.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([b, kv_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * QK_SCALE - lse[:, None])
        if MASKED:  # zero-filled keys score 0, whose p may overflow: masked, as in attention
            offs_n = start_n + tl.arange(0, BLOCK_N)
            seen = offs_n[None, :] < N_K
            if CAUSAL:
                seen &= offs_n[None, :] <= offs_m[:, None]
            p = tl.where(seen, p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def attention_dq_tma_kernel(
    q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, H, N_Q, N_K, GROUP,
    SCALE: tl.constexpr, QK_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """dQ for one block of BLOCK_M queries of one (batch, head), as attention_bwd_dq_kernel
    computes it, the last blocks first when causal."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    start_m = pid_m * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kv_h = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    rows = bh.to(tl.int64) * N_Q + offs_m
    lse = tl.load(lse_ptr + rows, mask=offs_m < N_Q, other=0.0) * LOG2E
    delta = tl.load(delta_ptr + rows, mask=offs_m < N_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end, unmasked = _key_blocks(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_tma_blocks(
        dq, q, do, lse, delta, k_desc, v_desc, b, kv_h, offs_m, 0, unmasked, N_K, QK_SCALE,
        HEAD_DIM, BLOCK_N, False, CAUSAL,
    )  # fmt: skip
    dq = _dq_tma_blocks(
        dq, q, do, lse, delta, k_desc, v_desc, b, kv_h, offs_m, unmasked, end, N_K, QK_SCALE,
        HEAD_DIM, BLOCK_N, True, CAUSAL,
    )  # fmt: skip
    dq = (dq * SCALE).to(dq_desc.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM)
    dq_desc.store([b, h, start_m, 0], dq)  # rows past N_Q: the unit clips the store


dkdv_tma_launcher = LeanLauncher(attention_dkdv_tma_kernel)
dq_tma_launcher = LeanLauncher(attention_dq_tma_kernel)


def suits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attention_fwd_tma_kernel takes these checked inputs: on the GPUs in TMA_GPUS,
    float16 or bfloat16, a head dimension in TMA_TILES (128), outside torch.compile's tracing
    (a graph records no descriptor built on the host), and every input as the TMA unit
    reads it: its last axis contiguous, the others a multiple of 16 bytes apart (not 0, as in
    a tensor expanded over heads), from a 16-byte aligned start."""
    return tma_suits(TMA_TILES, q, k, v)


def tma_suits(tiles: dict, *tensors: torch.Tensor) -> bool:
    """Whether the TMA kernel whose tiles are `tiles` (TMA_TILES, TMA_DKDV_TILES,
    TMA_DQ_TILES) takes these checked tensors, q first, all read through descriptors: the
    rules `suits` lists for the forward's."""
    q = tensors[0]
    if runtime.INTERPRETED or into_graph() or capability(q.get_device()) not in TMA_GPUS:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] not in tiles:
        return False
    return all(
        t.stride(-1) == 1
        and all(s > 0 and s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
        and t.data_ptr() % 16 == 0
        for t in tensors
    )


def _layout(t: torch.Tensor, block: int) -> tuple[list, list, list]:
    """The shape, strides and box of a descriptor over `t` [B, heads, N, d] that reads
    blocks of `block` rows of one (batch, head)."""
    return list(t.shape), list(t.stride()), [1, 1, block, t.shape[-1]]


def _contiguous_layout(shape, block: int) -> tuple[list, list, list]:
    """_layout of a contiguous tensor of this shape, which a plan makes for its outputs."""
    heads, n, d = shape[1:]
    return list(shape), [heads * n * d, n * d, d, 1], [1, 1, block, d]


def forward_launch(
    q, k, v, causal: bool, scale: float, tile: tuple | None = None, warp_specialize=False
) -> Callable:
    """For inputs laid out like these (suits(q, k, v)): a function of (q, k, v, o, lse) that
    fills o, a contiguous [B, H, Nq, d] of q's dtype, and lse [B, H, Nq] float32, its launch
    bound once. `tile`
    (BLOCK_M, BLOCK_N, num_warps, num_stages) and `warp_specialize` for experiments: by
    default TMA_TILES' tile, not specialised."""
    (B, H, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
    block_m, block_n, warps, stages = tile or TMA_TILES[d]
    meta = dict(QK_SCALE=scale * math.log2(math.e), HEAD_DIM=d, BLOCK_M=block_m,
                BLOCK_N=block_n, CAUSAL=causal, WARP_SPECIALIZE=warp_specialize,
                num_warps=warps, num_stages=stages)  # fmt: skip
    launch = BoundLaunch(forward_tma_launcher, (triton.cdiv(n_q, block_m), B * H), meta)
    sizes = (H, n_q, n_k, H // h_kv)
    # each tensor's shape, strides and box, which the plan's signature fixes
    layouts = [_layout(q, block_m), _layout(k, block_n), _layout(v, block_n)]
    layouts.append(_contiguous_layout(q.shape, block_m))

    def run(q, k, v, o, lse) -> None:
        descs = [descriptor(t, *layout) for t, layout in zip((q, k, v, o), layouts)]
        launch(*descs, lse, *sizes)

    return run


def _backward_meta(q, causal: bool, scale: float, tile: tuple) -> dict:
    block_m, block_n, warps, stages = tile
    return dict(SCALE=scale, QK_SCALE=scale * math.log2(math.e), HEAD_DIM=q.shape[-1],
                BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, num_warps=warps,
                num_stages=stages)  # fmt: skip


def dkdv_launch(q, k, v, do, causal: bool, scale: float, tile: tuple | None = None) -> Callable:
    """For tensors laid out like these (tma_suits(TMA_DKDV_TILES, q, k, v, do)): a
    function of (q, k, v, do, lse, delta, dk, dv) that fills dk and dv, contiguous
    [B, Hkv, Nk, d], its launch bound once; `tile` for experiments."""
    (B, H, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
    tile = tile or TMA_DKDV_TILES[d]
    block_m, block_n = tile[:2]
    grid = (triton.cdiv(n_k, block_n), B * h_kv)
    launch = BoundLaunch(dkdv_tma_launcher, grid, _backward_meta(q, causal, scale, tile))
    sizes = (h_kv, n_q, H // h_kv)
    layouts = [_layout(q, block_m), _layout(k, block_n), _layout(v, block_n), _layout(do, block_m)]
    layouts += [_contiguous_layout(k.shape, block_n)] * 2

    def run(q, k, v, do, lse, delta, dk, dv) -> None:
        descs = [descriptor(t, *layout) for t, layout in zip((q, k, v, do, dk, dv), layouts)]
        launch(*descs, lse, delta, *sizes)

    return run


def dq_launch(q, k, v, do, causal: bool, scale: float, tile: tuple | None = None) -> Callable:
    """For tensors laid out like these (tma_suits(TMA_DQ_TILES, q, k, v, do)): a
    function of (q, k, v, do, lse, delta, dq) that fills dq, contiguous [B, H, Nq, d], its
    launch bound once; `tile` for experiments."""
    (B, H, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
    tile = tile or TMA_DQ_TILES[d]
    block_m, block_n = tile[:2]
    grid = (triton.cdiv(n_q, block_m), B * H)
    launch = BoundLaunch(dq_tma_launcher, grid, _backward_meta(q, causal, scale, tile))
    sizes = (H, n_q, n_k, H // h_kv)
    layouts = [_layout(q, block_m), _layout(k, block_n), _layout(v, block_n), _layout(do, block_m)]
    layouts.append(_contiguous_layout(q.shape, block_m))

    def run(q, k, v, do, lse, delta, dq) -> None:
        descs = [descriptor(t, *layout) for t, layout in zip((q, k, v, do, dq), layouts)]
        launch(*descs, lse, delta, *sizes)

    return run
