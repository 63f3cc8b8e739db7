"""Plots written by the CLI and benchmarks (matplotlib, an optional extra: ``pip install steerdiff[plot]``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("plots need matplotlib: pip install 'steerdiff[plot]'") from err
    return plt


def scatter(samples: Tensor, path: str | Path, reference: Tensor | None = None, title: str = "") -> Path:
    """Scatter plot of the first two coordinates of ``samples`` over grey ``reference`` points; writes a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5), dpi=110)
    if reference is not None:
        r = torch.as_tensor(reference).detach().cpu().double()
        ax.scatter(r[:, 0], r[:, 1], s=2, c="0.75", label="exact samples", rasterized=True)
    s = torch.as_tensor(samples).detach().cpu().double()
    ys = s[:, 1] if s.shape[1] > 1 else torch.zeros_like(s[:, 0])
    ax.scatter(s[:, 0], ys, s=2, c="tab:blue", alpha=0.6, label="generated", rasterized=True)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x[0]")
    ax.set_ylabel("x[1]" if s.shape[1] > 1 else "")
    ax.legend(loc="upper right", markerscale=4, fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def image_grid(images: Tensor, path: str | Path, nrow: int | None = None, scale: int = 4, pad: int = 1) -> Path:
    """Save ``[N, C, H, W]`` images in [-1, 1] as one PNG grid (nearest-neighbour upscaled by ``scale``)."""
    plt = _pyplot()
    x = ((torch.as_tensor(images).detach().cpu().float().clamp(-1, 1) + 1) / 2)
    n, c, h, w = x.shape
    if c not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {c}")
    nrow = nrow or max(1, int(round(n**0.5)))
    ncol = -(-n // nrow)
    grid = torch.ones(c, ncol * (h + pad) + pad, nrow * (w + pad) + pad)
    for i in range(n):
        r, q = divmod(i, nrow)
        grid[:, pad + r * (h + pad) : pad + r * (h + pad) + h, pad + q * (w + pad) : pad + q * (w + pad) + w] = x[i]
    grid = grid.repeat_interleave(scale, 1).repeat_interleave(scale, 2).permute(1, 2, 0).numpy()
    path = Path(path)
    plt.imsave(path, grid[..., 0] if c == 1 else grid, cmap="gray" if c == 1 else None, vmin=0, vmax=1)
    return path
