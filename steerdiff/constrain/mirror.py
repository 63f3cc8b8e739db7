"""The mirror-space diffusion model ("MDM") and sampling / guidance / inverse problems through it.

Feng, Baptista, Bouman (ICLR 2025): the MDM and the mirror DPS of the official ``dps.py``; docs/methods/namm.md,
"Mirror-space sampling and inverse problems". The MDM is any steerdiff denoiser trained with the
library's trainer on ``g_EMA(x)`` (``g`` frozen, no gradient). :class:`MirrorDenoiser` *is* that mirror-space
denoiser (so every sampler and guider runs in mirror space unchanged) and adds ``encode = g``, ``decode = f``,
:meth:`MirrorDenoiser.sample` (sample, then decode) and :meth:`MirrorDenoiser.solve`: an inverse problem
``y = A(x) + n`` posed in data space is solved in mirror space with the operator ``A ∘ f``
(:class:`MirrorOperator`; as the paper's mirror DPS: the data fit is evaluated on ``f(x̂0)``), and the result
decoded by ``f``.

A MirrorDenoiser refuses a model that was not trained on its NAMM's forward map (the fingerprint check): decoding a
data-space model's samples with ``f`` would silently distort them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import Tensor, nn

from ..core.sampling import sample as _sample
from ..inverse.base import Operator, as_shape
from ..train.trainer import TrainConfig, TrainResult, train
from .namm import NAMM


@torch.no_grad()
def mirror_data(namm: NAMM, x: Tensor, batch_size: int = 1024) -> Tensor:
    """``g_EMA(x)`` in batches, without gradient (what the MDM trains on)."""
    return torch.cat([namm.encode(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)])


def train_mirror_model(namm: NAMM, model: nn.Module, data, config: TrainConfig | dict, out_dir: str | Path,
                       resume: bool = False, progress: bool = False) -> TrainResult:
    """Train ``model`` (e.g. ``EDMPrecond(UNet(...))``) on ``g(x)`` with :func:`steerdiff.train.train`.

    Args:
        namm: the trained maps (``g`` is applied once, frozen).
        model: a registered denoiser to train in place.
        data: ``x``, ``(x,)``, ``(x, cond)`` or a ``TensorDataset`` in **data** space.
        config: :class:`~steerdiff.train.TrainConfig` or its dict.
        out_dir: run directory (checkpoints; ``final/`` holds the EMA model; ``mirror.json`` the fingerprint).

    Returns:
        The trainer's result; ``result.model`` carries ``namm_fingerprint``.
    """
    from ..io import write_json

    tensors = getattr(data, "tensors", data)
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    x, rest = tensors[0], tuple(tensors[1:])
    result = train(model, (mirror_data(namm, x), *rest), config, out_dir, resume=resume, progress=progress)
    result.model.namm_fingerprint = namm.fingerprint
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / "mirror.json", {"forward_fingerprint": namm.fingerprint})
    return result


class MirrorOperator(Operator):
    """``A ∘ f``: a data-space measurement operator seen from mirror space (nonlinear).

    ``forward(x̃) = A(f(x̃))``; ``pinv(y) = g(A⁺(y))`` (the data-space initialiser moved to mirror space).
    """

    is_linear = False

    def __init__(self, operator: Operator, namm: NAMM):
        if not isinstance(operator, Operator):
            raise TypeError(f"operator must be a steerdiff.inverse Operator, got {type(operator).__name__}")
        self.op, self.namm = operator, namm
        self.dps_scale = operator.dps_scale
        super().__init__(operator.shape)

    def bind(self, shape) -> Operator:
        shape = as_shape(shape)
        if shape == self.shape:
            return self
        return MirrorOperator(self.op.bind(shape), self.namm)

    def _validate_shape(self, shape):
        if tuple(shape) != tuple(self.namm.sample_shape):
            raise ValueError(f"the NAMM maps act on {tuple(self.namm.sample_shape)}, not {tuple(shape)}")
        self.op = self.op.bind(shape)

    def _measurement_size(self, shape):
        return self.op.m

    def _forward(self, x):
        return self.op.forward(self.namm.decode(x))

    def _pinv(self, y):
        return self.namm.encode(self.op.pinv(y))

    def __repr__(self):
        return f"MirrorOperator({self.op!r})"


class MirrorDenoiser(nn.Module):
    """The MDM as a steerdiff denoiser, with the NAMM's maps to leave and enter mirror space.

    Args:
        denoiser: the mirror-space model ``D̃(x̃, σ, cond)``.
        namm: the maps it was trained on.
        trained_on: the forward-map fingerprint the model was trained on (default ``denoiser.namm_fingerprint``, set
            by :func:`train_mirror_model` and :func:`~.io.load_namm`).

    Raises:
        ValueError: the model was not trained in this NAMM's mirror space (no or a different fingerprint), or shapes
            differ.
    """

    def __init__(self, denoiser, namm: NAMM, trained_on: str | None = None):
        super().__init__()
        if not isinstance(namm, NAMM):
            raise TypeError(f"namm must be a steerdiff.constrain.NAMM, got {type(namm).__name__}")
        if not callable(denoiser):
            raise TypeError(f"denoiser must be callable D(x, sigma, cond), got {type(denoiser).__name__}")
        trained_on = trained_on if trained_on is not None else getattr(denoiser, "namm_fingerprint", None)
        if trained_on is None:
            raise ValueError("denoiser: this model was not trained in a NAMM mirror space (it records no forward-map "
                             "fingerprint); decoding its samples with the inverse map would be meaningless. Train it "
                             "with sd.constrain.train_mirror_model(namm, ...) or load a NAMM bundle with load_namm")
        if trained_on != namm.fingerprint:
            raise ValueError(f"denoiser was trained on forward map {trained_on!r}, not on this NAMM's "
                             f"{namm.fingerprint!r}: its mirror space is a different one")
        shape = getattr(denoiser, "sample_shape", None)
        if shape is not None and tuple(shape) != tuple(namm.sample_shape):
            raise ValueError(f"denoiser samples have shape {tuple(shape)}, the maps {tuple(namm.sample_shape)}")
        self.denoiser, self.namm = denoiser, namm
        self.sample_shape = tuple(namm.sample_shape)
        self.num_classes = tuple(getattr(denoiser, "num_classes", ()))
        self.namm_fingerprint = namm.fingerprint

    def forward(self, x: Tensor, sigma, cond: Tensor | None = None) -> Tensor:
        """The mirror-space denoiser ``D̃(x̃, σ, cond)``."""
        return self.denoiser(x, sigma, cond)

    def encode(self, x: Tensor) -> Tensor:
        """``g(x)``."""
        return self.namm.encode(x)

    def decode(self, x: Tensor) -> Tensor:
        """``f(x̃)``."""
        return self.namm.decode(x)

    def sample(self, noise: Tensor, sigmas: Tensor, return_mirror: bool = False, **kwargs):
        """:func:`steerdiff.sample` in mirror space, decoded by ``f`` (same arguments, e.g. ``cond``, ``guidance``).

        Returns:
            Data-space samples (and ``(samples, stats)`` if ``return_stats=True``; ``return_mirror`` adds the raw
            mirror samples as the last element).
        """
        out = _sample(self, noise, sigmas, **kwargs)
        mirror, stats = out if kwargs.get("return_stats") else (out, None)
        with torch.set_grad_enabled(bool(kwargs.get("enable_grad"))):
            x = self.decode(mirror)
        res = (x,) + ((stats,) if stats is not None else ()) + ((mirror,) if return_mirror else ())
        return res[0] if len(res) == 1 else res

    def solve(self, operator: Operator, y: Tensor, method: str = "hr", **kwargs):
        """:func:`steerdiff.inverse.solve` in mirror space with ``A ∘ f``; samples decoded by ``f``.

        The returned :class:`~steerdiff.inverse.result.InverseResult` holds data-space samples;
        ``result.extras["mirror_samples"]`` keeps the mirror-space ones.
        """
        from ..inverse.solve import solve

        res = solve(self, MirrorOperator(operator, self.namm), y, method, **kwargs)
        s = res.samples
        with torch.no_grad():
            flat = s.reshape(-1, *self.sample_shape)
            ok = torch.isfinite(flat.flatten(1)).all(1)
            dec = torch.full_like(flat, float("nan"))
            if ok.any():
                dec[ok] = self.decode(flat[ok])
        extras = {**res.extras, "mirror_samples": s}
        return dataclasses.replace(res, samples=dec.reshape(s.shape), extras=extras)
