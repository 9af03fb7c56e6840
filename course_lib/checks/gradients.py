"""What the autograd checks share: a learner's result differentiated through their backward,
which must exist, launch a Triton kernel and return each gradient asked for. Each failure is
an exception of its own, which a check's hints name by its class."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course_lib.checks.launches import counting_launches


class NoGradient(RuntimeError):
    """The checked function's result is not part of an autograd graph."""


class MissingGradient(RuntimeError):
    """Backward returned None where a gradient was needed."""


class NoKernelInBackward(RuntimeError):
    """The gradients came from PyTorch alone: no Triton kernel ran in the backward."""


def require_graph(y) -> None:
    """Raise NoGradient unless y is a tensor that autograd can differentiate."""
    if not isinstance(y, torch.Tensor) or y.grad_fn is None:
        raise NoGradient("your function's result has no grad_fn: autograd cannot reach it")


def kernel_gradients(y, leaves: Sequence[torch.Tensor], grad_output: torch.Tensor) -> tuple:
    """The gradients of y for `leaves` (None where unused) given grad_output, by the learner's
    backward, which must launch a Triton kernel."""
    require_graph(y)
    with counting_launches() as launches:
        grads = torch.autograd.grad(y, list(leaves), grad_output, allow_unused=True)
    if launches[0] == 0:
        raise NoKernelInBackward("the backward launched no Triton kernel")
    return grads


def returned(grad: torch.Tensor | None, name: str) -> torch.Tensor:
    """`grad`, the gradient of `name`, unless the backward returned None for it."""
    if grad is None:
        raise MissingGradient(f"backward returned None as the gradient of `{name}`")
    return grad


def wrong_gradient_count(message: str) -> bool:
    """Whether autograd refused a backward for returning more or fewer values than forward
    took arguments. torch (2.11 to 2.13) says so only in the error's text: "function
    ...Backward returned an incorrect number of gradients (expected 5, got 3)"."""
    return "returned an incorrect number of gradients" in message
