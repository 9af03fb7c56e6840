"""Checks for lesson 09: layer norm's forward, layer norm through autograd, RMSNorm.

`check_layer_norm_forward(fn)` calls `fn(x, weight, bias, eps=..., BLOCK_SIZE=256)` and
checks the (y, mean, rstd) it returns, each as a case of its own, on rows of many blocks.
`check_layer_norm(fn)` and `check_rms_norm(fn)` check y = fn(x, weight, bias, eps=...)
(`fn(x, weight, eps=...)` for RMSNorm) and each gradient autograd computes through it for
a random output gradient, as lesson 07's check_linear does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from course_lib import references, runtime
from course_lib.checks.engine import (
    RAISED_HINT,
    Case,
    CaseResult,
    CheckResult,
    Hints,
    KnownMistake,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.gradients import (
    MissingGradient,
    NoGradient,
    NoKernelInBackward,
    kernel_gradients,
    returned,
)

LOOP_BLOCK = 256  # the BLOCK_SIZE check_layer_norm_forward asks for: most rows take several

CUT_OFF_HINT = (
    "each row was handled only up to one block: rows wider than BLOCK_SIZE must be read in "
    "a loop over blocks of columns, for start in range(0, n_cols, BLOCK_SIZE), in every pass "
    "(the mean, the variance, and the normalised store)"
)
UNBIASED_HINT = (
    "you divided the sum of squared deviations by n - 1 (the unbiased variance): layer norm "
    "uses the biased one, var = sum((x - mean)²) / n"
)
EPS_OUTSIDE_HINT = (
    "eps belongs inside the square root, rstd = 1 / sqrt(var + eps): 1 / (sqrt(var) + eps) "
    "is almost the same for rows of variance near 1, and far off for rows whose variance is "
    "close to eps, as here"
)
WRONG_AXIS_HINT = (
    "you normalised each column (axis 0), over the rows: layer norm takes the mean and "
    "variance of each row, over its n_cols columns (axis=1 of a [ROWS, BLOCK] tile)"
)
HALF_HINT = (
    "the float32 cases pass and this 16-bit one does not: your statistics are computed in "
    "16 bits, whose sums drop the small terms of a long row, and whose float16 squares past "
    "65504 overflow to inf. Convert after loading, x = x.to(tl.float32), and keep the sums, "
    "the mean, the variance and rstd in float32"
)
ONE_PASS_HINT = (
    "only the rows with a large mean fail: a variance from sum(x²)/n - mean² subtracts two "
    "nearly equal large numbers and loses the digits that matter. Compute the mean first, "
    "then the sum of (x - mean)² (or merge blocks with Welford's update)"
)
RSTD_STD_HINT = (
    "you saved sqrt(var + eps), the standard deviation: the backward expects rstd, its "
    "reciprocal, 1 / sqrt(var + eps)"
)
RSTD_NO_EPS_HINT = (
    "the rstd used here leaves eps out, 1 / sqrt(var): it must be the forward's own, "
    "1 / sqrt(var + eps), saved by the forward and loaded, not recomputed differently"
)
DX_NO_MEAN_HINT = (
    "dx is missing the mean of w·dy: dx = rstd · (w·dy - mean(w·dy) - x̂ · mean(x̂ · w·dy)); "
    "the mean's own gradient brings the mean(w·dy) term"
)
DX_NO_XHAT_HINT = (
    "dx is missing x̂ · mean(x̂ · w·dy): dx = rstd · (w·dy - mean(w·dy) - x̂ · mean(x̂ · w·dy)); "
    "the variance's gradient brings that term"
)
DX_NO_WEIGHT_HINT = (
    "dx used dy where it needs w·dy: the gradient reaching x̂ is dy times the weight, in "
    "every term of dx"
)
DW_NO_XHAT_HINT = (
    "grad_weight = sum over rows of dy · x̂: you summed dy alone (that is the bias's gradient)"
)
DW_RAW_X_HINT = (
    "grad_weight = sum over rows of dy · x̂, with x̂ = (x - mean) · rstd: you multiplied by x itself"
)
SOME_ROWS_HINT = (
    "the {what} holds the sum over only some of the rows: every row adds to it. Each program "
    "must add all its rows into its accumulator (+=, not =), store its partial row, and a "
    "second kernel must add the partial rows of every program"
)
RMS_MEAN_HINT = (
    "you subtracted the mean: RMSNorm does not. y = x / sqrt(mean(x²) + eps) · w, with no "
    "mean and no bias"
)
RMS_DX_EXTRA_HINT = (
    "dx subtracts mean(w·dy), a term of layer norm's backward: RMSNorm has no mean, so "
    "dx = rstd · (w·dy - x̂ · mean(x̂ · w·dy))"
)
RMS_DX_MISSING_HINT = (
    "dx is missing x̂ · mean(x̂ · w·dy): dx = rstd · (w·dy - x̂ · mean(x̂ · w·dy)); rstd depends "
    "on every x of the row"
)
RMS_EPS_HINT = (
    "with eps=None, torch's rms_norm adds the machine epsilon of the dtype it computes the "
    "statistics in: torch.finfo(torch.float32).eps for float32, float16 and bfloat16 inputs "
    "(torch.finfo(torch.float64).eps for float64). Your eps is another value"
)
NO_GRADIENT_HINT = (
    "the result carries no gradient: return the output of your autograd Function, "
    "Function.apply(...), whose backward supplies it"
)
NO_KERNEL_IN_BACKWARD_HINT = (
    "your backward computed the gradients with PyTorch alone: launch your backward kernels"
)
MISSING_GRADIENT_HINT = (
    "backward must return a gradient for each input that needs one, in forward's order "
    "(None for the arguments that have none, such as eps)"
)
NOT_THREE_HINT = "return the three tensors, y, mean and rstd, as a tuple: return y, mean, rstd"


class NotThree(RuntimeError):
    """The forward did not return (y, mean, rstd)."""


def _raised(kind: str, message: str) -> str | None:
    return {
        NoGradient.__name__: NO_GRADIENT_HINT,
        MissingGradient.__name__: MISSING_GRADIENT_HINT,
        NoKernelInBackward.__name__: NO_KERNEL_IN_BACKWARD_HINT,
        NotThree.__name__: NOT_THREE_HINT,
    }.get(kind)


HINTS = Hints(
    out_of_bounds=(
        "the kernel wrote past the end of a row or of the output: mask every load and store "
        "with cols < n_cols, and the rows with rows < n_rows"
    ),
    missing_columns=CUT_OFF_HINT,
    stops_short_2d=CUT_OFF_HINT,
    missing_rows="launch one program per row: grid = (n_rows,)",
    grid_too_small="launch one program per row: grid = (n_rows,)",
    scattered=(
        "elements inside the rows were never written: check the store's pointer, its offsets "
        "and its mask, and that every row has a program"
    ),
    read_past_end=(
        "NaN where the reference is finite: a load read outside its tensor (the memory around "
        "it holds NaN during a check). Mask the loads with cols < n_cols; for 1-D tensors of "
        "one value per row (mean, rstd) index by the row, not by the column"
    ),
    raised=_raised,
)


# --- what the usual mistakes compute, in float64 ------------------------------------------


def _stats(x2, eps, *, rms=False, unbiased=False, eps_outside=False, block=None, rstd="right"):
    """(mean, rstd) [M, 1] of the rows of x2 in float64, with one thing done wrong: the
    unbiased variance, eps outside the root, sums over the first `block` columns only
    (divided by n all the same), or an rstd that is the standard deviation ("std") or
    leaves eps out ("no eps")."""
    part = x2[:, :block] if block else x2
    n = x2.shape[1]
    mean = torch.zeros_like(part[:, :1]) if rms else part.sum(dim=1, keepdim=True) / n
    var = ((part - mean) ** 2).sum(dim=1, keepdim=True) / (n - 1 if unbiased else n)
    if rstd == "std":
        return mean, (var + eps).sqrt()
    if rstd == "no eps":
        return mean, 1 / var.sqrt()
    return mean, 1 / (var.sqrt() + eps) if eps_outside else 1 / (var + eps).sqrt()


def _flat(x, w):
    n = x.shape[-1]
    return x.double().reshape(-1, n), (torch.ones(n, dtype=torch.float64, device=x.device)
                                       if w is None else w.double())  # fmt: skip


def _forward64(x, w, b, eps, *, part="y", axis=1, **how) -> torch.Tensor:
    """Layer norm's y, mean or rstd (`part`) in float64 with the mistake `how` (see _stats),
    or normalised over the wrong `axis`."""
    x2, w64 = _flat(x, w)
    if axis == 0:
        t = x2.t()
        mean, rstd = _stats(t, eps, **how)
        y = ((t - mean) * rstd).t()
    else:
        mean, rstd = _stats(x2, eps, **how)
        y = (x2 - mean) * rstd
    y = y * w64 + (0 if b is None else b.double())
    if part == "mean":
        return mean.reshape(-1)
    if part == "rstd":
        return rstd.reshape(-1)
    return y.reshape(x.shape)


def _grads64(x, w, g, eps, *, rms=False, part="x", drop=None, no_weight=False, raw_x=False,
             **how) -> torch.Tensor:  # fmt: skip
    """The gradient of `part` ("x", "weight", "bias") in float64, with one thing done wrong:
    a term of dx dropped ("mean", "x_hat") or added ("mean" for RMSNorm), dy for w·dy,
    dy · x for dy · x̂, or statistics per `how` (see _stats)."""
    x2, w64 = _flat(x, w)
    g2 = g.double().reshape(x2.shape)
    mean, rstd = _stats(x2, eps, rms=rms, **how)
    x_hat = (x2 - mean) * rstd
    if part == "weight":
        return (g2 * (x2 if raw_x else x_hat)).sum(dim=0)
    if part == "bias":
        return g2.sum(dim=0)
    wdy = g2 if no_weight else g2 * w64
    dx = wdy.clone()
    if drop != "x_hat":
        dx -= x_hat * (x_hat * wdy).mean(dim=1, keepdim=True)
    if (drop != "mean") != rms:  # layer norm keeps it unless dropped; RMSNorm only if added
        dx -= wdy.mean(dim=1, keepdim=True)
    return (dx * rstd).reshape(x.shape)


def _ln_forward_mistakes(eps: float, part: str) -> list[KnownMistake]:
    def mistake(hint, **how):
        return KnownMistake(lambda x, w, b, *_: _forward64(x, w, b, eps, part=part, **how), hint)

    mistakes = [
        mistake(UNBIASED_HINT, unbiased=True),
        mistake(EPS_OUTSIDE_HINT, eps_outside=True),
        mistake(CUT_OFF_HINT, block=LOOP_BLOCK),
    ]
    if part == "y":
        mistakes.append(mistake(WRONG_AXIS_HINT, axis=0))
    if part == "rstd":
        mistakes += [mistake(RSTD_STD_HINT, rstd="std"), mistake(RSTD_NO_EPS_HINT, rstd="no eps")]
    return mistakes


def _backward_mistakes(eps: float, part: str, rms: bool) -> list[KnownMistake]:
    def mistake(hint, **how):
        def compute(x, w, *rest):
            return _grads64(x, w, rest[-1], eps, rms=rms, part=part, **how)

        return KnownMistake(compute, hint)

    rstd = [mistake(RSTD_STD_HINT, rstd="std"), mistake(RSTD_NO_EPS_HINT, rstd="no eps")]
    if part == "x":
        terms = (
            [mistake(RMS_DX_MISSING_HINT, drop="x_hat"), mistake(RMS_DX_EXTRA_HINT, drop="mean")]
            if rms
            else [mistake(DX_NO_MEAN_HINT, drop="mean"), mistake(DX_NO_XHAT_HINT, drop="x_hat")]
        )
        return [*terms, mistake(DX_NO_WEIGHT_HINT, no_weight=True), *rstd]
    if part == "weight":
        no_xhat = KnownMistake(lambda x, w, *rest: rest[-1].double().reshape(-1, x.shape[-1])
                               .sum(dim=0), DW_NO_XHAT_HINT)  # fmt: skip
        return [no_xhat, mistake(DW_RAW_X_HINT, raw_x=True), *rstd]
    return []


def _rms_forward_mistakes(eps: float) -> list[KnownMistake]:
    def y(**how):
        def compute(x, w, *_):
            x2, w64 = _flat(x, w)
            mean, rstd = _stats(x2, eps, **how)
            return ((x2 - mean) * rstd * w64).reshape(x.shape)

        return compute

    return [
        KnownMistake(y(), RMS_MEAN_HINT),  # the mean subtracted: layer norm without a bias
        KnownMistake(y(rms=True, eps_outside=True), EPS_OUTSIDE_HINT),
    ]


def _rms_eps_mistakes(dtype: torch.dtype) -> list[KnownMistake]:
    """For a case with eps=None: the usual wrong defaults."""

    def y(eps):
        def compute(x, w, *_):
            x2, w64 = _flat(x, w)
            _, rstd = _stats(x2, eps, rms=True)
            return (x2 * rstd * w64).reshape(x.shape)

        return compute

    usual = {0.0, 1e-5, 1e-6, 1e-8, torch.finfo(dtype).eps, torch.finfo(torch.float32).eps}
    wrong = usual - {references.norm_eps(dtype)}
    return [KnownMistake(y(eps), RMS_EPS_HINT) for eps in sorted(wrong)]


# --- the cases ---------------------------------------------------------------------------


def _inputs(generator, x_shape, dtype, *, scale=1.0, shift=0.0, bias=True, strided=False,
            grad=False):  # fmt: skip
    """x, weight, (bias), (grad_output): x normal around `shift`, weight near 1, bias near 0,
    as a trained layer's are, so that a mistake in either shows."""
    n = x_shape[-1]
    if strided:  # rows a slice of wider ones: the row stride is not n
        x = random_input(generator, (*x_shape[:-1], n + 119), dtype, scale, shift)[..., :n]
    else:
        x = random_input(generator, x_shape, dtype, scale, shift)
    inputs = (x, random_input(generator, (n,), dtype, 0.5, 1.0))
    if bias:
        inputs += (random_input(generator, (n,), dtype, 0.5),)
    if grad:
        inputs += (random_input(generator, x_shape, dtype),)
    return inputs


