"""Lesson 05: tiled matrix multiplication with an fp32 accumulator, grouped program order,
autotuning, and an optional fused activation.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps of BLOCK_K.
Programs are numbered so that GROUP_M consecutive ones share column tiles of B and
row tiles of A while those are still in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib import runtime
from course_lib.kernels._launch import check_same

# In the interpreter one small configuration, timing means nothing there.
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}
# Products this small finish in microseconds: autotuning each new shape would cost
# far more than it could win, so they take one modest configuration.
SMALL_PRODUCT = 256**3
SMALL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}


def _configs() -> list[triton.Config]:
    shapes = [
        # BLOCK_M, BLOCK_N, BLOCK_K, stages, warps: large tiles for large products, small
        # ones so that a 1024^3 product still has a tile for every SM; BLOCK_K = 32 ones
        # for fp32, whose tiles take twice the shared memory
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
    return [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w
        )
        for m, n, k, s, w in shapes
    ]


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    # grouped order: walk GROUP_M row tiles down one column of tiles before moving right
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // programs_per_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % programs_per_group) % group_size_m
    pid_n = (pid % programs_per_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    # rows past M and columns past N wrap around instead of being masked: their results
    # are never stored, and unmasked loads keep the inner loop lean
    offs_am = offs_m % M
    offs_bn = offs_n % N
    a_ptrs = (
        a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    )  # [BLOCK_M, BLOCK_K]
    b_ptrs = (
        b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    )  # [BLOCK_K, BLOCK_N]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 whatever the inputs
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        # the last step of K overhangs: load zeros there, which add nothing to the dot
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if ACTIVATION == "relu":  # fused epilogue: applied in registers, before the one store
        acc = tl.maximum(acc, 0.0)
    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


matmul_kernel_autotuned = triton.autotune(configs=_configs(), key=["M", "N", "K"])(matmul_kernel)


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """a @ b for a [M, K] and b [K, N] of any strides; returns a new contiguous [M, N].

    fp16 and bf16 inputs accumulate in fp32. fp32 inputs use TF32 tensor cores when
    torch.backends.cuda.matmul.allow_tf32 is True, as torch.matmul does, and exact
    fp32 otherwise. activation="relu" applies ReLU to the result before it is stored.
    """
    check_same("matmul", a, b, same_shape=False)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul expects a [M, K] and b [K, N]; got {list(a.shape)} and {list(b.shape)}"
        )
    if activation not in (None, "relu"):
        raise ValueError(f"matmul: activation must be None or 'relu', got {activation!r}")
    M, K = a.shape
    N = b.shape[1]
    if max(M * K, K * N, M * N) >= 2**31:
        # the kernel's row * stride offsets are 32-bit integers
        raise ValueError(
            f"matmul: {M}x{K} @ {K}x{N} has a matrix of 2^31 elements or more, past what "
            "this kernel's 32-bit offsets address; split the product into blocks of rows"
        )
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if K == 0:
        return c.zero_()
    a, b = _aligned(a), _aligned(b)
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    args = (a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    meta = {"ACTIVATION": activation or "", "INPUT_PRECISION": "tf32" if tf32 else "ieee"}
    if runtime.INTERPRETED or M * N * K <= SMALL_PRODUCT:
        cfg = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
        matmul_kernel[grid](*args, **cfg, **meta)
    else:
        grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)
        matmul_kernel_autotuned[grid](*args, **meta)
    return c


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy whose rows (or columns) start on 16-byte boundaries.

    Tiles load 16 bytes at a time only when every row of a tile starts on a 16-byte
    boundary. A [1000, 777] fp16 matrix has rows 1554 bytes apart, so every load
    would fall back to 2-byte pieces; one copy into rows padded to 1568 bytes costs a
    few microseconds and buys back the full tensor-core speed.
    """
    if runtime.INTERPRETED:
        return t
    per_16_bytes = 16 // t.element_size()
    rows, cols = t.shape
    if t.stride(1) == 1 and t.stride(0) % per_16_bytes == 0:
        return t
    if t.stride(0) == 1 and t.stride(1) % per_16_bytes == 0:
        return t
    padded_cols = triton.cdiv(cols, per_16_bytes) * per_16_bytes
    copy = torch.empty((rows, padded_cols), dtype=t.dtype, device=t.device)[:, :cols]
    return copy.copy_(t)
