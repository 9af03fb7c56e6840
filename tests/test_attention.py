"""Lesson 10's flash attention: the references against SDPA, the finished kernel forward and
backward against float64 (awkward lengths, Nq != Nk, grouped-query attention, the causal
diagonal, every head size), gradcheck, its operator in torch.compile, what it says about
bad input; and the lesson's checkers against deliberately broken kernels."""

import functools
import math
import time

import broken_kernels as broken
import pytest
import torch
import torch.nn.functional as F
from reports import assert_hint_under, assert_no_other_family

import course_lib
from course_lib import DEVICE, ops, references, runtime
from course_lib.checks import CheckFailed
from course_lib.checks import attention as attention_checks
from course_lib.kernels import attention as kernels
from course_lib.kernels.attention import attention


def _qkv(b, h, h_kv, n_q, n_k, d, dtype=torch.float32, seed=0, grad=False):
    generator = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=generator).to(DEVICE, dtype)  # noqa: E731
    q, k, v = make(b, h, n_q, d), make(b, h_kv, n_k, d), make(b, h_kv, n_k, d)
    return (q, k, v, make(b, h, n_q, d)) if grad else (q, k, v)


# --- the references --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("h", "h_kv", "n_q", "n_k"),
    [(4, 4, 9, 9), (4, 2, 7, 13), (6, 2, 13, 7), (2, 1, 1, 5)],
    ids=["mha", "gqa-fewer-queries", "gqa-more-queries", "one-query"],
)
def test_the_references_agree_with_sdpa(h, h_kv, n_q, n_k, causal):
    q, k, v, do = _qkv(2, h, h_kv, n_q, n_k, 8, torch.float64, grad=True)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(references.attention(q, k, v, causal), expected)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True, scale=0.3)
    expected_grads = torch.autograd.grad(out, leaves, do)
    for got, want in zip(references.attention_grads(q, k, v, do, causal, 0.3), expected_grads):
        torch.testing.assert_close(got, want)
    scores = q @ k.repeat_interleave(h // h_kv, dim=1).transpose(-1, -2) / 8**0.5
    if causal:
        hidden = torch.ones(n_q, n_k, device=q.device).triu(1).bool()
        scores = scores.masked_fill(hidden, float("-inf"))
    torch.testing.assert_close(
        references.attention_lse(q, k, v, causal), torch.logsumexp(scores, -1).float()
    )


def test_attention_flops_counts_two_products_and_halves_the_causal_square():
    assert references.attention_flops(2, 3, 128, 256, 64, False) == 4 * 2 * 3 * 128 * 256 * 64
    assert references.attention_flops(1, 1, 512, 512, 64, True) == 2 * 512 * 512 * 64
    # causal with Nq != Nk counts the pairs seen: query i sees min(i + 1, Nk) keys
    assert references.attention_flops(1, 1, 3, 2, 1, True) == 4 * (1 + 2 + 2)


# --- the checkers ----------------------------------------------------------------------------


def test_the_lessons_correct_kernels_pass_without_hints_and_quickly():
    """A learner's check cell must stay well under a minute at the lesson's blocks."""
    for check, fn, causal in [
        (course_lib.check_attention_forward, broken.attention_forward, False),
        (course_lib.check_attention_forward, broken.attention_forward, True),
        (course_lib.check_attention_backward, broken.attention_backward, False),
        (course_lib.check_attention_backward, broken.attention_backward, True),
    ]:
        start = time.process_time()  # this process's CPU time: other workers do not count
        result = check(fn, causal=causal)
        assert result.passed and not any(c.hint for c in result.cases)
        assert time.process_time() - start < 45
    result = course_lib.check_attention(broken.attention)
    assert result.passed and not any(c.hint for c in result.cases)


def test_the_checks_cover_the_awkward_cases():
    for causal in (False, True):
        labels = " | ".join(c.label for c in attention_checks._forward_cases(20, causal))
        for needed in ("smaller than a block", "prime", "not a multiple of the block",
                       "several blocks", "Nq=20, Nk=77", "Nq=77, Nk=20", "d=16", "d=32",
                       "d=64", "float16", "scale=0.3", ": o", ": lse"):  # fmt: skip
            assert needed in labels, needed
        assert all(
            c.kwargs["causal"] == causal for c in attention_checks._forward_cases(20, causal)
        )
    parts = {c.label.rsplit(": ", 1)[1] for c in attention_checks._backward_cases(22, False)}
    assert parts == {"dq", "dk", "dv"}
    cases = attention_checks._autograd_cases(24)
    assert {c.kwargs["causal"] for c in cases} == {False, True}
    assert {c.label.rsplit(": ", 1)[1] for c in cases} == {"o", "grad_q", "grad_k", "grad_v"}


def test_the_backward_check_gives_the_references_o_and_lse_and_a_random_gradient():
    for case in attention_checks._backward_cases(22, True)[::3]:
        q, k, v, o, lse, do = case.inputs
        assert torch.equal(o, references.attention(q, k, v, True, case.kwargs["scale"]))
        assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
        assert do.numel() == 1 or do.float().std() > 0.5


def _failure(check, fn, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(fn, **kwargs)
    return info.value.result.report()


@functools.cache
def _report(fn, causal: bool) -> str:
    """Each broken function runs its check once, however many tests read the report."""
    name = fn.__name__
    if name.startswith("attention_forward"):
        return _failure(course_lib.check_attention_forward, fn, causal=causal)
    if name.startswith("attention_backward"):
        return _failure(course_lib.check_attention_backward, fn, causal=causal)
    return _failure(course_lib.check_attention, fn)


# the hints that name a mistake, by family: a report may show its own family's, no other
ATTENTION_FAMILIES = {
    "rescale": ["what was summed so far is on the old max's scale"],
    "scale": ["the scores were never scaled", "the scale was applied twice",
              "you used 1/sqrt(d) where the scale argument says otherwise"],
    "diagonal": ["the causal mask hides the diagonal", "one key too many",
                 "aligned the causal diagonal to the bottom right"],
    "mask value": ["masked scores must be -inf"],
    "each step": ["you divided acc by the running sum l at every step"],
    "keys": ["keys past N_k took part in the softmax"],
    "key end": ["every query saw one key past the last"],
    "read past": ["a load read past the end of an input",
                  "the loop over keys read past the end of k and v"],
    "lse": ["you saved the base-2 logsumexp", "you saved the running max alone",
            "you saved log(l) alone"],
    "grid": ["the last, partial block of queries has no program", "whole heads were never",
             "the grid has no programs"],
    "D": ["dS is missing D"],
    "P": ["P here was never normalised", "P was recomputed from unscaled scores",
          "lse is in natural log: with exp2"],
    "dq scale": ["dQ = dS·K·scale"],
    "dk scale": ["dK = dSᵀ·Q·scale"],
    "backward mask": ["the backward too must hide the keys"],
    "autograd": ["the result carries no gradient"],
    "gradient count": ["return one gradient per argument of forward"],
    "first head": ["only the first head is right"],
    "exp": ["but you exponentiated them with tl.exp", "tl.exp2 of scores scaled by scale alone"],
    "delta axis": ["subtracted D along the wrong axis"],
    "lse axis": ["took the lse along the wrong axis"],
    "backward scale": ["your backward used the default scale"],
    "key grid": ["the last, partial block of keys was never written", "no row of keys was written"],
    "half": ["keep m, l and acc in float32"],
    "tf32": ["tl.dot multiplies float32 in TF32"],
}  # fmt: skip
PRIME = "B=1, H=2, N=37, d=32 (prime), float32"
PRIME_FP16 = "B=1, H=2, N=61, d=64 (prime), float16"
ATTENTION_MISTAKES = [
    # broken function, causal, a case it fails, the hint under that case, the families it may show
    (broken.attention_forward_no_rescale, False, f"{PRIME}: o",
     "what was summed so far is on the old max's scale", {"rescale"}),
    (broken.attention_forward_scale_never, False, f"{PRIME}: lse",
     "the scores were never scaled", {"scale"}),
    (broken.attention_forward_scale_twice, True, f"{PRIME_FP16}: o",
     "the scale was applied twice", {"scale"}),
    (broken.attention_forward_mask_zero, True, f"{PRIME}: o",
     "masked scores must be -inf", {"mask value"}),
    (broken.attention_forward_diagonal_hidden, True, f"{PRIME}: lse",
     "the causal mask hides the diagonal", {"diagonal"}),
    (broken.attention_forward_diagonal_hidden, True, f"{PRIME}: o",
     "key_end = min(offs_m + 1, N_k), the keys offs_n < key_end", {"diagonal"}),
    (broken.attention_forward_one_past_diagonal, True, f"{PRIME}: o",
     "one key too many", {"diagonal"}),
    (broken.attention_forward_one_past_diagonal, True, f"{PRIME}: o",
     "keep the keys offs_n < key_end, key_end = min(offs_m + 1, N_k)", {"diagonal"}),
    (broken.attention_forward_bottom_right, True, "Nq=20, Nk=77, d=32 (fewer queries than "
     "keys), float32: o", "aligned the causal diagonal to the bottom right", {"diagonal"}),
    (broken.attention_forward_normalise_each_step, False, f"{PRIME}: o",
     "you divided acc by the running sum l at every step", {"each step"}),
    (broken.attention_forward_lse_log2, False, f"{PRIME}: lse",
     "you saved the base-2 logsumexp", {"lse"}),
    (broken.attention_forward_lse_max, True, f"{PRIME}: lse",
     "you saved the running max alone", {"lse"}),
    (broken.attention_forward_keys_not_masked, True, "Nq=77, Nk=20, d=64 (more queries than "
     "keys), float32: o",
     "keys past N_k took part in the softmax", {"keys"}),
    (broken.attention_forward_keys_not_masked, True, "Nq=77, Nk=20, d=64 (more queries than "
     "keys), float32: o",
     "key_end = min(offs_m + 1, N_k), whose min keeps a query past N_k from seeing", {"keys"}),
    (broken.attention_forward_keys_not_masked, False, f"{PRIME}: o",
     "s = tl.where(offs_n[None, :] < key_end[:, None], s, float('-inf')), key_end = N_k",
     {"keys"}),
    (broken.attention_forward_key_end_inclusive, False, f"{PRIME}: o",
     "every query saw one key past the last, key N_k: the mask offs_n <= key_end keeps it",
     {"key end"}),
    (broken.attention_forward_key_end_inclusive, False, f"{PRIME_FP16}: lse",
     "every query saw one key past the last", {"key end"}),
    (broken.attention_forward_key_end_inclusive, True, f"{PRIME}: o",
     "one key too many (j <= i + 1): keep the keys offs_n < key_end", {"diagonal"}),
    (broken.attention_forward_no_load_mask, False, f"{PRIME}: o",
     "a load read past the end of an input", {"read past"}),
    (broken.attention_forward_end_past_keys, True, f"{PRIME}: o",
     "hi = min((pid_m + 1) * BLOCK_M, N_k)", {"read past"}),
    (broken.attention_forward_end_past_keys, True, "Nq=77, Nk=20, d=64 (more queries than "
     "keys), float32: o", "hi = min((pid_m + 1) * BLOCK_M, N_k)", {"read past"}),
    (broken.attention_forward_grid_floor, False, f"{PRIME}: o",
     "the last, partial block of queries has no program", {"grid"}),
    (broken.attention_forward_grid_floor, False, "(smaller than a block), float32: o",
     "the grid has no programs", {"grid"}),
    (broken.attention_forward_sums_in_half, False, f"{PRIME_FP16}: lse",
     "keep m, l and acc in float32", {"half"}),
    (broken.attention_backward_key_grid_floor, False, f"{PRIME}: dv",
     "the last, partial block of keys was never written", {"key grid"}),
    (broken.attention_backward_key_grid_floor, False, "(smaller than a block), float32: dk",
     "no row of keys was written", {"key grid"}),
    (broken.attention_backward_without_d, False, f"{PRIME}: dq", "dS is missing D", {"D"}),
    (broken.attention_backward_without_d, False, f"{PRIME_FP16}: dk", "dS is missing D", {"D"}),
    (broken.attention_backward_dv_unnormalised, False, f"{PRIME}: dv",
     "P here was never normalised", {"P"}),
    (broken.attention_backward_lse_as_log2, False, f"{PRIME}: dv",
     "lse is in natural log: with exp2", {"P"}),
    (broken.attention_backward_unscaled, False, f"{PRIME}: dq",
     "dQ = dS·K·scale: you left the scale out", {"dq scale", "dk scale"}),
    (broken.attention_backward_unscaled, False, f"{PRIME}: dk",
     "dK = dSᵀ·Q·scale: you left the scale out", {"dq scale", "dk scale"}),
    (broken.attention_backward_no_causal_mask, True, f"{PRIME}: dk",
     "the backward too must hide the keys", {"backward mask"}),
    (broken.attention_without_d, False, f"{PRIME}, causal: grad_k", "dS is missing D", {"D"}),
    (broken.attention_lse_log2, False, f"{PRIME}: grad_q", "you saved the base-2 logsumexp",
     {"lse"}),
    (broken.attention_no_rescale, False, f"{PRIME}: grad_q",
     "what was summed so far is on the old max's scale", {"rescale"}),
    (broken.attention_without_function, False, f"{PRIME}: grad_q",
     "the result carries no gradient", {"autograd"}),
    # grad_q, not grad_v: on a GPU dV came out right from the NaN that o and lse carried
    (broken.attention_end_past_keys, False, f"{PRIME}, causal: grad_q",
     "hi = min((pid_m + 1) * BLOCK_M, N_k)", {"read past"}),
    (broken.attention_forward_q_and_o_of_head_0, False, f"{PRIME}: o",
     "whole heads were never written: axis 1 of the grid must have B * H programs, and each "
     "must store into its own head, head = tl.program_id(1): o_ptr + head * N_q * d",
     {"grid", "first head"}),
    (broken.attention_forward_q_and_o_of_head_0, False, f"{PRIME}: lse",
     "every program read q of head 0. Move q's pointer (and o's) to the program's own head, "
     "q_ptr + head * N_q * d", {"grid", "first head"}),
    (broken.attention_forward_kv_of_head_0, True, f"{PRIME_FP16}: o",
     "every program read k and v of head 0. Move k's and v's pointers to the program's own "
     "head, k_head = k_ptr + head * N_k * d", {"first head"}),
    (broken.attention_forward_qkv_of_head_0, False, "N=100, d=16 (not a multiple of the "
     "block), float32: lse", "every program read q, k and v of head 0", {"first head"}),
    (broken.attention_forward_qkv_of_head_0, False, f"{PRIME}: o",
     "every program read q, k and v of head 0. Move every pointer to the program's own "
     "head", {"first head"}),
    (broken.attention_forward_exp_of_log2, True, f"{PRIME}: lse",
     "your scores are in log2 units (qk_scale = scale * LOG2E) but you exponentiated them "
     "with tl.exp", {"exp"}),
    (broken.attention_forward_exp_of_log2, True, f"{PRIME_FP16}: o",
     "but you exponentiated them with tl.exp", {"exp"}),
    (broken.attention_forward_exp2_without_log2e, False, f"{PRIME}: o",
     "you took tl.exp2 of scores scaled by scale alone: exp2 wants them in log2 units, "
     "qk_scale = scale * LOG2E", {"exp"}),
    (broken.attention_forward_exp2_without_log2e, False, f"{PRIME_FP16}: lse",
     "tl.exp2 of scores scaled by scale alone", {"exp"}),
    (broken.attention_backward_delta_rows, False, f"{PRIME}: dk",
     "subtracted D along the wrong axis: in the transposed tile the queries run along the "
     "columns, so delta[None, :], not delta[:, None]", {"delta axis"}),
    (broken.attention_backward_delta_rows, False, f"{PRIME_FP16}: dk",
     "subtracted D along the wrong axis", {"delta axis"}),
    (broken.attention_backward_lse_rows, False, f"{PRIME}: dv",
     "took the lse along the wrong axis: in the transposed tile the queries run along the "
     "columns, so lse[None, :], not lse[:, None]", {"lse axis"}),
    (broken.attention_backward_lse_rows, True, f"{PRIME}: dk",
     "took the lse along the wrong axis", {"lse axis"}),
    (broken.attention_backward_lse_rows, False, f"{PRIME_FP16}: dv",
     "took the lse along the wrong axis", {"lse axis"}),
    (broken.attention_default_scale_in_backward, False, "Nq=20, Nk=77, d=32 (fewer queries "
     "than keys, scale=0.3), float32: grad_k", "your backward used the default scale "
     "1/sqrt(d), not the one forward was given: keep scale on ctx in forward and pass "
     "ctx.scale to flash_backward", {"backward scale"}),
    (broken.attention_three_gradients, False, f"{PRIME}, causal: grad_k",
     "return one gradient per argument of forward, None for causal and scale: "
     "return dq, dk, dv, None, None", {"gradient count"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "causal", "case", "hint", "families"),
    ATTENTION_MISTAKES,
    ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(ATTENTION_MISTAKES)],
)
def test_attention_checks_name_the_mistake_and_no_other(fn, causal, case, hint, families):
    report = _report(fn, causal)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, families, ATTENTION_FAMILIES)


@pytest.mark.parametrize("past", [0.0, float("inf")], ids=["lessons-load", "finished-load"])
def test_the_lse_axis_replay_is_what_each_load_gives(past):
    """The lse taken along the wrong axis of the transposed tile: past N_q a kernel gets what
    its load of the lse gives there, 0 in the lesson's, inf in the finished one's. The replay
    of each matches its kernel where query tiles run past N_q (37 queries, blocks of 16),
    and not the other's: both forms are needed."""
    q, k, v, do = _qkv(1, 2, 2, 37, 37, 32, grad=True)
    o = references.attention(q, k, v, False, 0.3)
    lse = references.attention_lse(q, k, v, False, 0.3)
    broken_lse_rows = broken._attn_backward_variant("lse_rows", LSE_ROWS=True, LSE_PAST=past)
    _, dk, dv = broken_lse_rows(q, k, v, o, lse, do, False, 0.3)
    for past_replayed in (0.0, float("inf")):
        replay = attention_checks._grads64(
            q, k, v, o, lse, do, False, 0.3, lse_block=broken.ATTN_BLOCK, lse_past=past_replayed
        )
        same = [torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4)
                for got, want in ((dk, replay[1]), (dv, replay[2]))]  # fmt: skip
        assert same == [past_replayed == past] * 2, (past, past_replayed)


