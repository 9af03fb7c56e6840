"""Stream-K: the Hopper matmul for products with too few tiles to keep every SM busy.

A persistent kernel hands each SM whole tiles of C. The weight gradient of a 768-wide
Linear layer, [3072, 768] with K the number of tokens, is 72 tiles of 128 x 256: on a GPU
of 132 SMs, 60 have nothing to do, and the product runs at 72/132 of the speed its tile
allows.

Stream-K deals out the steps along K instead of the tiles. Laid end to end, every tile's
steps make one long list, cut into one equal share per SM. A share then begins or ends
inside a tile. A program whose share ends inside a tile leaves its partial sum in a
workspace and raises a flag; the program that holds the tile's last step waits for those
flags, adds the partial sums and stores the tile.

Each program walks its share from the end back to the start. So it hands over first the
piece it does not finish; the piece it finishes, the first of its share, it computes last,
by which time the programs before it have long handed over theirs. Walking forward
instead, a program would finish its first tile only once the program before it had
reached the end of its whole share, and every program would wait on the one before.

It has costs of its own: the partial sums' round trip, a second start of the loads'
pipeline for each piece, and programs at different places along K, which share less of
what they read in L2. Measured on an H200 (bf16), it ran 13-30% faster than whole tiles
where those left 45% of the SMs idle (the weight gradients above, at 4096 and 16384
tokens), 17% slower where they left 27% idle (a [4096, 768] output, 96 tiles), and slower
still on products of two and three waves.

The flags are reset by the program that reads them, so a workspace serves one launch
after another on one stream: there is one per device, stream and tile size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib import runtime, triton_internals
from course_lib.kernels._args import cdiv
from course_lib.kernels._launch import BoundLaunch, LeanLauncher
from course_lib.kernels.hopper import column_major, descriptor, sm_count
from course_lib.kernels.tiles import grouped_tile, halves, store_half

# the tile of every stream-K launch: the tile count no longer decides how busy the SMs
# are, so one tile serves every shape, and a first call compiles one kernel and times none.
# Of four tried, 128 x 128 ran the weight gradients fastest
STREAM_K_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}
STREAM_K_LAUNCH = {"num_stages": 4, "num_warps": 8}
# A product goes stream-K where whole 128 x 256 tiles (tma_matmul_kernel's for large
# products) make less than one wave and leave more than this share of the SMs idle, and a
# tile has at least STREAM_K_MIN_STEPS steps along K to share out: measured, 45% idle
# gains, 27% loses, and so do products of several waves (above)
STREAM_K_IDLE = 0.4
STREAM_K_MIN_STEPS = 16
WHOLE_TILE = (128, 256)


def stream_k_pays(M: int, N: int, K: int, programs: int) -> bool:
    """Whether a product of these sizes runs faster stream-K on a GPU of this many SMs:
    where whole tiles make less than one wave, leaving more than STREAM_K_IDLE of the SMs
    idle, and K is long enough to be shared out."""
    tiles = cdiv(M, WHOLE_TILE[0]) * cdiv(N, WHOLE_TILE[1])
    idle = 1 - tiles / programs
    return idle > STREAM_K_IDLE and cdiv(K, STREAM_K_CONFIG["BLOCK_K"]) >= STREAM_K_MIN_STEPS


@triton.jit
def _share_start(program, total, NUM_SMS: tl.constexpr):
    # the first step of `program`'s share: total // NUM_SMS each, one more for the first
    # total % NUM_SMS programs
    return program * (total // NUM_SMS) + tl.minimum(program, total % NUM_SMS)


@triton.jit
def tma_stream_k_kernel(
    a_desc, b_desc, c_desc, bias_ptr, partials_ptr, flags_ptr, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, A_M_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """C = activation(A @ B + bias) as tma_matmul_kernel computes it, with each of the
    NUM_SMS programs taking an equal share of all tiles' steps along K. partials_ptr holds
    a float32 tile per program (its two halves one after the other) and flags_ptr one int32
    per program; the flags must be zero before the first launch, and each launch leaves
    them so."""
    pid = tl.program_id(axis=0)
    steps = tl.cdiv(K, BLOCK_K)  # a tile's steps along K
    total = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) * steps
    first = _share_start(pid, total, NUM_SMS)
    end = _share_start(pid + 1, total, NUM_SMS)
    last_tile = (end - 1) // steps
    pieces = tl.where(end > first, last_tile - first // steps + 1, 0)  # one per tile it meets
    HALF: tl.constexpr = BLOCK_N // 2
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    offs_half = tl.arange(0, BLOCK_M)[:, None] * HALF + tl.arange(0, HALF)[None, :]
    for piece in range(0, pieces):  # the last piece first
        tile = last_tile - piece
        tile_start = tile * steps
        start, stop = tl.maximum(first, tile_start), tl.minimum(end, tile_start + steps)
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # [BLOCK_M, BLOCK_N]
        for k in range((start - tile_start) * BLOCK_K, (stop - tile_start) * BLOCK_K, BLOCK_K):
            a = a_desc.load([k, row]).T if A_M_MAJOR else a_desc.load([row, k])
            b = b_desc.load([col, k]).T if B_K_MAJOR else b_desc.load([k, col])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        left, right = halves(acc, BLOCK_M, BLOCK_N)
        mine = partials_ptr + pid * TILE + offs_half
        if stop < tile_start + steps:
            # the tile's last steps are a later program's: hand this partial sum over
            tl.store(mine, left)
            tl.store(mine + BLOCK_M * HALF, right)
            tl.debug_barrier()  # every thread's part stored before the flag goes up
            tl.atomic_xchg(flags_ptr + pid, 1, sem="release")
        else:
            # the tile ends here: add the partial sums of the programs before this one
            # that hold its earlier steps, a half at a time (fewer registers)
            left = _add_held(left, partials_ptr, flags_ptr, offs_half, pid, start, tile_start,
                             total, NUM_SMS, TILE, WAIT=True)  # fmt: skip
            store_half(c_desc, left, row, col, bias_ptr, N, HALF, HAS_BIAS, ACTIVATION)
            right = _add_held(right, partials_ptr + BLOCK_M * HALF, flags_ptr, offs_half, pid,
                              start, tile_start, total, NUM_SMS, TILE, WAIT=False)  # fmt: skip
            store_half(c_desc, right, row, col + HALF, bias_ptr, N, HALF, HAS_BIAS, ACTIVATION)


@triton.jit
def _add_held(
    half, partials_ptr, flags_ptr, offs_half, pid, start, tile_start, total,
    NUM_SMS: tl.constexpr, TILE: tl.constexpr, WAIT: tl.constexpr,
):  # fmt: skip
    """`half` plus the same half of the partial sums that the programs before `pid` hold
    of its tile, whose steps from tile_start to start are theirs. WAIT: take each one's
    flag down first, waiting for it to go up (the first half's pass does)."""
    holder, summed_from = pid - 1, start
    while summed_from > tile_start:
        if WAIT:
            while tl.atomic_cas(flags_ptr + holder, 1, 0, sem="acquire") != 1:
                pass
        # from L2, where the holder stored it: this SM's L1 knows nothing of that store
        half += tl.load(partials_ptr + holder * TILE + offs_half, cache_modifier=".cg")
        summed_from = _share_start(holder, total, NUM_SMS)
        holder -= 1
    return half


stream_k_launcher = LeanLauncher(tma_stream_k_kernel)  # tma_stream_k_kernel[grid], lean

# the workspaces: (partials, flags) per device, stream and size, the flags zero once. One is
# never replaced, for a CUDA graph that captured a launch keeps using the one it saw
_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, programs: int, tile: int):
    stream = None if runtime.INTERPRETED else triton_internals.current_stream(device.index)
    key = (device, stream, programs, tile)
    held = _workspaces.get(key)
    if held is None:
        partials = torch.empty(programs * tile, device=device, dtype=torch.float32)
        flags = torch.zeros(programs, device=device, dtype=torch.int32)
        held = _workspaces[key] = (partials, flags)
    return held


