"""Lesson 07: a Linear layer, y = activation(x @ weight^T + bias), forward and backward.

The forward is lesson 05's tiled matmul with the weight read transposed through its
strides, no copy, and an epilogue that adds the bias and applies the activation before the
one store. The backward uses the same product two more ways through strides,
grad_x = g @ weight and grad_weight = g^T @ x, after one pass over the output's gradient g
that multiplies it by the activation's slope and sums it over the rows for grad_bias.
`LinearFunction` joins them for autograd; `linear` and `Linear`, a drop-in for
`torch.nn.Linear`, are what callers use.
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
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import PlanCache, into_graph, signature
from course_lib.kernels.matmul import TILE_SHAPES, matmul, matmul_plan
from course_lib.kernels.matmul_fast_paths import tma_launch, tma_takes
from course_lib.kernels.tiles import (
    INTERPRETER_CONFIG,
    LAYOUT_KEY,
    SMALL_CONFIG,
    SMALL_PRODUCT,
    activate,
    dot_over_k,
    tile_configs,
    tile_offsets,
)

ACTIVATIONS = (None, "relu", "gelu")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# the pass over the output's gradient: a [ROWS, COLUMNS] tile per step; programs
# enough to keep every SM of a large GPU reading
GRAD_ROWS, GRAD_COLUMNS = 32, 64
GRAD_PROGRAMS = 512


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
    """One pass over the output's gradient g [M, N], rows_per_program rows of BLOCK_N
    columns per program: gz = g * activation's slope (stored contiguous, where there is an
    activation), and where SUM the column sums of gz over those rows, at row
    program_id(1) of the contiguous sums [programs along M, N]."""
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


# lesson 05's tiles, and one more for the epilogue: with GELU's erf to compute, a 64 x 128
# tile on 8 warps ran a 1024^3 bf16 forward faster than any of lesson 05's (measured)
LINEAR_TILE_SHAPES = [*TILE_SHAPES, (64, 128, 64, 4, 8)]
# M, N, K and the dtypes (the autotuner adds these) choose the tile
# the epilogue is in the key: GELU's registers can make another tile the fastest
linear_kernel_autotuned = triton.autotune(
    configs=tile_configs(LINEAR_TILE_SHAPES),
    key=["M", "N", "K", *LAYOUT_KEY, "INPUT_PRECISION", "HAS_BIAS", "ACTIVATION", "SAVE_Z"],
    do_bench=autotune_timer,
)(linear_kernel)
# each kernel[grid], lean: see _launch.py
linear_launcher = LeanLauncher(linear_kernel)
linear_autotuned_launcher = LeanLauncher(linear_kernel_autotuned)
output_grad_launcher = LeanLauncher(output_grad_kernel)


def _accumulator(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a [M, K] and b [K, N] of any strides, arguments already checked: a new
    contiguous [M, N] tensor. 16- and 32-bit operands go to lesson 05's finished `matmul`,
    with its expert paths; float64 ones (gradcheck's) to linear_kernel."""
    return matmul(a, b) if a.dtype != torch.float64 else _product_plan(a, b)(a, b)


def _product_plan(a: torch.Tensor, b: torch.Tensor) -> Callable:
    """product's plan for operands laid out like a and b: a function of (a, b)."""
    if a.dtype != torch.float64:
        return matmul_plan(a, b)
    shape = (a.shape[0], b.shape[1])
    fill = _route(a, b, a.new_empty(shape), None, None, save_z=False)

    def plan(a, b):
        c = a.new_empty(shape)
        fill(a, b, c, None, None)
        return c

    return plan


