"""The host path of lesson 09's layer norm and RMSNorm: what `layer_norm` and `rms_norm`
(layer_norm.py) work out once per signature of their arguments and keep (see _plan.py).
The checks; how x's rows are read (a view of x where its strides allow, else one copy);
the kernels' configs; which kernels take the rows (layer_norm.py's for rows of one block,
layer_norm_wide_rows.py's for wider ones); the backward's programs and its partial sums.
layer_norm.py hands in its launchers (`Kernels`), so that nothing here imports it back.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton.language as tl

from course_lib import runtime
from course_lib.kernels import layer_norm_wide_rows as wide_rows
from course_lib.kernels._args import cdiv, next_power_of_2
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import PlanCache, into_graph, signature

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
HALF = (torch.float16, torch.bfloat16)
MAX_FUSED_BLOCK = 8192  # widest row kept in registers by one program
PROGRAMS_PER_SM = 2  # backward programs: each loops over many rows
PARTIAL_BLOCK_P, PARTIAL_BLOCK_N = 64, 32  # the tile of the kernel that sums the partials
# a dtype as a plan's option (a string), and back
_DTYPE_KEYS = {d: str(d).removeprefix("torch.") for d in DTYPES}
_DTYPES_BY_KEY = {key: d for d, key in _DTYPE_KEYS.items()}


def dtype_key(dtype: torch.dtype | None) -> str | None:
    return _DTYPE_KEYS.get(dtype)


def dtype_of(key: str | None, default: torch.dtype) -> torch.dtype:
    return _DTYPES_BY_KEY.get(key, default)


class Kernels(NamedTuple):
    """layer_norm.py's launchers: the fused forward, the fused backward, the partial sums."""

    forward: LeanLauncher
    backward: LeanLauncher
    sum_rows: LeanLauncher


def config(block_n: int) -> tuple[int, int]:
    """(rows per program, num_warps) for a row block of `block_n` columns: short rows go
    several to a program, so that each program has about 4096 elements' loads in flight;
    wide ones take more warps to hold the row in registers."""
    if block_n <= 2048:
        return min(16, max(1, 4096 // block_n)), 4 if block_n <= 512 else 8
    return 1, 8 if block_n == 4096 else 16


def accumulator(dtype: torch.dtype):
    """The statistics' and sums' dtype: float64's own, else float32 (never 16 bits)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def options(normalized_shape, eps, rms: bool) -> tuple:
    """The options of a call as a plan's key (see _plan.signature): normalized_shape as a
    tuple, eps by its exact bits (a float is no key there)."""
    if type(normalized_shape) is int:
        shape = (normalized_shape,)
    else:
        shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else None
    return shape, eps.hex() if type(eps) is float else eps, rms


def check_arguments(what: str, x, normalized_shape, weight, bias, eps) -> tuple[int, ...]:
    """Raise a clear error unless the arguments fit (torch's rules: a layer norm's
    parameters share one dtype, x's, or float32 for a 16-bit x); returns normalized_shape
    as a tuple."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} expects a tensor x, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(f"{what}: x has dtype {x.dtype}; use one of {names}")
    if x.dtype == torch.bfloat16:
        runtime.require_supported_dtype(x.dtype, what)  # the interpreter refuses bfloat16
    if x.device.type != runtime.DEVICE.type:
        raise ValueError(f"{what}: x is on {x.device}; move it to {runtime.DEVICE} first")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))):
        raise TypeError(f"{what}: eps must be a float, got {type(eps).__name__}")
    try:
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
    except TypeError:
        shape = ()
    if not shape or tuple(x.shape[-len(shape) :]) != shape or len(shape) > x.dim():
        raise ValueError(
            f"{what}: normalized_shape {list(shape)} must be x's last dimensions, and x has "
            f"shape {list(x.shape)}"
        )
    params = {"weight": weight, "bias": bias}
    for name, p in params.items():
        if p is None:
            continue
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != shape:
            got = list(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"{what}: {name} must have shape {list(shape)}, got {got}")
        if p.device != x.device or p.dtype not in DTYPES:
            raise ValueError(
                f"{what}: {name} must be a floating tensor on x's device ({x.device}), "
                f"got {p.dtype} on {p.device}"
            )
    given = {p.dtype for p in params.values() if p is not None}
    allowed = {x.dtype, torch.float32} if x.dtype in HALF else {x.dtype}
    if what == "layer_norm" and (len(given) > 1 or not given <= allowed):
        dtypes = ", ".join(f"{n} {p.dtype}" for n, p in params.items() if p is not None)
        raise TypeError(
            f"layer_norm: x is {x.dtype} and {dtypes}; give the weight and bias x's dtype "
            "(or float32 both, for a 16-bit x), as torch's layer_norm asks"
        )
    return shape


