"""The OCM head (Ou et al., ICLR 2025) of the shipped digits UNet: training recipe and head accuracy
(docs/methods/ocm.md, "Digits gate").

The head is a :class:`~steerdiff.models.ocm_heads.TrunkHead` on the frozen UNet's last feature map (the input of
``net.norm_out``). Its accuracy is measured against a many-probe Monte Carlo diagonal ``sigma^2 mean_m v_m J^T
v_m`` of the same denoiser (the Monte Carlo baseline), the only reference a learned denoiser has.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ...core.denoiser import append_dims
from ...core.sigmas import vp_linear
from ...covariance.target import hutchinson_diag
from ...covariance.train import train_ocm
from ...data.digits import load_digits
from ...models.ocm_heads import OCMHead, unet_trunk_head


def head_vs_monte_carlo(
    denoiser: nn.Module, head: OCMHead, x0: torch.Tensor, labels: torch.Tensor | None, sigmas: list[float],
    n_probes: int = 64, seed: int = 0,
) -> list[dict]:
    """Per sigma: the head's ``c`` against an ``n_probes`` Monte Carlo diagonal at ``x = x0 + sigma eps``.

    Reports the ratio of means (``mean c_head / mean c_mc``) and the relative L1 error ``sum|c_h - c_mc| /
    sum|c_mc|`` (part of which is the Monte Carlo noise of the reference itself).
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    denoiser.eval()
    for s in sigmas:
        sigma = torch.full((x0.shape[0],), float(s))
        x = (x0 + append_dims(sigma, x0.ndim) * torch.randn(x0.shape, generator=g)).requires_grad_(True)
        with torch.enable_grad(), head.capture(denoiser) as store:
            d = denoiser(x, sigma, labels)
            diag_j = hutchinson_diag(d, x, n_probes, g)
        c_mc = append_dims(sigma, x0.ndim) ** 2 * diag_j
        with torch.no_grad():
            c_h = head.covariance(x.detach(), sigma, store["features"])
        lo, hi = 0.0, head.c_max
        c_mc_c, c_h_c = c_mc.clamp(lo, hi), c_h.clamp(lo, hi)
        rows.append({
            "sigma": float(s),
            "mean_c_mc": float(c_mc_c.mean()),
            "mean_c_head": float(c_h_c.mean()),
            "ratio_of_means": float(c_h_c.mean() / c_mc_c.mean()),
            "rel_l1": float((c_h_c - c_mc_c).abs().sum() / c_mc_c.abs().sum()),
            # before the clamp (the means above are clamped, which hides negative predictions; issue 40)
            "negative_share_head": float((c_h < 0).float().mean()),
        })
    return rows


def train_digits_head(denoiser: nn.Module, recipe: dict, run_dir: str | Path, resume: bool = False,
                      n_mc: int = 64):
    """Train the digits head with ``recipe = {"head": {...}, "train": {...}}``; return ``(head, metrics)``."""
    x, y = load_digits("train")
    hcfg = dict(recipe["head"])
    data_range = tuple(hcfg.pop("data_range"))
    head = unet_trunk_head(denoiser, data_range=data_range, **hcfg)
    log = []
    result = train_ocm(denoiser, x, head, labels=y, checkpoint_dir=Path(run_dir) / "ckpt", resume=resume,
                       checkpoint_every=250, log_every=50, callback=lambda r: log.append(r), **recipe["train"])
    result.head.last_step_var_max = last_step_var_max(recipe.get("sampling", {}).get("clip_pixel"))
    xt, yt = load_digits("test")
    sig = [float(s) for s in vp_linear(10)[:-1].flip(0)]
    acc = head_vs_monte_carlo(denoiser, result.head, xt[:128], yt[:128], sig, n_probes=n_mc)
    metrics = {
        "train_steps": result.steps,
        "train_wall_time_s": round(result.wall_time, 1),
        "loss_first": result.losses[0] if result.losses else None,
        "loss_last": result.losses[-1] if result.losses else None,
        "head_vs_mc64_on_test": acc,
    }
    return result.head, metrics


def digits_grid_sigmas(step_counts) -> list[float]:
    """Every noise level of the VP-linear grids with the given step counts (for fitting Analytic-DPM once)."""
    out = set()
    for k in step_counts:
        out.update(float(s) for s in vp_linear(int(k))[:-1])
    return sorted(out)


DIGITS_BIN = 2.0 / 16  # sklearn digits take 17 grey levels, 0..16, mapped onto [-1, 1]


def last_step_var_max(clip_pixel: float | None, bin_width: float = DIGITS_BIN) -> float | None:
    """The official code's last-step clip (``clip_sigma_idx = 1``): ``(clip_pixel * bin * sqrt(pi/2))^2``, or None."""
    return None if clip_pixel is None else (clip_pixel * bin_width * math.sqrt(math.pi / 2)) ** 2


@torch.no_grad()
def digits_samples(denoiser: nn.Module, method: str, steps: int, covariance=None, analytic=None, n: int = 2000,
                   seed: int = 0, batch_size: int = 500, clip_pixel: float | None = None
                   ) -> tuple[torch.Tensor, float, int]:
    """``n`` class-conditional digits (classes ``i % 10``) with one method of the digits gate on the VP-linear grid.

    Every method clips ``D`` to [-1, 1] and clamps ``c`` to [0, 1] (docs/methods/ocm.md, "Digits gate"). Sample ``i``
    uses noise seed ``seed * 10**6 + i``, so methods and step counts share their starting noise. ``clip_pixel`` applies
    the official code's last-step variance clip (:func:`last_step_var_max`, in digit grey levels) to every method.
    Returns ``(images, NFE per sample, clamped entries)``.
    """
    import warnings

    from ...core.noise import randn
    from ...covariance.kernel import method_spec, sample_gaussian

    kind, cov = method_spec(method, covariance, analytic)
    sig = vp_linear(steps)
    labels = torch.arange(n) % 10
    out, nfe, clamped = [], 0.0, 0
    for start in range(0, n, batch_size):
        lab = labels[start : start + batch_size]
        base = seed * 10**6 + start
        noise = randn((lab.shape[0], *denoiser.sample_shape), seeds=base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = sample_gaussian(denoiser, noise, sig, kind=kind, covariance=cov, cond=lab, generator=base + 5 * 10**5,
                                  c_max=1.0, clip_denoised=(-1.0, 1.0), last_var_max=last_step_var_max(clip_pixel))
        out.append(res.samples)
        nfe, clamped = res.nfe, clamped + res.clamped
    return torch.cat(out), nfe, clamped
