"""Run one submission's lesson in a sandbox, and bring back only data.

The sandbox is bubblewrap's (``bwrap``, the one Flatpak is built on). Inside it:

- the whole file system is read-only; ``/tmp`` (also the home folder) is a fresh, small
  tmpfs; the only folder it can write on disk is its own job folder;
- the submissions, the results, the course's own folder (its solutions, its lesson
  notebooks, its history) and the instructor's home are empty tmpfs; only what Python
  needs is mounted back into them, read-only: the course's ``course_lib``, the virtual
  environment, the Python installation;
- no network, its own process IDs (when it ends, everything it started ends too), its own
  session, killed when the grader dies, and no further user namespaces;
- when the grader runs as root, the learner's code runs as uid 65534 (``nobody``), so
  file permissions protect what the mounts leave visible; otherwise it runs as the
  instructor's uid in a user namespace, with the read-only mounts as the protection;
- limits on memory (address space, in the interpreter), processes, file size and CPU
  time, set by the child before any learner code runs; no bytecode written.

The lesson's cells and the answers reach the process in its job folder (``job.json``),
never from the course's files. What it leaves there is read defensively: regular files
only, opened without following links and without blocking, every read and every
decompression capped; anything odd is the submission's failure (``Unusable``).

Without bwrap the grader refuses, unless told ``--unsandboxed``: then the process is
isolated only as a process (its own session and folder, a minimal environment).
"""

from __future__ import annotations

import errno
import functools
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from course_lib import runtime
from course_lib.grader.files import Unusable, read_regular
from course_lib.grader.lesson import Answers, Lesson

OUTPUT_CAP = 64 * 1024  # bytes of the child's printed output kept for the report
OUTCOME_CAP = 100_000  # bytes of one exercise's outcome file
PROGRESS_CAP = 1024 * 1024  # bytes of the progress file read at each look
RECORDS_CAP = 256 * 1024 * 1024  # bytes of one check's records, stored or unpacked
RECORDS_TOTAL_CAP = 512 * 1024 * 1024  # bytes of all of one notebook's records
TMPFS_BYTES = 512 * 1024 * 1024  # the sandbox's /tmp, in memory
SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup on Debian and Ubuntu
BOOT = (
    "import json, sys; job = json.load(open(sys.argv[1] + '/job.json'));"
    "sys.path[:0] = job['sys_path']; from course_lib.grader.child import main; main(sys.argv[1])"
)
_PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "SYSTEMROOT")
# system folders never hidden: a submissions folder here would hide the system itself
_SYSTEM = ("/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/dev",
           "/proc", "/sys", "/run", "/var", "/opt", "/srv", "/tmp", "/home", "/mnt", "/media",
           "/boot")  # fmt: skip
INSTALL_HINT = (
    "install bubblewrap: `sudo apt-get install bubblewrap` (Debian, Ubuntu), "
    "`sudo dnf install bubblewrap` (Fedora), or put a `bwrap` binary on PATH"
)


class Stopped(Exception):
    """The run was stopped (Ctrl-C) while this submission was running."""


class SandboxUnavailable(RuntimeError):
    """bwrap is missing, or cannot build the sandbox on this machine."""


@dataclass
class Limits:
    cell_s: float = 300.0
    notebook_s: float = 1200.0
    seed: int = 1  # moves every check's cases off the ones learners' check cells show
    sandboxed: bool = True  # False only with --unsandboxed
    hidden: tuple[Path, ...] = ()  # folders the learner's process must not see
    memory_bytes: int | None = 8 * 2**30  # address space; None: no limit (set on a GPU)
    processes: int = 256  # processes and threads of its own
    file_bytes: int = 2 * RECORDS_CAP  # the largest file it may write

    def rlimits(self) -> dict[str, int]:
        """What the child sets on itself before any learner code runs."""
        found = {
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_FSIZE": self.file_bytes,
            # CPU seconds: the notebook's limit and a margin, for a loop that hides its cells
            "RLIMIT_CPU": int(self.notebook_s) + 60,
            "RLIMIT_CORE": 0,
        }
        if self.memory_bytes is not None:
            found["RLIMIT_AS"] = self.memory_bytes
        return found


def default_memory_limit() -> int | None:
    """8 GiB of address space in the interpreter; none on a GPU, whose driver maps device
    memory into the address space (an address-space limit stops CUDA from starting)."""
    return 8 * 2**30 if runtime.INTERPRETED else None