def _cancellation(inputs, eps: float, rms: bool, part: str) -> float:
    """How much a right float32 kernel's absolute error in `part` ("y" or "x") grows past the
    tolerance table's, at least 1: y subtracts the mean from x, and dx subtracts means of w·dy
    from w·dy, before multiplying by rstd. A rounding of those terms, harmless in itself,
    comes out times rstd: with one column, say, dx is exactly 0, and a GPU's fused
    multiply-adds leave some 1e-8 · rstd of it (rstd is 316 there)."""
    x, w = inputs[0], inputs[1]
    x2, w64 = _flat(x, w)
    _, rstd = _stats(x2, eps, rms=rms)
    if part == "y":
        terms = x2.abs().amax(dim=1, keepdim=True) * w64.abs().max()
    elif part == "x":
        terms = (inputs[-1].double().reshape(x2.shape) * w64).abs().amax(dim=1, keepdim=True)
    else:
        return 1.0
    return max(1.0, float((rstd * terms).max()))


def _describe(x_shape, dtype, why) -> str:
    return f"{'x'.join(map(str, x_shape))} ({why}), {str(dtype).removeprefix('torch.')}"


def _shapes(generator):
    """(x's shape, why, input options, kind) for the cases every check shares."""
    wide = runtime.by_mode(gpu=12_345, interpreter=3001)
    return [
        ((1, 1), "one element", {}, ""),
        ((5, 3), "rows narrower than the block", {}, ""),
        ((37, 781), "row not a power of two", {}, ""),
        ((3, wide), "wide rows", {}, ""),
        ((20, 781), "row stride 900", {"strided": True}, ""),
        ((8, 500), "variance near 1e-6, close to eps", {"scale": 1e-3}, "small"),
        ((8, 300), "values 300 ± 1: a large mean", {"shift": 300.0}, "shift"),
    ]


