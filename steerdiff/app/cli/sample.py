"""``steerdiff sample``: samples of a built-in mixture or a trained model, unguided or guided.

    steerdiff sample --model gmm2d --class 2 --guidance apg --scale 8 --out out/
    steerdiff sample --model digits --n 256 --out out/
    steerdiff sample --model shapes_coind --expr 'shape=disk & !colour=red' --scale 3 --out out/
    steerdiff sample --model digits --covariance ocm --steps 10 --out out/
    steerdiff sample --model digits --init digits:test:0 --strength 0.5 --class 3 --out out/
    steerdiff sample --pipeline DIR --prompt "a red disk" --negative "a square" --guidance apg --scale 10 --out out/

Guidance is any guider of the registry (``steerdiff.guidance.GUIDERS``: CFG, CFG-rescale of Lin et al. 2023, APG of
Sadat et al. 2025, and what plugins register), with the guider flags its constructor takes (steerdiff/app/cli/
_guiders.py);
``--expr`` samples a logical query over attribute values (CoInD, logical composition, Gaudi et al. 2025);
``--covariance ocm`` samples with the model's learned diagonal covariance (OCM, Ou et al. 2025); ``--init`` starts
from a given sample (diffusers' img2img rule: with ``--strength s`` the run starts at step
``steps - min(int(steps * s), steps)`` of the schedule, from ``init + sigma * noise``). Writes ``samples.png``,
``samples.safetensors`` and ``metrics.json``: NFE and wall time; for a built-in mixture (without ``--init``) the
sliced Wasserstein distance, MMD and mode-weight error to exact samples of the (conditional) target; for digits
models the class accuracy (and FID-digits for n >= 200) under the shipped classifier; for a query on the shapes
models its conformity.

``--seeds 0-9999`` (a range, a comma list or both) names the seeds (``--seed S --n N`` means ``S..S+N-1``); a
sample is a function of its seed alone. The seeds run in chunks of ``--batch`` in global order; under ``torchrun``
(``torchrun --nproc_per_node=2 --no-python -- steerdiff sample ...``) the chunks are shared over the processes and
rank 0 gathers them and writes one result identical to the one-process run (steerdiff/app/cli/_shard.py).
``samples.safetensors`` holds ``samples``, ``seeds`` and, for a conditional model, ``labels``, with the seeds and
the command's options as metadata.

``--pipeline DIR`` samples a diffusers text-to-image pipeline directory (loaded by ``sd.pipelines.load``: safetensors
only, no custom code) instead of ``--model``: ``--n`` images per ``--prompt`` (image ``j`` from seed ``seed + j``),
``--scale`` the same ``w`` as with ``--model`` (default 7.5; above 1 diffusers' ``guidance_scale``, below 1 the
registry's CFG, since diffusers runs the conditional model for any ``guidance_scale <= 1``;
docs/methods/pipelines.md), ``--method`` by default the sampler equivalent to the pipeline's scheduler; it also
writes one ``image_NNN.png`` per image, and ``samples.safetensors`` holds the images in [-1, 1]
(steerdiff/app/cli/_pipelines.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import click
import torch

from ... import core, distributed, metrics
from ...models.gmm import BUILTIN_MIXTURES
from ._common import (
    POSITIVE,
    SEED,
    RegistryChoice,
    check_class,
    check_out,
    check_output_size,
    check_sigmas,
    device_option,
    dtype_name,
    dtype_option,
    finite_range,
    karras_schedule,
    load_denoiser,
    load_model,
    model_to_dtype,
    plot_samples,
    prepare_out,
    progress_option,
    refuse_dtype,
    start_outputs,
    write_metrics,
    write_samples,
)
from ._guiders import GUIDANCE_CHOICE, guider_flag_options, refuse_flags
from ._guiders import build as build_guider
from ._inputs import SPEC_HELP, read_start
from ._pipelines import check_prompts, reject_options, sample_pipeline
from ._schedules import SCHEDULE_CHOICE, registry_schedule
from ._shard import SEEDS, begin, end, format_seeds, map_chunks, rank_device
from .sample_graph import graph_model_dir, sample_graph_model

# Samplers that run without extra inputs (OCM's kernels need a covariance head: --covariance ocm), read from the
# sampler registry when the command runs.
METHODS = RegistryChoice(core.SAMPLERS, lambda _name, spec: not spec.required)
DEFAULT_STRENGTH = 0.8  # diffusers' img2img default
DEFAULT_BATCH = 256  # seeds per chunk: large enough for a CPU to batch well, small enough for a GPU's memory
DEFAULT_N = 16  # a grid for a first try that answers in seconds; metrics want --n 2000 or more
# Options that do not change the samples, left out of the rank check and of samples.safetensors' metadata.
_NOT_OPTIONS = ("out", "progress", "device")


@dataclass
class _Run:
    """What every sampling path shares: the sampler, the schedule, the batch, the device and the start."""

    method: str
    steps: int
    seeds: list[int]
    sigmas: torch.Tensor
    eta: float | None
    progress: bool
    device: torch.device
    dtype: torch.dtype = torch.float32
    init: str | None = None
    strength: float | None = None
    batch: int = DEFAULT_BATCH
    dist: distributed.DistContext = field(default_factory=lambda: distributed.SINGLE)
    solver: object = None  # --solver: the LearnedSolver that method "learned" runs

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def seed(self) -> int:
        """The first seed (the reference samples of a mixture are drawn from it, disjoint from the sampler's)."""
        return self.seeds[0]

    def start_at(self, shape, dtype: torch.dtype) -> dict:
        """``core.sample``'s ``x_start``/``strength`` for ``--init`` (read and checked against ``shape``).

        First the run's size: the samples and their noise, ``n`` rows of ``shape`` in ``dtype``, must fit in memory."""
        check_output_size(self.n, 2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size())
        if self.init is None:
            return {}
        x = read_start(self.init, shape, self.n).to(self.device, dtype)
        return {"x_start": x, "strength": self.strength}

    def seed_info(self) -> dict:
        """How the seeds are recorded in ``metrics.json``."""
        return {"seeds": format_seeds(self.seeds), "batch": self.batch}

    def info(self) -> dict:
        """The start as recorded in ``metrics.json``: the step and noise level the run starts from (and
        ``--ddim-eta`` where given)."""
        eta = {} if self.eta is None else {"ddim_eta": self.eta}
        if self.init is None:
            return eta
        first = self.steps - min(int(self.steps * self.strength), self.steps)
        return eta | {"init": self.init, "strength": self.strength, "start_step": first,
                      "start_sigma": float(self.sigmas[first])}


def _custom_sigmas(ctx, steps: int) -> torch.Tensor | None:
    """``--sigmas FILE``: the schedule it holds (validated), with the schedule-shaping options refused beside it and
    ``--steps``, when given, checked against its length."""
    path = ctx.params.get("sigmas_file")
    if path is None:
        return None
    reject_options(ctx, ("schedule", "schedule_options", "shift", "sigma_min", "sigma_max", "rho"),
                   "--sigmas gives the whole schedule")
    from ...core.schedule_opt import load_sigmas

    try:
        sig = load_sigmas(path)
    except (ValueError, TypeError, OSError) as err:
        raise click.BadParameter(str(err), param_hint="--sigmas") from err
    if ctx.get_parameter_source("steps") == click.core.ParameterSource.COMMANDLINE and steps != sig.numel() - 1:
        raise click.BadParameter(f"--steps {steps} but {path} has {sig.numel() - 1} steps", param_hint="--steps")
    return sig


def _learned_solver(ctx, steps: int):
    """``--solver FILE``: the learned solver it holds (``steerdiff schedule --learned``), which brings its own sampler
    and schedule: the options that would choose either are refused beside it."""
    path = ctx.params.get("solver_file")
    if path is None:
        return None
    reject_options(ctx, ("method", "schedule", "schedule_options", "shift", "sigma_min", "sigma_max", "rho",
                         "sigmas_file", "ddim_eta", "covariance_name", "expr"),
                   "--solver brings its own sampler and schedule")
    from ...core.learned_solver import LearnedSolver

    try:
        solver = LearnedSolver.load(path)
    except (ValueError, OSError) as err:
        raise click.BadParameter(str(err), param_hint="--solver") from err
    if ctx.get_parameter_source("steps") == click.core.ParameterSource.COMMANDLINE and steps != solver.steps:
        raise click.BadParameter(f"--steps {steps} but {path} has {solver.steps} steps", param_hint="--steps")
    return solver


def _check_init(init: str | None, strength: float | None, steps: int) -> float | None:
    """``--init``/``--strength``: the strength used (diffusers' default 0.8), checked to run at least one step."""
    if init is None:
        if strength is not None:
            raise click.BadParameter("--strength applies to --init only", param_hint="--strength")
        return None
    strength = DEFAULT_STRENGTH if strength is None else strength
    if int(steps * strength) < 1:
        raise click.BadParameter(f"{strength:g} with --steps {steps} runs int({steps} * {strength:g}) = 0 steps; "
                                 "raise --strength or --steps", param_hint="--strength")
    return strength


@click.command("sample")
@click.option("--model", "model_name", default="gmm2d", show_default=True,
              help="A built-in mixture (gmm1d, gmm2d, gmm16d), a shipped model (digits, toy2d; graphs_lggm, a graph "
                   "model: graphs from --prompt) or a model directory.")
@click.option("--pipeline", "pipeline_dir", default=None, metavar="DIR",
              help="A diffusers text-to-image pipeline directory (save_pretrained; safetensors only) instead of "
                   "--model; with --prompt, --negative, --height, --width.")
@click.option("--prompt", "prompts", multiple=True,
              help="--pipeline, or a graph model (graphs_lggm): a prompt; repeat for several.")
@click.option("--particles", type=click.IntRange(min=1), default=None,
              help="A graph model with --prompt: FK steering (SMC) with this many particles per graph toward the "
                   "prompt's own asked statistics (steerdiff.discrete.lggm.prompt_reward), at --particles times the "
                   "NFE [default: no steering].")
@click.option("--smc-alpha", "smc_alpha", type=POSITIVE, default=None,
              help="With --particles: the SMC tilt temperature (the reward is the share of the prompt's asked "
                   "statistics met, in [0, 1]; smaller steers harder) [default: 0.05].")
@click.option("--time-power", "time_power", type=POSITIVE, default=None,
              help="A graph model: the ancestral grid's times (1 - i/steps)**p (steps crowded near the data for p > "
                   "1; DeFoG's time distortion) [default: 3.5 with --prompt "
                   "(steerdiff.discrete.graph_train.TEXT_TO_GRAPH_TIME_POWER), else 1].")
@click.option("--negative", "negatives", multiple=True,
              help="--pipeline: a negative prompt, one for all prompts or one per --prompt (default empty).")
@click.option("--height", type=click.IntRange(min=1), default=None, help="--pipeline: image height in pixels.")
@click.option("--width", type=click.IntRange(min=1), default=None, help="--pipeline: image width in pixels.")
@click.option("--method", type=METHODS, default=None,
              help="Sampler [default: heun; with --pipeline the equivalent of the pipeline's scheduler].")
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True, help="Sampling steps.")
@click.option("--n", "n", type=click.IntRange(min=1), default=None,
              help="Number of samples [default: 16, a first look in seconds (metrics want 2000 or more), at least 2; "
                   "with --pipeline: images per prompt, default 1].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Sample i uses seed + i.")
