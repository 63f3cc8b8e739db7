"""Measurement operators and noise models (docs/methods/inverse.md, "Operators", "Noise models"), the level
schedule."""

import math

import pytest
import scipy.signal
import torch

from steerdiff.core.sigmas import vp_linear_levels
from steerdiff.inverse import (
    HDR,
    AvgPoolSR,
    Blur,
    Downsample,
    GaussBlur,
    GaussianNoise,
    Inpaint,
    Matrix,
    NoAdjointError,
    PoissonNoise,
    gaussian_kernel,
    measure,
    task_operator,
)

SHAPE = (1, 8, 8)


def linear_ops():
    g = torch.Generator().manual_seed(0)
    return [
        Matrix(torch.randn(3, 64, generator=g, dtype=torch.float64), SHAPE),
        Inpaint.center(SHAPE),
        Inpaint.random(SHAPE, keep=0.5, seed=1),
        Downsample(2, SHAPE),
        GaussBlur(5, 1.0, SHAPE),
        Blur(torch.rand(3, 5, generator=g, dtype=torch.float64), (2, 6, 10)),  # asymmetric kernel, 2 channels
    ]


@pytest.mark.parametrize("op", linear_ops(), ids=repr)
def test_adjoint_and_matrix_agree_with_forward(op):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, *op.shape, generator=g, dtype=torch.float64)
    v = torch.randn(4, op.m, generator=g, dtype=torch.float64)
    ax = op.forward(x)
    assert ax.shape == (4, op.m)
    # <A x, v> = <x, A^T v>
    torch.testing.assert_close((ax * v).sum(1), (x * op.adjoint(v)).flatten(1).sum(1))
    torch.testing.assert_close(ax, x.flatten(1) @ op.matrix().T)


@pytest.mark.parametrize("op", [Inpaint.center(SHAPE), Downsample(2, SHAPE), Matrix(torch.randn(5, 64).double())],
                         ids=repr)
def test_pinv_is_the_moore_penrose_inverse(op):
    y = torch.randn(3, op.m, dtype=torch.float64)
    torch.testing.assert_close(op.forward(op.pinv(y)), y)  # A A^+ y = y for full-row-rank A
    torch.testing.assert_close(op.pinv(y).flatten(1), y @ torch.linalg.pinv(op.matrix()).T)


def test_inpaint_keeps_the_masked_entries_and_zero_fills():
    op = Inpaint.center(SHAPE)
    assert op.m == 64 - 16
    x = torch.arange(64.0).reshape(1, *SHAPE)
    filled = op.pinv(op.forward(x))
    assert (filled[0, 0, 2:6, 2:6] == 0).all() and (filled[0, 0, 0] == x[0, 0, 0]).all()
    assert Inpaint(torch.ones(8, 8)).bind(SHAPE).m == 64  # an [H, W] mask broadcasts over channels
    assert Inpaint.random(SHAPE, keep=0.5, seed=0).m == 32


def test_downsample_is_block_mean_with_nearest_pinv():
    op = AvgPoolSR(2, SHAPE)
    x = torch.arange(64.0).reshape(1, *SHAPE)
    y = op.forward(x)
    assert y.shape == (1, 16) and y[0, 0] == (0 + 1 + 8 + 9) / 4
    up = op.pinv(y)[0, 0]
    assert (up[:2, :2] == y[0, 0]).all()


def test_gaussian_blur_matches_scipy_convolution():
    k = gaussian_kernel(5, 1.0)
    assert math.isclose(float(k.sum()), 1.0) and torch.equal(k, k.T)
    torch.testing.assert_close(k[2], k[:, 2])
    g = torch.Generator().manual_seed(0)
    kernel = torch.rand(3, 5, generator=g, dtype=torch.float64)  # asymmetric: checks a true convolution
    x = torch.randn(1, 1, 8, 8, generator=g, dtype=torch.float64)
    ref = scipy.signal.convolve2d(x[0, 0].numpy(), kernel.numpy(), mode="same")
    torch.testing.assert_close(Blur(kernel, SHAPE).forward(x).reshape(8, 8), torch.from_numpy(ref))


