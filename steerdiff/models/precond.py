"""EDM preconditioning (Karras et al. 2022, "Elucidating the Design Space", Table 1): network -> denoiser.

``D(x, sigma, cond) = c_skip x + c_out F(c_in x, c_noise, cond)`` with

* ``c_skip = sd^2 / (sigma^2 + sd^2)``, ``c_out = sigma sd / sqrt(sigma^2 + sd^2)``,
* ``c_in = 1 / sqrt(sigma^2 + sd^2)``, ``c_noise = ln(sigma) / 4``, ``sd = sigma_data``.

This is the only place in steerdiff where preconditioning lives (the preconditioner is the boundary, as in NVlabs/edm;
docs/methods/conventions.md, "Preconditioning"); backbones are raw networks ``F(x_in, c_noise, cond)`` and never see
``sigma`` directly.
"""

from __future__ import annotations

import math
import numbers

from torch import Tensor, nn

from ..core.denoiser import append_dims, as_sigma_batch
from .io import build_model, model_spec, register_model

# The top of the noise range an EDMPrecond declares unless its config says otherwise (EDMPrecond: ``sigma_max``).
DEFAULT_SIGMA_MAX = 160.0


def edm_scalings(sigma: Tensor, sigma_data: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(c_skip, c_out, c_in, c_noise)`` for per-sample noise levels ``sigma`` (Karras et al. 2022, Table 1)."""
    s2 = sigma**2 + sigma_data**2
    c_skip = sigma_data**2 / s2
    c_out = sigma * sigma_data / s2.sqrt()
    c_in = 1.0 / s2.sqrt()
    c_noise = sigma.log() / 4
    return c_skip, c_out, c_in, c_noise


@register_model()
class EDMPrecond(nn.Module):
    """A denoiser ``D(x, sigma, cond=None) -> x0_hat`` around a raw backbone ``F(x_in, c_noise, cond)``.

    The scalings are computed in the dtype of ``x`` (samplers may run their state in float64), the backbone in
    the dtype of its parameters, and the output is returned in the dtype of ``x``.

    Args:
        net: the backbone (a registered module with ``sample_shape``), or its spec ``{"class", "config"}``.
        sigma_data: standard deviation of the data (0.5 for data in [-1, 1], the EDM value).
        sigma_max: the top of the noise range the model is sampled over, its ``sigma_range[1]``;
            :func:`steerdiff.sample` refuses a schedule above it (docs/methods/conventions.md, "Preconditioning").
            The default, 160, holds the schedules an EDM-trained model is sampled with: EDM's Karras schedule to 80
            (Karras et al. 2022, Table 1) and the DDPM linear table to 157.4 (Ho et al. 2020; DDIM and OCM start
            there). EDM training draws ``ln sigma ~ N(-1.2, 1.2^2)``: 160 is 5.2 standard deviations up, and far
            above it (1e6: digits of class accuracy 0.05) the network only extrapolates.

    Attributes:
        sample_shape: per-sample shape ``x.shape[1:]`` the denoiser expects (samplers check noise against it).
        num_classes: values per condition slot, ``()`` if unconditional.
    """

    def __init__(self, net: nn.Module | dict, sigma_data: float = 0.5, sigma_max: float = DEFAULT_SIGMA_MAX):
        super().__init__()
        if isinstance(net, dict):
            net = build_model(net)
        if not isinstance(net, nn.Module) or not hasattr(net, "sample_shape"):
            raise TypeError("net must be a backbone module with a sample_shape attribute, or its config dict")
        for name, value in (("sigma_data", sigma_data), ("sigma_max", sigma_max)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a positive finite number, got {type(value).__name__} {value!r}")
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        self.net = net
        self.sigma_data = float(sigma_data)
        self.sigma_max = float(sigma_max)
        self.sample_shape: tuple[int, ...] = tuple(net.sample_shape)
        self.num_classes: tuple[int, ...] = tuple(getattr(net, "num_classes", ()))

    @property
    def sigma_range(self) -> tuple[float, float]:
        """``(0, sigma_max)``: the levels the model was trained and is sampled for (``sigma_max = 160`` by default).

        Above ``sigma_max`` the network extrapolates (a schedule from 1e6 gives digits of class accuracy 0.05), so
        :func:`steerdiff.sample` refuses it, naming ``sigma_max``; ``inf`` (pure noise, a flow schedule's start) is
        refused too, since ``c_noise = ln(sigma) / 4`` is infinite there. No lower bound: as ``sigma -> 0``,
        ``c_skip -> 1`` and ``c_out -> 0``, so ``D(x) -> x``, the exact limit, whatever the network does."""
        return 0.0, self.sigma_max

    @property
    def config(self) -> dict:
        """Constructor kwargs as JSON: the backbone nested as its own ``{"class", "config"}`` spec."""
        config = {"net": model_spec(self.net), "sigma_data": self.sigma_data}
        # The default is left out, so configs (and the fingerprints of the covariance heads trained for a model,
        # which hash them) read as before.
        if self.sigma_max != DEFAULT_SIGMA_MAX:
            config["sigma_max"] = self.sigma_max
        return config

    def forward(self, x: Tensor, sigma: Tensor | float, cond: Tensor | None = None) -> Tensor:
        """Denoise ``x: [B, *sample_shape]`` at noise levels ``sigma: [B]`` (a scalar is broadcast); sigma > 0."""
        if tuple(x.shape[1:]) != self.sample_shape or x.ndim < 2:
            raise ValueError(f"x must have shape [B, {', '.join(map(str, self.sample_shape))}], got {tuple(x.shape)}")
        sigma = as_sigma_batch(sigma, x)
        c_skip, c_out, c_in, c_noise = edm_scalings(sigma, self.sigma_data)
        param = next(self.net.parameters(), None)  # a backbone may hold no float parameter (a fully quantized one)
        net_dtype = x.dtype if param is None or not param.is_floating_point() else param.dtype
        f = self.net((append_dims(c_in, x.ndim) * x).to(net_dtype), c_noise.to(net_dtype), cond)
        return append_dims(c_skip, x.ndim) * x + append_dims(c_out, x.ndim) * f.to(x.dtype)
