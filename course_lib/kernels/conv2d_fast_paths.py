"""The cases of lesson 06's convolution that the lesson does not cover, which `conv2d`
(conv2d.py) hands here: outputs with nothing to compute, views whose offsets pass 32 bits,
operands the lesson's kernel reads from a copy, and on Hopper GPUs the TMA kernel of
conv2d_tma.py, for an NCHW input by the route a first call chose by timing both.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course_lib.kernels import conv2d_tma
from course_lib.kernels._launch import trial_launches
from course_lib.kernels._plan import into_graph
from course_lib.kernels.tiles import SMALL_PRODUCT

# a weight whose rows are not contiguous in K's order is read through its strides up to
# this size, and copied past it: measured with an NCHW x copied first, reading a 64x64x3x3
# weight in place beat copying it, and reading a 128x128x3x3 one lost
MAX_STRIDED_WEIGHT = 1 << 16
# ...except in products of this many multiply-adds or more, where the GPU's time outweighs
# the copy's launch (measured on ResNet's 56x56 3x3 layer, x read in place). The bound is
# NCHW_TIMED_PRODUCT's, for the same reason; no product between it and that layer's was
# measured
COPY_WEIGHT_PRODUCT = 2**30

# An NCHW x reaches the TMA kernel through channels-last copies of x and the weight, made
# by a launch of their own. Which route is faster depends on the layer: the copied route
# saves GPU time on some layers, and costs the host a second launch. So from
# NCHW_TIMED_PRODUCT multiply-adds the first call of a signature times both routes on the
# GPU's clock (_choose_route_by_timing). Below it both take less GPU time than the copy
# route costs the host, and x is read in place; from NCHW_TMA_PRODUCT on the GPU's time
# decides anyway, and x is copied (figures in the appendix).
NCHW_TIMED_PRODUCT = 2**30
NCHW_TMA_PRODUCT = 2**34
# how routes are timed (_choose_route_by_timing): rounds of calls back to back, the best kept
ROUTE_TIMING_ROUNDS = 3
ROUTE_TIMING_CALLS = 10
# x is copied only where the copied route takes at most this share of the in-place route's
# GPU time: the margin pays for its second launch, and keeps a layer near the line on the
# same side in every process. The choice reads the GPU's clock alone because it is the one
# that repeats: measured in fresh processes on ResNet's 14x14 layer, the copied route's GPU
# time came out the same to 2% in every one, and its time a call in a loop, bound by the
# host, varied by nearly a factor of two; a rule that read the loop chose differently from
# one process to the next (figures in the appendix to lesson 06 and in tests/test_kernels.py)
ROUTE_GPU_SHARE = 0.66
# GPU cycles the GPU sleeps before a timed round, while the host queues the round's calls:
# milliseconds at a data-center GPU's clock, several times what ten calls of the copied
# route took the slowest host measured. A slower host leaves gaps the round counts as GPU time,
# which leans the choice to x in place, the route with less host work
ROUTE_QUEUE_CYCLES = 10_000_000


def route(
    x, weight, bias, out, stride: tuple, padding: tuple, dilation: tuple, channels_inner: bool,
    lesson_launch: Callable,
) -> tuple[Callable, bool] | None:  # fmt: skip
    """How a convolution that conv2d has checked fills `out` (laid out as the output will
    be, on the meta device): (run(x, weight, bias, out), final), final False for a route
    chosen without the timing it needed (the next call like it chooses again); None where
    lesson_launch, conv2d's, takes x and the weight as they are. `padding` is the top and
    left padding, `channels_inner` K's order (see conv2d.py)."""
    (B, C, _, _), (O, _, KH, KW), (OH, OW) = x.shape, weight.shape, out.shape[2:]
    if out.numel() == 0:
        return (lambda *_: None), True
    if C == 0:
        return _bias_only, True
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    # a view's offsets reach as far as its strides take them, whatever its element count
    # (a dense tensor's reach is bounded by conv2d's size checks): copied past 32 bits
    far_x = not (x.is_contiguous() or channels_last) and _reach(x) >= 2**31
    far_w = _reach(weight) >= 2**31
    # what the route is planned for: the copies' layout, on the meta device
    x_seen = _copied(x) if far_x else x
    w_seen = _copied(weight) if far_w else weight
    product = B * OH * OW * O * C * KH * KW
    copies = _lesson_copies(x_seen, w_seen, channels_inner, product)
    # on Hopper, stride-1 convolutions go to the TMA kernel (conv2d_tma.py); an NCHW x, which
    # it copies channels-last first, where that is faster (see NCHW_TIMED_PRODUCT)
    tma = product > SMALL_PRODUCT and conv2d_tma.suits(x, weight, stride)
    if not (tma or far_x or far_w or copies[0] or copies[1] is not None):
        return None
    plan = (bias, out, stride, padding, dilation, channels_inner)
    in_place = lambda: _lesson_route(x_seen, w_seen, *plan, *copies, lesson_launch)
    final = True
    if not tma or (not channels_last and product < NCHW_TIMED_PRODUCT):
        run = in_place()
    elif channels_last or product >= NCHW_TMA_PRODUCT:
        run = _tma_route(x_seen, w_seen, bias, out, padding, dilation)
    elif far_x or far_w or into_graph() or torch.are_deterministic_algorithms_enabled():
        run = in_place()  # untimed: the same route on every run
    elif torch.cuda.is_current_stream_capturing():  # no timing inside a CUDA graph
        run, final = in_place(), False
    else:  # an NCHW x in between: read in place, unless timing shows copying clearly better
        runs = [in_place(), _tma_route(x_seen, w_seen, bias, out, padding, dilation)]
        calls = [_on_new_output(r, out.shape, x, weight, bias) for r in runs]
        run = runs[_choose_route_by_timing(calls)]
    if far_x or far_w:
        planned = run

        def run(x, w, b, out):
            planned(x.contiguous() if far_x else x, w.contiguous() if far_w else w, b, out)

    return run, final


