"""Calibration data of SVDQuant (Li et al., ICLR 2025), gathered as the official deepcompressor code does: the
model's own sampling trajectories (docs/methods/svdquant.md, "Calibration data").

deepcompressor runs the fp model's full sampler, saves the denoiser input of every step and every CFG branch,
and draws ``num_samples`` = 128 of those calls at random with seed 0. :func:`trajectory_calibration` does the
same for any steerdiff denoiser: a call is one sample's ``(x, sigma, cond)`` at one evaluation. Layer inputs are
then recorded from the **unquantized** model (:func:`capture_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

CalibItem = Tensor | tuple | dict


def trajectory_calibration(denoiser, num_samples: int = 128, n_trajectories: int = 32, steps: int = 20,
                           method: str = "heun", guidance_scale: float = 2.0, seed: int = 0,
                           sigma_min: float = 0.002, sigma_max: float = 80.0) -> list[tuple]:
    """Record every denoiser call of ``n_trajectories`` fp sampling runs and draw ``num_samples`` of them.

    Conditional models (``num_classes`` with one slot) are sampled with CFG at ``guidance_scale`` so that both
    the conditional and the null branch are recorded (deepcompressor keeps every step and every CFG branch); classes are
    spread evenly.

    Returns:
        A list with one ``(x [N, *shape], sigma [N], cond [N] or None)`` batch (N = ``num_samples``), usable as
        ``calib=`` of :func:`steerdiff.quant.quantize`.
    """
    from ..core import randn, sample
    from ..core import sigmas as sched
    from ..guidance import CFG

    shape = getattr(denoiser, "sample_shape", None)
    if shape is None:
        raise ValueError("trajectory calibration needs denoiser.sample_shape; pass calib= explicitly instead")
    num_classes = tuple(getattr(denoiser, "num_classes", ()) or ())
    cond = guidance = None
    if len(num_classes) == 1:
        cond = torch.arange(n_trajectories) % num_classes[0]
        guidance = CFG(guidance_scale) if guidance_scale != 1.0 else None
    records: list[tuple] = []

    def recorder(x, sigma, c=None):
        out = denoiser(x, sigma, c)
        sig = torch.as_tensor(sigma, dtype=x.dtype).expand(x.shape[0]) if torch.as_tensor(sigma).ndim == 0 \
            else sigma
        records.append((x.detach().clone(), sig.detach().clone(), None if c is None else c.detach().clone()))
        return out

    recorder.sample_shape = shape  # type: ignore[attr-defined]
    noise = randn((n_trajectories, *shape), seeds=seed)
    with torch.no_grad():
        sample(recorder, noise, sched.karras(steps, sigma_min, sigma_max), method=method, cond=cond,
               guidance=guidance)
    xs = torch.cat([r[0] for r in records])
    ss = torch.cat([r[1].reshape(-1) for r in records])
    cs = None
    if cond is not None:
        cs = torch.cat([r[2] if r[2] is not None else torch.full((r[0].shape[0],), -1) for r in records])
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(xs.shape[0], generator=g)[:num_samples]
    return [(xs[idx], ss[idx], None if cs is None else cs[idx])]


def iter_calib(calib) -> list[CalibItem]:
    """Normalise ``calib``: a tensor (one input), a callable returning an iterable, or an iterable of items, each
    a tensor, a tuple (positional inputs) or a dict (keyword inputs).

    Raises:
        TypeError: ``calib`` or one of its items has another type.
        ValueError: ``calib`` holds no item.
    """
    if isinstance(calib, Tensor):
        items = [calib]
    elif callable(calib) and not isinstance(calib, nn.Module):
        items = list(calib())
    elif isinstance(calib, (list, tuple)):
        items = list(calib)
    else:
        raise TypeError(
            f"calib must be a tensor, a list of model inputs, or a callable yielding inputs; got {type(calib).__name__}"
        )
    if not items:
        raise ValueError("calib holds no calibration input: pass at least one tensor, tuple or dict of model inputs")
    for i, item in enumerate(items):
        if not isinstance(item, (Tensor, tuple, dict)):
            raise TypeError(f"calib item {i} is a {type(item).__name__}; each item must be a tensor, a tuple of "
                            "positional model inputs or a dict of keyword inputs")
    return items


def run_item(model: Callable, item: CalibItem):
    if isinstance(item, dict):
        return model(**item)
    if isinstance(item, tuple):
        return model(*item)
    return model(item)


def capture_inputs(root: nn.Module, paths: list[str], model: Callable, items: Iterable[CalibItem]) -> dict[str, Tensor]:
    """Run the fp ``model`` on ``items`` and record the input of every module in ``paths`` (concatenated on dim 0).

    The inputs keep their dtype (the model's: calibration then runs each fp layer in its own dtype) and are
    copied to the CPU.

    Raises:
        ValueError: naming ``calib`` when the model fails on the calibration inputs (wrong shape or type), or when
            they give a layer non-finite inputs (the smoothing factors and scales would be NaN).
    """
    store: dict[str, list[Tensor]] = {p: [] for p in paths}
    hooks = []
    for p in paths:
        def hook(_mod, args, p=p):
            store[p].append(args[0].detach().to("cpu", copy=True))
        hooks.append(root.get_submodule(p).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for item in items:
                try:
                    run_item(model, item)
                except (RuntimeError, ValueError, TypeError, IndexError) as e:
                    shape = tuple(item.shape) if isinstance(item, Tensor) else type(item).__name__
                    raise ValueError(f"calib: the model failed on a calibration input ({shape}): {e}") from e
    finally:
        for h in hooks:
            h.remove()
    missing = [p for p, v in store.items() if not v]
    if missing:
        raise ValueError(f"calib: the calibration inputs never reached layers {missing[:5]}")
    out = {p: torch.cat(v, 0) for p, v in store.items()}
    bad = [p for p, v in out.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"calib: the calibration inputs give non-finite (NaN or Inf) inputs to layers {bad[:5]}; "
                         "check the calibration data (and that the model is finite on it)")
    return out


def subsample(x: Tensor, max_rows: int, tokens: bool, conv: bool = False, seed: int = 0) -> Tensor:
    """Cap calibration rows (calibration cost grows with them): tokens of a linear, or whole samples (attention
    inputs, conv maps)."""
    g = torch.Generator().manual_seed(seed)
    if tokens and not conv:
        x = x.reshape(-1, x.shape[-1])
        if x.shape[0] > max_rows:
            x = x[torch.randperm(x.shape[0], generator=g)[:max_rows]]
        return x
    per = x[0].numel() // (x.shape[1] if conv else x.shape[-1])  # tokens (pixels) per sample
    keep = max(1, max_rows // max(per, 1))
    if x.shape[0] > keep:
        x = x[torch.randperm(x.shape[0], generator=g)[:keep]]
    return x
