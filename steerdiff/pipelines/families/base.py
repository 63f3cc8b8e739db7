"""A pipeline family: how one kind of diffusers text-to-image pipeline encodes prompts, calls its network and lays
out its schedule, and the registry of families (docs/methods/pipelines.md, "Families").

A family is a subclass of :class:`Family` registered with :func:`register_family`; :func:`family_of` finds the one
that recognises a pipeline object, and the generic :class:`~steerdiff.pipelines.Pipeline` asks it for everything
that differs between pipelines:

* what it wraps and needs: ``pipeline_class`` (the diffusers class, or its name), ``required`` (the components
  :func:`~steerdiff.pipelines.from_diffusers` checks), ``network`` (the UNet or transformer);
* conditions: ``encode(prompts, negatives, height, width, ...) -> TextCond`` (the pipeline's own ``encode_prompt``
  plus the family's extra inputs) and ``call(network, x, t, cond)``; ``max_sequence_length`` (the T5 token count,
  None for a family without T5), ``embedded_guidance`` (a guidance-distilled network's default embedded value);
* the latent denoiser ``denoiser(null_for)`` in the one convention: VP families through
  :class:`~steerdiff.core.vp.VPDenoiser` with the scheduler's ``alphas_cumprod`` and ``prediction_type`` (Ho et
  al., NeurIPS 2020; Karras et al., NeurIPS 2022, Sec. 2 and Table 1, for the sigma convention), flow families
  through :class:`~steerdiff.core.flow.FlowDenoiser` (:class:`FlowFamily`);
* the schedule: ``schedulers`` (the steerdiff sampler equivalent to each diffusers scheduler class) and
  ``default_sigmas(pipeline, steps, height, width)`` (the scheduler's grid in sigma units);
* calibration: ``calibration_args``, the names of the network's positional arguments, so
  :meth:`~steerdiff.pipelines.Pipeline.calibration_inputs` records every call as keyword arguments.

diffusers is imported only inside functions (an optional dependency).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from ...core import sigmas as sd_sigmas
from ...core.flow import FlowDenoiser
from ...core.vp import PREDICTION_TYPES, VPDenoiser
from ...io.plugins import Registry
from ...models.diffusers_adapter import _finite_terminal_snr
from ..conditions import TextCond

FAMILIES: Registry[type] = Registry("pipeline family", argument="family")
"""The registered pipeline families, name -> :class:`Family` subclass (:func:`register_family`)."""

SCHEDULER_METHODS: Mapping[str, str] = {
    "DDIMScheduler": "ddim",
    "DDPMScheduler": "ddpm",
    "EulerDiscreteScheduler": "euler",
    "EulerAncestralDiscreteScheduler": "euler_ancestral",
    "LMSDiscreteScheduler": "lms",
    "HeunDiscreteScheduler": "heun",
    "FlowMatchEulerDiscreteScheduler": "euler",
    "DPMSolverMultistepScheduler": "dpmpp_2m",
    "UniPCMultistepScheduler": "unipc",
}
"""The steerdiff sampler equivalent to each diffusers scheduler class at its default options: the default of
:attr:`Family.schedulers`. The options that change the algorithm are translated (or refused, naming them) by
:func:`scheduler_plan`."""

SIGMA_SPACE_SCHEDULERS = ("EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler", "LMSDiscreteScheduler",
                          "HeunDiscreteScheduler")
"""VP schedulers that hold the state in sigma units (``x = x0 + sigma eps``; their ``scale_model_input`` divides by
``sqrt(1 + sigma^2)``) on their own interpolated ``sigmas`` (fractional timesteps with linspace spacing), starting
from ``init_noise_sigma`` = ``sigma_max`` (linspace, trailing spacing) or ``sqrt(1 + sigma_max^2)`` (leading). The
others (DDIM, DDPM, DPM-Solver, UniPC) hold ``x / sqrt(1 + sigma^2)`` and start from ``init_noise_sigma = 1``."""


def _refuse(scheduler: Any, option: str, why: str) -> ValueError:
    name = type(scheduler).__name__
    value = scheduler.config.get(option, None)
    return ValueError(f"the pipeline's {name} sets {option}={value!r}, which steerdiff's Pipeline has no "
                      f"equivalent for with method=None ({why}); pass method= (and sigmas=) to choose a steerdiff "
                      f"sampler, or use a scheduler it converts")


def _ddim_jump_consistent(scheduler: Any, steps: int) -> bool:
    """Whether DDIM's step from each timestep to ``timestep - num_train_timesteps // steps`` lands on its next
    timestep (diffusers' DDIM steps that way; a sigma list steps to the next listed level)."""
    sch = copy.copy(scheduler)  # set_timesteps rebinds timesteps / num_inference_steps only: a shallow copy is safe
    sch.set_timesteps(steps)
    ts = sch.timesteps.detach().to("cpu", torch.long)
    jump = int(sch.config.num_train_timesteps) // steps
    return len(ts) < 2 or bool(((ts[:-1] - jump) == ts[1:]).all())


def scheduler_plan(scheduler: Any, method: str, steps: int | None) -> tuple[str, dict[str, Any]]:
    """The steerdiff sampler and options computing what the diffusers ``scheduler`` computes in ``steps`` steps
    (None: on a grid the caller gives, where the scheduler's own step count does not apply).

    ``method`` is :data:`SCHEDULER_METHODS`' entry for the scheduler's class; its options that change the
    algorithm select another sampler or sampler options (DPM-Solver's ``algorithm_type``, ``solver_type``,
    ``solver_order``; UniPC's ``solver_order`` and ``solver_type``), and those with no steerdiff equivalent raise a
    ValueError naming them (docs/methods/pipelines.md, "Schedules, samplers and guidance"). Options that change
    the grid only are :meth:`Family.default_sigmas`' business.
    """
    name = type(scheduler).__name__
    config = scheduler.config
    if config.get("thresholding", False):
        raise _refuse(scheduler, "thresholding", "dynamic thresholding of the x0 prediction")
    if config.get("clip_sample", False):
        raise _refuse(scheduler, "clip_sample", "clipping of the x0 prediction")
    if config.get("final_sigmas_type", "zero") != "zero" and name != "DPMSolverMultistepScheduler":
        raise _refuse(scheduler, "final_sigmas_type", "a last step to sigma_min")
    if name == "DDIMScheduler":
        if steps is not None and not _ddim_jump_consistent(scheduler, steps):
            raise _refuse(scheduler, "timestep_spacing", f"at {steps} steps diffusers' DDIM steps from each "
                          f"timestep to timestep - {int(config.num_train_timesteps) // steps}, not to its next "
                          "timestep; leading spacing, or a step count dividing num_train_timesteps with trailing "
                          "spacing, is converted")
        return "ddim", {}
    if name == "DDPMScheduler":
        if config.get("variance_type", "fixed_small") != "fixed_small":
            raise _refuse(scheduler, "variance_type", "steerdiff's ddpm is the fixed_small posterior")
        return "ddpm", {}
    if name == "EulerDiscreteScheduler":
        if config.get("interpolation_type", "linear") != "linear":
            raise _refuse(scheduler, "interpolation_type", "log-linear sigmas at the linear timesteps")
        if config.get("timestep_type", "discrete") != "discrete":
            raise _refuse(scheduler, "timestep_type", "continuous timesteps")
        return "euler", {}
    if name == "LMSDiscreteScheduler":
        return "lms", {"order": 4}  # the order its step() uses by default (the pipelines do not pass one)
    if name == "DPMSolverMultistepScheduler":
        return _dpm_plan(scheduler, steps)
    if name == "UniPCMultistepScheduler":
        return _unipc_plan(scheduler)
    if name == "FlowMatchEulerDiscreteScheduler":
        if config.get("use_dynamic_shifting", False) and config.get("time_shift_type", "exponential") != "exponential":
            raise _refuse(scheduler, "time_shift_type", "sd.sigmas.flow shifts exponentially")
        return "euler", {}
    return method, {}


def _dpm_plan(scheduler: Any, steps: int | None) -> tuple[str, dict[str, Any]]:
    """DPMSolverMultistepScheduler (Lu et al. 2022, DPM-Solver++, Algorithm 2; its SDE variant as k-diffusion's)."""
    config = scheduler.config
    algorithm = config.get("algorithm_type", "dpmsolver++")
    order = int(config.get("solver_order", 2))
    solver = config.get("solver_type", "midpoint")
    if config.get("variance_type", None) is not None:
        raise _refuse(scheduler, "variance_type", "a learned-variance network output")
    if algorithm not in ("dpmsolver++", "sde-dpmsolver++") and not (order == 1 and algorithm == "dpmsolver"):
        raise _refuse(scheduler, "algorithm_type", "steerdiff's DPM-Solvers predict data (dpmsolver++, "
                      "sde-dpmsolver++), not noise")
    if config.get("final_sigmas_type", "zero") != "zero" and order == 3:
        raise _refuse(scheduler, "final_sigmas_type", "a third-order solver's last step to sigma_min")
    if order == 1 and algorithm in ("dpmsolver++", "dpmsolver"):
        return "ddim", {"eta": 0.0}  # DPM-Solver-1 (either parametrisation) is DDIM (Lu et al. 2022, Sec. 3.1)
    sde = algorithm == "sde-dpmsolver++"
    if order == 1:
        return "ddpm", {}  # first-order SDE-DPM-Solver++ is the DDPM posterior step (its sigma-space form)
    if order == 2:
        if not sde and solver == "midpoint":
            return "dpmpp_2m", {}
        return "dpmpp_2m_sde", {"eta": 1.0 if sde else 0.0, "solver_type": solver}
    if order == 3 and not sde:
        lower_second = bool(config.get("lower_order_final", True)) and steps is not None and steps < 15
        return "dpmpp_3m_sde", {"eta": 0.0, "solver_type": solver, "lower_order_final": lower_second}
    raise _refuse(scheduler, "solver_order", f"order {order} with {algorithm}; steerdiff has DPM-Solver++ "
                  "orders 1-3 and the SDE variant's orders 1-2")


def _unipc_plan(scheduler: Any) -> tuple[str, dict[str, Any]]:
    """UniPCMultistepScheduler (Zhao et al. 2023, UniPC, Algorithm 3)."""
    config = scheduler.config
    if not config.get("predict_x0", True):
        raise _refuse(scheduler, "predict_x0", "steerdiff's UniPC is the data-prediction form")
    if list(config.get("disable_corrector", []) or []):
        raise _refuse(scheduler, "disable_corrector", "steerdiff's UniPC corrects every step")
    if not config.get("lower_order_final", True):
        raise _refuse(scheduler, "lower_order_final", "steerdiff's UniPC lowers the order on the last steps")
    if config.get("solver_p", None) is not None:
        raise _refuse(scheduler, "solver_p", "another solver as predictor")
    order = int(config.get("solver_order", 2))
    if order not in (1, 2, 3):
        raise _refuse(scheduler, "solver_order", "steerdiff's UniPC has orders 1-3")
    return "unipc", {"variant": config.get("solver_type", "bh2"), "order": order}


def register_family(name: str, aliases: tuple[str, ...] = ()) -> Callable[[type], type]:
    """Class decorator registering a :class:`Family` subclass as the pipeline family ``name``.

    ``sd.pipelines.from_diffusers`` then wraps every pipeline the class's :meth:`Family.matches` recognises
    (by default: objects of exactly its ``pipeline_class``). The class's ``name`` becomes ``name``.
    """

    def decorate(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Family)):
            raise TypeError(f"register_family({name!r}) decorates a subclass of steerdiff.pipelines.Family, got "
                            f"{cls!r}")
        if not cls.pipeline_class:
            raise ValueError(f"pipeline family {name!r} ({cls.__name__}) must set pipeline_class (the diffusers "
                             "pipeline class, or its name)")
        cls.name = name
        return FAMILIES.add(name, cls, aliases)

    return decorate


