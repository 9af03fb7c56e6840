"""Checks for lesson 06: a direct convolution kernel, then an implicit-GEMM one."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from course_lib import gpu_rules, references, runtime
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckResult,
    Hints,
    KnownMistake,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.matmul import FP16_ACCUMULATION_HINT

PADDING_HINT = (
    "mask the taps that fall into the padding: (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W), "
    "with other=0.0, so that they add nothing"
)
STRIDES_IGNORED_HINT = (
    "your kernel reads x as if it were NCHW-contiguous: right for such inputs, wrong for "
    "this channels-last one. Pass x.stride() to the kernel and address "
    "x[b, c, ih, iw] as b * stride_xb + c * stride_xc + ih * stride_xh + iw * stride_xw"
)
HW_SWAPPED_HINT = (
    "H and W are swapped somewhere: rows go with ih, stride_xh, padding[0] and stride[0]; "
    "columns with iw, stride_xw, padding[1] and stride[1]"
)
UNMASKED_PADDING_HINT = (
    "the taps in the padding read x's neighbouring pixels instead of zeros: " + PADDING_HINT
)
STRIDE_IGNORED_HINT = (
    "your kernel ignores the stride when it finds a window: the window of output pixel "
    "(oh, ow) starts at input row oh * stride_h - pad_h and column ow * stride_w - pad_w"
)
DILATION_IGNORED_HINT = (
    "your kernel ignores the dilation: tap (r, s) reads input row oh * stride_h - pad_h "
    "+ r * dilation_h and column ow * stride_w - pad_w + s * dilation_w"
)
FLIPPED_HINT = (
    "your kernel flips the filter, as a textbook convolution does; conv2d in deep learning "
    "is a cross-correlation: tap (r, s) multiplies w[o, c, r, s] with x at row ih0 + r, "
    "column iw0 + s"
)
WEIGHT_RS_SWAPPED_HINT = (
    "the filter's rows and columns are swapped: w[o, c, r, s] is at "
    "w_ptr + o * stride_wo + c * stride_wc + r * stride_wr + s * stride_ws, r the row"
)
WEIGHT_OC_SWAPPED_HINT = (
    "the weight is read as [C, O, kh, kw]: its first dimension is the output channel, "
    "w[o, c, r, s] at w_ptr + o * stride_wo + c * stride_wc + ..."
)
WEIGHT_FLAT_HINT = (
    "the weight's rows are read as if each were laid out [kh, kw, C]; the weight is "
    "[O, C, kh, kw]: address it with its own four strides"
)
DROPPED_CHANNELS_HINT = (
    "channels past the last full channel tile are missing: with C = {C} and BLOCK_K = "
    "{block}, your loop stops at channel {kept}. Loop over triton.cdiv(C, BLOCK_K) tiles "
    "and mask the channels past C with other=0.0"
)
OUTPUT_STRIDES_HINT = (
    "the right values landed in the wrong places: your output is laid out like x, "
    "channels-last, and your kernel stores into it as if it were NCHW-contiguous. Pass "
    "out.stride() to the kernel and store through it, or allocate the output NCHW"
)
NO_CHANNELS_HINT = (
    "no channel was summed: C = {C} is smaller than BLOCK_K, so a loop over whole channel "
    "tiles never runs. Loop over triton.cdiv(C, BLOCK_K) tiles and mask the channels past C "
    "with other=0.0"
)
DROPPED_TAPS_HINT = (
    "the last, partial step of the reduction is missing: with K = C * kh * kw = {K} and "
    "BLOCK_K = {block}, your loop stops at {kept}. Loop over triton.cdiv(K, BLOCK_K) steps "
    "and mask the taps past K"
)

CHANNEL_MASK_HINT = (
    "the x tile reads channels past C: the last channel tile overhangs C, and its load "
    "needs the channels in its mask too, pixel_ok[:, None] & (c[None, :] < C), with "
    "other=0.0. The w tile's zeros there do not cancel what lies past x: NaN"
)
OUTPUT_AS_MATRIX_HINT = (
    "the right values landed in the wrong places: your kernel stores the output as an "
    "[M, N] matrix, one row per output pixel, but out is [B, O, OH, OW]. Store through "
    "out's strides: b * stride_ob + offs_n * stride_oc + oh * stride_oh + ow * stride_ow"
)
WINDOW_HW_HINT = (
    "rows and columns are mixed up in the window: input row ih = oh * stride_h - pad_h + r "
    "takes stride[0] and padding[0], input column iw = ow * stride_w - pad_w + s takes "
    "stride[1] and padding[1]; your kernel used {what}"
)
FP16_DIRECT_HINT = (
    "close but not close enough, in half precision only: accumulate in float32, "
    "acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32) and acc += x.to(tl.float32) * "
    "w.to(tl.float32), and convert once when you store"
)
DOT_SIZE_HINT = (
    "a GPU compile refuses a tl.dot whose inner side K is under 16: make BLOCK_K at least "
    "16 (the interpreter runs smaller tiles, a GPU does not)"
)
GPU_REFUSES_HINT = (
    "a GPU compile refuses your kernel, though the interpreter runs it: the reason above "
    "names the line"
)

_BLOCKS = (16, 32, 64, 128)


def _output_hw(x_shape, w_shape, stride, padding, dilation) -> tuple[int, int]:
    """(OH, OW) of x [B, C, H, W] convolved with w [O, C, kh, kw]."""
    sizes = zip(x_shape[2:], w_shape[2:], stride, padding, dilation)
    return tuple(references.conv2d_output_size(*axis) for axis in sizes)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _params(kwargs: dict) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(stride, padding, dilation) as pairs, from a case's keyword arguments."""
    get = kwargs.get
    return _pair(get("stride", 1)), _pair(get("padding", 0)), _pair(get("dilation", 1))


