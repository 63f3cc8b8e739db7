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


def _save(plt, fig, path: str | Path) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it (figures are not kept open between plots)."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def scatter(samples: Tensor, path: str | Path, reference: Tensor | None = None, title: str = "") -> Path:
    """Scatter plot of the first two coordinates of ``samples`` over grey ``reference`` points; for one-dimensional
    samples, their density histogram over the reference's. Writes a PNG."""
    plt = _pyplot()
    s = torch.as_tensor(samples).detach().cpu().double().reshape(len(samples), -1)
    r = None if reference is None else torch.as_tensor(reference).detach().cpu().double().reshape(len(reference), -1)
    if s.shape[1] == 1:  # a scatter of one coordinate would be a line: compare densities instead
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
        values = s[:, 0] if r is None else torch.cat([s[:, 0], r[:, 0]])
        bins = torch.linspace(float(values.min()), float(values.max()), 61).numpy()
        if r is not None:
            ax.hist(r[:, 0].numpy(), bins=bins, density=True, color="0.75", label="exact samples")
        ax.hist(s[:, 0].numpy(), bins=bins, density=True, histtype="step", color="tab:blue", label="generated")
        ax.set_xlabel("x[0]")
        ax.set_ylabel("density")
        ax.legend(loc="upper right", fontsize=8)
        ax.set_title(title, fontsize=9)
        return _save(plt, fig, path)
    fig, ax = plt.subplots(figsize=(5, 5), dpi=110)
    if r is not None:
        ax.scatter(r[:, 0], r[:, 1], s=2, c="0.75", label="exact samples", rasterized=True)
    ax.scatter(s[:, 0], s[:, 1], s=2, c="tab:blue", alpha=0.6, label="generated", rasterized=True)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x[0]")
    ax.set_ylabel("x[1]")
    ax.legend(loc="upper right", markerscale=4, fontsize=8)
    ax.set_title(title, fontsize=9)
    return _save(plt, fig, path)


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


def fan_chart(ensemble: Tensor, path: str | Path, truth: Tensor | None = None, reference: Tensor | None = None,
              title: str = "", reference_label: str = "oracle mean", max_panels: int = 6) -> Path:
    """Forecast fan charts of one case of a 1-D field: one panel per lead time, the members' 10-90% and 25-75% bands
    and median along the field, with the truth and a reference forecast (e.g. the oracle mean) if given.

    Args:
        ensemble: ``[members, S_f, N]``; truth, reference: ``[S_f, N]``.
    """
    plt = _pyplot()
    e = torch.as_tensor(ensemble).detach().cpu().double()
    leads = min(e.shape[1], max_panels)
    fig, axes = plt.subplots(1, leads, figsize=(2.4 * leads, 2.4), dpi=110, sharey=True, squeeze=False)
    q = torch.quantile(e, torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64), dim=0)
    cells = torch.arange(e.shape[-1])
    for h, ax in enumerate(axes[0][:leads]):
        ax.fill_between(cells, q[0, h], q[4, h], color="tab:blue", alpha=0.18, lw=0, label="10-90%")
        ax.fill_between(cells, q[1, h], q[3, h], color="tab:blue", alpha=0.35, lw=0, label="25-75%")
        ax.plot(cells, q[2, h], color="tab:blue", lw=1.2, label="median")
        if reference is not None:
            ax.plot(cells, torch.as_tensor(reference)[h].cpu(), color="tab:orange", lw=1, ls="--",
                    label=reference_label)
        if truth is not None:
            ax.plot(cells, torch.as_tensor(truth)[h].cpu(), color="k", lw=1, label="truth")
        ax.set_title(f"lead {h + 1}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6, loc="upper left")
    fig.suptitle(title, fontsize=9)
    return _save(plt, fig, path)


def forecast_fields(ensemble: Tensor, path: str | Path, truth: Tensor | None = None, title: str = "",
                    max_panels: int = 6) -> Path:
    """One case of a 2-D field forecast: rows ensemble mean, ensemble spread (std) and truth (if given), one column
    per lead time. ``ensemble: [members, S_f, H, W]``, ``truth: [S_f, H, W]``."""
    plt = _pyplot()
    e = torch.as_tensor(ensemble).detach().cpu().double()
    leads = min(e.shape[1], max_panels)
    rows = [("mean", e.mean(0)), ("spread", e.std(0) if e.shape[0] > 1 else torch.zeros_like(e[0]))]
    if truth is not None:
        rows.append(("truth", torch.as_tensor(truth).detach().cpu().double()))
    lim = float(max(rows[0][1].abs().max(), rows[-1][1].abs().max()))
    fig, axes = plt.subplots(len(rows), leads, figsize=(1.6 * leads, 1.6 * len(rows)), dpi=110, squeeze=False)
    for i, (name, field) in enumerate(rows):
        for h in range(leads):
            ax = axes[i][h]
            kw = {"cmap": "magma", "vmin": 0.0} if name == "spread" else {"cmap": "RdBu_r", "vmin": -lim, "vmax": lim}
            ax.imshow(field[h], **kw)
            ax.set_xticks([])
            ax.set_yticks([])
            if h == 0:
                ax.set_ylabel(name, fontsize=8)
            if i == 0:
                ax.set_title(f"lead {h + 1}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    return _save(plt, fig, path)


def graph_grid(graphs, path: str | Path, titles=None, ncol: int | None = None) -> Path:
    """Draw networkx ``graphs`` in a grid (spring layout, seed 0, so a drawing is reproducible), one title each."""
    import networkx as nx

    plt = _pyplot()
    count = max(len(graphs), 1)
    ncol = ncol or min(count, 4)
    nrow = (count + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 3.0 * nrow), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, g in enumerate(graphs):
        ax = axes.flat[i]
        nx.draw(g, pos=nx.spring_layout(g, seed=0), ax=ax, node_size=40, width=0.8, node_color="#3b6ea5",
                edge_color="#555555")
        if titles is not None:
            ax.set_title(titles[i], fontsize=7)
    return _save(plt, fig, path)
