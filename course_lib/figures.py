"""Figures the lessons draw: pictures of how a grid of programs covers the data.

Plain matplotlib, no Triton: the pictures describe a launch, they do not run one.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.lines import Line2D
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


IMAGE_COLOR = "#f0f0f0"  # an input pixel the tile does not read
PADDING_COLOR = "#bdbdbd"  # the ring of zeros that padding adds around the image
READ_COLOR = "#3182bd"  # an input pixel the tile reads
READ_PADDING_COLOR = "#fd8d3c"  # a padding position the tile reads: a masked load, other=0


def _pair_text(h: int, w: int) -> str:
    return str(h) if h == w else f"({h}, {w})"


def _span_text(what: str, span: range) -> str:
    if len(span) == 1:
        return f"{what} {span.start}"
    return f"{what}s {span.start}-{span.stop - 1}"


def _span(value: range | tuple[int, int], name: str) -> range:
    """A range of output rows or columns, from a range or a (start, stop) pair."""
    if isinstance(value, tuple) and len(value) == 2:
        value = range(*value)
    if not isinstance(value, range) or value.step != 1 or len(value) == 0:
        raise ValueError(
            f"plot_receptive_field: {name} must be a non-empty range or a (start, stop) pair "
            f"of output indices, got {value!r}"
        )
    return value


def _receptive_field(
    kh: int, kw: int, stride: tuple[int, int], padding: tuple[int, int],
    dilation: tuple[int, int], out_rows: range, out_cols: range,
) -> set[tuple[int, int]]:  # fmt: skip
    """The input positions (ih, iw) that output pixels out_rows x out_cols read: for each,
    ih = oh·sh − ph + r·dh and iw = ow·sw − pw + s·dw over the kh x kw taps. Positions
    outside the image (ih < 0, ih ≥ H, ...) are padding."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    return {
        (oh * sh - ph + r * dh, ow * sw - pw + s * dw)
        for oh in out_rows
        for ow in out_cols
        for r in range(kh)
        for s in range(kw)
    }


