"""Lesson 06: 2-D convolution as an implicit matrix product.

The output, seen as a matrix, has M = B·OH·OW rows (output pixels) and N = O columns
(output channels); the reduction runs over K = C·kh·kw taps. Each program computes one
BLOCK_M x BLOCK_N tile of it, as lesson 05's matmul does, but never builds the [M, K]
matrix of input windows (im2col): each step of K gathers its A tile straight from the
input, and the load's mask, false where a tap falls into the padding, *is* the padding.

With 16 channels or more, K runs (r, s, c), c innermost: the tap (r, s) is one scalar per
step, and each row of an A tile is BLOCK_K channels of one input pixel, contiguous in a
channels-last input. An NCHW input is read in place in the same order, each row of a tile
then gathered across channel planes H·W apart. With fewer channels (an RGB image) a channel
tile would be mostly padding, so K runs (c, r, s), each lane a tap of its own, over an NCHW
input (copied so where it is channels-last), whose tiles are loaded along the pixels that
lie side by side. The weight is read as an [O, K] matrix, in contiguous runs where its rows
lie in K's order (an NCHW model's weight for (c, r, s), a channels-last model's for
(r, s, c)); otherwise through its strides if both it and the product are small, and from a
copy in K's order if not.

On Hopper GPUs, 16-bit stride-1 convolutions go to conv2d_tma.py instead, whose tiles the
TMA unit moves: channels-last ones always. An NCHW input it copies channels-last first, with
the weight, which pays for itself in some layers and not in others: in mid-sized products
conv2d times both routes on the first call of a signature and keeps the faster (see
NCHW_TIMED_PRODUCT); small ones stay in place, very large ones are copied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.gpu_timer import autotune_timer
from course_lib.kernels import conv2d_tma
from course_lib.kernels._args import cdiv, check_same
from course_lib.kernels._launch import BoundLaunch, LeanLauncher, trial_launches
from course_lib.kernels._plan import PlanCache, into_graph, signature
from course_lib.kernels.tiles import grouped_tile

INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4}
# inputs with fewer channels (an RGB image) take K in (c, r, s) order, as they lie
MIN_CHANNELS_INNER = 16
# a weight whose rows are not contiguous in K's order is read through its strides up to
# this size, and copied past it: measured with an NCHW x copied first, reading a 64x64x3x3
# weight in place beat copying it, and reading a 128x128x3x3 one lost
MAX_STRIDED_WEIGHT = 1 << 16
# ...except in products of this many multiply-adds or more, where the GPU's time outweighs
# the copy's launch (measured on ResNet's 56x56 3x3 layer, x read in place). The bound is
# NCHW_TIMED_PRODUCT's, for the same reason; no product between it and that layer's was
# measured
COPY_WEIGHT_PRODUCT = 2**30

# BLOCK_M, BLOCK_N, BLOCK_K, stages, warps. O, the N of the product, is 64 to 512 in
# most networks, so tiles are at most 256 wide; M is large, so tall tiles come first.
TILE_SHAPES = [
    (128, 128, 64, 3, 8),
    (128, 64, 64, 4, 4),
    (256, 64, 64, 3, 8),
    (64, 128, 64, 4, 4),
    (128, 256, 64, 3, 8),
    (256, 128, 64, 3, 8),
    (128, 128, 32, 4, 4),
    (64, 64, 32, 4, 4),
    (128, 64, 32, 4, 4),
    (128, 64, 64, 3, 4),
    (64, 64, 64, 3, 4),
    # an NCHW x read in place with many channels (ResNet's 14x14 layer with 256, measured)
    (64, 128, 128, 3, 8),
]


@triton.jit
def conv2d_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    B, C, H, W, O, OH, OW,
    stride_xb, stride_xc, stride_xh, stride_xw,
    stride_wo, stride_wc, stride_wr, stride_ws,
    stride_ob, stride_oc, stride_oh, stride_ow,
    SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr,
    CHANNELS_INNER: tl.constexpr,  # K in (r, s, c) order; (c, r, s) otherwise
    C_DIVISOR: tl.constexpr,  # a power of two that divides C (up to 128)
    K_DIVISOR: tl.constexpr,  # a power of two that divides C·kh·kw (up to 128)
    W_FLAT: tl.constexpr,  # each weight row w[o] is contiguous in K's order
    HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    M = B * OH * OW
    K = C * KH * KW
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), M, O, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] output pixels
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output channels
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    m_ok = offs_m < M
    n_ok = offs_n < O
    b = tl.where(m_ok, offs_m // (OH * OW), 0)
    oh = (offs_m // OW) % OH
    ow = offs_m % OW
    ih0 = oh * SH - PH  # [BLOCK_M] the window's top-left corner, padding included
    iw0 = ow * SW - PW
    # int64 for the batch term: B·C·H·W may pass 2^31 elements, one image may not
    x_rows = x_ptr + b.to(tl.int64) * stride_xb  # [BLOCK_M]
    w_cols = w_ptr + tl.where(n_ok, offs_n, 0) * stride_wo  # [BLOCK_N]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if CHANNELS_INNER and C_DIVISOR % BLOCK_K == 0:
            # the tile lies in one tap (r, s): scalars, and BLOCK_K channels in a row
            rs = k0 // C
            c = tl.multiple_of(k0 % C, BLOCK_K) + offs_k  # [BLOCK_K]
            ih = ih0 + (rs // KW) * DH  # [BLOCK_M]
            iw = iw0 + (rs % KW) * DW
            pixel_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            x_ptrs = (x_rows + ih * stride_xh + iw * stride_xw)[:, None] + c[None, :] * stride_xc
            x_mask = pixel_ok[:, None]
            k_ok = offs_k < BLOCK_K  # all true: the tile never passes K
            w_k = c * stride_wc + (rs // KW) * stride_wr + (rs % KW) * stride_ws  # [BLOCK_K]
        else:
            k = k0 + offs_k  # [BLOCK_K] each tap its own (c, r, s)
            if CHANNELS_INNER:
                c = k % C
                r = (k // C) // KW
                s = (k // C) % KW
            else:
                c = k // (KH * KW)
                r = (k // KW) % KH
                s = k % KW
            ih = ih0[:, None] + (r * DH)[None, :]  # [BLOCK_M, BLOCK_K]
            iw = iw0[:, None] + (s * DW)[None, :]
            k_ok = (k < K) | (K_DIVISOR % BLOCK_K == 0)
            x_mask = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            x_ptrs = x_rows[:, None] + ih * stride_xh + iw * stride_xw + (c * stride_xc)[None, :]
            w_k = c * stride_wc + r * stride_wr + s * stride_ws
        if W_FLAT:  # one contiguous run per weight row: the compiler sees it
            w_k = k0 + offs_k
        w_ptrs = w_cols[None, :] + w_k[:, None]  # [BLOCK_K, BLOCK_N]
        if not CHANNELS_INNER:  # x is NCHW here
            # loaded as [BLOCK_K, BLOCK_M], so that neighbouring lanes read neighbouring
            # pixels of one channel, which an NCHW image keeps side by side (measured on the
            # 7x7 RGB stem, half as fast again as lanes along K)
            x_tile = tl.trans(tl.load(tl.trans(x_ptrs), mask=tl.trans(x_mask), other=0.0))
        else:
            x_tile = tl.load(x_ptrs, mask=x_mask, other=0.0)  # [BLOCK_M, BLOCK_K]
        w_tile = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x_tile, w_tile, acc, input_precision=INPUT_PRECISION)

    if HAS_BIAS:  # fused: added in registers before the one store
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_rows = out_ptr + b.to(tl.int64) * stride_ob + oh * stride_oh + ow * stride_ow
    out_ptrs = out_rows[:, None] + offs_n[None, :] * stride_oc
    # lanes along the output channels even for an NCHW output: measured, lanes along
    # the pixels (tl.trans of the tile) stored at less than half the speed
    out_mask = m_ok[:, None] & n_ok[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


# tiny products take one modest tile: tuning each new shape would cost more than it wins
SMALL_PRODUCT = 256**3
# An NCHW x reaches the TMA kernel through channels-last copies of x and the weight, made
# by a launch of their own. Which route is faster depends on the layer and on the host:
# the copied route saves GPU time on some layers, and costs the host a second launch. So
# from NCHW_TIMED_PRODUCT multiply-adds the first call of a signature times both routes in
# a loop, as a user's loop runs them, and keeps the faster (_fastest_in_a_loop). Below it
# both take less GPU time than the copy route costs the host, and x is read in place; from
# NCHW_TMA_PRODUCT on the GPU's time decides, and x is copied (figures in the appendix).
NCHW_TIMED_PRODUCT = 2**30
NCHW_TMA_PRODUCT = 2**34
# how routes are timed (_fastest_in_a_loop): rounds of calls back to back, the best kept
ROUTE_TIMING_ROUNDS = 3
ROUTE_TIMING_CALLS = 20
SMALL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
# the sizes and choices a tuned config is kept for (the dtypes are added by Triton), x's
# layout among them (stride_xc is 1 in channels-last memory)
TUNED_BY = ["B", "C", "H", "W", "O", "OH", "OW", "KH", "KW", "stride_xc", "CHANNELS_INNER",
            "W_FLAT", "INPUT_PRECISION"]  # fmt: skip
conv2d_kernel_autotuned = triton.autotune(
    configs=[
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w
        )
        for m, n, k, s, w in TILE_SHAPES
    ],  # fmt: skip
    key=TUNED_BY,
    do_bench=autotune_timer,
)(conv2d_kernel)
conv2d_launcher = LeanLauncher(conv2d_kernel)
conv2d_autotuned_launcher = LeanLauncher(conv2d_kernel_autotuned)


def _pair(value, name: str) -> tuple[int, int]:
    """An int or a pair of ints, as a pair; a clear error for anything else."""
    if type(value) is int:  # the usual case, at the least host cost
        return value, value
    try:
        pair = (value, value) if isinstance(value, int) else tuple(value)
    except TypeError:  # a float, say
        pair = ()
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise TypeError(f"conv2d: {name} must be an int or a pair of ints, got {value!r}")
    return pair


def _padding(padding, kernel: tuple[int, int], dilation: tuple[int, int], stride) -> tuple:
    """(top, left, bottom, right): torch's "same" puts the odd pixel at the bottom and right."""
    if padding == "valid":
        return 0, 0, 0, 0
    if padding == "same":
        if stride != (1, 1):
            raise ValueError("conv2d: padding='same' needs stride 1, as in torch")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2
    if isinstance(padding, str):
        raise ValueError(f"conv2d: padding must be 'same', 'valid', an int or a pair: {padding!r}")
    ph, pw = _pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"conv2d: padding must be >= 0, got {padding!r}")
    return ph, pw, ph, pw


