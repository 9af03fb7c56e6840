"""Lesson 05: tiled matrix multiplication with an fp32 accumulator, grouped program order,
autotuning, and an optional fused activation.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps of BLOCK_K.
Programs are numbered so that GROUP_M consecutive ones share column tiles of B and row
tiles of A while those are still in L2 (grouped_tile, with the K loop and the epilogue,
is in tiles.py: lessons 06 and 07 reuse them). What the lesson does not cover (copies
that align awkward rows, TF32's operand order, Hopper's persistent TMA kernel: the
appendix to lesson 05) is in matmul_fast_paths.py, which `matmul` hands those cases to.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.gpu_timer import autotune_timer
from course_lib.kernels import matmul_fast_paths as fast_paths
from course_lib.kernels._args import check_same
from course_lib.kernels._launch import LeanLauncher
from course_lib.kernels._plan import PlanCache, signature, uses_tf32
from course_lib.kernels.tiles import (  # noqa: F401  (INTERPRETER_CONFIG and the rest: lesson 05's too)
    INTERPRETER_CONFIG,
    LAYOUT_KEY,
    SMALL_CONFIG,
    SMALL_PRODUCT,
    activate,
    dot_over_k,
    grouped_tile,
    store_tile,
    tile_configs,
    tile_offsets,
    tiled_launch,
)

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


# the precision is in the key: a config that fits for exact fp32 can need more shared
# memory than the GPU has as TF32
matmul_kernel_autotuned = triton.autotune(
    configs=tile_configs(TILE_SHAPES),
    key=["M", "N", "K", *LAYOUT_KEY, "INPUT_PRECISION"],
    do_bench=autotune_timer,
)(matmul_kernel)
# each kernel[grid], lean: see _launch.py
matmul_launcher = LeanLauncher(matmul_kernel)
matmul_autotuned_launcher = LeanLauncher(matmul_kernel_autotuned)

# matmul's plans, by the operands' signature: checking and choosing again on every call
# would cost the host a good part of a launch's time (see _plan.py)
_plans = PlanCache()


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """a @ b for a [M, K] and b [K, N] of any strides; returns a new contiguous [M, N].

    fp16 and bf16 inputs accumulate in fp32. fp32 inputs use TF32 tensor cores where
    torch.matmul would (torch.backends.cuda.matmul.allow_tf32, or its fp32_precision), and
    exact fp32 otherwise. activation="relu" applies ReLU to the result before it is stored.
    """
    plan = _plans.get(signature((a, b), (activation,)))
    if plan is None:  # a first call with operands laid out like these
        plan = matmul_plan(a, b, activation)
    return plan(a, b)


def matmul_plan(a: torch.Tensor, b: torch.Tensor, activation: str | None = None):
    """matmul's plan for operands laid out like a and b: the arguments checked, and a
    function of (a, b) that returns a @ b, kept for the next calls like these."""
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
        return lambda a, b: a.new_zeros((M, N))  # nothing to launch
    tf32 = uses_tf32(a.dtype)
    c = a.new_empty((M, N))
    # copies that align awkward rows, TF32's operand order, Hopper's TMA kernel
    plan = fast_paths.plan(a, b, c, activation, tf32, lesson_launch)
    if plan is None:  # the lesson's kernel takes the operands as they are
        launch = lesson_launch(a, b, c, activation, tf32)

        def plan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            c = a.new_empty((M, N))
            launch(a, b, c)
            return c

    return _plans.put(signature((a, b), (activation,)), plan)


def lesson_launch(a, b, c, activation: str | None, tf32: bool):
    """The launch of matmul_kernel for operands laid out like a, b and c, as a function
    of (a, b, c)."""
    meta = {"ACTIVATION": activation or "", "INPUT_PRECISION": "tf32" if tf32 else "ieee"}
    return tiled_launch(matmul_launcher, matmul_autotuned_launcher, a, b, c, meta)
