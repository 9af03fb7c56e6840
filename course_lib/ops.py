"""Lesson 08: the course's finished kernels as PyTorch operators, for torch.compile.

torch.compile cannot trace into a finished kernel's launcher: the launcher reads tensor
pointers and strides on the host and caches compiled kernels, which Dynamo, tracing with
fake tensors that hold no memory, cannot follow. Registered as an operator, a launcher
becomes one opaque step for the compiler: its fake (``register_fake``) says what it
returns (shape, dtype, strides) without running it, and ``register_autograd`` gives it a
backward. That works in both modes: on a GPU with Inductor, and in the interpreter with
any backend.

Lesson 08's learners register theirs with ``torch.library.custom_op``, which checks what
the function returns on every call. These operators are declared with the lower-level
``torch.library.Library`` instead, whose calls go straight to the launcher: on an H100
host that saved about 12 µs per eager call of softmax (35 against 23 µs). On a GPU the
compiler may also take each operator apart, as it does one made with
``torch.library.triton_op``, and launch the kernels from its own code (see _taken_apart).

    from course_lib import ops
    y = torch.compile(lambda x: ops.softmax(x) * 2, fullgraph=True)(x)

`linear` and `Linear` differentiate through lesson 07's Triton backward, itself one
more operator.
"""

from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from course_lib import runtime
from course_lib.kernels import linear as linear_kernels
from course_lib.kernels import matmul as matmul_kernels
from course_lib.kernels import softmax as softmax_kernels
from course_lib.kernels._launch import NotTraceable
from course_lib.kernels._plan import launching_into_graph

COMPILE_BACKEND = runtime.COMPILE_BACKEND  # "inductor" on a GPU, "aot_eager" in the interpreter


_LIBRARY = torch.library.Library("course", "DEF")


def _operator(schema: str, implementation, fake):
    """Declare course::<schema>, implemented by `implementation` on every device (the
    launcher itself checks where the tensors are) and described to the compiler by `fake`;
    on a GPU, one that the compiler may take apart (see _taken_apart)."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, implementation, "CompositeExplicitAutograd")
    torch.library.register_fake(f"course::{name}", fake, lib=_LIBRARY)
    if not runtime.INTERPRETED:
        torch.library.register_torch_dispatch(
            f"course::{name}", FunctionalTensorMode, _taken_apart(implementation), lib=_LIBRARY
        )  # fmt: skip
    return getattr(torch.ops.course, name).default


def _taken_apart(implementation):
    """How torch.compile traces the operator on a GPU: AOTAutograd makes every graph
    functional under FunctionalTensorMode, and this rule runs the implementation there,
    on the traced tensors, with each kernel launch recorded into the graph by
    torch.library.wrap_triton, as torch.library.triton_op does. Inductor then launches
    the kernels from its own generated code, and a compiled call no longer pays for the
    dispatcher, autograd's wrapper and the launcher in Python: on an H100 host a compiled
    call of softmax at 4096 x 781 went from 100 to 63 µs (a compiled `x * 2`: 59 µs). An
    autotuned kernel goes in with the config the course's autotuner chose for its sizes. A
    launch the graph does not take (see NotTraceable) leaves the operator one opaque call,
    as every operator is in the interpreter, where wrap_triton records no kernel."""

    def rule(mode, op, types, args, kwargs):
        if not all(
            t in (torch.Tensor, FunctionalTensor) or issubclass(t, FakeTensor) for t in types
        ):
            return NotImplemented  # a tensor subclass of another kind handles the call
        try:
            with mode, launching_into_graph():
                return implementation(*args, **kwargs)
        except NotTraceable:
            return mode.__torch_dispatch__(op, types, args, kwargs)

    return rule


_softmax = _operator(
    "softmax(Tensor x) -> Tensor",
    softmax_kernels.softmax,
    lambda x: x.new_empty(x.shape),  # a new contiguous tensor, whatever x's strides
)


def _setup_softmax(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad_y):
    (y,) = ctx.saved_tensors
    # d softmax: y * (g - sum(g * y)) along the row; in PyTorch, no kernel of the course's
    return y * (grad_y - (grad_y * y).sum(dim=-1, keepdim=True))


torch.library.register_autograd(
    "course::softmax", _softmax_backward, setup_context=_setup_softmax, lib=_LIBRARY
)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D x, as kernels.softmax.softmax, callable
    inside torch.compile(fullgraph=True). Differentiable (its backward is PyTorch's)."""
    return _softmax(x)