def test_no_two_mistakes_with_different_hints_replay_alike():
    """Where a mistake's replay is what a learner's kernel returned, no replay with another
    hint may match it within the case's tolerance, in any case of the four checks, 16-bit
    ones included: the check could not tell the two apart, and its hint would be a guess
    (the scale never applied or twice, the exp and exp2 mix-ups with their factors log2(e)
    and ln(2), the first head's inputs, D along the wrong axis, the backward's default
    scale, and every other form)."""
    from course_lib.checks.tolerances import tolerance_for

    checks = attention_checks
    cases = [*checks._forward_cases(20, False), *checks._forward_cases(21, True),
             *checks._backward_cases(22, False), *checks._backward_cases(23, True),
             *checks._autograd_cases(24)]  # fmt: skip
    seen = 0
    for case in cases:
        expected = case.reference(*case.inputs)
        tol = tolerance_for(case.tolerance or expected.dtype)
        close = functools.partial(torch.isclose, rtol=tol.rtol, atol=tol.atol * case.atol_scale,
                                  equal_nan=True)  # fmt: skip
        # as the engine compares them: each replay in the output's dtype
        replays = [m.compute(*case.inputs).to(expected.dtype).double() for m in case.mistakes]
        expected = expected.double()
        for mistake, out in zip(case.mistakes, replays):
            wrong = ~close(out, expected)
            if not wrong.any():
                continue  # this case cannot show this mistake
            seen += 1
            for other, alternative in zip(case.mistakes, replays):
                if other.hint != mistake.hint:
                    assert not close(out, alternative)[wrong].all(), (case.label, mistake.hint,
                                                                     other.hint)  # fmt: skip
    assert seen > 1000