def test_blur_pinv_truncates_small_singular_values():
    op, plain = GaussBlur(5, 1.0, SHAPE), GaussBlur(5, 1.0, SHAPE, pinv_rtol=None)
    y = op.forward(torch.zeros(1, *SHAPE, dtype=torch.float64)) + 0.05 * torch.randn(1, 64, dtype=torch.float64)
    assert op.pinv(y).abs().max() < 2 < plain.pinv(y).abs().max()  # the plain inverse amplifies noise ~1000x


def test_hdr_is_nonlinear_with_pinv_and_no_adjoint():
    op = HDR(SHAPE)
    x = torch.linspace(-1, 1, 64).reshape(1, *SHAPE)
    torch.testing.assert_close(op.forward(x), (2 * x).clamp(-1, 1).flatten(1))
    torch.testing.assert_close(op.pinv(op.forward(x * 0.4)).flatten(1), (x * 0.4).flatten(1))
    with pytest.raises(NoAdjointError, match="nonlinear.*adjoint"):
        op.adjoint(torch.zeros(1, 64))
    with pytest.raises(NoAdjointError, match="matrix"):
        op.matrix()


def test_binding_and_shape_errors():
    op = Downsample(2)
    with pytest.raises(ValueError, match="no sample shape"):
        _ = op.m
    assert op.bind(SHAPE).m == 16 and op.shape is None
    with pytest.raises(ValueError, match="not divisible"):
        Downsample(3, SHAPE)
    with pytest.raises(ValueError, match=r"mask of shape \(7, 7\) does not fit samples of shape \(1, 8, 8\)"):
        Inpaint(torch.ones(7, 7)).bind(SHAPE)
    with pytest.raises(ValueError, match="expects x of shape"):
        Inpaint.center(SHAPE).forward(torch.zeros(2, 1, 7, 7))
    with pytest.raises(ValueError, match=r"y must have shape \[M, 48\]"):
        Inpaint.center(SHAPE).pinv(torch.zeros(2, 47))
    with pytest.raises(ValueError, match="NaN"):
        Downsample(2, SHAPE).pinv(torch.full((1, 16), math.nan))
    with pytest.raises(ValueError, match="0/1"):
        Inpaint(torch.full((8, 8), 0.5))
    with pytest.raises(ValueError, match="odd"):
        Blur(torch.ones(4, 4))
    with pytest.raises(ValueError, match="columns"):
        Matrix(torch.ones(2, 5)).bind(SHAPE)
    with pytest.raises(ValueError, match="unknown task"):
        task_operator("colorize")


def test_vp_linear_sigmas_match_the_hrdis_grid():
    s = vp_linear_levels(100)
    assert s.shape == (100,) and torch.all(s[1:] < s[:-1])
    assert math.isclose(s[0], 143.78, rel_tol=1e-4) and math.isclose(s[-1], 0.0100, rel_tol=1e-3)
    assert math.isclose(vp_linear_levels(90, end=100)[-1], 0.342, rel_tol=2e-3)
    with pytest.raises(ValueError, match="steps"):
        vp_linear_levels(2000)


def test_gaussian_measurement_is_per_row_and_has_the_stated_std():
    op = Inpaint.center(SHAPE)
    x = torch.zeros(400, *SHAPE, dtype=torch.float64)
    y = measure(op, x, 0.05, generator=3)
    assert math.isclose(float(y.std()), 0.05, rel_tol=0.03)
    torch.testing.assert_close(measure(op, x[5:6], 0.05, generator=[8]), y[5:6])  # row i uses seed 3 + i
    with pytest.raises(ValueError, match="noise_std"):
        GaussianNoise(-0.1)


def test_poisson_noise_counts_and_weights():
    noise = PoissonNoise(rate=1.0)
    clean = torch.full((2000, 4), 0.2, dtype=torch.float64)
    y = noise.sample(clean, generator=0)
    k = noise.counts(y)
    lam = 255 * (0.2 + 1) / 2
    assert math.isclose(float(k.mean()), lam, rel_tol=0.01) and math.isclose(float(k.var()), lam, rel_tol=0.1)
    torch.testing.assert_close(k, torch.round(k))
    # Lambda_jj = 1 / (2 max(k, 1)) in counts, on the count-unit residual (255 r / 2) (y - A x)
    torch.testing.assert_close(noise.weights(y), (255 / 2) ** 2 / (2 * k.clamp_min(1)))
