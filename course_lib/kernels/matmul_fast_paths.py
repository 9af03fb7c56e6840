"""The expert paths of lesson 05's matmul, taught in its appendix, "matmul on Hopper".

`matmul` (matmul.py) asks `plan` for each new layout of operands whether these paths take
it, and keeps the Route returned:

- copies of A and B with rows a multiple of 16 elements apart where they are not, so
  that tiles load 16 bytes at a time (and of views too wide for 32-bit offsets);
- TF32 products whose B is not K-major go to `tf32_b_first_kernel`, which computes
  C^T = B^T A^T to suit the tensor cores, or, large ones on Hopper, copy B with K
  contiguous first (`_copies_b_k_major`); on the Hopper GPUs in TMA_GPUS, large products
  go to `tma_matmul_kernel`: persistent, its tiles moved by the TMA unit, or, where its
  tiles would leave many SMs idle, to its stream-K twin (matmul_stream_k.py); the lesson's
  kernel takes the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.gpu_timer import autotune_timer
from course_lib.interpreter_guard import span
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch, LeanLauncher, tuned_config
from course_lib.kernels._plan import into_graph
from course_lib.kernels.hopper import (  # noqa: F401  (tma_available: the appendix's)
    TMA_GPUS,
    by_rows,
    capability,
    column_major,
    descriptor,
    sm_count,
    tma_available,
    tma_rule_broken,
)
from course_lib.kernels.matmul_stream_k import stream_k_launch, stream_k_pays
from course_lib.kernels.tiles import (
    INTERPRETER_CONFIG,
    LAYOUT_KEY,
    grouped_tile,
    halves,
    store_half,
    store_tile,
    tile_configs,
    tile_offsets,
    tiled_launch,
)

COPY_BLOCK = 64  # tiles of COPY_BLOCK x COPY_BLOCK in the copies that pad rows

# tf32_b_first_kernel's dot is [BLOCK_N, BLOCK_K] x [BLOCK_K, BLOCK_M]; the best of a search
# on a Hopper GPU: (256, 128) for 4096^3 and 8192^3, (128, 64) for 1024^3
B_FIRST_TILE_SHAPES = [
    (256, 128, 32, 3, 8),
    (256, 128, 32, 4, 8),
    (128, 256, 32, 3, 8),
    (128, 128, 32, 4, 8),
    (128, 128, 32, 4, 4),
    (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4),
]

# tma_matmul_kernel on Hopper, the best of a search: BLOCK_M, BLOCK_N, BLOCK_K, stages, warps
# and whether to specialise warps; 128 x 256 tiles for large products, 128 x 64 for 1024^3,
# BLOCK_K = 32 ones for fp32, whose large tiles need it to fit in shared memory
TMA_TILE_SHAPES = [
    (128, 256, 64, 4, 8, False),
    (128, 256, 64, 3, 8, True),
    (128, 128, 64, 4, 8, False),
    (128, 64, 64, 4, 4, False),
    (128, 256, 32, 3, 8, False),
    (128, 256, 32, 3, 8, True),
    (128, 128, 32, 4, 8, False),
    (128, 64, 32, 4, 4, False),
]
# Below this many multiply-adds (2048^3) a product takes less GPU time than the host takes to
# launch tma_matmul_kernel (three descriptors a call) and does not go to it, whatever the
# layout of a 16-bit B: the lesson's kernel is as fast there on the GPU, and its launch
# costs the host far less (figures in the appendix to lesson 05)
TMA_MIN_PRODUCT = 2048**3
# A TF32 product with a B that is not K-major copies B K-major for tma_matmul_kernel where
# A has this many rows or more (and the product is past TMA_MIN_PRODUCT): the copy's cost
# grows with B, the product's with A's rows too; measured, the two routes run level at
# 3072 rows, and the copy wins from 4096 (figures in the appendix to lesson 05)
TF32_COPY_MIN_ROWS = 4096


@dataclass
class Route:
    """How matmul computes products whose operands are laid out alike: which operands it
    copies first, with which axis contiguous (see padded_copy), and the launch that
    follows, a function of (a, b, c)."""

    shape: tuple[int, int]  # C's
    copy_a: PaddedCopy | None
    copy_b: PaddedCopy | None
    launch: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.copy_a is not None:
            a = self.copy_a(a)
        if self.copy_b is not None:
            b = self.copy_b(b)
        c = a.new_empty(self.shape)
        self.launch(a, b, c)
        return c


def plan(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, activation: str | None, tf32: bool,
    lesson_launch: Callable,
) -> Route | None:  # fmt: skip
    """The Route of a product that matmul has checked, for operands laid out like a and b
    and a new c; None where the lesson's kernel takes them as they are.

    A and B are first copied where `_copy_axis` says so. TF32 wants A with K contiguous
    and takes B either way: one that is not K-major goes B-first (tf32_b_first_kernel),
    or is copied K-major where `_copies_b_k_major` says so. On the Hopper GPUs in TMA_GPUS
    large products go to tma_matmul_kernel. `lesson_launch(a, b, c, activation, tf32)`,
    matmul's, launches the lesson's kernel on copies that no expert kernel takes."""
    axis_a = _copy_axis(a, 1 if tf32 else None)
    axis_b = 0 if tf32 and _copies_b_k_major(a, b, axis_a is not None) else _copy_axis(b)
    copy_a = None if axis_a is None else PaddedCopy.of(a, axis_a)
    copy_b = None if axis_b is None else PaddedCopy.of(b, axis_b)
    # what the launch is planned for: the copies' layout, in new tensors, unfilled
    a = a if copy_a is None else copy_a.empty_like(a)
    b = b if copy_b is None else copy_b.empty_like(b)
    launch = _expert_launch(a, b, c, activation, tf32)
    if launch is None:
        if copy_a is None and copy_b is None:
            return None
        launch = lesson_launch(a, b, c, activation, tf32)
    return Route((a.shape[0], b.shape[1]), copy_a, copy_b, launch)


def _copies_b_k_major(a: torch.Tensor, b: torch.Tensor, a_copied: bool) -> bool:
    """Whether a TF32 product whose B is not K-major copies B with K contiguous for
    tma_matmul_kernel, rather than going B-first: on the GPUs in TMA_GPUS, from
    TMA_MIN_PRODUCT multiply-adds and TF32_COPY_MIN_ROWS rows of A, where A (or its copy),
    C and the copy of B all suit the TMA unit."""
    (M, K), N = a.shape, b.shape[1]
    if column_major(b) or M < TF32_COPY_MIN_ROWS or M * K * N < TMA_MIN_PRODUCT:
        return False
    if N % 4 != 0 or not padded_copy_fits(b, contiguous_axis=0):  # C's rows; B's copy
        return False
    if not (a_copied or tma_rule_broken(a) is None):
        return False
    return not runtime.INTERPRETED and capability(a.get_device()) in TMA_GPUS


def _expert_launch(a, b, c, activation: str | None, tf32: bool) -> Callable | None:
    """The launch of an expert path that takes operands laid out like these, if one does."""
    if tma_takes(a, b, c, tf32):
        precision = "tf32" if tf32 else "ieee"
        return tma_launch(a, b, c, activation or "", precision, config=None)
    if not (tf32 and b.stride(1) == 1 and b.stride(0) != 1):
        return None
    meta = {"ACTIVATION": activation or ""}
    return tiled_launch(b_first_launcher, b_first_autotuned_launcher, a, b, c, meta)


@triton.jit
def tf32_b_first_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr,
):  # fmt: skip
    """matmul_kernel for TF32 with a B whose N axis is contiguous, as C^T = B^T A^T.

    On a Hopper GPU the TF32 tensor-core instruction reads its second operand from shared
    memory with K contiguous, and its first from shared memory likewise or from registers,
    where the layout in memory no longer matters. As the second operand a row-major B
    would have each tile transposed in shared memory by the compiler: a quarter of the
    speed. As the first operand, B^T, rounded to TF32 on its way through registers, it
    costs no measurable time, and a row-major A becomes the second operand, A^T, with K
    contiguous as required. The accumulator holds a tile of C^T. The tensor cores still
    cut A's low bits, so B's layout changes the last bits of a TF32 result. (Other GPUs
    take this kernel too; it was measured on Hopper only.)
    """
    offs_m, offs_n, offs_am, offs_bn = tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    bt_ptrs = b_ptr + offs_bn[:, None] * stride_bn + offs_k[None, :] * stride_bk  # [BN, BK]
    at_ptrs = a_ptr + offs_k[:, None] * stride_ak + offs_am[None, :] * stride_am  # [BK, BM]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):
        bt = _round_to_tf32(tl.load(bt_ptrs))
        acc = tl.dot(bt, tl.load(at_ptrs), acc, input_precision="tf32")
        bt_ptrs += BLOCK_K * stride_bk
        at_ptrs += BLOCK_K * stride_ak
    k_left = K % BLOCK_K
    if k_left > 0:
        bt = _round_to_tf32(tl.load(bt_ptrs, mask=offs_k[None, :] < k_left, other=0.0))
        at = tl.load(at_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(bt, at, acc, input_precision="tf32")
    c_ptrs = c_ptr + offs_n[:, None] * stride_cn + offs_m[None, :] * stride_cm
    store_tile(c_ptrs, acc, (offs_n[:, None] < N) & (offs_m[None, :] < M), ACTIVATION)


# cvt.rna.tf32.f32 needs compute capability 8.0; the interpreter runs no PTX at all.
# Elsewhere _round_to_tf32 does the same in integer operations
_PTX = tl.constexpr(not runtime.INTERPRETED and torch.cuda.get_device_capability() >= (8, 0))


@triton.jit
def _round_to_tf32(x):
    # round to nearest at TF32's 10 significand bits (ties away from zero), as to_tf32 in
    # lesson 05 does; the tensor cores would cut the 13 low bits off, which is less
    # accurate. Being computed rather than loaded is what sends the tile through
    # registers (so triton 3.6 decides).
    if _PTX:
        # one instruction per element, which keeps inf and NaN; the integer version below
        # costs the kernel several percent
        rounded = tl.inline_asm_elementwise(
            "cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        # inf and NaN keep their bits: a carry out of a NaN's payload would make 0 or inf
        bits = x.to(tl.uint32, bitcast=True)
        rounded = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        rounded = tl.where((bits & 0x7F800000) == 0x7F800000, x, rounded)
    return rounded


# the row strides serve only descriptors built on the GPU: not specialised, they cost eager
# launches, which never read them, no second compilation
@triton.jit(do_not_specialize=["stride_a", "stride_b", "stride_c"])
def tma_matmul_kernel(
    a_desc, b_desc, c_desc, bias_ptr, M, N, K, stride_a, stride_b, stride_c,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, A_M_MAJOR: tl.constexpr,
    B_K_MAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DTYPE: tl.constexpr, DEVICE_DESCRIPTORS: tl.constexpr,
):  # fmt: skip
    """matmul_kernel rebuilt for Hopper GPUs: persistent, with tiles moved by the TMA engine.

    The grid has one program per SM (NUM_SMS), each walking C's tiles in steps of NUM_SMS
    in grouped order, so no SM idles waiting for a new program to start. The descriptors
    carry shapes and strides: the TMA unit copies whole tiles into shared memory on its
    own, fills what lies past an edge with zeros and clips stores at the edges, so the
    kernel needs no pointers and no masks. A row-major B is loaded as [BLOCK_K, BLOCK_N]
    tiles, a K-major one (B_K_MAJOR) as [BLOCK_N, BLOCK_K] tiles of B^T; likewise an A with
    M contiguous (A_M_MAJOR, a Linear layer's g^T in grad_weight = g^T @ x) as tiles of A^T.
    The epilogue adds bias[n] to column n where HAS_BIAS, then the activation (lesson 07's
    Linear). Either WARP_SPECIALIZE,
    some warps only loading while the others compute, or `flatten`, the two loops merged
    so that loads for the next tile start while this one finishes: Hopper's compiler does
    not promise both at once. DTYPE is there for the autotuner's key only: descriptors do
    not show it their dtype, and fp32 tiles need twice the shared memory of fp16 ones.

    With DEVICE_DESCRIPTORS the first three arguments are the matrices as the TMA unit
    reads them, row-major with rows `stride_a`, `stride_b` and `stride_c` elements apart
    (without it the strides are unused), and each program builds the descriptors itself:
    so a compiled graph launches the kernel, for torch.compile records no descriptor built
    on the host when it traces an operator, at a cost of a few percent of the kernel's
    time at most (measured).
    """
    if DEVICE_DESCRIPTORS:
        if A_M_MAJOR:
            a_desc = tl.make_tensor_descriptor(a_desc, [K, M], [stride_a, 1], [BLOCK_K, BLOCK_M])
        else:
            a_desc = tl.make_tensor_descriptor(a_desc, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
        if B_K_MAJOR:
            b_desc = tl.make_tensor_descriptor(b_desc, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_desc, [K, N], [stride_b, 1], [BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_desc, [M, N], [stride_c, 1], [BLOCK_M, BLOCK_N // 2])
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(
        tl.program_id(axis=0), num_tiles, NUM_SMS,
        flatten=not WARP_SPECIALIZE, warp_specialize=WARP_SPECIALIZE,
    ):  # fmt: skip
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = a_desc.load([k, row]).T if A_M_MAJOR else a_desc.load([row, k])
            b = b_desc.load([col, k]).T if B_K_MAJOR else b_desc.load([k, col])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        left, right = halves(acc, BLOCK_M, BLOCK_N)
        store_half(c_desc, left, row, col, bias_ptr, N, BLOCK_N // 2, HAS_BIAS, ACTIVATION)
        store_half(c_desc, right, row, col + BLOCK_N // 2, bias_ptr, N, BLOCK_N // 2, HAS_BIAS,
                   ACTIVATION)  # fmt: skip


def _set_block_shapes(args: dict) -> None:
    """Make the descriptors' tile shapes those of the config about to run."""
    block_m, block_n, block_k = args["BLOCK_M"], args["BLOCK_N"], args["BLOCK_K"]
    args["a_desc"].block_shape = [block_k, block_m] if args["A_M_MAJOR"] else [block_m, block_k]
    args["b_desc"].block_shape = [block_n, block_k] if args["B_K_MAJOR"] else [block_k, block_n]
    args["c_desc"].block_shape = [block_m, block_n // 2]


tf32_b_first_autotuned = triton.autotune(
    configs=tile_configs(B_FIRST_TILE_SHAPES),
    key=["M", "N", "K", *LAYOUT_KEY],
    do_bench=autotune_timer,
)(tf32_b_first_kernel)
tma_matmul_autotuned = triton.autotune(
    configs=tile_configs(TMA_TILE_SHAPES, pre_hook=_set_block_shapes),
    # the epilogue is in the key: GELU's registers can make another tile the fastest
    key=[
        "M",
        "N",
        "K",
        "A_M_MAJOR",
        "B_K_MAJOR",
        "INPUT_PRECISION",
        "DTYPE",
        "HAS_BIAS",
        "ACTIVATION",
    ],
    do_bench=autotune_timer,
)(tma_matmul_kernel)
# each kernel[grid], lean: see _launch.py
b_first_launcher = LeanLauncher(tf32_b_first_kernel)
b_first_autotuned_launcher = LeanLauncher(tf32_b_first_autotuned)
tma_launcher = LeanLauncher(tma_matmul_kernel)
tma_autotuned_launcher = LeanLauncher(tma_matmul_autotuned)


def _before_device_descriptors(*args, **kwargs) -> None:
    """Run by Triton before a launch of tma_matmul_kernel through its own launcher: in a
    graph compiled by another backend than Inductor (aot_eager, say), which launches the
    recorded kernel that way. Descriptors built on the GPU need memory from an allocator
    set in the launching thread (Inductor sets its own), and a start address that is a
    multiple of 16 bytes, which only Inductor guarantees, by copying a misaligned input:
    here a misaligned matrix stops with an error instead of faulting on the GPU. torch
    passes every argument it can by position, constexprs included."""
    named = dict(zip(tma_matmul_kernel.arg_names, args)) | kwargs
    if not named.get("DEVICE_DESCRIPTORS"):
        return
    for name in ("a_desc", "b_desc", "c_desc"):
        if rule := tma_rule_broken(named[name]):
            raise ValueError(
                f"matmul: an operand ({name[0]}) of this compiled product breaks a rule of the "
                f"TMA unit that the graph was compiled for: {rule}; pass a .clone() of that "
                "operand, or compile with the default backend, inductor"
            )
    triton.set_allocator(_scratch_memory)


def _scratch_memory(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device=runtime.DEVICE)


tma_matmul_kernel.add_pre_run_hook(_before_device_descriptors)


def tma_takes(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tf32: bool) -> bool:
    """Whether this product goes to tma_matmul_kernel: from TMA_MIN_PRODUCT multiply-adds,
    where the kernel takes it (_tma_suits)."""
    return a.shape[0] * a.shape[1] * b.shape[1] >= TMA_MIN_PRODUCT and _tma_suits(a, b, c, tf32)


def _tma_suits(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tf32: bool) -> bool:
    """Whether tma_matmul_kernel takes this product: on the GPUs in TMA_GPUS, for fp16 and
    bf16 with either axis of A or B contiguous, and for TF32 with K contiguous in both
    (TF32 reads both tiles K-major from shared memory; a row-major B is copied K-major
    first, or goes to tf32_b_first_kernel), every matrix meeting the TMA unit's rules:
    16-byte aligned, rows too."""
    if runtime.INTERPRETED or capability(a.get_device()) not in TMA_GPUS:
        return False
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False  # a float64 product (lesson 07's gradcheck) takes linear_kernel
    if a.dtype == torch.float32 and not (tf32 and column_major(b) and not column_major(a)):
        return False
    return not any(tma_rule_broken(t) for t in (by_rows(a), by_rows(b), c))


def tma_matmul(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, activation: str | None = None,
    input_precision: str = "ieee", config: dict | None = None, bias: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """c = activation(a @ b + bias) through tma_matmul_kernel: autotuned on a GPU (or
    stream-K, where matmul_stream_k.stream_k_pays), or with `config` (BLOCK_M, BLOCK_N,
    BLOCK_K, GROUP_M, WARP_SPECIALIZE, optionally num_warps and num_stages). c needs its
    last axis contiguous, a and b either axis, each with rows a multiple of 16 bytes apart
    from a 16-byte aligned start (the TMA unit's rules, see hopper.tma_rule_broken);
    activation is None, "relu" or "gelu", and bias a contiguous [N] or None. Shapes and
    dtypes are not checked here: matmul checks them."""
    if not tma_available():
        raise RuntimeError(
            "tma_matmul needs a GPU with a TMA unit (Hopper or later) or the interpreter; "
            "use matmul, which picks the kernel that suits the GPU"
        )
    if activation not in (None, "relu", "gelu") or input_precision not in ("ieee", "tf32"):
        raise ValueError(
            "tma_matmul: activation must be None, 'relu' or 'gelu' and input_precision 'ieee' "
            f"or 'tf32'; got {activation!r} and {input_precision!r}"
        )
    if 0 in (*a.shape, *b.shape):
        raise ValueError(f"tma_matmul: a {list(a.shape)} @ b {list(b.shape)} has an empty axis")
    for name, t in (("a", by_rows(a)), ("b", by_rows(b)), ("c", c)):
        if rule := tma_rule_broken(t):
            raise ValueError(
                f"tma_matmul: {name} (strides {list(t.stride())}, {t.dtype}) breaks a rule of "
                f"the TMA unit: {rule}; padded_copy makes a copy that follows them all"
            )
    if config is None and runtime.INTERPRETED:  # nothing to time there
        config = {**INTERPRETER_CONFIG, "WARP_SPECIALIZE": False}
    has_bias = bias is not None
    tma_launch(a, b, c, activation or "", input_precision, config, has_bias)(a, b, c, bias)


def tma_launch(
    a, b, c, activation: str, precision: str, config: dict | None, has_bias: bool = False
) -> Callable:
    """tma_matmul without its checks, for operands laid out like a, b and c: a function of
    (a, b, c, bias=None) that builds the three descriptors and launches, its launch bound
    once the autotuner has chosen (see BoundLaunch: a bias, if any, is as far from a
    16-byte boundary on each call); while tracing into a graph, one that launches the
    kernel building them on the GPU. Without a config, a 16-bit product whose tiles would
    leave many SMs idle goes stream-K (matmul_stream_k.py) instead, outside graphs."""
    a_m_major, b_k_major = column_major(a), column_major(b)
    (M, K), N = a.shape, c.shape[1]
    num_sms = 4 if runtime.INTERPRETED else sm_count(a.get_device())
    # stream-K builds its descriptors on the host: a graph, which records none, keeps whole tiles
    if config is None and a.element_size() == 2 and not into_graph():
        if stream_k_pays(M, N, K, num_sms):
            return stream_k_launch(a, b, c, activation, precision, has_bias)
    meta = dict(
        NUM_SMS=num_sms, A_M_MAJOR=a_m_major, B_K_MAJOR=b_k_major, HAS_BIAS=has_bias,
        ACTIVATION=activation, INPUT_PRECISION=precision, DTYPE=str(a.dtype),
    )  # fmt: skip
    grid = lambda m: (min(num_sms, cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"])),)
    # how far apart the rows are, as the TMA unit reads each matrix
    strides = (a.stride(1 if a_m_major else 0), b.stride(1 if b_k_major else 0), c.stride(0))
    if into_graph():
        return functools.partial(
            _launch_in_graph, grid=grid, config=config, meta=meta, strides=strides
        )
    meta |= {"DEVICE_DESCRIPTORS": False}
    # the plain kernel's launch with the config given, or with the autotuner's choice once
    # made: no pre_hook to run and no autotuner to consult on the later calls
    bound = None if config is None else _bound_tma_launch(grid, config | meta)

    def launch(a, b, c, bias=None):
        nonlocal bound
        descs = {
            "a_desc": _descriptor(a.t() if a_m_major else a),
            "b_desc": _descriptor(b.t() if b_k_major else b),
            "c_desc": _descriptor(c),
        }
        args = (*descs.values(), c if bias is None else bias, M, N, K, *strides)
        if bound is None:  # the autotuner's pre_hook sets the tiles of each config it runs
            tuned = tma_autotuned_launcher.tune(grid, args, meta)
            bound = _bound_tma_launch(grid, tuned | meta, tuned)
            return
        chosen, plain = bound
        _set_block_shapes(descs | chosen)
        plain(*args)

    return launch


def _bound_tma_launch(grid, chosen: dict, tuned: dict | None = None) -> tuple[dict, BoundLaunch]:
    return chosen, BoundLaunch(tma_launcher, grid(chosen), chosen, tuned)


def _launch_in_graph(
    a, b, c, bias=None, *, grid, config: dict | None, meta: dict, strides: tuple
) -> None:
    """tma_matmul_kernel recorded into torch.compile's graph, building its descriptors on
    the GPU, with `config` or the one its autotuner chooses for these operands."""
    (M, K), N = a.shape, c.shape[1]
    a_rows, b_rows = by_rows(a), by_rows(b)
    bias = c if bias is None else bias
    if config is None:
        descs = (_descriptor(a_rows), _descriptor(b_rows), _descriptor(c))
        args = (*descs, bias, M, N, K, *strides)
        config = tuned_config(
            tma_matmul_autotuned, grid, args, meta | {"DEVICE_DESCRIPTORS": False}
        )
    tma_launcher[grid(config)](
        a_rows, b_rows, c, bias, M, N, K, *strides, **config, **meta, DEVICE_DESCRIPTORS=True
    )


def _descriptor(t: torch.Tensor):
    """A descriptor over the 2-D `t`, whose rules the callers have checked; its tile
    shape is the config's, set by _set_block_shapes."""
    return descriptor(t, t.shape, t.stride(), [16, 16])


def _copy_axis(t: torch.Tensor, contiguous_axis: int | None = None) -> int | None:
    """None where `t` suits the kernels as it is; else the axis to make contiguous in a
    padded copy: `contiguous_axis`, by default the one already contiguous, else the columns.

    Tiles load 16 bytes at a time only where the compiler can prove that each row of a
    tile starts on a 16-byte boundary, and it knows only of integer arguments that they
    are multiples of 16. A [1000, 777] fp16 matrix has rows 777 elements apart, so every
    load would fall back to 2-byte pieces; one copy into rows padded to 784 elements costs
    a few microseconds of GPU time (and one more launch) and buys back the full
    tensor-core speed. A view whose strides reach 2^31 elements or more is copied too:
    the kernel's offsets are 32-bit.
    """
    if contiguous_axis is None:
        contiguous_axis = 0 if column_major(t) else 1
    stride = t.stride()
    if span(t.shape, stride) < 2**31 and (
        runtime.INTERPRETED  # nothing to gain there, and the copies cost time
        or (stride[contiguous_axis] == 1 and stride[1 - contiguous_axis] % 16 == 0)
    ):
        return None
    return contiguous_axis


def padded_copy(t: torch.Tensor, contiguous_axis: int) -> torch.Tensor:
    """A copy of the 2-D `t` with `contiguous_axis` contiguous and the other axis's stride
    rounded up to a multiple of 16 elements. Refused, before anything is allocated, where
    the padding takes the copy to 2^31 elements or more: the kernel's offsets are 32-bit."""
    return PaddedCopy.of(t, contiguous_axis)(t)


def padded_copy_fits(t: torch.Tensor, contiguous_axis: int) -> bool:
    """Whether padded_copy(t, contiguous_axis) stays below 2^31 elements, within the
    kernel's 32-bit offsets."""
    rows, cols = t.shape if contiguous_axis == 1 else t.shape[::-1]
    return span((rows, cols), (cdiv(cols, 16) * 16, 1)) < 2**31


@dataclass
class PaddedCopy:
    """padded_copy worked out for one layout of `t` (shape, strides, dtype and alignment),
    for a Route, called on operands laid out alike."""

    shape: tuple[int, int]  # the copy's, its contiguous axis last, rows padded
    cols: int
    transposed: bool  # the contiguous axis is axis 0 of t
    launch: BoundLaunch | None  # None: nothing to copy
    sizes: tuple

    @staticmethod
    def of(t: torch.Tensor, contiguous_axis: int) -> PaddedCopy:
        src = t if contiguous_axis == 1 else t.t()  # the axis to make contiguous, last
        rows, cols = src.shape
        padded_cols = cdiv(cols, 16) * 16
        if not padded_copy_fits(t, contiguous_axis):
            raise ValueError(
                f"matmul: an operand of shape {list(t.shape)} needs 2^31 elements of memory or "
                "more once its rows are padded to a multiple of 16 elements, past what this "
                "kernel's 32-bit offsets address; split the product into blocks of rows"
            )
        tiles_r, tiles_c = cdiv(rows, COPY_BLOCK), cdiv(cols, COPY_BLOCK)
        grid = (tiles_r * tiles_c,)
        launch = BoundLaunch(copy_launcher, grid, {"BLOCK": COPY_BLOCK}) if rows * cols else None
        sizes = (rows, cols, *src.stride(), padded_cols, 1, tiles_c)
        return PaddedCopy((rows, padded_cols), cols, contiguous_axis == 0, launch, sizes)

    def empty_like(self, t: torch.Tensor) -> torch.Tensor:
        """A new tensor laid out as the copy of `t` is, unfilled."""
        copy = t.new_empty(self.shape)[:, : self.cols]
        return copy.t() if self.transposed else copy

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        copy = self.empty_like(t)
        if self.launch is not None:
            self.launch(t.t() if self.transposed else t, copy.t() if self.transposed else copy,
                        *self.sizes)  # fmt: skip
        return copy


@triton.jit
def _copy_kernel(
    src_ptr, dst_ptr, rows, cols, stride_sr, stride_sc, stride_dr, stride_dc, tiles_c,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # one tile per program; when src is transposed the compiler reads it down its
    # columns and writes along the rows of dst, passing the tile through shared memory
    pid = tl.program_id(axis=0)
    offs_r = ((pid // tiles_c) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    offs_c = ((pid % tiles_c) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = (offs_r[:, None] < rows) & (offs_c[None, :] < cols)
    x = tl.load(src_ptr + offs_r[:, None] * stride_sr + offs_c[None, :] * stride_sc, mask=mask)
    tl.store(dst_ptr + offs_r[:, None] * stride_dr + offs_c[None, :] * stride_dc, x, mask=mask)


copy_launcher = LeanLauncher(_copy_kernel)  # _copy_kernel[grid], lean: see _launch.py
