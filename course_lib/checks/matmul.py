"""Check for lesson 05: tiled matrix multiplication."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from course_lib import references, runtime
from course_lib.checks.engine import (
    Case,
    CaseResult,
    CheckResult,
    Hints,
    KnownMistake,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.guard import is_poison
from course_lib.checks.launches import recording_grids

HINTS = Hints(
    out_of_bounds=(
        "the edge tiles of C overhang: mask the store, "
        "mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"
    ),
    read_past_end=(
        "NaN where the reference is finite: the last step of the K loop read past the end of "
        "A or B (the memory around them holds NaN during a check). Mask the K dimension: "
        "offs_k < K - k * BLOCK_K in both loads, with other=0.0"
    ),
    load_out_of_bounds=(
        "a load of A or B reached outside it: mask the K dimension in both loads, "
        "offs_k < K - k * BLOCK_K with other=0.0, and check the strides in both pointer "
        "formulas and in the advance"
    ),
    nothing_written="did the kernel store its tile of C? Check tl.store's pointers and the grid",
    grid_too_small=(
        "the grid misses tiles of C: launch triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N) "
        "programs"
    ),
    missing_rows="the grid misses the last row tiles of C: triton.cdiv(M, BLOCK_M) of them",
    missing_columns="the grid misses the last column tiles of C: triton.cdiv(N, BLOCK_N) of them",
    dtype=(
        "C must have the inputs' dtype: allocate it with a.dtype and store "
        "acc.to(c_ptr.dtype.element_ty)"
    ),
)
FP16_ACCUMULATION_HINT = (
    "close but not close enough, in half precision only: accumulate in float32, "
    "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), and cast once when you store"
)


def _swap(t: torch.Tensor) -> torch.Tensor:
    return t.as_strided(t.shape, (t.stride(1), t.stride(0)))


def _not_advanced(block_k: int):
    """What a K loop computes when its pointers stay on the first K tile."""

    def compute(a, b):
        k = a.shape[1]
        out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
        for start in range(0, k, block_k):
            width = min(block_k, k - start)
            out += a[:, :width].double() @ b[:width, :].double()
        return out

    return compute


STRIDE_MISTAKES = [
    KnownMistake(
        lambda a, b: _swap(a) @ b,
        "A's strides are swapped: A[m, k] is at a_ptr + m * stride_am + k * stride_ak",
    ),  # fmt: skip
    KnownMistake(
        lambda a, b: a @ _swap(b),
        "B's strides are swapped: B[k, n] is at b_ptr + k * stride_bk + n * stride_bn",
    ),  # fmt: skip
]
MISTAKES = [
    *STRIDE_MISTAKES,
    *[
        KnownMistake(
            _not_advanced(block_k),
            "every step of your K loop multiplies the first K tile again: advance the "
            "pointers, a_ptrs += BLOCK_K * stride_ak and b_ptrs += BLOCK_K * stride_bk",
        )
        for block_k in (16, 32, 64, 128)
    ],
]


def _operands(generator, m, n, k, dtype, ta=False, tb=False) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded a [m, k] and b [k, n], either of them a transposed view where asked."""

    def rand(rows, cols, transposed):
        shape = (cols, rows) if transposed else (rows, cols)
        t = random_input(generator, shape, dtype)
        return t.t() if transposed else t

    return rand(m, k, ta), rand(k, n, tb)


def _product_case(label: str, inputs: tuple, kind: str, **fields) -> Case:
    """A case of a product with K = inputs[0].shape[1]: float32 runs as TF32 on a GPU (what
    tl.dot does by default) and the tolerance grows with sqrt(K), as a sum's rounding does."""
    dtype, k = inputs[0].dtype, inputs[0].shape[1]
    tolerance = "tf32" if dtype == torch.float32 and runtime.MODE == "gpu" else None
    return Case(label, inputs, kind, tolerance, math.sqrt(k), **fields)


