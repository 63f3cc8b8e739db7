"""``--pipeline DIR`` for ``steerdiff sample`` and ``steerdiff align``: a diffusers pipeline directory, loaded
safely through :func:`steerdiff.pipelines.load`, prompts, image sizes, decoded-image rewards and the outputs.

Rewards of decoded images go through :func:`steerdiff.pipelines.on_images` (differentiable through the VAE
decoder). Loading errors (a missing directory, pickle-only weights, custom code, an unsupported pipeline family)
become click errors naming ``--pipeline``; sizes the VAE cannot take become errors naming ``--height`` / ``--width``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click
import torch
from torch import Tensor

from ._common import plot_samples, prepare_out, start_outputs, write_metrics


# ----------------------------------------------------------------------------------------------- options
def reject_options(ctx: click.Context, names: Sequence[str], reason: str) -> None:
    """A usage error when any of the parameters ``names`` was given on the command line (not left at its default)."""
    given = [n for n in names if ctx.get_parameter_source(n) not in (None, click.core.ParameterSource.DEFAULT)]
    if given:
        flags = {p.name: p.opts[0] for p in ctx.command.params}
        raise click.UsageError(f"{', '.join(flags[n] for n in given)}: {reason}")


def check_prompts(prompts: Sequence[str], negatives: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``--prompt`` (one or more) and ``--negative`` (none, one for every prompt, or one per prompt)."""
    prompts = list(prompts)
    if not prompts:
        raise click.BadParameter("--pipeline needs at least one --prompt", param_hint="--prompt")
    negatives = list(negatives) or None
    if negatives is not None and len(negatives) not in (1, len(prompts)):
        raise click.BadParameter(f"got {len(negatives)} --negative for {len(prompts)} --prompt: give one negative "
                                 "prompt for all, or one per --prompt (in the same order)", param_hint="--negative")
    if negatives is not None and len(negatives) == 1:
        negatives = negatives * len(prompts)
    return prompts, negatives


def _vae_factor(root: Path) -> int | None:
    """The VAE's downsampling factor ``2 ** (len(block_out_channels) - 1)`` read from ``vae/config.json``."""
    try:
        config = json.loads((root / "vae" / "config.json").read_text())
        return 2 ** (len(config["block_out_channels"]) - 1)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the loader reports a missing or broken VAE


def check_size(root: Path, height: int | None, width: int | None) -> None:
    """``--height`` / ``--width`` multiples of the VAE's factor, checked from its config before anything loads."""
    factor = _vae_factor(root)
    if factor is None:
        return
    for hint, value in (("--height", height), ("--width", width)):
        if value is not None and value % factor:
            raise click.BadParameter(f"{value} is not a multiple of {factor}, the VAE's downsampling factor "
                                     f"(2 ** (len(vae.block_out_channels) - 1))", param_hint=hint)


# ----------------------------------------------------------------------------------------------- loading
# Load-time notices about optional backends steerdiff does not use (torchvision for CLIP's image processor, which
# the pipelines never call; accelerate's low-memory loading of models of a few MB): nothing a CLI user can act on, so
# they are dropped from the command's output. Only these messages, on the loggers that emit them.
_BACKEND_NOTICES = {
    "transformers.utils.import_utils": "requires torchvision (not installed)",
    "diffusers.pipelines.pipeline_utils": "because `accelerate` was not found",
    "diffusers.models.modeling_utils": "because `accelerate` was not found",
}


class _DropNotice(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_backend_notices() -> None:
    """Drop :data:`_BACKEND_NOTICES` (idempotent)."""
    for name, text in _BACKEND_NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) for f in logger.filters):
            logger.addFilter(_DropNotice(text))


@contextlib.contextmanager
def _loading_bars(progress: bool):
    """diffusers' and transformers' loading bars on or off for the block (each library's setting restored)."""
    import importlib

    libs = []
    for name in ("diffusers.utils.logging", "transformers.utils.logging"):
        try:
            libs.append(importlib.import_module(name))
        except ImportError:  # pipelines.load names a missing library itself
            pass
    saved = [(lib, lib.is_progress_bar_enabled()) for lib in libs]
    for lib, _ in saved:
        (lib.enable_progress_bar if progress else lib.disable_progress_bar)()
    try:
        yield
    finally:
        for lib, was in saved:
            (lib.enable_progress_bar if was else lib.disable_progress_bar)()


def load_pipeline(path: str, device: torch.device, height: int | None = None, width: int | None = None,
                  progress: bool = True, dtype: torch.dtype = torch.float32):
    """``sd.pipelines.load(path)`` on ``device`` in ``dtype`` (``--dtype``: every component moved to it), with
    ``height`` / ``width`` checked; errors name the option.
    Without ``progress`` the loading bars of diffusers and transformers are off for the load."""
    quiet_backend_notices()
    from ... import pipelines
    from ...pipelines.load import resolve

    try:
        root = resolve(path)
    except FileNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="--pipeline") from err
    if not root.is_dir():
        raise click.BadParameter(f"{path!r} is not a directory (a diffusers save_pretrained folder) nor a shipped "
                                 "pipeline", param_hint="--pipeline")
    check_size(root, height, width)
    try:
        with _loading_bars(progress):
            pipeline = pipelines.load(root)
    except (FileNotFoundError, ValueError, ImportError, OSError, TypeError) as err:
        raise click.BadParameter(str(err), param_hint="--pipeline") from err
    if device.type != "cpu" or dtype != torch.float32:
        pipeline.pipe.to(device, dtype)
    try:
        pipeline.latent_shape(height, width)
    except ValueError as err:
        hint = "--width" if str(err).startswith("width") else "--height"
        raise click.BadParameter(str(err), param_hint=hint) from err
    return pipeline


