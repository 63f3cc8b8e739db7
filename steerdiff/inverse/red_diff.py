"""Denoising Regularization, DR = RED-diff (Mardani, Song, Kautz, Vahdat, "A Variational Perspective on Solving
Inverse Problems with Diffusion Models", ICLR 2024): the variational objective in the form of the official code;
docs/methods/inverse.md, "DR (RED-diff)".

A Dirac variational posterior at ``mu`` minimises ``||y - A(mu)||^2 / (2 sigma_y^2) + E[lam w_t sg(eps_hat - eps)^T
mu]``. In EDM units with the "linear" weight ``w = sigma`` the regulariser's gradient ``lam sigma (eps_hat - eps) =
lam (mu - D(mu + sigma eps, sigma))`` is a RED gradient at a noised point. We follow the code form
(``algos/reddiff.py``), one Adam step per level on

    L = lam * mean(w(sigma) sg(eps_hat - eps) * x0) + v * mean((y - A(x0))^2) / 2,     x0 = mu + sigma_x0 xi,

where ``mean`` runs over batch and entries (gradients carry ``1 / (B d)`` and ``1 / (B m)``), so the
published ``lam``, ``v`` and ``lr`` keep their meaning; ``sigma_y`` never enters (as in the code, unlike the
paper's objective). The loop itself, shared
with CR and HR (``beta = 1`` is DR), is :func:`steerdiff.inverse.hybrid.variational_solve`.
"""

from __future__ import annotations

import math

from torch import Tensor

WEIGHTS = {  # RED-diff's denoise_term_weight options; sigma is EDM sigma = VP sigma_t / alpha_t
    "linear": lambda s: s,
    "sqrt": math.sqrt,
    "square": lambda s: s * s,
    "log": math.log1p,
    "trunc_linear": lambda s: min(s, 1.0),
    "power2over3": lambda s: s ** (2 / 3),
    "const": lambda s: 1.0,
}

RED_DIFF_DEFAULTS = {  # NVlabs/RED-diff _configs/algo/reddiff.yaml (same in HRDIS)
    "lam": 0.25,          # grad_term_weight
    "v": 1.0,             # obs_weight
    "lr": 0.1,            # Adam learning rate, for images in [-1, 1] (solve scales it to the prior: hybrid.default_lr)
    "weight": "linear",   # denoise_term_weight
    "sigma_x0": 0.0,      # noise on mu inside the losses (HRDIS inpainting runs: 1e-4)
}
ADAM_BETAS, ADAM_EPS = (0.9, 0.99), 1e-8  # RED-diff / HRDIS: not PyTorch's default 0.999


def omega(sigma: float, weight: str) -> float:
    """The level weight ``w(sigma)`` of the regulariser."""
    if weight not in WEIGHTS:
        raise ValueError(f"weight must be one of {sorted(WEIGHTS)}, got {weight!r}")
    return WEIGHTS[weight](sigma)


def red_diff_loss(x0: Tensor, eps_hat: Tensor, eps: Tensor, y: Tensor, operator, sigma: float, *, lam: float,
                  v: float, weight: str) -> Tensor:
    """``L_reg + L_obs`` of the code form; ``eps_hat`` and ``eps`` enter behind a stop-gradient."""
    l_reg = (lam * omega(sigma, weight) * (eps_hat - eps).detach() * x0).mean()
    l_obs = v * (y - operator.forward(x0)).square().mean() / 2
    return l_reg + l_obs
