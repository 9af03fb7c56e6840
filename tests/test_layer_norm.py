"""Lesson 09's finished layer norm and RMSNorm: forward and backward against float64,
gradcheck, the nn drop-ins, the operators in torch.compile, what they say about bad input;
and the lesson's checkers against deliberately broken kernels."""

import functools
import math

import broken_kernels as broken
import pytest
import torch
import torch.nn.functional as F
from reports import assert_hint_under, assert_no_other_family

import course_lib
from course_lib import DEVICE, bench, ops, references, runtime
from course_lib.bench.recording import recording_launches
from course_lib.checks import CheckFailed
from course_lib.checks import layer_norm as norm_checks
from course_lib.checks.tolerances import tolerance_for
from course_lib.kernels import layer_norm as finished
from course_lib.kernels.layer_norm import LayerNorm, RMSNorm, layer_norm, rms_norm

DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in runtime.DTYPES]
SHAPES = [  # x's shape, normalized_shape
    pytest.param((1, 1), (1,), id="1x1"),
    pytest.param((5, 3), (3,), id="5x3-narrower-than-a-block"),
    pytest.param((37, 781), (781,), id="37x781-prime-rows"),
    pytest.param((2, 5, 300), (300,), id="2x5x300-leading-dims"),
    pytest.param((3, 4, 7), (4, 7), id="3x4x7-over-two-dims"),
    pytest.param((300, 64), (64,), id="300x64-many-rows"),
    pytest.param((3, 9001), (9001,), id="3x9001-wider-than-the-fused-block"),
    pytest.param((129,), (129,), id="129-one-row"),
]


def _inputs(x_shape, shape, dtype=torch.float32, seed=0, affine=True, bias=True):
    generator = torch.Generator().manual_seed(seed)
    make = lambda *s, scale=1.0, shift=0.0: (  # noqa: E731
        torch.randn(*s, generator=generator) * scale + shift
    ).to(DEVICE, dtype)
    x = make(*x_shape, scale=2.0, shift=0.5)
    w = make(*shape, scale=0.5, shift=1.0) if affine else None
    b = make(*shape, scale=0.5) if affine and bias else None
    return x, w, b, make(*x_shape)


def _grads(fn, x, params, g):
    leaves = [None if t is None else t.detach().requires_grad_() for t in (x, *params)]
    y = fn(*leaves)
    inputs = [t for t in leaves if t is not None]
    return [y.detach(), *torch.autograd.grad(y, inputs, g)]


def _expected(fn, x, params, g):
    """The same through torch's own function in float64, each result rounded once."""
    params64 = [None if t is None else t.double() for t in params]
    got = _grads(fn, x.double(), params64, g.double())
    dtypes = [x.dtype, x.dtype] + [t.dtype for t in params if t is not None]
    return [t.to(d) for t, d in zip(got, dtypes)]


def _assert_close(got, expected, terms, dx_gain=1.0):
    """dx_gain: how much the backward amplifies a rounding of grad_x (the second result),
    rstd at most; 1/sqrt(eps) where a row is constant, whose grad_x should be 0."""
    for i, (g, e, n) in enumerate(zip(got, expected, terms)):
        tol = tolerance_for(e.dtype)
        atol = tol.atol * math.sqrt(n) * (max(1.0, dx_gain) if i == 1 else 1.0)
        torch.testing.assert_close(g, e, rtol=tol.rtol, atol=atol)


def _rstd_max(x, shape, eps=1e-5) -> float:
    dims = tuple(range(-len(shape), 0))
    return float((x.double().var(dims, unbiased=False) + eps).rsqrt().max())


