"""The NAMM forward map is the gradient of a convex potential (docs/methods/namm.md, "Forward map")."""

import pytest
import torch

from steerdiff.constrain import ConvICNNMap, ICNNMap


def _spread(m, scale=0.5, seed=0):
    """Non-trivial weights: the U(0, 1e-3) init makes g almost alpha * x, which would test nothing."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    m.clamp_()
    return m


def _jacobian(m, x):
    return torch.autograd.functional.jacobian(lambda v: m(v[None])[0].flatten(), x).reshape(x.numel(), x.numel())


@pytest.mark.parametrize("make", [lambda: ICNNMap(dim=5, hidden=16, layers=2),
                                  lambda: ConvICNNMap(shape=(1, 4, 4), filters=4, layers=2)])
def test_jacobian_symmetric_and_bounded_below(make):
    torch.manual_seed(0)
    m = _spread(make()).double()
    for seed in range(3):
        x = torch.randn(m.sample_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        jac = _jacobian(m, x)
        # A gradient map has a symmetric Jacobian; (1-a) Hess Psi + a I with Psi convex has eigenvalues >= a.
        assert torch.allclose(jac, jac.T, atol=1e-10)
        eig = torch.linalg.eigvalsh(0.5 * (jac + jac.T))
        assert eig.min() >= m.alpha - 1e-9
        assert eig.max() > m.alpha + 1e-3  # the potential is not trivially zero


def test_gradient_matches_finite_differences_of_potential():
    m = _spread(ICNNMap(dim=3, hidden=8, layers=2)).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    h = 1e-6
    num = torch.stack([(m.potential(x + h * e) - m.potential(x - h * e)) / (2 * h)
                       for e in torch.eye(3, dtype=torch.float64)], dim=1)
    assert torch.allclose(m(x), (1 - m.alpha) * num + m.alpha * x, atol=1e-7)


def test_strongly_monotone_and_convex_along_lines():
    m = _spread(ICNNMap(dim=6, hidden=16, layers=3)).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(200, 6, generator=g, dtype=torch.float64), torch.randn(200, 6, generator=g, dtype=torch.float64)
    inner = ((m(x) - m(y)) * (x - y)).sum(1)
    assert (inner >= m.alpha * ((x - y) ** 2).sum(1) - 1e-10).all()
    t = torch.rand(200, 1, generator=g, dtype=torch.float64)
    psi = m.potential
    assert (psi(t * x + (1 - t) * y) <= t[:, 0] * psi(x) + (1 - t[:, 0]) * psi(y) + 1e-10).all()


def _midpoint_gap(m, seed=3, n=2000):
    """max over random pairs of psi((x+y)/2) - (psi(x)+psi(y))/2: <= 0 for a convex potential."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *m.sample_shape, generator=g, dtype=torch.float64) * 2
    y = torch.randn(n, *m.sample_shape, generator=g, dtype=torch.float64) * 2
    psi = m.potential
    with torch.no_grad():
        return float((psi(0.5 * (x + y)) - 0.5 * (psi(x) + psi(y))).max())


def test_negative_weights_break_convexity_and_clamp_restores_it():
    m = _spread(ICNNMap(dim=2, hidden=16, layers=2), scale=1.0).double()
    with torch.no_grad():
        for w in m.wq:
            w.weight.mul_(0.01)  # weak quadratic terms, so the (non-)convexity of the z-path shows
        for w in m.wz:
            w.copy_(-w.abs() - 0.5)
    assert not m.is_convex()
    assert _midpoint_gap(m) > 1e-3  # the convexity check has teeth: without the clamp Psi is not convex here
    m.clamp_()
    assert m.is_convex()
    assert _midpoint_gap(m) <= 1e-10


def test_no_grad_mode_returns_detached_and_shape_checked():
    m = ICNNMap(shape=(1, 2, 2), hidden=4)
    x = torch.randn(3, 1, 2, 2)
    with torch.no_grad():
        out = m(x)
    assert out.shape == x.shape and not out.requires_grad
    with pytest.raises(ValueError, match=r"x must have shape \[B, 1, 2, 2\]"):
        m(torch.randn(3, 4))
    with pytest.raises(ValueError, match="alpha"):
        ICNNMap(dim=2, alpha=1.0)