def _wrong_shape(case: Case, got: list[int]) -> str | None:
    """Name the formula a wrong output shape came from."""
    x, w = case.inputs[:2]
    (B, C, H, W), (O, _, KH, KW) = x.shape, w.shape
    stride, padding, dilation = _params(case.kwargs)

    def shape(stride=stride, padding=padding, dilation=dilation, channels=O, sides=2):
        sizes = [references.conv2d_output_size(n + (sides - 2) * p, k, s, p, d)
                 for n, k, s, p, d in zip((H, W), (KH, KW), stride, padding, dilation)]  # fmt: skip
        return [B, channels, *sizes]

    right = shape()
    formula = (
        f"OH = (H + 2 * pad_h - dil_h * (kh - 1) - 1) // stride_h + 1 = {right[2]} and the "
        f"same along W, {right[3]}"
    )
    if got in ([B, O, right[3], right[2]], shape(padding=padding[::-1])) and got != right:
        return f"{HW_SWAPPED_HINT} ({formula})"
    for wrong, mistake in [
        (shape(channels=C), "it has x's C channels where it needs the weight's O"),
        (shape(padding=(0, 0)), "its size leaves out the padding"),
        (shape(sides=1), "its size counts the padding once: it goes on both sides, 2 * pad_h"),
        (shape(stride=(1, 1)), "its size leaves out the stride"),
        (shape(dilation=(1, 1)), "its size leaves out the dilation"),
    ]:
        if got == wrong and wrong != right:
            return f"{mistake}: {formula}"
    return f"the output is [B, O, OH, OW] with {formula}"