def _terms(x, shape):
    """How many terms each result sums: a row for y and grad_x, every row for a parameter."""
    n = math.prod(shape)
    return [n, n, x.numel() // n, x.numel() // n]


@pytest.mark.parametrize(("x_shape", "shape"), SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_forward_and_backward_match_float64(x_shape, shape, dtype):
    x, w, b, g = _inputs(x_shape, shape, dtype)
    got = _grads(lambda x, w, b: layer_norm(x, shape, w, b), x, (w, b), g)
    expected = _expected(lambda x, w, b: F.layer_norm(x, shape, w, b), x, (w, b), g)
    _assert_close(got, expected, _terms(x, shape), _rstd_max(x, shape))


@pytest.mark.parametrize(("x_shape", "shape"), SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_forward_and_backward_match_float64(x_shape, shape, dtype):
    x, w, _, g = _inputs(x_shape, shape, dtype)
    eps = references.norm_eps(dtype)  # what eps=None means for x's dtype
    got = _grads(lambda x, w: rms_norm(x, shape, w), x, (w,), g)
    expected = _expected(lambda x, w: F.rms_norm(x, shape, w, eps), x, (w,), g)
    _assert_close(got, expected, _terms(x, shape))


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_without_affine_parameters_and_with_a_weight_alone(rms):
    x, _, _, g = _inputs((37, 100), (100,), affine=False)
    fn = (lambda x: rms_norm(x, 100, eps=1e-6)) if rms else (lambda x: layer_norm(x, 100))
    ref = (
        (lambda x: F.rms_norm(x, (100,), eps=1e-6)) if rms else (lambda x: F.layer_norm(x, (100,)))
    )
    _assert_close(_grads(fn, x, (), g), _expected(ref, x, (), g), [100, 100])
    if not rms:
        x, w, _, g = _inputs((37, 100), (100,), bias=False)
        got = _grads(lambda x, w: layer_norm(x, 100, w), x, (w,), g)
        expected = _expected(lambda x, w: F.layer_norm(x, (100,), w), x, (w,), g)
        _assert_close(got, expected, [100, 100, 37])


def test_a_non_contiguous_input_is_normalised_along_its_last_dimension():
    x, w, b, g = _inputs((50, 40), (50,))
    x = x.t()  # [40, 50], rows 1 element apart: copied before the kernel
    g = g.t()
    got = _grads(lambda x, w, b: layer_norm(x, 50, w, b), x, (w, b), g)
    expected = _expected(lambda x, w, b: F.layer_norm(x, (50,), w, b), x, (w, b), g)
    _assert_close(got, expected, [50, 50, 40, 40])


def test_a_large_mean_keeps_float32_precision():
    """A row of 1000 ± 0.1: a variance from sum(x²) - n·mean² would lose every digit."""
    x = (torch.randn(8, 4096, generator=torch.Generator().manual_seed(1)) * 0.1 + 1000).to(DEVICE)
    wide = torch.randn(2, 20_000, generator=torch.Generator().manual_seed(2)) * 0.1 + 1000
    for t in (x, wide.to(DEVICE)):
        y = layer_norm(t, t.shape[-1])
        expected = F.layer_norm(t.double(), t.shape[-1:])
        # float32 holds 1000 ± 0.1 to 3e-5 absolute: y, in units of the row's 0.1, to 1e-3
        torch.testing.assert_close(y.double(), expected, rtol=0, atol=2e-3)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_gradcheck_in_float64(rms):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 7, generator=generator, dtype=torch.float64).transpose(0, 1)
    w = torch.randn(7, generator=generator, dtype=torch.float64)
    b = torch.randn(7, generator=generator, dtype=torch.float64)
    leaves = [t.to(DEVICE).requires_grad_() for t in (x, w, b)]
    if rms:
        assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, 7, w, 1e-3), leaves[:2])
    else:
        assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, 7, w, b), leaves)


def test_the_parameters_gradients_are_the_same_on_every_run():
    x, w, b, g = _inputs((300, 64), (64,))
    first = _grads(lambda x, w, b: layer_norm(x, 64, w, b), x, (w, b), g)
    again = _grads(lambda x, w, b: layer_norm(x, 64, w, b), x, (w, b), g)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_only_the_wanted_gradients_are_computed():
    x, w, b, g = _inputs((37, 100), (100,))
    w.requires_grad_()
    y = layer_norm(x, 100, w, b)  # x and b require no gradient
    with recording_launches() as launches:
        (grad_w,) = torch.autograd.grad(y, w, g)
    flags = {name: launches[0].kwargs[name] for name in ("DX", "DW", "DB")}
    assert flags == {"DX": False, "DW": True, "DB": False}
    assert [launch.grid[1] for launch in launches[1:]] == [1]  # dw's sum alone
    expected = references.norm_grads(x, w, b, g)[1]
    torch.testing.assert_close(grad_w, expected, rtol=1e-5, atol=1e-6 * math.sqrt(37))


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_strided_parameters_are_read_through_their_strides(rms):
    x, w, b, g = _inputs((7, 40), (80,))
    w, b = w[::2].requires_grad_(), b[::2].requires_grad_()
    assert w.stride(0) == 2
    ours = rms_norm(x, 40, w) if rms else layer_norm(x, 40, w, b)
    theirs = F.rms_norm(x, (40,), w) if rms else F.layer_norm(x, (40,), w, b)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rms", [False, True], ids=["LayerNorm", "RMSNorm"])
