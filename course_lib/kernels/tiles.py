"""What lesson 05's matmul kernel shares with its relatives (its TF32 B-first and TMA
fast paths, lesson 06's convolutions, lesson 07's Linear): the grouped order of C's
tiles, their offsets, the K loop, the epilogues, and the launch of a tiled product."""

from __future__ import annotations

import triton
import triton.language as tl

from course_lib import runtime
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch, LeanLauncher

# In the interpreter one small configuration, timing means nothing there.
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}
# Products this small finish in microseconds: autotuning each new shape would cost
# far more than it could win, so they take one modest configuration.
SMALL_PRODUCT = 256**3
SMALL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}


def tile_configs(shapes: list[tuple], pre_hook=None) -> list[triton.Config]:
    """Autotune configs from (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps), each with GROUP_M = 8,
    and from a sixth entry, where there is one, WARP_SPECIALIZE."""
    return [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}
            | dict(zip(["WARP_SPECIALIZE"], specialize)),
            num_stages=s, num_warps=w, pre_hook=pre_hook,
        )
        for m, n, k, s, w, *specialize in shapes
    ]  # fmt: skip


@triton.jit
def dot_over_k(
    a_ptrs, b_ptrs, K, stride_ak, stride_bk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """The sum over K of A's [BLOCK_M, BLOCK_K] tiles at a_ptrs times B's [BLOCK_K, BLOCK_N]
    tiles at b_ptrs, each step moving both BLOCK_K along K, in an ACC_DTYPE accumulator."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    # the whole steps of K, unmasked: a mask that varies along K, the contiguous axis of a
    # row-major A, would stop the compiler from loading 16 bytes at a time
    for _ in range(0, K // BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=ACC_DTYPE)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # the last step overhangs K unless BLOCK_K divides it: load zeros past the end there,
    # which add nothing to the dot
    k_left = K % BLOCK_K
    if k_left > 0:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=ACC_DTYPE)
    return acc


@triton.jit
def tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's rows and columns of C, and the same offsets made safe to load."""
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    # rows past M and columns past N read row or column 0 instead of being masked: their
    # results are never stored, and unmasked loads keep the inner loop lean
    offs_am = tl.where(offs_m < M, offs_m, 0)
    offs_bn = tl.where(offs_n < N, offs_n, 0)
    # tl.where hides that the offsets run in steps of one from a multiple of the block,
    # which the compiler must know to load 16 bytes at a time. It holds for every 16-byte
    # piece but one straddling M or N in the last tiles, which still starts at a valid
    # element and reads the rows' padding only into results that are never stored
    offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    return offs_m, offs_n, offs_am, offs_bn


@triton.jit
def grouped_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The row and column of C's tiles where tile number `tile` lies, in grouped order:
    GROUP_M row tiles are walked down one column of tiles before moving right."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile // tiles_per_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile % tiles_per_group) % group_size_m
    pid_n = (tile % tiles_per_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def store_tile(c_ptrs, acc, mask, ACTIVATION: tl.constexpr):
    # fused epilogue: the activation applied in registers, before the one store
    tl.store(c_ptrs, activate(acc, ACTIVATION).to(c_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The left and right [BLOCK_M, BLOCK_N // 2] halves of a tile, which the Hopper
    kernels store one after the other: a store goes through shared memory, and a whole
    128 x 256 tile there would leave too little room for the loads."""
    return tl.split(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1))


@triton.jit
def store_half(
    c_desc, half, row, col, bias_ptr, N,
    WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
):  # fmt: skip
    """The Hopper kernels' epilogue for one half of a tile, WIDTH columns from (row, col):
    bias[n] added to column n where HAS_BIAS, then the activation, stored through c_desc.
    The activation is applied per half: GELU's temporaries for a whole tile spilled
    registers (measured: a few percent slower than by halves)."""
    if HAS_BIAS:
        offs_n = col + tl.arange(0, WIDTH)
        half += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    c_desc.store([row, col], activate(half, ACTIVATION).to(c_desc.dtype))


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """x, its ReLU, or torch's exact GELU, x * Phi(x) with Phi the normal CDF (lesson 07)."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    return x


def tiled_launch(plain: LeanLauncher, tuned: LeanLauncher, a, b, c, meta: dict):
    """The launch, as a function of (a, b, c), of a kernel with matmul_kernel's parameters
    for operands laid out like a, b and c, each as far from a 16-byte boundary as these:
    `plain` with one modest tile for small products, `tuned`, its autotuned twin, for the
    others. It keeps the compiled kernel it launches (see BoundLaunch)."""
    (M, K), N = a.shape, b.shape[1]
    sizes = (M, N, K, *a.stride(), *b.stride(), *c.stride())
    if runtime.INTERPRETED or M * N * K <= SMALL_PRODUCT:
        config = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (cdiv(M, config["BLOCK_M"]) * cdiv(N, config["BLOCK_N"]),)
        launch = BoundLaunch(plain, grid, config | meta)
    else:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"]),)
        launch = BoundLaunch(tuned, grid, meta)
    return lambda a, b, c: launch(a, b, c, *sizes)


# the operands' layouts go into the autotuners' keys, through their strides along K (1
# where K is the contiguous axis): the tile tuned for a row-major B is not the one for a
# K-major B, and the autotuner would otherwise hand it over at the same sizes
LAYOUT_KEY = ["stride_ak", "stride_bk"]