def _route(a, b, c, bias, activation: str | None, save_z: bool) -> Callable:
    """How to fill c = activation(a @ b + bias), and z = a @ b + bias where save_z, for
    a [M, K], b [K, N] and bias [N] or None laid out like these, c and z new contiguous
    [M, N] tensors: a function of (a, b, c, bias, z), its launch bound (see BoundLaunch:
    a call laid out like this one shares its specialisation). On the GPUs that have it,
    a large product without z goes to the persistent TMA kernel, whose epilogue adds the
    bias and the activation; the rest to linear_kernel."""
    (M, K), N = a.shape, b.shape[1]
    if M * N == 0:
        return lambda *_: None
    if bias is not None and not bias.is_contiguous():  # read one element after the other
        fill = _route(a, b, c, bias.contiguous(), activation, save_z)
        return lambda a, b, c, bias, z: fill(a, b, c, bias.contiguous(), z)
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    precision = "tf32" if tf32 else "ieee"
    # large products only: measured, a 1024^3 bf16 forward with GELU ran at a third of
    # linear_kernel's speed there
    if not save_z and tma_takes(a, b, c, tf32):
        launch = tma_launch(a, b, c, activation or "", precision, None, bias is not None)
        return lambda a, b, c, bias, z: launch(a, b, c, bias)
    meta = dict(
        HAS_BIAS=bias is not None, ACTIVATION=activation or "", SAVE_Z=save_z,
        INPUT_PRECISION=precision, ACC_DTYPE=_accumulator(a.dtype),
    )  # fmt: skip
    sizes = (M, N, K, *a.stride(), *b.stride(), *c.stride())
    if runtime.INTERPRETED or M * N * K <= SMALL_PRODUCT:
        config = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (cdiv(M, config["BLOCK_M"]) * cdiv(N, config["BLOCK_N"]),)
        launch = BoundLaunch(linear_launcher, grid, meta | config)
    else:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"]),)
        launch = BoundLaunch(linear_autotuned_launcher, grid, meta)

    def fill(a, b, c, bias, z):
        # c stands in for the pointers the kernel does not read
        launch(a, b, c, c if bias is None else bias, c if z is None else z, *sizes)

    return fill