def test_the_modules_are_drop_ins_for_torch_nn(rms):
    theirs = (torch.nn.RMSNorm(64) if rms else torch.nn.LayerNorm(64)).to(DEVICE)
    ours = (RMSNorm(64) if rms else LayerNorm(64)).to(DEVICE)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 9, 64, device=DEVICE)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert isinstance(ours, torch.nn.RMSNorm if rms else torch.nn.LayerNorm)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda x: layer_norm(x, 7), ValueError, "must be x's last dimensions"),
        (lambda x: layer_norm(x, (3, 7)), ValueError, "must be x's last dimensions"),
        (lambda x: layer_norm(x, 8, torch.ones(7, device=DEVICE)), ValueError, "weight must"),
        (lambda x: rms_norm(x, 8, torch.ones(8, 1, device=DEVICE)), ValueError, "weight must"),
        (lambda x: layer_norm(x.int(), 8), TypeError, "use one of"),
        (lambda x: layer_norm("x", 8), TypeError, "expects a tensor"),
    ],
    ids=["wrong-last-dim", "too-many-dims", "weight-shape", "rms-weight-shape", "int", "str"],
)
def test_bad_input_gets_a_clear_error(call, error, message):
    x = torch.randn(3, 8, device=DEVICE)
    with pytest.raises(error, match=message):
        call(x)


@pytest.mark.parametrize(
    ("dtypes", "x_dtype"),
    [((torch.float16, torch.float32), torch.float32), ((torch.float32, None), torch.float64),
     ((torch.float32, torch.float16), torch.float16), ((None, torch.float64), torch.float32)],
    ids=["weight-and-bias-differ", "float32-weight-float64-x", "float16-bias-float32-weight",
         "float64-bias-float32-x"],
)  # fmt: skip
def test_dtype_mixes_torch_refuses_are_refused(dtypes, x_dtype):
    x = torch.randn(3, 8, device=DEVICE, dtype=x_dtype)
    w, b = (None if d is None else torch.randn(8, device=DEVICE, dtype=d) for d in dtypes)
    with pytest.raises(RuntimeError):  # torch's own refusal, for the record
        F.layer_norm(x.cpu(), (8,), *(None if t is None else t.cpu() for t in (w, b)))
    with pytest.raises(TypeError, match="give the weight and bias x's dtype"):
        layer_norm(x, 8, w, b)


def test_each_parameters_gradient_is_summed_in_float32_and_kept_in_its_dtype():
    """A float16 x with a float32 bias (torch allows it): grad_bias sums 300 rows in
    float32 and stays float32, not rounded to float16 on the way."""
    x, _, b, g = _inputs((300, 64), (64,), torch.float16)
    b = b.float().requires_grad_()
    (grad_b,) = torch.autograd.grad(layer_norm(x, 64, None, b), b, g)
    assert grad_b.dtype == torch.float32
    expected = g.double().sum(0)
    torch.testing.assert_close(grad_b.double(), expected, rtol=0, atol=1e-4)
    assert not torch.equal(grad_b, expected.half().float())  # finer than float16's rounding


def test_the_benchmark_records_the_forward_launch_bare():
    x, w, b, _ = _inputs((37, 100), (100,))
    bare = bench.bare_launches(lambda: layer_norm(x, 100, w, b))
    assert bare is not None and bare.kernel is finished.norm_fwd_kernel
    y = bare.args[1]  # the output the recorded call wrote
    expected = y.clone()
    y.fill_(math.nan)
    bare()
    torch.testing.assert_close(y, expected)