def test_float32_multiplied_in_tf32_on_a_gpu_is_named(monkeypatch):
    """On a GPU a float32 tl.dot runs in TF32 unless told otherwise: its float32 cases fail
    where the 16-bit ones pass. The interpreter multiplies exactly, so the broken kernel
    rounds its operands to TF32's 10 bits of mantissa, and the check is told it runs on a
    GPU; in the interpreter the same failures get no TF32 hint."""
    check, fn = course_lib.check_attention_forward, broken.attention_forward_tf32_like
    monkeypatch.setattr(attention_checks, "_float32_dots_in_tf32", lambda: False)
    assert "TF32" not in _failure(check, fn)
    monkeypatch.setattr(attention_checks, "_float32_dots_in_tf32", lambda: True)
    report = _failure(check, fn)
    assert_hint_under(report, f"{PRIME}: o", "tl.dot multiplies float32 in TF32")
    assert_no_other_family(report, {"tf32"}, ATTENTION_FAMILIES)


# --- the finished kernel -----------------------------------------------------------------------

SHAPES = [  # B, H, Hkv, Nq, Nk, d
    pytest.param((1, 2, 2, 1, 1, 16), id="one-query-one-key"),
    pytest.param((1, 2, 2, 10, 10, 16), id="smaller-than-a-block"),
    pytest.param((2, 3, 3, 37, 37, 32), id="prime"),
    pytest.param((1, 2, 2, 100, 100, 64), id="several-blocks"),
    pytest.param((1, 2, 2, 20, 77, 32), id="fewer-queries"),
    pytest.param((1, 2, 2, 77, 20, 32), id="more-queries"),
    pytest.param((2, 4, 2, 33, 45, 16), id="gqa-2"),
    pytest.param((1, 6, 1, 40, 40, 32), id="gqa-6-to-1"),
    pytest.param((1, 1, 1, 50, 40, 128), id="d128"),
    pytest.param((1, 1, 1, 33, 35, 256), id="d256"),
]
KERNEL_DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in runtime.DTYPES]


