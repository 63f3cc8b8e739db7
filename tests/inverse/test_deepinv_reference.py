"""deepinv as an independent reference for the inverse solvers (optional: skipped unless deepinv is importable;
benchmarks/_deepinv.py imports it beside the CPU torch, see there; not in requirements-test-reference.txt because
its ``__init__`` needs torchvision, whose PyPI wheels do not load beside the CPU torch).

- DDRM: deepinv's ``DDRM`` on the same levels, the same prior (the exact mixture as a deepinv ``Denoiser``) and the
  same global-RNG noise is steerdiff's DDRM step for step once its noise divisor ``sqrt(2)`` is undone (the paper's
  eq. 8 draws ``std * z``); with the divisor it is a different sampler (checked to differ).
- DPS / DiffPIR: deepinv's (DPS at weight 30, near its best on this problem in deepinv's [0, 1] units; DiffPIR at
  its defaults), at 100 NFE, recover the posterior on a one-mode problem (mean error below half the prior's), the
  sanity check that the adapter's units are right.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _deepinv as DI  # noqa: E402

if not DI.available():
    pytest.skip("deepinv is not installed (optional reference)", allow_module_level=True)
try:
    DI.load()
except Exception as err:  # an installed deepinv that does not import here: say why, do not fail the suite
    pytest.skip(f"deepinv does not import: {err!r}", allow_module_level=True)

from inverse_deepinv import ddrm_paper_noise  # noqa: E402

from steerdiff.app.protocols import inverse as V  # noqa: E402
from steerdiff.core.sigmas import vp_linear_levels  # noqa: E402
from steerdiff.inverse import solve  # noqa: E402
from steerdiff.inverse.metrics import posterior_metrics  # noqa: E402


@pytest.mark.parametrize("which", ["g1", "gauss"])
def test_deepinv_ddrm_with_the_papers_noise_is_steerdiffs_ddrm(which):
    p = V.g1_problems(chains=8)[3] if which == "g1" else V.gauss_problem(8)
    ad = DI.Adapter(p, unit=True)
    sig = vp_linear_levels(30).tolist()
    sig[0] = 1e4  # deepinv starts the null space at std s_0, steerdiff at sqrt(1 + s_0^2): equal to 5e-9 here
    theirs = ddrm_paper_noise(ad, 8, sig, seed=11)
    torch.manual_seed(11)
    ours = solve(p.prior, p.operator, p.y, "ddrm", noise_std=p.noise_std, chains=8, sigmas=sig, generator=None)
    torch.testing.assert_close(theirs, ours.samples[0], rtol=0, atol=1e-5)  # deepinv divides by s_i + 1e-6
    as_shipped = ad.ddrm(8, sig, seed=11)
    assert (as_shipped - ours.samples[0]).abs().max() > 1e-2


@pytest.mark.parametrize("method", ["dps", "diffpir"])
def test_deepinv_samplers_recover_a_one_mode_posterior_through_the_adapter(method):
    p = V.gauss_problem(200)
    ad = DI.Adapter(p)
    x = ad.dps(200, 101, 30.0, seed=0) if method == "dps" else ad.diffpir(200, 100, seed=0)
    assert ad.nfe == 100
    got = posterior_metrics(x, p.posterior, seed=0)
    prior = posterior_metrics(p.prior.sample(200, generator=torch.Generator().manual_seed(1)), p.posterior, seed=0)
    assert got["nonfinite"] == 0 and got["mean_err"] < 0.5 * prior["mean_err"], (got, prior)
