"""Perturbation guiders: guidance away from a deliberately degraded pass of the same network (docs/methods/guidance.md,
"Perturbation guiders").

* PAG, Ahn et al., "Self-Rectifying Diffusion Sampling with Perturbed-Attention Guidance" (ECCV 2024), Sec. 3.2:
  the perturbed pass replaces the self-attention map of chosen layers by the identity
  (:func:`steerdiff.models.perturb.perturbed_attention`: UNet self-attention, SD3's joint attention, FLUX's, the
  shipped DiT's ``blocks.<i>.attn``).
* SLG (skip-layer guidance, SD 3.5; STG, Hyung et al., CVPR 2025): chosen transformer blocks skipped
  (:func:`steerdiff.models.perturb.skip_blocks`), with its own step window ``perturb_start``/``perturb_stop``.
* SEG, Hong, "Smoothed Energy Guidance" (NeurIPS 2024), Sec. 3.3: the queries of chosen self-attention layers
  blurred (:func:`steerdiff.models.perturb.blurred_queries`).

With ``D_c``, ``D_u`` the conditional and null predictions and ``D_p`` the perturbed conditional prediction:

    D = D_u + w (D_c - D_u) + s (D_c - D_p)        (w = 1: D_c + s (D_c - D_p), no null pass)

(affine, so the same in D, eps or v). Cost per sample per evaluation: 3 network rows with CFG (a doubled batch and
the perturbed pass), 2 without. diffusers' ``StableDiffusionPAGPipeline`` / ``StableDiffusionXLPAGPipeline``
(``guidance_scale`` = ``w``, ``pag_scale`` = ``s``, ``pag_applied_layers`` = ``layers``) compute the same
(tests/pipelines/test_pipeline_perturbed_guidance.py); their ``pag_adaptive_scale`` is not offered. SD3:
``StableDiffusion3PAGPipeline`` for PAG, ``StableDiffusion3Pipeline(..., skip_guidance_layers=...)`` for SLG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn

from ..core.denoiser import Denoiser
from ..core.guided import cond_and_null
from ..core.sigmas import check_sigmas
from ..models.perturb import (
    blurred_queries,
    find_network,
    perturbed_attention,
    select_blocks,
    select_self_attention,
    skip_blocks,
)
from .base import (
    Guider,
    check_cond,
    check_denoiser_has_null,
    check_real,
    check_x_sigma,
    scale_is,
    scale_rows,
    window_rows,
)
from .registry import register_guider


def _layer_list(layers) -> tuple[str, ...]:
    if isinstance(layers, str):  # the CLI's comma-separated form
        layers = [part.strip() for part in layers.split(",") if part.strip()]
    if not isinstance(layers, Sequence) or not layers or not all(isinstance(x, str) and x for x in layers):
        raise ValueError(f"layers must be layer ids (a list of regular expressions over module names, or one "
                         f"comma-separated string), got {layers!r}")
    return tuple(layers)


class NetworkGuider(Guider):
    """Base of the guiders that change the network itself for a pass (PAG, SLG, SEG, NAG): the network is given
    (``network=``, checked against the guider's layer selection up front) or found inside the denoiser
    (:func:`steerdiff.models.perturb.find_network`, once per denoiser)."""

    _find_options: dict = {}  # keyword arguments of find_network for this guider

    def _bind_network(self, network: nn.Module | None, select, what: str) -> None:
        if network is not None and not isinstance(network, nn.Module):
            raise TypeError(f"network must be {what} (a torch module), got {type(network).__name__}")
        if network is not None:
            select(network)  # refuse layer ids that select nothing, up front
        self.network = network
        self._found: tuple[int, nn.Module] | None = None

    def _network(self, denoiser: Denoiser) -> nn.Module:
        if self.network is not None:
            return self.network
        if self._found is None or self._found[0] != id(denoiser):
            self._found = (id(denoiser), find_network(denoiser, **self._find_options))
        return self._found[1]


@register_guider("pag")
class PAG(NetworkGuider):
    """Perturbed-attention guidance, with CFG at ``scale`` on top (``scale = 1``: PAG alone).

    Args:
        scale: CFG's ``w`` (>= 0; 1: no null pass); a 1-D tensor or list ``[B]`` gives one ``w`` per sample.
        pag_scale: ``s`` >= 0, the weight of ``D_c - D_p`` (diffusers' ``pag_scale``, default 3).
        layers: layer ids selecting self-attention layers (diffusers' ``pag_applied_layers``; default ``("mid",)``):
            regular expressions over module names, or one comma-separated string.
        network: the UNet / transformer to perturb; None: found inside the denoiser
            (:func:`steerdiff.models.perturb.find_network`).
        start, stop, sigmas, enabled: as :class:`~steerdiff.guidance.CFG` (outside the window: the conditional
            model, one row).
    """

    name = "pag"

    def __init__(self, scale: float | Tensor | Sequence[float], pag_scale: float = 3.0,
                 layers: Sequence[str] | str = ("mid",), network: nn.Module | None = None, start: float = 0.0,
                 stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        self.pag_scale = check_real(pag_scale, "pag_scale", 0.0)
        self.layers = _layer_list(layers)
        self._bind_network(network, lambda net: select_self_attention(net, self.layers),
                           "the module to perturb (a UNet or transformer)")

    @property
    def config(self) -> dict:
        return {**super().config, "pag_scale": self.pag_scale, "layers": list(self.layers)}

    @property
    def perturb_scale(self) -> float:
        """``s``, the weight of ``D_c - D_p``."""
        return self.pag_scale

    def _perturbation(self, network: nn.Module) -> AbstractContextManager:
        return perturbed_attention(network, self.layers)

    def _perturb_rows(self, sigma: Tensor, step: int | None = None) -> Tensor | bool:
        """Where the perturbation term is on, within the guider's window (PAG: everywhere)."""
        return True

    def perturbed(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond: Tensor) -> Tensor:
        """The perturbed conditional prediction ``D_p``."""
        with self._perturbation(self._network(denoiser)):
            return denoiser(x, sigma, cond)

    def guide(self, denoiser: Denoiser, x: Tensor, sigma: Tensor, cond, step: int | None = None) -> Tensor:
        who = type(self).__name__
        check_x_sigma(x, sigma, who)
        if isinstance(cond, Tensor):
            cond = check_cond(cond, x, who)
        active = self._active_rows(sigma)
        off = active is False or self.perturb_scale == 0.0
        perturb = False if off else _both(active, self._perturb_rows(sigma, step))
        if perturb is False:
            return super().guide(denoiser, x, sigma, cond, step=step)
        if scale_is(self.scale, 1.0):
            d_cond = denoiser(x, sigma, cond)
            d_cfg = d_cond
        else:
            check_denoiser_has_null(denoiser, who)
            d_cond, d_null = cond_and_null(denoiser, x, sigma, cond)
            d_cfg = _where(active, torch.lerp(d_null, d_cond, scale_rows(self.scale, d_cond)), d_cond)
        return _where(perturb, d_cfg + self.perturb_scale * (d_cond - self.perturbed(denoiser, x, sigma, cond)),
                      d_cfg)

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        """CFG alone (the perturbation off)."""
        return torch.lerp(d_null, d_cond, scale_rows(self.scale, d_cond))


def _both(a: Tensor | bool, b: Tensor | bool) -> Tensor | bool:
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    return a & b.to(a.device)


def _where(mask: Tensor | bool, a: Tensor, b: Tensor) -> Tensor:
    if mask is True:
        return a
    return torch.where(mask.to(a.device).reshape(-1, *([1] * (a.ndim - 1))), a, b)


@register_guider("slg")
class SLG(PAG):
    """Skip-layer guidance (Stability AI's SD 3.5 release; as STG, Hyung et al., "Spatiotemporal Skip Guidance for
    Enhanced Video Diffusion Sampling", CVPR 2025): the perturbed pass skips chosen transformer blocks
    (:func:`steerdiff.models.perturb.skip_blocks`), with CFG at ``scale`` on top:
    ``D = D_u + w (D_c - D_u) + s (D_c - D_p)``.

    Args:
        scale: CFG's ``w`` (1: no null pass; the SLG term still applies, unlike diffusers' SD3 pipeline, which adds
            it only with CFG on).
        slg_scale: ``s`` >= 0 (diffusers' ``skip_layer_guidance_scale``, default 2.8).
        layers: the blocks to skip: ints index the network's ``transformer_blocks`` (or ``blocks``: the shipped
            DiT), as diffusers' ``skip_guidance_layers``; strings select blocks by qualified name (PAG's rule, e.g.
            ``"single_transformer_blocks.3"`` on FLUX, ``"mid"`` on a UNet). Default ``(7, 8, 9)`` (SD 3.5 Medium).
        perturb_start, perturb_stop: the SLG window, diffusers' SD3 rule: the term is added at step indices ``i``
            with ``N * perturb_start < i < N * perturb_stop`` (strict) of an ``N``-step schedule (defaults 0.01 and
            0.2, diffusers' ``skip_layer_guidance_start`` / ``_stop``); separate from the CFG window
            ``start``/``stop`` (outside the SLG window: CFG alone). ``i`` is the sampler's step index where it
            passes one (``sd.sample``, the pipelines: both evaluations of a Heun step share it), else the
            evaluation's sigma placed in the schedule.
        network, start, stop, sigmas, enabled: as :class:`PAG`.
    """

    _find_options = {"blocks": True}
    name = "slg"

    def __init__(self, scale: float | Tensor | Sequence[float], slg_scale: float = 2.8,
                 layers: Sequence[int | str] | str = (7, 8, 9), perturb_start: float = 0.01,
                 perturb_stop: float = 0.2, network: nn.Module | None = None, start: float = 0.0,
                 stop: float = 1.0, sigmas: Tensor | None = None, enabled: bool = True):
        self.perturb_start = check_real(perturb_start, "perturb_start", 0.0, 1.0)
        self.perturb_stop = check_real(perturb_stop, "perturb_stop", self.perturb_start, 1.0)
        self._perturb_window: tuple[float, float] | None = None
        self._n_steps: int | None = None
        Guider.__init__(self, scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)
        self.slg_scale = check_real(slg_scale, "slg_scale", 0.0)
        self.layers = _block_list(layers)
        self._bind_network(network, lambda net: select_blocks(net, self.layers),
                           "the module to perturb (a transformer or UNet)")

    @property
    def config(self) -> dict:
        return {**Guider.config.fget(self), "slg_scale": self.slg_scale, "layers": list(self.layers),
                "perturb_start": self.perturb_start, "perturb_stop": self.perturb_stop}

    @property
    def perturb_scale(self) -> float:
        return self.slg_scale

    def _perturbation(self, network: nn.Module) -> AbstractContextManager:
        return skip_blocks(network, self.layers)

    def set_schedule(self, sigmas: Tensor) -> Guider:
        super().set_schedule(sigmas)
        sig = check_sigmas(sigmas).tolist()
        n = len(sig) - 1
        i_lo = math.floor(n * self.perturb_start) + 1  # first i with i > N * start
        i_hi = math.ceil(n * self.perturb_stop) - 1  # last i with i < N * stop
        self._perturb_window = (math.inf, -math.inf) if i_hi < i_lo else (sig[i_hi], sig[i_lo])
        self._n_steps = n
        return self

    def _perturb_rows(self, sigma: Tensor, step: int | None = None) -> Tensor | bool:
        n = self._n_steps
        if step is not None and n is not None:  # the sampler's step index: diffusers' rule exactly, no host read
            return n * self.perturb_start < step < n * self.perturb_stop
        if self._perturb_window is None:
            raise RuntimeError(f"SLG(perturb_start={self.perturb_start}, perturb_stop={self.perturb_stop}) needs the "
                               "sampling schedule to place its window: sample with sd.sample or a pipeline (which "
                               "pass it), pass sigmas= to the constructor, or call set_schedule(sigmas) first")
        return window_rows(self._perturb_window, sigma)


def _block_list(layers) -> tuple[int | str, ...]:
    if isinstance(layers, str):  # the CLI's comma-separated form; numbers are block indices
        layers = [int(p) if p.strip().lstrip("-").isdigit() else p.strip() for p in layers.split(",") if p.strip()]
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if not isinstance(layers, Sequence) or not layers or not all(
            (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and x) for x in layers):
        raise ValueError(f"layers must be block indices or block names (a list, or one comma-separated string), "
                         f"got {layers!r}")
    return tuple(layers)


@register_guider("seg")
class SEG(PAG):
    """Smoothed Energy Guidance (Hong, "Smoothed Energy Guidance: Guiding Diffusion Models with Reduced Energy
    Curvature of Attention", NeurIPS 2024, Sec. 3.3): the perturbed pass blurs the queries of chosen self-attention
    layers with a Gaussian of std ``seg_blur_sigma`` (``inf``: every query replaced by their mean)
    (:func:`steerdiff.models.perturb.blurred_queries`), with CFG at ``scale`` on top:
    ``D = D_u + w (D_c - D_u) + s (D_c - D_p)``.

    Args:
        scale: CFG's ``w`` (1: no null pass).
        seg_scale: ``s`` >= 0 (diffusers' ``seg_guidance_scale``; default 3.0, the paper's).
        seg_blur_sigma: the blur's std in tokens, > 0 (default ``inf``, the paper's recommended setting).
        layers: self-attention layer ids as :class:`PAG` (default ``("mid",)``, the reference code's UNet choice;
            on SD3 e.g. ``["transformer_blocks.1"]``, on the shipped DiT ``["blocks.1"]``).
        network, start, stop, sigmas, enabled: as :class:`PAG`.
    """

    name = "seg"

    def __init__(self, scale: float | Tensor | Sequence[float], seg_scale: float = 3.0,
                 seg_blur_sigma: float = math.inf, layers: Sequence[str] | str = ("mid",),
                 network: nn.Module | None = None, start: float = 0.0, stop: float = 1.0,
                 sigmas: Tensor | None = None, enabled: bool = True):
        super().__init__(scale, pag_scale=seg_scale, layers=layers, network=network, start=start, stop=stop,
                         sigmas=sigmas, enabled=enabled)
        if isinstance(seg_blur_sigma, (int, float)) and not isinstance(seg_blur_sigma, bool) and \
                seg_blur_sigma == math.inf:
            self.seg_blur_sigma = math.inf
        else:
            self.seg_blur_sigma = check_real(seg_blur_sigma, "seg_blur_sigma", 0.0)
            if not self.seg_blur_sigma > 0:
                raise ValueError(f"seg_blur_sigma must be > 0 (inf: the mean), got {seg_blur_sigma!r}")

    @property
    def seg_scale(self) -> float:
        return self.pag_scale

    @property
    def config(self) -> dict:
        return {**Guider.config.fget(self), "seg_scale": self.seg_scale, "seg_blur_sigma": self.seg_blur_sigma,
                "layers": list(self.layers)}

    def _perturbation(self, network: nn.Module) -> AbstractContextManager:
        return blurred_queries(network, self.layers, self.seg_blur_sigma)
