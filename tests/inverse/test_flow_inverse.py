"""DPS on a flow schedule that starts at sigma = inf; the other solvers refuse it by name.

Independent truth: the limit. DPS from a huge finite ``s_0`` (state ``sqrt(1 + s_0^2) z``, gradient w.r.t. ``x``)
approaches DPS from ``inf`` (state ``z``, gradient w.r.t. ``z``, step ``sqrt(1 + s_1^2) g``) as ``O(1/s_0)``, on a
denoiser whose value at ``inf`` depends on the noise (so the gradient term is not zero there).
"""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.inverse import solve
from steerdiff.models import builtin_mixture

A = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
Y = torch.tensor([[1.5], [-2.0]], dtype=torch.float64)


def _perturbed_flow(mixture, amp=0.3):
    """The mixture as a velocity network plus ``amp t sin(x_t)``: its D at t = 1 is ``mean - amp sin(eps)``."""
    def velocity(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)
        sigma = torch.where(one, torch.full_like(tt, math.inf), tt / keep)
        return (x_t - mixture(x_t / keep, sigma[:, 0], cond)) / tt + amp * tt * torch.sin(x_t)
    return sd.FlowDenoiser(velocity, t_scale=1.0)


@pytest.mark.parametrize("eta", [1.0, 0.5])
def test_dps_from_inf_is_the_limit_of_a_huge_finite_start(eta):
    flow = _perturbed_flow(builtin_mixture("gmm2d"))
    levels = sd.sigmas.flow(20, shift=3.0)[:-1]
    finite = levels.clone()
    finite[0] = 1e7
    kw = {"noise_std": 0.1, "chains": 4, "scale": 0.3, "eta": eta, "generator": 3}
    seen = []
    at_inf = solve(flow, A, Y, "dps", sigmas=levels, callback=seen.append, **kw)
    near = solve(flow, A, Y, "dps", sigmas=finite, **kw)
    assert math.isinf(seen[0]["sigma"]) and at_inf.nfe == near.nfe == 20
    assert torch.isfinite(at_inf.samples).all()
    torch.testing.assert_close(at_inf.samples, near.samples, rtol=0, atol=1e3 / 1e7)
    # the gradient term at inf matters: without it (scale 0 there) the result would differ by far more
    free = solve(flow, A, Y, "dps", sigmas=levels, **{**kw, "scale": 1e-12})
    assert (free.samples - at_inf.samples).abs().max() > 1e-2


@pytest.mark.parametrize("method", ["dr", "cr", "hr"])
def test_solvers_that_cannot_start_at_inf_refuse_it_by_name(method):
    with pytest.raises(ValueError, match=rf"sigmas\[0\] = inf .*method='{method}' cannot start at sigma = inf "
                                         r"\(methods that can: \[.*\]\)"):
        solve(builtin_mixture("gmm2d"), A, Y, method, noise_std=0.1, sigmas=sd.sigmas.flow(10)[:-1])
