"""Lesson 05: tiled matrix multiplication with an fp32 accumulator, grouped program order,
autotuning, and an optional fused activation.

Each program computes one BLOCK_M x BLOCK_N tile of C, walking K in steps of BLOCK_K.
Programs are numbered so that GROUP_M consecutive ones share column tiles of B and
row tiles of A while those are still in L2. TF32 with a row-major B takes a second kernel,
tf32_b_first_kernel, which computes C^T = B^T A^T to suit the tensor cores (see there).
On Hopper GPUs large products go to a third, tma_matmul_kernel: persistent, its tiles
moved by the TMA unit (see there and _tma_suits).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from course_lib import runtime
from course_lib.interpreter_guard import span
from course_lib.kernels._launch import check_same

# In the interpreter one small configuration, timing means nothing there.
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}
# Products this small finish in microseconds: autotuning each new shape would cost
# far more than it could win, so they take one modest configuration.
SMALL_PRODUCT = 256**3
SMALL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
COPY_BLOCK = 64  # tiles of COPY_BLOCK x COPY_BLOCK in the copies that pad rows


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
# the GPUs (compute capability) where tma_matmul_kernel was measured and takes over
TMA_GPUS = {(9, 0)}


def _configs(shapes: list[tuple], pre_hook=None) -> list[triton.Config]:
    """Autotune configs from (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps) and, in
    TMA_TILE_SHAPES, a sixth entry: WARP_SPECIALIZE."""
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
    offs_m, offs_n, offs_am, offs_bn = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    a_ptrs = (
        a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    )  # [BLOCK_M, BLOCK_K]
    b_ptrs = (
        b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    )  # [BLOCK_K, BLOCK_N]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 whatever the inputs
    # the whole steps of K, unmasked: a mask that varies along K, the contiguous axis of a
    # row-major A, would stop the compiler from loading 16 bytes at a time
    for _ in range(0, K // BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # the last step overhangs K unless BLOCK_K divides it: load zeros past the end there,
    # which add nothing to the dot
    k_left = K % BLOCK_K
    if k_left > 0:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    _store(c_ptrs, acc, (offs_m[:, None] < M) & (offs_n[None, :] < N), ACTIVATION)


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's rows and columns of C, and the same offsets made safe to load."""
    pid_m, pid_n = _grouped(tl.program_id(axis=0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    # rows past M and columns past N read row or column 0 instead of being masked: their
    # results are never stored, and unmasked loads keep the inner loop lean
    offs_am = tl.where(offs_m < M, offs_m, 0)
    offs_bn = tl.where(offs_n < N, offs_n, 0)
    # tl.where hides from the compiler that the offsets run in steps of one from a multiple
    # of the block, which it must know to load 16 bytes at a time. Say so. It is true of
    # every 16-byte piece but those that straddle M or N in the last tiles: such a piece
    # still starts at a valid element on a 16-byte boundary, so it stays in memory that
    # exists, and the up to 7 elements it reads past the edge (the rows' padding, see
    # _aligned) go only into results that are never stored
    offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    return offs_m, offs_n, offs_am, offs_bn


@triton.jit
def _grouped(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
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
def _store(c_ptrs, acc, mask, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":  # fused epilogue: applied in registers, before the one store
        acc = tl.maximum(acc, 0.0)
    tl.store(c_ptrs, acc.to(c_ptrs.dtype.element_ty), mask=mask)


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
    offs_m, offs_n, offs_am, offs_bn = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
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
    _store(c_ptrs, acc, (offs_n[:, None] < N) & (offs_m[None, :] < M), ACTIVATION)


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


@triton.jit
def tma_matmul_kernel(
    a_desc, b_desc, c_desc, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, B_K_MAJOR: tl.constexpr,
    ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr, DTYPE: tl.constexpr,
):  # fmt: skip
    """matmul_kernel rebuilt for Hopper GPUs: persistent, with tiles moved by the TMA engine.

    The grid has one program per SM (NUM_SMS), each walking C's tiles in steps of NUM_SMS
    in grouped order, so no SM idles waiting for a new program to start. The descriptors
    carry shapes and strides: the TMA unit copies whole tiles into shared memory on its
    own, fills what lies past an edge with zeros and clips stores at the edges, so the
    kernel needs no pointers and no masks. A row-major B is loaded as [BLOCK_K, BLOCK_N]
    tiles, a K-major one (B_K_MAJOR) as [BLOCK_N, BLOCK_K] tiles of B^T. Either WARP_SPECIALIZE,
    some warps only loading while the others compute, or `flatten`, the two loops merged
    so that loads for the next tile start while this one finishes: Hopper's compiler does
    not promise both at once. DTYPE is there for the autotuner's key only: descriptors do
    not show it their dtype, and fp32 tiles need twice the shared memory of fp16 ones.
    """
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(
        tl.program_id(axis=0), num_tiles, NUM_SMS,
        flatten=not WARP_SPECIALIZE, warp_specialize=WARP_SPECIALIZE,
    ):  # fmt: skip
        pid_m, pid_n = _grouped(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = a_desc.load([row, k])
            b = b_desc.load([col, k]).T if B_K_MAJOR else b_desc.load([k, col])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        if ACTIVATION == "relu":
            acc = tl.maximum(acc, 0.0)
        # stored in two halves [BLOCK_M, BLOCK_N // 2]: a store goes through shared memory,
        # and a whole 128 x 256 tile there would leave too little room for the loads
        halves = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1)
        left, right = tl.split(halves)
        c_desc.store([row, col], left.to(c_desc.dtype))
        c_desc.store([row, col + BLOCK_N // 2], right.to(c_desc.dtype))


def _set_block_shapes(args: dict) -> None:
    """Make the descriptors' tile shapes those of the config about to run."""
    block_m, block_n, block_k = args["BLOCK_M"], args["BLOCK_N"], args["BLOCK_K"]
    args["a_desc"].block_shape = [block_m, block_k]
    args["b_desc"].block_shape = [block_n, block_k] if args["B_K_MAJOR"] else [block_k, block_n]
    args["c_desc"].block_shape = [block_m, block_n // 2]


# the precision is in the key: a config that fits for exact fp32 can need more shared
# memory than the GPU has as TF32
matmul_kernel_autotuned = triton.autotune(
    configs=_configs(TILE_SHAPES), key=["M", "N", "K", "INPUT_PRECISION"]
)(matmul_kernel)
tf32_b_first_autotuned = triton.autotune(
    configs=_configs(B_FIRST_TILE_SHAPES), key=["M", "N", "K"]
)(tf32_b_first_kernel)
tma_matmul_autotuned = triton.autotune(
    configs=_configs(TMA_TILE_SHAPES, pre_hook=_set_block_shapes),
    key=["M", "N", "K", "B_K_MAJOR", "INPUT_PRECISION", "DTYPE"],
)(tma_matmul_kernel)


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
        raise ValueError(
            f"matmul: {M}x{K} @ {K}x{N} has a matrix of 2^31 elements or more, past what "
            "this kernel's 32-bit offsets address; split the product into blocks of rows"
        )
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if K == 0:
        return c.zero_()
    tf32 = a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    # TF32 wants A with K contiguous, copied so if need be, and takes B either way: one with
    # N contiguous goes to tf32_b_first_kernel
    a = _aligned(a, contiguous_axis=1) if tf32 else _aligned(a)
    b = _aligned(b)
    meta = {"ACTIVATION": activation or ""}
    if M * N * K > SMALL_PRODUCT and _tma_suits(a, b, c, tf32):
        tma_matmul(a, b, c, activation, input_precision="tf32" if tf32 else "ieee")
        return c
    if tf32 and b.stride(1) == 1 and b.stride(0) != 1:
        kernel, autotuned = tf32_b_first_kernel, tf32_b_first_autotuned
    else:
        kernel, autotuned = matmul_kernel, matmul_kernel_autotuned
        meta["INPUT_PRECISION"] = "tf32" if tf32 else "ieee"
    args = (a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    if runtime.INTERPRETED or M * N * K <= SMALL_PRODUCT:
        cfg = INTERPRETER_CONFIG if runtime.INTERPRETED else SMALL_CONFIG
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
        kernel[grid](*args, **cfg, **meta)
    else:
        grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),)
        autotuned[grid](*args, **meta)
    return c


def _tma_suits(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tf32: bool) -> bool:
    """Whether tma_matmul_kernel takes this product: on the GPUs in TMA_GPUS, for fp16 and
    bf16, and for TF32 with a K-major B only (TF32 reads both tiles K-major from shared
    memory; a row-major B goes to tf32_b_first_kernel), with A's K axis contiguous and
    every matrix meeting the TMA unit's rules: 16-byte aligned, rows too."""
    if runtime.INTERPRETED or _capability(a.device) not in TMA_GPUS:
        return False
    if a.dtype == torch.float32 and not (tf32 and _column_major(b)):
        return False
    return all(_tma_ready(t) for t in (a, _by_rows(b), c))


def _column_major(t: torch.Tensor) -> bool:
    """Whether the 2-D `t` has its first axis contiguous and not its last: K-major, for b."""
    return t.stride(0) == 1 and t.stride(1) != 1


def _by_rows(b: torch.Tensor) -> torch.Tensor:
    """b as the TMA unit reads it: itself when row-major, b^T [N, K] when K-major."""
    return b.t() if _column_major(b) else b


def _tma_ready(t: torch.Tensor) -> bool:
    return _tma_rule_broken(t) is None


def _tma_rule_broken(t: torch.Tensor) -> str | None:
    """Which of the TMA unit's rules the 2-D `t` breaks, if any."""
    if t.stride(1) != 1:
        return "its last axis must be contiguous (b: either axis)"
    if t.stride(0) < t.shape[1] or t.stride(0) * t.element_size() % 16 != 0:
        return "its rows must not overlap and must lie a multiple of 16 bytes apart"
    if t.data_ptr() % 16 != 0:
        return "it must start at a 16-byte aligned address"
    return None


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def tma_available() -> bool:
    """Whether tma_matmul can run here: in the interpreter, or on a GPU with a TMA unit
    (compute capability 9.0, Hopper, or later)."""
    return runtime.INTERPRETED or _capability(runtime.DEVICE) >= (9, 0)


def tma_matmul(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, activation: str | None = None,
    input_precision: str = "ieee", config: dict | None = None,
) -> None:  # fmt: skip
    """c = a @ b through tma_matmul_kernel: autotuned on a GPU, or with `config` (BLOCK_M,
    BLOCK_N, BLOCK_K, GROUP_M, WARP_SPECIALIZE, optionally num_warps and num_stages).
    a and c need their last axis contiguous, b either axis, each with rows a multiple of
    16 bytes apart from a 16-byte aligned start (the TMA unit's rules, see
    _tma_rule_broken). Shapes and dtypes are not checked here: matmul checks them."""
    if not tma_available():
        raise RuntimeError(
            "tma_matmul needs a GPU with a TMA unit (Hopper or later) or the interpreter; "
            "use matmul, which picks the kernel that suits the GPU"
        )
    if activation not in (None, "relu") or input_precision not in ("ieee", "tf32"):
        raise ValueError(
            "tma_matmul: activation must be None or 'relu' and input_precision 'ieee' or "
            f"'tf32'; got {activation!r} and {input_precision!r}"
        )
    b_rows = _by_rows(b)
    for name, t in (("a", a), ("b", b_rows), ("c", c)):
        if rule := _tma_rule_broken(t):
            raise ValueError(
                f"tma_matmul: {name} (strides {list(t.stride())}, {t.dtype}) breaks a rule of "
                f"the TMA unit: {rule}; padded_copy makes a copy that follows them all"
            )
    placeholder = [16, 16]  # the tile shapes are the config's, set by _set_block_shapes
    args = {
        "a_desc": TensorDescriptor.from_tensor(a, placeholder),
        "b_desc": TensorDescriptor.from_tensor(b_rows, placeholder),
        "c_desc": TensorDescriptor.from_tensor(c, placeholder),
    }
    (M, K), N = a.shape, b.shape[1]
    num_sms = 4 if runtime.INTERPRETED else _sm_count(a.device)
    meta = dict(
        NUM_SMS=num_sms, B_K_MAJOR=b_rows is not b, ACTIVATION=activation or "",
        INPUT_PRECISION=input_precision, DTYPE=str(a.dtype),
    )  # fmt: skip
    grid = lambda m: (min(num_sms, triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"])),)
    if config is None and runtime.INTERPRETED:  # nothing to time there
        config = {**INTERPRETER_CONFIG, "WARP_SPECIALIZE": False}
    if config is None:
        tma_matmul_autotuned[grid](*args.values(), M, N, K, **meta)
    else:
        _set_block_shapes({**args, **config, **meta})
        tma_matmul_kernel[grid(config)](*args.values(), M, N, K, **config, **meta)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _aligned(t: torch.Tensor, contiguous_axis: int | None = None) -> torch.Tensor:
    """`t`, or a copy whose `contiguous_axis` (by default the one already contiguous,
    else the columns) is contiguous, with rows (or columns) a multiple of 16 elements apart.

    Tiles load 16 bytes at a time only where the compiler can prove that each row of a
    tile starts on a 16-byte boundary, and it knows only of integer arguments that they
    are multiples of 16. A [1000, 777] fp16 matrix has rows 777 elements apart, so every
    load would fall back to 2-byte pieces; one copy into rows padded to 784 elements costs
    a few microseconds of GPU time (and one more launch) and buys back the full
    tensor-core speed. A view whose strides reach 2^31 elements or more is copied too:
    the kernel's offsets are 32-bit.
    """
    if contiguous_axis is None:
        contiguous_axis = 0 if _column_major(t) else 1
    if span(t.shape, t.stride()) < 2**31 and (
        runtime.INTERPRETED  # nothing to gain there, and the copies cost time
        or (t.stride(contiguous_axis) == 1 and t.stride(1 - contiguous_axis) % 16 == 0)
    ):
        return t
    return padded_copy(t, contiguous_axis)


def padded_copy(t: torch.Tensor, contiguous_axis: int) -> torch.Tensor:
    """A copy of the 2-D `t` with `contiguous_axis` contiguous and the other axis's stride
    rounded up to a multiple of 16 elements. Refused, before anything is allocated, where
    the padding takes the copy to 2^31 elements or more: the kernel's offsets are 32-bit."""
    src = t if contiguous_axis == 1 else t.t()  # the axis to make contiguous, last
    rows, cols = src.shape
    padded_cols = triton.cdiv(cols, 16) * 16
    if span((rows, cols), (padded_cols, 1)) >= 2**31:
        raise ValueError(
            f"matmul: an operand of shape {list(t.shape)} needs 2^31 elements of memory or "
            "more once its rows are padded to a multiple of 16 elements, past what this "
            "kernel's 32-bit offsets address; split the product into blocks of rows"
        )
    copy = torch.empty((rows, padded_cols), dtype=t.dtype, device=t.device)[:, :cols]
    tiles_r, tiles_c = triton.cdiv(rows, COPY_BLOCK), triton.cdiv(cols, COPY_BLOCK)
    if copy.numel() > 0:
        _copy_kernel[(tiles_r * tiles_c,)](
            src, copy, rows, cols, *src.stride(), *copy.stride(), tiles_c, BLOCK=COPY_BLOCK
        )
    return copy if contiguous_axis == 1 else copy.t()


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