def _class_name(cls: Any) -> str:
    return cls if isinstance(cls, str) else getattr(cls, "__name__", repr(cls))


def supported() -> list[str]:
    """The pipeline classes of the registered families (class names), in family-name order."""
    return [_class_name(cls.pipeline_class) for _, cls in FAMILIES.items()]


def family_of(pipe: Any) -> Family:
    """The family of a diffusers pipeline object (an instance of the one registered family that recognises it).

    Raises:
        ValueError: no registered family recognises ``pipe`` (the message names its class and the supported
            ones), or more than one does (naming them).
    """
    found = [(name, cls) for name, cls in FAMILIES.items() if cls.matches(pipe)]
    if not found:
        raise ValueError(f"unsupported pipeline class {type(pipe).__name__}: sd.pipelines.from_diffusers supports "
                         f"{supported()}")
    if len(found) > 1:
        raise ValueError(f"pipeline class {type(pipe).__name__} is claimed by several registered families "
                         f"{[name for name, _ in found]}; unregister all but one (FAMILIES.remove)")
    return found[0][1](pipe)


_PLACED: ContextVar[tuple[Any, list] | None] = ContextVar("steerdiff_pipeline_placed", default=None)
"""The :class:`_Net` of the innermost pipeline call in progress and its ``[device, dtype, checked condition, rows]``
(:meth:`_Net.placed`)."""