def _rows_stride(t: torch.Tensor, n_rows: int, n_cols: int) -> int | None:
    """The stride between t's rows of n_cols adjacent elements, where t's strides let it be
    read as [n_rows, n_cols] without a copy; None where they do not."""
    try:
        t2d = t.view(n_rows, n_cols)
    except RuntimeError:
        return None
    return t2d.stride(0) if t2d.stride(1) == 1 or n_cols == 1 else None


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


class ForwardPlan:
    """The forward's plan for tensors laid out like these, with and without statistics."""

    def __init__(self, x, normalized_shape, weight, bias, eps, rms: bool, kernels: Kernels):
        what = "rms_norm" if rms else "layer_norm"
        if not into_graph():  # a traced call: course_lib.ops checks before it traces
            normalized_shape = check_arguments(what, x, normalized_shape, weight, bias, eps)
        if eps is None:  # torch's default: the epsilon of the statistics' dtype
            eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
        self.rms, self.shape = rms, x.shape
        self.param_shape = options(normalized_shape, eps, rms)[0]
        n_cols = math.prod(self.param_shape)
        n_rows = math.prod(x.shape[: x.dim() - len(self.param_shape)])
        self.stats_shape = (1 if rms else 2, n_rows)  # the means, then the rstds
        self.stats_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        stride_x = _rows_stride(x, n_rows, n_cols)
        self.copy_x = stride_x is None  # x's rows read from one contiguous copy
        self.copy_weight = weight is not None and not weight.is_contiguous()
        self.copy_bias = bias is not None and not bias.is_contiguous()
        self.bias_dtype = None if bias is None else _DTYPE_KEYS[bias.dtype]
        self.fills = None
        if n_rows and n_cols:
            flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, RMS=rms,
                         ACC_DTYPE=accumulator(x.dtype), EPS=float(eps))  # fmt: skip
            stride_x = n_cols if stride_x is None else stride_x
            self.fills = tuple(
                _forward_fill(kernels.forward, n_rows, n_cols, stride_x, flags | {"SAVE_STATS": s})
                for s in (False, True)
            )  # fmt: skip

    def __call__(self, x, weight, bias, save_stats: bool):
        """(y, stats [2, M] or RMSNorm's [1, M] or None, x as the kernel read it)."""
        if self.copy_x:
            x = x.contiguous()
        y = x.new_empty(self.shape)
        stats = x.new_empty(self.stats_shape, dtype=self.stats_dtype) if save_stats else None
        if self.fills is None:  # no rows or no columns: nothing to launch
            return y, None if stats is None else stats.fill_(math.nan), x
        if self.copy_weight:
            weight = weight.contiguous()
        if self.copy_bias:
            bias = bias.contiguous()
        # x stands in for the pointers the kernel does not read, y for the stats not saved
        self.fills[save_stats](
            x, y, x if weight is None else weight, x if bias is None else bias,
            y if stats is None else stats,
        )  # fmt: skip
        return y, stats, x


def _forward_fill(launcher, n_rows, n_cols, stride_x, flags):
    block_n = next_power_of_2(n_cols)
    if block_n > MAX_FUSED_BLOCK:  # rows wider than one block loop over it
        return wide_rows.forward_launch(n_rows, n_cols, stride_x, flags)
    rows, num_warps = config(block_n)
    meta = flags | dict(BLOCK_N=block_n, ROWS=rows, num_warps=num_warps)
    launch = BoundLaunch(launcher, (cdiv(n_rows, rows),), meta)
    return lambda x, y, w, b, stats: launch(x, y, w, b, stats, n_rows, n_cols, stride_x)


_backward_plans = PlanCache()


def backward(dy, x, weight, stats, needs, rms: bool, bias_dtype, param_shape, kernels: Kernels):
    """(dx, dweight, dbias) for the output's gradient dy, each None where `needs` (for x,
    weight, bias) says it is not wanted, by the plan for tensors laid out like these: x and
    stats as the forward returned them, or as saved-tensor hooks hand them back, which may
    lay them out anew. bias_dtype and param_shape as the forward's plan holds them; each
    parameter's gradient in its own dtype."""
    need_dx, need_dw, need_db = needs
    options = (need_dx, need_dw, need_db, rms, bias_dtype, param_shape)
    key = signature((dy, x, weight, stats), options)
    plan = _backward_plans.get(key)
    if plan is None:
        plan = _backward_plans.put(key, BackwardPlan(dy, x, weight, stats, *options, kernels))
    return plan(dy, x, weight, stats)


