"""The grader's trusted side against what a hostile run leaves behind, how submissions are
collected, a disk that fills up, and the sandbox's command line. No lesson runs here: each
test stands up the one file or folder it needs."""

import errno
import io
import os
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

from course_lib import grader
from course_lib.builder import NOTEBOOKS, SOLUTIONS
from course_lib.grader import sandbox
from course_lib.grader.results import DiskFull, ExerciseGrade, ResultsWriter
from course_lib.grader.sandbox import Unusable, load_records, read_regular

LESSON = "01_vector_add"


# -- reading what the child left ---------------------------------------------------------


def test_a_regular_file_is_read_whole(tmp_path):
    (tmp_path / "a.json").write_bytes(b"{}")
    assert read_regular(str(tmp_path / "a.json"), 10) == b"{}"
    assert read_regular(str(tmp_path / "missing.json"), 10) is None


def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "progress.jsonl")  # no writer: a blocking open would never return
    with pytest.raises(Unusable, match="not a regular file"):
        read_regular(str(tmp_path / "progress.jsonl"), 1024)


@pytest.mark.parametrize("target", ["/dev/zero", "/etc/hostname", "elsewhere.json"])
def test_a_link_is_refused_wherever_it_points(tmp_path, target):
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "exercise-0.json").symlink_to(target)
    with pytest.raises(Unusable, match="a link"):
        read_regular(str(tmp_path / "exercise-0.json"), 1024)


def test_a_device_is_refused(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Unusable, match="not a regular file"):
            read_regular("/dev/zero", 1024)
        (tmp_path / "x").write_text("1")
        assert read_regular("x", 10, dir_fd=fd) == b"1"  # relative to the job folder
    finally:
        os.close(fd)


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path):
    with (tmp_path / "exercise-0.json").open("wb") as f:
        f.truncate(2**40)  # a sparse terabyte: reading it would never end
    with pytest.raises(Unusable, match="larger than"):
        read_regular(str(tmp_path / "exercise-0.json"), 100_000)


def _saved(records) -> bytes:
    buffer = io.BytesIO()
    torch.save(records, buffer)
    return buffer.getvalue()


def test_records_load_when_stored_as_torch_saves_them():
    data = _saved([{"check": "add", "output": torch.arange(4.0)}])
    assert torch.equal(load_records(data)[0]["output"], torch.arange(4.0))


def test_a_compressed_record_that_would_expand_is_refused_before_it_expands():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\0" * (64 * 2**20))  # 64 MiB of zeros
    assert len(buffer.getvalue()) < 2**20
    with pytest.raises(Unusable, match="compressed"):
        load_records(buffer.getvalue())


def test_records_that_unpack_past_the_cap_are_refused():
    data = _saved([{"output": torch.zeros(1024)}])
    with pytest.raises(Unusable, match="unpack to more than"):
        load_records(data, cap=1024)
    with pytest.raises(Unusable, match="not a torch.save file"):
        load_records(b"not a zip at all")


# -- job folders -------------------------------------------------------------------------


def test_each_job_folder_is_fresh_private_and_removed_whole():
    one, two = sandbox.JobFolder(), sandbox.JobFolder()
    try:
        assert one.path != two.path and not any(one.path.iterdir())
        assert one.path.stat().st_mode & 0o777 == 0o700
        assert one.parent.stat().st_mode & 0o777 == 0o711  # passable, not listable
        if os.geteuid() == 0:
            assert one.path.stat().st_uid == sandbox.SANDBOX_UID
        locked = one.path / "locked"
        locked.mkdir()
        (locked / "f").write_text("x")
        locked.chmod(0)
    finally:
        one.remove()
        two.remove()
    assert not one.parent.exists() and not two.parent.exists()


