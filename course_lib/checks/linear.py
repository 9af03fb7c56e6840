"""Checks for lesson 07: a Linear layer's forward, then its forward and backward together.

`check_linear_forward(fn)` calls `fn(x, weight, bias, activation=...)` like any launcher.
`check_linear(fn)` checks y = fn(x, weight, bias, activation=...) and each of its gradients
as a case of its own: for the gradient of x, only x requires one (so a backward that
follows ctx.needs_input_grad is checked doing so), and the output's gradient is random,
never the ones that `y.sum().backward()` would send, which no forward mistake can change.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course_lib import gpu_rules, references, runtime
from course_lib.checks.conv2d import refusal_hint
from course_lib.checks.engine import (
    RAISED_HINT,
    Case,
    CaseResult,
    CheckResult,
    KnownMistake,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.gradients import (
    MissingGradient,
    NoGradient,
    NoKernelInBackward,
    require_graph,
    returned,
    wrong_gradient_count,
)
from course_lib.checks.launches import counting_launches
from course_lib.checks.matmul import (
    ACTIVATION_FIRST_HINT,
    BIAS_MISSING_HINT,
    BIAS_PER_ROW_HINT,
)
from course_lib.checks.matmul import HINTS as MATMUL_HINTS

W_NOT_TRANSPOSED_HINT = (
    "you multiplied by weight as if it were [in_features, out_features]: y = x @ weight^T, "
    "and weight is [out_features, in_features]. Read weight^T in place through its strides, "
    "stride_bk = weight.stride(1) and stride_bn = weight.stride(0). With a square weight "
    "the swap returns x @ weight; with more inputs than outputs it also reads past the "
    "weight's end"
)
LEADING_DIMS_HINT = (
    "x has leading dimensions: flatten all of them into the rows of the product, "
    "x2d = x.reshape(-1, in_features), so that M = x2d.shape[0] (not x.shape[0]), and "
    "return y reshaped to (*x.shape[:-1], out_features)"
)
FLOAT64_HINT = (
    "close, but not to float64's precision: accumulate float64 inputs in float64, "
    "acc = tl.zeros(..., dtype=ACC_DTYPE) and tl.dot(a, b, acc, out_dtype=ACC_DTYPE) with "
    "ACC_DTYPE = tl.float64 for them, or gradcheck fails"
)
WRONG_ACTIVATION_HINT = (
    "the bias is right, but you applied {got} where activation={asked!r} was asked: compare "
    'ACTIVATION with each name in its own branch (if ACTIVATION == "relu": ... elif '
    'ACTIVATION == "gelu": ...), and leave acc as it is for None'
)
NO_SLOPE_HINT = (
    "the activation's derivative is missing: the gradient reaching the product is "
    "gz = grad_y * activation'(z), and grad_x, grad_weight and grad_bias all use gz"
)
SLOPE_AT_OUTPUT_HINT = (
    "gelu's derivative was taken at the output y = gelu(z): it needs the pre-activation z. "
    "Forward must save z (linear_forward(..., save_z=True)), not y, and the kernel must "
    "store z before it applies the activation. (ReLU may use y: it is positive exactly "
    "where z is)"
)
GRAD_X_TRANSPOSED_HINT = (
    "grad_x = gz @ weight, with weight [out_features, in_features] read as it is: you used "
    "weight^T, which only a square layer lets through"
)
GRAD_WEIGHT_TRANSPOSED_HINT = (
    "grad_weight came out transposed: it is gz^T @ x, [out_features, in_features] like "
    "weight, not x^T @ gz"
)
GRAD_WEIGHT_FROM_Y_HINT = (
    "grad_weight = gz^T @ x multiplies by the layer's input x, which forward must save "
    "(ctx.save_for_backward), not by its output y"
)
BIAS_AXIS_HINT = (
    "grad_bias was summed along the wrong axis: bias[n] is added to every row, so its "
    "gradient sums gz over the rows, one value per column: [out_features]"
)
NO_GRADIENT_HINT = (
    "the result carries no gradient: a Triton kernel's output has none of its own. Return "
    "LinearFunction.apply(x, weight, bias, activation), whose backward supplies it"
)
MISSING_GRADIENT_HINT = (
    "backward must return a gradient for each input that needs one (ctx.needs_input_grad), "
    "in forward's argument order: grad_x, grad_weight, grad_bias, then None for activation"
)
GRADIENT_COUNT_HINT = (
    "backward returns one value per argument of forward, in order: grad_x, grad_weight, "
    "grad_bias and None for activation, which has no gradient"
)
NO_KERNEL_IN_BACKWARD_HINT = (
    "your backward computed the gradients with PyTorch alone: compute them with your "
    "kernels, product(gz, weight), product(gz.t(), x2d) and output_grad"
)
VIEW_HINT = (
    "a tensor with these strides has no view of the shape you asked for: flatten x and "
    "the output's gradient with reshape, which gives a view where one exists and a copy "
    "otherwise, never with view"
)
NONE_FOR_NONE_HINT = (
    "backward returned a gradient for an input that has none: None for bias when there is "
    "no bias (output_grad(..., bias_grad=False) gives None), and None for activation"
)
GRADIENT_SHAPE_HINT = (
    "the gradient of `{name}` has the wrong shape: each has its input's shape, grad_x like "
    "x, grad_weight [out_features, in_features] = gz^T @ x2d, and grad_bias [out_features], "
    "gz summed over every row"
)

Z_AFTER_ACTIVATION_HINT = (
    "the z you returned holds the activation's output: store z = acc in the epilogue after "
    "the bias and before the activation overwrites acc, and return (y, z) in that order"
)
Z_WITHOUT_BIAS_HINT = (
    "the z you returned lacks the bias: z = x @ weight^T + bias, the accumulator after the "
    "bias is added and before the activation"
)
NO_Z_HINT = (
    "with save_z=True, linear_forward returns a pair (y, z), z = x @ weight^T + bias "
    "shaped like y: allocate z, let the kernel store it where SAVE_Z, and return both"
)
Z_SHAPE_HINT = (
    "z must have y's shape, [..., out_features]: return z.view(y.shape) (or reshape it "
    "with x's leading dimensions, as y)"
)
SAVED_ORDER_HINT = (
    "forward saved the tensors in another order than backward unpacks them: backward reads "
    "x, weight, slope_from = ctx.saved_tensors, so save them in that order, "
    "ctx.save_for_backward(x or None, weight or None, y or z or None)"
)
SAVES_UNNEEDED_HINT = (
    "with the weight frozen, forward saved x, which only the weight's gradient reads: save "
    "x only where ctx.needs_input_grad[1] is True, and None in its place otherwise"
)
COMPUTES_UNWANTED_HINT = (
    "with the weight and the bias frozen, your backward launched as many kernels as with "
    "all three trained: compute only the gradients ctx.needs_input_grad asks for, and "
    "return None for the others"
)
NONE_SAVED_USED_HINT = (
    "with the weight and the bias frozen, your backward failed, though it works when all "
    "three are trained: it computes a gradient nobody asked for from a tensor forward "
    "rightly did not save (None). Compute grad_weight only where ctx.needs_input_grad[1]"
)
TORCH_PRODUCT_HINT = (
    "your backward computed a product with PyTorch ({ops}): compute both with your kernel, "
    "grad_x = product(gz, weight) and grad_weight = product(gz.t(), x2d)"
)


class NoZ(RuntimeError):
    """linear_forward(..., save_z=True) did not return a pair (y, z)."""


class SavedOutOfOrder(RuntimeError):
    """Forward saved the weight where backward unpacks x, or x where it unpacks the weight."""


class SavesUnneeded(RuntimeError):
    """Forward saved x though the weight's gradient, the only one that reads it, is not wanted."""


