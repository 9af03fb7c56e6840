"""The builder: stubs, metadata, safety of learners' edits."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_lib import builder, recordings

SOLVED = """\
@triton.jit
def k(x_ptr, BLOCK_SIZE: tl.constexpr):
    # TODO(1): load (1 line)
    ### BEGIN SOLUTION
    x = tl.load(x_ptr + tl.arange(0, BLOCK_SIZE))
    ### END SOLUTION


def launch(x):
    # TODO(2): launch (1 line)
    ### BEGIN SOLUTION
    k[(1,)](x, BLOCK_SIZE=16)
    ### END SOLUTION
    return x
"""

SOLUTION_META = {
    "nbgrader": {
        "grade": False,
        "grade_id": "ex-k",
        "locked": False,
        "schema_version": 3,
        "solution": True,
        "task": False,
    }
}


def _lesson(tmp_path, source=SOLVED):
    src, out = tmp_path / "solutions", tmp_path / "notebooks"
    src.mkdir()
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Lesson"),
            new_code_cell(source, metadata=SOLUTION_META),
            new_code_cell(
                "check(launch)", outputs=[new_output("stream", name="stdout", text="ok")]
            ),
        ]
    )
    nbformat.write(nb, src / "01_k.ipynb")
    return src, out


def test_stub_replaces_each_region_by_kind():
    stubbed = builder.stub_source(SOLVED, "ex-k", "cell")
    assert "tl.load(x_ptr" not in stubbed and "k[(1,)]" not in stubbed
    assert "    tl.static_assert(False, \"Exercise 'ex-k': replace this line" in stubbed
    assert "    raise course_lib.ExerciseNotDone(\"Exercise 'ex-k': replace this line" in stubbed
    assert "# TODO(1): load (1 line)" in stubbed and "    return x" in stubbed
    compile(stubbed, "stub", "exec")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = 1\n### BEGIN SOLUTION\ny = 2\n", "never closed"),
        ("### END SOLUTION\n", "without BEGIN"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside another region"),
        ("x = 1\n", "without a ### BEGIN SOLUTION region"),
        (
            "@triton.jit\ndef k():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION\n",
            "put one in the launcher too",
        ),
        ("def f(:\n", "does not parse"),
    ],
    ids=["unclosed", "stray-end", "nested", "no-region", "kernel-only", "syntax"],
)
def test_bad_solution_cells_are_refused_with_the_place(source, message):
    with pytest.raises(builder.BuildError, match=message):
        builder.stub_source(source, "ex", "solutions/x.ipynb, cell 3")


def test_build_clears_outputs_keeps_metadata_and_check_flags_stale(tmp_path):
    src, out = _lesson(tmp_path)
    assert builder.build_all(check=True, src_dir=src, out_dir=out) == ["01_k.ipynb"]
    assert builder.build_all(src_dir=src, out_dir=out) == ["01_k.ipynb"]
    nb = nbformat.read(out / "01_k.ipynb", as_version=4)
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")
    assert nb.cells[1].metadata["nbgrader"]["grade_id"] == "ex-k"
    assert nb.metadata["course"]["generated_from"].endswith("01_k.ipynb")
    assert builder.build_all(check=True, src_dir=src, out_dir=out) == []


def test_learners_edits_are_kept_unless_forced_then_backed_up(tmp_path, capsys):
    src, out = _lesson(tmp_path)
    builder.build_all(src_dir=src, out_dir=out)
    target = out / "01_k.ipynb"
    mine = nbformat.read(target, as_version=4)
    mine.cells[1].source = "my own answer"
    nbformat.write(mine, target)
    solved = nbformat.read(src / "01_k.ipynb", as_version=4)  # the lesson changes upstream
    solved.cells[0].source = "# Lesson, revised"
    nbformat.write(solved, src / "01_k.ipynb")

    assert builder.build_all(src_dir=src, out_dir=out) == []
    assert "has edits of yours" in capsys.readouterr().out
    assert nbformat.read(target, as_version=4).cells[1].source == "my own answer"

    builder.build_all(force=True, src_dir=src, out_dir=out)
    backups = list(out.glob("01_k.ipynb.bak-*"))
    assert len(backups) == 1
    assert nbformat.read(backups[0], as_version=4).cells[1].source == "my own answer"
    assert nbformat.read(target, as_version=4).cells[0].source == "# Lesson, revised"


def test_markers_outside_exercise_cells_are_refused(tmp_path):
    src, out = _lesson(tmp_path)
    nb = nbformat.read(src / "01_k.ipynb", as_version=4)
    nb.cells[2].source = "### BEGIN SOLUTION\nx = 1\n### END SOLUTION"
    nbformat.write(nb, src / "01_k.ipynb")
    with pytest.raises(builder.BuildError, match="without nbgrader solution metadata"):
        builder.build_all(src_dir=src, out_dir=out)


def test_answer_lines_lists_what_must_not_leak():
    assert builder.answer_lines(SOLVED) == [
        "x = tl.load(x_ptr + tl.arange(0, BLOCK_SIZE))",
        "k[(1,)](x, BLOCK_SIZE=16)",
    ]


def test_gpu_outputs_are_adopted_into_gpu_only_cells_only(tmp_path):
    src = tmp_path / "solutions"
    src.mkdir()
    timing = 'if course_lib.gpu_only("Timing"):\n    print(1)'
    solved = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell(timing)])
    nbformat.write(solved, src / "01_k.ipynb")
    executed_dir = tmp_path / "executed"
    executed_dir.mkdir()
    ran = new_notebook(cells=[
        ENVIRONMENT_CELL,
        new_code_cell("x = 1", outputs=[new_output("stream", name="stdout", text="noise")]),
        new_code_cell(timing, execution_count=2,
                      outputs=[new_output("stream", name="stdout", text="1.23 ms"),
                                       new_output("stream", name="stderr", text="tqdm 50%")]),
    ])  # fmt: skip
    nbformat.write(ran, executed_dir / "01_k.ipynb")
    assert builder.adopt_gpu_outputs(executed_dir, src_dir=src) == ["01_k.ipynb"]
    result = nbformat.read(src / "01_k.ipynb", as_version=4)
    assert result.cells[0].outputs == []
    assert [o["text"] for o in result.cells[1].outputs] == ["1.23 ms"]
    assert result.cells[1].execution_count == 2  # nbval wants a count where there are outputs
    ran_on = result.cells[1].metadata["course"]["recorded_on"]
    assert ran_on.startswith(f"{GPU} · 20")  # and the day it ran
    assert builder.adopt_gpu_outputs(executed_dir, src_dir=src) == []


GPU = "NVIDIA H100 80GB HBM3 · torch 2.11.0 · triton 3.6.0"
ENVIRONMENT_CELL = new_code_cell(
    "import course_lib\n\ncourse_lib.show_environment()",
    outputs=[new_output("stream", name="stdout", text=f"Mode: GPU: {GPU}\n")],
)
TIMING = 'if course_lib.gpu_only("Timing"):\n    print(1)'


def test_outputs_of_an_interpreter_run_are_not_adopted(tmp_path, capsys):
    src, executed_dir = tmp_path / "solutions", tmp_path / "executed"
    src.mkdir()
    executed_dir.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(TIMING)]), src / "01_k.ipynb")
    interpreter = "Mode: interpreter (no CUDA GPU in use) · torch 2.13.0 · triton 3.9.0\n"
    ran = new_notebook(cells=[
        new_code_cell(ENVIRONMENT_CELL.source,
                      outputs=[new_output("stream", name="stdout", text=interpreter)]),
        new_code_cell(TIMING, execution_count=2,
                      outputs=[new_output("stream", name="stdout", text="⏭ skipped")]),
    ])  # fmt: skip
    nbformat.write(ran, executed_dir / "01_k.ipynb")
    assert builder.adopt_gpu_outputs(executed_dir, src_dir=src) == []
    assert "did not run on a GPU" in capsys.readouterr().out
    assert nbformat.read(src / "01_k.ipynb", as_version=4).cells[0].outputs == []


def _recorded_lesson(tmp_path):
    src, out = _lesson(tmp_path)
    nb = nbformat.read(src / "01_k.ipynb", as_version=4)
    recorded = [new_output("stream", name="stdout", text="1.23 ms\n")]
    recording = {"recorded_on": GPU, "source_sha": builder._source_sha(TIMING)}
    nb.cells.append(new_code_cell(TIMING, execution_count=3, outputs=recorded,
                                  metadata={"course": recording}))  # fmt: skip
    nb.cells.append(new_code_cell('if course_lib.gpu_only("Unrecorded"):\n    print(2)'))
    nbformat.write(nb, src / "01_k.ipynb")
    return src, out


def test_exercise_notebooks_and_recordings_keep_the_recorded_gpu_run(tmp_path):
    src, out = _recorded_lesson(tmp_path)
    recordings_dir = tmp_path / "gpu_recordings"
    assert builder.build_all(src_dir=src, out_dir=out) == ["gpu_recordings/01_k.json", "01_k.ipynb"]
    cells = nbformat.read(out / "01_k.ipynb", as_version=4).cells
    assert [o["text"] for o in cells[3].outputs] == [builder.label_for(GPU), "1.23 ms\n"]
    assert GPU in cells[3].outputs[0]["text"]
    assert cells[4].outputs == [] and cells[2].outputs == []  # unrecorded, and not GPU-only
    (entry,) = json.loads((recordings_dir / "01_k.json").read_text())
    assert (entry["step"], entry["recorded_on"]) == ("Timing", GPU)
    assert entry["source"] == TIMING and entry["outputs"][0]["text"] == "1.23 ms\n"
    assert builder.build_all(check=True, src_dir=src, out_dir=out) == []

    nb = nbformat.read(src / "01_k.ipynb", as_version=4)
    nb.cells[3].source = TIMING.replace("print(1)", "print(10)")  # the code changed since
    nbformat.write(nb, src / "01_k.ipynb")
    builder.build_all(src_dir=src, out_dir=out)
    assert nbformat.read(out / "01_k.ipynb", as_version=4).cells[3].outputs == []
    assert not (recordings_dir / "01_k.json").exists()

    nb.cells[3].source = TIMING
    nbformat.write(nb, src / "01_k.ipynb")
    builder.build_all(src_dir=src, out_dir=out)
    assert (recordings_dir / "01_k.json").exists()
    (src / "01_k.ipynb").unlink()  # a lesson removed: its recording goes too
    assert builder.build_all(check=True, src_dir=src, out_dir=out) == ["gpu_recordings/01_k.json"]
    builder.build_all(src_dir=src, out_dir=out)
    assert not (recordings_dir / "01_k.json").exists()


def test_a_recording_is_found_by_its_cell_or_by_a_step_only_one_cell_runs(monkeypatch):
    entries = (
        {"step": "Timing", "source": "A", "recorded_on": GPU, "outputs": []},
        {"step": "Timing", "source": "B", "recorded_on": GPU, "outputs": []},
        {"step": "The sweep", "source": "C", "recorded_on": GPU, "outputs": []},
    )
    monkeypatch.setattr(recordings, "_all", lambda: entries)
    assert recordings.find("Timing", "B\n") is entries[1]
    assert recordings.find("The sweep", "C, edited by a learner") is entries[2]
    assert recordings.find("Timing", "A, edited by a learner") is None  # which one? say nothing
    assert recordings.find("Not recorded", None) is None
