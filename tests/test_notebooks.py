"""The lesson notebooks: generated copies are fresh, hold no answer, and stop at the exercise.

The solved notebooks themselves run top to bottom under nbval (pytest collects solutions/).
"""

import ast

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import course_lib
from course_lib import builder, recordings

SOLUTIONS = sorted(builder.SOLUTIONS.glob("*.ipynb"))
LESSONS = [pytest.param(p.name, id=p.stem) for p in SOLUTIONS if not builder.is_appendix(p)]
APPENDICES = [pytest.param(p.name, id=p.stem) for p in SOLUTIONS if builder.is_appendix(p)]
FIRST_CELL = ["import course_lib", "course_lib.show_environment()"]


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def test_there_are_lessons():
    assert len(LESSONS) >= 2


# appendices about Hopper's instructions: their GPU cells need compute capability 9.0
HOPPER_APPENDICES = {
    "05b_matmul_on_hopper.ipynb",
    "06b_conv2d_on_hopper.ipynb",
    "10b_attention_on_hopper.ipynb",
}


def test_appendices_are_named_after_their_lesson():
    assert [p.values[0] for p in APPENDICES] == [
        "05b_matmul_on_hopper.ipynb",
        "06b_conv2d_on_hopper.ipynb",
        "08b_what_a_call_costs.ipynb",
        "10b_attention_on_hopper.ipynb",
    ]
    assert not builder.is_appendix(builder.SOLUTIONS / "05_matmul.ipynb")
    lessons = {p.values[0][:2] for p in LESSONS}
    assert all(p.values[0][:2] in lessons for p in APPENDICES)