def _close(got, want, terms):
    """Within a few roundings of the inputs' dtype, by norm relative to the expected one's,
    or to unit values where that is smaller (one key: dk is exactly 0)."""
    scale = max(float(want.double().norm()), want.numel() ** 0.5)
    error = float((got.detach().double() - want.double()).norm()) / scale
    bound = {torch.float32: 1e-5, torch.float64: 1e-12}.get(got.dtype, 1e-2)
    assert error < bound * max(1.0, terms**0.5 / 4), (error, got.dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_forward_and_backward_match_float64(shape, dtype, causal):
    b, h, h_kv, n_q, n_k, d = shape
    q, k, v, do = _qkv(b, h, h_kv, n_q, n_k, d, dtype, grad=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attention(*leaves, causal=causal)
    grads = torch.autograd.grad(o, leaves, do)
    _close(o, references.attention(q, k, v, causal), n_k)
    lse = kernels.forward(q, k, v, causal)[1]
    torch.testing.assert_close(lse, references.attention_lse(q, k, v, causal), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, references.attention_grads(q, k, v, do, causal)):
        _close(got, want, max(n_q, n_k))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_stay_finite_where_every_score_is_far_below_zero(causal):
    """Scores near -100: a key past N_k, scored 0 where it is not masked, would overflow
    its probability, and inf times its zero k would put NaN into dq."""
    q, k, v, do = _qkv(1, 2, 2, 40, 37, 16, torch.float32, grad=True)
    q, k = q.abs() + 5, -(k.abs() + 5)  # every scaled score about -100 or below
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(attention(*leaves, causal=causal), leaves, do)
    for got, want in zip(grads, references.attention_grads(q, k, v, do, causal)):
        assert torch.isfinite(got).all()
        _close(got, want, 40)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_backward_is_right_where_its_query_and_key_blocks_differ_in_size(causal, monkeypatch):
    """The dQ kernel at 64 queries by 32 keys a block and the dK/dV kernel at 32 by 64, as on
    a GPU, where the causal diagonal crosses two key blocks of one query block (the
    interpreter's own tile is square): sizes ending inside a block, Nq > Nk and Nq < Nk, a
    single key, against float64."""
    from course_lib.kernels import attention_plans as plans

    monkeypatch.setattr(plans, "_tile", lambda table, kernels, dtype, d: table[d])
    for b, h, h_kv, n_q, n_k, d in [(1, 2, 1, 100, 64, 16), (2, 2, 2, 45, 130, 16),
                                    (1, 1, 1, 70, 1, 16)]:  # fmt: skip
        q, k, v, do = _qkv(b, h, h_kv, n_q, n_k, d, grad=True)
        tiles = kernels.KERNELS._replace(dq_tiles={d: (64, 32, 4, 1)},
                                         dkdv_tiles={d: (32, 64, 4, 1)})  # fmt: skip
        o, lse = kernels.forward(q, k, v, causal)
        plan = plans.BackwardPlan(do, q, k, v, o, lse, causal, d**-0.5, tiles)
        grads = plan(do, q, k, v, o, lse)
        for got, want in zip(grads, references.attention_grads(q, k, v, do, causal)):
            _close(got, want, max(n_q, n_k))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_in_float64(causal):
    q, k, v = _qkv(1, 4, 2, 5, 7, 16, torch.float64, seed=3)
    leaves = [t.requires_grad_() for t in (q.transpose(1, 2).contiguous().transpose(1, 2), k, v)]
    # fast mode: the Jacobian against random directions, a few calls instead of one per input
    fn = lambda q, k, v: attention(q, k, v, causal, 0.7)  # noqa: E731
    assert torch.autograd.gradcheck(fn, leaves, fast_mode=True)


def test_strided_inputs_are_read_through_their_strides():
    """q, k, v as [B, N, H, d] tensors seen as [B, H, N, d], as a fused projection leaves them."""
    q, k, v, do = _qkv(2, 3, 3, 29, 29, 32, grad=True)
    bnhd = [t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    assert not bnhd[0].is_contiguous()
    o = attention(*bnhd, causal=True)
    _close(o, references.attention(q, k, v, True), 29)
    for got, want in zip(
        torch.autograd.grad(o, bnhd, do), references.attention_grads(q, k, v, do, True)
    ):
        _close(got, want, 29)


def test_the_gradients_are_the_same_on_every_run():
    q, k, v, do = _qkv(1, 6, 2, 70, 70, 32, grad=True)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        runs.append(torch.autograd.grad(attention(*leaves), leaves, do))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_no_lse_is_kept_without_a_backward_to_come():
    q, k, v = _qkv(1, 2, 2, 20, 20, 16)
    o = attention(q, k, v)
    assert o.grad_fn is None
    _close(o, references.attention(q, k, v), 20)


def test_empty_inputs():
    q, k, v = _qkv(2, 2, 2, 0, 5, 16)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    o = attention(*leaves)
    assert o.shape == (2, 2, 0, 16)
    grads = torch.autograd.grad(o.sum(), leaves)
    assert [g.shape for g in grads] == [t.shape for t in leaves] and not grads[1].any()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), ValueError, "head dimension d=8"),
        (lambda q, k, v: (q, k[:, :1].expand(-1, 3, -1, -1), v), ValueError, "k and v must be"),
        (lambda q, k, v: (q[:, :3], k, v), ValueError, "multiple of k's"),
        (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, "share one dtype"),
        (lambda q, k, v: (q, k.half(), v), TypeError, "share one dtype"),
        (lambda q, k, v: (q[0], k[0], v[0]), ValueError, r"must be \[B, heads, N, d\]"),
        (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), ValueError, "no keys"),
        (lambda q, k, v: (q, "k", v), TypeError, "expects tensors"),
    ],
    ids=["d8", "kv-shapes", "heads", "int", "mixed-dtypes", "3d", "no-keys", "str"],
)
def test_bad_input_gets_a_clear_error(change, error, message):
    q, k, v = _qkv(1, 4, 2, 8, 8, 16)
    with pytest.raises(error, match=message):
        attention(*change(q, k, v))