# --- what the sandbox shows ----------------------------------------------------------------


def course_root() -> Path:
    return Path(__file__).resolve().parents[2]


def course_lib_dir() -> Path:
    return Path(__file__).resolve().parents[1]


def _trusted_sys_path(submissions: list[Path]) -> list[str]:
    root = str(course_root())
    submitted, here = [p.resolve() for p in submissions], Path.cwd().resolve()
    kept = [root]
    for entry in sys.path:
        if not entry or entry in kept:
            continue
        resolved = Path(entry).resolve()
        if resolved == here or any(resolved == s or s in resolved.parents for s in submitted):
            continue
        kept.append(entry)
    return kept


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _outermost(paths) -> list[Path]:
    unique = sorted({Path(p) for p in paths})
    return [p for p in unique if not any(o != p and o in p.parents for o in unique)]


def masked_folders(hidden: tuple[Path, ...], outermost: bool = True) -> list[Path]:
    """The folders the sandbox replaces with empty tmpfs: those asked for, the course's
    own folder where it is a checkout (solutions, notebooks, history), and the home
    folders of the instructor and of root (with `outermost`, none inside another)."""
    folders = [Path(p) for p in hidden]
    root = course_root()
    if any((root / name).exists() for name in ("solutions", "notebooks", ".git")):
        folders.append(root)
    folders += [Path.home(), Path("/root")]
    found = []
    for folder in folders:
        folder = folder if folder.is_dir() else folder.parent
        try:
            folder = folder.resolve()
        except OSError:
            continue
        if folder.is_dir() and str(folder) not in _SYSTEM and not _inside(folder, Path("/tmp")):
            found.append(folder)
    return _outermost(found) if outermost else sorted(set(found))


def needed_paths(sys_path: list[str]) -> list[Path]:
    """What the child needs from folders the sandbox masks: course_lib, the environment,
    the Python installation and every entry of its sys.path, each read-only."""
    found = [course_lib_dir()]
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)):
        found += [Path(p), Path(p).resolve()]
    found.append(Path(os.path.realpath(sys.executable)).parent)
    for entry in sys_path:
        path = Path(entry)
        if path.resolve() == course_root():
            continue  # the course's folder: only course_lib comes back
        if path.exists():
            found += [path, path.resolve()]
    return _outermost(p for p in found if p.exists())


def _gpu_devices() -> list[str]:
    if runtime.MODE != "gpu":
        return []
    devices = [str(p) for p in sorted(Path("/dev").glob("nvidia*"))]
    return devices + [str(p) for p in sorted(Path("/dev").glob("dri/*"))]


@functools.cache
def _bwrap_knows(bwrap: str, option: str) -> bool:
    """Whether this bwrap has `option` (--size and --disable-userns came with 0.7 and 0.8)."""
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return option in done.stdout + done.stderr


