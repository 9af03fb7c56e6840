"""Plain PyTorch versions of every operation in the course. No Triton here.

Checkers and benchmarks compare learners' kernels and the finished kernels with
these functions only, so a kernel can never pass by being compared with itself.
Each reference says what it moves through memory: the least any kernel must move.
"""

from __future__ import annotations

import torch


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two tensors of one shape. Reads 2n elements, writes n."""
    return x + y


def vector_add_bytes(n: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 3 * n * itemsize


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0) elementwise. Reads n elements, writes n."""
    return torch.relu(x)


def relu_bytes(n: int, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * n * itemsize


def axpy(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """alpha * x + y (BLAS's "a x plus y") for two tensors of one shape, computed in float64
    and rounded once to their dtype. Reads 2n elements, writes n."""
    return (alpha * x.double() + y.double()).to(x.dtype)


def leaky_relu(x: torch.Tensor, negative_slope: float = 0.01) -> torch.Tensor:
    """x where x >= 0, negative_slope * x elsewhere; NaN stays NaN. Reads n elements,
    writes n."""
    return torch.nn.functional.leaky_relu(x, negative_slope)


def add_2d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two [M, N] tensors of any strides, as a new contiguous [M, N] tensor.
    Reads 2·M·N elements, writes M·N."""
    return (x + y).contiguous()


def add_2d_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    return 3 * m * n * torch.empty((), dtype=dtype).element_size()


def transpose(x: torch.Tensor) -> torch.Tensor:
    """x.T of an [M, N] tensor of any strides, as a new contiguous [N, M] tensor.
    Reads M·N elements, writes M·N."""
    return x.t().contiguous()


def transpose_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of [M, N]. The fused minimum: read M·N, write M·N."""
    return torch.softmax(x, dim=-1)


def softmax_backward(y: torch.Tensor, grad_y: torch.Tensor) -> torch.Tensor:
    """The gradient of softmax's input for y = softmax(x) [M, N] and the gradient of y:
    y * (grad_y - sum(grad_y * y)) along each row, in float64, rounded to y's dtype.
    Reads 2·M·N elements, writes M·N."""
    y64, g64 = y.double(), grad_y.double()
    return (y64 * (g64 - (g64 * y64).sum(dim=-1, keepdim=True))).to(y.dtype)


def softmax_unfused(x: torch.Tensor) -> torch.Tensor:
    """The same softmax as five separate PyTorch ops, to count what fusion saves.

    max: read MN, write M; x - max: read MN + M, write MN; exp: read MN, write MN;
    sum: read MN, write M; divide: read MN + M, write MN. About 5 reads and 3 writes
    of M·N elements, against one read and one write for a fused kernel.
    """
    row_max = x.max(dim=-1, keepdim=True).values
    shifted = x - row_max
    numerator = torch.exp(shifted)
    denominator = numerator.sum(dim=-1, keepdim=True)
    return numerator / denominator


def softmax_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for [M, K] and [K, N], computed in float64 and rounded once to the inputs' dtype.

    Moves at least (M·K + K·N + M·N) elements; costs 2·M·N·K floating-point operations.
    """
    return torch.matmul(a.double(), b.double()).to(a.dtype)


def matmul_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


MATMUL_ACTIVATIONS = (None, "relu", "leaky_relu")
LEAKY_RELU_SLOPE = 0.01  # torch's default negative slope


def activation(x: torch.Tensor, name: str | None) -> torch.Tensor:
    """One of MATMUL_ACTIVATIONS applied to x: None leaves it, "relu" is max(x, 0),
    "leaky_relu" is x where x >= 0 and LEAKY_RELU_SLOPE * x below."""
    if name not in MATMUL_ACTIVATIONS:
        raise ValueError(f"activation must be one of {MATMUL_ACTIVATIONS}, got {name!r}")
    if name == "relu":
        return torch.relu(x)
    if name == "leaky_relu":
        return torch.nn.functional.leaky_relu(x, LEAKY_RELU_SLOPE)
    return x


def matmul_bias_act(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, activation_name: str | None = None
) -> torch.Tensor:
    """activation(a @ b + bias) for [M, K], [K, N] and a bias [N] added to every row,
    computed in float64 and rounded once to a's dtype. Moves at least
    (M·K + K·N + N + M·N) elements; a separate bias and activation would move 4·M·N more."""
    exact = torch.matmul(a.double(), b.double()) + bias.double()
    return activation(exact, activation_name).to(a.dtype)


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
) -> torch.Tensor:
    """torch.nn.functional.conv2d of x [B, C, H, W] with weight [O, C, kh, kw] (and bias [O]),
    computed in float64 and rounded once to x's dtype, in x's memory format.

    Reads at least B·C·H·W + O·C·kh·kw elements and writes B·O·OH·OW; costs
    2·B·O·OH·OW·C·kh·kw floating-point operations (conv2d_flops).
    """
    exact = torch.nn.functional.conv2d(
        x.double(),
        weight.double(),
        None if bias is None else bias.double(),
        stride,
        padding,
        dilation,
    )
    memory_format = (
        torch.channels_last
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        else torch.contiguous_format
    )
    return exact.to(x.dtype).contiguous(memory_format=memory_format)


def conv2d_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """torch's conv2d output size along one axis: (size + 2·padding − dilation·(kernel − 1) − 1)
    // stride + 1."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv2d_flops(batch: int, out_channels: int, out_h: int, out_w: int, in_channels: int,
                 kh: int, kw: int) -> int:  # fmt: skip
    return 2 * batch * out_channels * out_h * out_w * in_channels * kh * kw


LINEAR_ACTIVATIONS = (None, "relu", "gelu")


def linear_activation(z: torch.Tensor, name: str | None) -> torch.Tensor:
    """One of LINEAR_ACTIVATIONS applied to z; "gelu" is torch's exact one, z·Φ(z)."""
    if name not in LINEAR_ACTIVATIONS:
        raise ValueError(f"activation must be one of {LINEAR_ACTIVATIONS}, got {name!r}")
    if name == "relu":
        return torch.relu(z)
    if name == "gelu":
        return torch.nn.functional.gelu(z)
    return z


def linear_activation_slope(z: torch.Tensor, name: str | None) -> torch.Tensor:
    """d activation(z) / dz: 1, the step z > 0, or gelu's Φ(z) + z·φ(z)."""
    if name == "relu":
        return (z > 0).to(z.dtype)
    if name == "gelu":
        pdf = torch.exp(-0.5 * z * z) / (2 * torch.pi) ** 0.5
        return 0.5 * (1 + torch.erf(z / 2**0.5)) + z * pdf
    return torch.ones_like(z)


def linear_preactivation(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """z = x @ weight^T + bias in float64, with every leading dimension of x flattened
    into M rows: [M, out]."""
    z = x.double().reshape(-1, weight.shape[1]) @ weight.double().t()
    return z if bias is None else z + bias.double()


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:  # fmt: skip
    """activation(x @ weight^T + bias) for x [..., in], weight [out, in] and bias [out] or
    None, computed in float64 and rounded once to x's dtype: [..., out], contiguous.

    With x flattened to [M, in]: reads M·in + out·in + out elements and writes M·out;
    2·M·in·out floating-point operations. The backward (linear_grads) costs twice that."""
    z = linear_preactivation(x, weight, bias)
    y = linear_activation(z, activation).to(x.dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def linear_grads(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grad_output: torch.Tensor,
    activation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(grad_x, grad_weight, grad_bias) of linear for the output's gradient grad_output,
    in float64 and rounded once to x's dtype. With g = grad_output · activation'(z) and every
    leading dimension flattened into M rows: grad_x = g @ weight, grad_weight = g^T @ x
    (summed over all M rows), grad_bias = g summed over the M rows (None without a bias)."""
    z = linear_preactivation(x, weight, bias)
    g = grad_output.double().reshape(z.shape) * linear_activation_slope(z, activation)
    grad_x = (g @ weight.double()).reshape(x.shape)
    grad_weight = g.t() @ x.double().reshape(-1, weight.shape[1])
    grad_bias = None if bias is None else g.sum(dim=0).to(x.dtype)
    return grad_x.to(x.dtype), grad_weight.to(x.dtype), grad_bias


def linear_flops(rows: int, in_features: int, out_features: int) -> int:
    """The forward's floating-point operations for rows = every leading dimension of x
    multiplied together; the backward's two products cost twice as many."""
    return 2 * rows * in_features * out_features


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.layer_norm over the last dimension of x [..., N], with weight and
    bias [N] or None, computed in float64 and rounded once to x's dtype. Reads M·N elements
    (and 2N of parameters) and writes M·N; the mean and rstd a backward needs add 2M."""
    double = lambda t: None if t is None else t.double()  # noqa: E731
    y = torch.nn.functional.layer_norm(x.double(), x.shape[-1:], double(weight), double(bias), eps)
    return y.to(x.dtype)


def norm_eps(dtype: torch.dtype) -> float:
    """rms_norm's eps when none is given: the machine epsilon of the dtype its statistics
    are computed in, as torch does (float32 for 16-bit inputs)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float | None = None
) -> torch.Tensor:
    """torch.nn.functional.rms_norm over the last dimension of x [..., N]: x / sqrt(mean(x²)
    + eps) times weight [N] or None, in float64 and rounded once to x's dtype; eps None is
    norm_eps(x.dtype). Reads M·N elements (and N) and writes M·N."""
    eps = norm_eps(x.dtype) if eps is None else eps
    w = None if weight is None else weight.double()
    return torch.nn.functional.rms_norm(x.double(), x.shape[-1:], w, eps).to(x.dtype)


def norm_grads(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    grad_output: torch.Tensor, eps: float | None = 1e-5, rms: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
    """(grad_x, grad_weight, grad_bias) of layer_norm (or, with `rms`, of rms_norm, which
    takes no bias) for the output's gradient, by autograd in float64, each rounded once to
    its input's dtype (None where that input is None). The backward reads x, the output's
    gradient and the saved statistics, and writes grad_x: 3·M·N elements, plus the sums
    over rows for the parameters."""
    if rms and eps is None:
        eps = norm_eps(x.dtype)  # x's own dtype, before it goes to float64
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, weight)]
    b = None if bias is None else bias.detach().double().requires_grad_()
    if rms:
        y = rms_norm(leaves[0], leaves[1], eps)
    else:
        y = layer_norm(leaves[0], leaves[1], b, eps)
    inputs = [t for t in (*leaves, b) if t is not None]
    grads = iter(torch.autograd.grad(y, inputs, grad_output.double()))
    return tuple(
        None if t is None else next(grads).to(t.dtype) for t in (x, weight, bias)
    )  # fmt: skip


def layer_norm_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    """The least a forward moves: read x, write y (the parameters and statistics are small)."""
    return 2 * m * n * torch.empty((), dtype=dtype).element_size()


def layer_norm_backward_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    """The least a forward and backward move together: the forward's read of x and write of
    y, then the backward's reads of x and the output's gradient and write of grad_x."""
    return 5 * m * n * torch.empty((), dtype=dtype).element_size()


def _attention_scores(
    q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float | None
) -> torch.Tensor:
    """The scaled scores q·kᵀ·scale in float64, [B, H, Nq, Nk], with every key that a query
    does not see at -inf: a causal query i sees keys j <= i (the diagonal aligned top-left,
    as SDPA's is_causal, also where Nq != Nk). Grouped-query attention: query head h reads
    kv head h // (H // Hkv)."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"attention expects q [B, H, Nq, d] and k [B, Hkv, Nk, d]; got {list(q.shape)} "
            f"and {list(k.shape)}"
        )
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"attention: q's {heads} heads must be a multiple of k's {kv_heads}")
    k64 = k.double().repeat_interleave(heads // kv_heads, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q.double() @ k64.transpose(-1, -2) * scale
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(diagonal=1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """softmax(q·kᵀ·scale)·v with torch.nn.functional.scaled_dot_product_attention's
    semantics, computed in float64 and rounded once to q's dtype: q [B, H, Nq, d], k and v
    [B, Hkv, Nk, d] with H a multiple of Hkv (query head h reads kv head h // (H // Hkv));
    `causal` as SDPA's is_causal (query i sees keys j <= i); scale defaults to 1/sqrt(d).

    A fused kernel reads q, k and v and writes o: (2·Nq + 2·Nk)·d elements per head. This
    version writes and reads the [Nq, Nk] scores and probabilities too; at Nq = Nk = 8192
    that is 64 M elements per head, against 4 M for q, k, v and o together."""
    scores = _attention_scores(q, k, causal, scale)
    v64 = v.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return (torch.softmax(scores, dim=-1) @ v64).to(q.dtype)


def attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:  # fmt: skip
    """The natural-log logsumexp of each query's scaled, masked scores, [B, H, Nq] in
    float32: what a flash forward saves so that its backward can recompute the softmax,
    P = exp(S·scale - lse), without a second pass for the max and the sum."""
    return torch.logsumexp(_attention_scores(q, k, causal, scale), dim=-1).float()


def attention_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of attention for the output's gradient do [B, H, Nq, d], by autograd
    in float64, each rounded once to its input's dtype. With P the softmax and
    D = rowsum(do·o): dv = Pᵀ·do, dS = P·(do·vᵀ - D), dq = dS·k·scale, dk = dSᵀ·q·scale,
    dk and dv summed over the query heads that share a kv head."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o = attention(*leaves, causal=causal, scale=scale)
    grads = torch.autograd.grad(o, leaves, do.double())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))  # fmt: skip


def attention_flops(b: int, h: int, nq: int, nk: int, d: int, causal: bool) -> int:
    """The forward's floating-point operations: two products per head, S = q·kᵀ and
    O = P·v, 2·Nq·Nk·d each, so 4·B·H·Nq·Nk·d. Causal with Nq = Nk counts half, as
    FlashAttention's and PyTorch's benchmarks do (the diagonal's own half ignored); causal
    with Nq != Nk counts the (query, key) pairs seen. A backward is five such products
    (S again, dV, dP, dQ, dK): 2.5 times the forward, 3.5 times for both."""
    if causal and nq == nk:
        return 2 * b * h * nq * nk * d
    pairs = sum(min(i + 1, nk) for i in range(nq)) if causal else nq * nk
    return 4 * b * h * pairs * d
