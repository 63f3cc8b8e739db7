"""The geometry reward: a noise-aware regressor ``r_phi(x_sigma, sigma)`` of the standardised local scaling psi of the
final sample ("What Secrets Do Your Manifolds Hold?", Humayun et al., ICLR 2025; steps 1-2 of our version
of the paper's reward guidance, docs/methods/geometry.md "Geometry-reward guidance").

1. :func:`trajectory_states`: run the deterministic sampler from latents and keep every state ``x_{sigma_i}``;
2. :class:`PsiRegressor` + :func:`train_psi_regressor`: MSE on psi standardised over the set, sigma drawn from the
   sampler grid (every recorded state).

Step 3 (guidance) is :class:`steerdiff.guidance.RewardGuidance` with this regressor as its ``reward``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.sampling import sample
from ..models.io import register_model


@register_model()
class PsiRegressor(nn.Module):
    """``r(x, sigma, cond=None) -> [B]``: an MLP on ``[c_in x, log(sigma) / 4]`` with EDM's input scaling
    ``c_in = 1 / sqrt(sigma^2 + sigma_data^2)`` (the same input a preconditioned denoiser sees).

    Args:
        dim: flattened sample size.
        hidden: hidden widths (SiLU).
        sigma_data: data standard deviation of the input scaling.
        sample_shape: per-sample shape of ``x`` (default ``(dim,)``).
    """

    def __init__(self, dim: int = 64, hidden: Sequence[int] = (256, 256), sigma_data: float = 0.6,
                 sample_shape: Sequence[int] | None = None):
        super().__init__()
        self.config = {"dim": int(dim), "hidden": [int(h) for h in hidden], "sigma_data": float(sigma_data),
                       "sample_shape": None if sample_shape is None else [int(v) for v in sample_shape]}
        self.dim, self.sigma_data = int(dim), float(sigma_data)
        layers, width = [], dim + 1
        for h in hidden:
            layers += [nn.Linear(width, h), nn.SiLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        flat = x.reshape(x.shape[0], -1)
        if flat.shape[1] != self.dim:
            raise ValueError(f"x must have {self.dim} entries per sample, got shape {tuple(x.shape)}")
        s = torch.as_tensor(sigma, dtype=flat.dtype, device=flat.device).reshape(-1).expand(flat.shape[0])
        c_in = 1.0 / torch.sqrt(s**2 + self.sigma_data**2)
        inp = torch.cat([flat * c_in[:, None], (s.log() / 4)[:, None]], 1)
        return self.body(inp.to(self.body[0].weight.dtype)).squeeze(1).to(flat.dtype)


@dataclass
class States:
    """Trajectory states of ``N`` samples over ``S`` sampler steps: ``x [N, S, *shape]``, ``sigma [S]`` and the
    final samples ``x0 [N, *shape]``."""

    x: Tensor
    sigma: Tensor
    x0: Tensor


@torch.no_grad()
def trajectory_states(denoiser: Callable, z: Tensor, sigmas: Tensor, method: str = "ddim") -> States:
    """Every state ``x_{sigma_i}`` (i = 0..S-1, before each step) of the deterministic sampler from ``x_T = sigma_0
    z``, and the final samples."""
    states: list[Tensor] = []
    x0 = sample(denoiser, z, sigmas, method=method, callback=lambda info: states.append(info["x"].detach().clone()))
    return States(x=torch.stack(states, 1), sigma=sigmas[:-1].clone().double(), x0=x0)


def train_psi_regressor(states: States, psi: Tensor, steps: int = 3000, batch_size: int = 256, lr: float = 1e-3,
                        hidden: Sequence[int] = (256, 256), sigma_data: float = 0.6, seed: int = 0,
                        progress: bool = False) -> tuple[PsiRegressor, dict]:
    """Fit ``r_phi`` to psi standardised over the set (zero mean, unit variance), every state of a sample sharing
    its target; returns the regressor (eval mode) and ``{"psi_mean", "psi_std", "loss"}``."""
    from tqdm.auto import tqdm

    n, s = states.x.shape[:2]
    mean, std = float(psi.mean()), float(psi.std())
    target = ((psi.double() - mean) / std).float()
    x = states.x.reshape(n * s, -1).float()
    sig = states.sigma.float().repeat(n)
    y = target.repeat_interleave(s)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PsiRegressor(x.shape[1], hidden, sigma_data, sample_shape=states.x.shape[2:])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in tqdm(range(steps), disable=not progress, desc="psi regressor"):
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=gen)
        loss = (model(x[idx], sig[idx]) - y[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_now = lr * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * (step + 1) / steps))).item()
        for group in opt.param_groups:
            group["lr"] = lr_now
        losses.append(loss.item())
    model.eval().requires_grad_(False)
    return model, {"psi_mean": mean, "psi_std": std, "loss": sum(losses[-100:]) / min(100, len(losses))}