def bwrap_command(job_dir: Path, sys_path: list[str], hidden: tuple[Path, ...]) -> list[str]:
    """The bwrap command line (before the Python command) for a job folder."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bwrap is not installed: {INSTALL_HINT}")
    # every job's folder lies in the temporary folder: hidden too where it is not /tmp
    masked = masked_folders((*hidden, Path(tempfile.gettempdir())))
    command = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
               "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
               "--new-session", "--ro-bind", "/", "/", "--dev", "/dev",
               "--proc", "/proc"]  # fmt: skip
    for device in _gpu_devices():
        command += ["--dev-bind", device, device]
    size = ["--size", str(TMPFS_BYTES)] if _bwrap_knows(bwrap, "--size") else []
    command += ["--perms", "1777", *size, "--tmpfs", "/tmp"]
    for folder in masked:
        command += ["--tmpfs", str(folder)]
    cover = [*masked, Path("/tmp")]
    made: set[Path] = set()
    # the inner bwrap and setpriv run inside: their folders too (a bwrap unpacked in /tmp)
    tools = [shutil.which(t) for t in ("bwrap", "setpriv")] if os.geteuid() == 0 else []
    tool_dirs = [Path(os.path.realpath(t)).parent for t in tools if t]
    every_mask = masked_folders((*hidden, Path(tempfile.gettempdir())), outermost=False)
    for path in _outermost([*needed_paths(sys_path), *tool_dirs]):
        mask = next((m for m in cover if _inside(path, m)), None)
        if mask is None or any(_inside(m, path) for m in every_mask):
            continue  # not masked; or holding a masked folder, which it would uncover
        # the folders on the way, passable by the sandbox's uid (bwrap makes them 0700)
        for folder in reversed(path.parents):
            if mask in folder.parents and folder not in made:
                made.add(folder)
                command += ["--perms", "0755", "--dir", str(folder)]
        command += ["--ro-bind", str(path), str(path)]
    for folder in reversed(job_dir.parents):
        if any(m in folder.parents for m in cover) and folder not in made:
            made.add(folder)
            command += ["--perms", "0755", "--dir", str(folder)]
    command += ["--bind", str(job_dir), str(job_dir), "--chdir", str(job_dir)]
    inner = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    if _bwrap_knows(bwrap, "--disable-userns"):
        inner.insert(1, "--disable-userns")
    if os.geteuid() == 0:
        # bwrap as root mounts; the learner's process then runs as nobody, in a user
        # namespace of its own that nobody made (so it holds no privilege over anything)
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("setpriv (util-linux) is needed to grade as root")
        command += ["--", setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}",
                    "--clear-groups", "--no-new-privs", bwrap, *inner, "--dev-bind", "/", "/",
                    "--chdir", str(job_dir), "--die-with-parent"]  # fmt: skip
    else:
        command += inner
    return [*command, "--"]


@functools.cache
def _probe(hidden: tuple[Path, ...], sys_path: tuple[str, ...]) -> str | None:
    job = JobFolder()
    try:
        # Python starts, reads the course's child module and writes in its job folder
        check = "import sys; open(sys.argv[1]).read(1); open('probe', 'w').write('ok')"
        child = str(course_lib_dir() / "grader" / "child.py")
        command = [*bwrap_command(job.path, list(sys_path), hidden), sys.executable, "-I",
                   "-S", "-B", "-c", check, child]  # fmt: skip
        done = subprocess.run(command, capture_output=True, timeout=60, cwd="/", env=_base_env())
        if done.returncode != 0:
            return (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-800:]
        return None
    except (OSError, subprocess.SubprocessError) as error:
        return f"{type(error).__name__}: {error}"
    finally:
        job.remove()


def check_sandbox(hidden: tuple[Path, ...], submissions: list[Path]) -> None:
    """Raise SandboxUnavailable, saying what to do, unless the sandbox works here."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(f"bwrap is not installed: {INSTALL_HINT}")
    failure = _probe(tuple(hidden), tuple(_trusted_sys_path(submissions)))
    if failure:
        raise SandboxUnavailable(
            f"bwrap cannot build the sandbox on this machine: {failure}\n"
            "It needs user namespaces (sysctl kernel.unprivileged_userns_clone=1 where that "
            "setting exists, and user.max_user_namespaces above 0)"
            + (
                ", and, as root, the course and its Python readable by uid 65534"
                if os.geteuid() == 0
                else ""
            )  # fmt: skip
        )


def isolation_lines(limits: Limits) -> list[str]:
    """What is in force, for the instructor: printed before a run."""
    if not limits.sandboxed:
        return [
            "warning: grading UNSANDBOXED (--unsandboxed). The learner's code runs as your user: "
            "it can read and write everything you can (other submissions, the results, the "
            "course's solutions, your home), reach the network, and leave processes running "
            "after its run. Only the limits below hold. Grade this way only work you trust."
        ]
    who = (
        f"as uid {SANDBOX_UID} (nobody)"
        if os.geteuid() == 0
        else f"as your uid ({os.getuid()}) in a user namespace"
    )
    lines = [
        f"sandbox: bubblewrap; the learner's code runs {who}, the file system read-only but "
        "for its own job folder and a private /tmp, with no network and its own process IDs;",
        "  hidden from it: everything in /tmp, "
        + ", ".join(str(p) for p in masked_folders(limits.hidden))
        + " (but for the course's course_lib and the Python it needs, read-only)",
    ]
    bwrap = shutil.which("bwrap")
    if bwrap and not _bwrap_knows(bwrap, "--size"):
        lines.append(
            "warning: this bwrap (older than 0.7) cannot bound the private /tmp: files there "
            "take memory, each up to the file-size limit, and their number is not limited"
        )
    if bwrap and not _bwrap_knows(bwrap, "--disable-userns"):
        lines.append(
            "warning: this bwrap (older than 0.8) cannot stop the learner's code from making "
            "user namespaces of its own inside the sandbox"
        )
    return lines


