"""What a new shape's first call costs: the finished kernels as a program meets them.

A finished kernel's first call with a new shape compiles, and where it autotunes, times
its configs; later calls reuse both. Each case here runs in a fresh Python process, twice:
once with Triton's cache in a new empty directory, then once more in another fresh process
with the same directory, as the next run of a program finds it. The figure is the wall
time from just before the first call to after torch.cuda.synchronize; starting Python and
its imports (torch, triton, the course) are timed apart, and the inputs are made, on the
GPU, before the clock starts.

Beside them, torch's own operator on the same inputs (torch.matmul, F.linear, F.conv2d,
F.scaled_dot_product_attention) in a fresh process of its own: torch pays one-time costs
too, on its first call (cuBLAS's and cuDNN's handles, modules it imports lazily: its
autograd imports sympy for a backward given its output's gradient). The course's processes
make torch's call once before the clock, as any program that has run torch has, so that
their figure is the course's kernels' own.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from course_lib import runtime

# the course's targets for a first call: what a user waits before the first result
EMPTY_CACHE_TARGET_S = 10.0
WARM_CACHE_TARGET_S = 1.0
CHILD_TIMEOUT_S = 300.0
# the child's record, on one line of its stdout after this tag
_RECORD_TAG = "first-call record: "


@dataclass(frozen=True)
class Case:
    """One kernel at one shape: `kernel` names its module in course_lib.kernels; `shape`
    is matmul's (M, N, K), linear's (rows, in, out), conv2d's (B, C, H = W, O, kernel
    side, stride, padding) or attention's (B, H, N, d); `variant` is matmul's activation,
    conv2d's layout ("channels-last" or "NCHW"), or "forward + backward"."""

    kernel: str
    shape: tuple[int, ...]
    dtype: str
    variant: str = ""

    def __post_init__(self):
        if self.kernel not in _BUILDERS:
            raise ValueError(
                f"first call: no case for kernel {self.kernel!r}; use one of {sorted(_BUILDERS)}"
            )
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"first call: {self.dtype!r} is not a torch dtype, e.g. 'float16'")
        object.__setattr__(self, "shape", tuple(self.shape))  # a list, read back from JSON

    def label(self) -> str:
        """'matmul 1000x1000x1000', 'conv2d 32x64x56x56->64 3x3, NCHW', ..."""
        if self.kernel == "linear":
            rows, n_in, n_out = self.shape
            shape = f"{rows}x{n_in}->{n_out}"
        elif self.kernel == "conv2d":
            B, C, H, O, k, stride, padding = self.shape
            shape = f"{B}x{C}x{H}x{H}->{O} {k}x{k}"
            shape += f" stride {stride}" if stride != 1 else ""
        elif self.kernel == "attention":
            shape = "B{} H{} N{} d{}".format(*self.shape)
        else:
            shape = "x".join(map(str, self.shape))
        return f"{self.kernel} {shape}" + (f", {self.variant}" if self.variant else "")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def _random(case: Case, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device=runtime.DEVICE, dtype=case.torch_dtype) * scale


# a case's two calls on the same inputs: the course's kernel's, and torch's operator's
Calls = tuple[Callable[[], object], Callable[[], object]]
COURSE, TORCH = "course", "torch"  # whose call a process measures


def _matmul(case: Case) -> Calls:
    from course_lib.kernels import matmul

    m, n, k = case.shape
    a, b = _random(case, m, k), _random(case, k, n)
    relu = case.variant == "relu"
    theirs = (lambda: torch.relu(torch.matmul(a, b))) if relu else (lambda: torch.matmul(a, b))
    return (lambda: matmul.matmul(a, b, case.variant or None)), theirs


def _step(forward: Callable, inputs: tuple, grad_out: torch.Tensor) -> Callable[[], object]:
    """A training step's work: forward(*inputs), then the gradient of every input."""
    return lambda: torch.autograd.grad(forward(*inputs), inputs, grad_out)


