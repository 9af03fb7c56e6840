"""Lesson 07's finished Linear: forward and backward against float64, gradcheck, the drop-in
nn.Linear, and what it says about bad input."""

import contextlib

import pytest
import torch

from course_lib import DEVICE, references, runtime
from course_lib.checks.tolerances import tolerance_for
from course_lib.kernels import linear as finished
from course_lib.kernels import linear_plans
from course_lib.kernels import matmul as lesson05
from course_lib.kernels._plan import PlanCache
from course_lib.kernels.linear import Linear, linear

ACTIVATIONS = [None, "relu", "gelu"]
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in runtime.DTYPES]


def _layer(x_shape, out_features, dtype=torch.float32, bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    in_features = x_shape[-1]
    x = torch.randn(*x_shape, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
    b = torch.randn(out_features, generator=generator) if bias else None
    grad_y = torch.randn(*x_shape[:-1], out_features, generator=generator)
    return [None if t is None else t.to(DEVICE, dtype) for t in (x, weight, b, grad_y)]


def _grads(x, weight, bias, grad_y, activation):
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    y = linear(*leaves, activation)
    inputs = [t for t in leaves if t is not None]
    return (y.detach(), *torch.autograd.grad(y, inputs, grad_y))


def _assert_close(got, expected, terms):
    """Within the dtype's tolerance (TF32's for float32 on a GPU), the absolute part grown
    with sqrt(terms) as a sum's rounding grows."""
    tf32 = expected.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    tol = tolerance_for("tf32" if tf32 else expected.dtype)
    torch.testing.assert_close(got, expected, rtol=tol.rtol, atol=tol.atol * terms**0.5)


SHAPES = [  # x's shape, out_features
    pytest.param((1, 1), 1, id="1x1-to-1"),
    pytest.param((37, 45), 29, id="37x45-to-29"),
    pytest.param((2, 5, 45), 29, id="2x5x45-to-29"),
    pytest.param((3, 2, 4, 17), 33, id="3x2x4x17-to-33"),
    pytest.param((45,), 29, id="45-to-29"),
    pytest.param((130, 77), 100, id="130x77-to-100"),
]


@pytest.mark.parametrize(("x_shape", "out_features"), SHAPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_forward_and_backward_match_float64(x_shape, out_features, activation):
    x, weight, bias, grad_y = _layer(x_shape, out_features)
    y, gx, gw, gb = _grads(x, weight, bias, grad_y, activation)
    rows = x.numel() // x.shape[-1]
    _assert_close(y, references.linear(x, weight, bias, activation), x_shape[-1])
    ref_gx, ref_gw, ref_gb = references.linear_grads(x, weight, bias, grad_y, activation)
    _assert_close(gx, ref_gx, out_features)
    _assert_close(gw, ref_gw, rows)
    _assert_close(gb, ref_gb, rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_matches_nn_linear_in_every_dtype(dtype, activation):
    """Our Linear against torch's, same parameters, with a random output gradient: the
    ones of y.sum() would let a wrong forward through."""
    x, _, _, _ = _layer((2, 7, 40), 24, dtype)
    reference = torch.nn.Linear(40, 24, device=DEVICE, dtype=dtype)
    ours = Linear(40, 24, device=DEVICE, dtype=dtype, activation=activation)
    ours.load_state_dict(reference.state_dict())
    act = {None: lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu}[activation]
    grad_y = torch.randn(2, 7, 24, device=DEVICE, dtype=dtype)
    xs = [x.detach().requires_grad_() for _ in range(2)]
    y_ref, y = act(reference(xs[0])), ours(xs[1])
    grads_ref = torch.autograd.grad(y_ref, (xs[0], *reference.parameters()), grad_y)
    grads = torch.autograd.grad(y, (xs[1], *ours.parameters()), grad_y)
    # torch rounds z to the dtype before the activation, and g times the slope before the
    # products; ours keeps both in float32: a few roundings of the dtype apart
    tol = tolerance_for(dtype)
    for got, want in zip((y, *grads), (y_ref, *grads_ref)):
        torch.testing.assert_close(got, want, rtol=4 * tol.rtol, atol=4 * tol.rtol)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_passes_gradcheck_in_float64(activation):
    x, weight, bias, _ = _layer((2, 3, 5), 4, torch.float64)
    inputs = [t.detach().requires_grad_() for t in (x, weight, bias)]
    assert torch.autograd.gradcheck(lambda x, w, b: linear(x, w, b, activation), inputs)


def test_linear_takes_any_strides():
    x, weight, bias, grad_y = _layer((37, 45), 29)
    x, weight, grad_y = (t.t().contiguous().t() for t in (x, weight, grad_y))  # column-major
    y, gx, gw, gb = _grads(x, weight, bias, grad_y, "relu")
    _assert_close(y, references.linear(x, weight, bias, "relu"), 45)
    ref = references.linear_grads(x, weight, bias, grad_y, "relu")
    for got, want, terms in zip((gx, gw, gb), ref, (29, 37, 37)):
        _assert_close(got, want, terms)


def test_linear_without_bias_and_with_frozen_parts():
    x, weight, _, grad_y = _layer((2, 5, 45), 29)
    y, gx, gw = _grads(x, weight, None, grad_y, "gelu")
    ref_gx, ref_gw, ref_gb = references.linear_grads(x, weight, None, grad_y, "gelu")
    assert ref_gb is None
    _assert_close(gx, ref_gx, 29)
    _assert_close(gw, ref_gw, 10)
    # a frozen weight: only x's gradient is asked for, and the backward computes only it
    w = weight.detach()
    xs = x.detach().requires_grad_()
    (gx_only,) = torch.autograd.grad(linear(xs, w, None, "gelu"), xs, grad_y)
    _assert_close(gx_only, ref_gx, 29)
    # no gradient at all: nothing is saved, and the result has no graph
    assert linear(x, w).grad_fn is None


def test_linear_saves_only_what_its_backward_uses():
    x, weight, bias, _ = _layer((6, 8), 5)
    x.requires_grad_()
    for activation, extra in ((None, 0), ("relu", 1), ("gelu", 1)):
        y = linear(x, weight, bias, activation)  # weight frozen: x's gradient needs weight
        saved = [t for t in y.grad_fn.saved_tensors if t is not None]
        assert len(saved) == 1 + extra, activation


def test_linear_module_is_a_drop_in_for_nn_linear():
    torch.manual_seed(3)
    ours = Linear(12, 7, device=DEVICE, activation="relu")
    torch.manual_seed(3)
    reference = torch.nn.Linear(12, 7, device=DEVICE)
    # the same initialisation from the same seed, and state_dicts that load both ways
    assert torch.equal(ours.weight, reference.weight) and torch.equal(ours.bias, reference.bias)
    assert ours.state_dict().keys() == reference.state_dict().keys()
    reference.load_state_dict(ours.state_dict())
    ours.load_state_dict(reference.state_dict())
    assert "activation='relu'" in repr(ours)
    assert Linear(3, 2, bias=False).bias is None


def test_linear_of_empty_inputs():
    x, weight, bias, _ = _layer((0, 5), 3)
    assert linear(x, weight, bias).shape == (0, 3)
    x, weight, bias, _ = _layer((4, 0), 3)
    torch.testing.assert_close(linear(x, weight, bias, "relu"), torch.relu(bias).expand(4, 3))


def test_linear_says_what_is_wrong():
    x, weight, bias, _ = _layer((4, 5), 3)
    with pytest.raises(ValueError, match="activation must be one of"):
        linear(x, weight, bias, "tanh")
    with pytest.raises(ValueError, match=r"x must be \[..., in_features\]"):
        linear(x, weight.t(), bias)
    with pytest.raises(ValueError, match=r"bias must be \[out_features\] = \[3\]"):
        linear(x, weight, bias[:2])
    with pytest.raises(TypeError, match="same dtype and device"):
        linear(x, weight.double(), bias)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        linear(x, weight.tolist())
    with pytest.raises(TypeError, match="not supported"):
        linear(x.int(), weight.int())
    with pytest.raises(ValueError, match="activation must be one of"):
        Linear(3, 2, activation="softmax")


def test_output_grad_splits_long_columns_across_programs():
    """Many rows over few columns: the sums come from several programs, added in a second
    launch, and must equal one long sum."""
    g = torch.randn(5000, 3, device=DEVICE, dtype=torch.float64)
    gz, grad_bias = finished.output_grad(g, None, None, bias_grad=True)
    assert gz is g
    torch.testing.assert_close(grad_bias, g.sum(0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_linear_at_a_transformer_size_on_the_gpu(dtype):
    x, weight, bias, grad_y = _layer((4, 256, 768), 3072, dtype)
    # float32 as TF32, as networks train: exact float32 would autotune every product's
    # tiles for minutes on its first call
    with runtime.tf32(True):
        y, gx, gw, gb = _grads(x, weight, bias, grad_y, "gelu")
    ref_gx, ref_gw, ref_gb = references.linear_grads(x, weight, bias, grad_y, "gelu")
    # half precision: gz is rounded once to the dtype before the two products
    slack = 1 if dtype == torch.float32 else 8
    expected = (references.linear(x, weight, bias, "gelu"), ref_gx, ref_gw, ref_gb)
    for got, want, terms in zip((y, gx, gw, gb), expected, (768, 3072, 1024, 1024)):
        tol = tolerance_for("tf32" if dtype == torch.float32 else dtype)
        torch.testing.assert_close(
            got, want, rtol=slack * tol.rtol, atol=slack * tol.rtol * terms**0.5
        )


def test_linear_output_may_be_changed_in_place_like_nn_linear():
    """y is a tensor of its own, not a view: an in-place ReLU after the layer works."""
    x, weight, bias, grad_y = _layer((2, 5, 45), 29)
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    y = torch.nn.ReLU(inplace=True)(linear(*leaves))
    grads = torch.autograd.grad(y, leaves, grad_y)
    z = x.double() @ weight.double().t() + bias.double()
    g = grad_y.double() * (z > 0)
    _assert_close(grads[0], (g @ weight.double()).float(), 29)
    assert linear(x, weight, bias).mul_(2).shape == (2, 5, 29)


def test_linear_refuses_sizes_past_32_bit_offsets():
    x = torch.empty(2**16, 2**15, device="meta")
    weight = torch.empty(8, 2**15, device="meta")
    with pytest.raises(ValueError, match="2\\^31 elements or more"):
        linear(x, weight)


def test_linear_checks_each_signature_of_its_arguments_once(monkeypatch):
    # a call laid out like an earlier one (shapes, strides, dtypes, devices, alignments,
    # activation) reuses the plan that call made; anything else gets a plan of its own
    checked = []
    check = linear_plans.check_arguments
    monkeypatch.setattr(finished, "_plans", PlanCache())
    monkeypatch.setattr(linear_plans, "check_arguments", lambda *a: checked.append(a) or check(*a))
    storage = torch.randn(6 * 45 + 4, device=DEVICE)
    _, weight, bias, _ = _layer((6, 45), 29)
    aligned = storage[:-4].view(6, 45)
    misaligned = storage[1:-3].view(6, 45)  # 4 bytes off a 16-byte boundary
    for x, activation, expected_checked in [
        (aligned, "gelu", 1),
        (aligned * 2, "gelu", 1),  # other values, same signature
        (misaligned, "gelu", 2),
        (aligned, "relu", 3),
        (aligned.t().contiguous().t(), "relu", 4),  # other strides
        (aligned.view(2, 3, 45), "relu", 5),  # other leading dimensions
        (aligned.view(2, 3, 45), "relu", 5),
    ]:
        got = linear(x, weight, bias, activation)
        z = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        expected = torch.relu(z) if activation == "relu" else torch.nn.functional.gelu(z)
        _assert_close(got, expected.float(), 45)
        assert len(checked) == expected_checked, (x.shape, x.stride(), activation)
    # a tracked call uses the same plan, and its forward keeps gelu's input as well
    leaves = [t.detach().requires_grad_() for t in (aligned, weight, bias)]
    grads = torch.autograd.grad(linear(*leaves, "gelu"), leaves, torch.ones(6, 29, device=DEVICE))
    assert len(checked) == 5 and all(g is not None for g in grads)
    # the weight's and the bias's layouts, the dtype and TF32's switch are in it too
    bias_storage = torch.randn(29 * 3 + 1, device=DEVICE)
    for weight_, bias_, dtype, expected_checked in [
        (weight, None, torch.float32, 6),
        (weight.t().contiguous().t(), bias, torch.float32, 7),  # the weight column-major
        (weight, bias_storage[1:30], torch.float32, 8),  # 4 bytes off a 16-byte boundary
        (weight, bias_storage[::3][:29], torch.float32, 9),  # strided: copied on each call
        (weight, bias_storage[::3][:29], torch.float32, 9),
        (weight, bias, torch.float64, 10),
    ]:
        x, weight_ = aligned.to(dtype), weight_.to(dtype)
        bias_ = None if bias_ is None else bias_.to(dtype)
        expected = torch.nn.functional.linear(x.double(), weight_.double(), None)
        expected = expected if bias_ is None else expected + bias_.double()
        _assert_close(linear(x, weight_, bias_, "relu"), torch.relu(expected).to(dtype), 45)
        assert len(checked) == expected_checked, (weight_.stride(), bias_)
    with runtime.tf32(not torch.backends.cuda.matmul.allow_tf32):
        linear(aligned, weight, bias, "relu")
    assert len(checked) == 11
    # a call that fails its checks is kept by no one: it fails again, the same way
    for _ in range(2):
        with pytest.raises(ValueError, match=r"bias must be \[out_features\]"):
            linear(aligned, weight, bias[:4])
        with pytest.raises(ValueError, match="activation must be one of"):
            linear(aligned, weight, bias, "tanh")


def test_linear_with_one_output_and_a_strided_bias():
    # a [1] bias with any stride is contiguous to torch: read as it is
    x, weight, _, _ = _layer((4, 8), 1)
    bias = torch.randn(1, 5, device=DEVICE)[:, 0]
    for _ in range(2):
        expected = x.double() @ weight.double().t() + bias.double()
        _assert_close(linear(x, weight, bias), expected.float(), 8)


def test_the_operator_leaves_no_unchecked_plan_behind(monkeypatch):
    # course_lib.ops's operator runs the same forward: called directly, with arguments
    # linear() refuses, it refuses them too, and linear() goes on refusing them after
    from course_lib import ops  # noqa: F401  (registers torch.ops.course)

    monkeypatch.setattr(finished, "_plans", PlanCache())
    x, weight, bias, _ = _layer((4, 5), 3)
    for _ in range(2):
        with pytest.raises(ValueError, match="activation must be one of"):
            torch.ops.course.linear(x, weight, bias, "tanh", False)
        with pytest.raises(ValueError, match="activation must be one of"):
            linear(x, weight, bias, "tanh")


def test_backward_keeps_its_launches_per_layout_of_the_output_gradient(monkeypatch):
    # a plan's backward is worked out once per layout of the output's gradient and which
    # gradients are asked for: later steps like it reuse its launches, others get their own
    monkeypatch.setattr(finished, "_plans", PlanCache())
    monkeypatch.setattr(finished, "_backward_plans", PlanCache())
    x, weight, bias, _ = _layer((2, 3, 45), 29)
    storage = torch.randn(6 * 29 + 4, device=DEVICE)
    layouts = [
        ("contiguous", lambda: storage[:-4].view(2, 3, 29), 1),
        ("other values", lambda: storage[:-4].view(2, 3, 29) * 2, 1),
        ("misaligned", lambda: storage[1:-3].view(2, 3, 29), 2),  # 4 bytes off 16 bytes
        ("transposed", lambda: storage[:-4].view(29, 6).t().view(2, 3, 29), 3),
        ("expanded, as y.sum()'s", lambda: torch.ones((), device=DEVICE).expand(2, 3, 29), 4),
        ("contiguous again", lambda: storage[:-4].view(2, 3, 29), 4),
    ]
    for activation in ACTIVATIONS:
        finished._plans.clear()
        finished._backward_plans.clear()
        for name, make_grad_y, kept in layouts:
            grad_y = make_grad_y()
            _, gx, gw, gb = _grads(x, weight, bias, grad_y, activation)
            expected = references.linear_grads(x, weight, bias, grad_y, activation)
            for got, want in zip((gx, gw, gb), expected):
                _assert_close(got, want, 6)
            assert len(finished._plans) == 1
            assert len(finished._backward_plans) == kept, (activation, name)
        # the bias frozen: no grad_bias asked for, another backward
        leaves = [t.detach().requires_grad_(t is not bias) for t in (x, weight, bias)]
        grad_y = layouts[0][1]()
        gx, gw = torch.autograd.grad(linear(*leaves, activation), leaves[:2], grad_y)
        expected = references.linear_grads(x, weight, bias, grad_y, activation)
        for got, want in zip((gx, gw), expected):
            _assert_close(got, want, 6)
        assert len(finished._backward_plans) == 5, activation


def test_backward_keeps_apart_what_saved_tensor_hooks_hand_back(monkeypatch):
    # a pack hook may save a contiguous copy of x or of the weight (save_on_cpu does, of a
    # view with gaps): the backward then reads tensors laid out unlike the plan's
    # arguments, and a backward kept for the one layout must not be used for the other
    monkeypatch.setattr(finished, "_plans", PlanCache())
    storage = torch.randn(37, 64, device=DEVICE)
    _, weight, bias, grad_y = _layer((37, 45), 29)
    for x, w in [
        (storage[:, :45], weight),
        (storage[:, :45].contiguous(), weight.t().contiguous().t()),
    ]:
        expected = references.linear_grads(x, w, bias, grad_y, "relu")
        copies = torch.autograd.graph.saved_tensors_hooks(lambda t: t.contiguous(), lambda t: t)
        for hooks in [copies, contextlib.nullcontext(), copies, torch.autograd.graph.save_on_cpu()]:
            with hooks:
                _, gx, gw, gb = _grads(x, w, bias, grad_y, "relu")
            for got, want in zip((gx, gw, gb), expected):
                _assert_close(got, want, 37)


def test_backward_follows_tf32s_switch_as_it_runs(monkeypatch):
    # the products' precision is TF32's switch at the time of the backward, as for
    # torch's own backward, whatever it was when the forward ran
    monkeypatch.setattr(finished, "_plans", PlanCache())
    monkeypatch.setattr(lesson05, "_plans", PlanCache())
    monkeypatch.setattr(finished, "_backward_plans", PlanCache())
    x, weight, _, grad_y = _layer((64, 48), 32)
    leaves = [t.detach().requires_grad_() for t in (x, weight)]
    for allow_tf32 in (False, True):
        with runtime.tf32(False):
            y = linear(*leaves)
        with runtime.tf32(allow_tf32):
            torch.autograd.grad(y, leaves, grad_y)
    assert len(finished._plans) == 1 and len(finished._backward_plans) == 2
    # the products' plans without and with TF32 (the signature's first switch)
    assert {key[-4] for key in lesson05._plans} == {False, True}


def test_output_grad_of_empty_gradients():
    for shape in [(0, 3), (4, 0), (0, 0)]:
        g = torch.randn(shape, device=DEVICE)
        saved = torch.randn(shape, device=DEVICE)
        gz, grad_bias = finished.output_grad(g, saved, "gelu", bias_grad=True)
        assert gz.shape == shape
        torch.testing.assert_close(grad_bias, torch.zeros(shape[1], device=DEVICE))


@pytest.mark.gpu
def test_kept_launches_stay_right_as_alignments_alternate():
    # on a GPU a kept plan launches the compiled kernel it kept: calls that alternate
    # between 16-byte aligned and misaligned x and bias must each get their own
    storage = torch.randn(64 * 96 + 8, device=DEVICE, dtype=torch.float16)
    weight = torch.randn(80, 96, device=DEVICE, dtype=torch.float16) / 10
    bias_storage = torch.randn(88, device=DEVICE, dtype=torch.float16)
    for _ in range(3):
        for offset in (0, 1, 8, 3):
            x = storage[offset : offset + 64 * 96].view(64, 96)
            bias = bias_storage[offset : offset + 80]
            for activation in ACTIVATIONS:
                z = x.double() @ weight.double().t() + bias.double()
                expected = {None: z, "relu": torch.relu(z), "gelu": torch.nn.functional.gelu(z)}
                expected = expected[activation]
                got = linear(x, weight, bias, activation)
                _assert_close(got, expected.half(), 96)


@pytest.mark.gpu
def test_kept_backwards_stay_right_as_the_output_gradients_alignment_alternates():
    # the backward kept per layout of grad_y launches compiled kernels specialised to its
    # alignment; steps that alternate between aligned and misaligned gradients (a view
    # into a larger buffer, say) must each take their own, through the autotuned products
    rows, in_features, out_features = 320, 384, 448  # past the small products' tiles
    x, weight, bias, _ = _layer((rows, in_features), out_features, torch.float16)
    storage = torch.randn(rows * out_features + 8, device=DEVICE, dtype=torch.float16)
    for activation in ACTIVATIONS:
        for _ in range(2):
            for offset in (0, 1, 8, 3):  # in elements: 0 and 16 bytes aligned, 2 and 6 not
                grad_y = storage[offset : offset + rows * out_features].view(rows, out_features)
                _, gx, gw, gb = _grads(x, weight, bias, grad_y, activation)
                expected = references.linear_grads(x, weight, bias, grad_y, activation)
                # gz is rounded once to float16 before the two products
                for got, want, terms in zip((gx, gw, gb), expected, (out_features, rows, rows)):
                    tol = tolerance_for(torch.float16)
                    torch.testing.assert_close(
                        got, want, rtol=8 * tol.rtol, atol=8 * tol.rtol * terms**0.5,
                        msg=lambda m, a=activation, o=offset: f"{a}, grad_y {o} elements in: {m}",
                    )  # fmt: skip