class _Net:
    """``net(x, t, cond)`` for a diffusers UNet / transformer fed from a :class:`TextCond`.

    The network runs where it is and in its own dtype (docs/methods/pipelines.md, "Device and dtype"): the state
    ``x`` and the condition's floating-point fields (but those named in ``keep``) are moved to the network's device
    and cast to its dtype, the timestep ``t`` is moved there in float32 (what the diffusers pipelines pass; the
    network's time embedding casts it, FLUX's family rounds it as its pipeline does), and the prediction comes back
    on ``x``'s device in ``x``'s dtype (the sampler's state, float32 for a half-precision network).
    """

    def __init__(self, module: Any, call, null_for, keep: tuple[str, ...] = ()):
        self.module = module
        self.call = call  # call(module, x, t, cond) -> prediction
        self.null_for = null_for  # null_for(batch) -> the all-null TextCond (cond=None)
        self.keep = keep  # condition fields that keep their dtype (moved only)

    @contextlib.contextmanager
    def placed(self, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
        """Take the network's device and dtype as ``(device, dtype)`` for the enclosed calls (one pipeline call,
        which found them with :func:`placement` before its loop, as diffusers finds its execution device once per
        call), and remember the last condition found in place: the per-step calls then neither walk the module's
        parameters nor re-check a condition they have seen (the loop's own work per step,
        benchmarks/pipeline_step_ops.py). Kept in a context variable: per thread, and nothing on the object."""
        token = _PLACED.set((self, [device, dtype, None, 0, False]))
        try:
            yield
        finally:
            _PLACED.reset(token)

    def __call__(self, x: Tensor, t: Tensor, cond: TextCond | None = None) -> Tensor:
        entry = _PLACED.get()
        state = entry[1] if entry is not None and entry[0] is self else None  # [device, dtype, cond, rows, inpaint]
        if state is not None and cond is state[2] and x.shape[0] == state[3]:
            device, dtype = state[0], state[1]  # the condition of the last call (a guided loop's doubled one)
            inpaint = state[4]
        else:
            if cond is None:
                cond = self.null_for(x.shape[0])
            if not isinstance(cond, TextCond):
                raise TypeError(f"a pipeline denoiser takes cond = a TextCond from Pipeline.encode (or None for the "
                                f"empty prompt), got {type(cond).__name__}")
            if cond.batch_size != x.shape[0]:
                raise ValueError(f"cond has {cond.batch_size} rows but x has {x.shape[0]}")
            device, dtype = placement(self.module) if state is None else (state[0], state[1])
            inpaint = "inpaint_channels" in cond  # an inpainting network's extra input channels (image_inputs)
            if not cond.is_on(device, dtype, self.keep):  # the per-step fast path: no copies of a condition in place
                cond = cond.to(device=device, dtype=dtype, keep=self.keep)
            elif state is not None:
                state[2], state[3], state[4] = cond, x.shape[0], inpaint
        # _cast written out here: no helper calls per step (benchmarks/pipeline_step_ops.py counts them)
        x_in = x if x.dtype == dtype and x.device == device else x.to(device=device, dtype=dtype)
        if inpaint:  # [latents, mask, masked image latents]
            x_in = torch.cat([x_in, _cast(cond["inpaint_channels"], dtype, device)], 1)
        if t.dtype != torch.float32 or t.device != device:
            t = t.to(device=device, dtype=torch.float32)
        try:
            out = self.call(self.module, x_in, t, cond)
        except RuntimeError as e:
            if dtype in (torch.float16, torch.bfloat16) and "not implemented for" in str(e):
                name = type(self.module).__name__
                raise RuntimeError(f"{name} in {dtype} on {device}: a kernel this network needs is missing for that "
                                   f"dtype there ({e}); run the pipeline on a GPU, or cast it to float32 yourself "
                                   "(pipe.to(torch.float32)): steerdiff does not change the dtype of your "
                                   "modules") from e
            raise
        return out if out.dtype == x.dtype and out.device == x.device else out.to(device=x.device, dtype=x.dtype)


def placement(module: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device and dtype of a module's weights (its first floating-point parameter), where it runs."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    raise ValueError(f"{type(module).__name__} has no floating-point parameters to take the device and dtype from")


def _cast(v: Tensor, dtype: torch.dtype, device: torch.device | None = None) -> Tensor:
    """``v.to(device, dtype)``, without the call when ``v`` has them already (the per-step case)."""
    if v.dtype == dtype and (device is None or v.device == device):
        return v
    return v.to(device=device, dtype=dtype)


class Family:
    """Base: the pieces of one pipeline family, for a VP (DDPM-style) latent network. ``kind`` is ``"vp"`` or
    ``"flow"``. Subclasses set the class attributes and implement :meth:`encode` and :meth:`call`."""

    name = "family"  # set by register_family
    pipeline_class: type | str = ""  # the diffusers pipeline class (or its name in the diffusers namespace)
    required: tuple[str, ...] = ()  # the pipeline's components from_diffusers checks
    calibration_args: tuple[str, ...] = ()  # the network's positional argument names (calibration_inputs)
    schedulers: Mapping[str, str] = SCHEDULER_METHODS  # diffusers scheduler class -> steerdiff sampler
    kind = "vp"
    packed = False  # latents packed into tokens [B, seq, 4 C] (FLUX)
    embedded_guidance: float | None = None  # the default guidance-embedding value of a guidance-distilled model
    default_steps = 50  # the diffusers pipeline's default num_inference_steps
    default_guidance_scale = 7.5  # its default guidance_scale (FLUX: the embedded guidance)
    max_sequence_length: int | None = None  # T5's default token count (a family with a T5 encoder)
    keep_dtype: tuple[str, ...] = ()  # condition fields passed in their own dtype, not the network's
    upcast_vae = False  # decode a float16 VAE with force_upcast in float32, as the pipeline does (SDXL)

    def __init__(self, pipe: Any):
        self.pipe = pipe

    @classmethod
    def matches(cls, pipe: Any) -> bool:
        """Whether ``pipe`` is a pipeline of this family: by default, an object of exactly ``pipeline_class``."""
        target = cls.pipeline_class
        if isinstance(target, str):
            import diffusers

            target = getattr(diffusers, target, None)
        return isinstance(target, type) and type(pipe) is target

    @property
    def network(self) -> Any:
        return self.pipe.unet

    @property
    def device(self) -> torch.device:
        """Where prompts are encoded: the device of the first text encoder's weights, what ``pipe.device`` finds
        for a pipeline on one device without its walk over every submodule of every component (a fixed cost of
        each call, ~0.3 ms on a small pipeline)."""
        for name in ("text_encoder", "text_encoder_2"):
            encoder = getattr(self.pipe, name, None)
            if isinstance(encoder, torch.nn.Module):
                for p in encoder.parameters():
                    return p.device
        return self.pipe.device

    def default_size(self) -> tuple[int, int]:
        size = self.network.config.sample_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        f = self.pipe.vae_scale_factor
        return int(h) * f, int(w) * f

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor

    def encode(self, prompts: list[str], negatives: list[str] | None, height: int, width: int,
               embedded_guidance: float | None = None, max_sequence_length: int | None = None) -> TextCond:
        raise NotImplementedError

    def call(self, module: Any, x: Tensor, t: Tensor, cond: TextCond) -> Tensor:
        raise NotImplementedError

    def placed(self, device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
        """For one pipeline call: the network runs on ``device`` in ``dtype`` (:func:`placement` of it, found by
        the caller) throughout (:meth:`_Net.placed`); a no-op for a family whose denoiser is its own."""
        net = getattr(self, "_net", None)
        if isinstance(net, _Net) and net.module is self.network:
            return net.placed(device, dtype)
        return contextlib.nullcontext()

    def denoiser(self, null_for) -> Any:
        net = self._net = _Net(self.network, self.call, null_for, self.keep_dtype)
        scheduler = self.pipe.scheduler
        prediction_type = scheduler.config.prediction_type
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"the scheduler's prediction_type must be one of {PREDICTION_TYPES}, got "
                             f"{prediction_type!r}")
        if getattr(scheduler, "alphas_cumprod", None) is None:
            raise ValueError(f"the pipeline's scheduler {type(scheduler).__name__} has no alphas_cumprod (a VP "
                             f"training schedule), which steerdiff's Pipeline converts for a {self.name} pipeline; "
                             f"use one of {sorted(self.schedulers)}")
        abar = _finite_terminal_snr(scheduler.alphas_cumprod.detach().to("cpu", torch.float64))
        # Integer timesteps (leading / trailing spacing) are evaluated exactly; fractional ones (linspace, an Euler
        # scheduler's default) at the interpolated timestep.
        return VPDenoiser(net, abar, prediction_type, quantize=self.integral_timesteps())

    def integral_timesteps(self) -> bool:
        """Whether the scheduler's timesteps are integers (DDIM, DPM-Solver, ...: the training table's levels);
        the sigma-space schedulers with linspace spacing evaluate at fractional timesteps (832.5) on their
        interpolated sigmas."""
        spacing = self.pipe.scheduler.config.get("timestep_spacing", "leading")
        return not (type(self.pipe.scheduler).__name__ in SIGMA_SPACE_SCHEDULERS and spacing == "linspace")

    def scheduler_plan(self, steps: int | None) -> tuple[str, dict[str, Any]] | None:
        """The steerdiff sampler and its options equivalent to the pipeline's scheduler for ``steps`` steps
        (``method=None``), None when :attr:`schedulers` maps none. A class mapped to its built-in equivalent
        (:data:`SCHEDULER_METHODS`) has its options translated or refused by :func:`scheduler_plan`; another
        mapping (a registered family's own) is taken as it is."""
        scheduler = self.pipe.scheduler
        name = type(scheduler).__name__
        method = self.schedulers.get(name)
        if method is None:
            return None
        if SCHEDULER_METHODS.get(name) != method:
            return method, {}
        return scheduler_plan(scheduler, method, steps)

    def default_sigmas(self, pipeline: Any, steps: int, height: int | None, width: int | None) -> Tensor:
        """The scheduler's grid for ``steps`` steps in sigma units (float64 ``[steps + 1]``, ending in 0).

        VP: the scheduler's timesteps (``set_timesteps(steps)`` on a copy) converted through its
        ``alphas_cumprod``, ``sigma = sqrt((1 - abar) / abar)`` (an Euler scheduler's own sigmas, which are those).
        """
        sch = copy.deepcopy(self.pipe.scheduler)
        sch.set_timesteps(steps)
        if type(sch).__name__ in SIGMA_SPACE_SCHEDULERS:
            # Their own sigmas, interpolated at fractional timesteps (never truncated to the table's levels); Heun
            # lists each inner level twice (its two evaluations).
            sig = sch.sigmas.detach().to("cpu", torch.float64)
            return torch.cat([sig[:1], sig[1::2]]) if type(sch).__name__ == "HeunDiscreteScheduler" else sig
        table = pipeline.denoiser.sigmas  # float64, increasing in t
        ts = sch.timesteps.detach().to("cpu", torch.long)
        if type(sch).__name__ == "DDIMScheduler":
            # diffusers' DDIM steps from t to t - num_train_timesteps // steps, not to its next listed timestep: the
            # two agree for leading spacing, not for trailing (or linspace) spacing when steps does not divide it.
            # One sigma list cannot express both levels; ours evaluates and steps on the listed timesteps.
            jump = int(sch.config.num_train_timesteps) // steps
            if len(ts) > 1 and not bool(((ts[:-1] - jump) == ts[1:]).all()):
                warnings.warn(f"DDIM with {sch.config.timestep_spacing!r} spacing at {steps} steps: diffusers steps "
                              f"from each timestep to timestep - {jump}, not to its next timestep, so its result "
                              "differs from this (consistent) schedule; use a step count that divides "
                              f"{int(sch.config.num_train_timesteps)}, leading spacing, or an Euler scheduler to "
                              "match diffusers exactly", RuntimeWarning, stacklevel=3)
        return torch.cat([table[ts], table.new_zeros(1)])


class FlowFamily(Family):
    """Base of the rectified-flow families (Esser et al., ICML 2024, "Scaling Rectified Flow Transformers for
    High-Resolution Image Synthesis"): a transformer predicting velocity through
    :class:`~steerdiff.core.flow.FlowDenoiser` at ``timestep = t_scale * t``, on the flow scheduler's grid
    (:func:`steerdiff.sigmas.flow`, docs/methods/pipelines.md, "Schedules, samplers and guidance")."""

    kind = "flow"
    t_scale = 1000.0  # the transformer's timestep is t_scale * t
    sigma_grid = "scheduler"  # sd.sigmas.flow's base grid: the scheduler's own ("scheduler") or FLUX's ("flux")
    max_shift = 1.16  # the scheduler config's default max_shift for dynamic shifting

    @property
    def network(self):
        return self.pipe.transformer

    def denoiser(self, null_for):
        net = self._net = _Net(self.network, self.call, null_for, self.keep_dtype)
        return FlowDenoiser(net, prediction="velocity", t_scale=self.t_scale)

    def integral_timesteps(self) -> bool:
        return False

    def image_seq_len(self, pipeline: Any, height: int | None, width: int | None) -> int:
        """The transformer's image token count (what the dynamic shift is linear in)."""
        _, h, w = pipeline.latent_shape(height, width)
        p = self.pipe.transformer.config.patch_size
        return (h // p) * (w // p)

    def default_sigmas(self, pipeline: Any, steps: int, height: int | None, width: int | None) -> Tensor:
        """:func:`steerdiff.sigmas.flow` with the scheduler's ``shift``, or its dynamic shift from the image's token
        count (``height``, ``width``)."""
        config = self.pipe.scheduler.config
        n_train = int(config.num_train_timesteps)
        if config.get("use_dynamic_shifting", False):
            return sd_sigmas.flow(steps, image_seq_len=self.image_seq_len(pipeline, height, width),
                                  base_shift=config.get("base_shift", 0.5),
                                  max_shift=config.get("max_shift", self.max_shift),
                                  base_seq_len=config.get("base_image_seq_len", 256),
                                  max_seq_len=config.get("max_image_seq_len", 4096),
                                  num_train_timesteps=n_train, grid=self.sigma_grid)
        return sd_sigmas.flow(steps, shift=float(config.shift), num_train_timesteps=n_train, grid=self.sigma_grid)
