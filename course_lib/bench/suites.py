"""The finished kernels' benchmarks, as run by ``python -m course_lib.bench``.

Add a lesson's kernel by adding a function that returns its Sweep(s).
"""

from __future__ import annotations

from course_lib import references
from course_lib.bench.sweep import Sweep, bandwidth_sweep
from course_lib.kernels import relu, vector_add

# 2^12..2^18 show where launches dominate; 2^20..2^28 are where bandwidth is judged.
SIZES = [1 << p for p in (12, 14, 16, 18)] + [1 << p for p in range(20, 29)]


def vector_add_suite(ceiling_gbps: float) -> list[Sweep]:
    return [
        bandwidth_sweep(
            "add",
            vector_add.add,
            references.vector_add,
            n_inputs=2,
            bytes_moved=references.vector_add_bytes,
            sizes=SIZES,
            ceiling_gbps=ceiling_gbps,
        )
    ]


def relu_suite(ceiling_gbps: float) -> list[Sweep]:
    return [
        bandwidth_sweep(
            "relu",
            relu.relu,
            references.relu,
            n_inputs=1,
            bytes_moved=references.relu_bytes,
            sizes=SIZES,
            ceiling_gbps=ceiling_gbps,
        )
    ]


SUITES = {"add": vector_add_suite, "relu": relu_suite}
