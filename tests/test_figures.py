"""course_lib.figures: the tile map draws one labelled rectangle per program."""

import re

import matplotlib

matplotlib.use("Agg")  # no display needed: the figures are only saved

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from course_lib.figures import plot_tile_map  # noqa: E402

LABEL = re.compile(r"^\((\d+), (\d+)\)$")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _tiles(ax: Axes) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and LABEL.match(p.get_label())]


@pytest.mark.parametrize(
    "M, N, BLOCK_M, BLOCK_N, grid",
    [
        pytest.param(70, 100, 32, 32, (3, 4), id="M70-N100-32x32"),
        pytest.param(64, 64, 32, 32, (2, 2), id="M64-N64-exact"),
        pytest.param(1, 300, 16, 128, (1, 3), id="M1-N300-one-row"),
        pytest.param(37, 61, 32, 128, (2, 1), id="M37-N61-smaller-than-a-tile-across"),
    ],
)
def test_one_labelled_rectangle_per_program(M, N, BLOCK_M, BLOCK_N, grid):
    ax = plot_tile_map(M, N, BLOCK_M, BLOCK_N)
    assert isinstance(ax, Axes)
    labels = sorted(tuple(map(int, LABEL.match(t.get_label()).groups())) for t in _tiles(ax))
    assert labels == [(m, n) for m in range(grid[0]) for n in range(grid[1])]
    for tile in _tiles(ax):
        pid_m, pid_n = map(int, LABEL.match(tile.get_label()).groups())
        assert tile.get_xy() == (pid_n * BLOCK_N, pid_m * BLOCK_M)  # columns across, rows down
        assert (tile.get_height(), tile.get_width()) == (BLOCK_M, BLOCK_N)


def test_partial_tiles_are_the_bottom_row_and_right_column():
    # 70 = 32 + 32 + 6 rows and 100 = 3 * 32 + 4 columns: 3 + 4 - 1 tiles overhang
    ax = plot_tile_map(70, 100, 32, 32)
    partial = {t.get_label() for t in _tiles(ax) if t.get_gid() == "partial"}
    full = {t.get_label() for t in _tiles(ax) if t.get_gid() == "full"}
    assert len(partial) == 6 and len(full) == 6
    assert partial == {"(2, 0)", "(2, 1)", "(2, 2)", "(0, 3)", "(1, 3)", "(2, 3)"}
    colors = {t.get_gid(): t.get_facecolor() for t in _tiles(ax)}
    assert colors["partial"] != colors["full"]


def test_no_partial_tiles_when_the_blocks_divide_the_matrix():
    ax = plot_tile_map(64, 96, 32, 32)
    assert {t.get_gid() for t in _tiles(ax)} == {"full"}


def test_matrix_boundary_is_drawn():
    ax = plot_tile_map(70, 100, 32, 32)
    (boundary,) = [p for p in ax.patches if p.get_gid() == "matrix"]
    assert boundary.get_xy() == (0, 0)
    assert (boundary.get_width(), boundary.get_height()) == (100, 70)


def test_labels_are_written_on_small_maps():
    ax = plot_tile_map(70, 100, 32, 32)
    assert sorted(t.get_text() for t in ax.texts) == sorted(t.get_label() for t in _tiles(ax))


def test_draws_into_a_given_axes():
    _, ax = plt.subplots()
    assert plot_tile_map(10, 10, 4, 4, ax=ax) is ax


def test_saves_to_png(tmp_path):
    ax = plot_tile_map(70, 100, 32, 32)
    path = tmp_path / "tile_map.png"
    ax.figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("bad", [0, -4, 2.5])
def test_rejects_sizes_that_are_not_positive_ints(bad):
    with pytest.raises(ValueError, match="positive int"):
        plot_tile_map(10, 10, bad, 4)


# --- plot_program_order: the order in which programs visit the tiles of C (lesson 05)

from course_lib.figures import plot_program_order  # noqa: E402