HINTS = Hints(
    out_of_bounds=(
        "the last programs run past the output: mask the store with the output pixels "
        "(< B * OH * OW, or < OH * OW per image) and the output channels (< O)"
    ),
    load_out_of_bounds=(
        "a load of x or the weight reached outside it: " + PADDING_HINT + "; mask the "
        "channels past C too, and check the strides in each pointer formula"
    ),
    read_past_end=(
        "NaN where the reference is finite: your kernel read outside x or the weight (the "
        "memory around them holds NaN during a check). "
        + PADDING_HINT[0].upper()
        + PADDING_HINT[1:]
    ),
    nothing_written="did the kernel store its result? Check tl.store's pointers and the grid",
    grid_too_small=(
        "the grid misses the last output pixels: launch triton.cdiv(number of output pixels, "
        "BLOCK) programs along them, so the last partial block is covered too"
    ),
    dtype=(
        "the output must have x's dtype: allocate it with dtype=x.dtype and store "
        "acc.to(out_ptr.dtype.element_ty)"
    ),
    wrong_values=(
        "the values differ from torch's conv2d, in no pattern the check knows: compare your "
        "kernel's sum over c, r and s with the formula above, one index at a time"
    ),
    wrong_shape=_wrong_shape,
    raised=lambda kind, message: refusal_hint(kind, message),
)


def refusal_hint(kind: str, message: str) -> str | None:
    """The GPU compiler's refusal, from the interpreter's front end or a GPU's launch."""
    if "Input shapes should have" in message and "K >= " in message:
        return DOT_SIZE_HINT
    return GPU_REFUSES_HINT if kind == gpu_rules.GPURefused.__name__ else None


# --- what mistaken kernels compute, for the hints -----------------------------------------


def _gathered(x, w, stride, padding, dilation, *, strides=None, mask_padding=True,
              window=None):  # fmt: skip
    """conv2d summed tap by tap from x's memory at x[b, c, ih, iw] = memory[b·sB + c·sC +
    ih·sH + iw·sW] for the given strides (x's own by default), as a kernel would read it.
    Without mask_padding, taps in the padding read whatever that offset holds, and NaN
    outside x's memory, as the guard bands around it would give. `window`, a (stride,
    padding) pair, places the window otherwise than the output's size says."""
    (B, C, H, W), (O, _, KH, KW) = x.shape, w.shape
    sB, sC, sH, sW = strides or x.stride()
    OH, OW = _output_hw(x.shape, w.shape, stride, padding, dilation)
    stride, padding = window or (stride, padding)
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.stride()))
    memory = x.as_strided((span,), (1,), x.storage_offset()).double().cpu()
    memory = torch.cat([memory, torch.tensor([math.nan], dtype=torch.float64)])
    out = torch.zeros(B, O, OH, OW, dtype=torch.float64)
    oh, ow = torch.arange(OH)[:, None], torch.arange(OW)[None, :]
    b, c = torch.arange(B)[:, None, None, None], torch.arange(C)[None, :, None, None]
    weight = w.double().cpu()
    for r in range(KH):
        for s in range(KW):
            ih = oh * stride[0] - padding[0] + r * dilation[0]
            iw = ow * stride[1] - padding[1] + s * dilation[1]
            offsets = b * sB + c * sC + ih * sH + iw * sW  # [B, C, OH, OW]
            inside = (offsets >= 0) & (offsets < span)
            values = memory[torch.where(inside, offsets, span)]
            if mask_padding:  # where, not a product: NaN * 0 is NaN
                values = torch.where((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W), values, 0.0)
            out += torch.einsum("bchw,oc->bohw", values, weight[:, :, r, s])
    return out.to(x.device)


