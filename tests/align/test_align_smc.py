"""SMC helpers: log-weights, ESS and the five resamplers (U4 of das.md section 9)."""

import math

import pytest
import torch

from steerdiff.align.smc import RESAMPLERS, ess, group_uniforms, normalize, resample


def test_normalize_and_ess():
    logw = torch.tensor([[0.0, math.log(3.0), -math.inf, 1000.0]], dtype=torch.float64)
    ln = normalize(logw)
    assert torch.isfinite(ln[0, [0, 1, 3]]).all() and torch.isneginf(ln[0, 2])
    torch.testing.assert_close(ln.exp().sum(1), torch.ones(1, dtype=torch.float64))
    assert abs(float(ess(ln)) - 1.0) < 1e-9  # one particle holds all the weight
    assert abs(float(ess(normalize(torch.zeros(2, 8, dtype=torch.float64)))[0]) - 8) < 1e-12
    w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert abs(float(ess(w.log())) - 1 / (w**2).sum()) < 1e-12


@pytest.mark.parametrize("scheme", RESAMPLERS)
def test_u4_offspring_counts(scheme):
    """U4: over 10^4 draws the mean offspring count of j is P W_j (within 3 s.e.); SSP and systematic give
    floor(P W_j) or floor(P W_j) + 1 offspring."""
    P, n = 8, 10_000
    w = torch.tensor([0.31, 0.02, 0.17, 0.005, 0.2, 0.115, 0.08, 0.1], dtype=torch.float64)
    u = torch.rand(n, P, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    anc = resample(w.expand(n, P), u, scheme)
    assert anc.shape == (n, P) and int(anc.min()) >= 0 and int(anc.max()) < P
    counts = torch.zeros(n, P, dtype=torch.float64).scatter_add_(1, anc, torch.ones(n, P, dtype=torch.float64))
    mean, se = counts.mean(0), counts.std(0) / math.sqrt(n)
    assert ((mean - P * w).abs() <= 3 * se + 1e-9).all(), (scheme, mean, P * w)
    floor = (P * w).floor()
    if scheme in ("ssp", "systematic"):
        assert ((counts == floor) | (counts == floor + 1)).all()
    if scheme == "residual":
        assert (counts >= floor).all()


def test_resampling_is_exact_for_degenerate_and_uniform_weights():
    P = 6
    one_hot = torch.zeros(3, P, dtype=torch.float64)
    one_hot[:, 4] = 1.0
    uniform = torch.full((3, P), 1 / P, dtype=torch.float64)
    u = torch.rand(3, P, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for scheme in RESAMPLERS:
        assert (resample(one_hot, u, scheme) == 4).all()
        if scheme in ("ssp", "systematic", "residual"):
            assert (resample(uniform, u, scheme).sort(1).values == torch.arange(P)).all()
    with pytest.raises(ValueError, match="resampler"):
        resample(uniform, u, "bogus")


def test_group_uniforms_come_from_each_groups_generator():
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    u = group_uniforms(gens, torch.tensor([2, 0]), 4)
    ref = torch.stack([torch.rand(4, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in (3, 1)])
    torch.testing.assert_close(u, ref)
