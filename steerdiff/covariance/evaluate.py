"""Few-step evaluation on exact mixtures (spec ``methods/covariance.md`` 6.4): methods, sliced W1, the gates.

Methods (spec 6.4; all on the same grid, so at equal NFE = K): ``ddpm-beta-tilde``, ``ddpm-beta``, ``ddim``
(eta 0), ``analytic-ddpm`` / ``analytic-ddim``, ``ocm-ddpm`` / ``ocm-ddim`` (with the oracle or a learned head).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import ot
import torch
from torch import Tensor

from ..core.noise import randn
from ..models.gmm import GaussianMixture
from .grid import vp_linear_sigmas
from .kernel import AnalyticDPM, as_covariance, sample_gaussian

BASELINES = ("ddpm-beta-tilde", "ddpm-beta", "ddim")
OCM = ("ocm-ddpm", "ocm-ddim")
ANALYTIC = ("analytic-ddpm", "analytic-ddim")


def sliced_w1(x, y, n_projections: int = 256, seed: int = 0) -> float:
    """Sliced W1: mean over ``n_projections`` fixed random unit directions of the 1-D W1 (spec 6.4).

    In 1-D the single direction gives the exact W1. Equal sample sizes use the sorted (exact 1-D optimal)
    coupling, which is much faster than POT's quantile path and is tested to agree with
    ``ot.sliced_wasserstein_distance(p=1)`` on the same directions; unequal sizes go to POT.
    """
    a = np.asarray(torch.as_tensor(x).detach().double().reshape(len(x), -1))
    b = np.asarray(torch.as_tensor(y).detach().double().reshape(len(y), -1))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y must have the same dimension, got {a.shape[1]} and {b.shape[1]}")
    if a.shape[1] == 1:
        proj = np.ones((1, 1))
    else:
        p = np.random.default_rng(seed).standard_normal((a.shape[1], n_projections))
        proj = p / np.linalg.norm(p, axis=0, keepdims=True)
    if a.shape[0] != b.shape[0]:
        return float(ot.sliced_wasserstein_distance(a, b, p=1, projections=proj))
    pa, pb = np.sort(a @ proj, axis=0), np.sort(b @ proj, axis=0)
    return float(np.abs(pa - pb).mean())


def method_spec(method: str, covariance=None, analytic: AnalyticDPM | None = None):
    """``(kind, covariance)`` of a method name; ``covariance`` is the OCM source (oracle mixture or head)."""
    table = {"ddpm-beta-tilde": ("ddpm", "zero"), "ddpm-beta": ("ddpm", "beta"), "ddim": ("ddim", "zero"),
             "analytic-ddpm": ("ddpm", analytic), "analytic-ddim": ("ddim", analytic),
             "ocm-ddpm": ("ddpm", covariance), "ocm-ddim": ("ddim", covariance)}
    if method not in table:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(table)}")
    kind, cov = table[method]
    if cov is None:
        raise ValueError(f"method {method!r} needs its covariance (an OCM head/oracle, or a fitted AnalyticDPM)")
    return kind, cov


def mixture_run(mixture: GaussianMixture, method: str, steps: int, covariance=None, analytic=None,
                seeds=(0, 1, 2), n: int = 4000) -> dict:
    """Mean SW1 (and mode-weight TV) over sampler ``seeds`` of ``n`` samples against ``n`` fresh true samples."""
    kind, cov = method_spec(method, covariance, analytic)
    sig = vp_linear_sigmas(steps)
    sw, tv, nfe, clamped = [], [], 0.0, 0
    for seed in seeds:
        noise = randn((n, mixture.dim), seeds=seed * n, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = sample_gaussian(mixture, noise, sig, kind=kind, covariance=cov, generator=10**6 + seed * n)
        truth = mixture.sample(n, generator=torch.Generator().manual_seed(10**7 + seed))
        sw.append(sliced_w1(res.samples, truth, seed=seed))
        tv.append(_mode_tv(res.samples, mixture))
        nfe, clamped = res.nfe, clamped + res.clamped
    return {"method": method, "steps": steps, "nfe": nfe, "sw1": float(np.mean(sw)), "sw1_seeds": sw,
            "mode_tv": float(np.mean(tv)), "clamped": clamped}


def _mode_tv(x: Tensor, mixture: GaussianMixture) -> float:
    assign = mixture.responsibilities(x).argmax(-1)
    frac = torch.bincount(assign, minlength=mixture.n_components).double() / x.shape[0]
    return float(0.5 * (frac - mixture.weights).abs().sum())


def noise_floor(mixture: GaussianMixture, n: int = 4000, seeds=(0, 1, 2)) -> float:
    """SW1 between two independent true sample sets (spec 6.4 "noise floor")."""
    vals = []
    for seed in seeds:
        a = mixture.sample(n, generator=torch.Generator().manual_seed(2 * 10**7 + seed))
        b = mixture.sample(n, generator=torch.Generator().manual_seed(10**7 + seed))
        vals.append(sliced_w1(a, b, seed=seed))
    return float(np.mean(vals))


def few_step_gates(cells: dict, tol: float = 0.0) -> dict:
    """Spec 6.4 gates over ``cells[(mixture, K)] = {method: sw1}``.

    (a) geometric mean over cells of ``min(OCM) / best baseline`` (pass if <= 0.80); (b) per cell OCM-DDPM <
    min(DDPM-beta-tilde, DDPM-beta) + tol and OCM-DDIM < DDIM + tol; (c) no cell with ``min(OCM) > best + 0.01``.
    """
    ratios, fail_b, fail_c = [], [], []
    for key, r in cells.items():
        best = min(r[m] for m in BASELINES)
        ocm = min(r["ocm-ddpm"], r["ocm-ddim"])
        ratios.append(ocm / best)
        if not (r["ocm-ddpm"] < min(r["ddpm-beta-tilde"], r["ddpm-beta"]) + tol and r["ocm-ddim"] < r["ddim"] + tol):
            fail_b.append(key)
        if ocm > best + 0.01:
            fail_c.append(key)
    geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
    return {"geo_mean_ratio": geo, "a": geo <= 0.80, "b_failures": fail_b, "b": not fail_b,
            "c_failures": fail_c, "c": not fail_c}


def train_mixture_head(mixture: GaussianMixture, param: str = "direct", steps: int = 3000, batch_size: int = 512,
                       lr: float = 1e-3, seed: int = 0, n_probes: int = 1):
    """The spec 6.3 head of a mixture: MLP 3 x 128 on ``[x / sqrt(sigma^2 + 1), log(sigma)/4]``, zero-init output,
    Adam, 1 probe, sigma uniform over the VP-linear indices; the frozen denoiser is the exact mixture."""
    from .heads import InputHead
    from .train import train_ocm

    torch.manual_seed(seed)
    head = InputHead(mixture.dim, hidden=128, depth=3, param=param, sigma_data=1.0)
    return train_ocm(mixture, mixture, head, steps=steps, batch_size=batch_size, lr=lr, n_probes=n_probes,
                     sigma_mode="vp_index", seed=seed, log_every=100)


@torch.no_grad()
def head_accuracy(mixture: GaussianMixture, head, steps: int = 10, n: int = 4000, seed: int = 0) -> list[dict]:
    """relL1 ``sum|c_hat - c| / sum|c|`` of a head (clamped at 0) against the exact diagonal over ``x ~ p_sigma``,
    at each sigma of the ``steps``-step VP-linear grid (spec 6.3)."""
    from .kernel import mixture_diag_cov

    g = torch.Generator().manual_seed(seed)
    rows = []
    for s in vp_linear_sigmas(steps)[:-1].flip(0).tolist():
        x = mixture.sample(n, generator=g)
        x = x + s * torch.randn(x.shape, generator=g, dtype=torch.float64)
        sig = torch.full((n,), s, dtype=torch.float64)
        exact = mixture_diag_cov(mixture, x, sig)
        pred = head.covariance(x.float(), sig.float()).double().clamp_min(0)
        rows.append({"sigma": s, "rel_l1": float((pred - exact).abs().sum() / exact.abs().sum())})
    return rows


__all__ = ["ANALYTIC", "BASELINES", "OCM", "as_covariance", "few_step_gates", "head_accuracy", "method_spec",
           "mixture_run",
           "noise_floor", "sliced_w1", "train_mixture_head"]
