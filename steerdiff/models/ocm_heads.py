"""The OCM covariance heads: networks predicting the diagonal of the posterior covariance of one frozen denoiser
(Ou et al., "Improving Probabilistic Diffusion Models With Optimal Diagonal Covariance Matching", ICLR 2025,
Sec. 3; docs/methods/ocm.md, "Heads" and "Parameterisations"). The OCM objective that trains them (the Hutchinson
target) is :mod:`steerdiff.covariance.target`; the samplers that use them are :mod:`steerdiff.covariance.kernel`.

A head predicts ``c(x, sigma) ~= diag Cov[x0 | x]``. Two parameterisations of its output, same minimiser:

* ``direct`` (default): the head predicts ``u ~= sigma^2 diag(J) / c_out^2``, ``c = c_out^2 u`` with
  ``c_out^2 = sigma^2 sd^2 / (sigma^2 + sd^2)``;
* ``hess`` (code-faithful): the head predicts ``g ~= diag(J) - 1``, ``c = sigma^2 (1 + g)``;
* ``softplus`` (positive by construction; steerdiff, issue 40): the head predicts ``h`` with
  ``u = softplus(h + ln(e - 1)) ~= sigma^2 diag(J) / c_out^2`` and ``c = c_out^2 u > 0``. Same target and loss as
  ``direct`` (on ``u``), so the same minimiser wherever the true ``c`` is positive; zero init gives ``u = 1``, i.e.
  ``c = c_out^2``, the exact posterior variance of ``N(0, sd^2)`` data.

Two architectures:

* :class:`InputHead`: a small MLP on ``[c_in x, log(sigma)/4]`` for black-box denoisers;
* :class:`TrunkHead`: a head on the frozen trunk's last features, read with a forward pre-hook on one submodule of
  the denoiser (steerdiff's default for its UNet; "Heads"); it costs no extra network call at sampling time.

The registered class names (``InputHead``, ``TrunkHead``) are those in shipped ``config.json`` files
(``digits_ocm``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.denoiser import append_dims
from .io import register_model

PARAMS = ("direct", "hess", "softplus")
SOFTPLUS_SHIFT = math.log(math.e - 1)  # softplus(0 + shift) = 1: a zero-initialised head starts at c = c_out^2


def cout2(sigma: Tensor, sigma_data: float) -> Tensor:
    """EDM ``c_out^2 = sigma^2 sd^2 / (sigma^2 + sd^2)`` (the ``direct`` parameterisation's scale)."""
    return sigma**2 * sigma_data**2 / (sigma**2 + sigma_data**2)


def check_param(param: str) -> str:
    if param not in PARAMS:
        raise ValueError(f"param must be one of {PARAMS}, got {param!r}")
    return param


def regression_output(out: Tensor, param: str) -> Tensor:
    """The head output in the space of its regression target (:func:`steerdiff.covariance.target.ocm_target`):
    ``softplus(h + ln(e - 1))`` for ``softplus``, the raw output itself for ``direct`` and ``hess``."""
    return F.softplus(out + SOFTPLUS_SHIFT) if param == "softplus" else out


def output_to_cov(out: Tensor, sigma: Tensor, param: str, sigma_data: float) -> Tensor:
    """Raw (unclamped) covariance diagonal ``c`` from a head output (docs/methods/ocm.md, "Parameterisations")."""
    s = append_dims(sigma.to(out.dtype), out.ndim)
    if param == "hess":
        return s**2 * (1 + out)
    return cout2(s, sigma_data) * regression_output(out, param)


def cov_to_output(c: Tensor, sigma: Tensor, param: str, sigma_data: float) -> Tensor:
    """Inverse of :func:`output_to_cov`: the head output that represents covariance ``c``."""
    s = append_dims(sigma.to(c.dtype), c.ndim)
    if param == "hess":
        return c / s**2 - 1
    u = c / cout2(s, sigma_data)
    if param == "softplus":  # inverse softplus, log(expm1(u)); -inf where c = 0 (not representable), nan below
        return torch.where(u > 20, u, torch.expm1(u).log()) - SOFTPLUS_SHIFT
    return u



class OCMHead(nn.Module):
    """Base of the learned heads: parameterisation, data scale and the covariance bound.

    Attributes:
        param: ``direct``, ``hess`` or ``softplus`` (docs/methods/ocm.md, "Parameterisations").
        sigma_data: data scale used by ``direct``'s ``c_out^2`` and the input scaling.
        c_max: upper clamp of ``c`` at use (``((b - a)/2)^2`` for data in ``[a, b]``; ``inf`` if unbounded).
        data_range: ``(a, b)`` the data lie in, or None; the OCM samplers clip ``D`` to it (the official
            ``clip_x0``).
        feature_module: name of the denoiser submodule whose *input* is the trunk feature (None: no trunk).
    """

    feature_module: str | None = None
    last_step_var_max: float | None = None  # sampling default for images (the official last-step clip); not a weight

    def __init__(self, param: str, sigma_data: float, data_range: tuple[float, float] | None):
        super().__init__()
        self.param = check_param(param)
        if not sigma_data > 0:
            raise ValueError(f"sigma_data must be positive, got {sigma_data}")
        self.sigma_data = float(sigma_data)
        if data_range is not None:
            a, b = (float(v) for v in data_range)
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise ValueError(f"data_range must be a finite (low, high) with low < high, got {data_range}")
            data_range = (a, b)
        self.data_range = data_range
        self.c_max = math.inf if data_range is None else ((data_range[1] - data_range[0]) / 2) ** 2

    def _scaled_inputs(self, x: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
        s = sigma.to(x.dtype)
        x_in = x / append_dims((s**2 + self.sigma_data**2).sqrt(), x.ndim)
        return x_in, s.log() / 4

    def raw_output(self, x: Tensor, sigma: Tensor, features: Tensor | None) -> Tensor:
        raise NotImplementedError

    def covariance(self, x: Tensor, sigma: Tensor, features: Tensor | None = None) -> Tensor:
        """Raw (unclamped) ``c(x, sigma)`` in ``x``'s dtype; clamping happens in the sampler ("Clamps and clips")."""
        p = next(self.parameters())
        out = self.raw_output(x.to(p.dtype), sigma.to(p.dtype), None if features is None else features.to(p.dtype))
        return output_to_cov(out.to(x.dtype), sigma.to(x.dtype), self.param, self.sigma_data)

    @contextlib.contextmanager
    def capture(self, denoiser) -> Iterator[dict]:
        """While active, ``store["features"]`` holds the input of ``denoiser.<feature_module>`` of the last call."""
        store: dict = {"features": None}
        if self.feature_module is None:
            yield store
            return
        if not isinstance(denoiser, nn.Module):
            raise TypeError(f"this head reads the trunk features of a torch module; got {type(denoiser).__name__}")
        try:
            module = denoiser.get_submodule(self.feature_module)
        except AttributeError as e:
            raise ValueError(f"denoiser has no submodule {self.feature_module!r} to read trunk features from") from e

        def hook(_mod, args):
            store["features"] = args[0]

        handle = module.register_forward_pre_hook(hook)
        try:
            yield store
        finally:
            handle.remove()


@register_model()
class InputHead(OCMHead):
    """MLP head on ``[x / sqrt(sigma^2 + sd^2), log(sigma)/4]`` for any black-box denoiser (the mixtures' head).

    Args:
        dim: flattened data dimension.
        hidden: width (128 in the head-accuracy checks).
        depth: hidden layers (3 there), SiLU activations; the output layer is zero-initialised.
        param, sigma_data, data_range: see :class:`OCMHead`.
    """

    def __init__(self, dim: int, hidden: int = 128, depth: int = 3, param: str = "direct", sigma_data: float = 1.0,
                 data_range: tuple[float, float] | None = None):
        super().__init__(param, sigma_data, data_range)
        if dim < 1 or hidden < 1 or depth < 1:
            raise ValueError(f"dim, hidden and depth must be >= 1, got {dim}, {hidden}, {depth}")
        self.config = {"dim": dim, "hidden": hidden, "depth": depth, "param": param, "sigma_data": self.sigma_data,
                       "data_range": None if data_range is None else list(self.data_range)}
        layers, width = [], dim + 1
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.out = nn.Linear(hidden, dim)
        nn.init.zeros_(self.out.weight)  # zero init (as the official head): c = 0 (direct), sigma^2 (hess) or
        nn.init.zeros_(self.out.bias)  # c_out^2 (softplus)

    def raw_output(self, x: Tensor, sigma: Tensor, features: Tensor | None = None) -> Tensor:
        x_in, c_noise = self._scaled_inputs(x, sigma)
        h = torch.cat([x_in.flatten(1), c_noise[:, None]], 1)
        return self.out(self.body(h)).reshape(x.shape)


@register_model()
class TrunkHead(OCMHead):
    """Head on the frozen trunk's last features (as the official head on the UNet's last feature map), plus the
    scaled input and ``log(sigma)/4``.

    ``kind="conv"`` for image trunks (features ``[B, F, H, W]``): GroupNorm -> SiLU, concatenated with
    ``[c_in x, c_noise]``, then ``depth`` 3x3 convs of width ``hidden`` with SiLU and a zero-initialised 3x3 conv to
    the image channels. ``kind="linear"`` for flat trunks (features ``[B, F]``): LayerNorm -> SiLU, concatenated
    with the inputs, ``depth`` Linear + SiLU, zero-initialised Linear to ``dim``.

    Args:
        feature_module: the denoiser submodule whose input is the feature map (``net.norm_out`` for
            :class:`~steerdiff.models.UNet`, ``net.out`` for :class:`~steerdiff.models.MLP`).
        feature_dim: channels (conv) or width (linear) of those features.
        dim: image channels (conv) or flat data dimension (linear).
    """

    def __init__(self, feature_module: str, feature_dim: int, dim: int, kind: str = "conv", hidden: int = 64,
                 depth: int = 2, param: str = "direct", sigma_data: float = 0.5,
                 data_range: tuple[float, float] | None = None):
        super().__init__(param, sigma_data, data_range)
        if kind not in ("conv", "linear"):
            raise ValueError(f"kind must be 'conv' or 'linear', got {kind!r}")
        if min(feature_dim, dim, hidden, depth) < 1:
            raise ValueError("feature_dim, dim, hidden and depth must be >= 1")
        self.config = {"feature_module": feature_module, "feature_dim": feature_dim, "dim": dim, "kind": kind,
                       "hidden": hidden, "depth": depth, "param": param, "sigma_data": self.sigma_data,
                       "data_range": None if data_range is None else list(self.data_range)}
        self.feature_module = feature_module
        self.kind = kind
        if kind == "conv":
            self.norm = nn.GroupNorm(math.gcd(feature_dim, 8), feature_dim)
            layers, width = [], feature_dim + dim + 1
            for _ in range(depth):
                layers += [nn.Conv2d(width, hidden, 3, padding=1), nn.SiLU()]
                width = hidden
            self.out = nn.Conv2d(hidden, dim, 3, padding=1)
        else:
            self.norm = nn.LayerNorm(feature_dim)
            layers, width = [], feature_dim + dim + 1
            for _ in range(depth):
                layers += [nn.Linear(width, hidden), nn.SiLU()]
                width = hidden
            self.out = nn.Linear(hidden, dim)
        self.body = nn.Sequential(*layers)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def raw_output(self, x: Tensor, sigma: Tensor, features: Tensor | None) -> Tensor:
        if features is None:
            raise ValueError("TrunkHead needs the trunk features: run the denoiser inside head.capture(denoiser)")
        if features.shape[0] != x.shape[0]:
            raise ValueError(
                f"trunk features have batch {features.shape[0]} but x has {x.shape[0]} (a guided/doubled batch? "
                "the head is the Jacobian of the unguided denoiser only)"
            )
        x_in, c_noise = self._scaled_inputs(x, sigma)
        # frozen trunk: detached, so no gradient reaches it and the head's backward needs none of the denoiser's
        # graph (the one the Hutchinson VJPs use)
        h = F.silu(self.norm(features.detach()))
        if self.kind == "conv":
            extra = append_dims(c_noise, 4).expand(x.shape[0], 1, *x.shape[2:])
            h = torch.cat([h, x_in, extra], 1)
        else:
            h = torch.cat([h, x_in.flatten(1), c_noise[:, None]], 1)
        return self.out(self.body(h)).reshape(x.shape)


def unet_trunk_head(denoiser: nn.Module, **kwargs) -> TrunkHead:
    """A conv :class:`TrunkHead` for an ``EDMPrecond(UNet)`` denoiser (features: input of ``net.norm_out``)."""
    net = getattr(denoiser, "net", None)
    norm = getattr(net, "norm_out", None)
    if not isinstance(norm, nn.GroupNorm):
        raise TypeError("unet_trunk_head needs an EDMPrecond around a UNet (with net.norm_out)")
    kwargs.setdefault("sigma_data", float(getattr(denoiser, "sigma_data", 0.5)))
    return TrunkHead("net.norm_out", norm.num_channels, net.sample_shape[0], kind="conv", **kwargs)