@click.option("--seeds", "seed_list", type=SEEDS, default=None, metavar="SEEDS",
              help="The seeds instead of --seed/--n: a range A-B, a comma list or both (0-9999, 1,5,7, 0-3,10); "
                   "each seed once; sample i uses the i-th seed.")
@click.option("--batch", type=click.IntRange(min=1), default=DEFAULT_BATCH, show_default=True,
              help="Seeds per chunk: the unit of work that processes share under torchrun (a sample depends on its "
                   "seed and, at float rounding, on this chunk size; never on the number of processes).")
@click.option("--class", "class_", type=int, default=None,
              help="Class label for a conditional model (default: classes spread evenly).")
@click.option("--guidance", "guidance_name", type=GUIDANCE_CHOICE, default="cfg", show_default=True,
              help="Guider used when --scale != 1 (steerdiff.guidance.GUIDERS; its options: the guider flags below).")
@click.option("--scale", type=finite_range(min=0), default=None,
              help="Guidance scale w >= 0 in D_u + w (D_c - D_u), with --model and --pipeline alike: 0 = the "
                   "unconditional model (with --pipeline: the negative prompt's), 1 = the conditional model alone; "
                   "above 1 it is diffusers' guidance_scale (below 1 it is not: diffusers runs the conditional model "
                   "for any guidance_scale <= 1). FLUX: the guidance value its transformer embeds "
                   "[default: 1; with --pipeline 7.5].")