def _cases(seed: int) -> list[Case]:
    generator = case_generator(seed)

    def case(m, n, k, why, dtype=torch.float32, ta=False, tb=False, kind="contiguous"):
        a, b = _operands(generator, m, n, k, dtype, ta, tb)
        name = str(dtype).removeprefix("torch.")
        return _product_case(f"{m}x{n}x{k} ({why}), {name}", (a, b), kind)

    big = runtime.by_mode(gpu=(1000, 3000, 777), interpreter=(130, 100, 77))
    cases = [
        case(1, 1, 1, "all ones"),
        case(1, 37, 17, "M = 1"),
        case(37, 1, 23, "N = 1"),
        case(29, 31, 1, "K = 1"),
        case(61, 67, 71, "primes"),
        case(45, 53, 7, "K smaller than a K tile"),
        case(96, 96, 96, "square"),
        # B square and one K step: B's strides swapped anywhere read B transposed, in bounds
        case(48, 16, 16, "B square, one K step"),
        case(*big, "no dimension a multiple of a tile"),
        case(61, 67, 71, "A transposed", ta=True, kind="transposed"),
        case(61, 67, 71, "B transposed", tb=True, kind="transposed"),
        case(96, 96, 96, "A and B transposed", ta=True, tb=True, kind="transposed"),
    ]
    long_k = runtime.by_mode(gpu=4099, interpreter=2051)
    for dtype in runtime.DTYPES[1:]:
        cases.append(case(61, 67, 71, "primes", dtype))
        cases.append(case(40, 48, long_k, "long K", dtype))
        cases.append(case(61, 67, 71, "B transposed", dtype, tb=True, kind="transposed"))
    return cases


STRIDE_HINTS = {m.hint for m in STRIDE_MISTAKES}


def _refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """Hints that only a comparison of cases reveals."""
    full = [r for c, r in zip(cases, results) if c.inputs[0].dtype == torch.float32]
    # swapped strides also read far outside A or B on non-square shapes, which alone
    # would look like a missing K mask; where a square case names the swap, say so
    swap = next((r.hint for r in results if r.hint in STRIDE_HINTS), None)
    for case, result in zip(cases, results):
        half = case.inputs[0].dtype in (torch.float16, torch.bfloat16)
        close = result.relative_error is not None and result.relative_error < 1e-2
        if half and close and all(r.passed for r in full):
            result.hint = FP16_ACCUMULATION_HINT
        elif swap and result.hint in (
            HINTS.read_past_end,
            HINTS.wrong_values,
            HINTS.load_out_of_bounds,
        ):
            result.hint = swap