def _largest_power_of_2_dividing(n: int, cap: int = 128) -> int:
    return min(n & -n, cap)


def _reach(t: torch.Tensor) -> int:
    """The farthest offset, in elements, that one image of t (or one filter) spans."""
    return sum((n - 1) * abs(s) for n, s in zip(t.shape[1:], t.stride()[1:]))


def _strides_are(t: torch.Tensor, strides: tuple) -> bool:
    """t has these strides, except along dimensions of size 1, whose stride means nothing."""
    return all(a == b for a, b, n in zip(t.stride(), strides, t.shape) if n > 1)


@dataclass
class _Call:
    """conv2d's plan: what it works out from its arguments before it launches, the
    output's size and layout, and how to fill it (`run(x, weight, bias, out)`). It depends
    only on the call's signature (and on this module's constants, so a change to one of
    those takes effect for new signatures only), so it is kept per signature."""

    out_shape: tuple
    memory_format: torch.memory_format
    run: Callable[..., None]
    # False for a route chosen without the timing it needed (see _prepare): the next
    # call like it chooses again
    final: bool = True

    def __call__(self, x, weight, bias) -> torch.Tensor:
        """The convolution, into a new output."""
        out = torch.empty(self.out_shape, dtype=x.dtype, device=x.device,
                          memory_format=self.memory_format)  # fmt: skip
        self.run(x, weight, bias, out)
        return out