class ComputesUnwanted(RuntimeError):
    """The backward launched as much with inputs frozen as with all of them trained."""


class TorchProductInBackward(RuntimeError):
    """The backward computed a matrix product with PyTorch."""


class WrongOutputShape(RuntimeError):
    """The checked function's result does not have the layer's output shape."""


def _wrong_shape(case: Case, got: list[int]) -> str | None:
    x, weight = case.inputs[:2]
    rows = x.numel() // x.shape[-1]
    if case.kwargs.get("save_z") and x.dim() > 2 and got == [rows, weight.shape[0]]:
        return Z_SHAPE_HINT
    if x.dim() > 2 and got in ([rows, weight.shape[0]], [x.shape[0], weight.shape[0]]):
        return LEADING_DIMS_HINT
    if got[-1:] == [weight.shape[1]] and weight.shape[0] != weight.shape[1]:
        return W_NOT_TRANSPOSED_HINT
    return None


_INVALID_GRADIENT = re.compile(r"returned an invalid gradient at index (\d)")


def _raised(kind: str, message: str) -> str | None:
    """A hint for what a call raised: the check's own exceptions by their type, torch's
    autograd errors by their text (torch 2.11 to 2.13), which give no other handle."""
    own = {
        NoGradient.__name__: NO_GRADIENT_HINT,
        MissingGradient.__name__: MISSING_GRADIENT_HINT,
        WrongOutputShape.__name__: LEADING_DIMS_HINT,
        NoKernelInBackward.__name__: NO_KERNEL_IN_BACKWARD_HINT,
        NoZ.__name__: NO_Z_HINT,
        SavedOutOfOrder.__name__: SAVED_ORDER_HINT,
        SavesUnneeded.__name__: SAVES_UNNEEDED_HINT,
        ComputesUnwanted.__name__: COMPUTES_UNWANTED_HINT,
    }
    if kind in own:
        return own[kind]
    if kind == TorchProductInBackward.__name__:
        return TORCH_PRODUCT_HINT.format(ops=message.rsplit(": ", 1)[-1])
    if refused := refusal_hint(kind, message):
        return refused
    if "returned a gradient different than None" in message:
        return NONE_FOR_NONE_HINT
    if "Use .reshape(" in message:
        return VIEW_HINT
    if wrong_gradient_count(message):
        return GRADIENT_COUNT_HINT
    if match := _INVALID_GRADIENT.search(message):
        index = int(match.group(1))
        return GRADIENT_SHAPE_HINT.format(name=("x", "weight", "bias", "activation")[index])
    return None