def _linear(case: Case) -> Calls:
    from course_lib.kernels import linear

    rows, n_in, n_out = case.shape
    x = _random(case, rows, n_in).requires_grad_()
    weight = _random(case, n_out, n_in, scale=n_in**-0.5).requires_grad_()
    bias = _random(case, n_out).requires_grad_()
    inputs, grad_y = (x, weight, bias), _random(case, rows, n_out)
    return _step(linear.linear, inputs, grad_y), _step(torch.nn.functional.linear, inputs, grad_y)


def _conv2d(case: Case) -> Calls:
    from course_lib.kernels import conv2d

    B, C, H, O, k, stride, padding = case.shape
    layouts = {"channels-last": torch.channels_last, "NCHW": torch.contiguous_format}
    if case.variant not in layouts:
        raise ValueError(f"first call: conv2d's variant is a layout, one of {sorted(layouts)}")
    memory_format = layouts[case.variant]
    x = _random(case, B, C, H, H).contiguous(memory_format=memory_format)
    weight = _random(case, O, C, k, k).contiguous(memory_format=memory_format)
    ours = lambda: conv2d.conv2d(x, weight, None, stride, padding)
    return ours, lambda: torch.nn.functional.conv2d(x, weight, None, stride, padding)


def _attention(case: Case) -> Calls:
    from course_lib.kernels import attention

    inputs = tuple(_random(case, *case.shape).requires_grad_() for _ in range(3))
    grad_o = _random(case, *case.shape)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return _step(attention.attention, inputs, grad_o), _step(sdpa, inputs, grad_o)


_BUILDERS: dict[str, Callable[[Case], Calls]] = {
    "matmul": _matmul,
    "linear": _linear,
    "conv2d": _conv2d,
    "attention": _attention,
}

_STEP = "forward + backward"
# (M, N, K), (rows, in, out), (B, C, H = W, O, k, stride, padding), (B, H, N, d)
# one of each kernel first and the largest products last, so that a run stopped early has
# measured every kernel
CASES = [
    Case("matmul", (1000, 1000, 1000), "float16"),
    Case("linear", (4096, 768, 3072), "bfloat16", _STEP),  # a transformer MLP's two layers
    Case("conv2d", (32, 256, 14, 256, 3, 1, 1), "float16", "channels-last"),
    Case("conv2d", (32, 64, 56, 64, 3, 1, 1), "float16", "NCHW"),
    Case("attention", (4, 32, 4096, 128), "bfloat16", _STEP),
    Case("matmul", (3000, 127, 2000), "float32", "relu"),  # a narrow, awkward product
    Case("linear", (4096, 3072, 768), "bfloat16", _STEP),
    Case("matmul", (1000, 1000, 1000), "bfloat16"),
    *(
        Case("matmul", (size,) * 3, dtype)
        for size in (4096, 8192)
        for dtype in ("float16", "bfloat16")
    ),
]


def _synchronize() -> None:
    if not runtime.INTERPRETED:
        torch.cuda.synchronize()


def measure(case: Case, side: str = COURSE) -> dict:
    """In this process: the first call's wall seconds with this case's new inputs, the
    second call's milliseconds, and the launches a third call makes (how many, and the
    tiles its autotuners chose), as a dict for the record. `side` is whose call: the
    course's kernel's (torch's call made once first, off the clock) or torch's."""
    from course_lib.bench.recording import recording_launches
    from course_lib.bench.sweep import tuned_configs

    if side not in (COURSE, TORCH):
        raise ValueError(f"first call: side is {COURSE!r} or {TORCH!r}, got {side!r}")
    ours, theirs = _BUILDERS[case.kernel](case)
    if side == COURSE:
        theirs()  # torch's one-time costs, paid as a program that has run torch has
    call = ours if side == COURSE else theirs
    _synchronize()  # the inputs are made: the clock starts with the call
    start = time.perf_counter()
    call()
    _synchronize()
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    call()
    _synchronize()
    second_ms = (time.perf_counter() - start) * 1e3
    with recording_launches() as launches:  # not the timed calls: a recording costs a little
        call()
    _synchronize()
    return {
        "first_s": first_s,
        "second_ms": second_ms,
        "launches": len(launches),
        "tuned": tuned_configs(launches),
    }


