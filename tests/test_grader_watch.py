"""What the grader's watch (course_lib/grader/watch.py) lets a launcher do with PyTorch, and
what it names: each launcher here is defined as a notebook cell is (child.run_cell), so its
kernel counts as the notebook's own; every lesson's solutions are graded in
test_every_lessons_solutions_earn_full_marks."""

import csv
import subprocess
import sys

import nbformat
import pytest
import torch

from course_lib.builder import NOTEBOOKS, SOLUTIONS
from course_lib.grader.child import run_cell
from course_lib.grader.watch import Watch, watched, watching_backwards

KERNEL = """
import torch, triton, triton.language as tl

@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)

def launch(x, out):
    copy_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out
"""

LAUNCHERS = {
    # what the lessons' launchers do: copies of an input as it is, views, allocations
    "allowed": """
def f(x):
    flat = x.contiguous().reshape(-1).view(-1).to(torch.float32)
    out = torch.empty_like(flat)
    scratch = torch.zeros(4, dtype=x.dtype, device=x.device).new_empty(3)
    return launch(flat, out).view(x.shape)
""",
    "add": """
def f(x):
    out = launch(x.contiguous(), torch.empty_like(x))
    out.copy_(x + 1)
    return out
""",
    "transposed_copy": """
def f(x):
    out = torch.empty_like(x.t())
    launch(x.t().contiguous(), out)
    return out
""",
    "numpy": """
def f(x):
    import numpy
    out = launch(x.contiguous(), torch.empty_like(x))
    out.copy_(torch.from_numpy(numpy.exp(x.numpy())))
    return out
""",
    "never_launched": """
def f(x):
    launch(x.contiguous(), torch.empty_like(x))
    return x.clone()
""",
    "library_kernel": """
def f(x):
    from course_lib.kernels.relu import relu
    return relu(x)
""",
}


def _watched(name: str):
    namespace = {"__name__": "__main__"}
    run_cell(KERNEL, 1, namespace)
    run_cell(LAUNCHERS[name], 2, namespace)
    watch = Watch()
    return watched(namespace["f"], watch), watch


def test_allocation_views_and_plain_copies_are_a_launchers_business():
    f, watch = _watched("allowed")
    x = torch.randn(5, 7).t()  # not contiguous: .contiguous() copies it
    assert torch.equal(f(x), x.contiguous())
    assert watch.as_record() == {"computed": [], "calls": 1, "unlaunched": 0}


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("add", "aten.add"),
        ("transposed_copy", "transposed or sliced view"),
        ("numpy", "PyTorch did not make here"),
    ],
)
def test_computing_with_pytorch_is_found_and_named(name, found):
    f, watch = _watched(name)
    f(torch.randn(6, 4))
    assert watch.computed and found in watch.computed[0], watch


@pytest.mark.parametrize("name", ["never_launched", "library_kernel"])
def test_an_output_no_kernel_of_the_notebook_received_is_counted(name):
    f, watch = _watched(name)
    f(torch.randn(100))
    assert watch.unlaunched == 1, watch


DOUBLE = """
class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return launch(x.contiguous(), torch.empty_like(x))  # a copy; the test needs no more

    @staticmethod
    def backward(ctx, grad):
        return BACKWARD

def f(x):
    return Double.apply(x)
"""


@pytest.mark.parametrize(
    ("backward", "found"),
    [
        ("launch(grad.contiguous(), torch.empty_like(grad))", None),
        ("grad * 2", "aten.mul"),
        ("grad.clone()", "came from no kernel of yours"),
    ],
)
def test_a_notebooks_autograd_backward_is_watched_too(backward, found):
    namespace = {"__name__": "__main__"}
    run_cell(KERNEL, 1, namespace)
    run_cell(DOUBLE.replace("BACKWARD", backward), 2, namespace)
    watch = Watch()
    x = torch.randn(8, requires_grad=True)
    with watching_backwards(namespace, watch):
        watched(namespace["f"], watch)(x).sum().backward()
    if found is None:
        assert watch.computed == [] and x.grad is not None, watch
    else:
        assert watch.computed and found in watch.computed[0], watch
    assert "learners_backward" not in repr(namespace["Double"].__dict__["backward"])


def test_the_watch_keeps_the_functions_name_and_signature():
    import inspect

    def relu(x: torch.Tensor, BLOCK_SIZE: int = 1024) -> torch.Tensor:
        return x

    f = watched(relu, Watch())
    assert f.__name__ == "relu" and "BLOCK_SIZE" in inspect.signature(f).parameters


def test_every_lessons_solutions_earn_full_marks(tmp_path):
    """Graded as learners' notebooks, in the sandbox, the solved lessons score every point
    and raise no flag: the watch and the review refuse no correct solution."""
    from test_grader import _needs_sandbox

    _needs_sandbox()
    lessons = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    subs = tmp_path / "solutions"
    subs.mkdir()
    for name in lessons:
        nb = nbformat.read(SOLUTIONS / name, as_version=4)
        nbformat.write(nb, subs / name)
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.grader", str(subs), "--out", str(tmp_path / "r"),
         "--workers", "2", "--cell-timeout", "600"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with (tmp_path / "r" / "grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["assignment"] for r in rows} == {name[:-6] for name in lessons}
    wrong = [(r["assignment"], r["grade_id"], r["reason"], r["flags"]) for r in rows
             if r["score"] != r["max_score"] or r["flags"]]  # fmt: skip
    assert wrong == []