def _runs_gpu_work_unasked(source: str) -> bool:
    """Whether a cell's own statements (not the functions it defines) time or launch through
    bench or a fast path outside an `if course_lib.gpu_only(...)` block."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.If) and "gpu_only(" in ast.unparse(node.test):
            continue
        text = ast.unparse(node)
        if "bench." in text or "fast_paths." in text:
            return True
    return False


@pytest.mark.parametrize("name", APPENDICES)
def test_appendix_has_no_exercise_and_skips_plainly_without_its_gpu(name):
    nb = nbformat.read(builder.SOLUTIONS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [line for line in code[0].source.splitlines() if line.strip()] == FIRST_CELL
    assert not any(_nbgrader(c) for c in nb.cells)
    # every cell that times or launches GPU work asks first, and says in one line why it skips
    gpu_cells = [c.source for c in code[1:] if 'gpu_only("' in c.source]
    assert gpu_cells, "an appendix that measures nothing"
    for cell in code[1:]:
        assert not _runs_gpu_work_unasked(cell.source), cell.source
    if name in HOPPER_APPENDICES:
        for source in gpu_cells:
            assert "capability=(9, 0)" in source, source


# a markdown cell a learner reads in one go, and the longest lessons' share of reading
MAX_CELL_WORDS = 400
MAX_LESSON_WORDS = {
    "05_matmul.ipynb": 6500,
    "07_linear.ipynb": 6500,
    "08_torch_compile.ipynb": 6500,
    "10_attention.ipynb": 6500,
}


@pytest.mark.parametrize("name", [pytest.param(p.name, id=p.stem) for p in SOLUTIONS])
def test_markdown_keeps_to_the_word_limits(name):
    nb = nbformat.read(builder.SOLUTIONS / name, as_version=4)
    words = {i: len(c.source.split()) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"}
    long = {i: n for i, n in words.items() if n > MAX_CELL_WORDS}
    assert not long, f"solutions/{name}: markdown cells over {MAX_CELL_WORDS} words: {long}"
    limit = MAX_LESSON_WORDS.get(name)
    assert limit is None or sum(words.values()) <= limit, (
        f"solutions/{name}: {sum(words.values())} words of markdown, more than {limit}"
    )


def test_generated_notebooks_are_fresh():
    assert sorted(p.name for p in builder.NOTEBOOKS.glob("*.ipynb")) == [p.name for p in SOLUTIONS]
    stale = builder.build_all(check=True)
    assert stale == [], f"stale: {stale}; run ./course build"


@pytest.mark.parametrize("name", LESSONS)
def test_exercise_notebook_holds_no_answer(name):
    """No markers; no answer line left in an exercise cell; no answer copied whole elsewhere.

    Lines such as `mask = offsets < n_elements` are taught before the exercise, so a
    single line elsewhere is no leak; a whole answer region in one cell is.
    """
    solved = nbformat.read(builder.SOLUTIONS / name, as_version=4)
    exercise = nbformat.read(builder.NOTEBOOKS / name, as_version=4)
    text = "\n".join(c.source for c in exercise.cells)
    assert builder.BEGIN not in text and builder.END not in text
    pairs = [(s, e) for s, e in zip(solved.cells, exercise.cells) if _nbgrader(s).get("solution")]
    assert pairs, "a lesson without an exercise"
    for solved_cell, exercise_cell in pairs:
        outside = set(builder.stub_source(solved_cell.source, "x", name).splitlines())
        kept = {line.strip() for line in exercise_cell.source.splitlines()}
        leaked = [
            line
            for line in builder.answer_lines(solved_cell.source)
            if line in kept and line not in {o.strip() for o in outside}
        ]
        assert not leaked, f"answers left in the exercise cell of notebooks/{name}: {leaked}"
    for region in builder.answer_regions(solved):
        if len(region) < 2:
            continue
        for cell in exercise.cells:
            lines = [line.strip() for line in cell.source.splitlines()]
            assert not _contains_run(lines, region), f"notebooks/{name} repeats an answer"


def _contains_run(lines: list[str], run: list[str]) -> bool:
    return any(lines[i : i + len(run)] == run for i in range(len(lines) - len(run) + 1))


@pytest.mark.parametrize("name", LESSONS)
def test_solution_notebook_shape(name):
    nb = nbformat.read(builder.SOLUTIONS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [line for line in code[0].source.splitlines() if line.strip()] == FIRST_CELL
    checks = [c for c in code if _nbgrader(c).get("grade")]
    assert checks, "a lesson without a check cell"
    for cell in checks:
        assert cell.source.startswith("course_lib.check_") and "\n" not in cell.source.strip()
        assert "nbval-check-output" in cell.metadata.get("tags", [])
        assert any(o.get("text", "").startswith("✓ ") for o in cell.outputs), cell.source


@pytest.mark.notebooks
@pytest.mark.parametrize("name", LESSONS)
def test_exercise_notebook_stops_at_its_first_exercise(name):
    nb = nbformat.read(builder.NOTEBOOKS / name, as_version=4)
    first_exercise = next(i for i, c in enumerate(nb.cells) if _nbgrader(c).get("solution"))
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(builder.NOTEBOOKS)}},
    )
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert info.value.ename == "ExerciseNotDone", info.value
    failed = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.outputs)
    ]
    # the stub raises when the check cell right after the exercise calls the launcher
    check_cell = next(
        i for i in range(first_exercise + 1, len(nb.cells)) if nb.cells[i].cell_type == "code"
    )
    assert failed == [check_cell]


@pytest.mark.parametrize("name", [p.name for p in SOLUTIONS])
def test_gpu_outputs_in_solutions_are_recorded_runs_of_the_code_beside_them(name):
    nb = nbformat.read(builder.SOLUTIONS / name, as_version=4)
    unrecorded = [
        index
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        and cell.outputs
        and "gpu_only(" in cell.source
        and builder.recorded_run(cell) is None
    ]
    assert not unrecorded, (
        f"solutions/{name}, cells {unrecorded}: GPU outputs that no adopted run of the cell's "
        "current code made. Run the notebook on a GPU and adopt its outputs (README, For "
        "instructors), or clear them."
    )


@pytest.mark.notebooks
@pytest.mark.skipif(course_lib.MODE == "gpu", reason="on a GPU the cell measures live")
def test_a_gpu_only_cell_run_without_a_gpu_shows_its_recording():
    entry = next(e for e in recordings._all() if any("data" in o for o in e["outputs"]))
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import course_lib"),
            nbformat.v4.new_code_cell(entry["source"]),
        ]
    )
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert (
        f"needs a GPU: skipped in the interpreter.\n{recordings.label(entry['recorded_on'])}"
        in text
    )
    shown = [o.data for o in outputs if o.output_type == "display_data"]
    assert shown == [o["data"] for o in entry["outputs"] if o["output_type"] == "display_data"]