def _mistakes(x, w, stride, padding, dilation) -> list[KnownMistake]:
    """The mistakes this case can tell from a right kernel, each with its hint."""
    conv = functools.partial(F.conv2d, stride=stride, padding=padding, dilation=dilation)
    (B, C, H, W), (O, _, KH, KW) = x.shape, w.shape
    OH, OW = _output_hw(x.shape, w.shape, stride, padding, dilation)
    found = [
        KnownMistake(lambda x, w: conv(x.double(), w.double().flip(2, 3)), FLIPPED_HINT),
        KnownMistake(
            lambda x, w: _gathered(x, w, stride, padding, dilation, mask_padding=False),
            UNMASKED_PADDING_HINT,
        ),
    ]
    if max(stride) > 1:
        found.append(KnownMistake(
            lambda x, w: F.conv2d(x.double(), w.double(), None, 1, padding, dilation)[
                ..., :OH, :OW], STRIDE_IGNORED_HINT,
        ))  # fmt: skip
    if max(dilation) > 1:
        found.append(KnownMistake(
            lambda x, w: F.conv2d(x.double(), w.double(), None, stride, padding, 1)[
                ..., :OH, :OW], DILATION_IGNORED_HINT,
        ))  # fmt: skip
    if not x.is_contiguous():
        contiguous = torch.empty(x.shape).stride()
        found.append(KnownMistake(
            lambda x, w: _gathered(x, w, stride, padding, dilation, strides=contiguous),
            STRIDES_IGNORED_HINT,
        ))  # fmt: skip
    # with one output pixel, a filter read transposed and an image read transposed give
    # the same sum: only larger outputs tell the two apart
    if H == W and OH * OW > 1:
        sB, sC, sH, sW = x.stride()
        found.append(KnownMistake(
            lambda x, w: _gathered(x, w, stride, padding, dilation, strides=(sB, sC, sW, sH)),
            HW_SWAPPED_HINT,
        ))  # fmt: skip
    if KH == KW > 1 and OH * OW > 1:
        found.append(
            KnownMistake(lambda x, w: conv(x.double(), w.double().transpose(2, 3)),
                         WEIGHT_RS_SWAPPED_HINT)
        )  # fmt: skip
    if O == C:
        found.append(
            KnownMistake(lambda x, w: conv(x.double(), w.double().transpose(0, 1)),
                         WEIGHT_OC_SWAPPED_HINT)
        )  # fmt: skip
    if KH * KW > 1 and C > 1:
        found.append(KnownMistake(
            lambda x, w: conv(x.double(), w.double().reshape(O, KH, KW, C).permute(0, 3, 1, 2)),
            WEIGHT_FLAT_HINT,
        ))  # fmt: skip
    if C < _BLOCKS[-1]:
        found.append(KnownMistake(
            lambda x, w: torch.zeros(B, O, OH, OW, dtype=torch.float64, device=x.device),
            NO_CHANNELS_HINT.format(C=C),
        ))  # fmt: skip
    # one mistake per place the loop stops, naming every BLOCK_K that stops there
    K = C * KH * KW
    for kept, blocks in _stops(C).items():
        found.append(KnownMistake(
            lambda x, w, kept=kept: conv(x[:, :kept].double(), w[:, :kept].double()),
            DROPPED_CHANNELS_HINT.format(C=C, block=blocks, kept=kept),
        ))  # fmt: skip
    for kept, blocks in (_stops(K) if KH * KW > 1 else {}).items():
        found.append(KnownMistake(
            lambda x, w, kept=kept: _flat_k_prefix(x, w, stride, padding, dilation, kept),
            DROPPED_TAPS_HINT.format(K=K, block=blocks, kept=kept),
        ))  # fmt: skip
    if not x.is_contiguous():
        found.append(KnownMistake(
            lambda x, w: _stored_as_nchw(conv(x.double(), w.double()), x),
            OUTPUT_STRIDES_HINT,
        ))  # fmt: skip
    if OH * OW > 1 and O > 1:
        found.append(KnownMistake(
            lambda x, w: _stored_as_matrix(conv(x.double(), w.double())), OUTPUT_AS_MATRIX_HINT
        ))  # fmt: skip
    # channels-last memory keeps most of an unmasked channel tile inside x, which makes a
    # pattern of its own; in NCHW the overhang reads past x's end, NaN like any such read
    channels_last = x.stride(1) == 1 and C > 1
    for end in sorted({-(-C // block) * block for block in _BLOCKS if C % block}):
        if not channels_last:
            break
        found.append(KnownMistake(
            lambda x, w, end=end: _channels_unmasked(x, w, stride, padding, dilation, end),
            CHANNEL_MASK_HINT,
        ))  # fmt: skip
    found += _window_mixups(stride, padding, dilation)
    return found


def _window_mixups(stride, padding, dilation) -> list[KnownMistake]:
    """A window placed with the rows' stride or padding for the columns, or the other way
    round, or both swapped: wrong only where rows and columns differ."""
    found = []
    for name, (h, w) in (("stride", stride), ("padding", padding)):
        if h == w:
            continue
        for used, what in [
            ((h, h), f"{name}[0] for the columns too"),
            ((w, w), f"{name}[1] for the rows too"),
            ((w, h), f"{name}[1] for the rows and {name}[0] for the columns"),
        ]:
            window = (used, padding) if name == "stride" else (stride, used)
            found.append(KnownMistake(
                lambda x, w_, window=window: _gathered(x, w_, stride, padding, dilation,
                                                       window=window),
                WINDOW_HW_HINT.format(what=what),
            ))  # fmt: skip
    return found


def _channels_unmasked(x, w, stride, padding, dilation, end: int) -> torch.Tensor:
    """conv2d as a kernel computes it whose x tile is masked on the padding only: the
    channels from C up to `end`, the end of the last channel tile, are read and multiplied by
    the w tile's zeros, which cancel every finite value and no NaN of the guard bands."""
    (B, C, H, W), (KH, KW) = x.shape, w.shape[2:]
    result = F.conv2d(x.double(), w.double(), None, stride, padding, dilation).cpu()
    sB, sC, sH, sW = x.stride()
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.stride()))
    OH, OW = result.shape[2:]
    oh, ow = torch.arange(OH)[:, None], torch.arange(OW)[None, :]
    b = torch.arange(B)[:, None, None, None]
    c = torch.arange(C, end)[None, :, None, None]
    for r in range(KH):
        for s in range(KW):
            ih = oh * stride[0] - padding[0] + r * dilation[0]
            iw = ow * stride[1] - padding[1] + s * dilation[1]
            inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)  # [OH, OW]
            offsets = b * sB + c * sC + ih * sH + iw * sW  # [B, channels past C, OH, OW]
            outside = ((offsets < 0) | (offsets >= span)).any(dim=1) & inside  # [B, OH, OW]
            result = result.masked_fill(outside[:, None], math.nan)
    return result.to(x.device)


