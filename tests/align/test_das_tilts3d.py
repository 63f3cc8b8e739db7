"""Exact 3-D tilts with anisotropic components (issue 38, "The default DAS, looked at again";
``docs/methods/das.md``, "The default on 3-D exact tilts").

The targets are closed-form (``GaussianMixture.tilt_quadratic`` / ``tilt_linear``), checked here against importance
weighting of exact prior draws. The bounds come from the sample size: G outputs, one per group, drawn from the exact
target would put a fraction ``f_k`` in mode k with standard error ``sqrt(p_k (1 - p_k) / G)``; a sampler passes when
every mode is within 3.5 standard errors plus the 100-step chain's own bias (the ancestral chain shrinks the
within-mode variance): a pool of 10^5 plain chains weighted by ``exp(r / alpha)`` (``python
benchmarks/das_tilts3d.py``) puts its modes within 0.002 of the closed form on T3q and within 0.024 on T3l (0.329 /
0.517 / 0.154 for 0.320 / 0.541 / 0.139: the linear tilt's weights depend on the variance), so the slack is 0.01 and
0.03.

On T3q the library default (gradient-free, adaptive tempering) misses the bound (mode TV 0.11-0.12 at P = 32
and at P = 128) while SIR at the same cost is right: the look-ahead twist ``r(D(x)) / alpha``
overrates the wide component while the modes separate, and the adaptive schedule trusts it fully (lambda = 1) from
the first step. That test is a strict xfail: it documents the default's bias and fails (XPASS) once it is fixed.
``tempering="sigma"`` (levels ``min(1, (1 / sigma_i)^2)``) meets the bound; it is not the default, being worse on
the digits reward ``ink`` (``docs/methods/das.md``, "Tempering by sigma").
"""

import math

import pytest
import torch

from steerdiff.app.protocols.das import LIBRARY_DAS, TILTS_3D, run_method
from steerdiff.models import GaussianMixture

GROUPS = 1024
CHAIN_SLACK = {"T3q": 0.01, "T3l": 0.03}  # the chain's own offset from the closed form, rounded up (docstring)


def _mode_fractions(problem, samples) -> torch.Tensor:
    tilted = problem.tilted
    comp = tilted.responsibilities(samples.double()).argmax(-1)
    return torch.bincount(comp, minlength=tilted.n_components).double() / samples.shape[0]


def _assert_modes(problem, samples, n_se: float = 3.5):
    slack = CHAIN_SLACK[problem.name]
    p = problem.tilted.weights
    f = _mode_fractions(problem, samples)
    se = (p * (1 - p) / samples.shape[0]).sqrt()
    assert torch.all((f - p).abs() <= n_se * se + slack), (f.tolist(), p.tolist(), (n_se * se + slack).tolist())


@pytest.mark.parametrize("name", sorted(TILTS_3D))
def test_exact_3d_tilt_matches_importance_weighting(name):
    """The closed-form tilt (mode weights and E[r]) against exact prior draws weighted by exp(r / alpha)."""
    prob = TILTS_3D[name]()
    x, comp = prob.mixture.sample(200_000, torch.Generator().manual_seed(3), return_components=True)
    w = torch.softmax(prob.reward(x) / prob.alpha, 0)
    ess = float(1 / (w**2).sum())
    # mode weights: responsibilities under the tilted mixture are the tilt of the prior responsibilities
    frac = torch.zeros(prob.mixture.n_components, dtype=torch.float64).index_add_(0, comp, w)
    tol = 5 / math.sqrt(ess)
    assert torch.allclose(frac, prob.tilted.weights, atol=tol), (frac, prob.tilted.weights)
    r = prob.reward(x)
    sd = float(((w * (r - (w * r).sum()) ** 2).sum()).sqrt())
    assert abs(float((w * r).sum()) - prob.exact_reward) <= 5 * sd / math.sqrt(ess)


def test_3d_tilts_are_anisotropic_and_contested():
    """The cases are what they claim: anisotropic components, and more than one mode carries real weight."""
    for make in TILTS_3D.values():
        prob = make()
        assert isinstance(prob.mixture, GaussianMixture) and prob.mixture.dim == 3
        ev = torch.linalg.eigvalsh(prob.mixture.covs)
        assert float((ev[:, -1] / ev[:, 0]).max()) > 10
        assert int((prob.tilted.weights > 0.1).sum()) >= 2


@pytest.mark.slow  # ~2.5 s each; the default suite keeps the DAS rows (the default's linear case, the fix candidate)
@pytest.mark.parametrize("name", sorted(TILTS_3D))
def test_sir_samples_the_3d_tilts(name):
    """SIR at the protocol's equal cost (32 chains for 16 gradient particles) meets the sample-size bound: the bound
    is attainable by a consistent sampler at this size."""
    prob = TILTS_3D[name]()
    _assert_modes(prob, run_method(prob, "sir", GROUPS, seed=0, fast=False).samples)


def test_default_das_samples_the_linear_3d_tilt():
    prob = TILTS_3D["T3l"]()
    _assert_modes(prob, run_method(prob, "das", GROUPS, seed=0, fast=False, **LIBRARY_DAS).samples)


@pytest.mark.slow  # a known failure documented by a strict xfail: run with -m slow
@pytest.mark.xfail(strict=True, reason="known bias of the default on T3q (docs/methods/das.md, 'The default on 3-D "
                   "exact tilts'): the look-ahead twist overrates the wide component and adaptive tempering sets "
                   "lambda = 1 from the first step")
def test_default_das_samples_the_quadratic_3d_tilt():
    prob = TILTS_3D["T3q"]()
    _assert_modes(prob, run_method(prob, "das", GROUPS, seed=0, fast=False, **LIBRARY_DAS).samples)


def test_sigma_tempering_is_the_closed_form_levels():
    """``tempering="sigma"`` runs the levels ``min(1, (s / sigma_i)^2)`` computed here from the grid (s = 1 by default,
    ``gamma`` otherwise), bit for bit, and its recorded lambdas are those levels."""
    from steerdiff.app.protocols.das import validation_sigmas

    prob = TILTS_3D["T3q"]()
    sig = validation_sigmas(20)[:20].double()
    for gamma, s in ((None, 1.0), (0.5, 0.5)):
        levels = (s / sig).pow(2).clamp(max=1.0)
        named = run_method(prob, "das", 8, seed=2, steps=20, fast=False, gradient=False, tempering="sigma", gamma=gamma)
        explicit = run_method(prob, "das", 8, seed=2, steps=20, fast=False, gradient=False, tempering=levels.tolist())
        assert torch.equal(named.samples, explicit.samples)
        assert torch.allclose(named.lambdas[:-1], levels[:, None].expand(20, 8))
        assert named.extras["tempering"] == "sigma"


def test_sigma_tempering_samples_the_quadratic_3d_tilt():
    """Gradient-free DAS with ``tempering="sigma"`` (``lambda_i = min(1, (1 / sigma_i)^2)``: the look-ahead twist kept
    weak while the posterior covariance it omits is wide; docs/methods/das.md, "Tempering by sigma") puts T3q's
    modes within the sample-size bound that the adaptive schedule misses."""
    prob = TILTS_3D["T3q"]()
    res = run_method(prob, "das", GROUPS, seed=0, fast=False, **{**LIBRARY_DAS, "tempering": "sigma"})
    _assert_modes(prob, res.samples)
