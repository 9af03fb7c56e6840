"""Plans: what a finished kernel works out once for a call (its checks passed, its route
chosen, its launches bound) and finds again for every later call with the same signature.

In a loop over small tensors, checking the arguments and choosing the route again on
every call would cost the host more than the launch itself. A plan can be kept only
because its signature holds everything that decided it: for each tensor its shape,
strides, dtype, device and whether it starts on a 16-byte boundary (Triton specialises
on it), the operation's options, and the switches torch offers to change how products
are computed (TF32 for matmuls and for convolutions, deterministic algorithms) and grad
mode (the TF32 switches where the first tensor is float32, the only dtype they change).
`signature` builds it, for every finished kernel; `PlanCache` holds the plans.

The switches are read through torch._C's getters, which torch.backends' properties call
(torch 2.11 and 2.13): a tenth of the properties' host cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# plans one PlanCache holds at most (and compiled kernels one LeanLauncher keeps)
MAX_PLANS = 1024

Signature = tuple  # built by signature() only: the layouts, the options, the switches
_PLAIN_OPTIONS = frozenset((type(None), bool, int, str))

_cublas_tf32 = torch._C._get_cublas_allow_tf32
_cudnn_tf32 = torch._C._get_cudnn_allow_tf32
_deterministic = torch._C._get_deterministic_algorithms
_grad_enabled = torch._C.is_grad_enabled

# True while launches are recorded into torch.compile's graph (see launching_into_graph)
tracing = False


class PlanCache(dict):
    """Plans by signature, at most MAX_PLANS of them: a loop over ever new sizes empties
    it and starts afresh. A dict, so that a look-up (`.get(key)`) costs no Python call."""

    def put(self, key: Signature | None, plan):
        """Keep `plan` under `key` (not where key is None: nothing to keep); return plan."""
        if key is not None:
            if len(self) >= MAX_PLANS:
                self.clear()
            self[key] = plan
        return plan


def _tf32_switches() -> tuple:
    """The TF32 switches of cuBLAS and cuDNN. Once a program sets the newer
    `fp32_precision` settings, the legacy getters raise: the key then holds those."""
    try:
        return _cublas_tf32(), _cudnn_tf32()
    except RuntimeError:
        return (
            getattr(torch.backends.cuda.matmul, "fp32_precision", None),
            getattr(torch.backends.cudnn.conv, "fp32_precision", None),
        )


def signature(tensors: tuple, options: tuple = ()) -> Signature | None:
    """The signature of a call with these tensors (or None in their place) and options:
    everything its checks and its route depend on. None where no plan is to be kept: a
    tensor argument that is no tensor, an option other than None, a bool, an int, a
    string or a tuple of ints (1.0 == 1 as a key, but a first call refuses a float), or
    tensors being traced into a graph, which have no address."""
    if tracing:
        return None
    key = []
    for t in tensors:  # each tensor's layout, the alignment as its start's offset from 16 bytes
        if t is None:
            key.append(None)
        elif isinstance(t, torch.Tensor):
            key.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15))
        else:
            return None
    for option in options:
        if type(option) not in _PLAIN_OPTIONS and not (
            type(option) is tuple and all(type(v) is int for v in option)
        ):
            return None
    key += options
    if key[0] is not None and key[0][2] is torch.float32:  # TF32 changes float32 only
        key += _tf32_switches()
    key += _deterministic(), _grad_enabled()
    return tuple(key)


@contextlib.contextmanager
def launching_into_graph() -> Iterator[None]:
    """Within the block, every LeanLauncher launch goes through torch.library.wrap_triton:
    called by torch.compile's tracing on traced tensors, that records the kernel into the
    graph, for Inductor to launch from its own code, instead of launching it; and no plan
    is kept."""
    global tracing
    saved, tracing = tracing, True
    try:
        yield
    finally:
        tracing = saved


def into_graph() -> bool:
    """Whether launches are being recorded into a graph (see launching_into_graph): no
    tensor has an address then, and nothing is to be kept for later calls."""
    return tracing
