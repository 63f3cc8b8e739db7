"""Trained flow-matching models as registered, saveable denoisers (rectified flow: Liu et al. 2023, "Flow Straight
and Fast"; Esser et al. 2024, "Scaling Rectified Flow Transformers" (SD3), Sec. 2-3).

:class:`FlowModel` is :class:`steerdiff.core.FlowDenoiser` (the wrapper in the one convention: ``sigma = t / (1 - t)``,
``x_t = x / (1 + sigma)``, ``D = x_t - t v``) whose backbone is a registered steerdiff network, built from its JSON
config, so that it saves and loads like every other model::

    config.json        {"class": "FlowModel", "config": {"net": {"class": "UNet", ...}, "prediction": "velocity",
                        "t_scale": 1.0}, "steerdiff_version": ...}
    model.safetensors  the state dict (the backbone's tensors under "net.")

The checkpoint format registered here (``"flow"``) also saves a plain ``FlowDenoiser`` around a registered backbone,
``sd.models.save(sd.core.FlowDenoiser(UNet(...), t_scale=1.0), dir)``; ``sd.models.load(dir)`` returns a
``FlowModel``, which is a ``FlowDenoiser``.

The backbone takes ``t * t_scale`` where an EDM backbone takes ``c_noise = ln(sigma) / 4``. steerdiff's UNet and DiT
embed that scalar with fixed Fourier features of frequencies 1..64 (``steerdiff.models.embed.FourierFeatures``),
tuned to ``c_noise`` in about ``[-1.6, 1.1]``: ``t_scale = 1`` (``t`` in ``[0, 1]``, the facebookresearch/flow_matching
convention) keeps the label in that band, whereas diffusers' ``t_scale = 1000`` would put it at frequencies where the
features alias. The shipped ``digits_flow`` model uses ``t_scale = 1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..core.flow import FlowDenoiser
from ..io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    __version__,
    atomic_dir,
    load_state_strict,
    load_tensors,
    register_format,
    save_tensors,
    write_json,
)
from .io import build_model, model_spec, register_model


@register_model()
class FlowModel(FlowDenoiser):
    """A ``FlowDenoiser`` around a registered backbone ``net(x_t, t * t_scale, cond)``, rebuilt from its config.

    Args:
        net: the backbone (a registered module with ``sample_shape``, e.g. ``UNet``) or its spec
            ``{"class", "config"}``.
        prediction: what the backbone predicts (``"velocity"``: ``v = eps - x0``; see ``FlowDenoiser``).
        t_scale: the backbone's time label is ``t * t_scale`` (1 for steerdiff's backbones, module docstring).
    """

    def __init__(self, net: nn.Module | dict, prediction: str = "velocity", t_scale: float = 1.0):
        if isinstance(net, dict):
            net = build_model(net)
        if not isinstance(net, nn.Module) or not hasattr(net, "sample_shape"):
            raise TypeError("net must be a backbone module with a sample_shape attribute, or its config dict")
        super().__init__(net, prediction=prediction, t_scale=float(t_scale))

    @property
    def config(self) -> dict:
        """Constructor kwargs as JSON: the backbone nested as its own ``{"class", "config"}`` spec."""
        return {"net": model_spec(self.net), "prediction": self.prediction, "t_scale": float(self.t_scale)}


def _flow_spec(model: FlowDenoiser) -> dict:
    try:
        net_spec = model_spec(model.net)
    except TypeError as e:
        raise TypeError(
            f"model is a FlowDenoiser around a {type(model.net).__name__}, which is not a registered steerdiff "
            "backbone: only FlowDenoisers around registered networks (UNet, DiT, MLP) can be saved with "
            "sd.models.save; save a foreign network with its own library"
        ) from e
    return {"class": "FlowModel",
            "config": {"net": net_spec, "prediction": model.prediction, "t_scale": float(model.t_scale)},
            "steerdiff_version": __version__}


def save_flow(model: FlowDenoiser, directory: str | os.PathLike) -> Path:
    """Write a ``FlowModel`` (or a plain ``FlowDenoiser`` around a registered backbone) as a ``FlowModel``
    checkpoint, atomically."""
    spec = _flow_spec(model)
    with atomic_dir(directory) as tmp:
        write_json(tmp / CONFIG_NAME, spec)
        save_tensors(model.state_dict(), tmp / WEIGHTS_NAME)
    return Path(directory)


@register_format("flow", config_class="FlowModel", save=save_flow, handles=lambda obj: isinstance(obj, FlowDenoiser))
def load_flow(directory: Path, spec: dict, device: str | torch.device = "cpu") -> FlowModel:
    """Rebuild the ``FlowModel`` of ``config.json`` and load its weights (safetensors only), in eval mode."""
    model = build_model({"class": "FlowModel", "config": spec.get("config", {})})
    weights = directory / WEIGHTS_NAME
    load_state_strict(model, load_tensors(weights), str(weights))
    return model.to(device).eval()
