"""Figures the lessons draw: pictures of how a grid of programs covers the data.

Plain matplotlib, no Triton: the pictures describe a launch, they do not run one.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.patches import Patch, Rectangle

FULL_COLOR = "#9ecae1"  # a tile that lies wholly inside the matrix
PARTIAL_COLOR = "#fdae6b"  # a tile that overhangs the bottom or right edge
MASKED_COLOR = "#636363"  # hatching over the overhang: lanes the mask switches off
BOUNDARY_COLOR = "#cb181d"
MAX_TEXT_LABELS = 100  # past this many tiles, labels would overlap; the patches keep them


def plot_tile_map(M: int, N: int, BLOCK_M: int, BLOCK_N: int, ax: Axes | None = None) -> Axes:
    """Draw which program covers which tile of an [M, N] matrix cut into [BLOCK_M, BLOCK_N] tiles.

    One rectangle per program of the grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), labelled
    "(pid_m, pid_n)" (its patch label, and its text when there are at most
    MAX_TEXT_LABELS tiles). Tiles that overhang the matrix are shaded apart (gid "partial",
    the others "full"), the overhang (lanes the mask switches off) is hatched, and the
    matrix boundary is a thick line. Rows run down, columns across, as a matrix is printed.
    Returns the Axes.
    """
    for name, value in (("M", M), ("N", N), ("BLOCK_M", BLOCK_M), ("BLOCK_N", BLOCK_N)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"plot_tile_map: {name} must be a positive int, got {value!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 7 * min(max(M / N, 0.25), 1.5)))
    grid_m, grid_n = math.ceil(M / BLOCK_M), math.ceil(N / BLOCK_N)
    height, width = grid_m * BLOCK_M, grid_n * BLOCK_N  # what the grid covers, overhang included

    for pid_m in range(grid_m):
        for pid_n in range(grid_n):
            top, left = pid_m * BLOCK_M, pid_n * BLOCK_N
            partial = top + BLOCK_M > M or left + BLOCK_N > N
            tile = Rectangle(
                (left, top),
                BLOCK_N,
                BLOCK_M,
                facecolor=PARTIAL_COLOR if partial else FULL_COLOR,
                edgecolor="black",
                linewidth=1,
                label=f"({pid_m}, {pid_n})",
                gid="partial" if partial else "full",
            )
            ax.add_patch(tile)
            if grid_m * grid_n <= MAX_TEXT_LABELS:
                x, y = left + BLOCK_N / 2, top + BLOCK_M / 2
                ax.text(x, y, tile.get_label(), ha="center", va="center", fontsize=9)

    # hatch only, so that the partial tiles' shading shows through their overhang
    overhang = dict(facecolor="none", edgecolor=MASKED_COLOR, hatch="//", linewidth=0)
    if width > N:
        ax.add_patch(Rectangle((N, 0), width - N, height, **overhang))
    if height > M:
        ax.add_patch(Rectangle((0, M), N, height - M, **overhang))
    ax.add_patch(
        Rectangle((0, 0), N, M, fill=False, edgecolor=BOUNDARY_COLOR, linewidth=3, gid="matrix")
    )

    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)  # row 0 at the top
    ax.set_aspect("equal")
    _set_ticks(ax.xaxis, width, BLOCK_N, N)
    _set_ticks(ax.yaxis, height, BLOCK_M, M)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("column n")
    ax.set_ylabel("row m")
    ax.set_title(
        f"[{M}, {N}] in [{BLOCK_M}, {BLOCK_N}] tiles: grid ({grid_m}, {grid_n}), "
        f"{grid_m * grid_n} programs",
        pad=28,
    )
    legend = [
        Patch(facecolor=FULL_COLOR, edgecolor="black", label="full tile"),
        Patch(facecolor=PARTIAL_COLOR, edgecolor="black", label="partial tile"),
        Patch(facecolor="white", edgecolor=MASKED_COLOR, hatch="//", label="masked off"),
        Patch(fill=False, edgecolor=BOUNDARY_COLOR, linewidth=3, label="matrix boundary"),
    ]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return ax


def _set_ticks(axis: Axis, extent: int, block: int, size: int) -> None:
    """Ticks at the tile boundaries, and at the matrix's edge (in red) unless it crowds one."""
    ticks = list(range(0, extent + 1, block))
    if all(abs(size - t) >= 0.15 * block for t in ticks):
        ticks = sorted([*ticks, size])
    axis.set_ticks(ticks, labels=[str(t) for t in ticks])
    for tick, label in zip(ticks, axis.get_ticklabels()):
        if tick == size and size % block:
            label.set_color(BOUNDARY_COLOR)