def test_more_heads_than_a_grid_holds_get_a_clear_error():
    q = torch.empty(1, 1, 4, 16, device=DEVICE).expand(65536, 1, 4, 16)  # no memory taken
    with pytest.raises(ValueError, match=r"B \* H = 65536 heads .* at most 65535 sequences"):
        attention(q, q, q)


def test_a_bad_causal_or_scale_gets_a_clear_error():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16)
    with pytest.raises(TypeError, match="causal must be True or False"):
        attention(q, k, v, causal=1)
    with pytest.raises(TypeError, match="scale must be a finite number"):
        attention(q, k, v, scale=float("nan"))


@pytest.mark.skipif(runtime.MODE == "gpu", reason="bfloat16 runs on a GPU")
def test_bfloat16_in_the_interpreter_is_refused_plainly():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 needs a GPU"):
        attention(q, k, v)


def test_the_finished_kernel_passes_the_lessons_checks():
    def forward(q, k, v, causal, scale):
        return kernels.forward(q, k, v, causal, scale)

    def backward(q, k, v, o, lse, do, causal, scale):
        return kernels.backward(do, q, k, v, o, lse, causal, scale)

    for causal in (False, True):
        course_lib.check_attention_forward(forward, causal=causal)
        course_lib.check_attention_backward(backward, causal=causal)
    course_lib.check_attention(attention)