@guider_flag_options
@click.option("--schedule", type=SCHEDULE_CHOICE, default="auto", show_default=True,
              help="Noise levels: a registered schedule (steerdiff.core.sigmas.SCHEDULES: karras with sigma-min/max "
                   "and rho, exponential, kl_optimal, ComfyUI's simple, sgm_uniform, beta, ..., Align-Your-Steps "
                   "ays_sd15/ays_sdxl/ays_svd), or flow (from pure noise, sigma = inf: t uniform in (0, 1], FLUX's "
                   "grid, with --shift); auto = flow for a flow-matching model, else karras.")
@click.option("--schedule-option", "schedule_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the --schedule other than --sigma-min/--sigma-max/--rho/--shift (beta: alpha, "
                   "beta; linear_quadratic: threshold_noise, linear_steps); repeatable.")
@click.option("--sigmas", "sigmas_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A JSON schedule (a list of levels ending in 0, or steerdiff schedule's output): replaces "
                   "--schedule/--sigma-min/--sigma-max/--rho/--shift; --steps defaults to its length - 1.")
@click.option("--solver", "solver_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A learned few-step solver for this model (steerdiff schedule --learned): its own sampler "
                   "('learned') and schedule replace --method and the schedule options.")
@click.option("--shift", type=POSITIVE, default=1.0, show_default=True,
              help="Flow schedule: the static time shift s of t' = s t / (1 + (s - 1) t) (3 for SD3).")
@click.option("--sigma-min", type=POSITIVE, default=0.002, show_default=True)
@click.option("--sigma-max", type=POSITIVE, default=80.0, show_default=True)
@click.option("--rho", type=POSITIVE, default=7.0, show_default=True, help="Karras schedule exponent.")
@click.option("--ddim-eta", type=finite_range(0, 1), default=None, help="DDIM stochasticity (ddim only).")
@click.option("--expr", default=None,
              help="Multi-attribute models: a logical query composed over attribute values (CoInD, logical "
                   "composition), e.g. 'shape=disk & !colour=red' or '2*shape=disk & !colour={red,green}'; --scale "
                   "is its weight w.")
@click.option("--compose", "compose_mode", type=click.Choice(["and", "joint"]), default="and", show_default=True,
              help="With --expr: 'and' composes the marginals; 'joint' is joint CFG on the joint label.")
@click.option("--covariance", "covariance_name", type=click.Choice(["none", "ocm"]), default="none",
              show_default=True,
              help="ocm: the model's shipped OCM head (learned diagonal covariance, Ou et al. 2025); samples with "
                   "ocm-ddim (ocm-ddpm with --method ddpm) on the VP-linear grid, unguided.")
@click.option("--init", default=None, metavar="SPEC",
              help=f"Start from this sample instead of pure noise ({SPEC_HELP}); one sample of the model's shape, "
                   "shared by every row, or one per row.")
@click.option("--strength", type=finite_range(0, 1, min_open=True), default=None,
              help=f"With --init: the share of the schedule run, in (0, 1] (default {DEFAULT_STRENGTH}; 1 starts at "
                   "the top noise level).")