def _forward_cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    cases, eps = [], 1e-5
    rows = [(*s, torch.float32) for s in _shapes(generator)]
    for dtype in runtime.DTYPES[1:]:  # float16, and bfloat16 on a GPU
        rows += [((37, 781), "row not a power of two", {}, "", dtype),
                 ((16, 1024), "rows of four blocks", {}, "", dtype)]  # fmt: skip
    rows += [((4, 781), "values up to ±1000: squares past float16's 65504",
              {"scale": 400.0}, "half", torch.float16)]  # fmt: skip
    for x_shape, why, options, kind, dtype in rows:
        inputs = _inputs(generator, x_shape, dtype, **options)
        for part in ("y", "mean", "rstd"):
            cases.append(Case(
                f"{_describe(x_shape, dtype, why)}, BLOCK_SIZE={LOOP_BLOCK}: {part}", inputs,
                kind, torch.float32 if part != "y" else None,
                # float32 holds 300 ± 1 to about 2e-5: a right kernel's y is off by some 1e-4
                # there, a variance from sum(x²) - n·mean² by 1e-2 and more
                atol_scale=1000.0 if kind == "shift" else _cancellation(inputs, eps, False, part),
                kwargs={"eps": eps, "BLOCK_SIZE": LOOP_BLOCK, "part": part},
                reference=lambda x, w, b, part=part: _forward64(x, w, b, eps, part=part).to(
                    x.dtype if part == "y" else torch.float32),
                mistakes=_ln_forward_mistakes(eps, part),
                input_names=("x", "weight", "bias"),
            ))  # fmt: skip
    return cases