def child_main(started: float) -> None:
    """The fresh process's entry point: the case comes as JSON in sys.argv[1]; the record
    goes to stdout on one line. `started` is when the process began its imports."""
    case, side = Case(**json.loads(sys.argv[1])), sys.argv[2]
    importlib.import_module(f"course_lib.kernels.{case.kernel}")
    record = {"import_s": time.perf_counter() - started, **measure(case, side)}
    print(_RECORD_TAG + json.dumps(record), flush=True)


# the clock starts before anything is imported; Python's own start-up is left out
_CHILD = (
    "import time; started = time.perf_counter()\n"
    "from course_lib.bench import first_call\n"
    "first_call.child_main(started)\n"
)


MEASURED, TIMED_OUT, FAILED, NOT_RUN = "measured", "timed out", "failed", "not run"


@dataclass
class FreshProcess:
    """One fresh process's first call, or what became of it (`outcome`, and why)."""

    import_s: float = math.nan
    first_s: float = math.nan
    second_ms: float = math.nan
    launches: int = 0
    tuned: str = ""
    outcome: str = MEASURED  # or TIMED_OUT, FAILED, NOT_RUN
    detail: str = ""  # where not measured: the timeout, the child's error, why not run

    def cell(self, value: float, spec: str) -> str:
        """`value` formatted for the report, or the outcome where nothing was measured."""
        return format(value, spec) if self.outcome == MEASURED else self.outcome