def output_grad(
    g: torch.Tensor, saved: torch.Tensor | None, activation: str | None, bias_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(gz, grad_bias) for the output's gradient g [M, N] of any strides: gz = g times the
    activation's slope at what the forward saved (g itself without an activation), and
    grad_bias = gz summed over the rows where `bias_grad`, else None. One pass over g."""
    return OutputGradPlan(g, saved, activation, bias_grad)(g, saved)


class OutputGradPlan:
    """output_grad's launches for a g and a saved tensor laid out like these, bound once
    (see BoundLaunch): a backward plan calls it once a step."""

    def __init__(self, g, saved, activation: str | None, bias_grad: bool):
        M, N = g.shape
        self.shape, self.activation, self.bias_grad = (M, N), activation, bias_grad
        columns = cdiv(N, GRAD_COLUMNS)
        # enough programs along M too, each summing its rows; a second launch adds their sums
        row_programs = max(1, min(cdiv(M, GRAD_ROWS), GRAD_PROGRAMS // max(1, columns)))
        rows_per_program = cdiv(cdiv(M, row_programs), GRAD_ROWS) * GRAD_ROWS
        row_programs = cdiv(M, rows_per_program) if M else 0
        self.sums_shape = (row_programs, N)
        self.sums_dtype = torch.float64 if g.dtype == torch.float64 else torch.float32
        meta = dict(BLOCK_M=GRAD_ROWS, BLOCK_N=GRAD_COLUMNS, ACC_DTYPE=_accumulator(g.dtype))
        pass_meta = meta | dict(ACTIVATION=activation or "", SUM=bias_grad)
        self.one_pass = BoundLaunch(output_grad_launcher, (columns, row_programs), pass_meta)
        saved_strides = (g if saved is None else saved).stride()
        self.pass_sizes = (M, N, rows_per_program, *g.stride(), *saved_strides)
        # the sums, contiguous [row_programs, N], added by one program per column block
        self.add_sums = BoundLaunch(
            output_grad_launcher, (columns, 1), meta | dict(ACTIVATION="", SUM=True)
        )
        self.add_sizes = (row_programs, N, row_programs, N, 1, N, 1)

    def __call__(self, g, saved) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.activation is None and not self.bias_grad:
            return g, None
        gz = g if self.activation is None else g.new_empty(self.shape)
        if gz.numel() == 0:
            return gz, g.new_zeros(self.shape[1]) if self.bias_grad else None
        sums = g.new_empty(self.sums_shape, dtype=self.sums_dtype) if self.bias_grad else gz
        self.one_pass(g, g if saved is None else saved, gz, sums, *self.pass_sizes)
        if not self.bias_grad:
            return gz, None
        grad_bias = g.new_empty(self.shape[1])
        self.add_sums(sums, sums, sums, grad_bias, *self.add_sizes)
        return gz, grad_bias


class BackwardPlan:
    """input_gradients' launches for a g [M, N] (grad_y flattened), x2d, weight and saved
    laid out like these, under the same switches: the pass over g, then the products."""

    def __init__(self, g, x2d, weight, saved, activation: str | None, bias_grad: bool):
        self.output_grad = OutputGradPlan(g, saved, activation, bias_grad)
        gz = g if activation is None else g.new_empty(g.shape)  # laid out as output_grad's
        self.grad_x = None if weight is None else _product_plan(gz, weight)
        self.grad_weight = None if x2d is None else _product_plan(gz.t(), x2d)

    def __call__(self, g, x2d, weight, saved):
        gz, grad_bias = self.output_grad(g, saved)
        grad_x = self.grad_x(gz, weight) if weight is not None else None
        grad_weight = self.grad_weight(gz.t(), x2d) if x2d is not None else None
        return grad_x, grad_weight, grad_bias


class ForwardPlan:
    """linear's plan: y's shape, and the product's route (see _route), without z and, for
    gelu, with it."""

    def __init__(self, x, weight, bias, activation: str | None):
        self.rows = math.prod(x.shape[:-1])  # every leading dimension: M
        self.shape = (*x.shape[:-1], weight.shape[0])
        x2d, w_t = x.reshape(self.rows, x.shape[-1]), weight.t()
        y2d = x.new_empty((self.rows, self.shape[-1]))
        self.fill = _route(x2d, w_t, y2d, bias, activation, save_z=False)
        self.fill_z = None  # z is saved for gelu's backward only
        if activation == "gelu":
            self.fill_z = _route(x2d, w_t, y2d, bias, activation, save_z=True)

    def __call__(self, x, weight, bias, save_z: bool = False):
        """(y [..., out], z [M, out] or None, x flattened to [M, in]): the product written
        straight into y, so that y is no view and may be changed in place."""
        x2d = x.reshape(self.rows, x.shape[-1])  # a view where x's strides allow, else a copy
        y = x.new_empty(self.shape)
        y2d = y.view(self.rows, self.shape[-1])
        z = x.new_empty(y2d.shape) if save_z else None
        (self.fill_z if save_z else self.fill)(x2d, weight.t(), y2d, bias, z)
        return y, z, x2d


_plans = PlanCache()  # linear's forward plans, by signature
_backward_plans = PlanCache()  # and its backward's


def _plan(x, weight, bias, activation) -> ForwardPlan:
    """The plan for these arguments, made, and the arguments checked, on the first call
    like them."""
    key = signature((x, weight, bias), (activation,))
    plan = _plans.get(key)
    if plan is None:
        if not into_graph():  # a traced call: course_lib.ops checks before it traces
            check_arguments(x, weight, bias, activation)
        plan = _plans.put(key, ForwardPlan(x, weight, bias, activation))
    return plan


def forward(x, weight, bias, activation, save_z=False):
    """(y [..., out], z [M, out] or None, x flattened to [M, in]), for course_lib.ops."""
    return _plan(x, weight, bias, activation)(x, weight, bias, save_z)


class LinearFunction(torch.autograd.Function):
    """activation(x @ weight^T + bias) with its backward in Triton. Saves only what the
    backward will use: x for grad_weight, weight for grad_x, and for the activation's
    slope relu's output (no extra memory: it is the result) or gelu's input z."""

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
        grad_x, grad_weight, grad_bias = input_gradients(
            grad_y, x2d, weight, saved, ctx.activation, ctx.needs_input_grad[2]
        )
        grad_x = None if grad_x is None else grad_x.view(ctx.x_shape)
        return grad_x, grad_weight, grad_bias, None, None


def input_gradients(grad_y, x2d, weight, saved, activation, bias_grad: bool):
    """(grad_x [M, in], grad_weight, grad_bias) for the output's gradient grad_y [..., out]:
    grad_x where `weight` is given, grad_weight where `x2d` [M, in] is, grad_bias where
    `bias_grad`; None for the others. `saved` is what the forward kept for the
    activation's slope (relu's y or gelu's z, any shape with M·out elements) or None.
    Those of x2d, weight and saved are in the signature with grad_y's: saved-tensor hooks
    (torch.autograd.graph.save_on_cpu, say) may hand back copies laid out otherwise."""
    g = grad_y.reshape(math.prod(grad_y.shape[:-1]), grad_y.shape[-1])
    saved = None if saved is None else saved.reshape(g.shape)
    key = signature((g, x2d, weight, saved), (activation, bias_grad))
    plan = _backward_plans.get(key)
    if plan is None:
        plan = _backward_plans.put(key, BackwardPlan(g, x2d, weight, saved, activation, bias_grad))
    return plan(g, x2d, weight, saved)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:  # fmt: skip
    """activation(x @ weight^T + bias), as torch.nn.functional.linear followed by the
    activation, in Triton forward and backward.

    x is [..., in_features] with any leading dimensions, weight [out_features, in_features]
    and bias [out_features] or None, all of one dtype (float16, bfloat16 on a GPU, float32,
    float64) and device; activation is None, "relu" or "gelu" (torch's exact GELU). Any
    strides. float32 uses TF32 where torch.backends.cuda.matmul.allow_tf32 allows it.
    torch.autocast does not cast for it: under autocast, give every tensor one dtype."""
    plan = _plan(x, weight, bias, activation)
    tracked = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if tracked:
        return LinearFunction.apply(x, weight, bias, activation, plan)
    # nothing to differentiate: skip autograd's bookkeeping, a good part of a small
    # layer's host time
    return plan(x, weight, bias)[0]


def check_arguments(x, weight, bias, activation) -> None:
    """A clear error for arguments linear does not take."""
    tensors = {"x": x, "weight": weight} | ({} if bias is None else {"bias": bias})
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor, got {type(t).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: x must be [..., in_features] and weight [out_features, in_features]; "
            f"got x {list(x.shape)} and weight {list(weight.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(
            f"linear: bias must be [out_features] = [{weight.shape[0]}], got {list(bias.shape)}"
        )
    rows, (out_features, in_features) = math.prod(x.shape[:-1]), weight.shape
    if max(rows * in_features, rows * out_features, weight.numel()) >= 2**31:
        raise ValueError(
            f"linear: x {list(x.shape)} with weight {list(weight.shape)} has a matrix of 2^31 "
            "elements or more, past what these kernels' 32-bit offsets address; split x's rows "
            "into batches"
        )
    for name, t in tensors.items():
        if t.dtype != x.dtype or t.device != x.device:
            raise TypeError(
                f"linear: {name} is {t.dtype} on {t.device} and x {x.dtype} on {x.device}; "
                "give every tensor the same dtype and device"
            )
    if x.dtype not in DTYPES or (x.dtype == torch.bfloat16 and runtime.INTERPRETED):
        runtime.require_supported_dtype(x.dtype, "linear")  # its message says what to use
    if runtime.MODE == "gpu" and not x.is_cuda:
        raise ValueError(
            f"linear: the tensors are on {x.device}; Triton kernels run on the GPU here. "
            "Allocate them with device=course_lib.DEVICE."
        )


class Linear(torch.nn.Linear):
    """torch.nn.Linear computed by `linear`, with an optional fused activation: the same
    parameters (weight [out_features, in_features], bias [out_features]), the same
    initialisation and the same state_dict, which loads into either class."""

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