def test_a_kept_plan_serves_only_calls_like_its_first():
    """Plans are kept by signature: another eps, another way of writing normalized_shape,
    or a wrong one after a right one, each gets what a first call would."""
    x, w, b, _ = _inputs((6, 40), (40,))
    for eps in (1e-5, 0.5, 1e-5, 2):
        for shape in (40, [40], (40,), x.shape[-1:]):
            expected = F.layer_norm(x, (40,), w, b, eps)
            torch.testing.assert_close(layer_norm(x, shape, w, b, eps), expected)
        expected = F.rms_norm(x, (40,), w, eps)
        torch.testing.assert_close(rms_norm(x, 40, w, eps), expected)
    with pytest.raises(ValueError, match="must be x's last dimensions"):
        layer_norm(x, 39, w[:39], b[:39])
    with pytest.raises(TypeError, match="eps must be a float"):
        layer_norm(x, 40, w, b, "1e-5")


@pytest.mark.skipif(runtime.MODE == "gpu", reason="bfloat16 runs on a GPU")
def test_bfloat16_in_the_interpreter_is_refused_plainly():
    with pytest.raises(TypeError, match="bfloat16 needs a GPU"):
        layer_norm(torch.randn(3, 8, dtype=torch.bfloat16), 8)


def test_empty_inputs():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    y = layer_norm(x, 8, torch.ones(8, device=DEVICE), torch.zeros(8, device=DEVICE))
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 8)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_the_operators_compile_with_fullgraph(rms):
    x, w, b, g = _inputs((2, 5, 40), (40,))
    if rms:
        ours = lambda x, w, b: ops.rms_norm(x, 40, w) * 2  # noqa: E731
        theirs = lambda x, w, b: F.rms_norm(x, (40,), w) * 2  # noqa: E731
    else:
        ours = lambda x, w, b: ops.layer_norm(x, 40, w, b) * 2  # noqa: E731
        theirs = lambda x, w, b: F.layer_norm(x, (40,), w, b) * 2  # noqa: E731
    compiled = torch.compile(ours, fullgraph=True, backend=ops.COMPILE_BACKEND)
    params = (w, None) if rms else (w, b)
    got = _grads(lambda x, w, b=None: compiled(x, w, b), x, params, g)
    expected = _grads(lambda x, w, b=None: theirs(x, w, b), x, params, g)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_the_operator_passes_opcheck():
    x, w, b, _ = _inputs((6, 40), (40,))
    for save_stats in (False, True):
        args = (x, w, b, [40], 1e-5, False, save_stats)
        torch.library.opcheck(torch.ops.course.norm_forward.default, args)


# --- GPU: bfloat16 and the benchmark's shapes -------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize(
    "x_shape",
    [(4096, 4096), (8192, 8192), (4096, 1024), (2, 8, 512, 768), (64, 65_536), (3, 1823)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])  # fmt: skip
def test_large_shapes_on_a_gpu(x_shape, dtype, rms):
    n = x_shape[-1]
    x, w, b, g = _inputs(x_shape, (n,), dtype)
    if rms:
        got = _grads(lambda x, w: rms_norm(x, n, w), x, (w,), g)
        exp = _grads(lambda x, w: F.rms_norm(x.float(), (n,), w.float()).to(dtype), x, (w,), g)
    else:
        got = _grads(lambda x, w, b: layer_norm(x, n, w, b), x, (w, b), g)
        exp = _grads(lambda x, w, b: F.layer_norm(x.float(), (n,), w.float(), b.float()).to(dtype),
                     x, (w, b), g)  # fmt: skip
    # against torch in float32, by relative norm: both round to the same 16-bit results but
    # for ties, and the parameters' sums over thousands of rows round in other orders
    for a, e in zip(got, exp):
        error = float((a.double() - e.double()).norm() / e.double().norm().clamp_min(1e-30))
        assert error < {torch.float32: 1e-5}.get(dtype, 1e-2), error


@pytest.mark.gpu
def test_the_finished_kernels_pass_their_checks_with_bfloat16_on_a_gpu():
    course_lib.check_layer_norm(lambda x, w, b, eps: layer_norm(x, x.shape[-1], w, b, eps))
    course_lib.check_rms_norm(lambda x, w, eps: rms_norm(x, x.shape[-1], w, eps))


