"""A tried fix for HR's spread that was not kept: noise tied to the step by a Gibbs step that weighs the data by
``sigma_y`` (docs/methods/inverse.md, "Multimodal posteriors").

Per level ``sigma`` (HR's levels, 1 NFE each, no Adam): ``x_s = mu + sigma eps``, ``d = D(x_s, sigma)``, then ``mu``
is drawn from ``N(x0; d, r^2 I) N(y; A x0, sigma_y^2 I)`` (Matheron's rule, conjugate gradients), ``r^2 = sigma^2 c /
(sigma^2 + c)``, ``c`` the prior's per-entry variance (``hybrid.data_scale``). For a Gaussian prior and fresh noise
``eps`` the pair (``mu``, ``x_s``) is then a Gibbs sampler of the posterior at every level (the noise is tied to
the step: nothing is left to an optimiser's step size). ``eps`` is fresh (``beta = 1``, DR's noise) or HR's mix
``sqrt(1 - beta) eps_hat_prev + sqrt(beta) z`` (``beta = 0.2``), which re-uses noise the state depends on and so
breaks the Gibbs argument. 400 chains per problem, one seed; spread ratio, posterior-mean error and sliced W2 against
the exact posterior, means over each set's problems; HR at its defaults beside it at equal NFE.

    OMP_NUM_THREADS=1 python benchmarks/inverse_hr_gibbs_probe.py      # ~80 CPU s

Writes ``benchmarks/results/inverse/hr_gibbs_probe.md``.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from steerdiff.app.protocols import inverse as V
from steerdiff.core.sigmas import vp_linear_levels
from steerdiff.inverse import solve
from steerdiff.inverse.hybrid import data_scale
from steerdiff.inverse.linear import cg
from steerdiff.inverse.metrics import posterior_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_text  # noqa: E402

CHAINS = 400


def gibbs(p: V.Problem, steps: int, beta: float, seed: int) -> torch.Tensor:
    """The chains after the last level (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    op = p.operator.bind((p.prior.dim,))
    y = p.y.repeat(p.chains, 1)
    c = data_scale(p.prior) ** 2
    mu = op.pinv(y)
    eps_prev = None
    for s in [float(v) for v in vp_linear_levels(steps)]:
        z = torch.randn(mu.shape, generator=g, dtype=mu.dtype)
        eps = z if eps_prev is None or beta == 1 else math.sqrt(1 - beta) * eps_prev + math.sqrt(beta) * z
        xs = mu + s * eps
        d = p.prior(xs, torch.full((p.chains,), s, dtype=mu.dtype))
        eps_prev = (xs - d) / s
        r2 = s**2 * c / (s**2 + c)
        xt = d + math.sqrt(r2) * torch.randn(mu.shape, generator=g, dtype=mu.dtype)
        yt = y - p.noise_std * torch.randn(y.shape, generator=g, dtype=y.dtype)
        mu = xt + r2 * op.adjoint(cg(lambda v, r2=r2: r2 * op.forward(op.adjoint(v)) + p.noise_std**2 * v,
                                     yt - op.forward(xt)))
    return mu


def main() -> None:
    t0 = time.process_time()
    sets = {"ring": [V.ring_problem(CHAINS)], "G2": [V.g2_problem(s, chains=CHAINS) for s in range(3)],
            "G1": V.g1_problems(CHAINS)[:3], "gauss": [V.gauss_problem(CHAINS)],
            "3-mode": [V.three_mode_problem(CHAINS)], "3-mode aligned": [V.three_mode_problem(CHAINS, offset=0.0)]}
    rows = []
    for name, probs in sets.items():
        for steps in (100, 400):
            for label, run in (("hr (defaults)", None), ("gibbs, fresh noise", 1.0), ("gibbs, HR's noise", 0.2)):
                ms = []
                for j, p in enumerate(probs):
                    if run is None:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            x = solve(p.prior, p.operator, p.y, "hr", noise_std=p.noise_std, chains=p.chains,
                                      steps=steps, generator=j).samples[0]
                    else:
                        x = gibbs(p, steps, run, j)
                    ms.append(posterior_metrics(x, p.posterior, seed=j))
                rows.append([name, steps, label, *(f"{np.mean([m[k] for m in ms]):.3f}"
                                                   for k in ("diversity", "mean_err", "sw2", "tv"))])
    out = (f"# A Gibbs step with the noise tied to the step: tried for HR, not kept\n\n{provenance_line(provenance())}"
           "\n\nCommand: `OMP_NUM_THREADS=1 python benchmarks/inverse_hr_gibbs_probe.py`. 400 chains, seed = problem "
           "index; means over each set's problems.\n\n"
           + markdown_table(["set", "levels", "run", "spread", "mean err", "SW2", "TV"], rows, "lrlrrrr")
           + f"\n\nCPU {time.process_time() - t0:.0f} s.\n")
    write_text(results_dir("inverse") / "hr_gibbs_probe.md", out)


if __name__ == "__main__":
    main()
