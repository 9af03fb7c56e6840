"""Library of the Triton course: runtime, finished kernels, references, checkers, benchmarks.

Import it first in every notebook: it decides between GPU and interpreter before
Triton is imported (see runtime.py).
"""

from course_lib import runtime  # noqa: I001  (must come first: it sets TRITON_INTERPRET)
from course_lib.runtime import DEVICE, MODE, by_mode, gpu_only, show_environment

if runtime.INTERPRETED:
    from course_lib import interpreter_guard

    interpreter_guard.install()

from course_lib.checks import CheckFailed, CheckResult, check_relu, check_vector_add  # noqa: E402

__all__ = [
    "DEVICE",
    "MODE",
    "CheckFailed",
    "CheckResult",
    "by_mode",
    "check_relu",
    "check_vector_add",
    "gpu_only",
    "show_environment",
]