def limit_lines(limits: Limits) -> str:
    memory = (
        f"{limits.memory_bytes / 2**30:g} GiB of address space"
        if limits.memory_bytes
        else "memory not limited (a GPU's driver needs the address space)"
    )
    return (
        f"limits: {limits.cell_s:g} s a cell, {limits.notebook_s:g} s a notebook, {memory}, "
        f"{limits.processes} processes, files up to {limits.file_bytes // 2**20} MiB"
    )


# --- job folders ---------------------------------------------------------------------------


class JobFolder:
    """A fresh, private folder for one run: mode 0700, owned by the sandbox's uid when the
    grader is root, inside a folder of its own (0711: passable, not listable)."""

    def __init__(self):
        self.parent = Path(tempfile.mkdtemp(prefix="course-grade-"))
        os.chmod(self.parent, 0o711)
        self.path = Path(tempfile.mkdtemp(prefix="job-", dir=self.parent))
        os.chmod(self.path, 0o700)
        if os.geteuid() == 0:
            os.chown(self.path, SANDBOX_UID, SANDBOX_GID)

    def remove(self) -> None:
        def unlock(function, path, _):
            # a folder the learner made unreadable: open it up, then try again
            with _suppress():
                os.chmod(path if os.path.isdir(path) else os.path.dirname(path), 0o700)
                function(path)

        shutil.rmtree(self.parent, onerror=unlock)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        return kind is not None and issubclass(kind, OSError)


def check_free_space(folders: list[Path], needed: int = 256 * 2**20) -> None:
    """Raise OSError(ENOSPC) with a clear message where a folder's disk is nearly full."""
    for folder in folders:
        probe = folder
        while not probe.exists():
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < needed:
            raise OSError(
                errno.ENOSPC,
                f"only {free // 2**20} MiB free under {probe}; grading needs {needed // 2**20} "
                "MiB there: free some space first",
            )


# --- reading what the child left -----------------------------------------------------------


def load_records(data: bytes, cap: int = RECORDS_CAP) -> list:
    """torch.load of a records file, checked first: a zip of stored (uncompressed) entries
    whose sizes add up to at most `cap`, so nothing expands while it is read."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as error:
        raise Unusable(f"its records are not a torch.save file ({error})") from None
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries):
        raise Unusable("its records are compressed, which torch.save never does")
    if sum(e.file_size for e in entries) > cap:
        raise Unusable(f"its records unpack to more than {cap // 2**20} MiB")
    records = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise Unusable("its records are not a list of records")
    return records


@dataclass
class SandboxRun:
    """What came back from one run: per exercise index, the child's outcome and records."""

    outcomes: dict[int, dict] = field(default_factory=dict)
    records: dict[int, list] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    cells: dict[int, str] = field(default_factory=dict)  # cell index -> "ok" / "error: ..."
    stopped_at: int | None = None  # the cell running when the process ended early
    ended: str = ""  # why it ended early: "timed out (cell)", "died (signal 9)", ...
    output: str = ""  # the child's printed output, capped


def _base_env() -> dict[str, str]:
    return {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}


def _environment(job_dir: Path, sandboxed: bool = True) -> dict[str, str]:
    env = _base_env()
    home = "/tmp" if sandboxed else str(job_dir)  # the sandbox's /tmp is its own tmpfs
    env.update(
        HOME=home,
        TMPDIR=home,
        LANG="C.UTF-8",
        MPLBACKEND="Agg",
        MPLCONFIGDIR=f"{home}/.matplotlib",
        TRITON_CACHE_DIR=str(job_dir / ".triton"),
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",  # several submissions run at once, one core each
    )
    if runtime.INTERPRETED:
        env["TRITON_INTERPRET"] = "1"
    return env


def _job(lesson: Lesson, answers: Answers, sys_path: list[str], limits: Limits) -> dict:
    cells = []
    for cell in lesson.cells:
        if cell["kind"] == "answer":
            cells.append({"kind": "answer", "source": answers.sources.get(cell["grade_id"], "")})
        else:
            cells.append({"kind": cell["kind"], "source": cell["source"]})
    exercises = [
        {"grade_id": e.grade_id, "checker": e.checker, "function": e.function}
        for e in lesson.exercises
    ]
    return {"cells": cells, "exercises": exercises, "sys_path": sys_path, "seed": limits.seed,
            "rlimits": limits.rlimits()}  # fmt: skip


