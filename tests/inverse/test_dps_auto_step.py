"""DPS's automatic step (``scale="auto"``, docs/methods/inverse.md "Step sizes"): on an isotropic Gaussian prior
measured through ``A = a [I 0]`` the exact posterior is Gaussian and ``E[x0 | x_s, y]`` is the exact posterior
mixture's own denoiser, so the right DPS step is known in closed form: the one that turns DPS's level update into the
ancestral (DDIM(eta)) update of the exact posterior. The rule must reproduce that sampler path by path (same noise),
where the published constant does not; and every operator (``Matrix``, a plain function, HDR) runs without
``scale=``."""

from __future__ import annotations

import math

import pytest
import torch

from steerdiff.core.noise import SampleNoise, make_generators
from steerdiff.core.sampling import ancestral_split
from steerdiff.core.sigmas import vp_linear_levels
from steerdiff.inverse import solve
from steerdiff.inverse.dps import dps, dps_auto_scales
from steerdiff.inverse.linear import jacobian_norm_sq, operator_norm_sq
from steerdiff.inverse.operators import HDR, Inpaint, Matrix
from steerdiff.inverse.reference import exact_posterior
from steerdiff.models import GaussianMixture

F64 = torch.float64
D, M, SD, SY = 256, 128, 0.5, 0.1  # 256 unknowns, 128 measured, prior std 0.5, sigma_y 0.1


def isotropic_case(a: float):
    g = torch.Generator().manual_seed(0)
    prior = GaussianMixture([1.0], 0.3 * torch.randn(1, D, generator=g, dtype=F64), SD**2)
    op = Matrix(a * torch.eye(D, dtype=F64)[:M]).bind((D,))
    x = prior.sample(1, generator=g)
    y = op.forward(x) + SY * torch.randn(1, M, generator=g, dtype=F64)
    return prior, op, y, exact_posterior(prior, op, y, SY)[0]


def exact_ancestral(posterior, sigmas: list[float], eta: float, noise: SampleNoise, n: int) -> torch.Tensor:
    """The DDIM(eta) sampler DPS's update is built on, run on the exact posterior's denoiser (the same draws)."""
    sig = [*sigmas, 0.0]
    x = math.sqrt(1 + sig[0] ** 2) * noise.randn((n, D), F64)
    for s, s_next in zip(sig[:-1], sig[1:], strict=True):
        x0, z = posterior(x, s), noise.randn_like(x)
        s_down, s_up = ancestral_split(s, s_next, eta)
        x = x0 + s_down / s * (x - x0) + s_up * z
    return x


@pytest.mark.parametrize("a", [1.0, 3.0])
def test_rule_is_the_exact_posterior_step_on_an_isotropic_gaussian(a):
    prior, op, y, post = isotropic_case(a)
    sigmas, n = [float(s) for s in vp_linear_levels(100)], 100
    ref = exact_ancestral(post, sigmas, 1.0, SampleNoise(make_generators(5, n, "cpu")), n)[:, :M]
    mean = post.means[0, :M]

    def run(scale) -> tuple[float, float, float]:
        """On the measured coordinates (the others get no guidance): the median over chains of |x - x_exact| /
        |x_exact - E[x | y]|, the spread against the exact sampler's, the mean's distance in posterior stds."""
        x, dead = dps(prior, op, y.repeat(n, 1), sigmas, scale=scale, noise=SampleNoise(make_generators(5, n, "cpu")))
        assert (dead < 0).all()
        x, scale_ref = x[:, :M], (ref - mean).norm(dim=1)
        spread = (x - x.mean(0)).square().sum(1).mean() / (ref - ref.mean(0)).square().sum(1).mean()
        return (float(((x - ref).norm(dim=1) / scale_ref).median()), float(spread),
                float((x.mean(0) - ref.mean(0)).norm() / scale_ref.mean()))

    path, spread, mean_off = run(dps_auto_scales(sigmas, m=M, noise_std=SY, norm2=a * a, data_std=SD))
    # only ||r|| / sqrt(m v_s) - 1 (about 1 / sqrt(2 m) per level) separates the rule from the exact step
    assert path < 0.5 and 0.7 < spread < 1.3 and mean_off < 0.15
    for constant in (0.5, 2.0):  # the published inpainting step and a larger one miss it
        path_c, spread_c, _ = run(constant)
        assert path_c > 1.0 and not 0.7 < spread_c < 1.3


def test_rule_limits_and_paper_form():
    sig = [math.inf, 10.0, 1.0, 0.1]
    rule = dps_auto_scales(sig, m=4, noise_std=0.1, norm2=1.0, data_std=0.5)
    assert rule[0] == 0.0 and all(v > 0 for v in rule[1:])  # no step at sigma = inf
    # the last level (s -> 0) of an eta = 1 chain: s^2 sqrt(m / v) / sqrt(1 + s^2), v = sigma_y^2 + |A|^2 Cov_s
    v = 0.01 + 0.25 * 0.01 / (0.25 + 0.01)
    assert rule[-1] == pytest.approx(0.01 * math.sqrt(4 / v) / math.sqrt(1.01), rel=1e-12)
    with pytest.raises(ValueError, match="noise_std > 0"):
        dps_auto_scales([1.0], m=1, noise_std=0.0, norm2=0.0, data_std=0.5)
    prior, op, y, _ = isotropic_case(1.0)
    kw = dict(noise_std=SY, chains=3, steps=20, generator=0)
    code = solve(prior, op, y, "dps", **kw).samples
    paper = solve(prior, op, y, "dps", step_form="paper", **kw).samples  # zeta' = scale / 2, the same step
    torch.testing.assert_close(code, paper, rtol=1e-9, atol=1e-9)


