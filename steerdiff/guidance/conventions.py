"""Guidance-scale conventions and converters (docs/methods/guidance.md, "Scale conventions").

steerdiff's guiders all take ``w`` in ``D_u + w (D_c - D_u) = D_c + (w - 1)(D_c - D_u)``: ``w = 1`` is the
conditional model, ``w = 0`` the unconditional one. The same number means different things elsewhere:

==================== ======================================= ================================================
convention           formula (``c``/``u``: cond/null output)  steerdiff ``w``
==================== ======================================= ================================================
``steerdiff``        ``u + w (c - u)``                        ``w``
``apg_paper``        ``c + (w - 1) update`` (Algorithm 1)     ``w``
``ho_salimans``      ``(1 + omega) c - omega u``              ``1 + omega``
``diffusers``        ``u + s (c - u)`` (``guidance_scale``;    ``s``
                     also k-diffusion, ComfyUI CFG, CoInD)
``diffusers_original`` ``c + s (c - u)``                      ``1 + s``
                     (``use_original_formulation=True``)
``comfyui_apg``      ``c + s update`` (APG node, pre-CFG      ``s + 1``, except ``s = 1`` -> ``1``
                     hook; ``s`` = the sampler's cfg)
==================== ======================================= ================================================

ComfyUI's APG node has two edge cases, read from ``comfy_extras/nodes_apg.py`` and ``comfy/samplers.py``: at
``cond_scale = 1`` the sampler skips the unconditional batch ("cfg1 optimization", which the node does not
disable), so the node never runs and the result is ``D_c`` (``w = 1``, not 2); at ``cond_scale = 0`` the node
divides ``(cond - uncond)`` by ``cond_scale`` (undefined). ``w = 2`` therefore has no ComfyUI-APG equivalent.

diffusers' ``AdaptiveProjectedGuidance``: with ``use_original_formulation=True`` it computes ``c + s * update``,
the paper's operator at ``w = s + 1`` (``diffusers_original``; checked against diffusers 0.42 in the tests); by
default it computes ``u + s * update``, a different operator unless ``eta = 1`` and no norm clamp (then it is CFG
with ``w = s``).
"""

from __future__ import annotations

import math

from .base import check_real, check_scale

CONVENTIONS = ("steerdiff", "apg_paper", "ho_salimans", "diffusers", "diffusers_original", "comfyui_apg")


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown scale convention {convention!r}; choose one of {list(CONVENTIONS)}")


def to_w(value: float, convention: str) -> float:
    """steerdiff's ``w`` for a scale ``value`` given in ``convention`` (see the module table)."""
    _check_convention(convention)
    value = check_real(value, "value")
    if convention in ("steerdiff", "apg_paper", "diffusers"):
        w = value
    elif convention in ("ho_salimans", "diffusers_original"):
        w = 1.0 + value
    else:  # comfyui_apg
        if value == 0.0:
            raise ValueError(
                "ComfyUI's APG node is undefined at cond_scale = 0 (it divides cond - uncond by cond_scale)"
            )
        # ComfyUI skips the unconditional batch at cond_scale = 1 (math.isclose), so the node does not run.
        w = 1.0 if math.isclose(value, 1.0) else value + 1.0
    return check_scale(w, f"the scale converted from {convention} value {value}")


def from_w(w: float, convention: str) -> float:
    """The scale in ``convention`` that means steerdiff's ``w`` (inverse of :func:`to_w`)."""
    _check_convention(convention)
    w = check_scale(w, "w")
    if convention in ("steerdiff", "apg_paper", "diffusers"):
        return w
    if convention in ("ho_salimans", "diffusers_original"):
        return w - 1.0
    # comfyui_apg
    if w == 1.0:
        return 1.0  # cond_scale 1: ComfyUI evaluates the condition only
    if math.isclose(w, 2.0):
        raise ValueError("w = 2 has no ComfyUI APG equivalent: cond_scale = 1 skips guidance (cfg1 optimization)")
    if w == 0.0 or w < 1.0:
        raise ValueError(f"ComfyUI's APG node needs cond_scale > 0, i.e. w > 1 (or w = 1); got w = {w}")
    return w - 1.0


def _diffusers_convention(use_original_formulation: bool) -> str:
    # A string such as "no" is truthy: refuse it rather than pick the other formula.
    if not isinstance(use_original_formulation, bool):
        raise TypeError(f"use_original_formulation must be a bool, got {type(use_original_formulation).__name__}")
    return "diffusers_original" if use_original_formulation else "diffusers"