def _visit_order(ax: Axes) -> list[list[int]]:
    """The pid drawn on each tile, as rows of tiles."""
    tiles = [p for p in ax.patches if p.get_gid() == "tile"]
    n_rows = max(int(t.get_y()) for t in tiles) + 1
    n_cols = max(int(t.get_x()) for t in tiles) + 1
    order = [[-1] * n_cols for _ in range(n_rows)]
    for t in tiles:
        assert (t.get_width(), t.get_height()) == (1, 1)
        order[int(t.get_y())][int(t.get_x())] = int(t.get_label())
    return order


def test_program_order_row_major():
    assert _visit_order(plot_program_order(3, 4)) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]


def test_program_order_grouped_with_a_short_last_group():
    # bands of 2 tile rows, walked down each column; the fifth row is a band of its own
    assert _visit_order(plot_program_order(5, 3, GROUP_M=2)) == [
        [0, 2, 4],
        [1, 3, 5],
        [6, 8, 10],
        [7, 9, 11],
        [12, 13, 14],
    ]


def test_program_order_one_row_per_group_is_row_major():
    assert _visit_order(plot_program_order(4, 5, GROUP_M=1)) == _visit_order(
        plot_program_order(4, 5)
    )


def test_program_order_one_group_taller_than_the_matrix_is_column_major():
    assert _visit_order(plot_program_order(3, 2, GROUP_M=8)) == [[0, 3], [1, 4], [2, 5]]


@pytest.mark.parametrize("M_tiles, N_tiles, GROUP_M", [(7, 9, 3), (16, 16, 8), (1, 5, 4)])
def test_program_order_visits_every_tile_once(M_tiles, N_tiles, GROUP_M):
    order = _visit_order(plot_program_order(M_tiles, N_tiles, GROUP_M=GROUP_M))
    assert sorted(pid for row in order for pid in row) == list(range(M_tiles * N_tiles))


def test_program_order_outlines_the_groups():
    ax = plot_program_order(5, 3, GROUP_M=2)
    bands = [p for p in ax.patches if p.get_gid() == "group"]
    assert [(b.get_y(), b.get_height()) for b in bands] == [(0, 2), (2, 2), (4, 1)]
    assert not [p for p in plot_program_order(5, 3).patches if p.get_gid() == "group"]


def test_program_order_writes_the_pids_on_small_maps():
    ax = plot_program_order(3, 4, GROUP_M=2)
    assert sorted(int(t.get_text()) for t in ax.texts) == list(range(12))


def test_program_order_draws_into_a_given_axes():
    _, ax = plt.subplots()
    assert plot_program_order(2, 2, ax=ax) is ax


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_program_order_rejects_sizes_that_are_not_positive_ints(bad):
    with pytest.raises(ValueError, match="positive int"):
        plot_program_order(4, 4, GROUP_M=bad)


# --- plot_receptive_field: the input pixels one tile of a conv2d's output reads (lesson 06)

from course_lib.figures import plot_receptive_field  # noqa: E402

LABEL_SIGNED = re.compile(r"^\((-?\d+), (-?\d+)\)$")  # (ih, iw), negative in the padding


def _squares(ax: Axes) -> dict[tuple[int, int], str]:
    """Each input position drawn, (ih, iw) -> its gid, checked against where it is drawn."""
    squares = {}
    for p in ax.patches:
        if isinstance(p, Rectangle) and LABEL_SIGNED.match(p.get_label()):
            ih, iw = map(int, LABEL_SIGNED.match(p.get_label()).groups())
            assert p.get_xy() == (iw, ih) and (p.get_width(), p.get_height()) == (1, 1)
            squares[(ih, iw)] = p.get_gid()
    return squares


