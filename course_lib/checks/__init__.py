"""Checkers: one ``check_<topic>`` per exercise, on the engine in engine.py."""

from course_lib.checks.add_2d import check_add_2d
from course_lib.checks.attention import (
    check_attention,
    check_attention_backward,
    check_attention_backward_causal,
    check_attention_forward,
    check_attention_forward_causal,
)
from course_lib.checks.compiled import (
    check_add_into,
    check_compiled,
    check_softmax_backward,
    check_softmax_op,
)
from course_lib.checks.conv2d import check_conv2d, check_conv2d_bias_relu, check_conv2d_direct
from course_lib.checks.elementwise import (
    check_axpy,
    check_leaky_relu,
    check_relu,
    check_vector_add,
)
from course_lib.checks.engine import (
    PROBLEM_KINDS,
    CheckFailed,
    CheckResult,
    ExerciseNotDone,
    Problem,
)
from course_lib.checks.layer_norm import (
    check_layer_norm,
    check_layer_norm_forward,
    check_rms_norm,
)
from course_lib.checks.linear import check_linear, check_linear_forward
from course_lib.checks.matmul import check_matmul, check_matmul_bias_act, check_matmul_grouped
from course_lib.checks.softmax import (
    check_softmax,
    check_softmax_looped,
    check_softmax_persistent,
)
from course_lib.checks.transpose import check_transpose

__all__ = [
    "PROBLEM_KINDS",
    "CheckFailed",
    "CheckResult",
    "ExerciseNotDone",
    "Problem",
    "check_add_2d",
    "check_attention",
    "check_attention_backward",
    "check_attention_backward_causal",
    "check_attention_forward",
    "check_attention_forward_causal",
    "check_add_into",
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
]
