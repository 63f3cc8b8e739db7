"""The name map: AUTOMATIC1111, ComfyUI and diffusers sampler / scheduler names to a steerdiff sampler, its options
and a schedule (docs/methods/samplers.md, "The name map").

``sampler_from_name("DPM++ 2M Karras")`` is ``SamplerChoice("dpmpp_2m", {}, "karras")``; the schedule is a name in
:data:`steerdiff.core.sigmas.SCHEDULES` (None: the caller's grid, e.g. a diffusers pipeline's own timesteps) and
:meth:`SamplerChoice.sigmas` builds it, applying A1111's ``discard_next_to_last_sigma``. One table per ecosystem,
all in this module:

* A1111 (``modules/sd_samplers_kdiffusion.py``, ``sd_samplers_timesteps.py``, ``sd_schedulers.py``): a sampler name,
  optionally followed by a schedule ("DPM++ 2M Karras", the names before 1.9) or with ``scheduler=`` (1.9's
  "Schedule type"). Without a schedule, the sampler's 1.9 default for "Automatic" (``karras`` for DPM++ 2M, DPM++ SDE,
  DPM2, DPM++ 2S a; ``exponential`` for DPM++ 2M SDE and 3M SDE; else the model's ``normal`` grid).
* ComfyUI (``comfy/samplers.py``, ``KSAMPLER_NAMES`` and ``SCHEDULER_NAMES``): a sampler name and, with
  ``scheduler=``, a scheduler name ("dpmpp_2m" + "karras").
* diffusers: a scheduler class name with its config flags as keywords (``sampler_from_name(
  "DPMSolverMultistepScheduler", use_karras_sigmas=True, algorithm_type="sde-dpmsolver++")``), translated as
  ``steerdiff.pipelines``' ``scheduler_plan`` translates a pipeline's scheduler (the tests hold the two together).

Known names with no steerdiff equivalent (A1111's "DPM fast", ComfyUI's ``*_cfg_pp``, diffusers' ``PNDMScheduler``,
...) are refused saying so; unknown names are refused listing the close matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .sigmas import SCHEDULES


@dataclass(frozen=True)
class SamplerChoice:
    """What a foreign name means here: ``sd.sample(..., method=method, **options)`` on ``schedule``.

    Attributes:
        method: the steerdiff sampler (``steerdiff.core.SAMPLERS``).
        options: its keyword options (``eta``, ``variant``, ``order``, ...).
        schedule: a :data:`~steerdiff.core.sigmas.SCHEDULES` name, ``"flow"`` (a flow model's grid,
            :func:`~steerdiff.core.sigmas.flow`), or None (the caller's grid: a diffusers scheduler's own timesteps).
        schedule_options: options of the schedule the name fixes (``beta``'s ``alpha``, ...).
        discard_penultimate: A1111's ``discard_next_to_last_sigma`` (DPM2, DPM2 a, DPM++ 3M SDE): the schedule is
            built for ``steps + 1`` steps and its next-to-last level dropped.
        note: where the map is not exact (a different noise process, an approximate grid).
    """

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)
    schedule: str | None = None
    schedule_options: Mapping[str, Any] = field(default_factory=dict)
    discard_penultimate: bool = False
    note: str = ""

    def sigmas(self, steps: int, **schedule_kwargs: Any) -> Tensor:
        """The schedule for ``steps`` steps (``schedule_kwargs``: ``sigma_min``, ``sigma_max``, ``table``, ...).

        Raises:
            ValueError: the choice has no schedule of its own (``schedule=None``: use the caller's grid).
        """
        if self.schedule is None:
            raise ValueError(f"{self.method!r} from this name runs on the caller's grid (schedule=None); pass sigmas")
        if self.schedule == "flow":
            from .sigmas import flow

            return flow(steps, **schedule_kwargs)
        fn = SCHEDULES.get(self.schedule)
        kwargs = {**self.schedule_options, **schedule_kwargs}
        if not self.discard_penultimate:
            return fn(steps, **kwargs)
        full = fn(steps + 1, **kwargs)
        return full[[*range(len(full) - 2), len(full) - 1]]


def _c(method: str, schedule: str | None = None, note: str = "", discard: bool = False, **options: Any):
    return SamplerChoice(method, dict(options), schedule, {}, discard, note)


_BROWNIAN = ("A1111 and ComfyUI draw this sampler's noise from a Brownian tree; steerdiff draws independent "
             "per-sample Gaussians (the same law per step, tested equal with the same draws)")

_SA_WINDOW = ("ComfyUI injects SA-Solver's noise (tau = 1) only between its model's percent_to_sigma(0.2) and "
              "(0.8); steerdiff's default window is the whole schedule: pass tau_window=(sigma_hi, sigma_lo) "
              "for ComfyUI's")

# ------------------------------------------------------------------------------------------------------ A1111
# name -> (choice without schedule, the 1.9 default schedule for "Automatic")
A1111_SAMPLERS: dict[str, tuple[SamplerChoice, str | None]] = {
    "dpm++ 2m": (_c("dpmpp_2m"), "karras"),
    "dpm++ sde": (_c("dpmpp_sde", note=_BROWNIAN), "karras"),
    "dpm++ 2m sde": (_c("dpmpp_2m_sde", note=_BROWNIAN, solver_type="midpoint"), "exponential"),
    "dpm++ 2m sde heun": (_c("dpmpp_2m_sde", note=_BROWNIAN, solver_type="heun"), "exponential"),
    "dpm++ 2s a": (_c("dpmpp_2s_ancestral"), "karras"),
    "dpm++ 3m sde": (_c("dpmpp_3m_sde", note=_BROWNIAN, discard=True), "exponential"),
    "euler a": (_c("euler_ancestral"), "normal"),
    "euler": (_c("euler"), "normal"),
    "lms": (_c("lms", order=4), "normal"),
    "heun": (_c("heun"), "normal"),
    "dpm2": (_c("dpm_2", discard=True), "karras"),
    "dpm2 a": (_c("dpm_2_ancestral", discard=True), "karras"),
    "ddim": (_c("ddim", eta=0.0), "ddim_uniform"),
    "ddpm": (_c("ddpm"), "ddim_uniform"),
    "unipc": (_c("unipc", note="A1111's UniPC defaults: variant bh1, order 3, on its time-uniform grid (steerdiff: "
                 "the model's normal grid, the same timesteps for a discrete model)", variant="bh1", order=3),
              "normal"),
    "lcm": (_c("lcm"), "normal"),
}
A1111_SCHEDULES = {"karras": "karras", "exponential": "exponential", "polyexponential": "polyexponential",
                   "uniform": "normal", "normal": "normal", "automatic": None, "sgm uniform": "sgm_uniform",
                   "kl optimal": "kl_optimal", "simple": "simple", "ddim": "ddim_uniform", "beta": "beta",
                   "align your steps": "ays_sd15", "align your steps 11": "ays_sd15", "align your steps xl":
                   "ays_sdxl"}

# --------------------------------------------------------------------------------------------------- ComfyUI
COMFY_SAMPLERS: dict[str, SamplerChoice] = {
    "euler": _c("euler"), "euler_ancestral": _c("euler_ancestral"), "heun": _c("heun"), "heunpp2": _c("heunpp2"),
    "dpm_2": _c("dpm_2", discard=True), "dpm_2_ancestral": _c("dpm_2_ancestral", discard=True),
    "lms": _c("lms", order=4),
    "dpmpp_2s_ancestral": _c("dpmpp_2s_ancestral"), "dpmpp_sde": _c("dpmpp_sde", note=_BROWNIAN),
    "dpmpp_sde_gpu": _c("dpmpp_sde", note=_BROWNIAN), "dpmpp_2m": _c("dpmpp_2m"),
    "dpmpp_2m_sde": _c("dpmpp_2m_sde", note=_BROWNIAN, solver_type="midpoint"),
    "dpmpp_2m_sde_gpu": _c("dpmpp_2m_sde", note=_BROWNIAN, solver_type="midpoint"),
    "dpmpp_3m_sde": _c("dpmpp_3m_sde", note=_BROWNIAN), "dpmpp_3m_sde_gpu": _c("dpmpp_3m_sde", note=_BROWNIAN),
    "ddpm": _c("ddpm"), "lcm": _c("lcm"), "ipndm": _c("ipndm"), "ipndm_v": _c("ipndm_v"), "deis": _c("deis"),
    "res_multistep": _c("res_multistep"), "res_multistep_ancestral": _c("res_multistep_ancestral"),
    "er_sde": _c("er_sde"),
    "sa_solver": _c("sa_solver", note=_SA_WINDOW), "sa_solver_pece": _c("sa_solver_pece", note=_SA_WINDOW),
    # ComfyUI's "ddim" is its Euler sampler, which DDIM at eta = 0 equals in the sigma parametrisation
    "ddim": _c("euler"),
    "uni_pc": _c("unipc", discard=True, variant="bh1", order=3),
    "uni_pc_bh2": _c("unipc", discard=True, variant="bh2", order=3),
}
COMFY_SCHEDULES = {"simple": "simple", "sgm_uniform": "sgm_uniform", "karras": "karras", "exponential": "exponential",
                   "ddim_uniform": "ddim_uniform", "beta": "beta", "normal": "normal",
                   "linear_quadratic": "linear_quadratic", "kl_optimal": "kl_optimal",
                   # the AlignYourStepsScheduler node's model types
                   "ays_sd1": "ays_sd15", "ays_sdxl": "ays_sdxl", "ays_svd": "ays_svd",
                   "gits": "gits_sd15"}  # the GITSScheduler node at its default coefficient (1.20)

# ------------------------------------------------------------------------------------------------- diffusers
_DIFFUSERS_SIMPLE: dict[str, SamplerChoice] = {
    "DDIMScheduler": _c("ddim"), "DDPMScheduler": _c("ddpm"), "EulerDiscreteScheduler": _c("euler"),
    "EulerAncestralDiscreteScheduler": _c("euler_ancestral"), "LMSDiscreteScheduler": _c("lms", order=4),
    "HeunDiscreteScheduler": _c("heun"), "FlowMatchEulerDiscreteScheduler": _c("euler", "flow"),
    "KDPM2DiscreteScheduler": _c("dpm_2", note="with use_karras_sigmas diffusers evaluates the network at rounded "
                                               "timesteps (not the grid's levels)"),
    "KDPM2AncestralDiscreteScheduler": _c("dpm_2_ancestral", note="diffusers interpolates its midpoints on its "
                                                                  "own table"),
    "DPMSolverSDEScheduler": _c("dpmpp_sde", note=_BROWNIAN),
    "LCMScheduler": _c("lcm"), "EDMEulerScheduler": _c("euler", "karras"),
    "DEISMultistepScheduler": _c("deis", note="diffusers' DEIS is the log-rho multistep form, steerdiff's "
                                              "ComfyUI's tAB form: the same method family, not the same numbers"),
}

NO_EQUIVALENT: dict[str, str] = {
    "dpm fast": "k-diffusion's adaptive-order DPM-Solver", "dpm adaptive": "an adaptive step size",
    "restart": "Restart sampling", "plms": "PLMS's startup (closest: ipndm)",
    "dpm_fast": "k-diffusion's adaptive-order DPM-Solver", "dpm_adaptive": "an adaptive step size",
    "euler_cfg_pp": "CFG++ (a guidance change)", "euler_ancestral_cfg_pp": "CFG++ (a guidance change)",
    "dpmpp_2s_ancestral_cfg_pp": "CFG++", "dpmpp_2m_cfg_pp": "CFG++", "res_multistep_cfg_pp": "CFG++",
    "res_multistep_ancestral_cfg_pp": "CFG++", "gradient_estimation": "gradient-estimation sampling",
    "seeds_2": "SEEDS", "seeds_3": "SEEDS",
    "PNDMScheduler": "PNDM", "IPNDMScheduler": "diffusers' IPNDM (closest: ipndm)",
    "SASolverScheduler": "diffusers' SA-Solver (closest: sa_solver)",
    "DPMSolverSinglestepScheduler": "singlestep DPM-Solver (closest: dpmpp_2s_ancestral at eta 0)",
    "CMStochasticIterativeScheduler": "consistency models' iterative sampler",
}
DIFFUSERS_NAMES = (*_DIFFUSERS_SIMPLE, "DPMSolverMultistepScheduler", "UniPCMultistepScheduler", "TCDScheduler",
                   "EDMDPMSolverMultistepScheduler")


def _sigma_flags(config: dict[str, Any]) -> str | None:
    """diffusers' sigma-grid flags (``use_karras_sigmas``, ...) as a schedule name (None: the scheduler's own)."""
    chosen = [s for f, s in (("use_karras_sigmas", "karras"), ("use_exponential_sigmas", "exponential"),
                             ("use_beta_sigmas", "beta")) if config.pop(f, False)]
    if len(chosen) > 1:
        raise ValueError(f"at most one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas, got {chosen}")
    return chosen[0] if chosen else None


def _dpm_solver(config: dict[str, Any], schedule: str | None) -> SamplerChoice:
    """DPMSolverMultistepScheduler's options, as steerdiff.pipelines' ``_dpm_plan`` translates them."""
    algorithm = config.pop("algorithm_type", "dpmsolver++")
    order = int(config.pop("solver_order", 2))
    solver = config.pop("solver_type", "midpoint")
    lower_order_final = bool(config.pop("lower_order_final", True))
    if algorithm not in ("dpmsolver++", "sde-dpmsolver++") and not (order == 1 and algorithm == "dpmsolver"):
        raise ValueError(f"algorithm_type={algorithm!r}: steerdiff's DPM-Solvers predict data (dpmsolver++, "
                         "sde-dpmsolver++)")
    sde = algorithm == "sde-dpmsolver++"
    if order == 1:
        return _c("ddpm", schedule) if sde else _c("ddim", schedule, eta=0.0)
    if order == 2:
        if not sde and solver == "midpoint":
            return _c("dpmpp_2m", schedule)
        return _c("dpmpp_2m_sde", schedule, eta=1.0 if sde else 0.0, solver_type=solver)
    if order == 3 and not sde:
        note = "lower_order_final: a second-order last step below 15 steps (pass lower_order_final=True to the " \
               "sampler then)" if lower_order_final else ""
        return _c("dpmpp_3m_sde", schedule, note, eta=0.0, solver_type=solver, lower_order_final=False)
    raise ValueError(f"solver_order={order} with algorithm_type={algorithm!r}: steerdiff has DPM-Solver++ orders "
                     "1-3 and the SDE variant's orders 1-2")


def _diffusers(name: str, config: dict[str, Any]) -> SamplerChoice:
    config = dict(config)
    schedule = _sigma_flags(config)
    if name == "DPMSolverMultistepScheduler":
        choice = _dpm_solver(config, schedule)
    elif name == "EDMDPMSolverMultistepScheduler":
        choice = _dpm_solver(config, schedule or "karras")
    elif name == "UniPCMultistepScheduler":
        choice = _c("unipc", schedule, variant=config.pop("solver_type", "bh2"),
                    order=int(config.pop("solver_order", 2)))
    elif name == "TCDScheduler":
        choice = _c("tcd", schedule, eta=float(config.pop("eta", config.pop("gamma", 0.3))))
    else:
        base = _DIFFUSERS_SIMPLE[name]
        choice = SamplerChoice(base.method, dict(base.options), schedule or base.schedule, {}, False, base.note)
    if config:
        raise ValueError(f"{name}: the name map does not translate {sorted(config)} (it translates the sigma grid "
                         "flags and the algorithm options); steerdiff.pipelines converts a whole scheduler config")
    return choice


def _a1111(key: str, scheduler: str | None) -> SamplerChoice | None:
    """An A1111 name (sampler, optionally a schedule suffix), or None if it is not one."""
    sampler, suffix = key, None
    if key not in A1111_SAMPLERS:
        for sched in sorted(A1111_SCHEDULES, key=len, reverse=True):
            if key.endswith(" " + sched) and key[: -len(sched) - 1] in A1111_SAMPLERS:
                sampler, suffix = key[: -len(sched) - 1], sched
                break
        else:
            return None
    if suffix is not None and scheduler is not None:
        raise ValueError(f"the name already names its schedule ({suffix!r}); scheduler={scheduler!r} would replace it")
    suffix = suffix if suffix is not None else (None if scheduler is None else scheduler.strip().lower())
    base, default = A1111_SAMPLERS[sampler]
    if suffix is not None and suffix not in A1111_SCHEDULES:
        raise ValueError(f"scheduler={scheduler!r} is not an A1111 schedule type; one of {sorted(A1111_SCHEDULES)}")
    schedule = default if suffix is None or A1111_SCHEDULES[suffix] is None else A1111_SCHEDULES[suffix]
    return SamplerChoice(base.method, dict(base.options), schedule, {}, base.discard_penultimate, base.note)


def sampler_from_name(name: str, scheduler: str | None = None, **config: Any) -> SamplerChoice:
    """The steerdiff sampler, options and schedule an A1111, ComfyUI or diffusers name stands for.

    Args:
        name: an A1111 sampler name ("DPM++ 2M Karras", "Euler a"; case-insensitive), a ComfyUI sampler name
            ("dpmpp_2m"), or a diffusers scheduler class name ("DPMSolverMultistepScheduler").
        scheduler: the schedule, for an A1111 name without one (its 1.9 "Schedule type": "Karras", ...) or a ComfyUI
            sampler ("karras", "normal", ...); not with a diffusers class (give its flags in ``config``).
        **config: a diffusers scheduler's config flags (``use_karras_sigmas``, ``algorithm_type``,
            ``solver_order``, ``solver_type``, ``gamma``, ...).

    Raises:
        ValueError: an unknown name (the close matches listed), a known name with no steerdiff equivalent (saying
            what it is), an unknown scheduler, or config flags the map does not translate.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    raw = name.strip()
    if raw in DIFFUSERS_NAMES:
        if scheduler is not None:
            raise ValueError(f"{raw} is a diffusers scheduler: give its sigma grid as config flags "
                             "(use_karras_sigmas=True, ...), not scheduler=")
        return _diffusers(raw, config)
    if config:
        raise ValueError(f"config flags {sorted(config)} apply to a diffusers scheduler class name, not {raw!r}")
    key = " ".join(raw.lower().split())
    if raw in NO_EQUIVALENT or key in NO_EQUIVALENT:
        raise ValueError(f"{raw!r} has no steerdiff equivalent ({NO_EQUIVALENT.get(raw) or NO_EQUIVALENT[key]})")
    if key in COMFY_SAMPLERS and (key not in A1111_SAMPLERS or scheduler in COMFY_SCHEDULES):
        base = COMFY_SAMPLERS[key]
        if scheduler is not None and scheduler not in COMFY_SCHEDULES:
            raise ValueError(f"scheduler={scheduler!r} is not a ComfyUI scheduler; one of {sorted(COMFY_SCHEDULES)}")
        return SamplerChoice(base.method, dict(base.options), COMFY_SCHEDULES.get(scheduler), {},
                             base.discard_penultimate, base.note)  # DISCARD_PENULTIMATE_SIGMA_SAMPLERS
    choice = _a1111(key, scheduler)
    if choice is not None:
        return choice
    known = [*known_names(), *NO_EQUIVALENT]
    close = difflib.get_close_matches(key, [k.lower() for k in known], n=5, cutoff=0.6)
    spelled = {k.lower(): k for k in known}
    hint = f"; close matches: {', '.join(spelled[c] for c in close)}" if close else ""
    raise ValueError(f"unknown sampler name {raw!r}{hint} (A1111, ComfyUI and diffusers names are listed in "
                     "steerdiff.core.names)")


def known_names() -> list[str]:
    """Every name :func:`sampler_from_name` maps (A1111 in lower case, with and without schedule suffixes)."""
    return sorted({*A1111_SAMPLERS, *(f"{a} {s}" for a in A1111_SAMPLERS for s in A1111_SCHEDULES
                                      if A1111_SCHEDULES[s]), *COMFY_SAMPLERS, *DIFFUSERS_NAMES})
