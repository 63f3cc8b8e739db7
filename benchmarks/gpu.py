"""GPU benchmark: steerdiff on SD 1.5, SDXL, SD3-medium-size and FLUX-size pipelines in half precision.

Each pipeline is built from its published configuration with random weights (no download), directly on the device
and in the target dtype: SD 1.5 (UNet 860M, 512^2, float16), SDXL (UNet 2.6B, 1024^2, float16), SD3-medium's
transformer (2B, 1024^2, bfloat16) and FLUX.1-dev's (12B, 1024^2, bfloat16), with the published VAEs. The text
encoders have their published widths (the denoisers' cross-attention inputs) and the published depth for CLIP;
T5-XXL keeps its width but only ``--t5-layers`` of its 24 layers (it runs once per call, in both pipelines alike).
The tokenizers are the tiny ones of ``tests/tiny_pipelines.py`` (a byte-level CLIP vocabulary, 77 tokens here; a
word-level T5): prompts are tokenized differently from the real models, which changes no tensor shape.

Sections (``--sections``; by default all of them on SD 1.5 and the cheaper ones on the larger models, ``FULL_SECTIONS``;
all everywhere with ``--tiny``), per family (``--families``):

- ``call``: diffusers' own ``__call__`` against ``sd.pipelines.from_diffusers(pipe)(...)`` on the same pipeline and
  the same initial latents (batch 1 and 4, ``output_type="latent"``), interleaved repeats, medians and the median
  of the paired ratios. Target (issue 36): <= 1.02 at SD 1.5.
- ``apg``: steerdiff's call with ``guidance=sd.guidance.APG(w)`` against its CFG at the same ``w``. Target <= 1.01.
- ``dpm``: the same pipeline with ``DPMSolverMultistepScheduler`` (DPM-Solver++ 2M): diffusers against steerdiff.
- ``das``: ``sd.align.das`` with 4 and 8 particles (gradient-free, a latent reward) against ``sd.sample`` of as many
  images at equal NFE on the same bound denoiser. Target <= 1.1.
- ``forward``: ``sd.sample`` (Euler, CFG) against the same number of bare network forwards on the recorded inputs
  of one pipeline step (``Pipeline.calibration_inputs``): the sampler's whole overhead.
- ``compile``: the network ``torch.compile``'d in place (``--compile-backend``), both calls eager and compiled, and
  the number of recompilations during the timed calls (target 0).
- ``syncs``: host synchronisations per sampling step of steerdiff's call, ``sd.sample`` and DAS (and diffusers' call
  for reference): on CUDA counted with ``torch.cuda.set_sync_debug_mode("warn")``, then each run once under
  ``"error"`` (pass / the first sync); on CPU counted as host reads of tensor values (``tests/host_sync.py``).
- ``quant``: SVDQuant calibration (``sd.quant.quantize(network, "svdquant", calib=Pipeline.calibration_inputs(...),
  inplace=True)``) group by group until the family's time share is spent; the total is extrapolated from the
  groups done when it did not finish. Runs last: it replaces the network's layers.

Peak memory of each timed callable: ``torch.cuda.max_memory_allocated`` on CUDA, the peak resident set size
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``) on CPU.

``--budget`` (seconds, default 540) is shared among the families (``--shares``); a section that would start after its
family's share is spent is skipped and recorded as skipped. ``--tiny`` runs the same code on the tiny pipelines of
``tests/tiny_pipelines.py`` on CPU in float32 (under ~2 minutes) and writes ``gpu_tiny_cpu.json`` / ``.md``, labelled
CPU / tiny; a full run writes ``gpu.json`` / ``gpu.md`` (with the device name in the file when not CUDA).

    python benchmarks/gpu.py [--budget 540] [--families sd15,sdxl,sd3,flux] [--sections call,apg,...]
    python benchmarks/gpu.py --tiny
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import steerdiff as sd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

sys.path.insert(0, str(HERE.parent / "tests"))  # the tiny pipelines and the host-read counter are test harnesses
import tiny_pipelines  # noqa: E402
from host_sync import HostSyncCounter  # noqa: E402

from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer  # noqa: E402

FAMILIES = ("sd15", "sdxl", "sd3", "flux")
SECTIONS = ("call", "syncs", "apg", "dpm", "das", "forward", "compile", "quant")
FULL_SECTIONS = {"sd15": SECTIONS, "sdxl": ("call", "syncs", "dpm", "forward", "quant"),
                 "sd3": ("call", "syncs", "apg", "forward", "quant"), "flux": ("call", "syncs", "forward", "quant")}
"""A full run's sections when ``--sections`` is not given: everything on SD 1.5 (the issue's targets are set there),
the cheaper sections on the larger models (compiling SDXL or FLUX alone takes minutes)."""
PROMPTS = ["a red disk on a grey background", "a blue square", "a cat", "a dog"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Spec:
    """One family's benchmark settings: published size, dtype, guidance, steps, the sections that apply."""

    family: str
    size: int  # image side in pixels
    dtype: torch.dtype
    scale: float  # the pipeline's own default guidance (FLUX: embedded guidance)
    steps: int
    batches: tuple[int, ...]
    cfg: bool  # classifier-free guidance (two network rows per image): not FLUX
    call_kw: dict = field(default_factory=dict)


