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

import copy
import warnings
from collections.abc import Callable, Mapping
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
    "EulerDiscreteScheduler": "euler",
    "FlowMatchEulerDiscreteScheduler": "euler",
    "DPMSolverMultistepScheduler": "dpmpp_2m",
    "UniPCMultistepScheduler": "unipc",
}
"""The steerdiff sampler equivalent to each diffusers scheduler: the default of :attr:`Family.schedulers`."""


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

    def __call__(self, x: Tensor, t: Tensor, cond: TextCond | None = None) -> Tensor:
        if cond is None:
            cond = self.null_for(x.shape[0])
        if not isinstance(cond, TextCond):
            raise TypeError(f"a pipeline denoiser takes cond = a TextCond from Pipeline.encode (or None for the "
                            f"empty prompt), got {type(cond).__name__}")
        if cond.batch_size != x.shape[0]:
            raise ValueError(f"cond has {cond.batch_size} rows but x has {x.shape[0]}")
        device, dtype = placement(self.module)
        if not cond.is_on(device, dtype, self.keep):  # the per-step fast path: no copies of a condition in place
            cond = cond.to(device=device, dtype=dtype, keep=self.keep)
        x_in = _cast(x, dtype, device)
        if "inpaint_channels" in cond:  # an inpainting network: [latents, mask, masked image latents] (image_inputs)
            x_in = torch.cat([x_in, _cast(cond["inpaint_channels"], dtype, device)], 1)
        try:
            out = self.call(self.module, x_in, _cast(t, torch.float32, device), cond)
        except RuntimeError as e:
            if dtype in (torch.float16, torch.bfloat16) and "not implemented for" in str(e):
                name = type(self.module).__name__
                raise RuntimeError(f"{name} in {dtype} on {device}: a kernel this network needs is missing for that "
                                   f"dtype there ({e}); run the pipeline on a GPU, or cast it to float32 yourself "
                                   "(pipe.to(torch.float32)): steerdiff does not change the dtype of your "
                                   "modules") from e
            raise
        return _cast(out, x.dtype, x.device)


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

    def denoiser(self, null_for) -> Any:
        net = _Net(self.network, self.call, null_for, self.keep_dtype)
        scheduler = self.pipe.scheduler
        prediction_type = scheduler.config.prediction_type
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"the scheduler's prediction_type must be one of {PREDICTION_TYPES}, got "
                             f"{prediction_type!r}")
        abar = _finite_terminal_snr(scheduler.alphas_cumprod.detach().to("cpu", torch.float64))
        # Integer timesteps (leading / trailing spacing) are evaluated exactly; fractional ones (linspace, an Euler
        # scheduler's default) at the interpolated timestep.
        return VPDenoiser(net, abar, prediction_type, quantize=self.integral_timesteps())

    def integral_timesteps(self) -> bool:
        spacing = self.pipe.scheduler.config.get("timestep_spacing", "leading")
        return not (type(self.pipe.scheduler).__name__ == "EulerDiscreteScheduler" and spacing == "linspace")

    def default_sigmas(self, pipeline: Any, steps: int, height: int | None, width: int | None) -> Tensor:
        """The scheduler's grid for ``steps`` steps in sigma units (float64 ``[steps + 1]``, ending in 0).

        VP: the scheduler's timesteps (``set_timesteps(steps)`` on a copy) converted through its
        ``alphas_cumprod``, ``sigma = sqrt((1 - abar) / abar)`` (an Euler scheduler's own sigmas, which are those).
        """
        sch = copy.deepcopy(self.pipe.scheduler)
        sch.set_timesteps(steps)
        if type(sch).__name__ == "EulerDiscreteScheduler":
            return sch.sigmas.detach().to("cpu", torch.float64)
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
        net = _Net(self.network, self.call, null_for, self.keep_dtype)
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
