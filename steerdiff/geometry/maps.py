"""The maps whose local geometry is measured ("What Secrets Do Your Manifolds Hold?", Humayun et al., ICLR 2025;
docs/methods/geometry.md "Which map").

* ``"generator"`` (default): ``z -> x0`` through a fixed deterministic sampler, ``x_T = sigma_max z`` (unit-variance
  latent), EDM-DDIM (eta = 0) on the Karras grid ``karras(20, 0.002, 40, rho=7)`` unless told otherwise, a fixed
  condition and optional guidance. A sampler built from a ReLU denoiser is continuous piecewise-linear in ``z``.
* ``"denoiser"``: ``x -> D(x, sigma, c)`` at one fixed ``sigma``.
* ``"decoder"``: any callable ``z -> x`` (a VAE/GAN decoder, a plain network, a function).

Every map is a callable on a batch ``[B, *in_shape] -> [B, *out_shape]`` (rows independent) with ``modules()``,
the networks whose activation units the complexity descriptor delta counts, ``to(dtype)`` (a copy in that dtype)
and ``describe()`` (what to state with any number: the map, sigma grid, steps).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..core.registry import SAMPLERS
from ..core.sampling import sample
from ..core.sigmas import check_sigmas, karras

MAP_KINDS = ("generator", "denoiser", "decoder")
# the grid of the digits protocol (docs/methods/geometry.md "Which map")
DEFAULT_GRID = {"steps": 20, "sigma_min": 0.002, "sigma_max": 40.0, "rho": 7.0}


def _modules_of(obj) -> list[nn.Module]:
    """The ``nn.Module`` objects reachable from ``obj`` (itself, or a ``denoiser`` / ``net`` / ``reward`` attribute)."""
    if isinstance(obj, nn.Module):
        return [obj]
    out = []
    for name in ("denoiser", "net", "model", "reward"):
        inner = getattr(obj, name, None)
        if isinstance(inner, nn.Module):
            out.append(inner)
    return out


def _cast(obj, dtype: torch.dtype):
    """A copy of ``obj`` in ``dtype`` when it is a module (its floating parameters converted), else ``obj``."""
    if isinstance(obj, nn.Module):
        return copy.deepcopy(obj).to(dtype)
    return obj


def _fixed_cond(cond, batch: int, device) -> Tensor | None:
    if cond is None:
        return None
    c = torch.as_tensor(cond, device=device)
    if c.dtype.is_floating_point or c.dtype == torch.bool:
        raise ValueError(f"cond must be an integer label (or a 1-D integer tensor of slots), got dtype {c.dtype}")
    if c.ndim > 1:
        raise ValueError(f"cond is one fixed condition for the whole map: an int or a 1-D tensor of slots, got shape "
                         f"{tuple(c.shape)}")
    return c.long().expand(batch) if c.ndim == 0 else c.long().expand(batch, c.shape[0])


class GeneratorMap:
    """``G(z) = sample(denoiser, z, sigmas, method)``: the latent-to-image map of a deterministic sampler (map
    ``"generator"``).

    Args:
        denoiser: ``D(x, sigma, cond)``.
        sigmas: the decreasing grid ending in 0; default ``karras(20, 0.002, 40, rho=7)``.
        method: a registered sampler that is deterministic (``ddim`` with eta 0, ``euler``, ``heun``, ...).
        cond: one fixed condition (an int label, or a 1-D tensor of slots) for every sample, or None.
        guidance: a guider (e.g. :class:`steerdiff.guidance.RewardGuidance`); the condition then defaults to null.
        eta: only ``0`` is accepted for ``ddim`` (a stochastic sampler is not a map of ``z``; docs/methods/geometry.md
            "Pitfalls").

    Raises:
        ValueError: a stochastic sampler, or a grid that is not a valid schedule.
    """

    kind = "generator"

    def __init__(self, denoiser: Callable, sigmas: Tensor | None = None, method: str = "ddim", cond=None,
                 guidance=None):
        if not callable(denoiser):
            raise TypeError(f"denoiser must be a callable D(x, sigma, cond), got {type(denoiser).__name__}")
        spec = SAMPLERS.get(method)
        if spec.stochastic(0.0) or spec.required:  # samplers with an eta run at eta = 0
            raise ValueError(f"method={method!r} is stochastic or needs extra inputs: the generator map must be a "
                             "deterministic function of z (use 'ddim' (eta 0), 'euler' or 'heun'; "
                             "docs/methods/geometry.md, 'Which map')")
        self.denoiser = denoiser
        self.sigmas = check_sigmas(karras(**DEFAULT_GRID) if sigmas is None else sigmas).double()
        if math.isinf(float(self.sigmas[0])):
            raise ValueError("sigmas[0] must be finite for the generator map (x_T = sigma_max z)")
        self.method = method
        self.cond = cond
        self.guidance = guidance

    def __call__(self, z: Tensor) -> Tensor:
        cond = _fixed_cond(self.cond, z.shape[0], z.device)
        if self.guidance is not None and cond is None:
            cond = torch.full((z.shape[0],), -1, dtype=torch.long, device=z.device)  # all-null: guiders need cond
        eta = 0.0 if SAMPLERS.get(self.method).eta else None
        return sample(_GradChecked(self.denoiser), z, self.sigmas.to(z.device), method=self.method, cond=cond,
                      guidance=self.guidance, enable_grad=True, eta=eta)

    def modules(self) -> list[nn.Module]:
        return _modules_of(self.denoiser)

    def to(self, dtype: torch.dtype) -> GeneratorMap:
        out = copy.copy(self)
        out.denoiser = _cast(self.denoiser, dtype)
        if self.guidance is not None and isinstance(getattr(self.guidance, "reward", None), nn.Module):
            out.guidance = copy.copy(self.guidance)
            out.guidance.reward = _cast(self.guidance.reward, dtype)
        return out

    def describe(self) -> dict:
        s = self.sigmas.tolist()
        return {"map": "generator", "method": self.method, "steps": len(s) - 1, "sigma_max": s[0],
                "sigma_min": s[-2] if len(s) > 1 else s[0], "sigmas": s,
                "cond": None if self.cond is None else torch.as_tensor(self.cond).tolist(),
                "guidance": None if self.guidance is None else repr(self.guidance), "latent": "x_T = sigma_max * z"}


class _GradChecked:
    """A denoiser that refuses to drop the graph: an input that requires grad must give an output that does (a
    denoiser run under ``no_grad`` or through numpy would otherwise leave the sampler's Jacobian silently wrong)."""

    def __init__(self, denoiser: Callable):
        self.denoiser = denoiser

    def __call__(self, x: Tensor, sigma: Tensor, cond=None) -> Tensor:
        out = self.denoiser(x, sigma, cond)
        if x.requires_grad and torch.is_grad_enabled() and not (isinstance(out, Tensor) and out.requires_grad):
            raise ValueError("G: the denoiser's output is not differentiable in its input (run under no_grad, "
                             "detached or computed outside torch), so the sampler map is not differentiable in z")
        return out

    def __getattr__(self, name: str):
        if name == "denoiser":
            raise AttributeError(name)
        return getattr(self.denoiser, name)


class DenoiserMap:
    """``x -> D(x, sigma, cond)`` at one fixed noise level (map ``"denoiser"``).

    Raises:
        ValueError: ``sigma`` not a positive finite number.
    """

    kind = "denoiser"

    def __init__(self, denoiser: Callable, sigma: float, cond=None):
        if not callable(denoiser):
            raise TypeError(f"denoiser must be a callable D(x, sigma, cond), got {type(denoiser).__name__}")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be a positive finite number for map_kind='denoiser', got {sigma!r}")
        self.denoiser = denoiser
        self.sigma = float(sigma)
        self.cond = cond

    def __call__(self, x: Tensor) -> Tensor:
        cond = _fixed_cond(self.cond, x.shape[0], x.device)
        sig = torch.full((x.shape[0],), self.sigma, dtype=x.dtype, device=x.device)
        return self.denoiser(x, sig, cond)

    def modules(self) -> list[nn.Module]:
        return _modules_of(self.denoiser)

    def to(self, dtype: torch.dtype) -> DenoiserMap:
        out = copy.copy(self)
        out.denoiser = _cast(self.denoiser, dtype)
        return out

    def describe(self) -> dict:
        return {"map": "denoiser", "sigma": self.sigma,
                "cond": None if self.cond is None else torch.as_tensor(self.cond).tolist()}


class DecoderMap:
    """Any callable ``z -> x`` on batches (map ``"decoder"``): a decoder, a network, a plain function."""

    kind = "decoder"

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"G must be a callable z -> x on batches, got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, z: Tensor) -> Tensor:
        return self.fn(z)

    def modules(self) -> list[nn.Module]:
        return _modules_of(self.fn)

    def to(self, dtype: torch.dtype) -> DecoderMap:
        return DecoderMap(_cast(self.fn, dtype))

    def describe(self) -> dict:
        return {"map": "decoder", "fn": type(self.fn).__name__}


GeometryMap = GeneratorMap | DenoiserMap | DecoderMap


def as_map(G, map_kind: str = "generator", *, sigmas: Tensor | None = None, method: str = "ddim", cond=None,
           guidance=None, sigma: float | None = None) -> GeometryMap:
    """The map of ``map_kind`` built on ``G`` (a denoiser for ``generator``/``denoiser``, the map itself for
    ``decoder``); a map object passes through unchanged.

    Raises:
        ValueError: an unknown ``map_kind``, or ``map_kind="denoiser"`` without ``sigma``.
    """
    if isinstance(G, (GeneratorMap, DenoiserMap, DecoderMap)):
        return G
    if map_kind not in MAP_KINDS:
        raise ValueError(f"map_kind must be one of {MAP_KINDS}, got {map_kind!r}")
    if map_kind == "generator":
        return GeneratorMap(G, sigmas=sigmas, method=method, cond=cond, guidance=guidance)
    if map_kind == "denoiser":
        if sigma is None:
            raise ValueError("map_kind='denoiser' needs sigma= (the fixed noise level of x -> D(x, sigma))")
        return DenoiserMap(G, sigma, cond=cond)
    return DecoderMap(G)