def plot_program_order(
    M_tiles: int, N_tiles: int, GROUP_M: int | None = None, ax: Axes | None = None
) -> Axes:
    """Draw the order in which a 1-D grid of programs visits the [M_tiles, N_tiles] tiles of C.

    Program `pid` computes tile (pid_m, pid_n). With GROUP_M None the order is row-major,
    pid_m, pid_n = divmod(pid, N_tiles). Otherwise it is grouped, as in
    course_lib/kernels/matmul.py: bands of GROUP_M tile rows (the last band may be
    shorter), each walked column by column, top to bottom within a column. Each tile is a
    unit square whose patch label is its pid (also written in it, when there are at most
    MAX_TEXT_LABELS tiles), shaded from light to dark in visit order; in grouped order the
    bands are outlined (gid "group"). Rows run down, columns across. Returns the Axes.
    """
    for name, value in (("M_tiles", M_tiles), ("N_tiles", N_tiles), ("GROUP_M", GROUP_M)):
        if name == "GROUP_M" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"plot_program_order: {name} must be a positive int, got {value!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 6 * min(max(M_tiles / N_tiles, 0.25), 1.5)))
    n_programs = M_tiles * N_tiles
    cmap = plt.get_cmap("YlGnBu")  # light for the first programs, dark for the last

    for pid in range(n_programs):
        if GROUP_M is None:
            pid_m, pid_n = divmod(pid, N_tiles)
        else:
            group, within = divmod(pid, GROUP_M * N_tiles)
            first_m = group * GROUP_M
            rows_in_group = min(M_tiles - first_m, GROUP_M)  # the last band may be shorter
            pid_m, pid_n = first_m + within % rows_in_group, within // rows_in_group
        shade = 0.1 + 0.75 * pid / max(n_programs - 1, 1)
        tile = Rectangle(
            (pid_n, pid_m), 1, 1, facecolor=cmap(shade), edgecolor="white", linewidth=1,
            label=str(pid), gid="tile",
        )  # fmt: skip
        ax.add_patch(tile)
        if n_programs <= MAX_TEXT_LABELS:
            color = "white" if shade > 0.55 else "black"
            ax.text(pid_n + 0.5, pid_m + 0.5, str(pid), ha="center", va="center",
                    fontsize=8, color=color)  # fmt: skip

    if GROUP_M is not None:
        for first_m in range(0, M_tiles, GROUP_M):
            band = Rectangle(
                (0, first_m), N_tiles, min(GROUP_M, M_tiles - first_m), fill=False,
                edgecolor=BOUNDARY_COLOR, linewidth=2.5, gid="group",
            )  # fmt: skip
            ax.add_patch(band)

    ax.set_xlim(0, N_tiles)
    ax.set_ylim(M_tiles, 0)  # tile row 0 at the top
    ax.set_aspect("equal")
    ax.set_xticks([n + 0.5 for n in range(N_tiles)], [str(n) for n in range(N_tiles)])
    ax.set_yticks([m + 0.5 for m in range(M_tiles)], [str(m) for m in range(M_tiles)])
    ax.tick_params(length=0, labelsize=8)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("pid_n (column of tiles)")
    ax.set_ylabel("pid_m (row of tiles)")
    order = "row-major order" if GROUP_M is None else f"grouped order, GROUP_M = {GROUP_M}"
    ax.set_title(f"{M_tiles} x {N_tiles} tiles, {order}", pad=28)
    return ax