SKIPPED = ("rows narrower than the block", "row stride 900")


def _autograd_cases(seed: int, rms: bool) -> list[Case]:
    generator = case_generator(seed)
    cases = []
    # the forward's check has the strided and the tiny rows; each case here runs four times
    shapes = [s for s in _shapes(generator) if s[3] != "shift" and s[1] not in SKIPPED]
    shapes.insert(3, ((2, 5, 300), "leading dimensions [2, 5]", {}, "leading"))
    # more rows than the lesson's backward has programs (N_PROGRAMS: 264 on a GPU, 4 in the
    # interpreter, where every program is costly), several to each
    many = runtime.by_mode(gpu=300, interpreter=24)
    shapes.append(((many, 64), "many rows: every program takes several", {}, "many"))
    rows = [(*s, torch.float32, 1e-5) for s in shapes]
    rows += [((37, 781), "row not a power of two", {}, "", dtype, 1e-5)
             for dtype in runtime.DTYPES[1:]]  # fmt: skip
    if rms:
        rows += [((8, 500), "values near 3e-4 and eps=None", {"scale": 3e-4}, "eps", dtype, None)
                 for dtype in (torch.float32, torch.float16, torch.float64)]  # fmt: skip
        rows += [((8, 500), "values near 3e-4 and eps=1e-6", {"scale": 3e-4}, "", torch.float32,
                  1e-6)]  # fmt: skip
    parts = ("y", "x", "weight") if rms else ("y", "x", "weight", "bias")
    names = ("x", "weight", "grad_output") if rms else ("x", "weight", "bias", "grad_output")
    for x_shape, why, options, kind, dtype, eps in rows:
        inputs = _inputs(generator, x_shape, dtype, bias=not rms, grad=True, **options)
        used = references.norm_eps(dtype) if eps is None else eps
        # float64 x: only to see that eps=None is float64's epsilon there. The exercise's
        # statistics are float32, so y is held to float32's tolerance, and no gradient
        # (whose sums the exercise keeps in float32 too) to float64's
        only_y = dtype == torch.float64
        for part in parts[:1] if only_y else parts:
            if part == "y":
                mistakes = _rms_forward_mistakes(used) if rms else _ln_forward_mistakes(used, "y")
                if eps is None:  # after eps outside the root: in float16 that looks like eps=0
                    mistakes = [*mistakes, *_rms_eps_mistakes(dtype)]
            else:
                mistakes = _backward_mistakes(used, part, rms)
            # y and dx: a rounding of the terms they subtract, times rstd; the parameters'
            # gradients: sums over every row
            rows = math.prod(x_shape[:-1])
            scale = math.sqrt(rows) if part in ("weight", "bias") else 1.0
            cases.append(Case(
                f"{_describe(x_shape, dtype, why)}: {PARTS[part]}", inputs, kind,
                torch.float32 if only_y else None,
                atol_scale=scale * _cancellation(inputs, used, rms, part),
                kwargs={"eps": eps, "part": part},
                reference=_part_reference(part, used, rms), mistakes=mistakes,
                input_names=names,
            ))  # fmt: skip
    return cases