HINTS = replace(
    MATMUL_HINTS,
    read_past_end=(
        "NaN where the reference is finite: a load read outside its tensor (the memory around "
        "them holds NaN during a check). Check the weight's strides (weight^T is read with "
        "stride_bk = weight.stride(1), stride_bn = weight.stride(0)), the K mask and the bias's "
        "mask"
    ),
    load_out_of_bounds=(
        "a load reached outside its tensor: check the weight's strides first (weight^T is read "
        "with stride_bk = weight.stride(1), stride_bn = weight.stride(0)), then the K mask of "
        "both loads and the bias's mask"
    ),
    dtype=(
        "y must have x's dtype: allocate it with x.dtype and store acc.to(c_ptr.dtype.element_ty)"
    ),
    wrong_shape=_wrong_shape,
    raised=_raised,
)


# --- what the usual mistakes compute, in float64 -----------------------------------------


def _weight_as_in_by_out(weight: torch.Tensor) -> torch.Tensor:
    """What a kernel reads as B [in, out] when handed weight's own strides, the classic
    mistake: B[k, n] at k * weight.stride(0) + n * weight.stride(1), NaN past the end
    (the guard band's value during a check)."""
    out_features, in_features = weight.shape
    k = torch.arange(in_features, device=weight.device)[:, None]
    n = torch.arange(out_features, device=weight.device)[None, :]
    index = k * weight.stride(0) + n * weight.stride(1)
    flat = weight.double().contiguous().reshape(-1)
    inside = index < flat.numel()
    return torch.where(inside, flat[index.clamp(max=flat.numel() - 1)], float("nan"))


