"""Align-Your-Steps presets (Sabour, Fidler, Kreis, "Align Your Steps: Optimizing Sampling Schedules in Diffusion
Models", ICML 2024): the 10-step noise levels NVIDIA published for Stable Diffusion 1.5, SDXL and Stable Video
Diffusion, and their log-linear interpolation to other step counts, registered in
:data:`steerdiff.core.sigmas.SCHEDULES` as ``ays_sd15``, ``ays_sdxl`` and ``ays_svd``; and GITS's SD 1.5 lists
(``gits_sd15``, at the end).

The numbers are data: the 11 levels of each model from the paper's project page
(https://research.nvidia.com/labs/toronto-ai/AlignYourSteps/howto.html), as ComfyUI's ``AlignYourStepsScheduler``
(``comfy_extras/nodes_align_your_steps.py``) ships them. The interpolation is the how-to's ``loglinear_interp``:
``log sigma`` read as a piecewise-linear function of an even grid on ``[0, 1]`` (11 knots), evaluated at
``steps + 1`` even points. As in the node, the last level is then replaced by 0 (the presets end at the model's
smallest training sigma, 0.0292 for SD, 0.002 for SVD, where the final denoising step returns the estimate).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .sigmas import SCHEDULES, _check_steps

# The published 10-step schedules (11 levels, sigma_max first); SD 1.5 and SDXL are in the VP-eps sigma of their
# scaled-linear table (14.6146 = its top), SVD in its EDM sigma (700 down to 0.002).
AYS_LEVELS: dict[str, tuple[float, ...]] = {
    "sd15": (14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092, 0.9642583904,
             0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582),
    "sdxl": (14.6146412293, 6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945, 0.8620721141, 0.5550693289,
             0.3798540708, 0.2332364134, 0.1114188177, 0.0291671582),
    "svd": (700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002),
}


def loglinear_interp(levels: Tensor, count: int) -> Tensor:
    """``count`` decreasing levels whose logarithm interpolates ``log levels`` linearly, both read on even grids of
    ``[0, 1]`` (the AYS how-to's ``loglinear_interp``); float64, first and last level kept."""
    log = torch.as_tensor(levels, dtype=torch.float64).log().flip(0)  # increasing, as np.interp needs
    n = log.numel()
    pos = torch.linspace(0, 1, count, dtype=torch.float64) * (n - 1)
    i = pos.floor().long().clamp(0, n - 2)
    w = pos - i
    return ((1 - w) * log[i] + w * log[i + 1]).exp().flip(0)


def ays(steps: int, model: str = "sd15") -> Tensor:
    """The AYS schedule of ``model`` (``sd15``, ``sdxl``, ``svd``) for ``steps`` steps: the published 10-step levels,
    log-linearly interpolated to ``steps + 1`` levels when ``steps != 10``, the last replaced by 0; float64
    ``[steps + 1]``.

    Raises:
        ValueError: ``steps`` not an integer >= 1; an unknown ``model``.
    """
    _check_steps(steps)
    if model not in AYS_LEVELS:
        raise ValueError(f"model must be one of {sorted(AYS_LEVELS)}, got {model!r}")
    levels = torch.tensor(AYS_LEVELS[model], dtype=torch.float64)
    if steps + 1 != levels.numel():
        levels = loglinear_interp(levels, steps + 1)
    levels[-1] = 0.0
    return levels


@SCHEDULES.register("ays_sd15")
def ays_sd15(steps: int) -> Tensor:
    """Align Your Steps, Stable Diffusion 1.5 (:func:`ays`)."""
    return ays(steps, "sd15")


@SCHEDULES.register("ays_sdxl")
def ays_sdxl(steps: int) -> Tensor:
    """Align Your Steps, SDXL (:func:`ays`)."""
    return ays(steps, "sdxl")


@SCHEDULES.register("ays_svd")
def ays_svd(steps: int) -> Tensor:
    """Align Your Steps, Stable Video Diffusion (:func:`ays`)."""
    return ays(steps, "svd")


# ---------------------------------------------------------------------------------------------------------- GITS
# GITS (Chen, Zhou, Zhao, Lyu, "On the Trajectory Regularity of ODE-based Diffusion Sampling", ICML 2024): time
# schedules searched by dynamic programming along SD 1.5's sampling trajectories (zju-pi/diff-sampler, gits-main),
# as ComfyUI's GITSScheduler (comfy_extras/nodes_gits.py) ships them. Only the node's default coefficient, 1.20, is
# here: one list per step count 2..20; every level is a sigma of SD 1.5's training table (tested).
GITS_LEVELS_120: tuple[tuple[float, ...], ...] = (
    (14.61464119, 0.803307, 0.02916753),
    (14.61464119, 1.56271636, 0.52423614, 0.02916753),
    (14.61464119, 2.36326075, 0.92192322, 0.36617002, 0.02916753),
    (14.61464119, 2.84484982, 1.24153244, 0.59516323, 0.25053367, 0.02916753),
    (14.61464119, 5.85520077, 2.05039096, 0.95350921, 0.45573691, 0.17026083, 0.02916753),
    (14.61464119, 5.85520077, 2.45070267, 1.24153244, 0.64427125, 0.29807833, 0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 2.45070267, 1.36964464, 0.803307, 0.45573691, 0.25053367, 0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 2.84484982, 1.61558151, 0.95350921, 0.59516323, 0.36617002, 0.19894916, 0.09824532,
     0.02916753),
    (14.61464119, 5.85520077, 2.84484982, 1.67050016, 1.08895338, 0.74807048, 0.50118381, 0.32104823, 0.19894916,
     0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 2.95596409, 1.84880662, 1.24153244, 0.83188516, 0.59516323, 0.41087446, 0.27464288,
     0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 3.07277966, 1.98035145, 1.36964464, 0.95350921, 0.69515091, 0.50118381, 0.36617002,
     0.25053367, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 6.77309084, 3.46139455, 2.36326075, 1.56271636, 1.08895338, 0.803307, 0.59516323, 0.45573691,
     0.34370604, 0.25053367, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 6.77309084, 3.46139455, 2.45070267, 1.61558151, 1.162866, 0.86115354, 0.64427125, 0.50118381,
     0.38853383, 0.29807833, 0.22545385, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338, 0.83188516, 0.64427125,
     0.50118381, 0.38853383, 0.29807833, 0.22545385, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338, 0.83188516, 0.64427125,
     0.50118381, 0.41087446, 0.32104823, 0.25053367, 0.19894916, 0.13792117, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338, 0.83188516, 0.64427125,
     0.50118381, 0.41087446, 0.34370604, 0.27464288, 0.22545385, 0.17026083, 0.13792117, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.20157266, 0.92192322, 0.72133851,
     0.57119018, 0.45573691, 0.36617002, 0.29807833, 0.25053367, 0.19894916, 0.17026083, 0.13792117, 0.09824532,
     0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244, 0.95350921, 0.74807048,
     0.59516323, 0.4783645, 0.38853383, 0.32104823, 0.27464288, 0.22545385, 0.19894916, 0.17026083, 0.13792117,
     0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244, 0.95350921, 0.74807048,
     0.59516323, 0.50118381, 0.41087446, 0.34370604, 0.29807833, 0.25053367, 0.22545385, 0.19894916, 0.17026083,
     0.13792117, 0.09824532, 0.02916753),
)


@SCHEDULES.register("gits_sd15")
def gits_sd15(steps: int) -> Tensor:
    """GITS for SD 1.5 at coefficient 1.20 (ComfyUI's GITSScheduler default): the published list for 2..20 steps;
    above 20, the 20-step list log-linearly interpolated to ``steps + 1`` levels (:func:`loglinear_interp`); the last
    level replaced by 0. Float64 ``[steps + 1]``.

    Raises:
        ValueError: ``steps`` not an integer >= 2 (the node's minimum; no one-step list is published).
    """
    _check_steps(steps)
    if steps < 2:
        raise ValueError(f"steps must be an integer >= 2 for gits_sd15 (lists are published for 2..20), got {steps}")
    if steps <= len(GITS_LEVELS_120) + 1:
        levels = torch.tensor(GITS_LEVELS_120[steps - 2], dtype=torch.float64)
    else:
        levels = loglinear_interp(torch.tensor(GITS_LEVELS_120[-1], dtype=torch.float64), steps + 1)
    levels[-1] = 0.0
    return levels