def w_from_diffusers(guidance_scale: float, use_original_formulation: bool = False) -> float:
    """``w`` for diffusers' CFG ``guidance_scale`` (``u + s (c - u)``, or ``c + s (c - u)`` if original)."""
    return to_w(guidance_scale, _diffusers_convention(use_original_formulation))


def diffusers_from_w(w: float, use_original_formulation: bool = False) -> float:
    """diffusers' ``guidance_scale`` meaning steerdiff's ``w``."""
    return from_w(w, _diffusers_convention(use_original_formulation))


def w_from_comfyui_apg(cond_scale: float) -> float:
    """``w`` for the cfg value ``s`` used with ComfyUI's APG node (``D_c + s * update``; ``s = 1`` -> ``w = 1``)."""
    return to_w(cond_scale, "comfyui_apg")


def comfyui_apg_from_w(w: float) -> float:
    """ComfyUI cfg value for the APG node meaning steerdiff's ``w`` (``w - 1``; ``w = 2`` has none)."""
    return from_w(w, "comfyui_apg")


def w_from_omega(omega: float) -> float:
    """``w = 1 + omega`` for Ho & Salimans' ``(1 + omega) eps_c - omega eps_u``."""
    return to_w(omega, "ho_salimans")


def omega_from_w(w: float) -> float:
    """Ho & Salimans' ``omega = w - 1``."""
    return from_w(w, "ho_salimans")


# --- ComfyUI's guidance nodes beyond CFG (docs/methods/guidance.md, "ComfyUI's guidance nodes") -----------------------
# Read from comfy_extras/nodes_apg.py, nodes_pag.py, nodes_slg.py (+ nodes_sd3.py), nodes_tcfg.py, nodes_cfg.py and
# comfy/model_sampling.py. Each function returns the keyword arguments of the steerdiff guider that computes the same
# operator, or refuses (naming the argument) where the node computes another one.


def apg_from_comfyui(cond_scale: float, eta: float = 1.0, norm_threshold: float = 5.0, momentum: float = 0.0) -> dict:
    """:class:`~steerdiff.guidance.APG` arguments for ComfyUI's ``APG`` node (defaults: the node's) with the sampler's
    ``cfg`` = ``cond_scale``: ``scale = w_from_comfyui_apg(cond_scale)``; ``eta``, ``momentum`` (``M = dD + momentum
    M``, the node's running average) and ``norm_threshold`` (0: off) mean the same. Refused: ``eta`` outside [0, 1]
    and ``momentum >= 1`` (the node allows them; steerdiff's APG does not)."""
    momentum = check_real(momentum, "momentum", 0.0)
    if momentum >= 1.0:
        raise ValueError(f"momentum must be < 1 (ComfyUI allows 1, a running sum that steerdiff's APG refuses), got "
                         f"{momentum}")
    norm_threshold = check_real(norm_threshold, "norm_threshold", 0.0)
    return {"scale": w_from_comfyui_apg(cond_scale), "eta": check_real(eta, "eta", 0.0, 1.0),
            "norm_threshold": norm_threshold or None, "momentum": momentum}


def pag_from_comfyui(cfg: float, scale: float = 3.0) -> dict:
    """:class:`~steerdiff.guidance.PAG` arguments for ComfyUI's ``PerturbedAttentionGuidance`` node: its post-CFG
    hook returns ``cfg_result + scale (D_c - D_p)`` with ``cfg_result = D_u + cfg (D_c - D_u)`` and ``D_p`` the
    conditional pass whose middle-block self-attentions (``attn1`` of ``("middle", 0)``) return ``v``: ``scale =
    cfg``, ``pag_scale = scale``, ``layers = ("mid",)`` (a UNet; the node perturbs nothing else)."""
    return {"scale": to_w(cfg, "diffusers"), "pag_scale": check_real(scale, "scale", 0.0), "layers": ("mid",)}


def comfyui_flow_percent_to_sigma(percent: float, shift: float = 3.0) -> float:
    """steerdiff's ``sigma`` at ComfyUI's ``percent`` on a shifted rectified-flow model (SD3's
    ``ModelSamplingDiscreteFlow.percent_to_sigma``: ``t = shift u / (1 + (shift - 1) u)``, ``u = 1 - percent``;
    ``percent <= 0``: ``t = 1``, ``>= 1``: ``t = 0``), converted to ``sigma = t / (1 - t)``."""
    percent, shift = check_real(percent, "percent"), check_real(shift, "shift", 0.0)
    if percent <= 0.0:
        return math.inf
    if percent >= 1.0:
        return 0.0
    u = 1.0 - percent
    t = shift * u / (1.0 + (shift - 1.0) * u)
    return t / (1.0 - t)