def _forward64(x, weight, bias, activation, *, read=None, bias_rows=None, act_first=False,
               act=None) -> torch.Tensor:  # fmt: skip
    """The forward in float64 with one thing done wrong: the weight read as `read`, the
    bias per row (filling `bias_rows` past its end), or missing (bias None), the activation
    first, or another activation `act`."""
    x2d = x.double().reshape(-1, x.shape[-1])
    z = x2d @ (weight.double().t() if read is None else read)
    if bias is not None and not act_first:
        if bias_rows is None:
            z = z + bias.double()
        else:
            rows = torch.full((z.shape[0], 1), bias_rows, dtype=torch.float64, device=z.device)
            rows[: min(z.shape[0], bias.numel()), 0] = bias.double()[: z.shape[0]]
            z = z + rows
    y = references.linear_activation(z, activation if act is None else act)
    if bias is not None and act_first:
        y = y + bias.double()
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _forward_mistakes(activation: str | None, has_bias: bool) -> list[KnownMistake]:
    def mistake(hint, **how):
        if has_bias:
            return KnownMistake(lambda x, w, b: _forward64(x, w, b, activation, **how), hint)
        return KnownMistake(lambda x, w: _forward64(x, w, None, activation, **how), hint)

    def read_swapped(x, w, *bias):
        return _forward64(x, w, bias[0] if bias else None, activation, read=_weight_as_in_by_out(w))

    mistakes = [KnownMistake(read_swapped, W_NOT_TRANSPOSED_HINT)]
    mistakes += [
        mistake(WRONG_ACTIVATION_HINT.format(got=other or "no activation", asked=activation),
                act=other)
        for other in references.LINEAR_ACTIVATIONS
        if other != activation
    ]  # fmt: skip
    if has_bias:
        mistakes.append(KnownMistake(
            lambda x, w, b: _forward64(x, w, None, activation), BIAS_MISSING_HINT
        ))  # fmt: skip
        if activation is not None:
            mistakes.append(mistake(ACTIVATION_FIRST_HINT, act_first=True))
        mistakes += [mistake(BIAS_PER_ROW_HINT, bias_rows=fill) for fill in (float("nan"), 0.0)]
    return mistakes


