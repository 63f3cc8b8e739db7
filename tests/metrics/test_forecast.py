"""Ensemble forecast scores (docs/methods/dydiff.md): the fair CRPS against properscoring's CRPS through the exact
fair/non-fair relation, the ensemble-mean MSE, and bad inputs."""

import numpy as np
import pytest
import torch

from steerdiff.metrics.forecast import crps_fair, ensemble_mse, member_rmse

properscoring = pytest.importorskip("properscoring")


def nonfair_to_fair(nonfair: np.ndarray, ens: np.ndarray) -> np.ndarray:
    """properscoring's ``crps_ensemble`` is ``mean|x_i - y| - sum|x_i - x_j| / (2 m^2)``; the fair CRPS divides the
    spread by ``2 m (m - 1)``: fair = nonfair - spread (1 / (2 m (m-1)) - 1 / (2 m^2))."""
    m = ens.shape[-1]
    spread = np.abs(ens[..., :, None] - ens[..., None, :]).sum((-1, -2))
    return nonfair - spread * (1 / (2 * m * (m - 1)) - 1 / (2 * m**2))


@pytest.mark.parametrize("members", [2, 3, 8, 17])
def test_matches_properscoring(members):
    rng = np.random.default_rng(members)
    ens = rng.normal(size=(6, 5, members)) * rng.uniform(0.2, 3, size=(6, 5, 1))
    obs = rng.normal(size=(6, 5))
    ref = nonfair_to_fair(properscoring.crps_ensemble(obs, ens), ens)
    for method in ("pwm", "pairwise"):
        got = crps_fair(torch.from_numpy(ens), torch.from_numpy(obs), member_dim=-1, reduction="none", method=method)
        np.testing.assert_allclose(got.numpy(), ref, atol=1e-10)
    # members on axis 1 (the forecast layout [B, members, ...]) give the same per-element scores
    moved = torch.from_numpy(np.moveaxis(ens, -1, 1))
    np.testing.assert_allclose(crps_fair(moved, torch.from_numpy(obs), reduction="none").numpy(), ref, atol=1e-10)
    assert crps_fair(moved, torch.from_numpy(obs)).item() == pytest.approx(ref.mean(), abs=1e-10)


def test_fair_crps_is_unbiased_for_the_gaussian_crps():
    # CRPS of N(0, 1) at y = 0 is (sqrt(2) - 1) / sqrt(pi); the fair score of small ensembles is unbiased for it
    g = torch.Generator().manual_seed(0)
    ens = torch.randn(200000, 4, generator=g, dtype=torch.float64)
    got = crps_fair(ens, torch.zeros(200000, dtype=torch.float64)).item()
    assert got == pytest.approx((2**0.5 - 1) / np.pi**0.5, abs=3e-3)
    assert properscoring.crps_gaussian(0.0, 0.0, 1.0) == pytest.approx((2**0.5 - 1) / np.pi**0.5)


def test_ensemble_mse_and_member_rmse():
    ens = torch.tensor([[[1.0, 2.0], [3.0, 6.0]]])  # [B=1, members=2, 2]
    obs = torch.tensor([[1.0, 1.0]])
    assert ensemble_mse(ens, obs).item() == pytest.approx(((2 - 1) ** 2 + (4 - 1) ** 2) / 2)
    assert member_rmse(ens, obs).item() == pytest.approx(((0 + 1 + 4 + 25) / 4) ** 0.5)
    assert ensemble_mse(ens[:, :1], obs).item() == pytest.approx((0 + 1) / 2)  # one member is a point forecast


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least 2 members"):
        crps_fair(torch.randn(3, 1, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="obs must have"):
        crps_fair(torch.randn(3, 4, 5), torch.randn(3, 4))
    with pytest.raises(ValueError, match="member_dim"):
        crps_fair(torch.randn(3, 4), torch.randn(3), member_dim=2)
    with pytest.raises(ValueError, match="method"):
        crps_fair(torch.randn(3, 4), torch.randn(3), member_dim=1, method="sorted")
    with pytest.raises(ValueError, match="reduction"):
        ensemble_mse(torch.randn(3, 4), torch.randn(3), reduction="sum")