_plans = PlanCache()  # conv2d's, by signature


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> torch.Tensor:
    """torch.nn.functional.conv2d of x [B, C, H, W] with weight [O, C, kh, kw] and an optional
    bias [O]; stride, padding and dilation are ints or pairs, padding also "same" or "valid".

    Any strides; the output [B, O, OH, OW] comes in x's memory format (channels-last in,
    channels-last out). fp16 and bf16 accumulate in fp32; fp32 uses TF32 tensor cores when
    torch.backends.cudnn.allow_tf32 is True, as torch's convolutions do.

    On Hopper GPUs an NCHW x of mid-sized layers takes whichever of two routes ran faster
    when the first call of its shape timed them (see NCHW_TIMED_PRODUCT), as cuDNN does
    under torch.backends.cudnn.benchmark: two processes may choose differently, and their
    results then differ by rounding. Under torch.use_deterministic_algorithms(True) that
    first call reads x in place, untimed.
    """
    key = signature((x, weight, bias), (stride, padding, dilation, groups))
    plan = _plans.get(key)
    if plan is None:
        plan = _prepare(x, weight, bias, stride, padding, dilation, groups)
        if plan.final:
            _plans.put(key, plan)
    return plan(x, weight, bias)


def _prepare(x, weight, bias, stride, padding, dilation, groups) -> _Call:
    """conv2d's checks and choices for these arguments (see _Call), with a clear error for
    anything it does not take."""
    if groups != 1:
        raise NotImplementedError(
            f"conv2d: groups={groups} is not supported; only groups=1 (every output channel "
            "sees every input channel)"
        )
    check_same("conv2d", x, weight, same_shape=False)
    if x.dim() != 4 or weight.dim() != 4:
        raise ValueError(
            f"conv2d expects x [B, C, H, W] and weight [O, C, kh, kw]; got {list(x.shape)} "
            f"and {list(weight.shape)}"
        )
    (B, C, H, W), (O, C_w, KH, KW) = x.shape, weight.shape
    if C_w != C:
        raise ValueError(f"conv2d: x has {C} channels but weight expects {C_w}")
    if bias is not None:
        check_same("conv2d", x, bias, same_shape=False)
        if bias.shape != (O,):
            raise ValueError(f"conv2d: bias must have shape [{O}], got {list(bias.shape)}")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(*stride, *dilation) < 1:
        raise ValueError(f"conv2d: stride and dilation must be >= 1, got {stride}, {dilation}")
    pt, pl, pb, pr = _padding(padding, (KH, KW), dilation, stride)
    OH = (H + pt + pb - dilation[0] * (KH - 1) - 1) // stride[0] + 1
    OW = (W + pl + pr - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    if OH < 1 or OW < 1:
        raise ValueError(
            f"conv2d: a {KH}x{KW} kernel (dilation {dilation}) does not fit in the padded "
            f"{H + pt + pb}x{W + pl + pr} input"
        )
    if max(C * H * W, O * OH * OW, B * OH * OW, O * C * KH * KW) >= 2**31:
        raise ValueError(
            "conv2d: one image, one output image or the weight has 2^31 elements or more, past "
            "what this kernel's 32-bit offsets address; split the images into tiles"
        )
    # the output takes x's memory format
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty((B, O, OH, OW), device="meta", memory_format=memory_format)
    if out.numel() == 0:
        return _Call(out.shape, memory_format, lambda *_: None)
    if C == 0:
        return _Call(out.shape, memory_format, _bias_only)
    # a view's offsets reach as far as its strides take them, whatever its element count
    # (a dense tensor's reach is bounded by the size checks above): copied past 32 bits
    far_x = not (x.is_contiguous() or channels_last) and _reach(x) >= 2**31
    far_w = _reach(weight) >= 2**31
    # what the route is planned for: the copies' layout, on the meta device
    x_seen = _copied(x) if far_x else x
    w_seen = _copied(weight) if far_w else weight
    product = B * OH * OW * O * C * KH * KW
    # on Hopper, stride-1 convolutions go to the TMA kernel (conv2d_tma.py); an NCHW x, which
    # it copies channels-last first, where that is faster (see NCHW_TIMED_PRODUCT)
    tma = product > SMALL_PRODUCT and conv2d_tma.suits(x, weight, stride)
    in_place = lambda: _lesson_route(x_seen, w_seen, bias, out, stride, (pt, pl), dilation,
                                     product)  # fmt: skip
    final = True
    if not tma or (not channels_last and product < NCHW_TIMED_PRODUCT):
        route = in_place()
    elif channels_last or product >= NCHW_TMA_PRODUCT:
        route = _tma_route(x_seen, w_seen, bias, out, (pt, pl), dilation)
    elif far_x or far_w or into_graph() or torch.are_deterministic_algorithms_enabled():
        route = in_place()  # untimed: the same route on every run
    elif torch.cuda.is_current_stream_capturing():  # no timing inside a CUDA graph
        route, final = in_place(), False
    else:  # an NCHW x in between: the faster of reading it in place and copying it
        routes = [in_place(), _tma_route(x_seen, w_seen, bias, out, (pt, pl), dilation)]
        options = (stride, padding, dilation, groups)
        calls = [_as_conv2d_calls_it(_Call(out.shape, memory_format, r), x, weight, bias, options)
                 for r in routes]  # fmt: skip
        route = routes[_fastest_in_a_loop(calls)]
    if far_x or far_w:
        run = route

        def route(x, w, b, out):
            run(x.contiguous() if far_x else x, w.contiguous() if far_w else w, b, out)

    return _Call(out.shape, memory_format, route, final)


def _tma_route(x, weight, bias, out, padding: tuple, dilation: tuple) -> Callable:
    """How the TMA kernel runs this convolution (see conv2d_tma.plan)."""
    out = torch.empty_like(out, dtype=x.dtype)  # the plan reads its strides
    plan = conv2d_tma.plan(x, weight, bias, out, padding, dilation)
    return lambda x, w, b, out: plan(x, w, None if b is None else b.contiguous(), out)


def _as_conv2d_calls_it(call: _Call, x, weight, bias, options: tuple) -> Callable[[], None]:
    """`call` on these arguments at the host's cost of a planned conv2d() call: the
    signature's look-up, then the call (the output's allocation and the route)."""

    def as_called() -> None:
        _plans.get(signature((x, weight, bias), options))
        call(x, weight, bias)

    return as_called


def _fastest_in_a_loop(calls: list[Callable[[], None]]) -> int:
    """Which of these calls takes the least time per call in a loop of it, as a user's loop
    runs it: each is made once first (its kernels compiled and tuned), then timed over
    ROUTE_TIMING_ROUNDS rounds of ROUTE_TIMING_CALLS calls back to back, the rounds of the
    calls in turn, each call's best round kept. In a loop a call takes the longer of the
    host's time and the GPU's, and a round, timed from its first launch to the end of its
    last kernel on the GPU's clock, takes the sum of those longer times: so a route with
    more host work wins only where the GPU time it saves outweighs it. A call that runs
    out of GPU memory (the copies need room of their own) counts as the slowest."""
    stream = torch.cuda.current_stream()  # where course_lib's kernels launch
    best = [float("inf")] * len(calls)
    with trial_launches():  # not the call's own: a recording of its launches leaves them out
        usable = [_runs(call) for call in calls]
        for _ in range(ROUTE_TIMING_ROUNDS):
            for i, call in enumerate(calls):
                if not usable[i]:
                    continue
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                stream.synchronize()  # the GPU idle: the clock starts with the first launch
                start.record(stream)
                for _ in range(ROUTE_TIMING_CALLS):
                    call()
                end.record(stream)
                end.synchronize()
                best[i] = min(best[i], start.elapsed_time(end))
    return best.index(min(best))


def _runs(call: Callable[[], None]) -> bool:
    """Makes the call once; whether it ran, rather than run out of GPU memory."""
    try:
        call()
    except torch.OutOfMemoryError:
        return False
    return True


def _copied(t: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
    """What a copy of `t` in this memory format looks like (shape, strides), on the meta
    device: no memory is taken."""
    return torch.empty_like(t, device="meta", memory_format=memory_format)


def _bias_only(x, weight, bias, out) -> None:
    """A convolution over no channels: the bias alone, or zeros."""
    out.zero_() if bias is None else out.copy_(bias[:, None, None].expand_as(out))


def _lesson_route(x, weight, bias, out, stride, padding, dilation, product) -> Callable:
    """How the lesson's kernel runs this convolution: which operands are copied first, and
    its launch, bound (see BoundLaunch: the call's signature fixes its specialisation)."""
    (B, C, H, W), (O, _, KH, KW), (OH, OW) = x.shape, weight.shape, out.shape[2:]
    # K's order follows the memory, copied where that costs less: see the module's docstring
    channels_inner = C >= MIN_CHANNELS_INNER
    copy_x = not channels_inner and x.stride(3) != 1
    if copy_x:
        x = _copied(x)
    # the strides each weight row would have if it were contiguous in K's order
    flat = (KH * KW * C, 1, KW * C, C) if channels_inner else (C * KH * KW, KH * KW, KW, 1)
    w_flat = _strides_are(weight, flat)
    strided_read_pays = weight.numel() <= MAX_STRIDED_WEIGHT and product < COPY_WEIGHT_PRODUCT
    copy_w = not (w_flat or strided_read_pays)
    w_format = torch.channels_last if channels_inner else torch.contiguous_format
    if copy_w:
        weight = _copied(weight, w_format)
        w_flat = True
    sizes = (B, C, H, W, O, OH, OW, *x.stride(), *weight.stride(), *out.stride(),
             *stride, *padding, *dilation)  # fmt: skip
    tf32 = x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32
    meta = dict(
        KH=KH, KW=KW, CHANNELS_INNER=channels_inner,
        C_DIVISOR=_largest_power_of_2_dividing(C),
        K_DIVISOR=_largest_power_of_2_dividing(C * KH * KW), W_FLAT=w_flat,
        HAS_BIAS=bias is not None, INPUT_PRECISION="tf32" if tf32 else "ieee",
    )  # fmt: skip
    M = B * OH * OW
    if runtime.INTERPRETED or product <= SMALL_PRODUCT:
        config = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (cdiv(M, config["BLOCK_M"]) * cdiv(O, config["BLOCK_N"]),)
        launch = BoundLaunch(conv2d_launcher, grid, meta | config)
    else:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(O, m["BLOCK_N"]),)
        launch = BoundLaunch(conv2d_autotuned_launcher, grid, meta)

    def run(x, weight, bias, out):
        if copy_x:
            x = x.contiguous()
        if copy_w:
            weight = weight.contiguous(memory_format=w_format)
        bias_arg = x if bias is None else bias.contiguous()  # never read without HAS_BIAS
        launch(x, weight, bias_arg, out, *sizes)

    return run