@device_option
@dtype_option
@click.option("--out", default="out", show_default=True, help="Output directory.")
@progress_option
@click.pass_context
def sample_cmd(ctx, model_name, pipeline_dir, prompts, particles, smc_alpha, time_power, negatives, height, width,
               method, steps, n, seed, seed_list, batch, class_, guidance_name, scale, schedule, schedule_options,
               shift, sigma_min, sigma_max, rho, ddim_eta, expr, compose_mode, covariance_name, init, strength, device,
               dtype, out, progress, **_guider_flags) -> None:
    """Draw samples; write samples.png, samples.safetensors and metrics.json to --out."""
    # The guider flags (--phi, --eta, ...) are read from ctx where a guider is built (steerdiff/app/cli/_guiders.py).
    dist, started = begin(ctx, "sample", device, ignore=("progress",))
    try:
        graph_dir = graph_model_dir(model_name) if pipeline_dir is None else None
        if graph_dir is not None:  # a graph diffusion model: its own path (docs/methods/lggm.md, "CLI")
            if dist.distributed:
                raise click.UsageError("a graph model samples in one process: launch it without torchrun")
            sample_graph_model(ctx, graph_dir, prompts, n, seed, steps, scale, out, device, particles, smc_alpha,
                               time_power)
            return
        reject_options(ctx, _GRAPH_ONLY, "steer a graph model's prompts only (a continuous model or a pipeline "
                                         "is steered with steerdiff align)")
        if pipeline_dir is not None:
            if dist.distributed:
                raise click.UsageError("--pipeline runs in one process: launch it without torchrun")
            reject_options(ctx, ("seed_list", "batch"), "not used with --pipeline (image j uses seed + j)")
            _sample_pipeline(ctx, pipeline_dir, prompts, negatives, height, width, method, steps, n, seed,
                             guidance_name, scale, device, out, progress, dtype)
            return
        _sample_model(ctx, dist, model_name, method, steps, n, seed, seed_list, batch, class_, guidance_name, scale,
                      schedule, schedule_options, shift, sigma_min, sigma_max, rho, ddim_eta, expr,
                      compose_mode, covariance_name, init, strength, rank_device(dist, device), out, progress, dtype)
    finally:
        end(started)


def _seeds(ctx, seed_list: list[int] | None, seed: int, n: int | None) -> list[int]:
    """The seeds of the run: ``--seeds``, or ``--seed S --n N`` as ``S..S+N-1`` (at least 2 of them)."""
    if seed_list is not None:
        reject_options(ctx, ("seed", "n"), "--seeds names the seeds; give either --seeds or --seed/--n")
        seeds = seed_list
        _check_distinct(seeds)
    else:
        n = DEFAULT_N if n is None else n
        if n < 2:
            raise click.BadParameter(f"{n} is smaller than the minimum 2 (without --pipeline)", param_hint="--n")
        # Lower bound of a row's memory before the model is known: its seed in this list (a Python int and a
        # pointer), its int64 in samples.safetensors, and two float64 values; start_at checks the real size.
        check_output_size(n, 64)
        seeds = list(range(seed, seed + n))
    if len(seeds) < 2:
        raise click.BadParameter(f"{format_seeds(seeds)} is one seed; sample at least 2", param_hint="--seeds")
    return seeds


