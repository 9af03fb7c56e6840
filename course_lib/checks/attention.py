"""Checks for lesson 10: flash attention's forward, its backward, and both through autograd.

`check_attention_forward(fn, causal=False)` calls `fn(q, k, v, causal, scale)` and checks
the (o, lse) it returns, each as a case of its own: q [B, H, Nq, d], k and v [B, H, Nk, d]
(no grouped-query attention), lse [B, H, Nq] float32 in natural log. With causal=True every
case is causal, aligned top-left as SDPA's is_causal (query i sees keys j <= i), and two
cases have Nq != Nk: a kernel that bounds its loop by the diagonal must still stop at Nk.
`check_attention_backward(fn, causal=False)` calls `fn(q, k, v, o, lse, do, causal, scale)`,
with o and lse from the reference, and checks the (dq, dk, dv) it returns.
`check_attention(fn)` checks o = fn(q, k, v, causal, scale), your autograd Function, and
the gradients autograd computes through it, causal and not.

Every mistake a flash kernel makes inside its loop over key blocks (no rescaling, a
division at every step, keys past Nk left unmasked, a mask of 0) changes the result by an
amount that depends on its BLOCK_N (and BLOCK_M): each is replayed in float64 at the block
sizes a learner is likely to pick, and named where one of them matches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from course_lib import references, runtime
from course_lib.checks.engine import (
    RAISED_HINT,
    Case,
    CaseResult,
    CheckResult,
    Hints,
    KnownMistake,
    case_generator,
    random_input,
    run_check,
)
from course_lib.checks.gradients import (
    MissingGradient,
    NoGradient,
    NoKernelInBackward,
    kernel_gradients,
    returned,
    wrong_gradient_count,
)
from course_lib.checks.guard import is_poison

LOG2E = math.log2(math.e)
BLOCKS = (16, 32, 64, 128)  # the block sizes a mistake is replayed at

NO_RESCALE_HINT = (
    "when the running max grows, what was summed so far is on the old max's scale: multiply "
    "acc (and l) by alpha = exp2(m_old - m_new) before adding the new block's p @ v"
)
SCALE_NEVER_HINT = (
    "the scores were never scaled: S = q·kᵀ·scale, applied once (fold it into the exp2's "
    "factor, qk_scale = scale * log2(e))"
)
SCALE_TWICE_HINT = (
    "the scale was applied twice (scale² where scale is due): multiply the scores by "
    "scale * log2(e) once, not by scale again inside exp2"
)
SCALE_IGNORED_HINT = (
    "you used 1/sqrt(d) where the scale argument says otherwise: take the scale passed in"
)
DIAGONAL_HIDDEN_HINT = (
    "the causal mask hides the diagonal (j < i), so row 0, left with no key, came out NaN: "
    "a query sees its own key, key_end = min(offs_m + 1, N_k), the keys offs_n < key_end "
    "(offs_n <= offs_m)"
)
ONE_PAST_HINT = (
    "the causal mask lets each query see one key too many (j <= i + 1): keep the keys "
    "offs_n < key_end, key_end = min(offs_m + 1, N_k) (offs_n <= offs_m, not offs_m + 1)"
)
BOTTOM_RIGHT_HINT = (
    "you aligned the causal diagonal to the bottom right (query i sees keys j <= i + Nk - Nq): "
    "SDPA's is_causal aligns it top-left, j <= i, whatever Nq and Nk"
)
MASK_ZERO_HINT = (
    "masked scores must be -inf: you set them to 0 (or to a value not far enough below the "
    "row's max), so hidden keys still got weight. Use tl.where(mask, s, float('-inf'))"
)
EACH_STEP_HINT = (
    "rows are right where a query's keys fit one block and too small where they span "
    "several: you divided acc by the running sum l at every step, so earlier blocks were "
    "divided again and again. Divide once, o = acc / l, after the loop"
)
KEYS_UNMASKED_HINT = (
    "keys past N_k took part in the softmax: the last block of keys runs past the end, and "
    "their scores (0 from the masked load) must be -inf, "
    "s = tl.where(offs_n[None, :] < key_end[:, None], s, float('-inf')), key_end = N_k "
    "(offs_n < N_k)"
)
KEY_END_INCLUSIVE_HINT = (
    "every query saw one key past the last, key N_k: the mask offs_n <= key_end keeps it, "
    "and its score, 0 from the masked load, took a share of the softmax. Keep the keys "
    "offs_n < key_end"
)
KEYS_UNMASKED_CAUSAL_HINT = (
    "keys past N_k took part in the softmax of the queries past N_k: those keys' scores (0 "
    "from the masked load) must be -inf, so key_end = min(offs_m + 1, N_k), whose min keeps "
    "a query past N_k from seeing keys past it (offs_n <= offs_m and offs_n < N_k)"
)
EXP_OF_LOG2_HINT = (
    "your scores are in log2 units (qk_scale = scale * LOG2E) but you exponentiated them with "
    "tl.exp: in log2 units p = tl.exp2(s - m_new[:, None]) and alpha = tl.exp2(m_i - m_new)"
)
EXP2_NO_LOG2E_HINT = (
    "you took tl.exp2 of scores scaled by scale alone: exp2 wants them in log2 units, "
    "qk_scale = scale * LOG2E"
)
FIRST_HEAD_HINT = (
    "only the first head is right: every program read {what} of head 0. Move {fix}, with "
    "head = tl.program_id(1), the program's (batch, head)"
)
# what a program read of the first head -> where its pointers belong
FIRST_HEAD_FIXES = {
    "q": "q's pointer (and o's) to the program's own head, q_ptr + head * N_q * d",
    "k and v": "k's and v's pointers to the program's own head, "
    "k_head = k_ptr + head * N_k * d and v_head = v_ptr + head * N_k * d",
    "q, k and v": "every pointer to the program's own head: q_ptr + head * N_q * d, "
    "k_ptr + head * N_k * d and v_ptr + head * N_k * d",
}
LSE_LOG2_HINT = (
    "you saved the base-2 logsumexp, m + log2(l) with the scores in log2 units: the lse is "
    "in natural log, (m + log2(l)) * ln(2)"
)
LSE_MAX_HINT = (
    "you saved the running max alone: the lse is m + log(l), the max plus the log of the sum"
)
LSE_MAX_LOG2_HINT = (
    "you saved the running max alone, in log2 units: the lse is (m + log2(l)) * ln(2)"
)
LSE_NO_MAX_HINT = "you saved log(l) alone: the lse is m + log(l), with the running max added back"
NO_D_HINT = (
    "dS is missing D: dS = P * (dP - D), with D = rowsum(dO * O) per query (the softmax's "
    "own gradient subtracts it), computed once before the dK/dV and dQ loops"
)
UNNORMALISED_P_HINT = (
    "P here was never normalised: recompute it from the saved lse, "
    "P = exp(S·scale - lse) (exp2(S·scale·log2(e) - lse·log2(e))), not exp(S·scale)"
)
P_UNSCALED_HINT = (
    "P was recomputed from unscaled scores: P = exp(S·scale - lse), with the forward's scale"
)
LSE_UNITS_HINT = (
    "lse is in natural log: with exp2, multiply it by log2(e) too, "
    "P = exp2(S·scale·log2(e) - lse·log2(e))"
)
DQ_SCALE_HINT = "dQ = dS·K·scale: {how} (the scores' gradient reaches q through the scale)"
DK_SCALE_HINT = "dK = dSᵀ·Q·scale: {how} (the scores' gradient reaches k through the scale)"
DELTA_ROWS_HINT = (
    "dSᵀ = Pᵀ ∘ (dPᵀ - D) subtracted D along the wrong axis: in the transposed tile the "
    "queries run along the columns, so delta[None, :], not delta[:, None] (which took the D "
    "of other queries, and ran only because BLOCK_M == BLOCK_N)"
)
LSE_ROWS_HINT = (
    "Pᵀ = exp2(Sᵀ - lse) took the lse along the wrong axis: in the transposed tile the "
    "queries run along the columns, so lse[None, :], not lse[:, None] (which took the lse of "
    "other queries, and ran only because BLOCK_M == BLOCK_N)"
)
BACKWARD_DEFAULT_SCALE_HINT = (
    "your backward used the default scale 1/sqrt(d), not the one forward was given: keep "
    "scale on ctx in forward and pass ctx.scale to flash_backward"
)
BACKWARD_MASK_HINT = (
    "the backward too must hide the keys a query does not see: P = 0 above the diagonal "
    "(mask the recomputed scores with -inf, or P with 0, where offs_n > offs_m)"
)
HALF_HINT = (
    "the float32 cases pass and this 16-bit one does not: keep m, l and acc in float32 "
    "(tl.zeros(..., dtype=tl.float32)) and convert p to v's dtype only for tl.dot"
)
TF32_HINT = (
    "the 16-bit cases pass and this float32 one does not: on a GPU, tl.dot multiplies float32 "
    "in TF32 (10 bits of mantissa) unless told otherwise. Pass "
    'input_precision=DOT_PRECISION from kernel_options(q), which is "ieee" unless torch '
    "allows TF32"
)
GRID_HINT = (
    "some rows of queries were never written: launch triton.cdiv(N_q, BLOCK_M) programs "
    "along axis 0 and one per (batch, head) along axis 1, and store with mask offs_m < N_q"
)
LAST_BLOCK_HINT = (
    "the last, partial block of queries has no program: launch triton.cdiv(N_q, BLOCK_M) "
    "programs along axis 0, not N_q // BLOCK_M"
)
HEADS_HINT = (
    "whole heads were never written: axis 1 of the grid must have B * H programs, and each "
    "must store into its own head, head = tl.program_id(1): {where}"
)
# where a program's head starts, by the part its check compares (contiguous tensors)
HEAD_STARTS = {
    "o": "o_ptr + head * N_q * d, as q_ptr + head * N_q * d",
    "lse": "lse_ptr + head * N_q",
    "dq": "dq_ptr + head * N_q * d",
    "dk": "dk_ptr + head * N_k * d, and dv_ptr likewise",
    "dv": "dv_ptr + head * N_k * d, and dk_ptr likewise",
}
KEY_BLOCKS_HINT = (
    "{what}: launch triton.cdiv(N_k, BLOCK_N) programs (not N_k // BLOCK_N) along axis 0 of "
    "the dK/dV kernel, one per (batch, head) along axis 1, and store with mask offs_n < N_k"
)
NO_GRADIENT_HINT = (
    "the result carries no gradient: return the output of your autograd Function, "
    "Function.apply(...), whose backward supplies it"
)
NO_KERNEL_IN_BACKWARD_HINT = (
    "your backward computed the gradients with PyTorch alone: launch your backward kernels"
)
GRADIENT_COUNT_HINT = (
    "return one gradient per argument of forward, None for causal and scale: "
    "return dq, dk, dv, None, None"
)
MISSING_GRADIENT_HINT = (
    "backward must return a gradient for q, k and v, then None for causal and scale, in "
    "forward's order"
)
NOT_TWO_HINT = "return the output and the logsumexp as a tuple: return o, lse"
NOT_THREE_HINT = "return the three gradients as a tuple: return dq, dk, dv"


class NotTwo(RuntimeError):
    """The forward did not return (o, lse)."""


class NotThree(RuntimeError):
    """The backward did not return (dq, dk, dv)."""


def _raised(kind: str, message: str) -> str | None:
    """A hint for what a call raised: the check's own exceptions by their type, and autograd's
    refusal of a backward's count of values by its text (see wrong_gradient_count)."""
    if kind == "RuntimeError" and wrong_gradient_count(message):
        return GRADIENT_COUNT_HINT
    return {
        NoGradient.__name__: NO_GRADIENT_HINT,
        MissingGradient.__name__: MISSING_GRADIENT_HINT,
        NoKernelInBackward.__name__: NO_KERNEL_IN_BACKWARD_HINT,
        NotTwo.__name__: NOT_TWO_HINT,
        NotThree.__name__: NOT_THREE_HINT,
    }.get(kind)


