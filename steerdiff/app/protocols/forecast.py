"""The forecasting protocol of Dynamical Diffusion's CPU validation (Guo et al., ICLR 2025; docs/methods/dydiff.md
"The validation protocol"): ensemble forecasts of the fixed advection test set, scored on the
future frames only by the MSE of the ensemble mean and the fair CRPS, beside persistence and the exact oracle.
"""

from __future__ import annotations

import time

from torch import Tensor

from ...core.registry import SAMPLERS
from ...data import advection
from ...metrics.forecast import crps_fair, ensemble_mse
from ...temporal.dydiff import DyDiffDenoiser, forecast


def dims_of(model: DyDiffDenoiser) -> int:
    """1 or 2: the advection field a forecaster was built for (from its frame shape)."""
    if model.sample_shape is None or len(model.sample_shape) not in (2, 3):
        raise ValueError("model: not a forecaster of a 1-D or 2-D field")
    return len(model.sample_shape) - 1


def baselines(test: Tensor, dims: int = 1) -> dict:
    """Persistence and oracle-mean MSE on ``test`` (future frames only), and the oracle's exact expected MSE."""
    spec = advection.spec_for(dims)
    ctx, fut = test[:, : spec.n_context], test[:, spec.n_context :]
    return {
        "persistence_mse": float(((advection.persistence(ctx, spec=spec) - fut) ** 2).mean()),
        "oracle_mse": float(((advection.oracle_mean(ctx, spec=spec) - fut) ** 2).mean()),
        "oracle_mse_expected": float(advection.oracle_mse(spec=spec).mean()),
    }


def evaluate_forecaster(model: DyDiffDenoiser, test: Tensor | None = None, *, members: int = 8, steps: int = 12,
                        seed: int = 0, method: str = "heun") -> dict:
    """Forecast ``test`` (default: the fixed 128-sequence test set) and score it.

    Returns:
        ``{"mse", "crps", "mse_per_lead", "crps_per_lead", "persistence_mse", "oracle_mse", "oracle_mse_expected",
        "nfe_per_member", "seconds", "members", "steps", "n"}``.
    """
    dims = dims_of(model)
    test = advection.test_set(dims) if test is None else test
    n_ctx = model.n_context
    start = time.perf_counter()
    ens = forecast(model, test[:, :n_ctx], members=members, steps=steps, seed=seed, method=method)
    seconds = time.perf_counter() - start
    fut = test[:, n_ctx:]
    mse = ensemble_mse(ens, fut, member_dim=1, reduction="none").flatten(2).mean((0, 2))
    out = {"mse": float(mse.mean()), "mse_per_lead": [round(float(v), 5) for v in mse]}
    if members >= 2:
        crps = crps_fair(ens, fut, member_dim=1, reduction="none").flatten(2).mean((0, 2))
        out.update(crps=float(crps.mean()), crps_per_lead=[round(float(v), 5) for v in crps])
    nfe = SAMPLERS.get(method).nfe(steps)
    out.update(baselines(test, dims), nfe_per_member=nfe, seconds=round(seconds, 2), members=members, steps=steps,
               n=int(test.shape[0]))
    return out


__all__ = ["baselines", "dims_of", "evaluate_forecaster"]