# --- the checkers --------------------------------------------------------------------------


def _forward(x, weight, bias, eps=1e-5, BLOCK_SIZE=None):  # noqa: N803
    """The finished forward as the exercise's: (y, mean, rstd), mean and rstd [M]."""
    plan = finished.plan_for(x, x.shape[-1], weight, bias, eps, rms=False)
    y, stats, _ = plan(x, weight, bias, save_stats=True)
    return y, stats[0], stats[1]


def test_the_finished_kernels_pass_the_lessons_checks():
    course_lib.check_layer_norm_forward(_forward)
    course_lib.check_layer_norm(lambda x, w, b, eps: layer_norm(x, x.shape[-1], w, b, eps))
    course_lib.check_rms_norm(lambda x, w, eps: rms_norm(x, x.shape[-1], w, eps))


def test_the_lessons_correct_kernels_pass_without_hints():
    for check, fn in [(course_lib.check_layer_norm_forward, broken.layer_norm_forward),
                      (course_lib.check_layer_norm, broken.layer_norm),
                      (course_lib.check_rms_norm, broken.rms_norm)]:  # fmt: skip
        result = check(fn)
        assert result.passed and not any(c.hint for c in result.cases)


def test_the_checks_cover_the_awkward_cases():
    forward = " | ".join(c.label for c in norm_checks._forward_cases(9))
    for needed in ("1x1", "narrower than the block", "781", "wide rows", "row stride",
                   "close to eps", "a large mean", "float16", "squares past"):  # fmt: skip
        assert needed in forward, needed
    for rms in (False, True):
        labels = [c.label for c in norm_checks._autograd_cases(10, rms)]
        parts = {label.rsplit(": ", 1)[1] for label in labels}
        assert parts == ({"y", "grad_x", "grad_weight"} | (set() if rms else {"grad_bias"}))
        assert any("leading dimensions" in label for label in labels)
        assert any("eps=None" in label for label in labels) == rms


def test_the_check_sends_a_random_output_gradient():
    for case in norm_checks._autograd_cases(10, rms=False):
        grad_output = case.inputs[-1]
        assert grad_output.numel() == 1 or grad_output.std() > 0.5


def _failure(check, fn) -> str:
    with pytest.raises(CheckFailed) as info:
        check(fn)
    return info.value.result.report()


@functools.cache
def _report(fn) -> str:
    """Each broken layer runs its check once, however many tests read the report."""
    name = fn.__name__
    if name.startswith("layer_norm_forward"):
        return _failure(course_lib.check_layer_norm_forward, fn)
    return _failure(course_lib.check_rms_norm if name.startswith("rms") else
                    course_lib.check_layer_norm, fn)  # fmt: skip