def full_specs() -> dict[str, Spec]:
    """The published sizes and dtypes; steps and batches sized for a ~10 minute run on one large GPU."""
    return {"sd15": Spec("sd15", 512, torch.float16, 7.5, 20, (1, 4), True),
            "sdxl": Spec("sdxl", 1024, torch.float16, 5.0, 12, (1, 4), True),
            "sd3": Spec("sd3", 1024, torch.bfloat16, 7.0, 10, (1,), True),
            "flux": Spec("flux", 1024, torch.bfloat16, 3.5, 8, (1,), False)}


def tiny_specs(dtype: torch.dtype) -> dict[str, Spec]:
    """The tiny pipelines (16 x 16 pixels), few steps."""
    return {"sd15": Spec("sd15", 16, dtype, 7.5, 4, (1, 4), True),
            "sdxl": Spec("sdxl", 16, dtype, 5.0, 4, (1,), True),
            "sd3": Spec("sd3", 16, dtype, 7.0, 4, (1,), True),
            "flux": Spec("flux", 16, dtype, 3.5, 4, (1,), False, {"max_sequence_length": 6})}


# ------------------------------------------------------------------------------------------------ building
@contextlib.contextmanager
def building(device: torch.device, dtype: torch.dtype):
    """Create modules' parameters directly on ``device`` in ``dtype`` (no float32 CPU copy first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def clip_config(tok, hidden: int, layers: int, heads: int, projection: int | None, act: str = "quick_gelu"):
    """A CLIP text encoder configuration (published widths: ViT-L 768, OpenCLIP bigG 1280)."""
    import transformers

    return transformers.CLIPTextConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, max_position_embeddings=77, hidden_act=act, projection_dim=projection or hidden,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def t5_config(tok, layers: int):
    """T5-XXL's encoder width (d_model 4096, 64 heads, gated GELU 10240) at ``layers`` layers."""
    import transformers

    return transformers.T5Config(vocab_size=len(tok), d_model=4096, d_kv=64, d_ff=10240, num_layers=layers,
                                 num_heads=64, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                                 decoder_start_token_id=0, is_encoder_decoder=False)


def vae_config(latent_channels: int, scaling: float, shift: float | None, quant_conv: bool,
               force_upcast: bool = True) -> dict:
    """The SD / SDXL / SD3 / FLUX autoencoder (128-256-512-512, two ResNet layers per block)."""
    return dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                latent_channels=latent_channels, sample_size=1024, scaling_factor=scaling, shift_factor=shift,
                use_quant_conv=quant_conv, use_post_quant_conv=quant_conv, force_upcast=force_upcast)


SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, cross_attention_dim=768, attention_head_dim=8,
                 block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                 down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                 up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
SDXL_UNET = dict(sample_size=128, in_channels=4, out_channels=4, cross_attention_dim=2048,
                 attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
                 block_out_channels=(320, 640, 1280), layers_per_block=2, use_linear_projection=True,
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                 addition_embed_type="text_time", addition_time_embed_dim=256,
                 projection_class_embeddings_input_dim=2816)
SD3_MEDIUM = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
                  num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                  pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192)
FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56))
DENOISER_CONFIGS = {"sd15": ("UNet2DConditionModel", SD15_UNET), "sdxl": ("UNet2DConditionModel", SDXL_UNET),
                    "sd3": ("SD3Transformer2DModel", SD3_MEDIUM), "flux": ("FluxTransformer2DModel", FLUX_DEV)}


def build_denoiser(family: str):
    """The family's published denoiser (in the current default device and dtype)."""
    import diffusers

    cls, config = DENOISER_CONFIGS[family]
    return getattr(diffusers, cls)(**config).eval()