def _matmul_fake(a, b, activation=None):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul expects a [M, K] and b [K, N]; got {list(a.shape)} and {list(b.shape)}"
        )
    return a.new_empty((a.shape[0], b.shape[1]))


_matmul = _operator(
    "matmul(Tensor a, Tensor b, str? activation=None) -> Tensor",
    matmul_kernels.matmul,
    _matmul_fake,
)


def _matmul_backward(ctx, grad_c):
    a, b, c = ctx.saved_tensors
    if ctx.activation == "relu":
        grad_c = grad_c * (c > 0)
    # both products through strides, by the same operator
    grad_a = _matmul(grad_c, b.t()) if ctx.needs_input_grad[0] else None
    grad_b = _matmul(a.t(), grad_c) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


def _setup_matmul(ctx, inputs, output):
    a, b, *activation = inputs  # the activation only where it was passed
    ctx.activation = activation[0] if activation else None
    needs_a, needs_b = ctx.needs_input_grad[:2]
    # grad_a reads b, grad_b reads a, relu's slope the output: each kept only where needed
    ctx.save_for_backward(
        a if needs_b else None, b if needs_a else None,
        output if ctx.activation == "relu" else None,
    )  # fmt: skip


torch.library.register_autograd(
    "course::matmul", _matmul_backward, setup_context=_setup_matmul, lib=_LIBRARY
)


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """a @ b, as kernels.matmul.matmul, callable inside torch.compile(fullgraph=True).
    Differentiable: its backward is two more products by the same kernels."""
    return _matmul(a, b, activation)


def _linear_forward(x, weight, bias, activation, save_preactivation):
    y, z, _ = linear_kernels.forward(x, weight, bias, activation, save_preactivation)
    # an operator returns tensors, never None: no z is an empty one
    return y, z if z is not None else x.new_empty(0)


def _linear_forward_fake(x, weight, bias, activation, save_preactivation):
    y = x.new_empty((*x.shape[:-1], weight.shape[0]))
    rows = math.prod(x.shape[:-1])
    return y, x.new_empty((rows, weight.shape[0]) if save_preactivation else 0)


_linear = _operator(
    "linear(Tensor x, Tensor weight, Tensor? bias, str? activation, bool save_preactivation)"
    " -> (Tensor, Tensor)",
    _linear_forward,
    _linear_forward_fake,
)


def _linear_backward_impl(grad_y, x, weight, saved, activation, x_shape, needs):
    needs_x, needs_weight, needs_bias = needs
    x2d = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if needs_weight else None
    grads = linear_kernels.input_gradients(
        grad_y, x2d, weight if needs_x else None, saved if activation else None, activation,
        needs_bias,
    )  # fmt: skip
    grad_x, grad_weight, grad_bias = (g if g is not None else grad_y.new_empty(0) for g in grads)
    return grad_x.view(x_shape) if needs_x else grad_x, grad_weight, grad_bias


def _linear_backward_fake(grad_y, x, weight, saved, activation, x_shape, needs):
    out_features, in_features = grad_y.shape[-1], x_shape[-1]
    shapes = (x_shape, (out_features, in_features), (out_features,))
    return tuple(grad_y.new_empty(shape if need else 0) for shape, need in zip(shapes, needs))


_linear_backward = _operator(
    "linear_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor saved, str? activation, "
    "SymInt[] x_shape, bool[] needs) -> (Tensor, Tensor, Tensor)",
    _linear_backward_impl,
    _linear_backward_fake,
)


def _linear_autograd_setup(ctx, inputs, output):
    x, weight, bias, activation, _ = inputs
    y, z = output
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    # what the backward reads, no more: x for grad_weight, weight for grad_x, and the
    # activation's slope from relu's output or gelu's pre-activation
    saved = z if activation == "gelu" else y if activation == "relu" else None
    ctx.save_for_backward(
        x if needs_weight else None, weight if needs_x else None, saved
    )  # fmt: skip
    ctx.activation, ctx.x_shape = activation, list(x.shape)
    ctx.needs = [needs_x, needs_weight, needs_bias and bias is not None]
    # z is an output only to be saved: no gradient flows into it, so autograd need not
    # fill a zero [M, out] tensor for it on every backward
    ctx.set_materialize_grads(False)


def _linear_autograd_backward(ctx, grad_y, grad_z):
    x, weight, saved = ctx.saved_tensors
    if grad_y is None:  # y did not reach the loss
        return None, None, None, None, None
    # the operator wants tensors: an empty one stands for what was not saved
    empty = grad_y.new_empty(0)
    grads = _linear_backward(
        grad_y, x if x is not None else empty, weight if weight is not None else empty,
        saved if saved is not None else empty, ctx.activation, ctx.x_shape, ctx.needs,
    )  # fmt: skip
    grad_x, grad_weight, grad_bias = (g if need else None for g, need in zip(grads, ctx.needs))
    return grad_x, grad_weight, grad_bias, None, None


