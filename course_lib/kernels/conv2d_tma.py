"""Lesson 06's convolution on Hopper: the implicit GEMM with its tiles moved by the TMA unit.

With stride 1, the input that a patch of output pixels reads for one tap (r, s) is a patch
of the same shape, shifted by (r·dh - ph, s·dw - pw). So an output tile is taken as a
BH x BW patch of one image (BLOCK_M = BH·BW pixels), and for each tap and channel tile the
TMA unit copies the shifted [1, BH, BW, BLOCK_K] box of the input, seen as the 4-D tensor
[B, H, W, C], into shared memory. What lies past an edge of the image it fills with zeros:
the padding, with no mask, no pointer and no index arithmetic per pixel. The weight is read
the same way, as [O, kh, kw, C] boxes, and a channels-last output is stored as a box too.

The lesson's kernel (conv2d.py) gathers its A tiles through pointers and masks; this one
runs the ResNet-50 3x3 layers channels-last markedly faster (figures in the benchmark's
report). It needs
the channels innermost (an NCHW input is copied channels-last first, in one launch with its
weight where both are: channels_last_pair_kernel below), 16-bit floats, stride 1, and rows a
multiple of 16 bytes apart: `suits` says when. A stride of 2 would need boxes that skip every
other pixel, which Triton's descriptors do not offer; such convolutions stay with the
lesson's kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.gpu_timer import autotune_timer
from course_lib.kernels._args import cdiv, next_power_of_2
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels._plan import PlanCache, signature
from course_lib.kernels.hopper import TMA_GPUS, capability, descriptor
from course_lib.kernels.tiles import grouped_tile

# BH, BW (the output patch, BLOCK_M = BH·BW pixels), BLOCK_N, BLOCK_K, stages, warps: the
# best of a search on Hopper over the ResNet-50 3x3 layers (8x8 patches for 64 channels
# at 56x56, 32x4 for 128 at 28x28, 16x8 and 8x8 for 256 at 14x14) and their neighbours.
TILE_SHAPES = [
    (8, 8, 64, 64, 4, 4),
    (8, 8, 128, 64, 4, 4),
    (16, 8, 64, 64, 4, 4),
    (16, 8, 128, 64, 4, 8),
    (8, 16, 128, 64, 4, 8),
    (32, 4, 128, 64, 4, 8),
    (16, 4, 128, 64, 4, 4),
    (16, 8, 128, 128, 3, 8),
    (16, 16, 128, 64, 3, 8),
    (16, 8, 256, 64, 3, 8),
]
INTERPRETER_CONFIG = {"BH": 4, "BW": 4, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}


@triton.jit
def tma_conv2d_kernel(
    x_desc, w_desc, out_desc, bias_ptr, out_ptr,
    B, H, W, C, O, OH, OW, PH, PW, DH, DW, stride_ob, stride_oc, stride_oh, stride_ow,
    KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, OUT_DESC: tl.constexpr,
    BH: tl.constexpr, BW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """One [BH·BW, BLOCK_N] tile of the output: a BH x BW patch of one image, BLOCK_N
    channels. x_desc is the input as [B, H, W, C], w_desc the weight as [O, kh, kw, C],
    out_desc the output as [B, OH, OW, O] where OUT_DESC; otherwise the output is stored
    through out_ptr and its strides (H and W key the autotuner only).

    One program per tile: measured, a persistent grid and descriptors built on the GPU
    both ran these layers slower and saved the host no time, which goes to Python, not
    to the descriptors."""
    BLOCK_M: tl.constexpr = BH * BW
    tiles_h = tl.cdiv(OH, BH)
    tiles_w = tl.cdiv(OW, BW)
    # counted in tiles, not pixels: a padded tile count times BLOCK_M may pass 2^31
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), B * tiles_h * tiles_w, O, 1, BLOCK_N,
                                GROUP_M)  # fmt: skip
    b = pid_m // (tiles_h * tiles_w)
    oh0 = (pid_m // tiles_w) % tiles_h * BH
    ow0 = pid_m % tiles_w * BW
    col = pid_n * BLOCK_N
    c_steps = tl.cdiv(C, BLOCK_K)  # channels past C load as zeros, from x and w alike
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, KH * KW * c_steps):
        rs = step // c_steps
        r, s = rs // KW, rs % KW
        c0 = (step % c_steps) * BLOCK_K
        # the patch shifted to tap (r, s): a box past any edge of the image is fine
        x_box = x_desc.load([b, oh0 + r * DH - PH, ow0 + s * DW - PW, c0])  # [1, BH, BW, BK]
        w_box = w_desc.load([col, r, s, c0])  # [BLOCK_N, 1, 1, BLOCK_K]
        a = tl.reshape(x_box, (BLOCK_M, BLOCK_K))
        acc = tl.dot(a, tl.reshape(w_box, (BLOCK_N, BLOCK_K)).T, acc)

    offs_n = col + tl.arange(0, BLOCK_N)
    if HAS_BIAS:  # fused: added in registers before the one store
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < O, other=0.0).to(tl.float32)[None, :]
    tile = acc.to(out_ptr.dtype.element_ty)
    if OUT_DESC:  # the TMA unit clips the box at the image's edges
        out_desc.store([b, oh0, ow0, col], tl.reshape(tile, (1, BH, BW, BLOCK_N)))
    else:
        offs_p = tl.arange(0, BLOCK_M)
        oh = oh0 + offs_p // BW
        ow = ow0 + offs_p % BW
        rows = out_ptr + b.to(tl.int64) * stride_ob + oh * stride_oh + ow * stride_ow
        mask = ((oh < OH) & (ow < OW))[:, None] & (offs_n < O)[None, :]
        tl.store(rows[:, None] + offs_n[None, :] * stride_oc, tile, mask=mask)


@triton.jit
def channels_last_kernel(
    src_ptr, dst_ptr, C, P, stride_b, stride_c, stride_p,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """dst[b, p, c] = src[b, c, p], one [BLOCK_C, BLOCK_P] tile of one image per program:
    the H·W pixels of an image are one axis p of src (as in NCHW memory), and dst is
    channels-last."""
    _copy_tile(src_ptr, dst_ptr, C, P, stride_b, stride_c, stride_p, tl.program_id(axis=0),
               BLOCK_C, BLOCK_P)  # fmt: skip


@triton.jit
def channels_last_pair_kernel(
    x_ptr, x_dst_ptr, C, P, stride_xb, stride_xc, stride_xp, x_programs,
    w_ptr, w_dst_ptr, C_W, P_W, stride_wb, stride_wc, stride_wp,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, W_BLOCK_C: tl.constexpr,
    W_BLOCK_P: tl.constexpr,
):  # fmt: skip
    """channels_last_kernel for an NCHW convolution's x and weight in one launch: the first
    x_programs programs copy x's tiles, the others the weight's, each with tiles of its own
    shape: the weight's copy as a launch of its own costs the host a launch and the GPU a
    small kernel's least time."""
    pid = tl.program_id(axis=0)
    if pid < x_programs:
        _copy_tile(x_ptr, x_dst_ptr, C, P, stride_xb, stride_xc, stride_xp, pid,
                   BLOCK_C, BLOCK_P)  # fmt: skip
    else:
        _copy_tile(w_ptr, w_dst_ptr, C_W, P_W, stride_wb, stride_wc, stride_wp,
                   pid - x_programs, W_BLOCK_C, W_BLOCK_P)  # fmt: skip


