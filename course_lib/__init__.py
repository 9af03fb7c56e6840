"""Library of the Triton course: runtime, finished kernels, references, checkers, benchmarks.

Import it first in every notebook: it decides between GPU and interpreter before
Triton is imported (see runtime.py).
"""

import sys

from course_lib import runtime  # noqa: I001  (must come first: it sets TRITON_INTERPRET)
from course_lib.interpreter_guard import OutOfBoundsAccess  # noqa: E402
from course_lib.runtime import DEVICE, MODE, by_mode, compile_kernel, gpu_only, show_environment

if runtime.INTERPRETED:
    from course_lib import interpreter_guard

    if not interpreter_guard.install():
        print(
            "course_lib: this Triton's interpreter is not the kind course_lib can guard; "
            "out-of-bounds loads and stores are not stopped before they happen.",
            file=sys.stderr,
        )

from course_lib.checks import (  # noqa: E402
    CheckFailed,
    CheckResult,
    ExerciseNotDone,
    check_add_2d,
    check_add_into,
    check_attention,
    check_attention_backward,
    check_attention_backward_causal,
    check_attention_forward,
    check_attention_forward_causal,
    check_axpy,
    check_compiled,
    check_conv2d,
    check_conv2d_bias_relu,
    check_conv2d_direct,
    check_layer_norm,
    check_layer_norm_forward,
    check_leaky_relu,
    check_linear,
    check_linear_forward,
    check_matmul,
    check_matmul_bias_act,
    check_matmul_grouped,
    check_relu,
    check_rms_norm,
    check_softmax,
    check_softmax_backward,
    check_softmax_looped,
    check_softmax_op,
    check_softmax_persistent,
    check_transpose,
    check_vector_add,
)

__all__ = [
    "DEVICE",
    "MODE",
    "CheckFailed",
    "OutOfBoundsAccess",
    "CheckResult",
    "ExerciseNotDone",
    "by_mode",
    "check_add_2d",
    "check_add_into",
    "check_attention",
    "check_attention_backward",
    "check_attention_backward_causal",
    "check_attention_forward",
    "check_attention_forward_causal",
    "check_axpy",
    "check_compiled",
    "check_conv2d",
    "check_conv2d_bias_relu",
    "check_conv2d_direct",
    "check_layer_norm",
    "check_layer_norm_forward",
    "check_leaky_relu",
    "check_linear",
    "check_linear_forward",
    "check_matmul",
    "check_matmul_bias_act",
    "check_matmul_grouped",
    "check_relu",
    "check_rms_norm",
    "check_softmax",
    "check_softmax_backward",
    "check_softmax_looped",
    "check_softmax_op",
    "check_softmax_persistent",
    "check_transpose",
    "check_vector_add",
    "compile_kernel",
    "gpu_only",
    "show_environment",
]