# the lesson's attend_keys masks its loads of k and v by the loop's bound hi, not by N_k
CAUSAL_END_HINT = (
    "the loop over keys read past the end of k and v (NaN during a check, anything on a GPU): "
    "a causal loop stops at the diagonal and at N_k, hi = min((pid_m + 1) * BLOCK_M, N_k), "
    "since attend_keys masks its loads with offs_n < hi (in a kernel of your own, mask the "
    "loads of k and v with offs_n < N_k, and q's with offs_m < N_q)"
)


HINTS = Hints(
    out_of_bounds=(
        "the kernel wrote past the end of a tensor: store with mask offs_m < N_q (offs_n < N_k "
        "for dK and dV), and move each program's pointers by its own (batch, head)"
    ),
    load_out_of_bounds=(
        "a load ran past the end of a tensor: mask the loads of q and dO with offs_m < N_q, "
        "of k and v with offs_n < N_k (other=0.0)"
    ),
    nothing_written=(
        "did the kernel store its result? Check tl.store's pointer and the grid, "
        "(triton.cdiv(N_q, BLOCK_M), B * H)"
    ),
    grid_too_small=GRID_HINT,
    stops_short=GRID_HINT,
    unscaled_offsets=GRID_HINT,
    scattered=GRID_HINT,
    read_past_end=(
        "NaN where the reference is finite: a load read past the end of an input (the memory "
        "around it holds NaN during a check). Mask the loads of k and v with offs_n < N_k "
        "(attend_keys masks them with offs_n < hi: hi must not pass N_k) and of q with "
        "offs_m < N_q, and set the scores of keys past N_k to -inf"
    ),
    unmasked_load=(
        "the result is right by luck: a load read past the end of an input, undefined on a "
        "GPU. Mask the loads of k and v with offs_n < N_k (attend_keys masks them with "
        "offs_n < hi: hi must not pass N_k) and of q with offs_m < N_q"
    ),
    dtype="allocate o like q (torch.empty_like(q)) and lse as float32",
    raised=_raised,
)


