"""GPU or interpreter: the one place in the course that decides.

Importing this module (``import course_lib`` does it first) looks for a CUDA GPU once.
Without one, it sets ``TRITON_INTERPRET=1`` before Triton is imported, so every
``@triton.jit`` function defined afterwards, the learner's own included, runs in
Triton's interpreter on the CPU. Setting ``TRITON_INTERPRET=1`` yourself forces
interpreter mode on a GPU machine too.

Everything else asks this module: ``DEVICE`` to allocate on, ``by_mode`` for sizes
that suit the mode, ``gpu_only`` for steps only a GPU can do.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TypeVar

import torch

T = TypeVar("T")

_TRUTHY = {"1", "true", "yes", "on"}


def _interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUTHY


HAS_GPU: bool = torch.cuda.is_available()
INTERPRETED: bool = (not HAS_GPU) or _interpreter_requested()
MODE: str = "interpreter" if INTERPRETED else "gpu"

if INTERPRETED:
    if "triton" in sys.modules and not _interpreter_requested():
        # Triton reads the variable each time @triton.jit runs, so kernels defined
        # from now on are interpreted; kernels defined before this import are not.
        print(
            "course_lib: triton was imported before course_lib; kernels defined before this "
            "line will not run. Import course_lib first, in the first cell.",
            file=sys.stderr,
        )
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE: torch.device = torch.device("cpu" if INTERPRETED else "cuda")
# torch.compile's backend for the course's compiled code (lesson 08): Inductor on a GPU; in
# the interpreter, Dynamo and AOTAutograd without Inductor's C++ build, which takes seconds
# per graph on a CPU and adds nothing to what an opaque operator is checked for
COMPILE_BACKEND: str = "aot_eager" if INTERPRETED else "inductor"
GPU_NAME: str | None = torch.cuda.get_device_name() if MODE == "gpu" else None

# Triton's interpreter gets bfloat16 arithmetic wrong (it rounds by truncation and
# mis-adds native bf16 values), so bf16 is a GPU-only dtype in this course.
DTYPES: tuple[torch.dtype, ...] = (
    (torch.float32, torch.float16)
    if INTERPRETED
    else (torch.float32, torch.float16, torch.bfloat16)
)


def by_mode(*, gpu: T, interpreter: T) -> T:
    """Pick the value that suits the mode: a GPU size, or a small interpreter size."""
    return interpreter if INTERPRETED else gpu


def gpu_only(step: str, capability: tuple[int, int] | None = None) -> bool:
    """True on a GPU (of at least this compute capability, if given). Otherwise print one
    line saying `step` is skipped, show what the cell printed on a real GPU if the course
    recorded it (see recordings.py), and return False.

    Use it to guard timing and autotuning::

        if gpu_only("timing"):
            ...
    """
    if INTERPRETED:
        print(f"⏭ {step} needs a GPU: skipped in the interpreter.")
    elif capability is not None and (have := torch.cuda.get_device_capability()) < capability:
        print(
            f"⏭ {step} needs a GPU of compute capability {capability[0]}.{capability[1]} "
            f"or later; this one is {have[0]}.{have[1]}: skipped."
        )
    else:
        return True
    from course_lib import recordings

    recordings.show(step)
    return False


def compile_kernel(kernel, *args, **options):
    """Compile a @triton.jit `kernel` for these arguments and options without running it,
    and load it on the GPU, so that its `n_regs` (registers per thread), `n_spills` and
    `metadata` (`num_warps`, `shared` bytes) are known. GPU only."""
    if INTERPRETED:
        raise RuntimeError(
            "compile_kernel needs a GPU: the interpreter runs kernels as Python and compiles "
            "nothing. Guard the cell with course_lib.gpu_only(...)."
        )
    if not callable(getattr(kernel, "warmup", None)):
        raise TypeError(f"compile_kernel expects a @triton.jit kernel, got {kernel!r}")
    from course_lib import triton_internals  # imports Triton: not before the mode is set

    compiled = kernel.warmup(*args, grid=(1,), **options)
    # Triton loads a kernel on its first launch; n_regs and n_spills exist from then on.
    # warmup() launches nothing, so load it here.
    triton_internals.load_on_gpu(compiled)
    return compiled


@contextlib.contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """Set torch.backends.cuda.matmul.allow_tf32, which torch.matmul and the finished
    matmul both follow, for the `with` block; the previous value comes back after it. In
    a program that set the newer fp32_precision (whose clash makes allow_tf32 raise),
    that is set instead: "tf32" or "ieee"."""
    matmul = torch.backends.cuda.matmul
    try:
        name, saved, value = "allow_tf32", matmul.allow_tf32, allowed
    except RuntimeError:
        name, saved, value = "fp32_precision", matmul.fp32_precision, "tf32" if allowed else "ieee"
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, saved)


def require_supported_dtype(dtype: torch.dtype, what: str) -> None:
    """Raise a clear TypeError if `dtype` is not a floating dtype this mode supports."""
    if dtype in DTYPES:
        return
    if dtype == torch.bfloat16:
        raise TypeError(
            f"{what}: bfloat16 needs a GPU. Triton's interpreter computes bf16 arithmetic "
            "wrongly; use float16 or float32 on the CPU."
        )
    names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
    raise TypeError(f"{what}: dtype {dtype} is not supported; use one of {names}.")


def describe() -> str:
    """One line: the mode, the GPU if any, and the torch/triton versions."""
    import triton

    if INTERPRETED:
        where = "interpreter (no CUDA GPU in use: kernels run on the CPU, TRITON_INTERPRET=1)"
    else:
        where = f"GPU: {GPU_NAME}"
    return f"Mode: {where} · torch {torch.__version__} · triton {triton.__version__}"


def show_environment() -> None:
    """Print `describe()`; the first cell of every notebook calls this."""
    print(describe())