def _sample_model(ctx, dist, model_name, method, steps, n, seed, seed_list, batch, class_, guidance_name, scale,
                  schedule, schedule_options, shift, sigma_min, sigma_max, rho, ddim_eta, expr, compose_mode,
                  covariance_name, init, strength, device, out, progress, dtype=torch.float32) -> None:
    """``sample --model``: every rank samples its chunks of the seeds; rank 0 measures and writes."""
    reject_options(ctx, ("prompts", "negatives", "height", "width"), "these options apply to --pipeline only")
    method = "heun" if method is None else method
    scale = 1.0 if scale is None else scale
    seeds = _seeds(ctx, seed_list, seed, n)
    check_sigmas(sigma_min, sigma_max)
    custom = _custom_sigmas(ctx, steps)
    solver = _learned_solver(ctx, steps)
    if solver is not None:
        custom, method = solver.sigmas, "learned"
    if custom is not None:
        steps = custom.numel() - 1
    check_out(out)
    strength = _check_init(init, strength, steps)
    if ddim_eta is not None:
        # --covariance ocm samples with ocm-ddim (the default, or --method ddim), which takes eta as DDIM does, or
        # ocm-ddpm (--method ddpm), which has none
        ddim_like = ctx.params["method"] in ((None, "ddim") if covariance_name == "ocm" else ("ddim",))
        if not ddim_like:
            raise click.BadParameter("--ddim-eta applies to --method ddim only (with --covariance ocm: to ocm-ddim, "
                                     "its default sampler; ocm-ddpm has no eta)", param_hint="--ddim-eta")
    if covariance_name != "none":
        if scale != 1.0 or expr is not None:
            raise click.BadParameter("--covariance ocm samples the unguided model (--scale 1, no --expr): the head "
                                     "is the Jacobian of the unguided denoiser", param_hint="--covariance")
        refuse_dtype(dtype, "sample --covariance ocm", "the OCM head and its variances run in float32")
        if model_name in BUILTIN_MIXTURES:
            raise click.BadParameter("built-in mixtures have no shipped head; use a shipped model such as digits",
                                     param_hint="--covariance")
        if ctx.params["method"] not in (None, "ddim", "ddpm"):  # any other sampler would be replaced by ocm-ddim
            raise click.BadParameter(f"--covariance ocm samples with ocm-ddim (--method ddim) or ocm-ddpm (--method "
                                     f"ddpm), not {ctx.params['method']}", param_hint="--method")
    run = _Run(method, steps, seeds, core.sigmas.karras(steps, sigma_min, sigma_max, rho), ddim_eta,
               progress and dist.is_main, device, dtype, init, strength, batch, dist, solver)
    pipeline_only = ("pipeline_dir", "prompts", "negatives", "height", "width", "seed_list")  # seeds: on their own
    options = {k: v for k, v in ctx.params.items() if k not in _NOT_OPTIONS + pipeline_only + _GRAPH_ONLY}
    if expr is None:
        reject_options(ctx, ("compose_mode",), "applies with --expr only (how the query composes)")
    else:
        refuse_flags(ctx, "--expr composes its own guider; the guider flags apply to --guidance")
        if schedule not in ("auto", "karras"):
            raise click.BadParameter("--expr samples on the Karras schedule (--sigma-min, --sigma-max, --rho)",
                                     param_hint="--schedule")
        reject_options(ctx, ("shift", "schedule_options"), "--expr samples on the Karras schedule, which has no "
                                                           "shift and no other option")
        run.sigmas = karras_schedule(steps, sigma_min, sigma_max, rho)
        _sample_expr(model_name, expr, compose_mode, scale, class_, guidance_name, run, out, options)
        return
    if scale == 1.0:
        refuse_flags(ctx, "no guider runs at --scale 1 (the plain conditional model); give --scale with the guider "
                          "flags")
        reject_options(ctx, ("guidance_name",), "no guider runs at --scale 1 (the plain conditional model); give "
                                                "--scale too")
    guider = build_guider(ctx, guidance_name, scale)
    model, is_mixture = load_denoiser(model_name, device)
    if is_mixture:
        refuse_dtype(dtype, "sample", f"{model_name} is a built-in mixture, an exact denoiser evaluated in float64")
    else:
        model = model_to_dtype(model, dtype, "sample", model_name)
    if schedule == "flow" or (schedule == "auto" and isinstance(model, core.FlowDenoiser)):
        if covariance_name != "none":
            raise click.BadParameter("--covariance ocm runs on the VP-linear grid, not a flow schedule",
                                     param_hint="--schedule")
        run.sigmas = core.sigmas.flow(steps, shift, grid="flux")
        schedule = "flow"
    elif schedule == "auto":
        schedule = "karras"
    if covariance_name == "ocm" and schedule != "karras":
        raise click.BadParameter(f"--covariance ocm runs on the VP-linear grid, not --schedule {schedule}",
                                 param_hint="--schedule")
    # The options of the schedules the run does not use (ocm: the VP-linear grid; flow: from pure noise on FLUX's
    # grid with --shift; a registered schedule: its function's parameters) would be ignored: refuse them.
    if covariance_name == "ocm":
        reject_options(ctx, ("shift", "sigma_min", "sigma_max", "rho", "schedule_options"),
                       "--covariance ocm samples on the VP-linear grid the head was trained on")
    elif schedule == "flow":
        reject_options(ctx, ("sigma_min", "sigma_max", "rho"), "the flow schedule runs from pure noise on FLUX's "
                                                               "grid (its option: --shift); these shape the Karras "
                                                               "schedule")
        reject_options(ctx, ("schedule_options",), "the flow schedule's one option is --shift")
    else:
        run.sigmas, schedule_record = registry_schedule(ctx, schedule, model, model_name, steps, sigma_min,
                                                        sigma_max, rho, shift, schedule_options)
    if custom is not None:
        if covariance_name != "none" or expr is not None:
            raise click.BadParameter("--covariance ocm and --expr use their own grids", param_hint="--sigmas")
        run.sigmas, schedule = custom, "custom"
    if is_mixture:
        result = _sample_mixture(model, model_name, out, class_=class_, scale=scale, guider=guider, run=run,
                                 options=options)
    else:
        head = None
        if covariance_name == "ocm":
            from ...core.sigmas import vp_linear
            from ...covariance import load_head_for
            from ...io import CheckpointError

            try:
                head = load_head_for(model_name, model).to(device)
            except (CheckpointError, FileNotFoundError) as err:
                raise click.BadParameter(str(err), param_hint="--covariance") from err
            run.sigmas = vp_linear(steps)  # the grid the head was trained and benchmarked on
            run.method = "ocm-ddpm" if method == "ddpm" else "ocm-ddim"
        result = _sample_network(model, model_name, out, class_=class_, scale=scale, guider=guider, run=run,
                                 covariance=head, options=options)
    if result is None:  # not rank 0: it sampled its chunks, rank 0 writes
        return
    if scale != 1.0:
        result["guidance"] = {"name": guidance_name, **guider.config}
        if hasattr(guider, "weak_evaluations"):  # AutoGuidance: the weak model's evaluations, beside "nfe"
            result["guidance"]["weak_nfe"] = guider.weak_evaluations
    if covariance_name == "ocm":
        result["schedule"] = {"kind": "vp-linear", "steps": steps}
    elif schedule == "flow":
        result["schedule"] = {"kind": "flow", "grid": "flux", "shift": shift, "steps": steps}
    elif schedule == "custom":
        result["schedule"] = {"kind": "learned" if solver is not None else "custom",
                              "file": ctx.params["solver_file"] or ctx.params["sigmas_file"],
                              "sigmas": ["inf" if s == float("inf") else s for s in run.sigmas.tolist()]}
    else:
        result["schedule"] = schedule_record
    _finish(result, Path(out))