def stream_k_launch(
    a, b, c, activation: str, precision: str, has_bias: bool, config: dict | None = None,
    programs: int | None = None,
):  # fmt: skip
    """tma_launch's counterpart: a function of (a, b, c, bias=None) that computes c =
    activation(a @ b + bias) through tma_stream_k_kernel for operands laid out like these
    (the TMA unit's rules checked by the caller), with STREAM_K_CONFIG or `config` (tiles,
    and num_stages and num_warps where given) over `programs` programs, one per SM by
    default."""
    a_m_major, b_k_major = column_major(a), column_major(b)
    (M, K), N = a.shape, c.shape[1]
    if programs is None:
        programs = 4 if runtime.INTERPRETED else sm_count(a.get_device())
    config = {**STREAM_K_CONFIG, **({} if runtime.INTERPRETED else STREAM_K_LAUNCH),
              **(config or {})}  # fmt: skip
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    meta = config | dict(
        NUM_SMS=programs, A_M_MAJOR=a_m_major, B_K_MAJOR=b_k_major, HAS_BIAS=has_bias,
        ACTIVATION=activation, INPUT_PRECISION=precision,
    )  # fmt: skip
    launch = BoundLaunch(stream_k_launcher, (programs,), meta)
    a_box = [block_k, block_m] if a_m_major else [block_m, block_k]
    b_box = [block_n, block_k] if b_k_major else [block_k, block_n]

    def stream_k(a, b, c, bias=None):
        partials, flags = _workspace(c.device, programs, block_m * block_n)
        a_rows, b_rows = (a.t() if a_m_major else a), (b.t() if b_k_major else b)
        descs = (
            descriptor(a_rows, a_rows.shape, a_rows.stride(), a_box),
            descriptor(b_rows, b_rows.shape, b_rows.stride(), b_box),
            descriptor(c, c.shape, c.stride(), [block_m, block_n // 2]),
        )
        launch(*descs, c if bias is None else bias, partials, flags, M, N, K)

    return stream_k