# the hints that name a mistake, by family: a report may show its own family's, no other
NORM_FAMILIES = {
    "cut off": ["each row was handled only up to one block"],
    "unbiased": ["(the unbiased variance)"],
    "eps": ["eps belongs inside the square root"],
    "axis": ["you normalised each column"],
    "half": ["your statistics are computed in 16 bits"],
    "one pass": ["only the rows with a large mean fail"],
    "rstd": ["you saved sqrt(var + eps)", "the rstd used here leaves eps out"],
    "dx mean": ["dx is missing the mean of w·dy"],
    "dx x_hat": ["dx is missing x̂ · mean(x̂ · w·dy)"],
    "dx weight": ["dx used dy where it needs w·dy"],
    "dw x_hat": ["you summed dy alone", "you multiplied by x itself"],
    "rows": ["holds the sum over only some of the rows"],
    "rms mean": ["you subtracted the mean: RMSNorm does not"],
    "rms dx": ["a term of layer norm's backward"],
    "rms eps": ["with eps=None, torch's rms_norm adds"],
}
BLOCK = f"BLOCK_SIZE={norm_checks.LOOP_BLOCK}"
NORM_MISTAKES = [
    # broken launcher, a case it fails, the hint under that case, the families it may show
    (broken.layer_norm_forward_one_block, f"37x781 (row not a power of two), float32, {BLOCK}: y",
     "each row was handled only up to one block", {"cut off"}),
    (broken.layer_norm_forward_unbiased, f"37x781 (row not a power of two), float32, {BLOCK}: y",
     "(the unbiased variance)", {"unbiased"}),
    (broken.layer_norm_forward_eps_outside, "close to eps), float32, BLOCK_SIZE=256: y",
     "eps belongs inside the square root", {"eps"}),
    (broken.layer_norm_forward_by_column, f"37x781 (row not a power of two), float32, {BLOCK}: y",
     "you normalised each column", {"axis"}),
    (broken.layer_norm_forward_stats_in_half, "squares past float16's 65504), float16, "
     f"{BLOCK}: y", "your statistics are computed in 16 bits", {"half"}),
    (broken.layer_norm_forward_one_pass, f"(values 300 ± 1: a large mean), float32, {BLOCK}: y",
     "only the rows with a large mean fail", {"one pass"}),
    (broken.layer_norm_forward_saves_std, f"(row not a power of two), float32, {BLOCK}: rstd",
     "you saved sqrt(var + eps)", {"rstd"}),
    (broken.layer_norm_saved_std, "37x781 (row not a power of two), float32: grad_x",
     "you saved sqrt(var + eps)", {"rstd"}),
    (broken.layer_norm_rstd_recomputed_without_eps, "close to eps), float32: grad_x",
     "the rstd used here leaves eps out", {"rstd"}),
    (broken.layer_norm_dx_without_mean_term, "37x781 (row not a power of two), float32: grad_x",
     "dx is missing the mean of w·dy", {"dx mean"}),
    (broken.layer_norm_dx_without_xhat_term, "37x781 (row not a power of two), float32: grad_x",
     "dx is missing x̂ · mean(x̂ · w·dy)", {"dx x_hat"}),
    (broken.layer_norm_dw_without_xhat, "37x781 (row not a power of two), float32: grad_weight",
     "you summed dy alone", {"dw x_hat"}),
    (broken.layer_norm_dw_not_accumulated, "(many rows: every program takes several), float32: "
     "grad_weight", "the grad_weight holds the sum over only some of the rows", {"rows"}),
    (broken.layer_norm_dw_not_accumulated, "(many rows: every program takes several), float32: "
     "grad_bias", "the grad_bias holds the sum over only some of the rows", {"rows"}),
    (broken.layer_norm_dw_partials_not_summed, "(many rows: every program takes several), "
     "float32: grad_weight", "the grad_weight holds the sum over only some of the rows",
     {"rows"}),
    (broken.rms_norm_subtracts_mean, "37x781 (row not a power of two), float32: forward: y",
     "you subtracted the mean: RMSNorm does not", {"rms mean"}),
    (broken.rms_norm_subtracts_mean, "37x781 (row not a power of two), float32: grad_x",
     "you subtracted the mean: RMSNorm does not", {"rms mean"}),
    (broken.rms_norm_eps_outside, "close to eps), float32: forward: y",
     "eps belongs inside the square root", {"eps"}),
    (broken.rms_norm_default_eps_1e6, "(values near 3e-4 and eps=None), float32: forward: y",
     "with eps=None, torch's rms_norm adds", {"rms eps"}),
    (broken.rms_norm_float32_eps_always, "(values near 3e-4 and eps=None), float64: forward: y",
     "with eps=None, torch's rms_norm adds", {"rms eps"}),
    (broken.rms_norm_dx_with_mean_term, "37x781 (row not a power of two), float32: grad_x",
     "a term of layer norm's backward", {"rms dx"}),
    (broken.rms_norm_dx_without_xhat_term, "37x781 (row not a power of two), float32: grad_x",
     "dx is missing x̂ · mean(x̂ · w·dy)", {"dx x_hat"}),
    (broken.rms_norm_dw_without_xhat, "37x781 (row not a power of two), float32: grad_weight",
     "you summed dy alone", {"dw x_hat"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "case", "hint", "families"),
    NORM_MISTAKES,
    ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(NORM_MISTAKES)],
)
def test_norm_checks_name_the_mistake_and_no_other(fn, case, hint, families):
    report = _report(fn)
    assert_hint_under(report, case, hint)
    assert_no_other_family(report, families, NORM_FAMILIES)
