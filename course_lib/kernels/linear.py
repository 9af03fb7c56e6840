"""Lesson 07: a Linear layer, y = activation(x @ weight^T + bias), forward and backward.

The forward is lesson 05's tiled matmul with the weight read transposed through its
strides and an epilogue that adds the bias and applies the activation before the one
store. The backward is the same product two more ways, grad_x = g @ weight and
grad_weight = g^T @ x, after one pass over the output's gradient g (times the activation's
slope, summed over the rows for grad_bias). `LinearFunction` joins them for autograd;
`linear` and `Linear`, a drop-in for `torch.nn.Linear`, are what callers use. What a call
works out once is kept in linear_plans.py's plans, and `route` hands them its products.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from course_lib import runtime
from course_lib.gpu_timer import autotune_timer
from course_lib.kernels import linear_plans as plans
from course_lib.kernels import tiles
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import PlanCache, signature, uses_tf32
from course_lib.kernels.matmul import TILE_SHAPES, matmul
from course_lib.kernels.tiles import activate, dot_over_k, tile_offsets

ACTIVATIONS = plans.ACTIVATIONS
check_arguments = plans.check_arguments  # course_lib.ops checks before it traces


@triton.jit
def linear_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, z_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, SAVE_Z: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """C = activation(A @ B + bias), and Z = A @ B + bias where SAVE_Z, with Z laid out
    like C. The forward passes x as A and weight^T, a view, as B."""
    offs_m, offs_n, offs_am, offs_bn = tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BM, BK]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn  # [BK, BN]
    acc = dot_over_k(
        a_ptrs, b_ptrs, K, stride_ak, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION,
        ACC_DTYPE,
    )  # fmt: skip
    if HAS_BIAS:  # bias[n] on every row of column n
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(ACC_DTYPE)[None, :]
    offs_c = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SAVE_Z:  # the pre-activation, which gelu's slope needs in the backward
        tl.store(z_ptr + offs_c, acc.to(z_ptr.dtype.element_ty), mask=mask)
    tl.store(c_ptr + offs_c, activate(acc, ACTIVATION).to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def activation_slope(saved, ACTIVATION: tl.constexpr):
    """d activation / d z, from what the forward saved: relu's output (positive exactly
    where z is), or gelu's input z."""
    if ACTIVATION == "relu":
        slope = tl.where(saved > 0, 1.0, 0.0)
    else:  # gelu: Phi(z) + z * phi(z)
        cdf = 0.5 * (1.0 + tl.math.erf(saved * 0.7071067811865476))
        slope = cdf + saved * tl.exp(-0.5 * saved * saved) * 0.3989422804014327
    return slope


@triton.jit
def output_grad_kernel(
    g_ptr, saved_ptr, gz_ptr, sums_ptr, M, N, rows_per_program,
    stride_gm, stride_gn, stride_sm, stride_sn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ACTIVATION: tl.constexpr, SUM: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """One pass over g [M, N], rows_per_program rows of BLOCK_N columns per program: gz = g
    * activation's slope (stored contiguous, where there is one), and where SUM gz's column
    sums over those rows, at row program_id(1) of the contiguous sums [programs, N]."""
    offs_n = tl.program_id(axis=0) * BLOCK_N + tl.arange(0, BLOCK_N)
    first = tl.program_id(axis=1) * rows_per_program
    total = tl.zeros((BLOCK_N,), dtype=ACC_DTYPE)
    for start in range(first, tl.minimum(first + rows_per_program, M), BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :] * stride_gn, mask=mask)
        g = g.to(ACC_DTYPE)
        if ACTIVATION != "":
            s_ptrs = saved_ptr + offs_m[:, None] * stride_sm + offs_n[None, :] * stride_sn
            g *= activation_slope(tl.load(s_ptrs, mask=mask).to(ACC_DTYPE), ACTIVATION)
            gz_ptrs = gz_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.store(gz_ptrs, g.to(gz_ptr.dtype.element_ty), mask=mask)
        if SUM:
            total += tl.sum(tl.where(mask, g, 0.0), axis=0)
    if SUM:
        sums_ptrs = sums_ptr + tl.program_id(axis=1) * N + offs_n
        tl.store(sums_ptrs, total.to(sums_ptr.dtype.element_ty), mask=offs_n < N)


# lesson 05's tiles, and one that ran a 1024^3 bf16 forward with GELU's erf faster
LINEAR_TILE_SHAPES = [*TILE_SHAPES, (64, 128, 64, 4, 8)]
# the epilogue is in the key: GELU's registers can make another tile the fastest
linear_kernel_autotuned = triton.autotune(
    configs=tiles.tile_configs(LINEAR_TILE_SHAPES),
    key=["M", "N", "K", *tiles.LAYOUT_KEY, "INPUT_PRECISION", "HAS_BIAS", "ACTIVATION", "SAVE_Z"],
    do_bench=autotune_timer,
)(linear_kernel)
linear_launcher = LeanLauncher(linear_kernel)
linear_autotuned_launcher = LeanLauncher(linear_kernel_autotuned)
output_grad_launcher = LeanLauncher(output_grad_kernel)