def initial_latents(pipeline, rows: int, seed: int, height: int | None, width: int | None,
                    device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[Tensor, list[torch.Generator]]:
    """Unit-noise latents, row ``j`` from its own CPU generator seeded ``seed + j`` (so an image never depends on
    its batch), and those generators (advanced past the draw) for a stochastic sampler."""
    shape = pipeline.latent_shape(height, width)
    gens = [torch.Generator().manual_seed(seed + j) for j in range(rows)]
    latents = torch.cat([torch.randn((1, *shape), generator=g) for g in gens])
    return latents.to(device, dtype), gens


# ----------------------------------------------------------------------------------------------- rewards
def pixel_reward(spec: str) -> Callable[[Tensor], Tensor]:
    """A pixel reward of decoded images by name: ``ink``, ``symmetry`` (steerdiff.align.rewards) or ``red``."""
    from ...align.rewards import ink, redness, symmetry

    table = {"ink": ink, "symmetry": symmetry, "red": redness}
    if spec not in table:
        raise click.BadParameter(f"{spec!r}: with --pipeline use a reward of decoded images, one of {sorted(table)}",
                                 param_hint="--reward")
    return table[spec]


class PromptDenoiser:
    """The pipeline's latent denoiser with integer labels ``i`` meaning the ``i``-th encoded prompt (the reward
    samplers of ``steerdiff.align`` carry integer conditions per row), optionally classifier-free guided at scale
    ``w`` (``D_u + w (D_c - D_u)``, two evaluations per call). ``cond=None`` evaluates the first prompt."""

    def __init__(self, pipeline, cond, scale: float = 1.0):
        self.denoiser = pipeline.denoiser
        self.cond = cond
        self.scale = float(scale)
        self.sigma_range = getattr(self.denoiser, "sigma_range", None)

    @property
    def evaluations(self) -> int:
        """Network evaluations per call."""
        return 1 if self.scale == 1.0 else 2

    def __call__(self, z: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        labels = torch.zeros(z.shape[0], dtype=torch.long) if cond is None else torch.as_tensor(cond).long().cpu()
        c = self.cond.index(labels)
        d_cond = self.denoiser(z, sigma, c)
        if self.scale == 1.0:
            return d_cond
        d_null = self.denoiser(z, sigma, c.null_like())
        return d_null + self.scale * (d_cond - d_null)


# ----------------------------------------------------------------------------------------------- outputs
def save_images(images: Tensor, out_dir: Path, title: str) -> list[str]:
    """``samples.safetensors`` (images in [-1, 1]), the grid ``samples.png`` and ``image_{j:03d}.png`` per image."""
    from PIL import Image

    from ...io import save_tensors

    images = images.detach().float().cpu().clamp(-1, 1).contiguous()
    start_outputs(out_dir)  # the summary (metrics.json, finish) comes last: a failure in between leaves none
    save_tensors({"samples": images}, out_dir / "samples.safetensors")
    plot_samples(images, out_dir / "samples.png", title=title, max_images=256)
    arr = ((images + 1) / 2).permute(0, 2, 3, 1).mul(255).round().to(torch.uint8).numpy()
    names = []
    for j, a in enumerate(arr):
        name = f"image_{j:03d}.png"
        Image.fromarray(a).save(out_dir / name)
        names.append(name)
    return names


def finish(result: dict, out: str) -> Path:
    """Write ``metrics.json`` into ``out`` and say what was written."""
    out_dir = prepare_out(out)
    path = write_metrics(out_dir, result)
    for key in ("nfe", "wall_time_s", "reward_mean"):
        if isinstance(result.get(key), float | int):
            click.echo(f"{key:>14}: {result[key]:.4g}")
    click.echo(f"wrote {path}, {out_dir / 'samples.png'}, {out_dir / 'samples.safetensors'} and "
               f"{len(result.get('images', []))} image PNGs")
    return path


def sample_pipeline(path: str, prompts: list[str], negatives: list[str] | None, n: int, *, guidance_name: str,
                    guider, scale: float, method: str | None, steps: int, seed: int, height: int | None,
                    width: int | None, device: torch.device, out: str, progress: bool,
                    dtype: torch.dtype = torch.float32) -> dict:
    """``steerdiff sample --pipeline``: ``n`` images per prompt, written to ``out``; returns the metrics."""
    pipeline = load_pipeline(path, device, height, width, progress, dtype)
    rows = len(prompts) * n
    all_prompts = [p for p in prompts for _ in range(n)]
    all_negatives = None if negatives is None else [p for p in negatives for _ in range(n)]
    latents, gens = initial_latents(pipeline, rows, seed, height, width, device, dtype)
    # guider None: diffusers' own CFG at guidance_scale (a FLUX transformer embeds it instead: no CFG guider there)
    if guider is None or (guidance_name == "cfg" and pipeline.family == "flux"):
        kwargs = {"guidance_scale": scale}
    else:
        kwargs = {"guidance": guider}
    start = time.perf_counter()
    try:
        with torch.no_grad():
            res = pipeline(all_prompts, negative_prompt=all_negatives, num_inference_steps=steps, method=method,
                           height=height, width=width, latents=latents, generator=gens, output_type="latent",
                           progress=progress, **kwargs)
            images = pipeline.decode(res.latents, height, width).float()  # [-1, 1] ("pt" is in [0, 1])
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    wall = time.perf_counter() - start
    used = method if method is not None else pipeline.scheduler_method(steps)
    out_dir = prepare_out(out)
    names = save_images(images, out_dir, f"{pipeline.family}: {used}, {steps} steps, scale {scale:g}")
    h, w = images.shape[-2:]
    guidance = {"name": guidance_name, "scale": scale} if guidance_name == "cfg" else \
        {"name": guidance_name, **guider.config}
    result = {"pipeline": str(path), "family": pipeline.family, "scheduler": type(pipeline.pipe.scheduler).__name__,
              "prompts": prompts, "negative_prompts": negatives, "n_per_prompt": n, "rows": all_prompts,
              "method": used, "steps": steps, "seed": seed, "height": int(h), "width": int(w),
              "guidance": guidance, "nfe": float(res.nfe), "wall_time_s": wall, "images": names,
              "dtype": str(dtype).removeprefix("torch.")}
    finish(result, out)
    return result


def align_pipeline(path: str, prompts: list[str], negatives: list[str] | None, n: int, *, rewards: Sequence[str],
                   method: str, run_method: Callable, particles: int, steps: int, seed: int, scale: float,
                   height: int | None, width: int | None, device: torch.device, out: str, progress: bool,
                   dtype: torch.dtype = torch.float32,
                   settings: dict) -> dict:
    """``steerdiff align --pipeline``: ``n`` reward-aligned images per prompt; the reward is a sum of pixel rewards
    of the decoded images. ``run_method(denoiser, reward, noise, sigmas, particles, cond)`` runs the chosen
    sampler of steerdiff.align. The schedule is the pipeline scheduler's, without its final 0 (so the last
    proposal of the SMC samplers is stochastic, as for ``--model``)."""
    from ...align.rewards import WeightedSum
    from ...core import randn
    from ...pipelines import on_images

    parts = [pixel_reward(s) for s in rewards]
    pixel = parts[0] if len(parts) == 1 else WeightedSum([(1.0, p) for p in parts])
    pipeline = load_pipeline(path, device, height, width, progress, dtype)
    reward = on_images(pipeline, pixel, height=height, width=width)  # r(decode(z)), gradients through the decoder
    cond = pipeline.encode(prompts, negatives, height, width).to(device)
    model = PromptDenoiser(pipeline, cond, scale)
    # A flow pipeline's schedule starts at sigma = inf; the reward samplers start there from the unit noise.
    sigmas = pipeline.default_sigmas(steps + 1, height, width)[:-1]
    groups = len(prompts) * n
    shape = pipeline.latent_shape(height, width)
    noise = randn((groups * particles, *shape), seeds=seed, device=device, dtype=dtype)
    labels = torch.arange(len(prompts), device=device).repeat_interleave(n)
    start = time.perf_counter()
    try:
        res = run_method(model, reward, noise, sigmas, particles, labels)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    wall = time.perf_counter() - start
    with torch.no_grad():
        images = pipeline.decode(res.samples.detach().to(device, dtype), height, width).float()
        image_rewards = pixel(images).float().cpu()
    out_dir = prepare_out(out)
    names = save_images(images, out_dir, f"{method}: {', '.join(rewards)} on {pipeline.family}")
    result = {"pipeline": str(path), "family": pipeline.family, "dtype": str(dtype).removeprefix("torch."),
              "prompts": prompts, "negative_prompts": negatives,
              "n_per_prompt": n, "rows": [p for p in prompts for _ in range(n)], "rewards": list(rewards),
              "method": method, "steps": steps, "seed": seed, "scale": scale, "height": int(images.shape[-2]),
              "width": int(images.shape[-1]), **settings, **res.summary(),
              "evaluations_per_denoiser_call": model.evaluations,
              "decoded_reward_mean": float(image_rewards.mean()), "decoded_reward_per_image": image_rewards.tolist(),
              "wall_time_s": wall, "images": names}
    if model.evaluations == 2:  # the reward samplers count one evaluation per denoiser call; CFG makes two
        for key in ("nfe", "nfe_grad"):
            if isinstance(result.get(key), float | int):
                result[key] = 2 * result[key]
    finish(result, out)
    return result