def weight_rows_flat(weight: torch.Tensor, channels_inner: bool) -> bool:
    """Whether each weight row w[o] is contiguous in K's order: (r, s, c) where
    channels_inner, else (c, r, s)."""
    O, C, KH, KW = weight.shape
    flat = (KH * KW * C, 1, KW * C, C) if channels_inner else (C * KH * KW, KH * KW, KW, 1)
    return _strides_are(weight, flat)


def _lesson_copies(x, weight, channels_inner: bool, product: int) -> tuple[bool, object]:
    """Which operands the lesson's kernel reads from a copy: (whether x is copied NCHW,
    the weight's copy's memory format or None). K's order follows the memory, copied
    where that costs less: see conv2d.py's docstring."""
    copy_x = not channels_inner and x.stride(3) != 1
    strided_read_pays = weight.numel() <= MAX_STRIDED_WEIGHT and product < COPY_WEIGHT_PRODUCT
    copy_w = not (weight_rows_flat(weight, channels_inner) or strided_read_pays)
    w_format = torch.channels_last if channels_inner else torch.contiguous_format
    return copy_x, w_format if copy_w else None


def _lesson_route(
    x, weight, bias, out, stride, padding, dilation, channels_inner: bool, copy_x: bool,
    w_format, lesson_launch: Callable,
) -> Callable:  # fmt: skip
    """The lesson's kernel, on copies of x (NCHW) where copy_x and of the weight (in
    w_format) where w_format is not None: a function of (x, weight, bias, out)."""
    x_seen = _copied(x) if copy_x else x
    w_seen = weight if w_format is None else _copied(weight, w_format)
    launch = lesson_launch(x_seen, w_seen, bias, out, stride, padding, dilation, channels_inner)
    if not copy_x and w_format is None:
        return launch

    def run(x, weight, bias, out):
        if copy_x:
            x = x.contiguous()
        if w_format is not None:
            weight = weight.contiguous(memory_format=w_format)
        launch(x, weight, bias, out)

    return run