def _stored_as_matrix(result: torch.Tensor) -> torch.Tensor:
    """What a kernel leaves in an NCHW output when it stores acc as a row-major [M, N]
    matrix, M = B * OH * OW pixels by N = O channels: the right values, misplaced."""
    out = torch.empty(result.shape, dtype=result.dtype, device=result.device)
    out.view(-1).copy_(result.permute(0, 2, 3, 1).reshape(-1))
    return out


def _stops(n: int) -> dict[int, str]:
    """Where a loop over whole tiles of BLOCK_K stops short of n, for each BLOCK_K that
    does: {stop: "16 or 32", ...}."""
    stops: dict[int, list[str]] = {}
    for block in _BLOCKS:
        if n % block and n > block:
            stops.setdefault(n // block * block, []).append(str(block))
    return {kept: " or ".join(blocks) for kept, blocks in stops.items()}


def _stored_as_nchw(result: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """What a kernel leaves in an output allocated in x's memory format when it stores as
    if the output were NCHW-contiguous: the right values, in the wrong places."""
    out = torch.empty(result.shape, dtype=result.dtype, device=result.device)
    out = out.contiguous(memory_format=torch.channels_last) if x.stride(1) == 1 else out
    memory = out.as_strided((out.numel(),), (1,))
    memory.copy_(result.contiguous().reshape(-1))
    return out


def _flat_k_prefix(x, w, stride, padding, dilation, kept: int):
    """conv2d over the first `kept` taps of K in (c, r, s) order, as a loop over whole
    BLOCK_K steps of a flat K computes it."""
    B, (O, _, KH, KW) = x.shape[0], w.shape
    OH, OW = _output_hw(x.shape, w.shape, stride, padding, dilation)
    columns = F.unfold(x.double(), (KH, KW), dilation, padding, stride)  # [B, C·kh·kw, L]
    rows = w.double().reshape(O, -1)[:, :kept]
    return (rows @ columns[:, :kept]).reshape(B, O, OH, OW)


# --- the cases --------------------------------------------------------------------------


def _case(generator, label, x_shape, w_shape, dtype=torch.float32, channels_last=False,
          direct=False, **kwargs) -> Case:  # fmt: skip
    x = random_input(generator, x_shape, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = random_input(generator, w_shape, dtype)
    stride, padding, dilation = _params(kwargs)
    K = w_shape[1] * w_shape[2] * w_shape[3]
    # tl.dot runs float32 as TF32 on a GPU; a sum of K products rounds like sqrt(K) of them
    tolerance = "tf32" if dtype == torch.float32 and not direct and runtime.MODE == "gpu" else None
    name = str(dtype).removeprefix("torch.")
    layout = ", channels-last" if channels_last else ""
    return Case(
        f"{label}: x {list(x_shape)}, weight {list(w_shape)}, {_describe(kwargs)}{name}{layout}",
        (x, w),
        kind="channels_last" if channels_last else "contiguous",
        tolerance=tolerance,
        atol_scale=math.sqrt(K),
        kwargs=kwargs,
        reference=functools.partial(
            references.conv2d, stride=stride, padding=padding, dilation=dilation
        ),
        mistakes=_mistakes(x, w, stride, padding, dilation),
        input_names=("x", "weight"),
    )


def _describe(kwargs: dict) -> str:
    return "".join(f"{k}={v}, " for k, v in kwargs.items())


def _cases(seed: int, direct: bool) -> list[Case]:
    generator = case_generator(seed)
    case = functools.partial(_case, generator, direct=direct)
    gpu = runtime.MODE == "gpu"
    cases = [
        case("a single output pixel", (1, 3, 3, 3), (2, 3, 3, 3)),
        case("1x1 kernel", (2, 4, 6, 7), (3, 4, 1, 1)),
        case("odd image, padding 1", (1, 3, 13, 11), (3, 3, 3, 3), padding=1),
        case("square image, C = O", (1, 3, 9, 9), (3, 3, 3, 3), padding=1),
        case("stride 2, padding (2, 1)", (1, 2, 12, 9), (2, 2, 5, 5), stride=2, padding=(2, 1)),
        case(
            "1x3 kernel, stride (2, 1)", (1, 4, 8, 9), (3, 4, 1, 3), stride=(2, 1), padding=(0, 1)
        ),  # fmt: skip
        case(
            "7x7 kernel, 3 channels, stride 2", (1, 3, 12, 12), (2, 3, 7, 7), stride=2, padding=3
        ),  # fmt: skip
        case("channels-last", (2, 3, 9, 8), (2, 3, 3, 3), channels_last=True, padding=1),
    ]
    if not direct:
        cases += [
            case("dilation 2", (1, 4, 11, 10), (5, 4, 3, 3), padding=2, dilation=2),
            case("C and O past a tile", (1, 37, 6, 5), (19, 37, 3, 3), padding=1),
            case(
                "5x5 kernel, channels-last",
                (1, 20, 9, 8),
                (11, 20, 5, 5),
                channels_last=True,
                padding=2,
            ),  # fmt: skip
        ]
        if gpu:
            cases.append(case("many tiles", (4, 64, 28, 28), (64, 64, 3, 3), padding=1))
    half = runtime.DTYPES[1:]
    for dtype in half:
        cases.append(case("3x3", (1, 3, 9, 7), (2, 3, 3, 3), dtype, padding=1))
        if not direct:
            cases.append(case("3x3", (1, 33, 7, 9), (10, 33, 3, 3), dtype, padding=1,
                              channels_last=True))  # fmt: skip
    return cases


def _refine(cases: Sequence[Case], results: list[CaseResult], *, direct: bool) -> None:
    """Hints that only a comparison of cases reveals."""
    full = [r for c, r in zip(cases, results) if c.inputs[0].dtype == torch.float32]
    contiguous_pass = all(r.passed for c, r in zip(cases, results) if c.kind == "contiguous")
    # an H/W swap, or a misread weight, reads far outside x on most shapes, which alone
    # looks like a missing mask: where one case names it, say so everywhere
    carried = {HW_SWAPPED_HINT, WEIGHT_OC_SWAPPED_HINT, WEIGHT_RS_SWAPPED_HINT, WEIGHT_FLAT_HINT,
               CHANNEL_MASK_HINT}  # fmt: skip
    named = next((r.hint for r in results if r.hint in carried), None)
    vague = {HINTS.read_past_end, HINTS.wrong_values, HINTS.load_out_of_bounds}
    for case, result in zip(cases, results):
        half = case.inputs[0].dtype in (torch.float16, torch.bfloat16)
        close = result.relative_error is not None and result.relative_error < 1e-2
        if half and close and all(r.passed for r in full):
            result.hint = FP16_DIRECT_HINT if direct else FP16_ACCUMULATION_HINT
        elif case.kind == "channels_last" and result.hint in vague and contiguous_pass:
            result.hint = STRIDES_IGNORED_HINT
        elif named and result.hint in vague:
            result.hint = named


ConvFn = Callable[..., torch.Tensor]


def check_conv2d_direct(fn: ConvFn) -> CheckResult:
    """Check `fn(x, weight, stride=1, padding=0)`, your direct convolution for lesson 06,
    against torch's conv2d in float64: odd sizes, 1x1 to 7x7 kernels, stride and padding
    as ints and pairs, a channels-last input, float16."""
    return run_check("conv2d_direct", _refusing(fn), _cases(61, direct=True), references.conv2d,
                     hints=HINTS, refine=functools.partial(_refine, direct=True))  # fmt: skip


def check_conv2d(fn: ConvFn) -> CheckResult:
    """Check `fn(x, weight, stride=1, padding=0, dilation=1)`, your implicit-GEMM
    convolution for lesson 06, against torch's conv2d in float64: the direct check's cases
    and dilation 2, channels that are not a multiple of a tile, more channels-last."""
    return run_check("conv2d", _refusing(fn), _cases(62, direct=False), references.conv2d,
                     hints=HINTS, refine=functools.partial(_refine, direct=False))  # fmt: skip


def _refusing(fn: ConvFn) -> ConvFn:
    """fn, failing a case whose kernel a GPU compile refuses (in the interpreter, which
    runs it all the same): a tl.dot with BLOCK_K under 16, say."""
    if not callable(fn):
        return fn  # the engine says what it got
    return gpu_rules.refusing(fn)


# --- the fused epilogue: bias and ReLU --------------------------------------------------

CONV_BIAS_MISSING_HINT = (
    "the bias is missing: load the tile's BLOCK_N values of bias, one per output channel, "
    "masked with n_ok, and add them to every row of acc before the ReLU"
)
CONV_BIAS_PER_PIXEL_HINT = (
    "the bias went along the pixels: it holds one value per output channel, the tile's "
    "columns, so load it at bias_ptr + offs_n, masked with n_ok, and add it as bias[None, :]"
)
CONV_RELU_FIRST_HINT = (
    "the ReLU came before the bias: add the bias to acc first, then acc = tl.maximum(acc, 0.0)"
)
CONV_NO_RELU_HINT = (
    "the ReLU is missing: acc = tl.maximum(acc, 0.0) after the bias, before the one store"
)


def _epilogue_mistakes(stride, padding, dilation) -> list[KnownMistake]:
    def conv(x, w):
        return F.conv2d(x.double(), w.double(), None, stride, padding, dilation)

    def per_pixel(x, w, b, fill):
        out = conv(x, w)
        B, O, OH, OW = out.shape
        m = torch.arange(B * OH * OW, device=out.device).reshape(B, 1, OH, OW)
        rows = torch.where(m < O, b.double()[m.clamp(max=O - 1)], fill)
        return (out + rows).relu()

    return [
        KnownMistake(lambda x, w, b: conv(x, w).relu(), CONV_BIAS_MISSING_HINT),
        KnownMistake(lambda x, w, b: per_pixel(x, w, b, 0.0), CONV_BIAS_PER_PIXEL_HINT),
        KnownMistake(lambda x, w, b: per_pixel(x, w, b, math.nan), CONV_BIAS_PER_PIXEL_HINT),
        KnownMistake(
            lambda x, w, b: conv(x, w).relu() + b.double()[:, None, None], CONV_RELU_FIRST_HINT
        ),
        KnownMistake(lambda x, w, b: conv(x, w) + b.double()[:, None, None], CONV_NO_RELU_HINT),
    ]


def _bias_relu_cases(seed: int) -> list[Case]:
    generator = case_generator(seed)

    def case(label, x_shape, w_shape, dtype=torch.float32, channels_last=False, **kwargs):
        base = _case(generator, label, x_shape, w_shape, dtype, channels_last, **kwargs)
        x, w = base.inputs
        K = w_shape[1] * w_shape[2] * w_shape[3]
        # a bias as large as the sums, so that one left out, or misplaced, shows
        bias = random_input(generator, (w_shape[0],), dtype, scale=math.sqrt(K) / 2)
        stride, padding, dilation = _params(kwargs)

        def reference(x, w, b):
            out = F.conv2d(x.double(), w.double(), b.double(), stride, padding, dilation)
            return out.relu().to(x.dtype)

        mistakes = [*_epilogue_mistakes(stride, padding, dilation)]
        mistakes += [KnownMistake(lambda x, w, b, m=m: m.compute(x, w).relu(), m.hint)
                     for m in base.mistakes]  # fmt: skip
        return replace(base, inputs=(x, w, bias), reference=reference, mistakes=mistakes,
                       input_names=("x", "weight", "bias"))  # fmt: skip

    cases = [
        case("odd image, padding 1", (1, 3, 13, 11), (3, 3, 3, 3), padding=1),
        case("C and O past a tile", (1, 37, 6, 5), (19, 37, 3, 3), padding=1),
        case("stride 2, padding (2, 1)", (1, 2, 12, 9), (2, 2, 5, 5), stride=2, padding=(2, 1)),
        case("dilation 2", (1, 4, 11, 10), (5, 4, 3, 3), padding=2, dilation=2),
        case("channels-last", (2, 3, 9, 8), (2, 3, 3, 3), channels_last=True, padding=1),
    ]
    for dtype in runtime.DTYPES[1:]:
        cases.append(case("3x3", (1, 33, 7, 9), (10, 33, 3, 3), dtype, padding=1,
                          channels_last=True))  # fmt: skip
    return cases


def check_conv2d_bias_relu(fn: ConvFn) -> CheckResult:
    """Check `fn(x, weight, bias, stride=1, padding=0, dilation=1)`, your implicit GEMM with
    the bias and a ReLU fused into its epilogue, for lesson 06, against
    relu(conv2d(x, weight, bias)) computed in float64."""
    return run_check("conv2d_bias_relu", _refusing(fn), _bias_relu_cases(63), references.conv2d,
                     hints=HINTS, refine=functools.partial(_refine, direct=False))  # fmt: skip