def run_fresh(
    case: Case, cache_dir: str | Path, timeout_s: float = CHILD_TIMEOUT_S, side: str = COURSE
) -> FreshProcess:
    """`case`'s first call (`side`'s: see measure) in a fresh Python process whose Triton
    cache is `cache_dir`, killed after `timeout_s` seconds."""
    root = str(Path(__file__).resolve().parents[2])  # where course_lib is importable from
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": root + (os.pathsep + path if path else ""),
    }
    # the child stays in this process group: a `timeout` around the benchmark ends it too
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(asdict(case)), side],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return FreshProcess(outcome=TIMED_OUT, detail=f"after {timeout_s:g} s")
    records = [line for line in out.splitlines() if line.startswith(_RECORD_TAG)]
    if child.returncode != 0 or not records:
        lines = [line.strip() for line in err.splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {child.returncode}, no record"
        return FreshProcess(outcome=FAILED, detail=why[:300])
    return FreshProcess(**json.loads(records[-1].removeprefix(_RECORD_TAG)))


def _compiled_kernels(cache_dir: str | Path) -> int:
    """The kernels compiled into a Triton cache: one .cubin each."""
    return sum(1 for _ in Path(cache_dir).rglob("*.cubin"))


def _c_modules(cache_dir: str | Path) -> int:
    """The C modules built into a Triton cache (its driver's helpers and launchers, in the
    versions that build them): part of an empty cache's figure, never of a warm one's."""
    return sum(1 for _ in Path(cache_dir).rglob("*.so"))


@dataclass
class FirstCall:
    """A case's first call with an empty Triton cache and with the cache it left."""

    case: Case
    empty: FreshProcess
    warm: FreshProcess
    # kernels that each process compiled: with the cache warm, none should be
    compiled: tuple[int, int] = (0, 0)
    c_modules: int = 0  # C modules the empty-cache process built
    torch_process: FreshProcess = field(default_factory=lambda: FreshProcess(outcome=NOT_RUN))


def first_call(case: Case, timeout_s: float = CHILD_TIMEOUT_S) -> FirstCall:
    """`case` in a fresh process with a new, empty Triton cache, then in another fresh
    process with the cache the first one left; and torch's call in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache_dir:
        torch_process = run_fresh(case, cache_dir, timeout_s, side=TORCH)
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache_dir:
        empty = run_fresh(case, cache_dir, timeout_s)
        compiled_empty, c_modules = _compiled_kernels(cache_dir), _c_modules(cache_dir)
        if empty.outcome != MEASURED:  # a partly filled cache is not what a program finds
            warm = FreshProcess(outcome=NOT_RUN, detail="the empty-cache process did not finish")
        else:
            warm = run_fresh(case, cache_dir, timeout_s)
        compiled_warm = _compiled_kernels(cache_dir) - compiled_empty
    compiled = (compiled_empty, compiled_warm)
    return FirstCall(case, empty, warm, compiled, c_modules, torch_process)


@dataclass
class FirstCallTable:
    """The first calls of some cases, with the course's targets: a report section
    of its own (no throughput, no baseline: a Sweep does not fit)."""

    name: str
    calls: list[FirstCall] = field(default_factory=list)
    empty_target_s: float = EMPTY_CACHE_TARGET_S
    warm_target_s: float = WARM_CACHE_TARGET_S

    def table(self) -> str:
        """A markdown table, then a line per target, per process not measured, and per
        case the tiles its autotuners chose."""
        header = ["case", "dtype", "imports s", "first call s, empty cache",
                  "first call s, warm cache", "torch's first call s",
                  "kernels compiled, empty / warm", "second call ms"]  # fmt: skip
        lines = [
            f"**{self.name}** (a new shape's first call in a fresh Python process, wall "
            f"seconds to torch.cuda.synchronize after it: with a new, empty Triton cache, "
            f"then in a second fresh process with the cache the first left, each after one "
            f"call of torch's operator off the clock; torch's operator's first call in a "
            f"fresh process of its own. Imports: torch, triton and the course, in the first "
            f"process; the second call is the first process's, a sanity check)",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---:|" * len(header),
        ]
        notes = self.verdicts()
        for call in self.calls:
            empty, warm, name = call.empty, call.warm, call.case.label()
            lines.append(self.row(call))
            processes = (
                ("empty cache", empty),
                ("warm cache", warm),
                ("torch", call.torch_process),
            )
            for cache, process in processes:
                if process.outcome in (TIMED_OUT, FAILED):
                    notes.append(f"{name}, {cache}: {process.outcome}, {process.detail}")
            if call.c_modules:
                notes.append(f"{name}: Triton built {call.c_modules} C modules into the empty "
                             "cache, within its figure")  # fmt: skip
            if empty.tuned:
                again = (
                    f" (warm cache: {warm.tuned})" if warm.tuned not in ("", empty.tuned) else ""
                )
                notes.append(f"tiles at {name}: {empty.tuned}{again}")
        return "\n".join(lines + [""] + [f"- {note}" for note in notes])

    @staticmethod
    def row(call: FirstCall) -> str:
        """The table's row for one case."""
        empty, warm, theirs = call.empty, call.warm, call.torch_process
        compiled_warm = call.compiled[1] if warm.outcome == MEASURED else "—"
        cells = [call.case.label(), call.case.dtype, empty.cell(empty.import_s, ".1f"),
                 empty.cell(empty.first_s, ".2f"), warm.cell(warm.first_s, ".2f"),
                 theirs.cell(theirs.first_s, ".2f"), f"{call.compiled[0]} / {compiled_warm}",
                 empty.cell(empty.second_ms, ".2f")]  # fmt: skip
        return "| " + " | ".join(cells) + " |"

    def verdicts(self) -> list[str]:
        """One line per target, naming the cases that miss it and by how much."""
        lines = []
        for cache, target, side in (("an empty", self.empty_target_s, "empty"),
                                    ("a warm", self.warm_target_s, "warm")):  # fmt: skip
            misses = []
            for call in self.calls:
                process = getattr(call, side)
                if process.outcome != MEASURED or process.first_s > target:
                    figure = process.cell(process.first_s, ".1f")
                    unit = " s" if process.outcome == MEASURED else ""
                    misses.append(f"{call.case.label()} {call.case.dtype} ({figure}{unit})")
            verdict = "met" if not misses else "missed at " + "; ".join(misses)
            lines.append(f"target first call ≤ {target:g} s with {cache} cache: {verdict}")
        return lines


def first_call_table(cases: list[Case] = CASES, timeout_s: float = CHILD_TIMEOUT_S):
    """The cases' first calls, each in fresh processes, one at a time (a compile on the
    side would slow the one measured). Each case's row is printed as soon as it is
    measured: a long run that is stopped keeps it."""
    from tqdm.auto import tqdm

    table = FirstCallTable("first call")
    print("\n".join(table.table().splitlines()[:4]), flush=True)  # its title and header
    for case in tqdm(cases, desc=table.name, leave=False):
        table.calls.append(first_call(case, timeout_s))
        print(table.row(table.calls[-1]), flush=True)
    return table
