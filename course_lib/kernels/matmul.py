"""Lesson 05: tiled matrix multiplication with an fp32 accumulator, grouped program order,
autotuning, and an optional fused activation.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps of BLOCK_K.
Programs are numbered so that GROUP_M consecutive ones share column tiles of B and row
tiles of A while those are still in L2. On a GPU, `matmul` first offers the product to the
expert paths of matmul_fast_paths.py: copies that align awkward rows, TF32's operand order,
and Hopper's persistent TMA kernel (the appendix to lesson 05).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.bench.timing import autotune_timer
from course_lib.kernels._launch import KeptLaunch, LeanLauncher, cdiv, check_same

# In the interpreter one small configuration, timing means nothing there.
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}
# Products this small finish in microseconds: autotuning each new shape would cost
# far more than it could win, so they take one modest configuration.
SMALL_PRODUCT = 256**3
SMALL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}

# BLOCK_M, BLOCK_N, BLOCK_K, stages, warps: large tiles for large products, small ones so
# that a 1024^3 product still has a tile for every SM; BLOCK_K = 32 ones for fp32, whose
# tiles take twice the shared memory
TILE_SHAPES = [
    (128, 256, 64, 3, 8),
    (256, 128, 64, 3, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (128, 256, 32, 3, 8),
    (128, 128, 32, 4, 8),
    (128, 64, 32, 4, 4),
]


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
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m, offs_n, offs_am, offs_bn = tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BM, BK]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn  # [BK, BN]
    acc = dot_over_k(
        a_ptrs, b_ptrs, K, stride_ak, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, INPUT_PRECISION,
        tl.float32,  # fp32 whatever the inputs
    )  # fmt: skip
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    store_tile(c_ptrs, acc, (offs_m[:, None] < M) & (offs_n[None, :] < N), ACTIVATION)


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
def activate(x, ACTIVATION: tl.constexpr):
    """x, its ReLU, or torch's exact GELU, x * Phi(x) with Phi the normal CDF (lesson 07)."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    return x


# the operands' layouts are in the key, through their strides along K (1 where K is the
# contiguous axis): the tile tuned for a row-major B is not the one for a K-major B, and
# the autotuner would otherwise hand it over at the same sizes. The precision is in it too:
# a config that fits for exact fp32 can need more shared memory than the GPU has as TF32
LAYOUT_KEY = ["stride_ak", "stride_bk"]
matmul_kernel_autotuned = triton.autotune(
    configs=tile_configs(TILE_SHAPES),
    key=["M", "N", "K", *LAYOUT_KEY, "INPUT_PRECISION"],
    do_bench=autotune_timer,
)(matmul_kernel)
# each kernel[grid], lean: see _launch.py
matmul_launcher = LeanLauncher(matmul_kernel)
matmul_autotuned_launcher = LeanLauncher(matmul_kernel_autotuned)


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """a @ b for a [M, K] and b [K, N] of any strides; returns a new contiguous [M, N].

    fp16 and bf16 inputs accumulate in fp32. fp32 inputs use TF32 tensor cores when
    torch.backends.cuda.matmul.allow_tf32 is True, as torch.matmul does, and exact
    fp32 otherwise. activation="relu" applies ReLU to the result before it is stored.
    """
    route = fast.known_route(a, b, activation)
    if route is not None:  # operands laid out as before: checked, and the kernel chosen
        return route(a, b)
    check_same("matmul", a, b, same_shape=False)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul expects a [M, K] and b [K, N]; got {list(a.shape)} and {list(b.shape)}"
        )
    if activation not in (None, "relu"):
        raise ValueError(f"matmul: activation must be None or 'relu', got {activation!r}")
    (M, K), N = a.shape, b.shape[1]
    if max(M * K, K * N, M * N) >= 2**31:
        raise ValueError(
            f"matmul: {M}x{K} @ {K}x{N} has a matrix of 2^31 elements or more, past what "
            "this kernel's 32-bit offsets address; split the product into blocks of rows"
        )
    if M * N == 0 or K == 0:
        return a.new_zeros((M, N))
    return fast.first_call(a, b, activation)


def lesson_launch(a, b, c, activation: str | None, tf32: bool):
    """The launch of matmul_kernel for operands laid out like a, b and c, as a function
    of (a, b, c)."""
    meta = {"ACTIVATION": activation or "", "INPUT_PRECISION": "tf32" if tf32 else "ieee"}
    return tiled_launch(matmul_launcher, matmul_autotuned_launcher, a, b, c, meta)


def tiled_launch(plain: LeanLauncher, tuned: LeanLauncher, a, b, c, meta: dict):
    """The launch, as a function of (a, b, c), of a kernel with matmul_kernel's parameters
    for operands laid out like a, b and c, each as far from a 16-byte boundary as these:
    `plain` with one modest tile for small products, `tuned`, its autotuned twin, for the
    others. It keeps the compiled kernel it launches (see KeptLaunch)."""
    (M, K), N = a.shape, b.shape[1]
    sizes = (M, N, K, *a.stride(), *b.stride(), *c.stride())
    if runtime.INTERPRETED or M * N * K <= SMALL_PRODUCT:
        config = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (cdiv(M, config["BLOCK_M"]) * cdiv(N, config["BLOCK_N"]),)
        launch = KeptLaunch(plain, grid, config | meta)
    else:
        grid = lambda m: (cdiv(M, m["BLOCK_M"]) * cdiv(N, m["BLOCK_N"]),)
        launch = KeptLaunch(tuned, grid, meta)
    return lambda a, b, c: launch(a, b, c, *sizes)


# the expert paths and the routes kept per layout; last, for they build on this module
from course_lib.kernels import matmul_fast_paths as fast  # noqa: E402
