"""Test helpers shared by the exact-reference tests: an exact mixture as a flow model, and the spread of posterior
metrics over exact samples (the bounds the inverse solvers are held to)."""

from __future__ import annotations

import math

import numpy as np
import torch

import steerdiff as sd
from steerdiff.inverse.metrics import posterior_metrics

BAND_KEYS = ("mean_err", "diversity", "sw2")


def mixture_as_flow(mixture, amp: float = 0.0) -> sd.FlowDenoiser:
    """The mixture as a velocity network ``v = (x_t - D) / t`` (``x_t = x / (1 + s)``, ``t = s / (1 + s)``, ``D`` its
    exact denoiser) in a FlowDenoiser, plus ``amp t sin(x_t)`` (then ``D`` at ``t = 1`` depends on the noise)."""
    def velocity(x_t, t, cond=None):
        tt = t.to(torch.float64)[:, None]
        one = tt == 1
        keep = torch.where(one, torch.ones_like(tt), 1 - tt)
        sigma = torch.where(one, torch.full_like(tt, math.inf), tt / keep)
        out = (x_t - mixture(x_t / keep, sigma[:, 0], cond)) / tt
        return out + amp * tt * torch.sin(x_t) if amp else out
    return sd.FlowDenoiser(velocity, t_scale=1.0)


def exact_band(post, n: int, reps: int = 12, keys: tuple[str, ...] = BAND_KEYS) -> dict:
    """``{metric: (mean, sd)}`` of :func:`posterior_metrics` over ``reps`` sets of ``n`` exact posterior samples."""
    rows = [posterior_metrics(post.sample(n, generator=torch.Generator().manual_seed(100 + r)), post, seed=0)
            for r in range(reps)]
    return {k: (float(np.mean([r[k] for r in rows])), float(np.std([r[k] for r in rows]))) for k in keys}


EXACT_CASES = ("gauss", "g1")  # the one-mode and the several-mode exact problems of the new-solver tests


def exact_case(name: str, n: int) -> tuple:
    """``(name, problem, posterior, band)`` of an exact inverse problem (``gauss``: one Gaussian mode; ``g1``: the
    G1 mixture case 3) with ``n`` chains, and its :func:`exact_band` over ``n`` exact samples."""
    from steerdiff.app.protocols import inverse as V

    makers = {"gauss": lambda: V.gauss_problem(n), "g1": lambda: V.g1_problems(chains=n)[3]}
    problem = makers[name]()
    post = problem.posterior
    return name, problem, post, exact_band(post, n)