torch.library.register_autograd(
    "course::linear", _linear_autograd_backward, setup_context=_linear_autograd_setup,
    lib=_LIBRARY,
)  # fmt: skip


def _refuse_double_backward(ctx, *grads):
    raise RuntimeError(
        "course_lib.ops.linear is differentiable once: its backward's kernels record no "
        "graph to differentiate again (use torch.nn.functional.linear for higher derivatives)"
    )


# without an autograd of its own, a second backward would run through the backward's
# result as if it were constant, and be silently wrong
torch.library.register_autograd("course::linear_backward", _refuse_double_backward, lib=_LIBRARY)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:  # fmt: skip
    """activation(x @ weight^T + bias) with lesson 07's Triton forward and backward, as
    kernels.linear.linear, callable inside torch.compile(fullgraph=True)."""
    linear_kernels.check_arguments(x, weight, bias, activation)
    tracked = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    # gelu's backward needs z = x @ W^T + b; store it only when a backward may come
    return _linear(x, weight, bias, activation, activation == "gelu" and tracked)[0]


class Linear(linear_kernels.Linear):
    """lesson 07's Linear (an nn.Linear with the same parameters, initialisation and
    state_dict, and an optional fused activation) through the `linear` operator, so that
    it compiles."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.activation)


# --- lesson 09: layer norm and RMSNorm ---------------------------------------------------
# Declared without _operator's rule for taking an operator apart: these launchers launch
# their kernels plainly, so the operator stays one opaque call on a GPU too.

from course_lib.kernels import layer_norm as norm_kernels  # noqa: E402


def _norm_forward_fake(x2d, weight, bias, eps, rms):
    stats = torch.float64 if x2d.dtype == torch.float64 else torch.float32
    rows = x2d.shape[0]
    return (
        x2d.new_empty(x2d.shape), x2d.new_empty(0 if rms else rows, dtype=stats),
        x2d.new_empty(rows, dtype=stats),
    )  # fmt: skip


def _norm_backward_impl(dy, x2d, weight, mean, rstd, needs, rms, bias_dtype):
    grads = norm_kernels.norm_backward(dy, x2d, weight, mean, rstd, needs, rms, bias_dtype)
    return tuple(g if g is not None else dy.new_empty(0) for g in grads)


def _norm_backward_fake(dy, x2d, weight, mean, rstd, needs, rms, bias_dtype):
    n_cols = x2d.shape[1]
    dtypes = (x2d.dtype, weight.dtype if weight is not None else x2d.dtype, bias_dtype)
    shapes = (x2d.shape, (n_cols,), (n_cols,))
    return tuple(
        dy.new_empty(shape if need else 0, dtype=dtype or x2d.dtype)
        for shape, need, dtype in zip(shapes, needs, dtypes)
    )  # fmt: skip


for _schema, _impl, _fake in (
    ("norm_forward(Tensor x2d, Tensor? weight, Tensor? bias, float eps, bool rms)"
     " -> (Tensor, Tensor, Tensor)", norm_kernels.norm_forward, _norm_forward_fake),
    ("norm_backward(Tensor dy, Tensor x2d, Tensor? weight, Tensor mean, Tensor rstd, "
     "bool[] needs, bool rms, ScalarType? bias_dtype) -> (Tensor, Tensor, Tensor)",
     _norm_backward_impl, _norm_backward_fake),
):  # fmt: skip
    _LIBRARY.define(_schema)
    _LIBRARY.impl(_schema.split("(", 1)[0], _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"course::{_schema.split('(', 1)[0]}", _fake, lib=_LIBRARY)


def _norm_autograd_setup(ctx, inputs, output):
    x2d, weight, bias, _, rms = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x2d, weight, mean, rstd)
    ctx.rms, ctx.bias_dtype = rms, bias.dtype if bias is not None else None
    needs = ctx.needs_input_grad
    ctx.needs = [needs[0], weight is not None and needs[1], bias is not None and needs[2]]
    ctx.set_materialize_grads(False)  # mean and rstd are saved, never differentiated


def _norm_autograd_backward(ctx, grad_y, grad_mean, grad_rstd):
    x2d, weight, mean, rstd = ctx.saved_tensors
    if grad_y is None:  # y did not reach the loss
        return None, None, None, None, None
    grads = torch.ops.course.norm_backward(
        grad_y, x2d, weight, mean, rstd, ctx.needs, ctx.rms, ctx.bias_dtype
    )  # fmt: skip
    grad_x, grad_weight, grad_bias = (g if need else None for g, need in zip(grads, ctx.needs))
    return grad_x, grad_weight, grad_bias, None, None


def _refuse_norm_double_backward(ctx, *grads):
    raise RuntimeError(
        "course_lib.ops.layer_norm and rms_norm are differentiable once: use "
        "torch.nn.functional's for higher derivatives"
    )


torch.library.register_autograd(
    "course::norm_forward", _norm_autograd_backward, setup_context=_norm_autograd_setup,
    lib=_LIBRARY,
)  # fmt: skip
torch.library.register_autograd(
    "course::norm_backward", _refuse_norm_double_backward, lib=_LIBRARY
)  # fmt: skip


def _norm(x, shape, weight, bias, eps, rms):
    n_cols = math.prod(shape)
    x2d = norm_kernels._rows(x, n_cols)
    flat = lambda p: None if p is None else p.reshape(n_cols)  # noqa: E731
    y = torch.ops.course.norm_forward(x2d, flat(weight), flat(bias), eps, rms)[0]
    return y.view(x.shape)


def layer_norm(
    x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, eps: float = 1e-5,
) -> torch.Tensor:  # fmt: skip
    """kernels.layer_norm.layer_norm (torch.nn.functional.layer_norm's semantics, lesson
    09's Triton forward and backward), callable inside torch.compile(fullgraph=True)."""
    shape = norm_kernels._check("layer_norm", x, normalized_shape, {"weight": weight, "bias": bias})
    return _norm(x, shape, weight, bias, float(eps), False)


def rms_norm(
    x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """kernels.layer_norm.rms_norm (torch.nn.functional.rms_norm's semantics), callable
    inside torch.compile(fullgraph=True)."""
    shape = norm_kernels._check("rms_norm", x, normalized_shape, {"weight": weight})
    if eps is None:
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    return _norm(x, shape, weight, None, float(eps), True)


# --- lesson 10: flash attention --------------------------------------------------------------
# Declared plainly, as layer norm's: the operator stays one opaque call on a GPU too, its
# forward's autotuned launch made by the finished kernel's own launcher.

from course_lib.kernels import attention as attention_kernels  # noqa: E402


def _attention_forward_fake(q, k, v, causal, scale):
    lse = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=lse)


def _attention_backward_fake(do, q, k, v, o, lse, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_backward_impl(do, q, k, v, o, lse, causal, scale):
    return attention_kernels.backward(do, q, k, v, o, lse, causal, scale)


for _schema, _impl, _fake in (
    ("attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float? scale)"
     " -> (Tensor, Tensor)", attention_kernels.forward, _attention_forward_fake),
    ("attention_backward(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
     "bool causal, float? scale) -> (Tensor, Tensor, Tensor)", _attention_backward_impl,
     _attention_backward_fake),
):  # fmt: skip
    _LIBRARY.define(_schema)
    _LIBRARY.impl(_schema.split("(", 1)[0], _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"course::{_schema.split('(', 1)[0]}", _fake, lib=_LIBRARY)


def _attention_autograd_setup(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)  # O(N): the scores are recomputed from lse
    ctx.causal, ctx.scale = causal, scale
    ctx.set_materialize_grads(False)  # lse is saved, never differentiated


def _attention_autograd_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    if grad_o is None:  # o did not reach the loss
        return None, None, None, None, None
    grads = torch.ops.course.attention_backward(grad_o, q, k, v, o, lse, ctx.causal, ctx.scale)
    return *grads, None, None


def _refuse_attention_double_backward(ctx, *grads):
    raise RuntimeError(
        "course_lib.ops.attention is differentiable once: use "
        "torch.nn.functional.scaled_dot_product_attention for higher derivatives"
    )


torch.library.register_autograd(
    "course::attention_forward", _attention_autograd_backward,
    setup_context=_attention_autograd_setup, lib=_LIBRARY,
)  # fmt: skip
torch.library.register_autograd(
    "course::attention_backward", _refuse_attention_double_backward, lib=_LIBRARY
)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """kernels.attention.attention (scaled_dot_product_attention's semantics, grouped-query
    attention included, lesson 10's Triton forward and backward), callable inside
    torch.compile(fullgraph=True)."""
    attention_kernels.check_arguments(q, k, v, causal, scale)
    return torch.ops.course.attention_forward(
        q, k, v, causal, None if scale is None else float(scale)
    )[0]
