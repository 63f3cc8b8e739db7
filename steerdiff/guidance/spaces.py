"""The prediction spaces a guider may combine in: denoised ``D``, noise ``eps`` and flow velocity ``v``
(docs/methods/guidance.md, "Prediction spaces").

steerdiff's denoiser returns ``D = E[x0 | x]`` for ``x = x0 + sigma eps`` (docs/methods/conventions.md). CFG is
affine, so it gives the same result in every space; the guiders of 2025 (CFG-Zero*, TCFG, MAMBO-G, FDG) are not:
their optimised scale, projection or norm ratio depends on the space. diffusers applies them to the network's own
output: ``eps`` for SD 1.x / SDXL (epsilon prediction), ``v`` for SD3 / FLUX (flow matching). The conversions:

* ``eps = (x - D) / sigma``, ``D = x - sigma eps``;
* ``v = eps - x0`` of the flow ``x_t = (1 - t) x0 + t eps`` with ``t = sigma / (1 + sigma)`` and
  ``x_t = x / (1 + sigma)``: ``v = (x - D) / sigma - D``, ``D = x_t - t v``.

At ``sigma = inf`` (a flow schedule's first level) the state holds the unit noise itself (``x = eps``, ``t = 1``):
``v = x - D`` and ``D = x - v``; ``eps`` is ``x`` whatever ``D`` is, so ``D`` cannot be recovered from it there:
:func:`from_space` returns NaN rows for ``space="eps"`` at that level, and the guiders refuse such a schedule up
front (:func:`check_schedule_space`, from the host-side schedule, once per trajectory). Samplers never evaluate at
``sigma = 0``. Everything is computed in float64 and returned in ``D``'s dtype, without host synchronisation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Guider

SPACES = ("D", "eps", "v")


def check_prediction_space(space: str, name: str = "space") -> str:
    """``space`` if it is one of :data:`SPACES`, else a ValueError naming ``name``."""
    if space not in SPACES:
        raise ValueError(f"{name} must be one of {list(SPACES)} (denoised x0, noise eps, or flow velocity v = eps - "
                         f"x0), got {space!r}")
    return space


def _sigma_rows(sigma: Tensor, like: Tensor) -> Tensor:
    return sigma.to(device=like.device, dtype=torch.float64).reshape(-1, *([1] * (like.ndim - 1)))


def to_space(d: Tensor, x: Tensor, sigma: Tensor, space: str) -> Tensor:
    """The prediction ``D`` at ``(x, sigma)`` expressed in ``space`` (float64)."""
    d64 = d.double()
    if space == "D":
        return d64
    x64, s = x.double(), _sigma_rows(sigma, d)
    inf = torch.isinf(s)
    finite_s = torch.where(inf, torch.ones_like(s), s)
    eps = torch.where(inf, x64, (x64 - d64) / finite_s)
    if space == "eps":
        return eps
    return eps - d64


def from_space(p: Tensor, x: Tensor, sigma: Tensor, space: str, dtype: torch.dtype) -> Tensor:
    """``D`` from a prediction ``p`` in ``space`` at ``(x, sigma)``, in ``dtype`` (``space="eps"`` at ``sigma =
    inf``: NaN, ``D`` is not determined by ``eps`` there)."""
    if space == "D":
        return p.to(dtype)
    x64, s = x.double(), _sigma_rows(sigma, p)
    inf = torch.isinf(s)
    if space == "eps":
        return torch.where(inf, torch.full_like(x64, float("nan")), x64 - torch.where(inf, 0.0, s) * p).to(dtype)
    finite_s = torch.where(inf, torch.ones_like(s), s)
    t = torch.where(inf, torch.ones_like(s), finite_s / (1 + finite_s))
    x_t = torch.where(inf, x64, x64 / (1 + finite_s))
    return (x_t - t * p).to(dtype)


def check_schedule_space(sigmas: list[float], space: str, who: str) -> None:
    """Refuse ``space="eps"`` on a schedule that starts at ``sigma = inf`` (from the host-side schedule)."""
    if space == "eps" and sigmas and sigmas[0] == float("inf"):
        raise ValueError(f"{who}(space='eps') cannot return D at sigma = inf (a flow schedule's first level: the state "
                         "is the noise itself there): use space='v' (the flow velocity) or start at a finite sigma")


def zero_prediction(x: Tensor, sigma: Tensor, space: str, dtype: torch.dtype) -> Tensor:
    """The ``D`` whose prediction in ``space`` is zero: ``0`` (``D``), ``x`` (``eps``: the state does not move
    under an Euler step) or ``x_t`` (``v``: the flow state does not move). CFG-Zero*'s zero-init."""
    zero = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    return from_space(zero, x, sigma, space, dtype)


class SpaceGuider(Guider):
    """A guider that combines the conditional and null predictions in a prediction space (``"D"``, ``"eps"`` or
    ``"v"``): subclasses implement :meth:`combine_in_space` on float64 predictions; this class converts to and
    from ``space`` and refuses ``space="eps"`` on a schedule starting at ``sigma = inf``."""

    default_space = "eps"

    def __init__(self, scale, space: str | None = None, start: float = 0.0, stop: float = 1.0,
                 sigmas: Tensor | None = None, enabled: bool = True):
        self.space = check_prediction_space(self.default_space if space is None else space)
        super().__init__(scale, start=start, stop=stop, sigmas=sigmas, enabled=enabled)

    @property
    def config(self) -> dict:
        return {**super().config, "space": self.space}

    def set_schedule(self, sigmas: Tensor) -> SpaceGuider:
        super().set_schedule(sigmas)
        check_schedule_space(torch.as_tensor(sigmas, dtype=torch.float64).tolist()[:1], self.space,
                             type(self).__name__)
        return self

    def combine(self, d_cond: Tensor, d_null: Tensor, x: Tensor, sigma: Tensor, step: int | None = None) -> Tensor:
        c, u = to_space(d_cond, x, sigma, self.space), to_space(d_null, x, sigma, self.space)
        return from_space(self.combine_in_space(c, u), x, sigma, self.space, d_cond.dtype)

    def combine_in_space(self, c: Tensor, u: Tensor) -> Tensor:
        """The guided prediction from the conditional ``c`` and null ``u`` predictions in :attr:`space`
        (float64 ``[B, *shape]``)."""
        raise NotImplementedError