def test_every_operator_runs_without_a_scale():
    prior, op, y, _ = isotropic_case(1.0)
    kw = dict(noise_std=SY, chains=4, steps=30, generator=1)
    auto = solve(prior, op, y, "dps", **kw)  # a Matrix: no published step, the rule
    assert torch.isfinite(auto.samples).all()
    torch.testing.assert_close(auto.samples, solve(prior, op, y, "dps", scale="auto", **kw).samples)
    # Inpaint: the rule too (the same operator as this Matrix); the DPS config's step (0.5) on request
    inp = Inpaint(torch.arange(D) < M).bind((D,))
    torch.testing.assert_close(solve(prior, inp, y, "dps", **kw).samples, auto.samples)
    torch.testing.assert_close(solve(prior, inp, y, "dps", scale="config", **kw).samples,
                               solve(prior, inp, y, "dps", scale=0.5, **kw).samples)


def test_norms_for_the_rule_against_exact_values():
    A = torch.tensor([[1.0, -0.5, 0.25], [0.0, 1.0, 2.0]], dtype=F64)
    exact = float(torch.linalg.matrix_norm(A, ord=2) ** 2)
    assert operator_norm_sq(Matrix(A).bind((3,)), F64, "cpu") == pytest.approx(exact, rel=1e-12)
    from steerdiff.inverse.operators import as_operator

    fn = as_operator(lambda x: x @ A.to(x).T, shape=(3,))  # one function: treated as nonlinear
    assert not fn.is_linear
    assert jacobian_norm_sq(fn, torch.zeros(1, 3, dtype=F64), iters=60) == pytest.approx(exact, rel=1e-8)
    hdr = HDR().bind((4,))  # clip(2x, -1, 1): J = 2 I at 0
    assert jacobian_norm_sq(hdr, torch.zeros(1, 4, dtype=F64)) == pytest.approx(4.0, rel=1e-12)
    prior = GaussianMixture([1.0], torch.zeros(1, 4, dtype=F64), 0.1)
    y = torch.tensor([[0.3, -0.2, 0.1, 0.0]], dtype=F64)
    res = solve(prior, hdr, y, "dps", noise_std=0.05, chains=4, steps=20, generator=0)
    assert torch.isfinite(res.samples).all()
    # a chain that fits y: clip(2x) of the posterior mean is near y (no published step for HDR before)
    assert float((hdr.forward(res.samples[0].mean(0, keepdim=True)) - y).abs().max()) < 0.1


def test_solve_takes_one_dps_step_per_level():
    """``scale=`` as a sequence, one step per level: the rule's own steps reproduce ``scale="auto"`` exactly, a
    constant sequence reproduces the number, and a wrong length or a non-positive step is refused by name."""
    prior, op, y, _ = isotropic_case(1.0)
    steps = 12
    auto = solve(prior, op, y, "dps", noise_std=SY, chains=3, steps=steps, generator=0)
    per_level = dps_auto_scales(vp_linear_levels(steps).tolist(), m=M, noise_std=SY,
                                norm2=operator_norm_sq(op, F64, torch.device("cpu")), data_std=SD)
    given = solve(prior, op, y, "dps", noise_std=SY, chains=3, steps=steps, generator=0, scale=per_level)
    torch.testing.assert_close(given.samples, auto.samples, rtol=1e-12, atol=1e-12)
    const = solve(prior, op, y, "dps", noise_std=SY, chains=3, steps=steps, generator=0, scale=0.3)
    seq = solve(prior, op, y, "dps", noise_std=SY, chains=3, steps=steps, generator=0, scale=[0.3] * steps)
    assert torch.equal(const.samples, seq.samples)
    with pytest.raises(ValueError, match="one value per level"):
        solve(prior, op, y, "dps", noise_std=SY, steps=steps, scale=[0.3] * (steps - 1))
    with pytest.raises(ValueError, match="scale"):
        solve(prior, op, y, "dps", noise_std=SY, steps=steps, scale=[0.3] * (steps - 1) + [-1.0])


@pytest.mark.parametrize("eta", [1.0, 0.5])
def test_score_form_is_the_ancestral_sampler_on_the_guided_score(eta):
    """``step_form="score"``: the likelihood term ``-w grad ||y - A D(x, s)||`` added to the prior's score (deepinv's
    ``PosteriorDiffusion`` form). By Tweedie's formula that is the DDIM(eta) sampler on the shifted denoiser
    ``D(x, s) - w s^2 grad_x ||y - A D(x, s)||``, built here by hand and run with the same draws."""
    prior, op, y, _ = isotropic_case(1.0)
    sigmas, n, w = [float(s) for s in vp_linear_levels(30)], 5, 0.7

    def shifted(x, s):
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            x0 = prior(x, torch.full((x.shape[0],), s, dtype=F64))
            (g,) = torch.autograd.grad((y - op.forward(x0)).norm(dim=1).sum(), x)
        return x0.detach() - w * s * s * g

    ref = exact_ancestral(shifted, sigmas, eta, SampleNoise(make_generators(5, n, "cpu")), n)
    got = solve(prior, op, y, "dps", noise_std=SY, chains=n, sigmas=torch.tensor(sigmas, dtype=F64),
                generator=5, step_form="score", scale=w, eta=eta).samples[0]
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="step_form='score' needs scale="):
        solve(prior, op, y, "dps", noise_std=SY, steps=5, step_form="score")
    with pytest.raises(ValueError, match="sigma = inf"):
        solve(prior, op, y, "dps", noise_std=SY, sigmas=torch.tensor([math.inf, 1.0, 0.1], dtype=F64),
              step_form="score", scale=w)