def check_matmul(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Check `fn(a, b)`, your launcher for lesson 05, against a @ b computed in float64."""
    return run_check("matmul", fn, _cases(seed=5), references.matmul, MISTAKES, HINTS, _refine)


# --- grouped program order --------------------------------------------------------------

# tile sides a learner may choose (tl.dot needs 16 at least), for what a launch covered to
# be worked out from the grid it asked for
TILE_SIDES = (16, 32, 64, 128, 256)
# wrong mappings from pid to (pid_m, pid_n), in the order they are recognised
FULL_LAST_GROUP = "the last group taken as full"
REST_SWAPPED = "% and // exchanged"
EXCHANGED = "pid_m and pid_n exchanged"
ROW_MAJOR = "row-major"
MAPPING_HINTS = {
    FULL_LAST_GROUP: (
        "the last group has fewer than GROUP_M rows of tiles ({num_pid_m} rows of tiles, "
        "GROUP_M = {group_m}), and your mapping walks it as if it were full, so some of its "
        "tiles get no program. Take its true height, group_size_m = "
        "tl.minimum(num_pid_m - first_pid_m, GROUP_M), in both the % and the //"
    ),
    REST_SWAPPED: (
        "the tiles written are those of a mapping with % and // exchanged. Within a group, "
        "consecutive programs go down one column of tiles: pid_m = first_pid_m + "
        "(pid % num_pid_in_group) % group_size_m, and pid_n = "
        "(pid % num_pid_in_group) // group_size_m moves right after every group_size_m of them"
    ),
    EXCHANGED: (
        "your pid_m and pid_n are exchanged: the tiles your programs computed are those of "
        "the grouped order mirrored across the diagonal. pid_m numbers the rows of tiles "
        "(first_pid_m + ...), pid_n the columns"
    ),
    ROW_MAJOR: (
        "your programs take their tiles in row-major order, along the first row of tiles: "
        "replace pid // num_pid_n and pid % num_pid_n with the grouped mapping, which goes "
        "down GROUP_M rows of tiles before moving one column right"
    ),
}
# the first group alone cannot tell the two apart
ACROSS_FIRST_HINT = (
    "within a group your programs go along a row of tiles before moving down, where they "
    "should go down a column first: the row changes with every program, pid_m = "
    "first_pid_m + (pid % num_pid_in_group) % group_size_m, and the column after every "
    "group_size_m programs, pid_n = (pid % num_pid_in_group) // group_size_m"
)
OTHER_GROUP_HINT = (
    "your programs follow the grouped order for GROUP_M = {seen}, not for the GROUP_M = "
    "{group_m} your launcher was given: pass GROUP_M=GROUP_M to the kernel"
)
SHORT_GRID_HINT = (
    "the tiles written are those the grouped order gives to the first {n_programs} "
    "programs, and your grid ran only those, where C has {n_tiles} tiles of {bm} x {bn}: "
    "launch triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N) programs, one per tile"
)
GROUPED_GRID_HINT = (
    "your grid ran {n_programs} programs, which is the number of tiles for no tile size: "
    "launch triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N) programs, one per tile"
)
UNWRITTEN_TILES_HINT = (
    "{n_missing} tiles of C were never written, (pid_m, pid_n) = {missing} (of {bm} x {bn} "
    "tiles, the size for which your grid has one program per tile): some programs were "
    "given the same tile, or a tile outside C. Work out by hand which tile your mapping "
    "gives a few pids, and compare with the figure of the grouped order"
)
UNWRITTEN_HINT = (
    "parts of C were never written: check that your mapping gives each program a tile "
    "of its own, and that the grid runs one program per tile"
)
ORDER_HINT = (
    "each tile was written, but not by the programs the grouped order assigns it to: "
    "compare your mapping with the figure, program by program"
)
# the K loop is given in this exercise: a read outside A or B comes from the strides
GROUPED_HINTS = replace(
    HINTS,
    read_past_end=(
        "NaN where the reference is finite: your kernel read outside A or B (the memory "
        "around them holds NaN during a check). Pass the strides in the kernel's order, "
        "a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)"
    ),
)
# what the engine says of unwritten elements, which a mapping explains better
_UNWRITTEN_HINTS = {
    GROUPED_HINTS.scattered, GROUPED_HINTS.grid_too_small, GROUPED_HINTS.missing_rows,
    GROUPED_HINTS.missing_columns, GROUPED_HINTS.missing_edges, GROUPED_HINTS.stops_short,
    GROUPED_HINTS.stops_short_2d, GROUPED_HINTS.unscaled_offsets,
}  # fmt: skip


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tile_of(pid: int, num_pid_m: int, num_pid_n: int, group_m: int, mistake: str | None = None):
    """(pid_m, pid_n) of program pid in grouped order, or as one of the wrong mappings."""
    if mistake == ROW_MAJOR:
        return divmod(pid, num_pid_n)
    group, within = divmod(pid, group_m * num_pid_n)
    first_pid_m = group * group_m
    group_size_m = min(num_pid_m - first_pid_m, group_m)
    if mistake == FULL_LAST_GROUP:
        group_size_m = group_m
    pid_m, pid_n = first_pid_m + within % group_size_m, within // group_size_m
    if mistake == REST_SWAPPED:
        pid_m, pid_n = first_pid_m + within // group_size_m, within % group_size_m
    if mistake == EXCHANGED:
        pid_m, pid_n = pid_n, pid_m
    return pid_m, pid_n


def _tiles_written(shape, tile, group_m: int, n_programs: int, mistake=None) -> torch.Tensor:
    """[num_pid_m, num_pid_n]: the tiles that programs 0 .. n_programs - 1 store."""
    num_pid_m, num_pid_n = _cdiv(shape[0], tile[0]), _cdiv(shape[1], tile[1])
    tiles = torch.zeros(num_pid_m, num_pid_n, dtype=torch.bool)
    for pid in range(n_programs):
        pid_m, pid_n = _tile_of(pid, num_pid_m, num_pid_n, group_m, mistake)
        if pid_m < num_pid_m and pid_n < num_pid_n:  # the store's mask drops the others
            tiles[pid_m, pid_n] = True
    return tiles


def _as_tiles(written: torch.Tensor, tile) -> torch.Tensor | None:
    """[num_pid_m, num_pid_n] of the tiles written, if `written` is made of whole tiles."""
    tiles = written[:: tile[0], :: tile[1]]
    whole = tiles.repeat_interleave(tile[0], 0).repeat_interleave(tile[1], 1)
    return tiles if torch.equal(whole[: written.shape[0], : written.shape[1]], written) else None


def _matches(written, tile, group_m: int, n_programs: int, mistake=None) -> bool:
    """Whether `written` is what programs 0 .. n_programs - 1 store at this tile size."""
    tiles = _as_tiles(written, tile)
    shape = tuple(written.shape)
    return tiles is not None and torch.equal(
        tiles, _tiles_written(shape, tile, group_m, n_programs, mistake)
    )


def _tile_sizes(shape, n_programs: int) -> list[tuple[int, int]]:
    """The tile sizes for which C has exactly n_programs tiles."""
    return [
        (bm, bn) for bm in TILE_SIDES for bn in TILE_SIDES
        if _cdiv(shape[0], bm) * _cdiv(shape[1], bn) == n_programs
    ]  # fmt: skip


def _listed(tiles: torch.Tensor, most: int = 8) -> str:
    pairs = [f"({m}, {n})" for m, n in tiles.nonzero().tolist()]
    return ", ".join(pairs[:most]) + (", ..." if len(pairs) > most else "")


def _mapping_hint(written, tiles, group_m: int, n_programs: int) -> str | None:
    """The hint of the wrong mapping that writes exactly `written` at one of `tiles`."""
    named = {}
    for mistake in MAPPING_HINTS:
        tile = next((t for t in tiles if _matches(written, t, group_m, n_programs, mistake)), None)
        if tile is not None:
            named[mistake] = tile
    if not named:
        return None
    if REST_SWAPPED in named and EXCHANGED in named:
        return ACROSS_FIRST_HINT
    mistake, tile = next(iter(named.items()))
    num_pid_m = _cdiv(written.shape[0], tile[0])
    return MAPPING_HINTS[mistake].format(num_pid_m=num_pid_m, group_m=group_m)


@dataclass
class _Launch:
    """What one call of the launcher wrote, and the grids it asked for."""

    out: object
    grids: list[tuple[int, ...]]

    def one_grid(self) -> int | None:
        """The number of programs of its one 1-D launch, if that is what it made."""
        return self.grids[0][0] if len(self.grids) == 1 and len(self.grids[0]) == 1 else None


@dataclass
class _GroupedRun:
    """The learner's launcher as the engine calls it: it keeps what every case's call
    wrote, and on a case with `first_programs`, calls the launcher a second time with only
    its first programs run, which shows the order in which it hands out the tiles."""

    fn: Callable
    full: dict[int, _Launch] = field(default_factory=dict)
    first: dict[int, _Launch] = field(default_factory=dict)

    def __call__(self, a, b, *, case: int, GROUP_M: int, first_programs: int | None = None):
        with recording_grids() as grids:
            out = self.fn(a, b, GROUP_M=GROUP_M)
        self.full[case] = _Launch(out, grids)
        if first_programs is not None and isinstance(out, torch.Tensor):
            with recording_grids(first_programs) as grids:
                self.first[case] = _Launch(self.fn(a, b, GROUP_M=GROUP_M), grids)
        return out

    def refine(self, cases: Sequence[Case], results: list[CaseResult]) -> None:
        """Hints from which tiles were written, and the order of the first programs."""
        for i, (case, result) in enumerate(zip(cases, results)):
            a, b = case.inputs
            shape, group_m = (a.shape[0], b.shape[1]), case.kwargs["GROUP_M"]
            launch, probe = self.full.get(i), self.first.get(i)
            if launch is None or not _usable(launch.out, shape, a.dtype):
                continue
            written = (~is_poison(launch.out)).cpu()
            if not bool(written.all()):
                if result.hint in _UNWRITTEN_HINTS:
                    result.hint = _explain_unwritten(written, launch, group_m)
            elif probe is not None and result.passed and _usable(probe.out, shape, a.dtype):
                first = case.kwargs["first_programs"]
                _check_order(result, (~is_poison(probe.out)).cpu(), probe, group_m, first)


def _usable(out, shape, dtype) -> bool:
    return isinstance(out, torch.Tensor) and tuple(out.shape) == shape and out.dtype == dtype


def _explain_unwritten(written: torch.Tensor, launch: _Launch, group_m: int) -> str:
    n_programs = launch.one_grid()
    if n_programs is None:
        return UNWRITTEN_HINT
    shape = tuple(written.shape)
    every_tile = [(m, n) for m in TILE_SIDES for n in TILE_SIDES]
    for bm, bn in every_tile:  # the right order, from a grid too small for the tiles
        n_tiles = _cdiv(shape[0], bm) * _cdiv(shape[1], bn)
        if n_programs < n_tiles and _matches(written, (bm, bn), group_m, n_programs):
            return SHORT_GRID_HINT.format(n_programs=n_programs, n_tiles=n_tiles, bm=bm, bn=bn)
    tiles = _tile_sizes(shape, n_programs)
    if not tiles:
        return GROUPED_GRID_HINT.format(n_programs=n_programs)
    named = _mapping_hint(written, tiles, group_m, n_programs)
    if named is not None:
        return named
    for tile in tiles:
        as_tiles = _as_tiles(written, tile)
        if as_tiles is not None:
            missing = ~as_tiles
            return UNWRITTEN_TILES_HINT.format(
                n_missing=int(missing.sum()), missing=_listed(missing, 4), bm=tile[0], bn=tile[1]
            )
    return UNWRITTEN_HINT


def _check_order(result: CaseResult, written, probe: _Launch, group_m: int, first: int) -> None:
    """Fail `result` unless the first programs wrote the tiles grouped order gives them."""
    n_asked = probe.one_grid()
    if n_asked is None:
        return  # not the 1-D grid the exercise asks for: the order cannot be told
    shape = tuple(written.shape)
    n_programs = min(n_asked, first)
    tiles = _tile_sizes(shape, n_asked) or [(m, n) for m in TILE_SIDES for n in TILE_SIDES]
    if any(_matches(written, tile, group_m, n_programs) for tile in tiles):
        return
    tile = next((t for t in tiles if _as_tiles(written, t) is not None), tiles[0])
    got = _as_tiles(written, tile)
    result.problems.append(
        f"run with only its first {n_programs} programs, your kernel wrote "
        + (f"tiles {_listed(got)}" if got is not None else "parts of tiles")
        + f"; in grouped order (GROUP_M = {group_m}, {tile[0]} x {tile[1]} tiles) they "
        f"compute {_listed(_tiles_written(shape, tile, group_m, n_programs))}"
    )
    result.hint = _mapping_hint(written, tiles, group_m, n_programs)
    if result.hint is None:
        seen = [
            g for g in range(1, 17)
            if g != group_m and any(_matches(written, t, g, n_programs) for t in tiles)
        ]  # fmt: skip
        if seen:
            # a GROUP_M past the rows of tiles gives the order of every larger one
            said = f"{seen[0]} or more" if seen[-1] == 16 and len(seen) > 1 else seen[0]
            result.hint = OTHER_GROUP_HINT.format(seen=said, group_m=group_m)
        else:
            result.hint = ORDER_HINT


def _grouped_cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    cases = []

    def case(shape, group_m, why, dtype=torch.float32, tb=False, first_programs=None):
        m, n, k = runtime.by_mode(gpu=shape[1], interpreter=shape[0])
        a, b = _operands(generator, m, n, k, dtype, tb=tb)
        kwargs = {"case": len(cases), "GROUP_M": group_m}
        if first_programs is not None:
            kwargs["first_programs"] = first_programs
        name = str(dtype).removeprefix("torch.")
        label = f"{m}x{n}x{k}, GROUP_M={group_m} ({why}), {name}"
        cases.append(_product_case(label, (a, b), "transposed" if tb else "", kwargs=kwargs))

    # the cases that say so leave a short last band at the notebook's tiles: 32 rows in the
    # interpreter, 128 on a GPU
    case([(20, 30, 10)] * 2, 4, "one tile")
    case([(70, 90, 40), (300, 400, 64)], 8, "GROUP_M more than the rows of tiles")
    case([(170, 130, 50), (1100, 700, 100)], 4, "the last group shorter")
    case([(230, 60, 33), (1000, 500, 64)], 3, "the last group shorter")
    case([(90, 70, 40), (700, 300, 64)], 1, "row-major order")
    for dtype in runtime.DTYPES[1:]:
        case([(130, 100, 77), (1100, 900, 300)], 2, "B transposed", dtype, tb=True)
    # what the first programs compute shows the order: 5 x 5 and 5 x 7 tiles of 32,
    # 8 x 8 and 8 x 9 tiles of 128
    case([(150, 150, 20), (900, 900, 64)], 4, "the order", first_programs=10)
    case([(150, 200, 20), (900, 1100, 64)], 3, "the order", first_programs=8)
    return cases


def check_matmul_grouped(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(a, b, GROUP_M=...)`, your grouped launcher for lesson 05: a @ b at several
    GROUP_M, and which tiles the first programs of a launch compute."""
    if not callable(fn):
        raise TypeError(
            f"check_matmul_grouped expects your launcher function, got {type(fn).__name__}"
        )
    run = _GroupedRun(fn)
    return run_check(
        "matmul_grouped", run, _grouped_cases(seed=6), references.matmul, STRIDE_MISTAKES,
        GROUPED_HINTS, run.refine,
    )  # fmt: skip


# --- the fused epilogue: bias and activation ----------------------------------------------

WRONG_ACTIVATION_HINT = (
    "the bias is right, but you applied {got} where activation={asked!r} was asked: "
    'compare ACTIVATION with each name in its own branch, if ACTIVATION == "relu": ..., '
    'elif ACTIVATION == "leaky_relu": ..., and leave acc as it is for None'
)
BIAS_MISSING_HINT = (
    "the bias is missing: load it, bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, "
    "other=0.0), and add it to acc before the activation"
)
ACTIVATION_FIRST_HINT = (
    "the activation came before the bias: add the bias to acc first, then apply the "
    "activation to the sum"
)
BIAS_TAIL_HINT = (
    "the bias is missing in the last column of tiles, the one that overhangs N: load it "
    "in every tile, masked, tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)"
)
BIAS_PER_ROW_HINT = (
    "the bias went along the wrong axis: bias[n] belongs to column n, the same for every "
    "row. Load it at offs_n and add it as a row, acc += bias[None, :]"
)
# the K loop is given in this exercise: NaN comes from the bias's load
BIAS_ACT_HINTS = replace(
    HINTS,
    read_past_end=(
        "NaN where the reference is finite: your kernel read outside an input (the memory "
        "around them holds NaN during a check). Mask the bias's load, offs_n < N"
    ),
)
ROUNDED_FIRST_HINT = (
    "close, but rounded twice: you converted to C's dtype before the bias and the "
    "activation. Add the bias to the float32 acc, apply the activation, then convert once"
)


def _epilogue_mistakes(activation: str | None, n: int, dtype: torch.dtype) -> list[KnownMistake]:
    """What the usual wrong epilogues compute, for a case of N = n and this activation."""

    def act(x, name=activation):
        return references.activation(x, name)

    def product(a, b):
        return a.double() @ b.double()

    def bias_rows(bias, m, other):
        """bias[m] for each row m, `other` past the bias's end: [M, 1]."""
        rows = torch.full((m, 1), other, dtype=torch.float64, device=bias.device)
        rows[: min(m, bias.numel()), 0] = bias[:m].double()
        return rows

    def bias_down_tiles(bias, m, side):
        """bias[:, None] of a tile's columns in square tiles: [M, N]."""
        rows, cols = torch.arange(m)[:, None], torch.arange(n)[None, :]
        index = (cols // side * side + rows % side).to(bias.device)  # masked past N: 0
        return bias.double()[index.clamp(max=n - 1)].masked_fill(index >= n, 0.0)

    def bias_in_full_tiles(bias, side):
        columns = torch.arange(n, device=bias.device)
        return bias.double().masked_fill(columns >= n // side * side, 0.0)

    mistakes = [
        KnownMistake(
            lambda a, b, bias, other=other: act(product(a, b) + bias.double(), other),
            WRONG_ACTIVATION_HINT.format(got=other or "no activation", asked=activation),
        )
        for other in references.MATMUL_ACTIVATIONS
        if other != activation
    ]
    # where some tiles are whole and the last is not: a bias missing from that one only
    mistakes += [
        KnownMistake(
            lambda a, b, bias, side=side: act(product(a, b) + bias_in_full_tiles(bias, side)),
            BIAS_TAIL_HINT,
        )
        for side in TILE_SIDES
        if side < n and n % side
    ]
    mistakes.append(KnownMistake(lambda a, b, bias: act(product(a, b)), BIAS_MISSING_HINT))
    if activation is not None:
        mistakes.append(KnownMistake(
            lambda a, b, bias: act(product(a, b)) + bias.double(), ACTIVATION_FIRST_HINT
        ))  # fmt: skip
    mistakes += [
        KnownMistake(
            lambda a, b, bias, other=other: act(product(a, b) + bias_rows(bias, a.shape[0], other)),
            BIAS_PER_ROW_HINT,
        )
        for other in (float("nan"), 0.0)  # past the bias's end: the guard's NaN, or other=0
    ]
    mistakes += [
        KnownMistake(
            lambda a, b, bias, side=side: act(
                product(a, b) + bias_down_tiles(bias, a.shape[0], side)
            ),
            BIAS_PER_ROW_HINT,
        )
        for side in TILE_SIDES
    ]
    if dtype in (torch.float16, torch.bfloat16):
        mistakes.append(KnownMistake(
            lambda a, b, bias: act(product(a, b).to(dtype).double() + bias.double()),
            ROUNDED_FIRST_HINT,
        ))  # fmt: skip
    return mistakes


def _bias_act_cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    cases = []

    def case(m, n, k, why, activation, dtype=torch.float32, ta=False, tb=False):
        a, b = _operands(generator, m, n, k, dtype, ta, tb)
        # a bias as large as the products, so that it cancels some of them: where it
        # does, rounding before adding it shows
        bias = random_input(generator, (n,), dtype, scale=math.sqrt(k))
        name = str(dtype).removeprefix("torch.")
        label = f"{m}x{n}x{k} ({why}), activation={activation!r}, {name}"
        kind = "transposed" if ta or tb else ""
        cases.append(_product_case(
            label, (a, b, bias), kind,
            kwargs={} if activation is None else {"activation": activation},
            reference=lambda a, b, bias: references.matmul_bias_act(a, b, bias, activation),
            mistakes=_epilogue_mistakes(activation, n, dtype),
        ))  # fmt: skip

    case(1, 1, 1, "all ones", "relu")
    case(37, 61, 20, "M < N", None)
    case(61, 37, 20, "M > N", "leaky_relu")
    case(64, 64, 33, "square", "relu")
    case(*runtime.by_mode(gpu=(1000, 3000, 777), interpreter=(130, 100, 77)), "many tiles",
         "leaky_relu")  # fmt: skip
    case(61, 67, 71, "A transposed", "relu", ta=True)
    for dtype in runtime.DTYPES[1:]:
        case(61, 67, 71, "primes", None, dtype)
        case(61, 67, 71, "B transposed", "leaky_relu", dtype, tb=True)
    return cases


def _refine_bias_act(cases: Sequence[Case], results: list[CaseResult]) -> None:
    """A bias missing from the last column of tiles looks missing everywhere where N is
    less than one tile: where another case shows the first, say so for those too."""
    if any(r.hint == BIAS_TAIL_HINT for r in results):
        for result in results:
            if result.hint == BIAS_MISSING_HINT:
                result.hint = BIAS_TAIL_HINT


def check_matmul_bias_act(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(a, b, bias, activation=...)`, your fused epilogue for lesson 05, against
    activation(a @ b + bias) computed in float64 and rounded once."""
    return run_check(
        "matmul_bias_act", fn, _bias_act_cases(seed=7), references.matmul_bias_act, (),
        BIAS_ACT_HINTS, _refine_bias_act,
    )  # fmt: skip