def slg_window_from_comfyui(sigma_start: float, sigma_end: float, sigmas) -> tuple[float, float]:
    """``(perturb_start, perturb_stop)`` of :class:`~steerdiff.guidance.SLG` that switch the term on at the same
    steps as ComfyUI's ``SkipLayerGuidanceDiT``: the node tests each evaluation's sigma, ``sigma_end <= sigma <=
    sigma_start`` (its ``percent_to_sigma`` of ``end_percent`` / ``start_percent``, here in steerdiff's sigma), SLG
    the step index, ``N start < i < N stop``, on the schedule ``sigmas`` (``[N + 1]``, decreasing). The steps the
    node selects are contiguous, ``a..b``: ``start = (a - 1/2) / N``, ``stop = (b + 1/2) / N``; none: ``(0, 0)``.
    Equal for one evaluation per step (Euler); a second evaluation inside a step (Heun, at ``sigma_{i+1}``) follows
    its step's decision here, its own sigma in ComfyUI. Refused: a window holding step 0 (the index rule is strict,
    as diffusers')."""
    if sigma_start != math.inf:  # percent 0: every sigma
        sigma_start = check_real(sigma_start, "sigma_start", 0.0)
    sigma_end = check_real(sigma_end, "sigma_end", 0.0)
    sig = [float(s) for s in sigmas][:-1]
    on = [i for i, s in enumerate(sig) if sigma_end <= s <= sigma_start]
    if not on:
        return 0.0, 0.0
    if 0 in on:
        raise ValueError(f"sigma_start={sigma_start} includes the first step (sigma {sig[0]}); SLG's step rule "
                         "N * start < i never holds at i = 0: lower sigma_start (raise start_percent)")
    n = len(sig)
    return (on[0] - 0.5) / n, (on[-1] + 0.5) / n


def slg_from_comfyui(cfg: float, sigmas, sigma_start: float, sigma_end: float, scale: float = 3.0,
                     double_layers=(7, 8, 9), single_layers=(), rescaling_scale: float = 0.0) -> dict:
    """:class:`~steerdiff.guidance.SLG` arguments for ComfyUI's ``SkipLayerGuidanceDiT`` (and
    ``SkipLayerGuidanceSD3``: ``layers`` are its ``double_layers``, no single layers) on the schedule ``sigmas``:
    the node returns ``cfg_result + scale (D_c - D_p)``, ``D_p`` the conditional pass with the chosen blocks skipped,
    within ``sigma_end <= sigma <= sigma_start`` (:func:`comfyui_flow_percent_to_sigma` gives these from its
    percents on SD3). ``scale = cfg``, ``slg_scale = scale``, ``layers``: the double-block indices (SD3's joint
    blocks, FLUX's double blocks: ``transformer_blocks``) and ``"single_transformer_blocks.<i>"`` for FLUX's single
    blocks; the window by :func:`slg_window_from_comfyui`. Refused: ``rescaling_scale != 0`` (the node then rescales
    the result by ``std(D_c) / std(result)`` over the whole batch: another operator)."""
    if check_real(rescaling_scale, "rescaling_scale") != 0.0:
        raise ValueError("rescaling_scale != 0 rescales by a batch-wide std ratio; steerdiff's SLG has no such term")
    layers = [int(i) for i in double_layers] + [f"single_transformer_blocks.{int(i)}" for i in single_layers]
    if not layers:
        raise ValueError("double_layers and single_layers are both empty: ComfyUI's node then does nothing (use CFG)")
    start, stop = slg_window_from_comfyui(sigma_start, sigma_end, sigmas)
    return {"scale": to_w(cfg, "diffusers"), "slg_scale": check_real(scale, "scale", 0.0), "layers": tuple(layers),
            "perturb_start": start, "perturb_stop": stop}


def tcfg_from_comfyui(cfg: float, flow: bool) -> dict:
    """:class:`~steerdiff.guidance.TCFG` arguments for ComfyUI's ``TCFG`` node: it damps the null prediction on the
    scores ``x - D`` (``sigma eps`` on an eps model; ``t v`` on a rectified flow, where ComfyUI's ``x`` is ``x_t``),
    whose first singular direction is that of ``eps`` (resp. ``v``), then applies CFG at ``cfg``: ``scale = cfg``,
    ``space = "v"`` for a flow model (SD3, FLUX), ``"eps"`` otherwise. The node's SVD runs in float32."""
    if not isinstance(flow, bool):
        raise TypeError(f"flow must be a bool (a rectified-flow model), got {type(flow).__name__}")
    return {"scale": to_w(cfg, "diffusers"), "space": "v" if flow else "eps"}