# --- GPU: bfloat16, long sequences, wide heads, memory --------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((2, 8, 8, 4096, 4096, 128), torch.bfloat16), ((1, 8, 2, 4096, 4096, 64), torch.bfloat16),
     ((1, 4, 4, 4099, 4099, 256), torch.bfloat16), ((1, 4, 4, 1000, 3001, 128), torch.float16),
     ((1, 2, 2, 1023, 1023, 64), torch.float32), ((1, 1, 1, 130, 70, 32), torch.float64)],
    ids=["bf16-d128", "bf16-gqa-d64", "bf16-d256-prime", "fp16-nq-nk", "fp32", "fp64"],
)  # fmt: skip
def test_long_sequences_on_a_gpu(shape, dtype, causal):
    b, h, h_kv, n_q, n_k, d = shape
    q, k, v, do = _qkv(b, h, h_kv, n_q, n_k, d, dtype, grad=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attention(*leaves, causal=causal)
    grads = torch.autograd.grad(o, leaves, do)
    # against SDPA in float32 by relative norm: both round P in their own way
    wide = [t.float().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*wide, is_causal=causal, enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, wide, do.float())
    for got, want in zip((o, *grads), (expected, *expected_grads)):
        error = float((got.double() - want.double()).norm() / want.double().norm())
        assert error < {torch.float32: 1e-4, torch.float64: 1e-4}.get(dtype, 2e-2), error


@pytest.mark.gpu
def test_the_finished_kernel_passes_the_checks_with_bfloat16_on_a_gpu():
    test_the_finished_kernel_passes_the_lessons_checks()


@pytest.mark.skipif(runtime.MODE == "gpu", reason="float32 dots would run in TF32 there")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_hopper_forward_computes_the_lessons_forward_in_the_interpreter(causal):
    """attention_tma.py's kernel, which only a Hopper GPU takes in attention(), run here by
    hand at a small tile: grouped heads, Nq != Nk, sizes ending inside a block, q strided."""
    from course_lib.kernels import attention_tma

    for b, h, h_kv, n_q, n_k, d in [(1, 4, 2, 37, 77, 16), (2, 3, 3, 100, 29, 32)]:
        q, k, v = _qkv(b, h, h_kv, n_q, n_k, d)
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        o, lse = torch.empty(q.shape), torch.empty(b, h, n_q)  # o contiguous, as the plan makes it
        attention_tma.forward_launch(q, k, v, causal, 0.3, tile=(32, 32, 4, 1))(q, k, v, o, lse)
        _close(o, references.attention(q, k, v, causal, 0.3), n_k)
        _close(lse, references.attention_lse(q, k, v, causal, 0.3), n_k)


@pytest.mark.skipif(runtime.MODE == "gpu", reason="float32 dots would run in TF32 there")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_hopper_backward_computes_the_lessons_gradients_in_the_interpreter(causal):
    """attention_tma.py's dK/dV and dQ kernels, run here by hand at tiles of 32 queries by
    16 keys and the reverse (the causal diagonal crosses two blocks): grouped heads, Nq !=
    Nk, sizes ending inside a block, a single key, q strided; against float64."""
    from course_lib.kernels import attention_tma

    for b, h, h_kv, n_q, n_k, d in [(1, 4, 2, 37, 77, 16), (2, 3, 3, 100, 29, 32),
                                    (1, 2, 1, 45, 1, 16)]:  # fmt: skip
        q, k, v, do = _qkv(b, h, h_kv, n_q, n_k, d, grad=True)
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        o, lse = kernels.forward(q, k, v, causal, 0.3)
        delta = (o * do).sum(-1)
        want = references.attention_grads(q, k, v, do, causal, 0.3)
        for tile in [(32, 16, 4, 1), (16, 32, 4, 1)]:
            # NaN where a kernel writes nothing; the plan makes its outputs contiguous
            dq, dk, dv = (torch.full(t.shape, math.nan) for t in (q, k, v))
            dkdv = attention_tma.dkdv_launch(q, k, v, do, causal, 0.3, tile)
            dkdv(q, k, v, do, lse, delta, dk, dv)
            attention_tma.dq_launch(q, k, v, do, causal, 0.3, tile)(q, k, v, do, lse, delta, dq)
            for got, expected in zip((dq, dk, dv), want):
                _close(got, expected, max(n_q, n_k))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape",
    [(1, 4, 2, 37, 77, 128), (2, 3, 3, 100, 29, 128), (1, 2, 1, 257, 257, 128),
     (1, 2, 2, 129, 1000, 128), (1, 1, 1, 1, 5, 128)],
    ids=["gqa-prime", "more-queries", "gqa-past-blocks", "fewer-queries", "one-query"],
)  # fmt: skip
def test_the_hopper_forward_on_awkward_sizes(shape, causal):
    """The TMA forward (attention_tma.py), which a Hopper GPU runs for 16-bit inputs with d
    = 128: sizes that end inside a block, Nq != Nk, grouped heads, and q laid out
    [B, N, H, d] as a fused projection leaves it; o and lse against float64."""
    from course_lib.bench.recording import recording_launches
    from course_lib.kernels import attention_tma

    b, h, h_kv, n_q, n_k, d = shape
    dtype = torch.float16 if n_q % 2 else torch.bfloat16
    q, k, v = _qkv(b, h, h_kv, n_q, n_k, d, dtype)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if not attention_tma.suits(q, k, v):
        pytest.skip("not a GPU the TMA forward runs on")
    with recording_launches() as launches:
        o, lse = kernels.forward(q, k, v, causal, 0.3)
    assert [launch.kernel for launch in launches] == [attention_tma.attention_fwd_tma_kernel]
    _close(o, references.attention(q, k, v, causal, 0.3), n_k)
    _close(lse, references.attention_lse(q, k, v, causal, 0.3), n_k)
    # a q one element off a 16-byte boundary breaks the unit's rules: the lesson's kernel
    offset = torch.empty(q.numel() + 1, device=q.device, dtype=q.dtype)[1:].view(q.shape)
    offset.copy_(q)
    assert not attention_tma.suits(offset, k, v)
    _close(kernels.forward(offset, k, v, causal, 0.3)[0], o.float(), n_k)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape",
    [(1, 4, 2, 37, 77, 128), (2, 3, 3, 100, 29, 64), (1, 2, 1, 257, 257, 128),
     (1, 2, 2, 129, 1000, 64), (1, 1, 1, 1, 5, 128)],
    ids=["gqa-prime", "more-queries", "gqa-past-blocks", "fewer-queries", "one-query"],
)  # fmt: skip
def test_the_hopper_backward_on_awkward_sizes(shape, causal):
    """The TMA dK/dV kernel (d = 128) and dQ kernel (d = 64 and 128), which a Hopper GPU
    runs for 16-bit inputs: the kernels launched, and the gradients against float64, with q
    laid out [B, N, H, d]; a dO off a 16-byte boundary goes to the lesson's kernels."""
    from course_lib.bench.recording import recording_launches
    from course_lib.kernels import attention_tma

    b, h, h_kv, n_q, n_k, d = shape
    dtype = torch.float16 if n_q % 2 else torch.bfloat16
    q, k, v, do = _qkv(b, h, h_kv, n_q, n_k, d, dtype, grad=True)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if not attention_tma.tma_suits(attention_tma.TMA_DQ_TILES, q, k, v, do):
        pytest.skip("not a GPU the TMA backward runs on")
    o, lse = kernels.forward(q, k, v, causal, 0.3)
    with recording_launches() as launches:
        grads = kernels.backward(do, q, k, v, o, lse, causal, 0.3)
    tma = {attention_tma.attention_dkdv_tma_kernel, attention_tma.attention_dq_tma_kernel}
    expected = {attention_tma.attention_dq_tma_kernel} | (
        {attention_tma.attention_dkdv_tma_kernel} if d in attention_tma.TMA_DKDV_TILES else set()
    )
    assert {launch.kernel for launch in launches} & tma == expected
    want = references.attention_grads(q, k, v, do, causal, 0.3)
    for got, expected_grad in zip(grads, want):
        _close(got, expected_grad, max(n_q, n_k))
    offset = torch.empty(do.numel() + 1, device=do.device, dtype=do.dtype)[1:].view(do.shape)
    offset.copy_(do)
    assert not attention_tma.tma_suits(attention_tma.TMA_DQ_TILES, q, k, v, offset)
    with recording_launches() as launches:
        pointer_grads = kernels.backward(offset, q, k, v, o, lse, causal, 0.3)
    assert not {launch.kernel for launch in launches} & tma
    for got, expected_grad in zip(pointer_grads, grads):
        _close(got, expected_grad.float(), max(n_q, n_k))


