"""Saving and loading the small codec parts a DiffDIS segmenter can swap in (docs/methods/diffdis.md, "The light mask
decoder", "The light image encoder"): one folder with ``config.json`` (format, architecture, metadata) and
``model.safetensors`` (float32), written atomically and read back with every check a shipped file gets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..io import CheckpointError, atomic_dir, load_state_strict, load_tensors, read_json, save_tensors, write_json


def save_light_part(module: nn.Module, directory: str | Path, fmt: str, metadata: dict | None = None) -> Path:
    """Write ``module``'s float32 weights and ``{"format": fmt, **module.config, "metadata": metadata}``."""
    directory = Path(directory)
    with atomic_dir(directory) as tmp:
        save_tensors({k: v.float() for k, v in module.state_dict().items()}, tmp / "model.safetensors")
        write_json(tmp / "config.json", {"format": fmt, **module.config, "metadata": metadata or {}})
    return directory


def load_light_part(directory: str | Path, fmt: str, what: str, build: Callable[[dict], nn.Module], codec=None,
                    made: str = "trained") -> nn.Module:
    """Read a folder of :func:`save_light_part` (safetensors only) as ``build(config)``, float32, eval mode.

    ``what`` names the part in errors ("light mask decoder"); with ``codec`` the part must match its latents (same
    latent channels, scaling factor and spatial factor; ``made`` says how the part got them in the error). A missing
    or foreign config, a corrupt one, a mismatch, non-finite or missing / extra weights are a
    :class:`~steerdiff.io.CheckpointError`.
    """
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{directory}: no config.json (not a {what} folder)")
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict) or cfg.get("format") != fmt:
        raise CheckpointError(f"{cfg_path}: format {cfg.get('format') if isinstance(cfg, dict) else cfg!r} is not "
                              f"{fmt!r}")
    try:
        part = build(cfg)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{cfg_path}: corrupt config ({err})") from err
    if codec is not None:
        ours, theirs = ((m.latent_channels, m.scaling_factor, m.factor) for m in (part, codec))
        if ours != theirs:
            raise CheckpointError(f"{directory}: {made} for latents with (channels, scaling factor, factor) "
                                  f"{ours}, the codec's are {theirs}")
    tensors = load_tensors(directory / "model.safetensors")
    if any(v.is_floating_point() and not torch.isfinite(v).all() for v in tensors.values()):
        raise CheckpointError(f"{directory / 'model.safetensors'}: non-finite weights")
    load_state_strict(part, {k: v.float() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return part.eval()