PARTS = {"y": "forward: y", "x": "grad_x", "weight": "grad_weight", "bias": "grad_bias"}


def _part_reference(part: str, eps: float, rms: bool) -> Callable:
    def reference(x, weight, *rest):
        bias = None if rms else rest[0]
        if part == "y":
            if rms:
                return references.rms_norm(x, weight, eps)
            return references.layer_norm(x, weight, bias, eps)
        grads = references.norm_grads(x, weight, bias, rest[-1], eps, rms)
        return grads[("x", "weight", "bias").index(part)]

    return reference


# --- running the learner's function ------------------------------------------------------


def _forward_part(fn: Callable) -> Callable:
    def run(x, weight, bias, *, part, **kwargs):
        out = fn(x, weight, bias, **kwargs)
        if not isinstance(out, tuple | list) or len(out) != 3:
            raise NotThree(f"the forward returned {type(out).__name__}, not (y, mean, rstd)")
        return out[("y", "mean", "rstd").index(part)]

    return run


def _autograd_part(fn: Callable, rms: bool) -> Callable:
    def run(x, weight, *rest, part, eps):
        bias = None if rms else rest[0]
        leaves = {"x": x.detach(), "weight": weight.detach(), "bias": bias}
        if part != "y":
            for t in leaves.values():
                if t is not None:
                    t.requires_grad_(True)
        args = (leaves["x"], leaves["weight"]) + (() if rms else (leaves["bias"],))
        y = fn(*args, eps=eps)
        if part == "y":
            return y.detach() if isinstance(y, torch.Tensor) else y
        grads = kernel_gradients(y, [t for t in leaves.values() if t is not None], rest[-1])
        return returned(grads[list(leaves).index(part)], part)

    return run


