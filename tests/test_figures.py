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