def scheduler(family: str):
    """The family's published scheduler (SD 1.5 ships PNDM, which steerdiff does not map: DDIM with its config)."""
    import diffusers

    betas = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    if family == "sd15":
        return diffusers.DDIMScheduler(**betas, clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    if family == "sdxl":
        return diffusers.EulerDiscreteScheduler(**betas, timestep_spacing="leading", steps_offset=1)
    if family == "sd3":
        return diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    return diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                     max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)


def build_full(family: str, tok_dir: Path, device: torch.device, dtype: torch.dtype, t5_layers: int):
    """A diffusers pipeline of the family at its published size, random weights, on ``device`` in ``dtype``."""
    import diffusers
    import transformers

    def clip_tok():
        return transformers.CLIPTokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"),
                                          model_max_length=77)

    def encoder(cls, config, seed):
        torch.manual_seed(seed)
        return cls(config).eval()

    sch = scheduler(family)  # on the CPU in float32, as diffusers makes them (outside the device context)
    with building(device, dtype):
        torch.manual_seed(0)
        den = build_denoiser(family)
        if family == "sd15":
            tok = clip_tok()
            te = encoder(transformers.CLIPTextModel, clip_config(tok, 768, 12, 12, None), 1)
            vae = diffusers.AutoencoderKL(**vae_config(4, 0.18215, None, True, force_upcast=True)).eval()
            pipe = diffusers.StableDiffusionPipeline(unet=den, vae=vae, text_encoder=te, tokenizer=tok, scheduler=sch,
                                                     safety_checker=None, feature_extractor=None,
                                                     requires_safety_checker=False)
        elif family == "sdxl":
            tok, tok2 = clip_tok(), clip_tok()
            te = encoder(transformers.CLIPTextModel, clip_config(tok, 768, 12, 12, None), 1)
            te2 = encoder(transformers.CLIPTextModelWithProjection, clip_config(tok2, 1280, 32, 20, 1280, "gelu"), 4)
            vae = diffusers.AutoencoderKL(**vae_config(4, 0.13025, None, True, force_upcast=True)).eval()
            pipe = diffusers.StableDiffusionXLPipeline(unet=den, vae=vae, text_encoder=te, tokenizer=tok,
                                                       text_encoder_2=te2, tokenizer_2=tok2, scheduler=sch)
        elif family == "sd3":
            tok, tok2, tok3 = clip_tok(), clip_tok(), tiny_pipelines.make_t5_tokenizer()
            te = encoder(transformers.CLIPTextModelWithProjection, clip_config(tok, 768, 12, 12, 768), 1)
            te2 = encoder(transformers.CLIPTextModelWithProjection, clip_config(tok2, 1280, 32, 20, 1280, "gelu"), 4)
            te3 = encoder(transformers.T5EncoderModel, t5_config(tok3, t5_layers), 6)
            vae = diffusers.AutoencoderKL(**vae_config(16, 1.5305, 0.0609, False, force_upcast=False)).eval()
            pipe = diffusers.StableDiffusion3Pipeline(transformer=den, vae=vae, text_encoder=te, tokenizer=tok,
                                                      text_encoder_2=te2, tokenizer_2=tok2, text_encoder_3=te3,
                                                      tokenizer_3=tok3, scheduler=sch)
        else:
            tok, tok2 = clip_tok(), tiny_pipelines.make_t5_tokenizer()
            te = encoder(transformers.CLIPTextModel, clip_config(tok, 768, 12, 12, None), 1)
            te2 = encoder(transformers.T5EncoderModel, t5_config(tok2, t5_layers), 5)
            vae = diffusers.AutoencoderKL(**vae_config(16, 0.3611, 0.1159, False, force_upcast=False)).eval()
            pipe = diffusers.FluxPipeline(scheduler=sch, vae=vae, text_encoder=te, tokenizer=tok, text_encoder_2=te2,
                                          tokenizer_2=tok2, transformer=den)
    pipe.to(device)  # a no-op when everything was created there
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny(family: str, tok_dir: Path, device: torch.device, dtype: torch.dtype):
    """The tiny pipeline of ``tests/tiny_pipelines.py`` for the family, moved to ``device`` and ``dtype``."""
    make = {"sd15": lambda: tiny_pipelines.make_sd(tok_dir, "ddim"), "sdxl": lambda: tiny_pipelines.make_sdxl(tok_dir),
            "sd3": lambda: tiny_pipelines.make_sd3(tok_dir), "flux": lambda: tiny_pipelines.make_flux(tok_dir)}
    pipe = make[family]()
    return pipe.to(device, dtype)


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------------------------------ measuring
class Clock:
    """Wall time and peak memory of one call on ``device`` (synchronised on CUDA)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)

    def peak_bytes(self) -> int | None:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device)
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak (not resettable)

    def time(self, fn: Callable) -> tuple[float, int | None]:
        self.sync()
        self.reset_peak()
        start = time.perf_counter()
        with torch.no_grad():
            fn()
        self.sync()
        return time.perf_counter() - start, self.peak_bytes()


def interleaved(clock: Clock, fns: dict[str, Callable], repeats: int) -> dict:
    """One warm-up call each, then ``repeats`` rounds calling every function once, rotating the order each round
    (load drifting during the run falls on all alike). Medians, peak memory, and for each function after the
    first the ratio of medians to the first and the median of the paired ratios."""
    names = list(fns)
    for n in names:
        clock.time(fns[n])
    times: dict[str, list[float]] = {n: [] for n in names}
    peaks: dict[str, int] = {n: 0 for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t, peak = clock.time(fns[n])
            times[n].append(t)
            peaks[n] = max(peaks[n], peak or 0)
    base = names[0]
    out = {"repeats": repeats, "order": names}
    for n in names:
        out[n] = {"median_s": statistics.median(times[n]), "times_s": times[n], "peak_bytes": peaks[n]}
        if n != base:
            out[n]["ratio_of_medians"] = out[n]["median_s"] / out[base]["median_s"]
            out[n]["median_paired_ratio"] = statistics.median(a / b for a, b in zip(times[n], times[base],
                                                                                     strict=True))
    return out


def count_syncs(device: torch.device, fn: Callable) -> dict:
    """Host synchronisations of ``fn()``: on CUDA the ``set_sync_debug_mode("warn")`` warnings, then one run under
    ``"error"`` (``error_mode``: "pass" or the error's first line); on CPU the host reads of tensor values."""
    if device.type != "cuda":
        with torch.no_grad(), HostSyncCounter() as c:
            fn()
        return {"syncs": c.reads, "how": "host reads (aten _local_scalar_dense / equal) under a dispatch mode, CPU"}
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
    error = "pass"
    torch.cuda.synchronize(device)
    try:
        with torch.no_grad():
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    except RuntimeError as err:
        error = str(err).splitlines()[0][:200]
    return {"syncs": syncs, "error_mode": error, "how": "torch.cuda.set_sync_debug_mode('warn') warnings"}


# ------------------------------------------------------------------------------------------------ one family
class Family:
    """One family's pipeline, its steerdiff wrapper, fixed latents, and the sections measured on them."""

    def __init__(self, spec: Spec, pipe, device: torch.device, repeats: int, compile_backend: str):
        self.spec, self.pipe, self.device, self.repeats = spec, pipe, device, repeats
        self.compile_backend = compile_backend
        self.ours = sd.pipelines.from_diffusers(pipe)
        self.ours.set_progress_bar_config(disable=True)
        self.clock = Clock(device)
        self.kw = {"num_inference_steps": spec.steps, "height": spec.size, "width": spec.size, **spec.call_kw}

    def latents(self, batch: int, seed: int = 0) -> torch.Tensor:
        shape = self.ours.latent_shape(self.spec.size, self.spec.size)
        return torch.randn((batch, *shape), generator=torch.Generator().manual_seed(seed)).to(self.device,
                                                                                              self.spec.dtype)

    def prompts(self, batch: int) -> list[str]:
        return (PROMPTS * batch)[:batch]

    def diffusers_call(self, batch: int, **extra) -> Callable:
        lat, prompts = self.latents(batch), self.prompts(batch)
        return lambda: self.pipe(prompts, latents=lat.clone(), output_type="latent",
                                 guidance_scale=self.spec.scale, **self.kw, **extra)

    def steerdiff_call(self, batch: int, **extra) -> Callable:
        lat, prompts = self.latents(batch), self.prompts(batch)
        extra.setdefault("guidance_scale", self.spec.scale)
        return lambda: self.ours(prompts, latents=lat.clone(), output_type="latent", **self.kw, **extra)

    # --- sections ---
    def call(self) -> list[dict]:
        rows = []
        for b in self.spec.batches:
            res = interleaved(self.clock, {"diffusers": self.diffusers_call(b), "steerdiff": self.steerdiff_call(b)},
                              self.repeats)
            rows.append({"section": "call", "batch": b, **res})
        return rows

    def apg(self) -> list[dict]:
        if not self.spec.cfg:
            return [{"section": "apg", "skipped": "no classifier-free guidance in this family's call"}]
        w = self.spec.scale
        res = interleaved(self.clock, {"cfg": self.steerdiff_call(1, guidance=sd.guidance.CFG(w)),
                                       "apg": self.steerdiff_call(1, guidance=sd.guidance.APG(w))}, self.repeats)
        return [{"section": "apg", "batch": 1, **res}]

    def dpm(self) -> list[dict]:
        import diffusers

        if self.spec.family not in ("sd15", "sdxl"):
            return [{"section": "dpm", "skipped": "DPM-Solver++ through the scheduler applies to the UNet families"}]
        old = self.pipe.scheduler
        self.pipe.scheduler = diffusers.DPMSolverMultistepScheduler.from_config(old.config)
        try:
            ours = sd.pipelines.from_diffusers(self.pipe)
            ours.set_progress_bar_config(disable=True)
            lat, prompts = self.latents(1), self.prompts(1)
            res = interleaved(self.clock, {
                "diffusers": self.diffusers_call(1),
                "steerdiff": lambda: ours(prompts, latents=lat.clone(), output_type="latent",
                                          guidance_scale=self.spec.scale, **self.kw)}, self.repeats)
            method = ours.scheduler_method
            res["method"] = method() if callable(method) else method
        finally:
            self.pipe.scheduler = old
        return [{"section": "dpm", "batch": 1, **res}]

    def _bound(self):
        cond = self.ours.encode(self.prompts(1), height=self.spec.size, width=self.spec.size)
        return sd.pipelines.bind(self.ours, cond, height=self.spec.size, width=self.spec.size)

    def das(self) -> list[dict]:
        den, labels = self._bound()
        sigmas = self.ours.default_sigmas(self.spec.steps, self.spec.size, self.spec.size)
        if not torch.isfinite(sigmas[0]):
            return [{"section": "das", "skipped": "the family's schedule starts at sigma = inf"}]
        shape = self.ours.latent_shape(self.spec.size, self.spec.size)

        def reward(z):  # a cheap latent reward (no decode): the benchmark times the sampler, not the reward
            return -z.float().flatten(1).pow(2).mean(1)

        rows = []
        for p in (4, 8):
            noise = sd.randn((p, *shape), seeds=0).to(self.device, self.spec.dtype)
            plain_cond = labels.repeat(p)

            def das_run(noise=noise, p=p):
                sd.align.das(den, reward, noise, sigmas, alpha=0.1, particles=p, cond=labels, gradient=False)

            def plain(noise=noise, plain_cond=plain_cond):
                sd.sample(den, noise * sigmas[0], sigmas, method="euler_ancestral", cond=plain_cond)

            res = interleaved(self.clock, {"plain": plain, "das": das_run}, self.repeats)
            rows.append({"section": "das", "particles": p, **res})
        return rows

    def forward(self) -> list[dict]:
        calls = self.ours.calibration_inputs(self.prompts(1), num_inference_steps=1, height=self.spec.size,
                                             width=self.spec.size, guidance_scale=self.spec.scale, **self.spec.call_kw)
        kw = calls[0]
        net = self.ours.network
        steps = self.spec.steps
        sigmas = self.ours.default_sigmas(steps, self.spec.size, self.spec.size)
        cond = self.ours.encode(self.prompts(1), height=self.spec.size, width=self.spec.size)
        guidance = sd.guidance.CFG(self.spec.scale) if self.spec.cfg else None
        noise = self.latents(1)
        method = "euler"

        def bare():
            for _ in range(steps):
                net(**kw)

        def sample():
            sd.sample(self.ours.denoiser, noise, sigmas, method=method, cond=cond, guidance=guidance)

        res = interleaved(self.clock, {"bare_forwards": bare, "sd_sample": sample}, self.repeats)
        return [{"section": "forward", "batch": 1, "forwards": steps, **res}]

    def compile(self) -> list[dict]:
        from torch._dynamo.utils import counters

        net = self.ours.network
        eager = interleaved(self.clock, {"diffusers": self.diffusers_call(1), "steerdiff": self.steerdiff_call(1)},
                            self.repeats)
        net.compile(backend=self.compile_backend)
        try:
            start = time.perf_counter()
            for fn in (self.diffusers_call(1), self.steerdiff_call(1)):  # compile (and warm) both call paths
                self.clock.time(fn)
            compile_s = time.perf_counter() - start
            before = sum(counters["stats"].values()), counters["stats"]["unique_graphs"]
            compiled = interleaved(self.clock, {"diffusers": self.diffusers_call(1),
                                                "steerdiff": self.steerdiff_call(1)}, self.repeats)
            graphs = counters["stats"]["unique_graphs"] - before[1]
        finally:
            net._compiled_call_impl = None  # back to eager (nn.Module.compile's own attribute)
        rows = []
        for name in ("diffusers", "steerdiff"):
            rows.append({"section": "compile", "batch": 1, "call": name, "backend": self.compile_backend,
                         "eager_median_s": eager[name]["median_s"], "compiled_median_s": compiled[name]["median_s"],
                         "speedup": eager[name]["median_s"] / compiled[name]["median_s"],
                         "peak_bytes": compiled[name]["peak_bytes"], "first_calls_s": compile_s,
                         "new_graphs_while_timed": graphs})
        rows.append({"section": "compile", "call": "steerdiff / diffusers", "backend": self.compile_backend,
                     "eager_ratio": eager["steerdiff"]["median_s"] / eager["diffusers"]["median_s"],
                     "compiled_ratio": compiled["steerdiff"]["median_s"] / compiled["diffusers"]["median_s"]})
        return rows

    def syncs(self) -> list[dict]:
        steps = self.spec.steps
        runs = {"diffusers call": self.diffusers_call(1), "steerdiff call": self.steerdiff_call(1)}
        sigmas = self.ours.default_sigmas(steps, self.spec.size, self.spec.size)
        cond = self.ours.encode(self.prompts(1), height=self.spec.size, width=self.spec.size)
        guidance = sd.guidance.CFG(self.spec.scale) if self.spec.cfg else None
        noise = self.latents(1)
        runs["sd.sample"] = lambda: sd.sample(self.ours.denoiser, noise, sigmas, method="euler", cond=cond,
                                              guidance=guidance)
        if torch.isfinite(sigmas[0]):
            den, labels = self._bound()
            n4 = noise.repeat(4, *([1] * (noise.ndim - 1)))
            runs["das P=4"] = lambda: sd.align.das(den, lambda z: -z.float().flatten(1).pow(2).mean(1), n4, sigmas,
                                                   alpha=0.1, particles=4, cond=labels, gradient=False)
        rows = []
        for name, fn in runs.items():
            try:
                res = count_syncs(self.device, fn)
            except Exception as err:  # noqa: BLE001 - a failing run is a result here (e.g. a CPU tensor on CUDA)
                res = {"syncs": None, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
            if res.get("syncs") is not None:
                res["per_step"] = res["syncs"] / steps
            rows.append({"section": "syncs", "run": name, "steps": steps, **res})
        return rows

    def quant(self, seconds_left: float) -> list[dict]:
        """SVDQuant calibration of the first ``k`` quantization groups of a copy of the network, ``k = 1, 2, 4, ...``
        while the next run is predicted to fit in ``seconds_left``; the pipeline's own network is left as it is."""
        import copy

        import steerdiff.quant as sq

        deadline = time.perf_counter() + seconds_left
        net = self.ours.network
        t0 = time.perf_counter()
        calib = self.ours.calibration_inputs(self.prompts(2), num_inference_steps=2, height=self.spec.size,
                                             width=self.spec.size, guidance_scale=self.spec.scale,
                                             generator=torch.Generator().manual_seed(1), **self.spec.call_kw)
        calib_s = time.perf_counter() - t0
        groups = sq.select_groups(net)
        k, done, spent, peak = 1, 0, 0.0, None
        while True:
            k = min(k, len(groups))
            work = copy.deepcopy(net)
            part = sq.select_groups(work)[:k]
            self.clock.sync()
            self.clock.reset_peak()
            start = time.perf_counter()
            sq.quantize(work, "svdquant", calib=calib, groups=part, inplace=True)
            self.clock.sync()
            spent, done, peak = time.perf_counter() - start, k, self.clock.peak_bytes()
            del work
            if done == len(groups) or time.perf_counter() + spent * 2.2 > deadline:
                break
            k *= 2
        row = {"section": "quant", "method": "svdquant", "calibration_calls": len(calib), "record_calib_s": calib_s,
               "groups": len(groups), "groups_done": done, "seconds": spent, "complete": done == len(groups),
               "peak_bytes": peak, "network_parameters": parameter_count(net)}
        row["extrapolated_total_s"] = spent * len(groups) / max(done, 1)
        return [row]


# ------------------------------------------------------------------------------------------------ report
def _mb(b) -> str:
    return "-" if not b else f"{b / 2**20:.0f}"


def _ms(s) -> str:
    return f"{1e3 * s:.1f}"


def table(results: list[dict]) -> str:
    """The markdown tables of a run's rows."""
    out = []
    timed = [r for r in results if r.get("order") and len(r["order"]) == 2]
    if timed:
        rows = []
        for r in timed:
            a, b = r["order"]
            what = {"call": f"batch {r.get('batch')}", "apg": "APG / CFG", "dpm": f"DPM++ ({r.get('method')})",
                    "das": f"P = {r.get('particles')}", "forward": f"{r.get('forwards')} forwards"}[r["section"]]
            rows.append([r["family"], r["section"], what, f"{a}: {_ms(r[a]['median_s'])}",
                         f"{b}: {_ms(r[b]['median_s'])}", f"{r[b]['ratio_of_medians']:.3f}",
                         f"{r[b]['median_paired_ratio']:.3f}", f"{_mb(r[a]['peak_bytes'])} / {_mb(r[b]['peak_bytes'])}",
                         r["repeats"]])
        out.append(markdown_table(["family", "section", "what", "baseline (ms)", "measured (ms)", "ratio of medians",
                                   "median paired ratio", "peak MiB (baseline / measured)", "repeats"], rows,
                                  align="llllllrrr"))
    comp = [r for r in results if r["section"] == "compile" and "speedup" in r]
    if comp:
        out.append(markdown_table(
            ["family", "call", "backend", "eager (ms)", "compiled (ms)", "speed-up", "first calls (s)",
             "graphs compiled while timed", "peak MiB"],
            [[r["family"], r["call"], r["backend"], _ms(r["eager_median_s"]), _ms(r["compiled_median_s"]),
              f"{r['speedup']:.2f}", f"{r['first_calls_s']:.1f}", r["new_graphs_while_timed"], _mb(r["peak_bytes"])]
             for r in comp], align="lllrrrrrr"))
    syncs = [r for r in results if r["section"] == "syncs" and "run" in r]
    if syncs:
        out.append(markdown_table(
            ["family", "run", "steps", "host syncs", "per step", "error mode"],
            [[r["family"], r["run"], r["steps"], r.get("syncs", "-"),
              "-" if r.get("per_step") is None else f"{r['per_step']:.2f}",
              r.get("error_mode", r.get("error", "n/a (CPU)"))] for r in syncs], align="llrrrl"))
    quant = [r for r in results if r["section"] == "quant" and "seconds" in r]
    if quant:
        out.append(markdown_table(
            ["family", "network params (M)", "groups done / all", "seconds", "extrapolated total (s)",
             "calibration calls", "peak MiB"],
            [[r["family"], f"{r['network_parameters'] / 1e6:.1f}", f"{r['groups_done']} / {r['groups']}",
              f"{r['seconds']:.1f}", f"{r['extrapolated_total_s']:.1f}", r["calibration_calls"], _mb(r["peak_bytes"])]
             for r in quant], align="lrrrrrr"))
    builds = [r for r in results if r["section"] == "build"]
    if builds:
        out.append(markdown_table(["family", "dtype", "size", "denoiser params (M)", "build (s)", "steps"],
                                  [[r["family"], r["dtype"], r["size"], f"{r['denoiser_parameters'] / 1e6:.1f}",
                                    f"{r['seconds']:.1f}", r["steps"]] for r in builds], align="llrrrr"))
    skipped = [r for r in results if r.get("skipped")]
    if skipped:
        out.append("Skipped: " + "; ".join(f"{r['family']} {r['section']} ({r['skipped']})" for r in skipped) + ".")
    errors = [r for r in results if r.get("error") and r["section"] != "syncs"]
    if errors:
        out.append("Errors: " + "; ".join(f"{r['family']} {r['section']}: {r['error']}" for r in errors) + ".")
    return "\n\n".join(out)


# ------------------------------------------------------------------------------------------------ main
def _csv(value: str, allowed: tuple[str, ...], name: str) -> list[str]:
    items = [v for v in value.split(",") if v]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise SystemExit(f"--{name}: {', '.join(bad) or 'nothing given'}; choose among {', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny pipelines on CPU (the same code path, quickly)")
    ap.add_argument("--device", default=None, help="default cuda when available, else cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="override every family's dtype (default: published; float32 with --tiny)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--sections", default=None,
                    help=f"comma-separated, of {','.join(SECTIONS)} (default: all with --tiny; else FULL_SECTIONS)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run, builds included")
    ap.add_argument("--shares", default="0.4,0.2,0.2,0.2", help="the budget's shares of the families, in order")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3)")
    ap.add_argument("--steps", type=int, default=None, help="override every family's steps")
    ap.add_argument("--t5-layers", type=int, default=2, help="T5-XXL layers built (of 24)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; eager --tiny)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    families = _csv(args.families, FAMILIES, "families")
    sections = _csv(args.sections, SECTIONS, "sections") if args.sections else None
    shares = [float(s) for s in args.shares.split(",")]
    if len(shares) != len(families):
        shares = [1.0 / len(families)] * len(families)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype] if args.dtype else None
    specs = tiny_specs(dtype or torch.float32) if args.tiny else full_specs()
    repeats = args.repeats or 3
    backend = args.compile_backend or ("eager" if args.tiny else "inductor")
    tok_dir = Path(tempfile.mkdtemp(prefix="clip_tokenizer_"))
    write_clip_tokenizer(tok_dir)
    results: list[dict] = []
    total = sum(shares)
    deadline = t_start
    for fam, share in zip(families, shares, strict=True):
        deadline += args.budget * share / total
        spec = specs[fam]
        if dtype is not None:
            spec.dtype = dtype
        if args.steps:
            spec.steps = args.steps
        if time.perf_counter() > deadline:
            results.append({"family": fam, "section": "build", "skipped": "budget spent"})
            continue
        start = time.perf_counter()
        try:
            pipe = (build_tiny(fam, tok_dir, device, spec.dtype) if args.tiny
                    else build_full(fam, tok_dir, device, spec.dtype, args.t5_layers))
        except Exception as err:  # noqa: BLE001 - record and go on with the other families
            results.append({"family": fam, "section": "build", "error": f"{type(err).__name__}: {err}"[:300]})
            continue
        den = pipe.unet if hasattr(pipe, "unet") else pipe.transformer
        Clock(device).sync()
        results.append({"family": fam, "section": "build", "dtype": str(spec.dtype).removeprefix("torch."),
                        "size": spec.size, "steps": spec.steps, "denoiser_parameters": parameter_count(den),
                        "seconds": time.perf_counter() - start})
        bench = Family(spec, pipe, device, repeats, backend)
        for section in sections or (SECTIONS if args.tiny else FULL_SECTIONS[fam]):
            if time.perf_counter() > deadline:
                results.append({"family": fam, "section": section, "skipped": "budget spent"})
                continue
            print(f"[gpu.py] {fam} {section} ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
            try:
                rows = (bench.quant(deadline - time.perf_counter()) if section == "quant"
                        else getattr(bench, section)())
            except Exception as err:  # noqa: BLE001 - one failing section must not lose the others' numbers
                rows = [{"section": section, "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"[:300]}]
            results += [{"family": fam, **r} for r in rows]
        del bench, pipe, den
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta = provenance(argv, packages=("diffusers", "transformers"))
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    label = ("CPU, tiny pipelines (tests/tiny_pipelines.py): checks the code path, not GPU numbers" if args.tiny
             else f"{meta.get('gpu', device.type)}, published configurations, random weights")
    name = "gpu_tiny_cpu" if args.tiny else ("gpu" if device.type == "cuda" else f"gpu_{device.type}")
    out = args.out or results_dir("gpu")
    out.mkdir(parents=True, exist_ok=True)
    report = {"provenance": meta, "label": label, "tiny": args.tiny, "device": str(device),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "wall_s": time.perf_counter() - t_start, "results": results}
    write_json(out / f"{name}.json", report)
    text = (f"# GPU benchmark ({label})\n\n{provenance_line(meta)}\n\n{table(results)}\n\n"
            f"Wall time of the whole run: {time.perf_counter() - t_start:.0f} s (budget {args.budget:.0f} s). "
            "Ratios: measured / baseline (the ratio of the medians, and the median of the paired per-round ratios). "
            + ("The tiny pipelines' networks cost well under a millisecond per call: the ratios show each loop's "
               "Python overhead, host syncs count host reads of CPU tensors too. " if args.tiny else
               "Text encoders: published widths, CLIP at published depth, T5-XXL at "
               f"{args.t5_layers} of 24 layers; tokenizers: the tiny ones of tests/tiny_pipelines.py. ")
            + "Peak memory: torch.cuda.max_memory_allocated on CUDA, peak RSS on CPU.\n")
    write_text(out / f"{name}.md", text)
    print(text)
    return report


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with contextlib.suppress(ImportError):
        import diffusers
        import transformers

        transformers.logging.set_verbosity_error()  # the tiny tokenizers truncate every prompt: not news
        diffusers.utils.logging.set_verbosity_error()
    main()
