"""The inverse-problem checks of docs/methods/inverse.md (G1, G2, chi-square, digits): problems, runs, pass rules,
shared by ``tests/inverse`` and ``benchmarks/inverse.py``.

* G1, bimodal 2-D: ``pi = (0.4, 0.1, 0.3, 0.2)``, means ``(+-2, +-2)``, ``C_k = 0.3 I``, ``A = [1, 0]``,
  ``sigma_y = 0.2``, six values of ``y``, 1000 chains each.
* G2, random 8-D: per seed, ``K = 4``, ``pi ~ Dir(3)``, ``m_k ~ N(0, 4 I)``, ``C_k = Q diag(U(0.05, 0.5)) Q^T``,
  ``A ~ N(0, 1/d)^{2 x 8}``, ``sigma_y = 0.1``, ``y = A x* + sigma_y n`` with ``x* ~ prior``, 400 chains.

Every run uses 100 levels of ``vp_linear_levels``, ``lam = 0.25``, ``v = 1``, float64; DPS is tuned over a grid.

* The ring (the multimodal case of docs/methods/inverse.md, "Multimodal posteriors"): ``gmm2d`` through
  ``A = [1, 1]`` at ``y = 0`` (two posterior modes 3 from the pseudo-inverse start), 400 chains, the API's defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ...inverse.metrics import posterior_metrics
from ...inverse.operators import Matrix
from ...inverse.reference import exact_posterior
from ...inverse.solve import solve
from ...models.gmm import GaussianMixture

G1_YS = (1.9, 2.3, 1.5, -1.8, -2.2, 0.0)
DPS_GRID = (0.2, 0.6, 2.0)
METRICS = ("mean_err", "tv", "diversity", "sw2")


@dataclass
class Problem:
    """One linear-Gaussian measurement of a mixture prior, with its exact posterior."""

    name: str
    prior: GaussianMixture
    operator: Matrix
    y: torch.Tensor  # [1, m] float64
    noise_std: float
    chains: int

    @property
    def posterior(self) -> GaussianMixture:
        return exact_posterior(self.prior, self.operator, self.y, self.noise_std)[0]


def g1_problems(chains: int = 1000) -> list[Problem]:
    prior = GaussianMixture([0.4, 0.1, 0.3, 0.2], [[2, 2], [2, -2], [-2, 2], [-2, -2]], 0.3)
    op = Matrix(torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    return [Problem(f"G1 y={y:g}", prior, op, torch.tensor([[y]], dtype=torch.float64), 0.2, chains) for y in G1_YS]


def ring_problem(chains: int = 400, noise_std: float = 0.1) -> Problem:
    """``builtin_mixture("gmm2d")`` (8 modes on a ring of radius 3) measured by ``A = [1, 1]`` at ``y = 0``: the
    exact posterior has two modes (weights 0.625 / 0.375) at distance 3 from the pseudo-inverse start ``0``; the
    solvers never read ``noise_std`` and the posterior barely depends on it (its std along the line is 2.91 for
    ``noise_std`` in 0.05-0.5)."""
    from ...models.gmm import builtin_mixture

    return Problem("ring y=0", builtin_mixture("gmm2d"), Matrix(torch.tensor([[1.0, 1.0]], dtype=torch.float64)),
                   torch.zeros(1, 1, dtype=torch.float64), noise_std, chains)


def ring_stats(x: torch.Tensor) -> dict:
    """Mean ``|x|`` and the std of ``x`` along the line ``x_1 + x_2 = 0`` (the issue's two numbers) of ``[N, 2]``."""
    u = torch.tensor([1.0, -1.0], dtype=torch.float64) / math.sqrt(2)
    x = x.double().reshape(-1, 2)
    return {"abs_x": float(x.norm(dim=1).mean()), "std_line": float((x @ u).std())}


def gauss_problem(chains: int = 800) -> Problem:
    """One posterior mode: a 4-D Gaussian prior (covariance eigenvalues 0.3, 0.6, 1.2, 2 in a random basis, mean
    ``N(0, I)``), ``A`` 2x4 with ``N(0, 1/4)`` entries, ``sigma_y = 0.1``, ``x*`` drawn from the prior (seeded)."""
    rng = np.random.default_rng(0)
    q = np.linalg.qr(rng.normal(size=(4, 4)))[0]
    prior = GaussianMixture([1.0], rng.normal(0, 1, (1, 4)), (q @ np.diag([0.3, 0.6, 1.2, 2.0]) @ q.T)[None])
    A = torch.from_numpy(rng.normal(0, 0.5, (2, 4)))
    x = prior.sample(1, generator=torch.Generator().manual_seed(1))
    y = x @ A.T + 0.1 * torch.from_numpy(rng.normal(size=(1, 2)))
    return Problem("gauss 4-D", prior, Matrix(A), y, 0.1, chains)


def three_mode_problem(chains: int = 400, noise_std: float = 0.5, y: float = 0.0, offset: float = 1.0) -> Problem:
    """Three modes apart along the unobserved axis: components ``N((-1, -3), 0.09 I)``, ``N((0, 0), 0.09 I)``,
    ``N((1, 3), 0.09 I)`` (equal weights) measured through ``A = [1, 0]`` at ``y`` (default 0) with ``sigma_y =
    0.5``. At ``y = 0`` the observed coordinates of the outer modes differ from ``y`` by 2 sigma_y, so the posterior's
    mode weights (about 0.16 / 0.68 / 0.16) and its spread along ``x_2`` are set by the measurement noise: a solver
    that weighs the data by a fixed factor instead of ``sigma_y`` (DR/CR/HR) cannot reach them
    (docs/methods/inverse.md, "Multimodal posteriors"). The problem is symmetric under ``x -> -x`` at ``y = 0`` (the
    posterior mean is 0 and the middle mode's centre); ``y = 0.5`` breaks that (two modes of about equal weight).
    ``offset``: the outer modes' observed coordinate (``(-offset, -3)``, ``(offset, 3)``); at 0 the modes are apart
    along the unobserved axis only, and the noise no longer sets their weights (1/3 each at ``y = 0``)."""
    o = float(offset)
    prior = GaussianMixture([1 / 3] * 3, [[-o, -3.0], [0.0, 0.0], [o, 3.0]], 0.09)
    name = f"three modes y={y:g}" + ("" if o == 1.0 else f" offset={o:g}")
    return Problem(name, prior, Matrix(torch.tensor([[1.0, 0.0]], dtype=torch.float64)),
                   torch.full((1, 1), float(y), dtype=torch.float64), noise_std, chains)


THREE_MODE_CONFIGS = {"hr": ("hr", {}), "hr beta=0.5": ("hr", {"beta": 0.5}), "hr v=0.1": ("hr", {"v": 0.1}),
                      "hr init=prior": ("hr", {"init": "prior"}), "dr": ("dr", {}), "mcgdiff": ("mcgdiff", {})}


def three_mode_table(steps: tuple[int, ...] = (100, 400, 1000), chains: int = 400, seed: int = 0,
                     noise_stds: tuple[float, ...] = (0.5, 0.05)) -> dict:
    """:func:`three_mode_problem` at each ``noise_std`` and level count: the posterior metrics of each config of
    :data:`THREE_MODE_CONFIGS` and the std of ``x_1`` (the observed coordinate: about ``sigma_y`` for the exact
    posterior, since the prior is wide there), beside the exact posterior's. ``init="prior"`` starts HR from prior
    samples (the prior's own draws, so it is an oracle start across the modes)."""
    import warnings

    out = {}
    for sy in noise_stds:
        p = three_mode_problem(chains, noise_std=sy)
        post = p.posterior
        exact = post.sample(chains, generator=torch.Generator().manual_seed(seed))
        x1_std = float(exact[:, 0].std())
        out[f"sigma_y={sy:g} exact"] = posterior_metrics(exact, post, seed=seed + 1) | {"x1_std": x1_std}
        for n in steps:
            for label, (method, options) in THREE_MODE_CONFIGS.items():
                if options.get("init") == "prior":
                    options = options | {"init": p.prior.sample(chains, generator=torch.Generator().manual_seed(9))}
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    res = solve(p.prior, p.operator, p.y, method, noise_std=sy, chains=chains, steps=n, generator=seed,
                                **options)
                x = res.samples[0]
                out[f"sigma_y={sy:g} {label} steps={n}"] = (posterior_metrics(x, post, seed=seed)
                                                           | {"x1_std": float(x[:, 0].std()), "warned": len(caught)})
    return out


RING_CONFIGS = {"dps s=0.5": ("dps", {"scale": 0.5}), "dr": ("dr", {}), "cr": ("cr", {}), "hr": ("hr", {})}


def ring_table(steps: tuple[int, ...] = (50, 200), chains: int = 400, seed: int = 0,
               configs: dict[str, tuple[str, dict]] | None = None) -> dict:
    """The ring at each level count: ``ring_stats`` and the posterior metrics of every method (API defaults unless
    ``configs`` says otherwise), the share of chains the lag check flags, and the exact posterior's own numbers
    (``chains`` exact samples)."""
    import warnings

    problem = ring_problem(chains)
    post = problem.posterior
    exact = post.sample(chains, generator=torch.Generator().manual_seed(seed))
    out = {"exact": ring_stats(exact) | posterior_metrics(exact, post, seed=seed + 1)}
    for n in steps:
        for label, (method, options) in (configs or RING_CONFIGS).items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                res = solve(problem.prior, problem.operator, problem.y, method, noise_std=problem.noise_std,
                            chains=chains, steps=n, generator=seed, **options)
            lag = res.extras.get("lag")
            out[f"{label} steps={n}"] = (ring_stats(res.samples[0]) | posterior_metrics(res.samples[0], post, seed=seed)
                                         | {"lr": res.options.get("lr"),
                                            "flagged": None if lag is None else float((lag > 3).double().mean()),
                                            "warned": any("chains end where" in str(w.message) for w in caught)})
    return out


def g2_problem(seed: int, chains: int = 400, d: int = 8, k: int = 4, m: int = 2, x_star: str = "prior", *,
               mean_std: float = 2.0, a_std: float | None = None, cov_squared: bool = False,
               noise_std: float = 0.1) -> Problem:
    """G2 for one seed; the defaults are the problem as described (docs/methods/inverse.md, "Exact-posterior checks").

    The other arguments are readings of that text used only as diagnostics (``benchmarks/inverse.py --only
    g2-readings``), because G2's first calibration numbers do not follow from its description: ``x_star="wide"`` draws
    ``x* ~ N(0, 4 I)`` instead of the prior; ``mean_std`` is the std of ``m_k`` (the text's ``N(0, 4 I)``: 2);
    ``a_std`` the std of ``A``'s entries (the text's ``N(0, 1/d)``: ``d**-0.5``); ``cov_squared`` draws the
    eigenvalues of ``C_k`` as squares of ``U(0.05, 0.5)`` (stds rather than variances); ``noise_std`` is ``sigma_y``.
    """
    if x_star not in ("prior", "wide"):
        raise ValueError(f"x_star must be 'prior' or 'wide', got {x_star!r}")
    for name, value in (("mean_std", mean_std), ("a_std", a_std), ("noise_std", noise_std)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(3 * np.ones(k))
    means = rng.normal(0, mean_std, (k, d))
    q = np.linalg.qr(rng.normal(size=(k, d, d)))[0]
    eig = rng.uniform(0.05, 0.5, (k, d))
    covs = q @ ((eig**2 if cov_squared else eig)[..., None] * np.swapaxes(q, -1, -2))
    prior = GaussianMixture(weights, means, covs)
    A = torch.from_numpy(rng.normal(0, d**-0.5 if a_std is None else a_std, (m, d)))
    if x_star == "prior":
        x = prior.sample(1, generator=torch.Generator().manual_seed(seed))
    else:
        x = 2.0 * torch.randn(1, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    y = x @ A.T + noise_std * torch.from_numpy(rng.normal(size=(1, m)))
    return Problem(f"G2 seed={seed}" + ("" if x_star == "prior" else f" x*={x_star}"), prior, Matrix(A), y,
                   noise_std, chains)


# Readings of G2's description tried against its first (since retired) calibration band (DR 0.96-1.08 / 0.39-0.45,
# HR 0.50-0.69 / 0.19-0.27, DPS s=2 0.21-0.23 / 0.04-0.06, mean-err / TV; docs/methods/inverse.md, "Findings and
# amendments"): name -> g2_problem keyword overrides.
G2_READINGS: dict[str, dict] = {
    "text": {},
    "x* ~ N(0, 4I)": {"x_star": "wide"},
    "m_k std 4": {"mean_std": 4.0},
    "m_k std 1": {"mean_std": 1.0},
    "A std 1/d": {"a_std": 1 / 8},
    "C_k eigenvalues U(0.05, 0.5)^2": {"cov_squared": True},
    "one measurement row (m = 1)": {"m": 1},
    "d = 16": {"d": 16},
    "sigma_y 0.3": {"noise_std": 0.3},
}
G2_CALIBRATION = {"dr": ((0.96, 1.08), (0.39, 0.45)), "hr": ((0.50, 0.69), (0.19, 0.27)),
                  "dps s=2": ((0.21, 0.23), (0.04, 0.06))}


def run(problem: Problem, method: str, seed: int = 0, **options) -> dict:
    """The G1 / G2 metrics of one method on one problem (plus wall time, NFE and VJPs per chain)."""
    res = solve(problem.prior, problem.operator, problem.y, method, noise_std=problem.noise_std,
                chains=problem.chains, generator=seed, **options)
    out = posterior_metrics(res.samples[0], problem.posterior, seed=seed)
    return out | {"wall_time_s": res.wall_time, "nfe": res.nfe, "nfe_vjp": res.nfe_vjp}


def run_suite(problems: list[Problem], configs: dict[str, tuple[str, dict]]) -> dict[str, dict]:
    """``{label: {"per_problem": [...], "mean": {metric: mean over problems}}}`` for ``{label: (method, options)}``.
    Problem ``j`` uses seed ``1000 j`` for every method (common random numbers)."""
    table = {}
    for label, (method, options) in configs.items():
        rows = [run(p, method, seed=1000 * j, **options) for j, p in enumerate(problems)]
        mean = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
        mean["diversity_median"] = float(np.median([r["diversity"] for r in rows]))
        table[label] = {"method": method, "options": options, "per_problem": rows, "mean": mean}
    return table


def best_dps(table: dict[str, dict]) -> dict[str, float]:
    """Per metric, the best (lowest) mean over the tuned DPS runs (the strictest comparison for HR)."""
    runs = [v["mean"] for v in table.values() if v["method"] == "dps"]
    return {key: min(r[key] for r in runs) for key in ("mean_err", "tv", "sw2")}


def g1_configs(lr: float = 0.25) -> dict[str, tuple[str, dict]]:
    cfg = {f"{m} lr={lr:g}": (m, {"lr": lr}) for m in ("dr", "hr", "cr")}
    return cfg | {f"dps s={s:g}": ("dps", {"scale": s}) for s in DPS_GRID}


def g1_criteria(table: dict[str, dict], lr: float = 0.25) -> dict[str, tuple[float, float, bool]]:
    """G1 pass rules: ``{rule: (value, bound, passed)}``."""
    dr, hr, dps = table[f"dr lr={lr:g}"]["mean"], table[f"hr lr={lr:g}"]["mean"], best_dps(table)
    le = {  # value <= bound
        "HR mean_err <= 0.5 DR": (hr["mean_err"], 0.5 * dr["mean_err"]),
        "HR mean_err <= 0.2": (hr["mean_err"], 0.2),
        "HR tv <= 0.5 DR": (hr["tv"], 0.5 * dr["tv"]),
        "HR tv <= 0.12": (hr["tv"], 0.12),
        "HR diversity <= 2.0": (hr["diversity"], 2.0),
        "DR diversity < 0.5 (collapse)": (dr["diversity"], 0.5),
        "HR mean_err <= 1.1 DPS-best": (hr["mean_err"], 1.1 * dps["mean_err"]),
        "HR sw2 <= 1.1 DPS-best": (hr["sw2"], 1.1 * dps["sw2"]),
    }
    out = {k: (v, b, v <= b) for k, (v, b) in le.items()}
    out["HR diversity >= 0.5"] = (hr["diversity"], 0.5, hr["diversity"] >= 0.5)
    return out


def g2_configs() -> dict[str, tuple[str, dict]]:
    return {"dr": ("dr", {"lr": 0.25}), "hr": ("hr", {"lr": 0.25}), "dps s=2": ("dps", {"scale": 2.0})}


def g2_criteria(table: dict[str, dict]) -> dict[str, tuple[float, float, bool]]:
    """G2 pass rules (DPS reported, no rule)."""
    dr, hr = table["dr"]["mean"], table["hr"]["mean"]
    rules = {"HR mean_err <= 0.75 DR": (hr["mean_err"], 0.75 * dr["mean_err"]),
             "HR tv <= 0.75 DR": (hr["tv"], 0.75 * dr["tv"])}
    return {k: (v, b, v <= b) for k, (v, b) in rules.items()}


def chi2_problem(n_measurements: int = 100, m: int = 4, seed: int = 0) -> tuple[Problem, torch.Tensor]:
    """Measurements consistent with the prior: the G2 mixture of ``seed`` with ``m`` random rows, ``x* ~ prior``,
    ``y = A x* + 0.1 n`` for ``n_measurements`` draws. Returns the problem (``y`` of all rows) and ``x*``."""
    base = g2_problem(seed, m=m)
    x_star = base.prior.sample(n_measurements, generator=torch.Generator().manual_seed(seed + 1))
    rng = np.random.default_rng(seed + 2)
    y = x_star @ base.operator.A.T + base.noise_std * torch.from_numpy(rng.normal(size=(n_measurements, m)))
    return Problem(f"chi2 seed={seed}", base.prior, base.operator, y, base.noise_std, 1), x_star


def expected_chi2(problem: Problem) -> float:
    """The exact posterior's own chi-square in closed form: the mean over the measurements of
    ``E[||y - A x||^2 | y] / (m sigma_y^2)`` with ``E||y - A x||^2 = sum_k w_k (||y - A mu_k||^2 + tr(A S_k A^T))`` for
    the posterior mixture ``sum_k w_k N(mu_k, S_k)`` (1 on average over ``y`` drawn from the model)."""
    A = problem.operator.matrix(torch.float64)
    total = 0.0
    for row, post in zip(problem.y.double(), exact_posterior(problem.prior, problem.operator, problem.y,
                                                            problem.noise_std), strict=True):
        resid = (row[None] - post.means @ A.T).square().sum(-1)
        spread = torch.einsum("ij,kjl,il->k", A, post.covs, A)
        total += float(post.weights @ (resid + spread))
    return total / (problem.y.shape[0] * problem.operator.m * problem.noise_std**2)


def samples_chi2(problem: Problem, samples: torch.Tensor) -> float:
    """Mean ``||y - A x||^2 / (m sigma_y^2)`` of ``samples`` ``[M, K, d]`` (row ``i`` measured by ``y[i]``), over
    the finite ones."""
    A = problem.operator.matrix(torch.float64)
    r = (problem.y.double()[:, None] - samples.double() @ A.T).square().sum(-1)
    return float(r.nanmean() / (problem.operator.m * problem.noise_std**2))


def exact_chi2(problem: Problem, chains: int, seed: int = 0) -> float:
    """Mean ``||y - A x||^2 / (m sigma_y^2)`` over exact posterior samples (1 in expectation over ``y``)."""
    posts = exact_posterior(problem.prior, problem.operator, problem.y, problem.noise_std)
    g = torch.Generator().manual_seed(seed)
    return samples_chi2(problem, torch.stack([p.sample(chains, generator=g) for p in posts]))


def method_chi2(problem: Problem, method: str, chains: int, seed: int = 0, **options) -> float:
    """Mean chi-square per degree of freedom of ``method``'s samples (finite chains)."""
    res = solve(problem.prior, problem.operator, problem.y, method, noise_std=problem.noise_std, chains=chains,
                generator=seed, **options)
    return samples_chi2(problem, res.samples.flatten(2))


def chi2_report(problem: Problem, configs: dict[str, tuple[str, dict]], chains: int = 4, seed: int = 0) -> dict:
    """The chi-square report (a report, not a gate: DR, CR and HR never read ``sigma_y``, and DPS only through its
    step; docs/methods/inverse.md, "Findings and amendments"): ``{"exact": the posterior's own value in closed form,
    "exact samples": the same from exact posterior samples, label: each method's, ...}``, and each method's ratio to
    the exact value under ``"ratio"``."""
    out = {"exact": expected_chi2(problem), "exact samples": exact_chi2(problem, chains, seed)}
    for label, (method, options) in configs.items():
        out[label] = method_chi2(problem, method, chains, seed, **options)
    out["ratio"] = {label: out[label] / out["exact"] for label in configs}
    return out


CHI2_BAND = (0.75, 1.33)  # exact samples: mean chi2/dof over 100 y of m = 4 has sd ~0.07 around 1
CHI2_CONFIGS = {"dps s=0.2": ("dps", {"scale": 0.2}), "dr": ("dr", {}), "cr": ("cr", {}), "hr": ("hr", {})}


# --- the digits protocol: 8x8 digits ---------------------------------------------------------------------------------
DIGITS_TASKS = ("inpaint-center", "sr2")
DIGITS_NOISE_STD = 0.05
# The protocol's DR/CR/HR settings, given explicitly (the API's default lr follows the prior's scale: 0.109 for the
# surrogate, 0.15 for digits_mlp's sigma_data 0.753).
DIGITS_VARIATIONAL = {"lam": 0.25, "v": 1.0, "lr": 0.1}
DIGITS_DPS_GRID = (0.3, 0.6, 1.0, 2.0)
DIGITS_SSIM_MIN = {"inpaint-center": 0.55, "sr2": 0.60}


def digits_prior(kind: str):
    """The digits priors: ``"mlp"``: (a), the shipped tiny MLP EDM denoiser ``digits_mlp`` (float32);
    ``"gmm"``: (b), the analytic surrogate (float64); ``"unet"``: the shipped class-conditional EDM UNet with the
    null label (a stronger prior than (a) and (b), float32); ``"model:<name or directory>"``: any other saved
    unconditional digits denoiser (e.g. a retrained prior (a): ``steerdiff train digits_mlp --set steps=2000``)."""
    if kind.startswith("model:") and kind[len("model:"):]:
        from ...models.io import load

        return load(kind[len("model:"):]).eval().requires_grad_(False)
    if kind == "gmm":
        from ...inverse.reference import digits_surrogate

        return digits_surrogate()
    if kind in ("unet", "mlp"):
        from ...models.io import load

        return load("digits" if kind == "unet" else "digits_mlp").eval().requires_grad_(False)
    raise ValueError(f"prior must be 'mlp', 'gmm', 'unet' or 'model:<name or directory>', got {kind!r}")


def digits_problem(task: str, n: int, offset: int = 0, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Operator, clean test images ``[n, 1, 8, 8]`` (from ``offset``) and their measurements (sigma_y = 0.05)."""
    from ...data.digits import load_digits
    from ...inverse.noise import measure
    from ...inverse.tasks import task_operator

    x = load_digits("test")[0][offset:offset + n].to(dtype)
    if x.shape[0] < n:
        raise ValueError(f"the test split has {x.shape[0] + offset} images; asked for {offset}..{offset + n}")
    op = task_operator(task, (1, 8, 8))
    return op, x, measure(op, x, DIGITS_NOISE_STD, generator=seed + 10_000 * offset)


def image_scores(samples: torch.Tensor, x: torch.Tensor) -> dict:
    """Mean per-chain PSNR and SSIM against the clean images, and the chain diversity."""
    from ...inverse.metrics import chain_diversity, psnr, ssim

    ok = torch.isfinite(samples).flatten(2).all(2)
    flat, ref = samples[ok], x[:, None].expand_as(samples)[ok]
    return {"psnr": float(psnr(flat, ref).mean()), "ssim": float(ssim(flat, ref).mean()),
            "diversity": float(chain_diversity(samples).mean()), "nonfinite": int((~ok).sum())}


def digits_run(prior, op, x, y, method: str, chains: int = 8, seed: int = 0, **options) -> dict:
    """One solver on digits measurements with the protocol's settings (:data:`DIGITS_VARIATIONAL` for DR/CR/HR):
    PSNR, SSIM, diversity, cost."""
    if method != "dps":
        options = {**DIGITS_VARIATIONAL, **options}
    res = solve(prior, op, y.to(x.dtype), method, noise_std=DIGITS_NOISE_STD, chains=chains, generator=seed,
                **options)
    return image_scores(res.samples, x) | {"wall_time_s": res.wall_time, "nfe": res.nfe, "nfe_vjp": res.nfe_vjp,
                                           "levels": len(res.sigmas)}


def predicted_noise_rms(prior, op, y, method: str = "hr", chains: int = 2, seed: int = 0, **options) -> dict:
    """RMS of the predicted noise ``eps_hat = (x - D(x, s)) / s`` at every level of one solve.

    CR and HR build the next level's input from this ``eps_hat`` (Dou et al.'s noise re-use), so it must stay near
    1; a value that grows from level to level means the chain feeds on the denoiser's errors off the data manifold.
    """
    trace: list[tuple[float, float]] = []

    def traced(x, sigma, cond=None):
        out = prior(x, sigma, cond)
        s = sigma.reshape(-1, *([1] * (x.ndim - 1)))
        trace.append((float(sigma.flatten()[0]), float(((x - out) / s).pow(2).mean().sqrt())))
        return out

    res = solve(traced, op, y, method, noise_std=DIGITS_NOISE_STD, chains=chains, generator=seed, **options)
    trace = trace[: len(res.sigmas)]  # the levels; DR/CR/HR's noise-share check calls the denoiser after the loop
    rms = [r for _, r in trace]
    worst = max(range(len(rms)), key=rms.__getitem__)
    return {"sigma": [s for s, _ in trace], "rms": rms, "max": rms[worst], "sigma_at_max": trace[worst][0],
            "final": rms[-1]}


def noise_feedback_gain(denoiser, x0: torch.Tensor, sigma: float, beta: float = 0.2, seed: int = 0,
                        cond: torch.Tensor | None = None) -> dict:
    """How strongly HR's noise recursion amplifies itself at level ``sigma`` around the images ``x0``.

    HR feeds ``eps' = sqrt(1 - beta) eps_hat(mu + sigma eps) + sqrt(beta) z`` (its hybrid noise), and
    ``d eps_hat / d eps = I - dD/dx``. For an exact denoiser ``dD/dx = Cov[x0 | x] / sigma^2`` is symmetric positive
    semi-definite, so on the data manifold the map does not expand; a network whose Jacobian has negative
    eigenvalues gives ``||I - dD/dx||_2 > 1``, and once ``sqrt(1 - beta) ||I - dD/dx||_2 > 1`` the chain's noise
    grows from level to level.

    Evaluated at ``x = x0 + sigma n`` (one draw per image), with the full Jacobian (small images only: its cost is
    one backward pass per pixel). Returns per-image ``min_eig`` (the smallest eigenvalue of the symmetric part of
    ``dD/dx``), ``gain`` (``||I - dD/dx||_2``), and ``loop_gain = sqrt(1 - beta) * gain``.
    """
    params = list(denoiser.parameters()) if isinstance(denoiser, torch.nn.Module) else []
    dtype = params[0].dtype if params else torch.float64  # evaluate in the denoiser's own precision
    g = torch.Generator().manual_seed(seed)
    x0 = x0.to(dtype)
    eye = torch.eye(x0[0].numel(), dtype=torch.float64)
    min_eig, gain = [], []
    for i in range(x0.shape[0]):
        x = x0[i:i + 1] + sigma * torch.randn(x0[i:i + 1].shape, generator=g, dtype=dtype)
        s = torch.full((1,), sigma, dtype=dtype)
        c = None if cond is None else cond[i:i + 1]

        def flat(v, s=s, c=c, shape=x.shape):
            return denoiser(v.reshape(shape), s, c).reshape(-1)

        jac = torch.autograd.functional.jacobian(flat, x.reshape(-1)).to(torch.float64)
        min_eig.append(float(torch.linalg.eigvalsh(0.5 * (jac + jac.T)).min()))
        gain.append(float(torch.linalg.matrix_norm(eye - jac, 2)))
    return {"sigma": sigma, "min_eig": min_eig, "gain": gain,
            "loop_gain": [math.sqrt(1 - beta) * v for v in gain]}


def digits_references(prior, op, x, y, chains: int = 8, seed: int = 0) -> dict[str, dict]:
    """The measurement-only baseline (``pinv``: zero fill / nearest), and for a mixture prior its exact posterior
    mean and exact posterior samples."""
    out = {"baseline": image_scores(op.pinv(y.to(x.dtype))[:, None], x)}
    if hasattr(prior, "mixture"):
        posts = exact_posterior(prior, op, y, DIGITS_NOISE_STD)
        g = torch.Generator().manual_seed(seed)
        mean = torch.stack([p.weights @ p.means for p in posts]).reshape(x.shape)
        samples = torch.stack([p.sample(chains, generator=g) for p in posts]).reshape(x.shape[0], chains, *x.shape[1:])
        out["posterior_mean"] = image_scores(mean[:, None].to(x.dtype), x)
        out["posterior_sample"] = image_scores(samples.to(x.dtype), x)
    return out


def digits_criteria(rows: dict[str, dict], task: str) -> dict[str, tuple[float, float, bool]]:
    """The digits pass rules for one prior and task, plus HR's wall time below DPS's (the HR paper's claimed
    advantage): ``{rule: (value, bound, passed)}`` (``>=`` rules store the value and the lower bound)."""
    hr, dr, dps, base = rows["hr"], rows["dr"], rows["dps"], rows["baseline"]
    ge = {
        "HR PSNR >= baseline + 3 dB": (hr["psnr"], base["psnr"] + 3),
        f"HR SSIM >= {DIGITS_SSIM_MIN[task]}": (hr["ssim"], DIGITS_SSIM_MIN[task]),
        "HR PSNR >= max(DR, DPS-best) - 0.75 dB": (hr["psnr"], max(dr["psnr"], dps["psnr"]) - 0.75),
        "HR diversity >= DR diversity": (hr["diversity"], dr["diversity"]),
    }
    if "posterior_sample" in rows:
        ge["HR PSNR >= exact posterior sample - 1 dB"] = (hr["psnr"], rows["posterior_sample"]["psnr"] - 1)
    out = {k: (v, b, v >= b) for k, (v, b) in ge.items()}
    if "time_ratio_hr_dps" in rows.get("timing", {}):
        r = rows["timing"]["time_ratio_hr_dps"]
        out["HR wall time < DPS wall time"] = (r, 1.0, r < 1.0)
    return out
