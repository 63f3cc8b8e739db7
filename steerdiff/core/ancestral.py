"""The Euler ancestral sampler, as k-diffusion's ``sample_euler_ancestral`` (docs/methods/samplers.md).

``euler_ancestral``: an Euler step of the probability-flow ODE down to ``sigma_down`` followed by fresh noise of
  std ``sigma_up`` (``ancestral_split``: DDIM's ``sigma_t(eta)``, Song et al. 2021, eq. 16, in sigma space), so
  ``x' = D + (s_down / s)(x - D) + s_up z``. It is the same update as ``ddim`` at the same ``eta``; it exists under
  the name practitioners use and defaults to ``eta = 1`` (the DDPM posterior's noise, as k-diffusion).
From ``sigma_0 = inf`` (the state is then the unit noise ``eps``) its first step is ``x_1 = D_0 + s_down eps + s_up z``
with ``s_up = eta sigma_1``, ``s_down = sigma_1 sqrt(1 - eta^2)`` (at ``eta = 1`` ``x_1 = D_0 + sigma_1 z``).

The linear multistep sampler (``lms``) that shared this module is :mod:`steerdiff.core.lms`; its names are still
importable from here for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import math
import warnings

from torch import Tensor

from .calls import emit
from .dpm_solver import check_eta, state_scale
from .noise import SampleNoise
from .registry import register_sampler
from .sampling import Model, X0Corrector, ancestral_split, denoise_step, step_range


@register_sampler("euler_ancestral", inf_start=True, nfe=lambda steps: steps, stochastic=lambda eta: eta > 0, eta=True,
                  default_eta=1.0, corrector=True)
def sample_euler_ancestral(
    model: Model, x: Tensor, sigmas: list[float], *, callback=None, progress=False, noise=None, eta: float = 1.0,
    x0_corrector: X0Corrector | None = None, **_,
) -> Tensor:
    """Euler ancestral steps (k-diffusion's ``sample_euler_ancestral``); NFE = ``len(sigmas) - 1``.

    ``x' = D + (s_down / s)(x - D) + s_up z`` with ``(s_down, s_up)`` from :func:`ancestral_split` and fresh
    per-sample noise ``z``; no noise on the last step to sigma = 0. ``eta = 0`` is the Euler sampler.
    """
    eta = check_eta(eta)
    noise = noise or SampleNoise(None)
    for i in step_range(sigmas, progress, "euler_ancestral"):
        s, s_next = sigmas[i], sigmas[i + 1]
        x, d = denoise_step(model, x, s, i, x0_corrector)
        emit(callback, i, s, s_next, x, d)
        x = euler_ancestral_step(x, d, s, s_next, eta, noise)
    return x


def euler_ancestral_step(x: Tensor, denoised: Tensor, s: float, s_next: float, eta: float,
                         noise: SampleNoise) -> Tensor:
    """One Euler ancestral step (k-diffusion's arithmetic): ``D + (s_down / s)(x - D) + s_up z`` with
    :func:`ancestral_split`; from ``s = inf`` (state = the unit noise) ``D + s_down x + s_up z``."""
    s_down, s_up = ancestral_split(s, s_next, eta)
    a = state_scale(s, s_down)  # s_down / s; at s = inf the state is eps and its weight s_down
    x = denoised + (x - denoised) * a if not math.isinf(s) else denoised + x * a
    if s_up > 0:
        x = x + noise.randn_like(x) * s_up
    return x


_MOVED_TO_LMS = ("LMS_MAX_ORDER", "lms_coefficients", "sample_lms")


def __getattr__(name: str):
    # The LMS names moved to steerdiff.core.lms (issue 34); the old path re-exports them for one release.
    if name in _MOVED_TO_LMS:
        warnings.warn(f"steerdiff.core.ancestral.{name} is deprecated: import it from steerdiff.core.lms",
                      DeprecationWarning, stacklevel=2)
        from . import lms

        return getattr(lms, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