def _drain(stream, kept: bytearray) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        if len(kept) < OUTPUT_CAP:
            kept += chunk[: OUTPUT_CAP - len(kept)]


def _progress(dir_fd: int) -> tuple[int | None, float | None, dict[int, str]]:
    """The cell running now and since when, and how finished cells ended."""
    running, since, ended = None, None, {}
    data = read_regular("progress.jsonl", PROGRESS_CAP, dir_fd)
    for line in (data or b"").splitlines():
        try:
            entry = json.loads(line)
            cell = int(entry["cell"])
        except (ValueError, KeyError, TypeError):
            continue
        if entry.get("event") == "start":
            try:
                running, since = cell, float(entry.get("time", time.time()))
            except (TypeError, ValueError):
                running, since = cell, time.time()
        elif entry.get("event") == "end":
            ended[cell] = str(entry.get("status", ""))[:500]
            running, since = None, None
    return running, since, ended


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    lesson: Lesson,
    answers: Answers,
    submissions: list[Path],
    limits: Limits,
    stop: threading.Event | None = None,
) -> SandboxRun:
    """Run the lesson with these answers in a fresh sandbox; raise Stopped if `stop` is set."""
    job = JobFolder()
    job_dir = job.path
    result = SandboxRun()
    dir_fd = None
    try:
        sys_path = _trusted_sys_path(submissions)
        (job_dir / "job.json").write_text(json.dumps(_job(lesson, answers, sys_path, limits)))
        if os.geteuid() == 0:
            os.chown(job_dir / "job.json", SANDBOX_UID, SANDBOX_GID)
        command = [sys.executable, "-I", "-B", "-c", BOOT, str(job_dir)]
        if limits.sandboxed:
            command = [*bwrap_command(job_dir, sys_path, limits.hidden), *command]
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        proc = subprocess.Popen(
            command,
            cwd=job_dir,
            env=_environment(job_dir, limits.sandboxed),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
        kept = bytearray()
        reader = threading.Thread(target=_drain, args=(proc.stdout, kept), daemon=True)
        reader.start()
        started = time.monotonic()
        try:
            while proc.poll() is None:
                if stop is not None and stop.is_set():
                    raise Stopped()
                time.sleep(0.2)
                try:
                    running, since, _ = _progress(dir_fd)
                except Unusable as error:
                    result.ended = f"its progress file was tampered with: {error}"
                    break
                if since is not None and time.time() - since > limits.cell_s:
                    result.ended = f"a cell ran past its {limits.cell_s:g} s limit"
                    break
                if time.monotonic() - started > limits.notebook_s:
                    result.ended = f"the notebook ran past its {limits.notebook_s:g} s limit"
                    break
        finally:
            _kill_group(proc)
            proc.wait()
            reader.join(timeout=5)
        try:
            running, _, result.cells = _progress(dir_fd)
        except Unusable as error:
            running, result.cells = None, {}
            result.ended = result.ended or f"its progress file was tampered with: {error}"
        if running is not None:
            result.stopped_at = running
            if not result.ended:
                code = proc.returncode  # bwrap reports the learner's process's end as 128 + signal
                signal_number = -code if code < 0 else code - 128 if code > 128 else 0
                result.ended = (
                    f"the process died (signal {signal_number})"
                    if signal_number
                    else f"it exited (status {code})"
                )
        result.output = kept.decode("utf-8", "replace")
        budget = [RECORDS_TOTAL_CAP]
        for index in range(len(lesson.exercises)):
            _collect(dir_fd, index, result, budget)
        return result
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
        job.remove()


def _collect(dir_fd: int, index: int, result: SandboxRun, budget: list[int]) -> None:
    try:
        raw = read_regular(f"exercise-{index}.json", OUTCOME_CAP, dir_fd)
        if raw is None:
            return
        outcome = json.loads(raw)
        if not isinstance(outcome, dict):
            raise Unusable("its outcome is not an object")
        result.outcomes[index] = outcome
        data = read_regular(f"records-{index}.pt", min(RECORDS_CAP, budget[0]), dir_fd)
        if data is None:
            raise Unusable("its records are missing")
        budget[0] -= len(data)
        result.records[index] = load_records(data, min(RECORDS_CAP, budget[0] + len(data)))
    except Exception as error:  # noqa: BLE001  (whatever the child left, it is only data)
        result.unreadable[index] = f"{type(error).__name__}: {error}"[:300]