@pytest.mark.gpu
def test_memory_grows_linearly_with_the_sequence():
    """Forward and backward at N and 4N: the extra memory grows 4 times, not 16 (no
    [N, N] scores), and stays far below what the naive attention's scores take."""

    def peak(n):
        q, k, v, do = _qkv(1, 8, 8, n, n, 64, torch.bfloat16, grad=True)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        # a first call may tune, timing tiles on scratch memory: not measured
        torch.autograd.grad(attention(*leaves, causal=True), leaves, do)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.autograd.grad(attention(*leaves, causal=True), leaves, do)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    small, large = peak(2048), peak(8192)
    assert large < 5 * small, (small, large)
    assert large < 8 * 8192 * 8192 * 2 / 4  # a quarter of one bf16 score matrix per head


# --- the operator ------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_operator_compiles_with_fullgraph(causal):
    q, k, v, do = _qkv(2, 4, 2, 19, 23, 16, grad=True)

    def ours(q, k, v):
        return ops.attention(q, k, v, causal, 0.4) * 2

    def theirs(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.4,
                                              enable_gqa=True) * 2  # fmt: skip

    torch.compiler.reset()
    compiled = torch.compile(ours, fullgraph=True, backend=ops.COMPILE_BACKEND)
    results = []
    for fn in (compiled, theirs):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        results.append((out, *torch.autograd.grad(out, leaves, do)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_operators_pass_opcheck():
    q, k, v, do = _qkv(1, 4, 2, 9, 12, 16, grad=True)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.course.attention_forward.default, (*leaves, True, None))
    o, lse = kernels.forward(q, k, v, True)
    torch.library.opcheck(torch.ops.course.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o, lse, True, 0.25))  # fmt: skip