def _tma_route(x, weight, bias, out, padding: tuple, dilation: tuple) -> Callable:
    """How the TMA kernel runs this convolution (see conv2d_tma.plan)."""
    plan = conv2d_tma.plan(x, weight, bias, out, padding, dilation)
    return lambda x, w, b, out: plan(x, w, None if b is None else b.contiguous(), out)


def _on_new_output(run, shape, x, weight, bias) -> Callable[[], None]:
    """`run` on these arguments, into an NCHW output allocated by the call as conv2d's is
    (so that running out of GPU memory shows in the call)."""

    def call() -> None:
        run(x, weight, bias, torch.empty(shape, dtype=x.dtype, device=x.device))

    return call


def _choose_route_by_timing(calls: list[Callable[[], None]]) -> int:
    """Which of these calls to keep: the first, unless another takes clearly less of the
    GPU's time (see _route_to_keep).

    Each call is made once first (its kernels compiled and tuned), then timed over
    ROUTE_TIMING_ROUNDS rounds of ROUTE_TIMING_CALLS calls back to back, the rounds of the
    calls in turn, each call's best round kept. Each round waits behind a sleep on the GPU
    that lets the host queue all of its calls first, so the round takes the GPU's time
    alone, however fast the host. A call that runs out of GPU memory (the copies need room
    of their own) counts as the slowest."""
    stream = torch.cuda.current_stream()  # where course_lib's kernels launch
    on_gpu = [float("inf")] * len(calls)

    def round_ms(call) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(ROUTE_QUEUE_CYCLES)
        start.record(stream)
        for _ in range(ROUTE_TIMING_CALLS):
            call()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end)

    with trial_launches():  # not the call's own: a recording of its launches leaves them out
        usable = [_runs(call) for call in calls]
        for _ in range(ROUTE_TIMING_ROUNDS):
            for i, call in enumerate(calls):
                if usable[i]:
                    on_gpu[i] = min(on_gpu[i], round_ms(call))
    return _route_to_keep(on_gpu)


def _route_to_keep(on_gpu: list[float]) -> int:
    """Which route _choose_route_by_timing keeps, given each one's time on the GPU's clock:
    the first, or of the others taking at most ROUTE_GPU_SHARE of its time, the fastest.
    A route that ran out of memory (inf) is never kept over one that ran."""
    better = [
        i for i in range(1, len(on_gpu))
        if math.isfinite(on_gpu[i]) and on_gpu[i] <= ROUTE_GPU_SHARE * on_gpu[0]
    ]  # fmt: skip
    return min(better, key=lambda i: on_gpu[i], default=0)


def _runs(call: Callable[[], None]) -> bool:
    """Makes the call once; whether it ran, rather than run out of GPU memory."""
    try:
        call()
    except torch.OutOfMemoryError:
        return False
    return True


def _copied(t: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
    """What a copy of `t` in this memory format looks like (shape, strides), on the meta
    device: no memory is taken. (Not torch.empty_like: on a meta tensor it runs torch's
    Python reference, whose first use imports sympy, seconds of a first call.)"""
    return torch.empty(t.shape, dtype=t.dtype, device="meta", memory_format=memory_format)


def _bias_only(x, weight, bias, out) -> None:
    """A convolution over no channels: the bias alone, or zeros."""
    out.zero_() if bias is None else out.copy_(bias[:, None, None].expand_as(out))


def _reach(t: torch.Tensor) -> int:
    """The farthest offset, in elements, that one image of t (or one filter) spans."""
    return sum((n - 1) * abs(s) for n, s in zip(t.shape[1:], t.stride()[1:]))


def _strides_are(t: torch.Tensor, strides: tuple) -> bool:
    """t has these strides, except along dimensions of size 1, whose stride means nothing."""
    return all(a == b for a, b, n in zip(t.stride(), strides, t.shape) if n > 1)