def _grads64(x, weight, bias, grad_output, activation, *, slope_at_output=False,
             no_slope=False, rows=None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(x2d, y, gz) in float64 for the backward's mistakes: gz = grad_output times the
    activation's slope, taken at y where `slope_at_output`, left out where `no_slope`;
    only the first `rows` rows where given."""
    x2d = x.double().reshape(-1, x.shape[-1])
    z = references.linear_preactivation(x, weight, bias)
    y = references.linear_activation(z, activation)
    g = grad_output.double().reshape(z.shape)
    if not no_slope:
        g = g * references.linear_activation_slope(y if slope_at_output else z, activation)
    if rows is not None:
        x2d, y, g = x2d[:rows], y[:rows], g[:rows]
    return x2d, y, g


def _backward_mistakes(part: str, activation: str | None, has_bias: bool, x_shape, weight_shape):
    """What the usual wrong backwards return as the gradient of `part` ("x", "x alone",
    "weight" or "bias"), each a function of the case's inputs."""
    part = part.removesuffix(" alone")

    def mistake(hint, result, **how):
        def compute(*inputs):
            x, weight, *rest = inputs
            bias = rest[0] if has_bias else None
            x2d, y, g = _grads64(x, weight, bias, rest[-1], activation, **how)
            return result(x, weight, x2d, y, g)

        return KnownMistake(compute, hint)

    right = {
        "x": lambda x, w, x2d, y, g: (g @ w.double()).reshape(x.shape),
        "weight": lambda x, w, x2d, y, g: g.t() @ x2d,
        "bias": lambda x, w, x2d, y, g: g.sum(dim=0),
    }[part]
    mistakes = []
    if activation is not None:
        mistakes.append(mistake(NO_SLOPE_HINT, right, no_slope=True))
    if activation == "gelu":
        mistakes.append(mistake(SLOPE_AT_OUTPUT_HINT, right, slope_at_output=True))
    if len(x_shape) > 2 and part != "x":  # M taken as x.shape[0]
        mistakes.append(mistake(LEADING_DIMS_HINT, right, rows=x_shape[0]))
    square = weight_shape[0] == weight_shape[1]
    if part == "x" and square:
        mistakes.append(mistake(
            GRAD_X_TRANSPOSED_HINT, lambda x, w, x2d, y, g: (g @ w.double().t()).reshape(x.shape)
        ))  # fmt: skip
    if part == "weight" and square:
        mistakes.append(mistake(GRAD_WEIGHT_TRANSPOSED_HINT, lambda x, w, x2d, y, g: x2d.t() @ g))
        mistakes.append(mistake(GRAD_WEIGHT_FROM_Y_HINT, lambda x, w, x2d, y, g: g.t() @ y))
    if part == "bias":
        mistakes.append(mistake(BIAS_AXIS_HINT, lambda x, w, x2d, y, g: g.sum(dim=1)))
    return mistakes


# --- the cases -------------------------------------------------------------------------


def _layer(generator, x_shape, out_features, dtype, has_bias=True, x_transposed=False,
           layer_scale=False, weight_transposed=False):  # fmt: skip
    """Seeded x, weight and (where has_bias) bias: by default values near 1 and a bias as
    large as the products, so that one added after a rounding, or not at all, shows; with
    `layer_scale`, weight and bias scaled by 1 / sqrt(in_features) like nn.Linear's, so
    that y stays near 1 too."""
    in_features = x_shape[-1]
    if x_transposed and len(x_shape) == 2:  # a [rows, in] view of an [in, rows] tensor
        x = random_input(generator, x_shape[::-1], dtype).t()
    elif x_transposed:  # [B, T, in] from a [T, B, in] tensor: no view flattens it
        x = random_input(generator, (x_shape[1], x_shape[0], *x_shape[2:]), dtype).transpose(0, 1)
    else:
        x = random_input(generator, x_shape, dtype)
    scale = 1 / math.sqrt(in_features) if layer_scale else 1.0
    if weight_transposed:  # an [out, in] view of an [in, out] tensor
        weight = random_input(generator, (in_features, out_features), dtype, scale=scale).t()
    else:
        weight = random_input(generator, (out_features, in_features), dtype, scale=scale)
    inputs = (x, weight)
    if has_bias:
        scale = scale if layer_scale else math.sqrt(in_features)
        inputs += (random_input(generator, (out_features,), dtype, scale=scale),)
    return inputs


def _describe(x_shape, out_features, activation, dtype, why, has_bias=True) -> str:
    name = str(dtype).removeprefix("torch.")
    bias = "" if has_bias else ", no bias"
    return (
        f"x {list(x_shape)}, weight [{out_features}, {x_shape[-1]}]{bias} ({why}), "
        f"activation={activation!r}, {name}"
    )


def _tolerance(dtype: torch.dtype) -> str | None:
    # a float32 tl.dot runs as TF32 on a GPU unless told otherwise
    return "tf32" if dtype == torch.float32 and runtime.MODE == "gpu" else None


def _kind(x_shape, dtype) -> str:
    if dtype == torch.float64:
        return "float64"
    return "leading" if len(x_shape) > 2 else ""


def _forward_cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    cases = []

    def case(x_shape, out_features, why, activation=None, dtype=torch.float32, has_bias=True,
             x_transposed=False, weight_transposed=False, save_z=False):  # fmt: skip
        inputs = _layer(generator, x_shape, out_features, dtype, has_bias, x_transposed,
                        weight_transposed=weight_transposed)  # fmt: skip
        kwargs = (
            ({} if has_bias else {"bias": None})
            | ({} if activation is None else {"activation": activation})
            | ({"save_z": True} if save_z else {})
        )
        label = _describe(x_shape, out_features, activation, dtype, why, has_bias)
        cases.append(Case(
            f"{label}: the z of save_z=True" if save_z else label, inputs,
            "z" if save_z else _kind(x_shape, dtype), _tolerance(dtype),
            math.sqrt(x_shape[-1]), kwargs,
            reference=lambda x, w, b=None: references.linear(
                x, w, b, None if save_z else activation
            ),
            mistakes=_z_mistakes(activation) if save_z else _forward_mistakes(activation, has_bias),
            input_names=("x", "weight", "bias")[: len(inputs)],
        ))  # fmt: skip

    case((1, 1), 1, "all ones", "relu")
    case((37, 45), 29, "in > out")
    case((29, 37), 45, "out > in", "relu")
    case((33, 48), 48, "square weight", "gelu")
    case((2, 5, 45), 29, "leading dimensions [2, 5]")
    case((2, 5, 45), 29, "leading dimensions of a transposed x", "relu", x_transposed=True)
    case((37, 45), 29, "x a transposed view", "relu", x_transposed=True)
    case((37, 45), 29, "weight a transposed view", "gelu", weight_transposed=True)
    case((20, 30), 17, "bias=None", "gelu", has_bias=False)
    many = runtime.by_mode(gpu=((3, 333, 777), 1000), interpreter=((130, 77), 100))
    case(*many, "many tiles", "gelu")
    for dtype in runtime.DTYPES[1:]:
        case((2, 7, 40), 24, "leading dimensions", "relu", dtype)
    case((3, 11), 5, "gradcheck's dtype", "gelu", torch.float64)
    case((2, 5, 45), 29, "leading dimensions [2, 5]", "gelu", save_z=True)
    case((37, 45), 29, "in > out", "relu", save_z=True)
    return cases


def _z_mistakes(activation: str | None) -> list[KnownMistake]:
    """z stored after the activation, or before the bias."""
    return [
        KnownMistake(lambda x, w, b: _forward64(x, w, b, activation), Z_AFTER_ACTIVATION_HINT),
        KnownMistake(lambda x, w, b: _forward64(x, w, None, None), Z_WITHOUT_BIAS_HINT),
    ]


def _forward_with_z(fn: Callable) -> Callable:
    """fn as the forward check calls it: y, or for a case of save_z=True the z it returns."""

    @functools.wraps(fn)
    def run(*inputs, save_z: bool = False, **kwargs):
        if not save_z:
            return fn(*inputs, **kwargs)
        out = fn(*inputs, save_z=True, **kwargs)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise NoZ(f"save_z=True returned {type(out).__name__}, not a pair (y, z)")
        return out[1]

    return run


def _function_node(y: torch.Tensor):
    """The node of the torch.autograd.Function that produced y (a view of its output too),
    or None."""
    todo, seen = [y.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            return node
        todo += [parent for parent, _ in node.next_functions]
    return None


def _shares_memory(a, b: torch.Tensor) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def _check_saved(y, x, weight, x_alone: bool) -> None:
    """What the Function saved: x where backward unpacks x, the weight where it unpacks the
    weight, and no x where the weight's gradient is not wanted."""
    node = _function_node(y)
    saved = tuple(getattr(node, "saved_tensors", ()) or ())
    if len(saved) >= 2 and (
        _shares_memory(saved[0], weight) or _shares_memory(saved[1], x)
    ) and not _shares_memory(saved[0], x):  # fmt: skip
        raise SavedOutOfOrder("forward saved the weight first, or x second")
    if x_alone and any(_shares_memory(t, x) for t in saved):
        raise SavesUnneeded("forward saved x, though the weight is frozen")


_PRODUCTS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "mv", "addmv", "dot", "linear")


class _TorchProducts(TorchDispatchMode):
    """Records the matrix products PyTorch computes while it is active."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _PRODUCTS and name not in self.found:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def _launches_all_trained(fn, x, weight, bias, grad_output, kwargs) -> int | None:
    """How many kernels fn's backward launches with x, weight and bias all trained; None
    where that fails (the other cases say why)."""
    leaves = [t.detach().requires_grad_(True) for t in (x, weight, bias) if t is not None]
    try:
        y = fn(leaves[0], leaves[1], leaves[2] if bias is not None else None, **kwargs)
        with counting_launches() as launches, _TorchProducts() as products:
            torch.autograd.grad(y, leaves, grad_output, allow_unused=True)
    except Exception:  # noqa: BLE001
        return None
    return None if products.found else launches[0]  # PyTorch's products: named elsewhere


def _run_part(fn: Callable, part: str) -> Callable:
    """fn's output y for part "y"; else the gradient of the input `part` that autograd
    computes through fn for the case's random grad_output (the inputs' last), with every
    input requiring one, as in training, or, for part "x alone", x only, as in a frozen
    layer."""

    def run(x, weight, *rest, activation=None):
        *bias_given, grad_output = rest
        bias = bias_given[0].detach() if bias_given else None
        leaves = {"x": x.detach(), "weight": weight.detach(), "bias": bias}
        wanted = part.removesuffix(" alone")
        trained = [wanted] if part.endswith(" alone") else ["x", "weight", "bias"]
        trained = [name for name in trained if leaves[name] is not None]
        if part != "y":
            for name in trained:
                leaves[name].requires_grad_(True)
        kwargs = {} if activation is None else {"activation": activation}
        y = fn(leaves["x"], leaves["weight"], leaves["bias"], **kwargs)
        if part == "y":
            return y.detach() if isinstance(y, torch.Tensor) else y
        require_graph(y)
        if y.shape != grad_output.shape:
            raise WrongOutputShape(f"y has shape {list(y.shape)}, not {list(grad_output.shape)}")
        alone = part.endswith(" alone")
        _check_saved(y, leaves["x"], leaves["weight"], alone)
        with counting_launches() as launches, _TorchProducts() as products:
            grads = torch.autograd.grad(
                y, [leaves[name] for name in trained], grad_output, allow_unused=True
            )
        if launches[0] == 0:
            raise NoKernelInBackward("the backward launched no Triton kernel")
        if products.found:
            raise TorchProductInBackward(
                f"the backward ran PyTorch's products: {', '.join(products.found)}"
            )
        if alone:
            everything = _launches_all_trained(fn, x, weight, bias, grad_output, kwargs)
            if everything is not None and launches[0] >= everything:
                raise ComputesUnwanted(
                    f"{launches[0]} launches with the weight frozen, {everything} with it trained"
                )
        return returned(grads[trained.index(wanted)], wanted)

    return run


RELU_DEAD_ZONE = 0.05  # |z| below this gets no gradient in the ReLU cases
PARTS = {"y": "forward: y", "x": "grad_x", "weight": "grad_weight", "bias": "grad_bias",
         "x alone": "grad_x, weight and bias frozen"}  # fmt: skip


def _autograd_cases(seed: int) -> list[tuple[str, Case]]:
    """(part, case): each layer's y and each of its gradients as a case of its own."""
    generator = case_generator(seed)
    cases = []

    def layer(x_shape, out_features, why, activation=None, dtype=torch.float32, has_bias=True,
              frozen=False, g_transposed=False):  # fmt: skip
        # y near 1, so that a mistake that multiplies by y is told apart within the tolerance
        inputs = _layer(generator, x_shape, out_features, dtype, has_bias, layer_scale=True)
        grad_output = random_input(generator, (*x_shape[:-1], out_features), dtype)
        if activation == "relu":
            # ReLU's slope jumps at z = 0: where z is within a rounding of it (TF32's, say)
            # either slope is right, so the output's gradient is 0 there
            z = references.linear(*(t.double() for t in inputs))
            grad_output = grad_output.masked_fill(z.abs() < RELU_DEAD_ZONE, 0.0)
        if g_transposed:  # the same values with other strides, as autograd may hand them over
            grad_output = grad_output.transpose(0, 1).contiguous().transpose(0, 1)
        inputs += (grad_output,)
        label = _describe(x_shape, out_features, activation, dtype, why, has_bias)
        names = (
            ("x", "weight", "bias", "grad_output") if has_bias else ("x", "weight", "grad_output")
        )
        rows = math.prod(x_shape[:-1])
        for part, what in PARTS.items():
            if (part == "bias" and not has_bias) or (part == "x alone" and not frozen):
                continue
            # the sum each result is made of: in_features terms for y, out_features for
            # grad_x, one per row for grad_weight and grad_bias
            terms = {"y": x_shape[-1], "x": out_features, "x alone": out_features}.get(part, rows)
            cases.append((part, Case(
                f"{label}: {what}", inputs, _kind(x_shape, dtype), _tolerance(dtype),
                math.sqrt(terms), {} if activation is None else {"activation": activation},
                reference=_part_reference(part, activation, has_bias),
                mistakes=(
                    _forward_mistakes(activation, has_bias) if part == "y"
                    else _backward_mistakes(part, activation, has_bias, x_shape,
                                            (out_features, x_shape[-1]))
                ),
                input_names=names,
            )))  # fmt: skip

    layer((37, 45), 29, "in > out, grad_output column-major", frozen=True, g_transposed=True)
    layer((2, 5, 45), 29, "leading dimensions [2, 5], grad_output transposed", "relu",
          frozen=True, g_transposed=True)  # fmt: skip
    layer((48, 48), 48, "square: M = in = out", "gelu")
    layer((20, 30), 17, "bias=None", "gelu", has_bias=False)
    many = runtime.by_mode(gpu=((4, 100, 300), 200), interpreter=((70, 50), 60))
    layer(*many, "many tiles", "relu")
    for dtype in runtime.DTYPES[1:]:
        layer((2, 7, 40), 24, "leading dimensions", "relu", dtype)
    layer((3, 11), 5, "gradcheck's dtype", "gelu", torch.float64)
    return cases