def test_the_operator_refuses_a_second_derivative_and_bad_input():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 5, 5, 16))
    (grad_q,) = torch.autograd.grad(ops.attention(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(grad_q.sum(), q)
    with pytest.raises(ValueError, match="head dimension d=8"):
        ops.attention(q[..., :8], k[..., :8], v[..., :8])


# --- the grader's replay ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "causal"),
    [(broken.attention_forward_keys_not_masked, False),
     (broken.attention_forward_end_past_keys, True),
     (broken.attention_backward_without_d, True)],
    ids=["keys-not-masked", "causal-end-past-keys", "backward-without-d"],
)  # fmt: skip
def test_a_replayed_check_judges_as_the_check_itself(fn, causal):
    from test_replay import _record_then_replay

    name = fn.__name__
    if name.startswith("attention_forward"):
        check = functools.partial(course_lib.check_attention_forward, causal=causal)
    elif name.startswith("attention_backward"):
        check = functools.partial(course_lib.check_attention_backward, causal=causal)
    else:
        check = course_lib.check_attention
    original, replayed, _ = _record_then_replay(check, fn)
    assert [c.passed for c in replayed.cases] == [c.passed for c in original.cases]
    assert [c.hint for c in replayed.cases] == [c.hint for c in original.cases]


def test_the_one_argument_causal_checks_check_causal_attention(monkeypatch):
    """A check cell calls its checker with the learner's function alone (the grader reads it
    so): lesson 10's causal exercises have checkers of their own, which pass causal=True."""
    calls = []
    for name in ("check_attention_forward", "check_attention_backward"):

        def record(fn, causal=False, name=name):
            calls.append((name, fn, causal))

        monkeypatch.setattr(attention_checks, name, record)
    course_lib.check_attention_forward_causal(broken.attention_forward)
    course_lib.check_attention_backward_causal(broken.attention_backward)
    assert calls == [("check_attention_forward", broken.attention_forward, True),
                     ("check_attention_backward", broken.attention_backward, True)]  # fmt: skip
