"""The host path of lesson 10's flash attention: what `attention` (attention.py) works out
once per signature of its arguments and keeps (see _plan.py). The checks; each kernel's
tile (the forward's autotuned on a GPU for long sequences, or taken from its tile table:
see tile_table.py) and its launch, bound once; the backward's three launches; and
`AttentionFunction`, which joins forward and backward for autograd. attention.py hands in
its launchers and tile tables (`Kernels`), so that nothing here imports it back.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton.language as tl
from torch.autograd.function import once_differentiable

from course_lib import runtime
from course_lib.kernels import attention_tma
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import PlanCache, signature, uses_tf32

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HEAD_DIMS = (16, 32, 64, 128, 256)
LOG2E = math.log2(math.e)  # the kernels' LOG2E: scores in base-2 units for exp2
MAX_HEADS = 65535  # B * H: CUDA's limit on the grid's second axis, one (batch, head) each

Tile = tuple[int, int, int, int]  # (BLOCK_M, BLOCK_N, num_warps, num_stages)


class Kernels(NamedTuple):
    """attention.py's launchers and tiles: a table of tiles by head dimension per kernel,
    for 2-byte inputs; `wide_tile` for 4- and 8-byte ones; `interpreter_tile` in the
    interpreter; the forward autotuned instead (see tile_table.py), on a GPU, from
    `tuned_from` = Nq·Nk."""

    forward: LeanLauncher
    forward_autotuned: LeanLauncher
    delta: LeanLauncher
    dkdv: LeanLauncher
    dq: LeanLauncher
    forward_tiles: dict[int, Tile]
    dkdv_tiles: dict[int, Tile]
    dq_tiles: dict[int, Tile]
    wide_tile: Tile
    interpreter_tile: Tile
    tuned_from: int


def check_arguments(q, k, v, causal, scale) -> None:
    """Raise a clear error unless q [B, H, Nq, d], k and v [B, Hkv, Nk, d] fit attention."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention expects tensors; {name} is a {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention: {name} must be [B, heads, N, d], got {list(t.shape)}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(
            f"attention: q, k and v must share one dtype of {names}; got {q.dtype}, "
            f"{k.dtype}, {v.dtype}"
        )
    if q.dtype != torch.float64:  # float64 is for gradcheck, in either mode
        runtime.require_supported_dtype(q.dtype, "attention")
    if k.device != q.device or v.device != q.device or q.device.type != runtime.DEVICE.type:
        raise ValueError(
            f"attention: q, k and v must all be on {runtime.DEVICE}; got {q.device}, "
            f"{k.device}, {v.device}"
        )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"attention: k and v must be [B, Hkv, Nk, d] with q's B and d; got q "
            f"{list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"attention: head dimension d={q.shape[-1]}; use one of {HEAD_DIMS}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"attention: q's {q.shape[1]} heads must be a multiple of k's and v's {k.shape[1]}"
            " (grouped-query attention)"
        )
    if k.shape[2] == 0 and q.shape[2] > 0:
        raise ValueError("attention: no keys (Nk = 0): every query's softmax would be empty")
    # each (batch, head) is one program along the grid's second axis, which CUDA caps
    if q.shape[0] * q.shape[1] > MAX_HEADS:
        raise ValueError(
            f"attention: B * H = {q.shape[0] * q.shape[1]} heads in all, more than the "
            f"{MAX_HEADS} a launch's grid holds; call it on slices of the batch, "
            f"q[i:i + n], of at most {MAX_HEADS // q.shape[1]} sequences each"
        )
    if type(causal) is not bool:
        raise TypeError(f"attention: causal must be True or False, got {causal!r}")
    if scale is not None and not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise TypeError(f"attention: scale must be a finite number or None, got {scale!r}")


def _tile(table: dict, kernels: Kernels, dtype: torch.dtype, head_dim: int) -> Tile:
    if runtime.INTERPRETED:
        return kernels.interpreter_tile
    return table[head_dim] if dtype in (torch.float16, torch.bfloat16) else kernels.wide_tile


def _meta(q: torch.Tensor, scale: float, causal: bool, tile: Tile | None = None) -> dict:
    meta = dict(
        QK_SCALE=scale * LOG2E, HEAD_DIM=q.shape[-1], CAUSAL=causal,
        ACC_DTYPE=tl.float64 if q.dtype == torch.float64 else tl.float32,
        INPUT_PRECISION="tf32" if uses_tf32(q.dtype) else "ieee",
    )  # fmt: skip
    if tile is not None:
        block_m, block_n, warps, stages = tile
        meta |= dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    return meta