def _part_reference(part: str, activation: str | None, has_bias: bool) -> Callable:
    def reference(x, weight, *rest):
        bias = rest[0] if has_bias else None
        if part == "y":
            return references.linear(x, weight, bias, activation)
        grads = references.linear_grads(x, weight, bias, rest[-1], activation)
        return grads[("x", "weight", "bias").index(part.removesuffix(" alone"))]

    return reference


# --- hints only a comparison of cases reveals ------------------------------------------


# mistakes that only a square case shows as wrong values, by the part they are in; the
# others fail the same way with an error, a wrong shape or a read past the end
SQUARE_ONLY = {
    W_NOT_TRANSPOSED_HINT: "y",
    GRAD_X_TRANSPOSED_HINT: "x",
    GRAD_WEIGHT_TRANSPOSED_HINT: "weight",
    GRAD_WEIGHT_FROM_Y_HINT: "weight",
    BIAS_AXIS_HINT: "bias",
}


def _refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """Hints that only a comparison of cases reveals."""
    shown = {SQUARE_ONLY[r.hint]: r.hint for r in results if r.hint in SQUARE_ONLY}
    plain_pass = all(r.passed for c, r in zip(cases, results) if c.kind == "")
    for case, result in zip(cases, results):
        part = case.kwargs.get("part", "y").removesuffix(" alone")
        vague = {HINTS.read_past_end, HINTS.load_out_of_bounds, HINTS.wrong_values, HINTS.zeros,
                 RAISED_HINT, GRADIENT_SHAPE_HINT.format(name=part), None}  # fmt: skip
        if result.passed:
            continue
        # with every input requiring a gradient, one of the wrong shape stops all of them
        wrong_shape = [p for p in ("x", "weight", "bias") if GRADIENT_SHAPE_HINT.format(name=p)
                       == result.hint and p in shown]  # fmt: skip
        if wrong_shape:
            result.hint = shown[wrong_shape[0]]
        elif part in shown and result.hint in vague:
            result.hint = shown[part]
        elif case.kind == "leading" and plain_pass and "unwritten" in result.kinds:
            result.hint = LEADING_DIMS_HINT
        elif case.kind == "float64" and plain_pass and (result.relative_error or 1) < 1e-4:
            result.hint = FLOAT64_HINT
        elif (
            case.kwargs.get("part") == "x alone" and "NoneType" in " ".join(result.problems)
            and all(r.passed for c, r in zip(cases, results)
                    if c.kwargs.get("part") == "x" and c.inputs[0] is case.inputs[0])
        ):  # fmt: skip
            result.hint = NONE_SAVED_USED_HINT


def check_linear_forward(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x, weight, bias, activation=...)`, your forward for lesson 07, against
    activation(x @ weight^T + bias) computed in float64 and rounded once."""
    if not callable(fn):
        raise TypeError(f"check_linear_forward expects your function, got {type(fn).__name__}")
    return run_check(
        "linear_forward", gpu_rules.refusing(_forward_with_z(fn)), _forward_cases(seed=17),
        references.linear, (), HINTS, _refine,
    )  # fmt: skip


def check_linear(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x, weight, bias, activation=...)`, your Linear through autograd, for lesson
    07: its output, and the gradients of x, weight and bias that its backward gives for a
    random grad_output, against float64 computations rounded once."""
    if not callable(fn):
        raise TypeError(f"check_linear expects your function, got {type(fn).__name__}")
    by_part = {part: _run_part(fn, part) for part in PARTS}

    def run(*inputs, part: str, **kwargs):
        return by_part[part](*inputs, **kwargs)

    cases = [
        replace(case, kwargs=case.kwargs | {"part": part}) for part, case in _autograd_cases(19)
    ]
    return run_check("linear", gpu_rules.refusing(run), cases, references.linear, (), HINTS,
                     _refine)  # fmt: skip