class BackwardPlan:
    """The backward's plan: the fused or looped kernel over a few programs per SM, each
    writing its row of dw's and db's float32 partial sums, then the partials summed by
    sum_rows_kernel into each parameter's gradient, in a fixed order."""

    def __init__(self, dy, x, weight, stats, need_dx, need_dw, need_db, rms, bias_dtype,
                 param_shape, kernels: Kernels):  # fmt: skip
        self.needs = need_dx, need_dw, need_db
        n_rows, n_cols = stats.shape[1], math.prod(param_shape)
        self.shape, self.param_shape = x.shape, param_shape
        bias_dtype = dtype_of(bias_dtype, x.dtype)
        self.dtypes = (x.dtype if weight is None else weight.dtype, bias_dtype)
        stride_dy, stride_x = _rows_stride(dy, n_rows, n_cols), _rows_stride(x, n_rows, n_cols)
        self.copy_dy, self.copy_x = stride_dy is None, stride_x is None
        self.copy_weight = weight is not None and not weight.is_contiguous()
        self.copy_stats = not stats.is_contiguous()
        self.fill = None
        if not (n_rows and n_cols):
            return
        block_n = next_power_of_2(n_cols)
        fused = block_n <= MAX_FUSED_BLOCK
        rows, num_warps = config(block_n) if fused else (1, 16)
        if runtime.INTERPRETED:
            programs = 4
        else:
            programs = PROGRAMS_PER_SM * _sm_count(x.device.index or 0)
        programs = min(programs, cdiv(n_rows, rows))
        # rows per program, a multiple of the program's ROWS so that its steps stay aligned
        rows_per_program = cdiv(cdiv(n_rows, programs), rows) * rows
        programs = cdiv(n_rows, rows_per_program)
        self.partial_shape = (2, programs, n_cols)  # dw's partial sums, then db's
        self.partial_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        self.make_partial = torch.empty if fused else torch.zeros  # the looped kernel adds
        sizes = (n_rows, n_cols, n_cols if stride_dy is None else stride_dy,
                 n_cols if stride_x is None else stride_x, rows_per_program)  # fmt: skip
        flags = dict(HAS_WEIGHT=weight is not None, RMS=rms, DX=need_dx, DW=need_dw, DB=need_db,
                     ACC_DTYPE=accumulator(x.dtype))  # fmt: skip
        if fused:
            # about six [ROWS, BLOCK_N] tiles at once: at least 8 warps, so that no thread
            # holds more than 16 values of each
            meta = flags | dict(BLOCK_N=block_n, ROWS=rows, num_warps=max(num_warps, 8))
            launch = BoundLaunch(kernels.backward, (programs,), meta)
            self.fill = lambda *tensors: launch(*tensors, *sizes)
        else:
            self.fill = wide_rows.backward_launch(programs, sizes, flags)
        # both sums in one launch, one program per column block and parameter
        grid = (cdiv(n_cols, PARTIAL_BLOCK_N), need_dw + need_db)
        meta = dict(BLOCK_P=PARTIAL_BLOCK_P, BLOCK_N=PARTIAL_BLOCK_N)
        self.sum_rows = BoundLaunch(kernels.sum_rows, grid, meta)
        self.sum_sizes = (programs, n_cols, 0 if need_dw else 1)

    def __call__(self, dy, x, weight, stats):
        need_dx, need_dw, need_db = self.needs
        dx = x.new_empty(self.shape) if need_dx else None
        dw = x.new_empty(self.param_shape, dtype=self.dtypes[0]) if need_dw else None
        db = x.new_empty(self.param_shape, dtype=self.dtypes[1]) if need_db else None
        if self.fill is None:  # no rows or no columns: the sums are empty sums
            return dx, None if dw is None else dw.zero_(), None if db is None else db.zero_()
        if self.copy_dy:
            dy = dy.contiguous()
        if self.copy_x:
            x = x.contiguous()
        if self.copy_weight:
            weight = weight.contiguous()
        if self.copy_stats:
            stats = stats.contiguous()
        partial = stats
        if need_dw or need_db:
            partial = self.make_partial(self.partial_shape, dtype=self.partial_dtype,
                                        device=x.device)  # fmt: skip
        # x stands in for the pointers the kernel does not read
        self.fill(dy, x, x if weight is None else weight, stats, x if dx is None else dx, partial)
        if need_dw or need_db:
            # the gradient not wanted is never written, but a graph's analysis of what a
            # launch writes counts its place as written: scratch holds it, neither x (a leaf
            # that may require grad) nor the other gradient (one tensor in two places)
            self.sum_rows(partial, partial if dw is None else dw, partial if db is None else db,
                          *self.sum_sizes)  # fmt: skip
        return dx, dw, db
