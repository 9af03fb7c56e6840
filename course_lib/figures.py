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
