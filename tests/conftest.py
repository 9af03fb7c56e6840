import sys
from pathlib import Path

import pytest
import torch

import course_lib  # noqa: F401  (first: decides GPU or interpreter before triton loads)
from course_lib import runtime

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