def _recording(run: Callable, outputs: list) -> Callable:
    """`run`, keeping what it returned for each case: the rows a sum covered show there."""

    def recorded(*inputs, **kwargs):
        outputs.append(None)
        outputs[-1] = run(*inputs, **kwargs)
        return outputs[-1]

    return recorded


# --- hints only a comparison of cases reveals --------------------------------------------


def _row_subsets(n_rows: int):
    """Sets of rows a sum over rows may cover by mistake: one row; a first run of k rows (one
    program's) or every k-th row from 0 (one program's, taking rows in turn), where the
    partial sums were not added up; the last row of each run of k rows, or the last k rows
    (each program's last row, kept by = instead of +=)."""
    for row in range(n_rows):
        yield [row]
    for k in range(2, n_rows):
        yield list(range(k))
        yield list(range(0, n_rows, k))
        yield [min(start + k, n_rows) - 1 for start in range(0, n_rows, k)]
        yield list(range(n_rows - k, n_rows))


def _some_rows(case: Case, out, rms: bool) -> bool:
    """Whether `out`, a parameter's gradient, is the sum over only some of the rows."""
    part = case.kwargs.get("part")
    if not isinstance(out, torch.Tensor) or part not in ("weight", "bias"):
        return False
    x, w, g = case.inputs[0], case.inputs[1], case.inputs[-1]
    eps = case.kwargs.get("eps") or references.norm_eps(x.dtype)
    x2, _ = _flat(x, w)
    mean, rstd = _stats(x2, eps, rms=rms)
    g2 = g.double().reshape(x2.shape)
    terms = g2 * ((x2 - mean) * rstd) if part == "weight" else g2
    if out.shape != terms.shape[1:] or terms.shape[0] < 2:
        return False
    got = out.double()
    for rows in _row_subsets(terms.shape[0]):
        if len(rows) < terms.shape[0]:
            candidate = terms[rows].sum(dim=0)
            if torch.allclose(got, candidate, rtol=1e-3, atol=1e-3 * math.sqrt(len(rows))):
                return True
    return False


