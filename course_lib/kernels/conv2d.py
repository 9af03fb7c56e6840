"""Lesson 06: 2-D convolution as an implicit matrix product.

The output, seen as a matrix, has M = B·OH·OW rows (output pixels) and N = O columns
(output channels); the reduction runs over K = C·kh·kw taps. Each program computes one
BLOCK_M x BLOCK_N tile of it, as lesson 05's matmul does, but never builds the matrix of
input windows (im2col): each step of K gathers its A tile straight from the input, and
the load's mask, false where a tap falls into the padding, *is* the padding.

With 16 channels or more, K runs (r, s, c): each row of an A tile is BLOCK_K channels of
one pixel, contiguous in a channels-last input. With fewer (an RGB image), K runs (c, r, s)
over an NCHW input, loaded along the pixels. The weight is read as an [O, K] matrix. What
the lesson does not cover (copies, views past 32-bit offsets, Hopper's TMA kernel and its
timed routes) is in conv2d_fast_paths.py, which `conv2d` hands those cases to.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.gpu_timer import autotune_timer
from course_lib.kernels import conv2d_fast_paths as fast_paths
from course_lib.kernels._args import cdiv, check_same, conv2d_padding, conv2d_pair
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import PlanCache, signature, uses_tf32
from course_lib.kernels.tiles import SMALL_CONFIG, SMALL_PRODUCT, grouped_tile, tile_configs

INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4}
MIN_CHANNELS_INNER = 16  # fewer (an RGB image): K in (c, r, s) order, as they lie
# BLOCK_M, BLOCK_N, BLOCK_K, stages, warps: N = O is 64 to 512 in most networks, M large
TILE_SHAPES = [
    (128, 128, 64, 3, 8), (128, 64, 64, 4, 4), (256, 64, 64, 3, 8), (64, 128, 64, 4, 4),
    (128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 32, 4, 4), (64, 64, 32, 4, 4),
    (128, 64, 32, 4, 4), (128, 64, 64, 3, 4), (64, 64, 64, 3, 4),
    # an NCHW x read in place with many channels (ResNet's 14x14 layer with 256, measured)
    (64, 128, 128, 3, 8),
]  # fmt: skip


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


# what a tuned config is kept for (Triton adds the dtypes); stride_xc: x's layout
TUNED_BY = ["B", "C", "H", "W", "O", "OH", "OW", "KH", "KW", "stride_xc", "CHANNELS_INNER",
            "W_FLAT", "INPUT_PRECISION"]  # fmt: skip
conv2d_kernel_autotuned = triton.autotune(
    configs=tile_configs(TILE_SHAPES), key=TUNED_BY, do_bench=autotune_timer
)(conv2d_kernel)
conv2d_launcher = LeanLauncher(conv2d_kernel)
conv2d_autotuned_launcher = LeanLauncher(conv2d_kernel_autotuned)


_plans = PlanCache()  # conv2d's, by signature


def conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
    padding=0, dilation=1, groups: int = 1,
) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.conv2d of x [B, C, H, W] with weight [O, C, kh, kw] and an optional
    bias [O]; stride, padding and dilation are ints or pairs, padding also "same" or "valid".

    Any strides; the output [B, O, OH, OW] comes in x's memory format (channels-last in,
    channels-last out). fp16 and bf16 accumulate in fp32; fp32 uses TF32 tensor cores where
    torch's convolutions would (torch.backends.cudnn.allow_tf32, or cudnn.conv.fp32_precision).

    On Hopper GPUs an NCHW x of mid-sized layers takes the route a first call chose by
    timing two, as cuDNN does under torch.backends.cudnn.benchmark: two processes may,
    rarely, differ by rounding. torch.use_deterministic_algorithms(True) reads x in place,
    untimed.
    """
    key = signature((x, weight, bias), (stride, padding, dilation, groups))
    plan = _plans.get(key)
    if plan is None:  # a first call with arguments like these
        plan, final = _prepare(x, weight, bias, stride, padding, dilation, groups)
        if final:  # not a route that should have been timed, and was not
            _plans.put(key, plan)
    return plan(x, weight, bias)


def _prepare(x, weight, bias, stride, padding, dilation, groups) -> tuple[Callable, bool]:
    """conv2d's plan for these arguments, a function of (x, weight, bias), and whether it is
    final (see conv2d_fast_paths.route); a clear error for anything conv2d does not take."""
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
    stride, dilation = conv2d_pair(stride, "stride"), conv2d_pair(dilation, "dilation")
    if min(*stride, *dilation) < 1:
        raise ValueError(f"conv2d: stride and dilation must be >= 1, got {stride}, {dilation}")
    pt, pl, pb, pr = conv2d_padding(padding, (KH, KW), dilation, stride)
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
    out = torch.empty((B, O, OH, OW), dtype=x.dtype, device="meta", memory_format=memory_format)
    channels_inner = C >= MIN_CHANNELS_INNER
    args = (x, weight, bias, out, stride, (pt, pl), dilation, channels_inner)
    # empty outputs, copies, views past 32 bits, Hopper's TMA kernel, timed routes
    route = fast_paths.route(*args, lesson_launch)
    if route is None:  # the lesson's kernel reads x and the weight as they are
        route = lesson_launch(*args), True
    run, final = route

    def plan(x, weight, bias) -> torch.Tensor:  # into a new output
        out = torch.empty((B, O, OH, OW), dtype=x.dtype, device=x.device,
                          memory_format=memory_format)  # fmt: skip
        run(x, weight, bias, out)
        return out

    return plan, final


def lesson_launch(x, weight, bias, out, stride, padding, dilation, channels_inner: bool):
    """The launch of conv2d_kernel for operands laid out like these (out may be on the meta
    device), bound (see BoundLaunch): a function of (x, weight, bias, out)."""
    (B, C, H, W), (O, _, KH, KW), (OH, OW) = x.shape, weight.shape, out.shape[2:]
    sizes = (B, C, H, W, O, OH, OW, *x.stride(), *weight.stride(), *out.stride(),
             *stride, *padding, *dilation)  # fmt: skip
    tf32 = uses_tf32(x.dtype, convolution=True)
    meta = dict(
        KH=KH, KW=KW, CHANNELS_INNER=channels_inner, C_DIVISOR=min(C & -C, 128),
        K_DIVISOR=min((C * KH * KW) & -(C * KH * KW), 128),
        W_FLAT=fast_paths.weight_rows_flat(weight, channels_inner),
        HAS_BIAS=bias is not None, INPUT_PRECISION="tf32" if tf32 else "ieee",
    )  # fmt: skip
    M = B * OH * OW
    if runtime.INTERPRETED or M * O * C * KH * KW <= SMALL_PRODUCT:
        config = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (cdiv(M, config["BLOCK_M"]) * cdiv(O, config["BLOCK_N"]),)
        launch = BoundLaunch(conv2d_launcher, grid, meta | config)
    else:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(O, m["BLOCK_N"]),)
        launch = BoundLaunch(conv2d_autotuned_launcher, grid, meta)

    def run(x, weight, bias, out):
        bias_arg = x if bias is None else bias.contiguous()  # never read without HAS_BIAS
        launch(x, weight, bias_arg, out, *sizes)

    return run