# Options of the --model path that a pipeline does not take (its schedule and condition come from the pipeline).
def _check_distinct(seeds: list[int]) -> None:
    """Refuse a seed named twice in ``--seeds`` (it would draw the same sample twice and count it twice)."""
    order = torch.tensor(seeds, dtype=torch.int64).sort().values
    repeated = order[1:][order[1:] == order[:-1]].unique().tolist()
    if repeated:
        shown = ", ".join(map(str, repeated[:10])) + (f" (and {len(repeated) - 10} more)" if len(repeated) > 10 else "")
        raise click.BadParameter(f"repeats seed{'s' if len(repeated) > 1 else ''} {shown}: name each seed once",
                                 param_hint="--seeds")


_GRAPH_ONLY = ("particles", "smc_alpha", "time_power")
_MODEL_ONLY = ("model_name", "class_", "schedule", "schedule_options", "shift", "sigma_min", "sigma_max", "rho",
               "ddim_eta", "expr", "compose_mode", "covariance_name", "init", "strength",
               "sigmas_file", "solver_file")


def _sample_pipeline(ctx, pipeline_dir, prompts, negatives, height, width, method, steps, n, seed, guidance_name,
                     scale, device, out, progress, dtype=torch.float32) -> None:
    """``sample --pipeline DIR``: text to image with a diffusers pipeline (steerdiff/app/cli/_pipelines.py)."""
    if ctx.get_parameter_source("model_name") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--pipeline and --model are mutually exclusive: sample a pipeline directory or a "
                               "model, not both")
    reject_options(ctx, _MODEL_ONLY, "not used with --pipeline (its schedule and prompts define the run)")
    prompts, negatives = check_prompts(prompts, negatives)
    check_out(out)
    scale = 7.5 if scale is None else scale
    # diffusers' own CFG for cfg (its guidance_scale); any other guider of the registry through the pipeline
    guider = build_guider(ctx, guidance_name, scale)  # built for cfg too: it checks the guider flags given
    if guidance_name == "cfg" and scale >= 1:
        # diffusers' own CFG (its guidance_scale: the same numbers as CFG(scale) above 1, the conditional model alone
        # at 1). Below 1 the registry's CFG(scale) runs instead, so that --scale means w of D_u + w (D_c - D_u) with
        # --pipeline as with --model (0: the unconditional model), where diffusers' guidance_scale <= 1 would run the
        # conditional model alone.
        guider = None
    sample_pipeline(pipeline_dir, prompts, negatives, 1 if n is None else n, guidance_name=guidance_name,
                    guider=guider, scale=scale, method=method, steps=steps, seed=seed, height=height, width=width,
                    device=device, out=out, progress=progress, dtype=dtype)


def _draw(model, shape, dtype: torch.dtype, run: _Run, cond, guidance, start: dict, **extra):
    """``core.sample`` with the run's settings on every chunk of ``--batch`` seeds of this rank, gathered in seed
    order on every rank: ``(samples [n, *shape] on the CPU, stats)``.

    Row ``i`` starts from the noise of seed ``seeds[i]`` and its sampler noise comes from seed ``seeds[i] + 10**9``
    (as ``core.randn(seeds=seed)`` and ``generator=seed + 10**9`` gave before there were chunks). ``stats.nfe`` is
    per sample, ``stats.wall_time`` the longest rank's sampling time, ``stats.extras`` the sampler's counts summed
    over all chunks. A bad start or condition found by the sampler is a usage error.
    """
    numbers = ("nfe_rows", "calls") + (("clamped",) if extra.get("covariance") is not None else ())

    def one(c: slice):
        seeds = run.seeds[c]
        noise = core.randn((len(seeds), *shape), seeds=seeds, dtype=dtype, device=run.device)
        part = {k: (v[c] if isinstance(v, torch.Tensor) else v) for k, v in start.items()}
        try:
            x, stats = core.sample(model, noise, run.sigmas, method=run.method,
                                   cond=None if cond is None else cond[c], guidance=guidance,
                                   generator=[s + 10**9 for s in seeds], eta=run.eta, solver=run.solver,
                                   progress=run.progress and len(run.seeds) <= run.batch, return_stats=True,
                                   **part, **extra)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
        values = {"nfe_rows": stats.nfe * len(seeds), "calls": stats.calls}
        if "clamped" in numbers:
            values["clamped"] = stats.clamped
        return {"samples": x}, values

    with torch.no_grad():
        out, per_rank = map_chunks(run.dist, run.n, run.batch, one, numbers, progress=run.progress)
    total = {k: sum(r[k] for r in per_rank) for k in numbers}
    stats = core.SampleStats(nfe=total["nfe_rows"] / run.n, calls=int(total["calls"]),
                             wall_time=max(r["wall_time_s"] for r in per_rank),
                             extras={"clamped": int(total["clamped"])} if "clamped" in total else {})
    return out["samples"], stats


def _save(samples: torch.Tensor, out_dir: Path, run: _Run, options: dict, cond=None) -> None:
    """``samples.safetensors``: the samples, their seeds and labels; the seeds and options as metadata."""
    tensors = {"samples": samples, "seeds": torch.tensor(run.seeds, dtype=torch.int64)}
    if cond is not None:
        tensors["labels"] = cond.cpu()
    start_outputs(out_dir)  # the summary (metrics.json, _finish) comes last: a failure in between leaves none
    write_samples(out_dir, tensors, {"command": "sample", "seeds": format_seeds(run.seeds), "options": options})