def _refine(rms: bool, outputs: list) -> Callable[[Sequence[Case], list[CaseResult]], None]:
    def refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
        vague = {HINTS.wrong_values, HINTS.zeros, HINTS.read_past_end, RAISED_HINT, None}
        float32 = [r.passed for c, r in zip(cases, results) if c.inputs[0].dtype == torch.float32]
        plain = [r.passed for c, r in zip(cases, results) if c.kind in ("", "leading", "many")]
        forward_hint = {
            id(c.inputs): r.hint
            for c, r in zip(cases, results)
            if c.kwargs.get("part") == "y" and r.hint not in vague
        }
        for i, (case, result) in enumerate(zip(cases, results)):
            if result.passed:
                continue
            out = outputs[i] if i < len(outputs) else None
            if case.kwargs.get("part") != "y" and forward_hint.get(id(case.inputs)):
                # the gradients of a wrong forward are wrong too: name the forward's mistake
                result.hint = forward_hint[id(case.inputs)]
            elif _some_rows(case, out, rms):
                what = "grad_weight" if case.kwargs["part"] == "weight" else "grad_bias"
                result.hint = SOME_ROWS_HINT.format(what=what)
            elif result.hint not in vague:
                continue
            elif case.inputs[0].dtype in (torch.float16, torch.bfloat16) and all(float32):
                result.hint = HALF_HINT
            elif case.kind == "shift" and all(plain):
                result.hint = ONE_PASS_HINT

    return refine


def check_layer_norm_forward(fn: Callable[..., tuple]) -> CheckResult:
    """Check `fn(x, weight, bias, eps=1e-5, BLOCK_SIZE=256)`, your forward of lesson 09,
    which returns (y, mean, rstd), against float64 computations: rows narrower than the
    block and of many blocks, a strided x, a large mean, a variance close to eps."""
    if not callable(fn):
        raise TypeError(f"check_layer_norm_forward expects your function, got {type(fn)}")
    outputs: list = []
    return run_check(
        "layer_norm_forward", _recording(_forward_part(fn), outputs), _forward_cases(seed=9),
        references.layer_norm, (), HINTS, _refine(False, outputs),
    )  # fmt: skip


def check_layer_norm(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x, weight, bias, eps=...)`, your layer norm through autograd for lesson 09:
    its output y and the gradients of x, weight and bias that its backward gives for a
    random output gradient, against float64 computations rounded once."""
    if not callable(fn):
        raise TypeError(f"check_layer_norm expects your function, got {type(fn).__name__}")
    outputs: list = []
    return run_check(
        "layer_norm", _recording(_autograd_part(fn, rms=False), outputs),
        _autograd_cases(seed=10, rms=False), references.layer_norm, (), HINTS,
        _refine(False, outputs),
    )  # fmt: skip


def check_rms_norm(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(x, weight, eps=...)`, your RMSNorm through autograd for lesson 09, against
    torch.nn.functional.rms_norm in float64 (eps=None included): y and the gradients of x
    and weight for a random output gradient."""
    if not callable(fn):
        raise TypeError(f"check_rms_norm expects your function, got {type(fn).__name__}")
    outputs: list = []
    return run_check(
        "rms_norm", _recording(_autograd_part(fn, rms=True), outputs),
        _autograd_cases(seed=11, rms=True), references.rms_norm, (), HINTS,
        _refine(True, outputs),
    )  # fmt: skip
