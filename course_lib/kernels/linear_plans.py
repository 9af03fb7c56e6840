"""The host path of lesson 07's Linear: what `linear` (linear.py) works out once per
signature of its arguments and keeps. Its checks; what the lesson's kernel does not cover
(`fast_path`: Hopper's TMA kernel for large products, nothing to launch for empty ones);
the pass over the output's gradient, spread over enough programs; and the backward's
products through lesson 05's finished matmul. linear.py hands in its routes (`route`,
which hands products to `fast_path` or its own kernel) and the output-gradient kernel's
launcher, so that nothing here imports it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton.language as tl

from course_lib import runtime
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch
from course_lib.kernels._plan import into_graph, uses_tf32
from course_lib.kernels.matmul import matmul_plan
from course_lib.kernels.matmul_fast_paths import tma_launch, tma_takes

ACTIVATIONS = (None, "relu", "gelu")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# the pass over the output's gradient: a [ROWS, COLUMNS] tile per step; programs
# enough to keep every SM of a large GPU reading
GRAD_ROWS, GRAD_COLUMNS = 32, 64
GRAD_PROGRAMS = 512


def accumulator(dtype: torch.dtype):
    """The accumulator's dtype for these operands: float64's own, else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


class ForwardPlan:
    """linear's plan: its arguments checked, y's shape, and the product's route (see
    route), without z and, for gelu, with it."""

    def __init__(self, x, weight, bias, activation: str | None, route: Callable):
        if not into_graph():  # a traced call: course_lib.ops checks before it traces
            check_arguments(x, weight, bias, activation)
        self.rows = math.prod(x.shape[:-1])  # every leading dimension: M
        self.shape = (*x.shape[:-1], weight.shape[0])
        operands = x.reshape(self.rows, x.shape[-1]), weight.t()
        y2d = x.new_empty((self.rows, self.shape[-1]))
        self.fill = _bias_in_order(route, *operands, y2d, bias, activation, False)
        self.fill_z = None  # z is saved for gelu's backward only
        if activation == "gelu":
            self.fill_z = _bias_in_order(route, *operands, y2d, bias, activation, True)

    def __call__(self, x, weight, bias, save_z: bool = False):
        """(y [..., out], z [M, out] or None, x flattened to [M, in]): the product written
        straight into y, so that y is no view and may be changed in place."""
        x2d = x.reshape(self.rows, x.shape[-1])  # a view where x's strides allow, else a copy
        y = x.new_empty(self.shape)
        y2d = y.view(self.rows, self.shape[-1])
        z = x.new_empty(y2d.shape) if save_z else None
        (self.fill_z if save_z else self.fill)(x2d, weight.t(), y2d, bias, z)
        return y, z, x2d


class BackwardPlan:
    """linear.input_gradients' plan for a g [M, N] (grad_y flattened), x2d, weight and
    saved laid out like these, under the same switches: the pass over g (output_grad_kernel,
    by `launcher`), then the products."""

    def __init__(self, g, x2d, weight, saved, activation, bias_grad: bool, route, launcher):
        self.output_grad = OutputGradPlan(g, saved, activation, bias_grad, launcher)
        gz = g if activation is None else g.new_empty(g.shape)  # laid out as output_grad's
        self.grad_x = None if weight is None else product_plan(gz, weight, route)
        self.grad_weight = None if x2d is None else product_plan(gz.t(), x2d, route)

    def __call__(self, g, x2d, weight, saved):
        gz, grad_bias = self.output_grad(g, saved)
        grad_x = self.grad_x(gz, weight) if weight is not None else None
        grad_weight = self.grad_weight(gz.t(), x2d) if x2d is not None else None
        return grad_x, grad_weight, grad_bias


class OutputGradPlan:
    """linear.output_grad's launches of output_grad_kernel (by `launcher`) for a g and a
    saved tensor laid out like these, bound once (see BoundLaunch): a backward plan calls
    it once a step."""

    def __init__(self, g, saved, activation: str | None, bias_grad: bool, launcher):
        M, N = g.shape
        self.shape, self.activation, self.bias_grad = (M, N), activation, bias_grad
        columns = cdiv(N, GRAD_COLUMNS)
        # enough programs along M too, each summing its rows; a second launch adds their sums
        row_programs = max(1, min(cdiv(M, GRAD_ROWS), GRAD_PROGRAMS // max(1, columns)))
        rows_per_program = cdiv(cdiv(M, row_programs), GRAD_ROWS) * GRAD_ROWS
        row_programs = cdiv(M, rows_per_program) if M else 0
        self.sums_shape = (row_programs, N)
        self.sums_dtype = torch.float64 if g.dtype == torch.float64 else torch.float32
        meta = dict(BLOCK_M=GRAD_ROWS, BLOCK_N=GRAD_COLUMNS, ACC_DTYPE=accumulator(g.dtype))
        pass_meta = meta | dict(ACTIVATION=activation or "", SUM=bias_grad)
        self.one_pass = BoundLaunch(launcher, (columns, row_programs), pass_meta)
        saved_strides = (g if saved is None else saved).stride()
        self.pass_sizes = (M, N, rows_per_program, *g.stride(), *saved_strides)
        # the sums, contiguous [row_programs, N], added by one program per column block
        self.add_sums = BoundLaunch(launcher, (columns, 1), meta | dict(ACTIVATION="", SUM=True))
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


def product_plan(a: torch.Tensor, b: torch.Tensor, route: Callable) -> Callable:
    """linear.product's plan for operands laid out like a and b: a function of (a, b)."""
    if a.dtype != torch.float64:
        return matmul_plan(a, b)
    shape = (a.shape[0], b.shape[1])
    fill = route(a, b, a.new_empty(shape), None, None, False)

    def plan(a, b):
        c = a.new_empty(shape)
        fill(a, b, c, None, None)
        return c

    return plan


def fast_path(a, b, c, bias, activation: str | None, save_z: bool) -> Callable | None:
    """What linear_kernel, as linear.py launches it, does not take: how to fill c =
    activation(a @ b + bias) for a [M, K], b [K, N] and a contiguous bias [N] or None laid
    out like these, c a new contiguous [M, N], as a function of (a, b, c, bias, z), its
    launch bound (see BoundLaunch). On the GPUs that have it, a large product without z
    goes to the persistent TMA kernel, whose epilogue adds the bias and the activation; an
    empty one launches nothing. None for the rest, which linear_kernel takes as they are."""
    if a.shape[0] * b.shape[1] == 0:
        return lambda *_: None
    tf32 = uses_tf32(a.dtype)
    # large products only: measured, a 1024^3 bf16 forward with GELU ran at a third of
    # linear_kernel's speed there
    if not save_z and tma_takes(a, b, c, tf32):
        precision = "tf32" if tf32 else "ieee"
        launch = tma_launch(a, b, c, activation or "", precision, None, bias is not None)
        return lambda a, b, c, bias, z: launch(a, b, c, bias)
    return None


def _bias_in_order(route: Callable, a, b, c, bias, activation, save_z: bool) -> Callable:
    """route(...)'s fill, for a bias the kernels read one element after the other: a
    strided one is copied contiguous on each call."""
    if bias is None or bias.is_contiguous():
        return route(a, b, c, bias, activation, save_z)
    fill = route(a, b, c, bias.contiguous(), activation, save_z)
    return lambda a, b, c, bias, z: fill(a, b, c, bias.contiguous(), z)


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