# Guided image samples past where the guidance steers (issue 35): the share of sample values beyond 1.5 x the data's
# bound (images lie in [-1, 1]; the data and the unguided model's samples have none there). Measured on the digits
# model with the shipped classifier (docs/bad_inputs_sweep.md, "Guidance scale"): Heun 18 steps, 100 samples, CFG:
# share 0 up to scale 12 (class accuracy 1.0), 0.035 at 30 (1.0), 0.19 at 50 (1.0, pixels saturating), 0.49 at 100
# (0.99), 0.72 at 300 (0.6), 0.97 at 10,000 (0.32); APG: 0.006 at 30, 0.07 at 50, 0.31 at 100 (0.95), 0.93 at 10,000
# (0.34). Heun 10 steps, 20-40 samples, CFG: 0.004 at 10 (0.85), 0.06 at 20 (0.55), 0.27 at 50 (0.4). Every run
# whose accuracy fell below 0.8 has a share above 5% (a coarse schedule's own loss, 0.85 at scale 10, stays unseen).
# The 1e4-data-scale rule of core.sampling.check_guided_range never fires on digits up to scale 1e4 (|x| reaches 60).
SATURATED_SHARE = 0.05
IMAGE_BOUND = 1.0


def _saturation(samples: torch.Tensor, scale: float, flag: str = "--scale") -> tuple[float, str | None]:
    """``(share of values beyond 1.5 x IMAGE_BOUND, warning or None)`` for guided image samples ``[N, C, H, W]``."""
    share = float((samples.detach().abs() > 1.5 * IMAGE_BOUND).float().mean())
    if share <= SATURATED_SHARE:
        return share, None
    return share, (f"{flag} {scale:g}: {share:.0%} of the sample values lie beyond 1.5 x the images' range [-1, 1] "
                   f"(more than {SATURATED_SHARE:.0%}): the guidance is past where it steers and the images saturate "
                   "(on digits the class accuracy falls with it: 0.55 at 6%, 0.6 at 72%); lower " + flag)


def _warn_saturation(result: dict, samples: torch.Tensor, scale: float) -> None:
    """Record the saturated share in ``result`` and warn (stderr and ``result["warnings"]``) above
    :data:`SATURATED_SHARE`."""
    share, warning = _saturation(samples, scale)
    result["share_beyond_image_range"] = share
    if warning is not None:
        result.setdefault("warnings", []).append(warning)
        click.echo(f"warning: {warning}", err=True)


def _finish(result: dict, out_dir: Path) -> None:
    """Write metrics.json and print its numbers."""
    path = write_metrics(out_dir, result)
    for key, value in result.items():
        if isinstance(value, float):
            click.echo(f"{key:>26}: {value:.4g}")
    click.echo(f"wrote {path}, {out_dir / 'samples.png'} and {out_dir / 'samples.safetensors'}")


def _sample_mixture(mixture, model_name, out, class_, scale, guider, run: _Run, options: dict) -> dict | None:
    """A built-in mixture's exact denoiser, measured against exact samples of the (conditional) target."""
    target, cond = mixture, None
    if class_ is not None:  # the exact conditional model: the components carrying that label
        k = mixture.n_components
        if not 0 <= class_ < k:
            raise click.BadParameter(f"must be in [0, {k - 1}] for {model_name}", param_hint="--class")
        target, cond = mixture.restrict(torch.tensor(class_)), torch.full((run.n,), class_, device=run.device)
    elif scale != 1.0:
        raise click.BadParameter("guidance (--scale != 1) needs --class", param_hint="--scale")
    start = run.start_at(mixture.sample_shape, torch.float64)
    out_dir = prepare_out(out) if run.dist.is_main else None
    samples, stats = _draw(mixture, (mixture.dim,), torch.float64, run, cond, guider if scale != 1.0 else None, start)
    if not run.dist.is_main:
        return None
    result = {"model": model_name, "method": run.method, "steps": run.steps, "n": run.n, "seed": run.seed,
              "class": class_, "scale": scale, "nfe": stats.nfe, "wall_time_s": stats.wall_time} | run.info()
    result |= run.seed_info()
    # Reference: exact samples of the (conditional) target from a seed disjoint from the sampler's. A run from
    # --init targets another law (the posterior around the start, for a stochastic sampler), so none is reported.
    g = torch.Generator().manual_seed(run.seed + 2 * 10**9)
    exact, exact2 = target.sample(run.n, generator=g), target.sample(run.n, generator=g)
    if run.init is None:
        result |= {
            "sliced_w2_to_exact": metrics.sliced_wasserstein(samples, exact),
            "sliced_w2_exact_vs_exact": metrics.sliced_wasserstein(exact2, exact),
            "mmd_rbf_to_exact": metrics.mmd_rbf(samples, exact),
            "mode_weight_error": metrics.mode_weight_error(samples, target),
            "mode_weight_error_exact": metrics.mode_weight_error(exact, target),
        }
    _save(samples, out_dir, run, options, cond)
    title = f"{model_name}: {run.method}, {run.steps} steps, NFE {stats.nfe:g}"
    if "sliced_w2_to_exact" in result:
        title += f", SW2 {result['sliced_w2_to_exact']:.3f}"
    plot_samples(samples, out_dir / "samples.png", reference=exact, title=title)
    return result


