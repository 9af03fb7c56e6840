import sys
from pathlib import Path

import pytest
import torch

import course_lib  # noqa: F401  (first: decides GPU or interpreter before triton loads)
from course_lib import runtime
from course_lib.checks.compiled import compiling_afresh

sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    if runtime.MODE == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded():
    """Random inputs differ per test but repeat from run to run, so a failure reproduces."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _compiled_afresh():
    """Graphs compiled by this run's code: torch's caches on disk, keyed without the
    operators' kernels and backwards (see compiling_afresh), would serve an earlier run's."""
    with compiling_afresh():
        yield
