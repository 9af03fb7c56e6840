"""Plans: what a finished kernel works out once for a call (its checks passed, its route
chosen, its launches bound) and finds again for every later call with the same signature.

In a loop over small tensors, checking the arguments and choosing the route again on
every call would cost the host more than the launch itself. A plan can be kept only
because its signature holds everything that decided it: for each tensor its shape,
strides, dtype, device and whether it starts on a 16-byte boundary (Triton specialises
on it), the operation's options, and the switches torch offers to change how products
are computed (TF32 for matmuls and for convolutions, deterministic algorithms) and grad
mode (the TF32 switches where the first tensor is float32, the only dtype they change).
`signature` builds it, for every finished kernel; `PlanCache` holds the plans; `uses_tf32`
answers, for the kernels, whether a float32 product uses TF32.

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


def uses_tf32(dtype: torch.dtype, convolution: bool = False) -> bool:
    """Whether a product of `dtype` operands (a convolution's, with `convolution`) may run
    on TF32 tensor cores, as torch's own would: float32 only, as
    torch.backends.cuda.matmul.allow_tf32 says (cudnn.allow_tf32 for a convolution), or
    the newer `fp32_precision` settings where a program uses them. Never raises."""
    if dtype is not torch.float32:
        return False
    try:
        return _cudnn_tf32() if convolution else _cublas_tf32()
    except RuntimeError:
        return _tf32_by_precision(convolution)


def _tf32_by_precision(convolution: bool) -> bool:
    """TF32 or not by the newer `fp32_precision` settings. Once a program sets them to
    other than the legacy switch says, the legacy getters raise, and torch's products
    follow the newer ones: "tf32" yes, "ieee" no; "none" (set at no level: torch reads it
    through the backend's and torch.backends' own) leaves a matmul to the legacy float32
    matmul precision, and makes cuDNN's convolutions exact."""
    ops = torch.backends.cudnn.conv if convolution else torch.backends.cuda.matmul
    precision = ops.fp32_precision
    if precision != "none" or convolution:
        return precision == "tf32"
    try:
        return torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:  # that clashes too: no level asked for TF32
        return False


def _tf32_switches() -> tuple:
    """Whether cuBLAS's and cuDNN's float32 products use TF32 (see uses_tf32), by the
    legacy getters, a tenth of the properties' cost, where they do not raise."""
    try:
        return _cublas_tf32(), _cudnn_tf32()
    except RuntimeError:
        return _tf32_by_precision(False), _tf32_by_precision(True)


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