def _sample_expr(model_name, expr, mode, scale, class_, guidance_name, run: _Run, out, options: dict) -> None:
    """``sample --expr``: logical composition over attribute values with :class:`steerdiff.guidance.Compose`."""
    from ...guidance import Compose, load_composable

    if class_ is not None or guidance_name != "cfg":
        raise click.BadParameter("--expr defines the query; do not combine it with --class or --guidance",
                                 param_hint="--expr")
    if model_name in BUILTIN_MIXTURES:
        raise click.BadParameter(f"{model_name} has no attribute slots; use a multi-attribute model such as "
                                 "shapes_coind", param_hint="--model")
    model = load_model(model_name, extra=sorted(BUILTIN_MIXTURES), loader=load_composable, device=run.device)
    model = model_to_dtype(model, run.dtype, "sample", model_name)
    try:
        guider = Compose.for_model(model, expr, scale, mode=mode)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--expr") from err
    start = run.start_at(model.sample_shape, torch.float32)
    out_dir = prepare_out(out) if run.dist.is_main else None
    cond = guider.cond(run.n, run.device)
    samples, stats = _draw(model, model.sample_shape, torch.float32, run, cond, guider, start)
    if not run.dist.is_main:
        return
    result = {"model": model_name, "method": run.method, "steps": run.steps, "n": run.n, "seed": run.seed,
              "expr": expr, "guidance": {"name": "compose", **guider.config}, "nfe": stats.nfe,
              "wall_time_s": stats.wall_time, "dtype": dtype_name(run.dtype)} | run.info() | run.seed_info()
    from ...models.io import load, shipped_models

    if samples.shape[1:] == (3, 12, 12) and "shapes_classifier" in shipped_models():
        from ...metrics.composition import conformity

        pred = load("shapes_classifier").predict(samples.clamp(-1, 1))
        result["conformity"] = conformity(pred, guider.terms)
    if len(model.sample_shape) == 3 and scale != 1.0:
        _warn_saturation(result, samples, scale)
    _save(samples, out_dir, run, options, cond)
    plot_samples(samples, out_dir / "samples.png", title=f"{model_name}: {expr}", max_images=256)
    _finish(result, out_dir)


def _sample_network(model, model_name, out, class_, scale, guider, run: _Run, covariance=None,
                    options: dict | None = None) -> dict | None:
    """A trained model, unconditional or class-conditional (classes spread evenly unless --class)."""
    num_classes = tuple(getattr(model, "num_classes", ()) or ())
    cond = None
    if num_classes:
        if len(num_classes) != 1:
            raise click.BadParameter("multi-attribute models are sampled with --expr, e.g. "
                                     "--expr 'shape=disk & !colour=red'", param_hint="--model")
        check_class(class_, num_classes, model_name)
        k = num_classes[0]
        cond = torch.full((run.n,), class_) if class_ is not None else torch.arange(run.n) % k
        cond = cond.to(run.device)
    elif class_ is not None or scale != 1.0:
        raise click.BadParameter(f"{model_name} is unconditional", param_hint="--class")
    # The sampler's state stays in float32 whatever --dtype the network runs in (the denoiser casts its input to the
    # network's dtype and its output back): in bfloat16 a state of scale sigma_max = 80 would be rounded to 0.5 and
    # the small late updates lost (EDM runs its sampler state in float64 for the same reason).
    start = run.start_at(model.sample_shape, torch.float32)
    out_dir = prepare_out(out) if run.dist.is_main else None
    samples, stats = _draw(model, model.sample_shape, torch.float32, run, cond, guider if scale != 1.0 else None,
                           start, covariance=covariance)
    if not run.dist.is_main:
        return None
    result = {"model": model_name, "method": run.method, "steps": run.steps, "n": run.n, "seed": run.seed,
              "scale": scale, "class": class_, "nfe": stats.nfe, "wall_time_s": stats.wall_time,
              "dtype": dtype_name(run.dtype)} | run.info()
    result |= run.seed_info()
    if covariance is not None:
        result["clamped_variances"] = stats.clamped
    if len(model.sample_shape) == 3:
        result.update(_image_metrics(samples, None if cond is None else cond.cpu(), class_))
        if scale != 1.0:
            _warn_saturation(result, samples, scale)
    _save(samples, out_dir, run, options or {}, cond)
    plot_samples(samples, out_dir / "samples.png", title=f"{model_name}: {run.method}, {run.steps} steps",
                 max_images=256)
    return result


def _image_metrics(samples: torch.Tensor, cond, class_: int | None = None) -> dict:
    """Class accuracy (and FID-digits for n >= 200) with the shipped digits classifier, for digits models.

    FID is measured against the test images of the classes sampled: all of them, or only ``class_``'s (against
    the whole test set a one-class sample would score its missing classes, not its quality)."""
    from ...models.io import load, shipped_models

    if samples.shape[1:] != (1, 8, 8) or "digits_classifier" not in shipped_models():
        return {}
    from ...data.digits import load_digits
    from ...metrics.images import class_accuracy, classifier_features, frechet_distance

    clf = load("digits_classifier")
    images = samples.clamp(-1, 1)
    out = {}
    if cond is not None:
        out["class_accuracy"] = class_accuracy(clf, images, cond)
    if images.shape[0] >= 200:
        test_images, test_labels = load_digits("test")
        key = "fid_digits_vs_test"
        if class_ is not None:
            test_images, key = test_images[test_labels == class_], f"fid_digits_vs_test_class_{class_}"
        out[key] = frechet_distance(classifier_features(clf, test_images), classifier_features(clf, images))
    return out