@triton.jit
def _copy_tile(
    src_ptr, dst_ptr, C, P, stride_b, stride_c, stride_p, tile,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """The tile-th [BLOCK_C, BLOCK_P] tile of the copy: read along the pixels and written
    along the channels, both contiguous; the compiler turns it around in shared memory
    between the two, as in lesson 03's transpose."""
    tiles_p = tl.cdiv(P, BLOCK_P)
    tiles_c = tl.cdiv(C, BLOCK_C)
    b = tile // (tiles_c * tiles_p)
    offs_c = (tile // tiles_p) % tiles_c * BLOCK_C + tl.arange(0, BLOCK_C)  # [BLOCK_C]
    offs_p = tile % tiles_p * BLOCK_P + tl.arange(0, BLOCK_P)  # [BLOCK_P]
    mask = (offs_c < C)[:, None] & (offs_p < P)[None, :]
    image = b.to(tl.int64)  # B·C·H·W may pass 2^31
    src = src_ptr + image * stride_b + offs_c[:, None] * stride_c + offs_p[None, :] * stride_p
    block = tl.load(src, mask=mask)  # [BLOCK_C, BLOCK_P]
    tl.store(dst_ptr + image * P * C + offs_p[None, :] * C + offs_c[:, None], block, mask=mask)


channels_last_launcher = LeanLauncher(channels_last_kernel)
channels_last_pair_launcher = LeanLauncher(channels_last_pair_kernel)


def _copy_tile_shape(C: int, P: int) -> dict:
    """channels_last_kernel's tile for images of C channels and P pixels: square, 64 x 64,
    as lesson 03's transpose found best (it copies ResNet's NCHW activations several times
    faster than torch's own copy); for fewer pixels (a filter's kh·kw = 9 taps, say)
    as few as cover them and more channels, where a square tile would leave most of its
    lanes masked off."""
    block_p = max(16, min(64, next_power_of_2(P)))
    block_c = max(16, min(4096 // block_p, next_power_of_2(C)))
    return {"BLOCK_C": block_c, "BLOCK_P": block_p, "num_warps": 4}


@dataclass
class _Copy:
    """How to copy a [B, C, H, W] operand channels-last, worked out once per layout: by
    channels_last_kernel where its H·W pixels are one axis (its rows follow each other in
    memory, as in NCHW), by torch otherwise, which copies NCHW activations to channels-last
    at a fraction of the memory's speed."""

    shape: tuple
    args: tuple  # C, P and the three strides
    launch: BoundLaunch | None  # None: torch copies; else its grid and tile are the copy's

    @staticmethod
    def of(t: torch.Tensor) -> _Copy:
        B, C, H, W = t.shape
        if H > 1 and W > 1 and t.stride(2) != W * t.stride(3):
            return _Copy(t.shape, (), None)
        stride_p = t.stride(3) if W > 1 else t.stride(2)
        P = H * W
        tile = _copy_tile_shape(C, P)
        tiles = cdiv(C, tile["BLOCK_C"]) * cdiv(P, tile["BLOCK_P"])
        launch = BoundLaunch(channels_last_launcher, (B * tiles,), tile)
        return _Copy(t.shape, (C, P, t.stride(0), t.stride(1), stride_p), launch)

    def empty_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty(self.shape, dtype=t.dtype, device=t.device,
                           memory_format=torch.channels_last)  # fmt: skip

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """The copy of `t`, which has the layout this copy was worked out for, and a
        16-byte alignment that does not change between calls (see BoundLaunch)."""
        if self.launch is None:
            return t.contiguous(memory_format=torch.channels_last)
        dst = self.empty_like(t)
        self.launch(t, dst, *self.args)
        return dst


@dataclass
class _Copies:
    """How to copy a convolution's x and weight channels-last where the TMA unit cannot
    read them as they are (either copy None where it can): in one launch of
    channels_last_pair_kernel where both go through the course's kernel."""

    copy_x: _Copy | None
    copy_w: _Copy | None
    pair: BoundLaunch | None = field(init=False, default=None)
    x_args: tuple = field(init=False, default=())  # the pair's for x, x_programs last

    def __post_init__(self):
        x, w = self.copy_x, self.copy_w
        if x is not None and w is not None and x.launch is not None and w.launch is not None:
            x_programs, w_programs = x.launch.grid[0], w.launch.grid[0]
            tiles = {"W_BLOCK_C": w.launch.meta["BLOCK_C"], "W_BLOCK_P": w.launch.meta["BLOCK_P"]}
            self.pair = BoundLaunch(channels_last_pair_launcher, (x_programs + w_programs,),
                                   x.launch.meta | tiles)  # fmt: skip
            self.x_args = (*x.args, x_programs)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> tuple:
        """(x, weight), each copied where this was worked out to copy it."""
        if self.pair is not None:
            x_copy, w_copy = self.copy_x.empty_like(x), self.copy_w.empty_like(weight)
            self.pair(x, x_copy, *self.x_args, weight, w_copy, *self.copy_w.args)
            return x_copy, w_copy
        if self.copy_x is not None:
            x = self.copy_x(x)
        if self.copy_w is not None:
            weight = self.copy_w(weight)
        return x, weight


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """t [B, C, H, W] copied channels-last (see _Copy)."""
    return _Copy.of(t)(t)


def _boxes(config: dict) -> tuple[list, list, list]:
    """The boxes of x, the weight and the output that a config's tiles take."""
    bh, bw, bn, bk = config["BH"], config["BW"], config["BLOCK_N"], config["BLOCK_K"]
    return [1, bh, bw, bk], [bn, 1, 1, bk], [1, bh, bw, bn]


def _set_block_shapes(args: dict) -> None:
    """Make the descriptors' boxes those of the config about to run."""
    boxes = _boxes(args)
    for name, box in zip(("x_desc", "w_desc", "out_desc"), boxes):
        args[name].block_shape = box


# the sizes and choices a tuned config is kept for
TUNED_BY = ["B", "H", "W", "C", "O", "OH", "OW", "DH", "DW", "KH", "KW", "HAS_BIAS", "OUT_DESC"]
tma_conv2d_autotuned = triton.autotune(
    configs=[
        triton.Config(
            {"BH": bh, "BW": bw, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8},
            num_stages=s,
            num_warps=w,
            pre_hook=_set_block_shapes,
        )
        for bh, bw, n, k, s, w in TILE_SHAPES
    ],  # fmt: skip
    key=TUNED_BY,
    do_bench=autotune_timer,
)(tma_conv2d_kernel)
tma_conv2d_launcher = LeanLauncher(tma_conv2d_kernel)
tma_conv2d_autotuned_launcher = LeanLauncher(tma_conv2d_autotuned)


def suits(x: torch.Tensor, weight: torch.Tensor, stride: tuple[int, int]) -> bool:
    """Whether tma_conv2d takes this convolution: on the GPUs in TMA_GPUS, fp16 or bf16,
    stride 1, and C and O multiples of 8, so that every row of channels is a multiple of
    16 bytes long (x's layout is tma_conv2d's business: it copies an NCHW x)."""
    if runtime.INTERPRETED or capability(x.get_device()) not in TMA_GPUS:
        return False
    return (
        x.dtype in (torch.float16, torch.bfloat16)
        and x.numel() > 0  # a descriptor has no axis of size 0
        and stride == (1, 1)
        and x.shape[1] % 8 == 0
        and weight.shape[0] % 8 == 0
    )


@dataclass
class ConvPlan:
    """What tma_conv2d works out once per signature of its operands: in a loop, checking
    strides and building the kernel's arguments again on every call would cost the host
    more than the launch itself. Called as plan(x, weight, bias, out) on operands of that
    signature (shapes, strides, dtype, and each one's alignment to 16 bytes, the bias's
    too)."""

    copies: _Copies  # how x and the weight are copied channels-last first, where they are
    views: tuple  # (shape, strides) of x, the weight and the output, channels innermost
    out_desc: bool  # the output takes TMA stores (else x's view stands in for it)
    sizes: tuple  # the kernel's integer arguments
    meta: dict
    grid: Callable[[dict], tuple]
    # once the autotuner has chosen: the boxes of its config, and the plain kernel's
    # launch bound to it, with no pre_hook to run and no autotuner to consult (one
    # attribute, set once: a thread never sees the launch without its boxes)
    bound: tuple[tuple, BoundLaunch] | None = None

    def __call__(self, x, weight, bias, out, config: dict | None = None) -> None:
        x, weight = self.copies(x, weight)
        if config is None and runtime.INTERPRETED:  # nothing to time there
            config = INTERPRETER_CONFIG
        bound = self.bound
        if config is not None:
            boxes = _boxes(config)
        elif bound is not None:
            boxes = bound[0]
        else:  # the autotuner's pre_hook sets the boxes of each config it tries
            boxes = ([1, 1, 1, 16],) * 3
        x_view, w_view, out_view = self.views
        descs = (descriptor(x, *x_view, boxes[0]), descriptor(weight, *w_view, boxes[1]),
                 descriptor(out if self.out_desc else x, *out_view, boxes[2]))  # fmt: skip
        args = (*descs, out if bias is None else bias, out, *self.sizes)
        if config is not None:
            tma_conv2d_launcher[self.grid(config)](*args, **self.meta, **config)
        elif bound is not None:
            bound[1](*args)
        else:
            config = tma_conv2d_autotuned_launcher.tune(self.grid, args, self.meta)
            launch = BoundLaunch(
                tma_conv2d_launcher, self.grid(config), self.meta | config, tuned=config
            )
            self.bound = _boxes(config), launch


# plans by the operands' signature (see tma_conv2d)
_plans = PlanCache()


def _box_rules_met(t: torch.Tensor) -> bool:
    """Whether the TMA unit reads the 4-D `t` with its channels (axis 1) as the innermost
    axis of a box: channels contiguous, every other stride a multiple of 16 bytes, and a
    16-byte aligned start."""
    if t.stride(1) != 1 and t.shape[1] > 1:
        return False
    others = [s for i, s in enumerate(t.stride()) if i != 1 and t.shape[i] > 1]
    # a stride of 0 (an expanded tensor) is no stride the TMA unit steps by
    return all(s > 0 and s * t.element_size() % 16 == 0 for s in others) and (
        t.data_ptr() % 16 == 0
    )


def _channels_innermost(t: torch.Tensor) -> tuple[list, list]:
    """The shape and strides of [B, C, H, W]-like `t` seen as [B, H, W, C]. An axis of
    size 1 gets a stride of 16 bytes: it is never stepped along, and the TMA unit wants
    every stride but the innermost a multiple of 16 bytes, whatever the axis's size."""
    shape = [t.shape[i] for i in (0, 2, 3, 1)]
    strides = [t.stride(i) if t.shape[i] > 1 else 16 // t.element_size() for i in (0, 2, 3)]
    return shape, [*strides, 1]


def _copy_plan(t: torch.Tensor) -> _Copy | None:
    return None if _box_rules_met(t) else _Copy.of(t)


def plan(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
         padding: tuple[int, int], dilation: tuple[int, int]) -> ConvPlan:  # fmt: skip
    """What tma_conv2d does for operands of this layout, worked out from their shapes,
    strides, dtype and alignment (any of them may be on the meta device, whose tensors
    count as aligned): a plan that a caller keyed on those may keep and call."""
    copy_x, copy_w = _copy_plan(x), _copy_plan(weight)
    out_desc = _box_rules_met(out)
    # the shapes and strides of the copies, on the meta device: no memory is taken
    if copy_x is not None:
        x = torch.empty(x.shape, dtype=x.dtype, device="meta", memory_format=torch.channels_last)
    if copy_w is not None:
        weight = torch.empty(
            weight.shape, dtype=weight.dtype, device="meta", memory_format=torch.channels_last
        )
    (B, C, H, W), (O, _, KH, KW), (OH, OW) = x.shape, weight.shape, out.shape[2:]
    # an output the TMA unit cannot store into still needs a valid descriptor: x's
    views = tuple(_channels_innermost(t) for t in (x, weight, out if out_desc else x))
    sizes = (B, H, W, C, O, OH, OW, *padding, *dilation, *out.stride())
    meta = dict(KH=KH, KW=KW, HAS_BIAS=bias is not None, OUT_DESC=out_desc)
    grid = lambda m: (B * cdiv(OH, m["BH"]) * cdiv(OW, m["BW"]) * cdiv(O, m["BLOCK_N"]),)
    return ConvPlan(_Copies(copy_x, copy_w), views, out_desc, sizes, meta, grid)


def tma_conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
    padding: tuple[int, int], dilation: tuple[int, int], config: dict | None = None,
) -> torch.Tensor:  # fmt: skip
    """out = conv2d(x, weight, bias) with stride 1, `padding` the top and left padding (the
    bottom and right follow from out's size), for a convolution that `suits` says this
    kernel takes; autotuned on a GPU, or with `config` (BH, BW, BLOCK_N, BLOCK_K, GROUP_M,
    optionally num_warps and num_stages). x and the weight are copied channels-last where
    they are not; out may have any layout, and bias must be contiguous. Shapes are not
    checked here: conv2d checks them, and keeps its plan itself."""
    key = signature((x, weight, bias, out), (padding, dilation))
    conv_plan = _plans.get(key)
    if conv_plan is None:
        conv_plan = _plans.put(key, plan(x, weight, bias, out, padding, dilation))
    conv_plan(x, weight, bias, out, config)
    return out