def plot_receptive_field(
    H: int, W: int, kh: int, kw: int, stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
    out_rows: range | tuple[int, int] = (0, 1), out_cols: range | tuple[int, int] = (0, 1),
    ax: Axes | None = None,
) -> Axes:  # fmt: skip
    """Draw which input pixels one tile of a conv2d's output reads: its receptive field.

    The input is an [H, W] image inside its padding ring of ph rows and pw columns, one unit
    square per position, labelled "(ih, iw)" with ih and iw counted from the image's first
    pixel (the padding has ih = -1, ih = H, ...). Squares have gid "image" or "padding",
    and, when the output pixels out_rows x out_cols (ranges, or (start, stop) pairs of
    output indices) read them, "read" or "read padding": those reads are masked loads that
    return 0. stride, padding and dilation are ints or (h, w) pairs, as in
    torch.nn.functional.conv2d. Rows run down, columns across. Returns the Axes.
    """
    pairs = {}
    for name, value, least in (("stride", stride, 1), ("padding", padding, 0),
                               ("dilation", dilation, 1)):  # fmt: skip
        pair = (value, value) if isinstance(value, int) else value
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(isinstance(v, int) and v >= least for v in pair)
        ):
            raise ValueError(f"plot_receptive_field: {name} must be an int or a pair of ints "
                             f"of at least {least}, got {value!r}")  # fmt: skip
        pairs[name] = tuple(pair)
    for name, value in (("H", H), ("W", W), ("kh", kh), ("kw", kw)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"plot_receptive_field: {name} must be a positive int, got {value!r}")
    (sh, sw), (ph, pw), (dh, dw) = pairs["stride"], pairs["padding"], pairs["dilation"]
    OH, OW = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if OH < 1 or OW < 1:
        raise ValueError(f"plot_receptive_field: the {kh} x {kw} window does not fit the padded "
                         f"[{H}, {W}] image: the output would be [{OH}, {OW}]")  # fmt: skip
    rows, cols = _span(out_rows, "out_rows"), _span(out_cols, "out_cols")
    if rows.start < 0 or rows.stop > OH or cols.start < 0 or cols.stop > OW:
        raise ValueError(f"plot_receptive_field: output rows {rows.start}..{rows.stop - 1} and "
                         f"columns {cols.start}..{cols.stop - 1} are not all inside the "
                         f"[{OH}, {OW}] output")  # fmt: skip
    read = _receptive_field(kh, kw, (sh, sw), (ph, pw), (dh, dw), rows, cols)
    if ax is None:
        size = max(H + 2 * ph, W + 2 * pw)
        _, ax = plt.subplots(figsize=(min(0.45 * size + 1, 8), min(0.45 * size + 1, 8)))

    for ih in range(-ph, H + ph):
        for iw in range(-pw, W + pw):
            in_image = 0 <= ih < H and 0 <= iw < W
            if in_image:
                gid = "read" if (ih, iw) in read else "image"
            else:
                gid = "read padding" if (ih, iw) in read else "padding"
            color = {"image": IMAGE_COLOR, "padding": PADDING_COLOR, "read": READ_COLOR,
                     "read padding": READ_PADDING_COLOR}[gid]  # fmt: skip
            ax.add_patch(Rectangle((iw, ih), 1, 1, facecolor=color, edgecolor="white",
                                   linewidth=1, label=f"({ih}, {iw})", gid=gid))  # fmt: skip
    ax.add_patch(Rectangle((0, 0), W, H, fill=False, edgecolor=BOUNDARY_COLOR, linewidth=2.5,
                           gid="image boundary"))  # fmt: skip

    ax.set_xlim(-pw, W + pw)
    ax.set_ylim(H + ph, -ph)  # row -ph at the top
    ax.set_aspect("equal")
    step = max(1, (max(H, W) + 2 * max(ph, pw)) // 16)  # about 16 labelled ticks at most
    ax.set_xticks([iw + 0.5 for iw in range(-pw, W + pw, step)],
                  [str(iw) for iw in range(-pw, W + pw, step)])  # fmt: skip
    ax.set_yticks([ih + 0.5 for ih in range(-ph, H + ph, step)],
                  [str(ih) for ih in range(-ph, H + ph, step)])  # fmt: skip
    ax.tick_params(length=0, labelsize=8)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("input column iw")
    ax.set_ylabel("input row ih")
    # the taps of the tile's first output pixel: one window of the kernel
    first = _receptive_field(kh, kw, (sh, sw), (ph, pw), (dh, dw), rows[:1], cols[:1])
    ax.plot([iw + 0.5 for _, iw in sorted(first)], [ih + 0.5 for ih, _ in sorted(first)], "o",
            color="black", markersize=4, gid="first window")  # fmt: skip
    n_padding = sum(1 for ih, iw in read if not (0 <= ih < H and 0 <= iw < W))
    ax.set_title(
        f"{kh}x{kw} kernel, stride {_pair_text(sh, sw)}, padding {_pair_text(ph, pw)}, "
        f"dilation {_pair_text(dh, dw)}\noutput {_span_text('row', rows)}, "
        f"{_span_text('column', cols)} of [{OH}, {OW}] read {len(read)} input positions, "
        f"{n_padding} in the padding",
        pad=28, fontsize=10,
    )  # fmt: skip
    legend = [
        Patch(facecolor=IMAGE_COLOR, edgecolor="black", label="image, not read"),
        Patch(facecolor=PADDING_COLOR, edgecolor="black", label="padding, not read"),
        Patch(facecolor=READ_COLOR, edgecolor="black", label="read"),
        Patch(facecolor=READ_PADDING_COLOR, edgecolor="black", label="read in the padding (0)"),
        Patch(fill=False, edgecolor=BOUNDARY_COLOR, linewidth=2.5, label="image boundary"),
        Line2D([], [], marker="o", color="black", linestyle="none", markersize=4,
               label=f"window of output ({rows.start}, {cols.start})"),
    ]  # fmt: skip
    # below the grid, so that figures side by side do not cover each other
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=3,
              fontsize=8, frameon=False)  # fmt: skip
    return ax