class ForwardPlan:
    """attention's forward for q, k, v laid out like these: checked once, and its launch
    bound (see BoundLaunch)."""

    def __init__(self, q, k, v, causal: bool, scale: float | None, kernels: Kernels):
        check_arguments(q, k, v, causal, scale)
        self.kernels = kernels  # for the backward
        self.scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
        (B, H, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
        self.shape = (B, H, n_q, d)
        self.lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.empty = B * H * n_q == 0
        self.sizes = (*q.stride(), *k.stride(), *v.stride(), H * n_q * d, n_q * d, d,
                      B, H, n_q, n_k, H // max(h_kv, 1))  # fmt: skip
        tuned = not runtime.INTERPRETED and d <= 128 and q.dtype in (torch.float16, torch.bfloat16)
        if attention_tma.suits(q, k, v):  # a Hopper GPU: the TMA unit moves the tiles
            self.launch = attention_tma.forward_launch(q, k, v, causal, self.scale)
        elif tuned and n_q * n_k >= kernels.tuned_from:
            grid = lambda meta: (cdiv(n_q, meta["BLOCK_M"]), B * H)  # noqa: E731
            self.launch = _with_sizes(
                BoundLaunch(kernels.forward_autotuned, grid, _meta(q, self.scale, causal)),
                self.sizes,
            )
        else:
            tile = _tile(kernels.forward_tiles, kernels, q.dtype, d)
            meta = _meta(q, self.scale, causal, tile)
            self.launch = _with_sizes(
                BoundLaunch(kernels.forward, (cdiv(n_q, tile[0]), B * H), meta), self.sizes
            )

    def __call__(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        o = q.new_empty(self.shape)
        lse = q.new_empty(self.shape[:3], dtype=self.lse_dtype)
        if not self.empty:
            self.launch(q, k, v, o, lse)
        return o, lse


class BackwardPlan:
    """attention's backward for tensors laid out like these: D's pre-pass, then the dK/dV
    and the dQ kernels, each launch bound once; on a Hopper GPU each of the two takes
    attention_tma.py's kernel where that suits (attention_tma.tma_suits)."""

    def __init__(self, do, q, k, v, o, lse, causal: bool, scale: float, kernels: Kernels):
        (B, H, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
        self.shapes = (q.shape, k.shape, (B, H, n_q))
        self.empty = q.numel() == 0 or k.numel() == 0
        group = H // max(h_kv, 1)
        meta = _meta(q, scale, causal)
        dq = _tile(kernels.dq_tiles, kernels, q.dtype, d)
        delta_meta = dict(HEAD_DIM=d, BLOCK_M=dq[0], ACC_DTYPE=meta["ACC_DTYPE"])
        self.delta = BoundLaunch(kernels.delta, (cdiv(n_q, dq[0]), B * H), delta_meta)
        self.delta_sizes = (*o.stride()[:3], *do.stride(), H, n_q)
        strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
        if attention_tma.tma_suits(attention_tma.TMA_DKDV_TILES, q, k, v, do):
            self.dkdv = attention_tma.dkdv_launch(q, k, v, do, causal, scale)
        else:
            dkdv = _tile(kernels.dkdv_tiles, kernels, q.dtype, d)
            self.dkdv = _with_sizes(
                BoundLaunch(kernels.dkdv, (cdiv(n_k, dkdv[1]), B * h_kv),
                            _meta(q, scale, causal, dkdv) | dict(SCALE=scale)),
                (*strides, h_kv * n_k * d, n_k * d, d, h_kv, n_q, n_k, group),
            )  # fmt: skip
        if attention_tma.tma_suits(attention_tma.TMA_DQ_TILES, q, k, v, do):
            self.dq = attention_tma.dq_launch(q, k, v, do, causal, scale)
        else:
            self.dq = _with_sizes(
                BoundLaunch(kernels.dq, (cdiv(n_q, dq[0]), B * H),
                            _meta(q, scale, causal, dq) | dict(SCALE=scale)),
                (*strides, H * n_q * d, n_q * d, d, H, n_q, n_k, group),
            )  # fmt: skip
        self.delta_dtype = lse.dtype

    def __call__(self, do, q, k, v, o, lse):
        dq = q.new_empty(self.shapes[0])
        dk = k.new_empty(self.shapes[1])
        dv = k.new_empty(self.shapes[1])
        if self.empty:
            return dq.zero_(), dk.zero_(), dv.zero_()
        delta = q.new_empty(self.shapes[2], dtype=self.delta_dtype)
        self.delta(o, do, delta, *self.delta_sizes)
        self.dkdv(q, k, v, do, lse, delta, dk, dv)
        self.dq(q, k, v, do, lse, delta, dq)
        return dq, dk, dv


def _with_sizes(launch: BoundLaunch, sizes: tuple):
    """The launch as a function of its tensors alone, the plan's sizes and strides after."""
    return lambda *tensors: launch(*tensors, *sizes)


_plans, _backward_plans = PlanCache(), PlanCache()


def _scale_key(scale) -> str | None:
    """The scale as a plan's key: its exact value, as text (a float keys no plan)."""
    return None if scale is None else float(scale).hex() if isinstance(scale, int | float) else "?"


def forward_plan(q, k, v, causal, scale, kernels: Kernels) -> ForwardPlan:
    """The forward's plan for a call with these arguments: found by their signature, or
    made (the arguments checked) and kept."""
    # causal=1 would find causal=True's plan (1 == True) and skip the checks that refuse it
    key = signature((q, k, v), (causal if type(causal) is bool else "?", _scale_key(scale)))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, ForwardPlan(q, k, v, causal, scale, kernels))
    return plan


def backward(do, q, k, v, o, lse, causal: bool, scale: float | None, kernels: Kernels):
    """(dq, dk, dv) for the output's gradient do, from the forward's o and lse, by the
    plan for tensors laid out like these."""
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    # the kernels read o's rows and lse adjacent (a saved-tensor hook may lay them out anew)
    o = o if o.stride(-1) == 1 else o.contiguous()
    lse = lse if lse.is_contiguous() else lse.contiguous()
    key = signature((do, q, k, v, o, lse), (causal, _scale_key(scale)))
    plan = _backward_plans.get(key)
    if plan is None:
        plan = _backward_plans.put(key, BackwardPlan(do, q, k, v, o, lse, causal, scale, kernels))
    return plan(do, q, k, v, o, lse)


class AttentionFunction(torch.autograd.Function):
    """Flash attention with its backward in Triton, by the forward's `plan` (see
    forward_plan). Saves q, k, v, o and lse: O(N)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, plan: ForwardPlan):
        o, lse = plan(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.plan = causal, plan
        return o

    @staticmethod
    @once_differentiable  # the backward's kernels record no graph of their own
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        plan = ctx.plan
        grads = backward(do, q, k, v, o, lse, ctx.causal, plan.scale, plan.kernels)
        return *grads, None, None, None