def route(a, b, c, bias, activation: str | None, save_z: bool) -> Callable:
    """How a plan fills c = activation(a @ b + bias), and z = a @ b + bias where save_z, for
    a [M, K], b [K, N], a contiguous bias [N] or None, c and z new contiguous [M, N]: bound
    (see BoundLaunch), a function of (a, b, c, bias, z) laid out like these."""
    fill = plans.fast_path(a, b, c, bias, activation, save_z)
    if fill is not None:  # Hopper's TMA kernel for a large product; an empty one launches nothing
        return fill
    (M, K), N = a.shape, b.shape[1]  # the lesson's kernel takes the rest as they are
    meta = dict(
        HAS_BIAS=bias is not None, ACTIVATION=activation or "", SAVE_Z=save_z,
        INPUT_PRECISION="tf32" if uses_tf32(a.dtype) else "ieee",
        ACC_DTYPE=plans.accumulator(a.dtype),
    )  # fmt: skip
    sizes = (M, N, K, *a.stride(), *b.stride(), *c.stride())
    if runtime.INTERPRETED or M * N * K <= tiles.SMALL_PRODUCT:
        config = tiles.INTERPRETER_CONFIG if runtime.INTERPRETED else tiles.SMALL_CONFIG
        grid = (cdiv(M, config["BLOCK_M"]) * cdiv(N, config["BLOCK_N"]),)
        launch = BoundLaunch(linear_launcher, grid, meta | config)
    else:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"]),)
        launch = BoundLaunch(linear_autotuned_launcher, grid, meta)

    def fill(a, b, c, bias, z):  # c stands in for the pointers the kernel does not read
        launch(a, b, c, c if bias is None else bias, c if z is None else z, *sizes)

    return fill


_plans, _backward_plans = PlanCache(), PlanCache()  # the forward's, the backward's


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:  # fmt: skip
    """activation(x @ weight^T + bias), as torch.nn.functional.linear and the activation,
    in Triton forward and backward. x is [..., in_features], weight [out_features,
    in_features], bias [out_features] or None, all of one dtype (float16, bfloat16 on a
    GPU, float32, float64) and device, any strides; activation is None, "relu" or "gelu"
    (torch's exact GELU). float32 uses TF32 where torch's matmuls would (allow_tf32 or
    fp32_precision). Under torch.autocast, give every tensor one dtype: it does not cast."""
    plan = _plan(x, weight, bias, activation)
    tracked = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if tracked:
        return LinearFunction.apply(x, weight, bias, activation, plan)
    # nothing to differentiate: skip autograd's bookkeeping (host time)
    return plan(x, weight, bias)[0]


class LinearFunction(torch.autograd.Function):
    """activation(x @ weight^T + bias) with its backward in Triton. Saves only what the
    backward uses: x, the weight, and relu's output (the result itself) or gelu's input z."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation, plan=None):
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        any_grad = needs_x or needs_weight or needs_bias
        save_z = activation == "gelu" and any_grad
        plan = plan or _plan(x, weight, bias, activation)
        y, z, x2d = plan(x, weight, bias, save_z)
        saved = z if save_z else y if activation == "relu" and any_grad else None
        ctx.save_for_backward(x2d if needs_weight else None, weight if needs_x else None, saved)
        ctx.activation, ctx.x_shape = activation, x.shape
        return y

    @staticmethod
    @once_differentiable  # the backward's kernels record no graph of their own
    def backward(ctx, grad_y):
        x2d, weight, saved = ctx.saved_tensors
        asked = grad_y, x2d, weight, saved, ctx.activation, ctx.needs_input_grad[2]
        grad_x, grad_weight, grad_bias = input_gradients(*asked)
        grad_x = None if grad_x is None else grad_x.view(ctx.x_shape)
        return grad_x, grad_weight, grad_bias, None, None


def _plan(x, weight, bias, activation) -> plans.ForwardPlan:  # checked on a first call
    key = signature((x, weight, bias), (activation,))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, plans.ForwardPlan(x, weight, bias, activation, route))
    return plan


def forward(x, weight, bias, activation, save_z=False):  # (y, z or None, x2d): for ops
    return _plan(x, weight, bias, activation)(x, weight, bias, save_z)


def input_gradients(grad_y, x2d, weight, saved, activation, bias_grad: bool):
    """(grad_x [M, in], grad_weight, grad_bias) for the output's gradient grad_y [..., out],
    each where `weight`, `x2d` [M, in], `bias_grad` ask for it; `saved`, relu's y or gelu's
    z, or None. All key the plan: saved-tensor hooks may hand back copies laid out anew."""
    g = grad_y.reshape(math.prod(grad_y.shape[:-1]), grad_y.shape[-1])
    saved = None if saved is None else saved.reshape(g.shape)
    key = signature((g, x2d, weight, saved), (activation, bias_grad))
    plan = _backward_plans.get(key)
    if plan is None:
        args = (g, x2d, weight, saved, activation, bias_grad, route, output_grad_launcher)
        plan = _backward_plans.put(key, plans.BackwardPlan(*args))
    return plan(g, x2d, weight, saved)


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, a new contiguous [M, N], for checked a [M, K] and b [K, N] of any strides: by
    lesson 05's finished `matmul`, or for float64 (gradcheck's) by linear_kernel."""
    return matmul(a, b) if a.dtype != torch.float64 else plans.product_plan(a, b, route)(a, b)


def output_grad(g: torch.Tensor, saved, activation: str | None, bias_grad: bool) -> tuple:
    """(gz, grad_bias) in one pass over g [M, N]: gz = g times the activation's slope at
    `saved` (g itself without one); grad_bias = gz summed over the rows, where asked."""
    return plans.OutputGradPlan(g, saved, activation, bias_grad, output_grad_launcher)(g, saved)


class Linear(torch.nn.Linear):
    """torch.nn.Linear computed by `linear`, with an optional fused activation: the same
    parameters, initialisation and state_dict, which loads into either class."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
        activation: str | None = None,
    ) -> None:  # fmt: skip
        if activation not in ACTIVATIONS:
            raise ValueError(f"Linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"