# --- what the usual mistakes compute, in float64 ------------------------------------------


def _visible(n_q: int, n_k: int, causal: bool, diagonal: str, device) -> torch.Tensor:
    """[Nq, Nk] True where query i sees key j: all, or causal with the diagonal right
    ("right": j <= i), hidden ("hidden": j < i), one past ("one past": j <= i + 1) or
    aligned bottom right ("bottom right": j <= i + Nk - Nq)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    if not causal:
        return torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    shift = {"right": 0, "hidden": -1, "one past": 1, "bottom right": n_k - n_q}[diagonal]
    return j <= i + shift


def _flash64(q, k, v, causal, scale, *, block_m=None, block_n=None, skip=True,
             diagonal="right", mask_value=float("-inf"), rescale=True, each_step=False,
             keys_unmasked=False, key_end_inclusive=False,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """What a flash forward computes, block by block in float64, with one mistake:
    (o, m, l), m the running max of the scaled scores (natural units) and l the sum of
    exp(s - m). `skip`: causal loops stop after the query block's diagonal block.
    `key_end_inclusive`: the keys j <= key_end seen, key_end = N_k (causal, min(i + 1,
    N_k)), so key N_k too where its block is visited, a key of zeros from the masked load."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    block_m, block_n = block_m or n_q, block_n or n_k
    q64, k64, v64 = q.double(), k.double(), v.double()
    padded = -(-n_k // block_n) * block_n
    k64 = torch.nn.functional.pad(k64, (0, 0, 0, padded - n_k))  # the masked loads' zeros
    v64 = torch.nn.functional.pad(v64, (0, 0, 0, padded - n_k))
    i = torch.arange(n_q, device=q.device)
    if key_end_inclusive:
        key_end = torch.clamp(i + 1, max=n_k) if causal else torch.full_like(i, n_k)
        seen = torch.arange(padded, device=q.device)[None, :] <= key_end[:, None]
    else:
        seen = _visible(n_q, padded, causal, diagonal, q.device)
        if not keys_unmasked:
            seen = seen & (torch.arange(padded, device=q.device) < n_k)
    # the keys each query's loop visits: whole blocks, up to the diagonal's where it skips
    end = torch.full_like(i, n_k)
    if causal and skip:
        end = torch.clamp(i // block_m * block_m + block_m, max=n_k)
    visited = (
        torch.arange(padded, device=q.device)[None, :] < (-(-end // block_n) * block_n)[:, None]
    )
    s = q64 @ k64.transpose(-1, -2) * scale
    s = s.masked_fill(~seen, mask_value).masked_fill(~visited, float("-inf"))
    if rescale and not each_step:
        # with every block rescaled, the loop computes the softmax of what it visits exactly
        m = s.amax(dim=-1)
        p = torch.exp(s - m[..., None])
        l_sum = p.sum(dim=-1)
        return p @ v64 / l_sum[..., None], m, l_sum
    m = torch.full(s.shape[:-1], float("-inf"), dtype=torch.float64, device=q.device)
    l_sum = torch.zeros_like(m)
    acc = torch.zeros_like(q64)
    for start_n in range(0, padded, block_n):
        block = s[..., start_n : start_n + block_n]
        m_new = torch.maximum(m, block.amax(dim=-1))
        # a row whose loop has ended sees -inf only: nothing changes for it
        alpha = torch.where(m_new == m, 1.0, torch.exp(m - m_new))
        p = torch.exp(block - m_new[..., None]).nan_to_num(0.0)
        live = (start_n < -(-end // block_n) * block_n)[:, None]
        l_sum = torch.where(live[:, 0], l_sum * alpha + p.sum(dim=-1), l_sum)
        kept = acc * alpha[..., None] if rescale else acc  # the mistake: not rescaled
        update = kept + p @ v64[..., start_n : start_n + block_n, :]
        if each_step:
            update = update / l_sum[..., None]
        acc = torch.where(live, update, acc)
        m = torch.where(live[:, 0], m_new, m)
    return (acc if each_step else acc / l_sum[..., None]), m, l_sum


def _part(result, part: str, lse: str = "right") -> torch.Tensor:
    """o, or the lse as saved right ("right") or wrongly: in base 2, the max alone (in
    natural or log2 units), log(l) without the max, or (m + log2(l)) * ln(2) where the
    running max and sum were taken with exp, not exp2 ("exp")."""
    o, m, l_sum = result
    if part == "o":
        return o
    return {
        "right": m + torch.log(l_sum),
        "log2": (m + torch.log(l_sum)) * LOG2E,
        "max": m,
        "max log2": m * LOG2E,
        "no max": torch.log(l_sum),
        "exp": m * math.log(2) + torch.log(l_sum),
    }[lse]


def _block_pairs(causal: bool) -> list[tuple[int, int]]:
    """(BLOCK_M, BLOCK_N) pairs a mistake inside the loop is replayed at: the lesson's
    square blocks, and for a causal loop, whose end follows BLOCK_M, the usual oblong ones
    (BLOCK_N below BLOCK_M)."""
    pairs = [(b, b) for b in BLOCKS]
    if causal:
        pairs += [(m, n) for m in BLOCKS for n in BLOCKS if n < m]
    return pairs


# --- the cases ---------------------------------------------------------------------------


def _kv_ramp(generator, shape, dtype):
    """Keys whose size grows along the sequence, so that later blocks hold larger scores
    and the running max grows from block to block, as a rescaling must then follow."""
    k = random_input(generator, shape, torch.float32)
    ramp = torch.linspace(0.5, 2.5, shape[-2], device=k.device)[:, None]
    return (k * ramp).to(dtype)


def _describe(b, h, n_q, n_k, d, dtype, why) -> str:
    size = f"N={n_q}" if n_q == n_k else f"Nq={n_q}, Nk={n_k}"
    return f"B={b}, H={h}, {size}, d={d} ({why}), {str(dtype).removeprefix('torch.')}"


def _shapes(causal: bool) -> list[tuple]:
    """(B, H, Nq, Nk, d, dtype, why, options) of the cases the forward's check tries."""
    rows = [
        (1, 2, 10, 10, 16, torch.float32, "smaller than a block", {}),
        (1, 2, 37, 37, 32, torch.float32, "prime", {}),
        (2, 1, 100, 100, 16, torch.float32, "not a multiple of the block", {}),
        (1, 1, 128, 128, 32, torch.float32, "several blocks", {}),
        (1, 2, 20, 77, 32, torch.float32, "fewer queries than keys", {}),
        (1, 1, 77, 20, 64, torch.float32, "more queries than keys", {}),
        (1, 1, 96, 96, 32, torch.float32, "scores growing along the keys", {"ramp": True}),
        (1, 2, 37, 37, 32, torch.float32, "scale=0.3, not 1/sqrt(d)", {"scale": 0.3}),
    ]
    for dtype in runtime.DTYPES[1:]:  # float16, and bfloat16 on a GPU
        rows += [(1, 2, 61, 61, 64, dtype, "prime", {}),
                 (2, 1, 128, 128, 32, dtype, "several blocks", {})]  # fmt: skip
    return rows


def _inputs(generator, b, h, n_q, n_k, d, dtype, *, ramp=False, grad=False):
    q = random_input(generator, (b, h, n_q, d), dtype)
    k = _kv_ramp(generator, (b, h, n_k, d), dtype) if ramp else random_input(
        generator, (b, h, n_k, d), dtype)  # fmt: skip
    v = random_input(generator, (b, h, n_k, d), dtype)
    return (q, k, v, random_input(generator, (b, h, n_q, d), dtype)) if grad else (q, k, v)


def _atol_scale(expected: torch.Tensor, dtype: torch.dtype, terms: int) -> float:
    """How far a right kernel may be off, as a multiple of the tolerance table's atol: a
    float32 sum of `terms` terms rounds some sqrt(terms) times; in 16 bits P is rounded to
    the inputs' dtype for tl.dot (and dS in the backward), an error of one rounding of the
    largest values."""
    from course_lib.checks.tolerances import tolerance_for

    tol = tolerance_for(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        return max(1.0, 2 * tol.rtol * float(expected.abs().max()) / tol.atol)
    return max(1.0, 4 * math.sqrt(terms) * float(expected.abs().max()))


def _forward_cases(seed: int, causal: bool) -> list[Case]:
    generator = case_generator(seed)
    cases = []
    for b, h, n_q, n_k, d, dtype, why, options in _shapes(causal):
        scale = options.get("scale", d**-0.5)
        inputs = _inputs(generator, b, h, n_q, n_k, d, dtype, ramp=options.get("ramp", False))
        for part in ("o", "lse"):
            reference = _forward_reference(part, causal, scale)
            expected = reference(*inputs)
            cases.append(Case(
                f"{_describe(b, h, n_q, n_k, d, dtype, why)}: {part}", inputs,
                "causal" if causal else "",
                torch.float32 if part == "lse" else None,
                atol_scale=_atol_scale(expected, dtype if part == "o" else torch.float32, n_k),
                kwargs={"causal": causal, "scale": scale, "part": part},
                reference=reference,
                mistakes=_mistakes_for(causal, scale, part, n_k, d, b * h),
                input_names=("q", "k", "v"),
            ))  # fmt: skip
    return cases


def _forward_reference(part: str, causal: bool, scale: float) -> Callable:
    def reference(q, k, v, *_):
        if part == "o":
            return references.attention(q, k, v, causal, scale)
        return references.attention_lse(q, k, v, causal, scale)

    return reference


def _first_head(t: torch.Tensor) -> torch.Tensor:
    """t [B, H, N, d] with every (batch, head) holding the first one's values: what a
    program reads that never moved its pointer to its own head."""
    return t.flatten(0, 1)[:1].expand(t.shape[0] * t.shape[1], -1, -1).reshape(t.shape)


def _mistakes_for(causal: bool, scale: float, part: str, n_k: int, d: int, heads: int) -> list:
    """The forward's usual mistakes for one case of `heads` (batch, head) pairs: one
    KnownMistake per form, a form per block size where the mistake's effect depends on it
    (the engine tries them in order, computing each only while none before it has matched)."""
    mistakes = []

    def at_blocks(hint, pairs, lse="right", scale_used=scale, first_head="", **how):
        for block_m, block_n in pairs:

            def compute(q, k, v, *_, block_m=block_m, block_n=block_n):
                q = _first_head(q) if "q" in first_head else q
                k, v = (_first_head(k), _first_head(v)) if "k" in first_head else (k, v)
                result = _flash64(q, k, v, causal, scale_used, block_m=block_m,
                                  block_n=block_n, **how)  # fmt: skip
                return _part(result, part, lse)

            mistakes.append(KnownMistake(compute, hint))

    whole = [(None, None)]
    looped = [(b, b) for b in BLOCKS if b < n_k]
    if heads > 1:
        for what, fix in FIRST_HEAD_FIXES.items():
            at_blocks(FIRST_HEAD_HINT.format(what=what, fix=fix), whole, first_head=what)
    at_blocks(NO_RESCALE_HINT, looped, rescale=False)
    at_blocks(EACH_STEP_HINT, looped, each_step=True)
    at_blocks(SCALE_NEVER_HINT, whole, scale_used=1.0)
    at_blocks(SCALE_TWICE_HINT, whole, scale_used=scale * scale)
    if not math.isclose(scale, d**-0.5):
        at_blocks(SCALE_IGNORED_HINT, whole, scale_used=d**-0.5)
    # log2 units and exp mixed up: the softmax of the scores scaled by log2(e) or by ln(2)
    for lse in ("exp", "right") if part == "lse" else ("right",):
        at_blocks(EXP_OF_LOG2_HINT, whole, lse=lse, scale_used=scale * LOG2E)
    at_blocks(EXP2_NO_LOG2E_HINT, whole, scale_used=scale * math.log(2))
    keys_hint = KEYS_UNMASKED_CAUSAL_HINT if causal else KEYS_UNMASKED_HINT
    at_blocks(keys_hint, [(b, b) for b in BLOCKS if n_k % b], keys_unmasked=True)
    # offs_n <= key_end: key N_k seen where its block is visited; causal, each query's next
    inclusive_pairs = _block_pairs(True) if causal else [(b, b) for b in BLOCKS if n_k % b]
    at_blocks(ONE_PAST_HINT if causal else KEY_END_INCLUSIVE_HINT, inclusive_pairs,
              key_end_inclusive=True)  # fmt: skip
    if causal:
        pairs = _block_pairs(True)
        at_blocks(DIAGONAL_HIDDEN_HINT, whole, diagonal="hidden")
        at_blocks(ONE_PAST_HINT, whole + pairs, diagonal="one past")
        at_blocks(BOTTOM_RIGHT_HINT, whole, diagonal="bottom right", skip=False)
        at_blocks(MASK_ZERO_HINT, whole + pairs, mask_value=0.0)
    if part == "lse":
        at_blocks(LSE_LOG2_HINT, whole, lse="log2")
        at_blocks(LSE_MAX_HINT, whole, lse="max")
        at_blocks(LSE_MAX_LOG2_HINT, whole, lse="max log2")
        at_blocks(LSE_NO_MAX_HINT, whole, lse="no max")
    return mistakes


def _grads64(
    q, k, v, o, lse, do, causal, scale, *, d_term=True, p_from="lse", dq_scale=1, dk_scale=1,
    leak_block=None, delta_block=None, lse_block=None, lse_past=float("inf"),
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(dq, dk, dv) as a flash backward computes them from the saved o and lse, in float64,
    with one mistake: D left out of dS; P from exp(S) ("exp"), from unscaled scores
    ("unscaled"), from an lse taken for base 2 ("log2 lse"), or from what a forward saved
    wrongly: the lse in base 2 ("saved log2"), the max alone ("saved max"); dq or dk scaled
    `*_scale` times; or, causal, no mask in the backward: with `leak_block` b, its loops
    skip the blocks past the diagonal, so only the keys of a query's own b-block leak
    (leak_block 0: every key); or, with `delta_block` b, dK's D broadcast along the wrong
    axis of a transposed b x b tile: key j of a tile takes the D of the query at its own
    place in the tile, (i // b) * b + j % b, where that query exists, 0 past N_q; or, with
    `lse_block` b, the dK/dV kernel's Pᵀ made with the lse taken likewise (`lse_past` past
    N_q: what the load's `other` gave), while dQ's kernel uses the right P."""
    q64, k64, v64, do64 = q.double(), k.double(), v.double(), do.double()
    n_q, n_k = q.shape[-2], k.shape[-2]
    s = q64 @ k64.transpose(-1, -2)
    lse64 = lse.double()[..., None]
    p = {
        "lse": lambda: torch.exp(s * scale - lse64),
        "exp": lambda: torch.exp(s * scale),
        "unscaled": lambda: torch.exp(s - lse64),
        "log2 lse": lambda: torch.exp(s * scale - lse64 / LOG2E),
        "saved log2": lambda: torch.exp(s * scale - lse64 * LOG2E),
        "saved max": lambda: torch.exp(s * scale - _causal_max(s * scale, causal)),
    }[p_from]()
    i, j = torch.arange(n_q, device=q.device), torch.arange(n_k, device=q.device)

    def tile_place(block: int) -> torch.Tensor:
        """[Nq, Nk]: the query at key j's place in its transposed block x block tile"""
        return i[:, None] // block * block + j[None, :] % block

    hidden = torch.zeros(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        hidden = ~_visible(n_q, n_k, True, "right", q.device)
        if leak_block == 0:
            hidden = torch.zeros_like(hidden)
        elif leak_block:
            hidden = hidden & (i[:, None] // leak_block != j[None, :] // leak_block)
    p = p.masked_fill(hidden, 0.0)
    p_keys = p  # the dK/dV kernel's
    if lse_block:
        padded = torch.nn.functional.pad(lse.double(), (0, lse_block), value=lse_past)
        p_keys = torch.exp(s * scale - padded[..., tile_place(lse_block)]).masked_fill(hidden, 0.0)
    dv = p_keys.transpose(-1, -2) @ do64
    dp = do64 @ v64.transpose(-1, -2)
    delta = (do64 * o.double()).sum(dim=-1, keepdim=True)  # [..., Nq, 1]
    ds = p * (dp - delta) if d_term else p * dp
    dq = ds @ k64 * scale**dq_scale
    if delta_block:
        padded = torch.nn.functional.pad(delta[..., 0], (0, delta_block))  # 0 past N_q
        ds = p * (dp - padded[..., tile_place(delta_block)])
    elif lse_block:
        ds = p_keys * (dp - delta)
    dk = ds.transpose(-1, -2) @ q64 * scale**dk_scale
    return dq, dk, dv


def _causal_max(s: torch.Tensor, causal: bool) -> torch.Tensor:
    """Each query's max of the scaled scores it sees, [..., Nq, 1]."""
    if causal:
        s = s.masked_fill(~_visible(s.shape[-2], s.shape[-1], True, "right", s.device), -math.inf)
    return s.amax(dim=-1, keepdim=True)


def _backward_mistakes(causal: bool, scale: float, part: str) -> list[KnownMistake]:
    index = ("dq", "dk", "dv").index(part)

    def mistake(hint, **how):
        def compute(q, k, v, o, lse, do, *_):
            return _grads64(q, k, v, o, lse, do, causal, scale, **how)[index]

        return KnownMistake(compute, hint)

    mistakes = [
        mistake(UNNORMALISED_P_HINT, p_from="exp"),
        mistake(P_UNSCALED_HINT, p_from="unscaled"),
        mistake(LSE_UNITS_HINT, p_from="log2 lse"),
    ]
    if part != "dv":
        mistakes.append(mistake(NO_D_HINT, d_term=False))
    if part == "dk":
        mistakes += [mistake(DELTA_ROWS_HINT, delta_block=b) for b in BLOCKS]
    if part in ("dk", "dv"):  # past N_q the lesson's load gives 0, the finished kernel's inf
        mistakes += [mistake(LSE_ROWS_HINT, lse_block=b, lse_past=past)
                     for b in BLOCKS for past in (0.0, float("inf"))]  # fmt: skip
    if part in ("dq", "dk"):
        hint = DQ_SCALE_HINT if part == "dq" else DK_SCALE_HINT
        for times, how in ((0, "you left the scale out"), (2, "you applied it twice")):
            mistakes.append(mistake(hint.format(how=how), **{f"{part}_scale": times}))
    if causal:
        mistakes += [mistake(BACKWARD_MASK_HINT, leak_block=b) for b in (0, *BLOCKS)]
    return mistakes


def _backward_shapes(causal: bool) -> list[tuple]:
    rows = [
        (1, 2, 10, 10, 16, torch.float32, "smaller than a block", {}),
        (1, 2, 37, 37, 32, torch.float32, "prime", {}),
        (2, 1, 100, 100, 16, torch.float32, "not a multiple of the block", {}),
        (1, 1, 128, 128, 64, torch.float32, "several blocks", {}),
        (1, 2, 20, 77, 32, torch.float32, "fewer queries than keys", {}),
        (1, 1, 77, 20, 32, torch.float32, "more queries than keys", {}),
        (1, 2, 37, 37, 32, torch.float32, "scale=0.3, not 1/sqrt(d)", {"scale": 0.3}),
    ]
    for dtype in runtime.DTYPES[1:]:
        rows.append((1, 2, 61, 61, 64, dtype, "prime", {}))
    return rows


def _backward_cases(seed: int, causal: bool) -> list[Case]:
    generator = case_generator(seed)
    cases = []
    for b, h, n_q, n_k, d, dtype, why, options in _backward_shapes(causal):
        scale = options.get("scale", d**-0.5)
        q, k, v, do = _inputs(generator, b, h, n_q, n_k, d, dtype, grad=True)
        o = references.attention(q, k, v, causal, scale)
        lse = references.attention_lse(q, k, v, causal, scale)
        inputs = (q, k, v, o, lse, do)
        for part in ("dq", "dk", "dv"):
            reference = _grad_reference(part, causal, scale)
            expected = reference(*inputs)
            cases.append(Case(
                f"{_describe(b, h, n_q, n_k, d, dtype, why)}: {part}", inputs,
                "causal" if causal else "",
                atol_scale=_atol_scale(expected, dtype, max(n_q, n_k)),
                kwargs={"causal": causal, "scale": scale, "part": part},
                reference=reference, mistakes=_backward_mistakes(causal, scale, part),
                input_names=("q", "k", "v", "o", "lse", "do"),
            ))  # fmt: skip
    return cases


def _grad_reference(part: str, causal: bool, scale: float | None) -> Callable:
    def reference(q, k, v, *rest):
        return references.attention_grads(q, k, v, rest[-1], causal, scale)[
            ("dq", "dk", "dv").index(part)
        ]

    return reference


def _autograd_cases(seed: int) -> list[Case]:
    generator = case_generator(seed)
    rows = [
        (1, 2, 37, 37, 32, torch.float32, "prime", False, None),
        (2, 2, 50, 50, 16, torch.float32, "not a multiple of the block", False, None),
        (1, 2, 20, 77, 32, torch.float32, "fewer queries than keys", False, 0.3),
        (1, 2, 37, 37, 32, torch.float32, "prime", True, None),
        (2, 1, 100, 100, 16, torch.float32, "not a multiple of the block", True, None),
        (1, 2, 40, 77, 64, torch.float32, "fewer queries than keys", True, None),
    ]
    # d = 32, not 64: at d = 64 a saved base-2 lse shrinks the gradients by about scale
    # (1/8), which 16-bit tolerances cannot tell from the scale applied twice
    for dtype in runtime.DTYPES[1:]:
        rows += [(1, 2, 61, 61, 32, dtype, "prime", causal, None) for causal in (False, True)]
    cases = []
    for b, h, n_q, n_k, d, dtype, why, causal, scale in rows:
        inputs = _inputs(generator, b, h, n_q, n_k, d, dtype, grad=True)
        used = d**-0.5 if scale is None else scale
        if scale is not None:
            why += f", scale={scale}"
        label = _describe(b, h, n_q, n_k, d, dtype, why) + (", causal" if causal else "")
        for part in ("o", "dq", "dk", "dv"):
            if part == "o":
                reference = _forward_reference("o", causal, used)
                mistakes = _mistakes_for(causal, used, "o", n_k, d, b * h)
            else:
                reference = _grad_reference(part, causal, used)
                mistakes = _autograd_backward_mistakes(causal, used, part, d)
            expected = reference(*inputs)
            cases.append(Case(
                f"{label}: {PARTS[part]}", inputs, "causal" if causal else "",
                atol_scale=_atol_scale(expected, dtype, max(n_q, n_k)),
                kwargs={"causal": causal, "scale": scale, "part": part},
                reference=reference, mistakes=mistakes, input_names=("q", "k", "v", "do"),
            ))  # fmt: skip
    return cases


PARTS = {"o": "forward: o", "dq": "grad_q", "dk": "grad_k", "dv": "grad_v"}


def _autograd_backward_mistakes(causal: bool, scale: float, part: str, d: int) -> list:
    """The backward's mistakes where the check supplies only q, k, v and do: o and lse are
    the right ones, as a right forward saves them, or the forward's scale left behind."""

    def with_saved(mistake: KnownMistake) -> KnownMistake:
        def compute(q, k, v, do):
            o = references.attention(q, k, v, causal, scale)
            lse = references.attention_lse(q, k, v, causal, scale)
            return mistake.compute(q, k, v, o, lse, do)

        return KnownMistake(compute, mistake.hint)

    index = ("dq", "dk", "dv").index(part)

    def saved_wrongly(hint, p_from="lse", backward_scale=scale):
        def compute(q, k, v, do):
            o = references.attention(q, k, v, causal, scale)
            lse = references.attention_lse(q, k, v, causal, scale)
            return _grads64(q, k, v, o, lse, do, causal, backward_scale, p_from=p_from)[index]

        return KnownMistake(compute, hint)

    mistakes = [
        *(with_saved(m) for m in _backward_mistakes(causal, scale, part)),
        saved_wrongly(LSE_LOG2_HINT, "saved log2"),
        saved_wrongly(LSE_MAX_HINT, "saved max"),
    ]
    if not math.isclose(scale, d**-0.5):  # the backward called without ctx.scale
        mistakes.append(saved_wrongly(BACKWARD_DEFAULT_SCALE_HINT, backward_scale=d**-0.5))
    return mistakes


# --- running the learner's function ------------------------------------------------------


def _forward_part(fn: Callable) -> Callable:
    def run(q, k, v, *, part, causal, scale):
        out = fn(q, k, v, causal, scale)
        if not isinstance(out, tuple | list) or len(out) != 2:
            raise NotTwo(f"the forward returned {type(out).__name__}, not (o, lse)")
        return out[("o", "lse").index(part)]

    return run


def _backward_part(fn: Callable) -> Callable:
    def run(q, k, v, o, lse, do, *, part, causal, scale):
        out = fn(q, k, v, o, lse, do, causal, scale)
        if not isinstance(out, tuple | list) or len(out) != 3:
            raise NotThree(f"the backward returned {type(out).__name__}, not (dq, dk, dv)")
        return out[("dq", "dk", "dv").index(part)]

    return run


def _autograd_part(fn: Callable) -> Callable:
    def run(q, k, v, do, *, part, causal, scale):
        leaves = [t.detach() for t in (q, k, v)]
        if part != "o":
            for t in leaves:
                t.requires_grad_(True)
        o = fn(*leaves, causal, scale)
        if part == "o":
            return o.detach() if isinstance(o, torch.Tensor) else o
        grads = kernel_gradients(o, leaves, do)
        return returned(grads[("dq", "dk", "dv").index(part)], part[1])

    return run


def _recording(run: Callable, outputs: list) -> Callable:
    """`run`, keeping what it returned for each case: the rows left unwritten show there."""

    def recorded(*inputs, **kwargs):
        outputs.append(None)
        outputs[-1] = run(*inputs, **kwargs)
        return outputs[-1]

    return recorded


# --- hints only the whole output, or a comparison of cases, reveals ----------------------


def _unwritten_hint(out, part: str) -> str | None:
    """What the pattern of unwritten elements of a [B, H, N, d] (or [B, H, N]) output says:
    whole heads unwritten, or in every head the same last rows, fewer than a block."""
    if not isinstance(out, torch.Tensor) or out.dim() < 3:
        return None
    unwritten = is_poison(out)
    if out.dim() == 4:
        unwritten = unwritten.all(dim=-1)  # [B, H, N]: rows never written
    if unwritten.all() and part in ("dk", "dv"):  # the engine's hint names the queries' grid
        return KEY_BLOCKS_HINT.format(what="no row of keys was written")
    if not unwritten.any() or unwritten.all():  # nothing written: the engine's hint says why
        return None
    heads = unwritten.all(dim=-1)
    if heads.any() and torch.equal(unwritten, heads[..., None].expand_as(unwritten)):
        return HEADS_HINT.format(where=HEAD_STARTS[part])
    rows = unwritten.reshape(-1, unwritten.shape[-1])
    if bool((rows == rows[:1]).all()):
        first = int(rows[0].nonzero()[0]) if rows[0].any() else rows.shape[1]
        n = rows.shape[1]
        if bool(rows[0, first:].all()) and first and n - first < (first & -first):
            if part in ("dk", "dv"):
                return KEY_BLOCKS_HINT.format(
                    what="the last, partial block of keys was never written"
                )
            return LAST_BLOCK_HINT
    return None


def _float32_dots_in_tf32() -> bool:
    """Whether a tl.dot of float32 operands, not told otherwise, runs in TF32: on a GPU."""
    return runtime.MODE == "gpu"


def _refine(
    outputs: list, first_part: str | None
) -> Callable[[Sequence[Case], list[CaseResult]], None]:
    """Sharpen hints across cases: a causal forward's read past N_k named by its loop's
    bound, unwritten rows' pattern, the hint of `first_part` (the forward's o, upstream of
    every gradient) for the other parts of the same inputs, and a 16-bit case's vague hint
    from what the float32 cases named."""

    def refine(cases: Sequence[Case], results: list[CaseResult]) -> None:
        for case, result in zip(cases, results):
            causal_forward = case.kwargs.get("causal") and case.kwargs.get("part") in ("o", "lse")
            if causal_forward and result.hint in (HINTS.read_past_end, HINTS.unmasked_load):
                # a causal forward reads past N_k where its loop's bound forgot N_k
                result.hint = CAUSAL_END_HINT
        vague = {HINTS.wrong_values, HINTS.zeros, HINTS.read_past_end, GRID_HINT, RAISED_HINT,
                 None}  # fmt: skip
        float32 = [r.passed for c, r in zip(cases, results) if c.inputs[0].dtype == torch.float32]
        sixteen = [r.passed for c, r in zip(cases, results) if c.inputs[0].dtype != torch.float32]
        # a mistake that float32 cases name, by part: 16-bit rounding can hide its exact form
        named = {}
        for c, r in zip(cases, results):
            if c.inputs[0].dtype == torch.float32 and not r.passed and r.hint not in vague:
                named.setdefault(c.kwargs.get("part"), set()).add(r.hint)
        first_hint = {
            id(c.inputs): r.hint
            for c, r in zip(cases, results)
            if c.kwargs.get("part") == first_part and r.hint not in vague
        }
        for i, (case, result) in enumerate(zip(cases, results)):
            if result.passed:
                continue
            part = case.kwargs.get("part")
            out = outputs[i] if i < len(outputs) else None
            if "unwritten" in result.kinds and (named := _unwritten_hint(out, part)):
                result.hint = named
            elif part != first_part and first_hint.get(id(case.inputs)):
                # a wrong o makes wrong gradients too: name the forward's mistake
                result.hint = first_hint[id(case.inputs)]
            elif result.hint not in vague:
                continue
            elif case.inputs[0].dtype in (torch.float16, torch.bfloat16) and all(float32):
                result.hint = HALF_HINT
            elif (
                case.inputs[0].dtype == torch.float32
                and sixteen
                and all(sixteen)
                and (_float32_dots_in_tf32())
            ):
                result.hint = TF32_HINT
            elif len(named.get(part, ())) == 1:
                result.hint = next(iter(named[part]))

    return refine


def check_attention_forward(fn: Callable[..., tuple], causal: bool = False) -> CheckResult:
    """Check `fn(q, k, v, causal, scale)`, your flash forward of lesson 10, which returns
    (o, lse): o like q, lse [B, H, Nq] float32, the natural-log logsumexp of each query's
    scaled scores. Sequences smaller than a block, prime, not a multiple of the block, of
    several blocks, Nq != Nk, d of 16, 32 and 64, a scale other than 1/sqrt(d), float32 and
    float16 (bfloat16 on a GPU). With causal=True every case is causal, top-left aligned as
    SDPA's is_causal (query i sees keys j <= i), Nq != Nk included."""
    if not callable(fn):
        raise TypeError(f"check_attention_forward expects your function, got {type(fn)}")
    outputs: list = []
    name = "attention_forward_causal" if causal else "attention_forward"
    return run_check(
        name, _recording(_forward_part(fn), outputs), _forward_cases(20 + causal, causal),
        references.attention, (), HINTS, _refine(outputs, "o"),
    )  # fmt: skip


# the backward's outputs are the gradients: its dtype hint names them
BACKWARD_HINTS = dataclasses.replace(
    HINTS, dtype="allocate dq, dk and dv like q, k and v (torch.empty_like(q), ...)"
)


def check_attention_backward(fn: Callable[..., tuple], causal: bool = False) -> CheckResult:
    """Check `fn(q, k, v, o, lse, do, causal, scale)`, your flash backward of lesson 10,
    which returns (dq, dk, dv), given the forward's o and lse from the reference and a
    random output gradient do, at sizes like the forward check's (see _backward_shapes).
    With causal=True every case is causal."""
    if not callable(fn):
        raise TypeError(f"check_attention_backward expects your function, got {type(fn)}")
    outputs: list = []
    name = "attention_backward_causal" if causal else "attention_backward"
    return run_check(
        name, _recording(_backward_part(fn), outputs), _backward_cases(22 + causal, causal),
        references.attention, (), BACKWARD_HINTS, _refine(outputs, None),
    )  # fmt: skip


# a check cell calls its checker with the learner's function alone (the grader reads it so):
# the causal checks of exercises 2 and 3 under names of their own


def check_attention_forward_causal(fn: Callable[..., tuple]) -> CheckResult:
    """`check_attention_forward(fn, causal=True)`: lesson 10's causal forward."""
    return check_attention_forward(fn, causal=True)


def check_attention_backward_causal(fn: Callable[..., tuple]) -> CheckResult:
    """`check_attention_backward(fn, causal=True)`: lesson 10's backward, causal."""
    return check_attention_backward(fn, causal=True)


def check_attention(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Check `fn(q, k, v, causal, scale)`, your attention through autograd for lesson 10
    (scale None means 1/sqrt(d)): its output o and the gradients of q, k and v that its
    backward gives for a random output gradient, causal and not."""
    if not callable(fn):
        raise TypeError(f"check_attention expects your function, got {type(fn).__name__}")
    outputs: list = []
    return run_check(
        "attention", _recording(_autograd_part(fn), outputs), _autograd_cases(24),
        references.attention, (), HINTS, _refine(outputs, "o"),
    )  # fmt: skip
