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