def _read_by_brute_force(H, W, kh, kw, stride, padding, dilation, rows, cols):
    """Positions read, by looping over output pixels and taps as a direct kernel does."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    read = set()
    for oh in rows:
        for ow in cols:
            for r in range(kh):
                for s in range(kw):
                    read.add((oh * sh - ph + r * dh, ow * sw - pw + s * dw))
    return read


@pytest.mark.parametrize(
    "H, W, kh, kw, stride, padding, dilation, rows, cols",
    [
        pytest.param(6, 6, 3, 3, (1, 1), (1, 1), (1, 1), range(0, 2), range(0, 2), id="3x3-s1-p1"),
        pytest.param(9, 9, 3, 3, (2, 2), (1, 1), (1, 1), range(0, 2), range(1, 3), id="3x3-s2-p1"),
        pytest.param(7, 5, 3, 3, (1, 1), (2, 2), (2, 2), range(0, 1), range(0, 3), id="3x3-d2-p2"),
        pytest.param(5, 8, 5, 3, (1, 2), (2, 1), (1, 1), range(3, 5), range(0, 4), id="5x3-pairs"),
        pytest.param(4, 4, 1, 1, (1, 1), (0, 0), (1, 1), range(0, 4), range(0, 4), id="1x1-p0"),
    ],
)
def test_receptive_field_marks_exactly_what_the_tile_reads(
    H, W, kh, kw, stride, padding, dilation, rows, cols
):
    ax = plot_receptive_field(H, W, kh, kw, stride, padding, dilation, rows, cols)
    assert isinstance(ax, Axes)
    squares = _squares(ax)
    (ph, pw) = padding
    assert set(squares) == {(ih, iw) for ih in range(-ph, H + ph) for iw in range(-pw, W + pw)}
    read = _read_by_brute_force(H, W, kh, kw, stride, padding, dilation, rows, cols)
    for (ih, iw), gid in squares.items():
        in_image = 0 <= ih < H and 0 <= iw < W
        expected = {
            (True, True): "read",
            (True, False): "image",
            (False, True): "read padding",
            (False, False): "padding",
        }[(in_image, (ih, iw) in read)]
        assert gid == expected, (ih, iw)


def test_receptive_field_shades_padding_apart_from_the_image():
    ax = plot_receptive_field(6, 6, 3, 3, stride=1, padding=1, out_rows=(0, 2), out_cols=(0, 2))
    colors = {}
    for p in ax.patches:
        if p.get_gid() in ("image", "padding", "read", "read padding"):
            colors.setdefault(p.get_gid(), set()).add(p.get_facecolor())
    assert all(len(shades) == 1 for shades in colors.values())
    assert len({shades.pop() for shades in colors.values()}) == 4
    # a 2 x 2 tile in the corner: a 4 x 4 window, of which the top row and left column are padding
    gids = list(_squares(ax).values())
    assert (gids.count("read"), gids.count("read padding")) == (9, 7)
    assert gids.count("padding") + gids.count("read padding") == 8 * 8 - 6 * 6


def test_receptive_field_marks_the_window_of_the_first_output_pixel():
    ax = plot_receptive_field(9, 9, 3, 3, stride=2, padding=1, out_rows=(1, 3), out_cols=(2, 4))
    (dots,) = [line for line in ax.lines if line.get_gid() == "first window"]
    taps = {(int(y - 0.5), int(x - 0.5)) for x, y in zip(dots.get_xdata(), dots.get_ydata())}
    assert taps == {(1 + r, 3 + s) for r in range(3) for s in range(3)}  # oh=1, ow=2, stride 2


def test_receptive_field_takes_ranges_or_pairs_and_draws_into_a_given_axes():
    _, ax = plt.subplots()
    assert plot_receptive_field(6, 6, 3, 3, 1, 1, 1, range(0, 2), range(1, 3), ax=ax) is ax
    other = plot_receptive_field(6, 6, 3, 3, 1, 1, 1, (0, 2), (1, 3))
    assert _squares(ax) == _squares(other)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param(dict(out_rows=(0, 7)), "not all inside", id="tile-past-the-output"),
        pytest.param(dict(out_cols=(2, 2)), "non-empty range", id="empty-tile"),
        pytest.param(dict(stride=0), "stride", id="stride-0"),
        pytest.param(dict(padding=-1), "padding", id="negative-padding"),
        pytest.param(dict(padding="same"), "padding", id="padding-string"),
        pytest.param(dict(kh=9), "does not fit", id="kernel-larger-than-the-image"),
    ],
)
def test_receptive_field_rejects_what_is_not_a_tile_of_the_output(kwargs, match):
    args = dict(H=6, W=6, kh=3, kw=3, stride=1, padding=1, dilation=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plot_receptive_field(**args)
