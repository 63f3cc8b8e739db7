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