def test_the_sandbox_command_hides_mounts_back_and_drops_privilege(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    hidden = (tmp_path / "subs", SOLUTIONS)
    command = sandbox.bwrap_command(job, sandbox._trusted_sys_path([]), hidden)
    text = " ".join(command)
    for flag in ("--unshare-pid", "--unshare-net", "--die-with-parent", "--new-session",
                 "--disable-userns", "--ro-bind / /"):  # fmt: skip
        assert flag in text
    root = sandbox.course_root()
    assert f"--tmpfs {root} " in text  # solutions, notebooks, history
    assert f"--ro-bind {root / 'course_lib'} {root / 'course_lib'}" in text
    assert f"--bind {job} {job}" in text and text.count("--bind ") == 1  # its only writable
    if os.geteuid() == 0:
        assert f"--reuid={sandbox.SANDBOX_UID}" in text
    # a sys.path entry that is (or holds) a hidden folder is not mounted back over it
    home = Path.home().resolve()
    uncovering = " ".join(sandbox.bwrap_command(job, [str(home)], ()))
    assert f"--tmpfs {home}" in uncovering and f"--ro-bind {home} {home}" not in uncovering


def test_free_space_is_checked_before_a_run(tmp_path):
    sandbox.check_free_space([tmp_path / "new" / "results"], needed=1)
    with pytest.raises(OSError, match="free some space"):
        sandbox.check_free_space([tmp_path], needed=2**62)


def test_limits_reach_the_child_as_rlimits():
    limits = sandbox.Limits(notebook_s=100, memory_bytes=2**30, processes=64)
    assert limits.rlimits() == {
        "RLIMIT_NPROC": 64, "RLIMIT_FSIZE": 2 * sandbox.RECORDS_CAP, "RLIMIT_CPU": 160,
        "RLIMIT_CORE": 0, "RLIMIT_AS": 2**30,
    }  # fmt: skip
    assert "RLIMIT_AS" not in sandbox.Limits(memory_bytes=None).rlimits()  # a GPU's


@pytest.mark.parametrize("knows", [True, False], ids=["bwrap-0.8", "bwrap-0.6"])
def test_what_an_older_bwrap_cannot_enforce_is_printed(monkeypatch, knows):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(sandbox, "_bwrap_knows", lambda bwrap, option: knows)
    warnings = [line for line in sandbox.isolation_lines(sandbox.Limits()) if "older than" in line]
    if knows:
        assert warnings == []
    else:
        assert any("bound the private /tmp" in line for line in warnings)
        assert any("user namespaces of its own" in line for line in warnings)


# -- collecting submissions --------------------------------------------------------------


def _notebook(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.read(NOTEBOOKS / f"{LESSON}.ipynb", as_version=4), path)
    return path


def _found(paths):
    found, others = grader.find_submissions(paths, {LESSON})
    return {(s.student_id, s.path.name): s for s in found}, others


def test_links_are_refused_with_a_reason(tmp_path):
    class_ = tmp_path / "class"
    _notebook(class_ / "ada" / f"{LESSON}.ipynb")
    (class_ / "ben").mkdir()
    (class_ / "ben" / f"{LESSON}.ipynb").symlink_to(SOLUTIONS / f"{LESSON}.ipynb")
    (class_ / "cy").symlink_to(class_ / "ada")
    found, _ = _found([class_])
    assert found[("ada", f"{LESSON}.ipynb")].refused == ""
    assert "symbolic link" in found[("ben", f"{LESSON}.ipynb")].refused
    assert "symbolic link" in found[("cy", "cy")].refused


def test_a_hard_link_to_the_course_or_to_another_learner_is_refused(tmp_path):
    class_ = tmp_path / "class"
    ada = _notebook(class_ / "ada" / f"{LESSON}.ipynb")
    (class_ / "ben").mkdir()
    os.link(ada, class_ / "ben" / f"{LESSON}.ipynb")
    found, _ = _found([class_])
    assert "same file as ada" in found[("ben", f"{LESSON}.ipynb")].refused
    try:
        (class_ / "cy").mkdir()
        os.link(NOTEBOOKS / f"{LESSON}.ipynb", class_ / "cy" / f"{LESSON}.ipynb")
    except OSError:
        return  # another file system: a hard link cannot be made, nor handed in
    found, _ = _found([class_])
    assert "course's own" in found[("cy", f"{LESSON}.ipynb")].refused


def test_one_notebook_per_lesson_per_learner(tmp_path):
    ada = tmp_path / "class" / "ada"
    _notebook(ada / f"{LESSON}.ipynb")
    _notebook(ada / "old" / f"{LESSON}.ipynb")
    _notebook(ada / f"{LESSON} (copy).ipynb")
    found, others = grader.find_submissions([tmp_path / "class"], {LESSON})
    (graded,) = found
    assert graded.path == ada / f"{LESSON}.ipynb" and len(graded.others) == 2
    assert len(others) == 2 and any("(copy)" in o for o in others)


def test_submissions_inside_the_course_are_refused():
    for inside in (SOLUTIONS, NOTEBOOKS / f"{LESSON}.ipynb", sandbox.course_root().parent):
        with pytest.raises(grader.SubmissionsError, match="course"):
            grader.find_submissions([inside], {LESSON})


# -- a disk that fills up ----------------------------------------------------------------


def _grade(student):
    return ExerciseGrade(student, LESSON, "check-vector-add", 2, 2, "passed", "ok")


def test_a_full_disk_keeps_the_rows_written_and_still_gets_a_summary(tmp_path, monkeypatch):
    results = ResultsWriter(tmp_path / "r")
    results.add("ada", LESSON, [_grade("ada")])
    real_write = results._csv_file.write

    def full(data):  # half a row reaches the disk, then the disk is full
        real_write(bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results._csv_file, "write", full, raising=False)
    with pytest.raises(DiskFull):
        results.add("ben", LESSON, [_grade("ben")])
    with pytest.raises(DiskFull):  # and nothing more is written after that
        results.add("cy", LESSON, [_grade("cy")])
    summary = results.finish(["ben/01_vector_add.ipynb: the disk is full"])
    rows = (tmp_path / "r" / "grades.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("ada,")  # the header and ada's whole row
    assert "ben/01" in (tmp_path / "r" / "summary.md").read_text() and "ben/01" in summary


def test_the_summary_room_is_reserved_at_the_start(tmp_path):
    with ResultsWriter(tmp_path / "r"):
        assert (tmp_path / "r" / "summary.md").stat().st_size >= 1024 * 1024


def test_a_full_disk_mid_run_ends_the_run_with_a_summary(tmp_path, monkeypatch):
    from test_grader import _needs_sandbox

    _needs_sandbox()
    for learner in ("ada", "ben", "cy"):
        _notebook(tmp_path / "subs" / learner / f"{LESSON}.ipynb")
    lesson = grader.load_lesson(NOTEBOOKS / f"{LESSON}.ipynb")

    def graded(sub, lesson_, *_):
        return grader._zero_rows(sub, lesson, "not run in this test")

    added = []

    def add(self, student_id, assignment, grades, real=ResultsWriter.add):
        if added:  # the second notebook finds the disk full
            raise DiskFull(errno.ENOSPC, "the disk holding the results is full")
        added.append(student_id)
        real(self, student_id, assignment, grades)

    monkeypatch.setattr(grader, "grade_submission", graded)
    monkeypatch.setattr(ResultsWriter, "add", add)
    code = grader.main([str(tmp_path / "subs"), "--out", str(tmp_path / "r"), "--workers", "1"])
    assert code == 3
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "disk holding the results is full" in summary
    assert "1 learner graded" in summary
    left = {"ada", "ben", "cy"} - set(added)
    assert all(f"{learner}/01" in summary.replace("\\", "") for learner in left)
    rows = (tmp_path / "r" / "grades.csv").read_text().splitlines()
    assert len(rows) == 3 and all(r.startswith(added[0]) for r in rows[1:])  # whole rows
