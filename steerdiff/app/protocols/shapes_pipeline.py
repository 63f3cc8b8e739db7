"""Measurements on the shipped shapes text-to-image pipeline (docs/methods/pipelines.md, "The shipped pipeline"),
shared by its tests, the demo's pipeline section and ``benchmarks/shapes_pipeline.py``.

The pipeline (``steerdiff/assets/shapes_pipeline``, a diffusers ``StableDiffusionPipeline``) draws the coloured shapes
at 32x32 from captions ``"a <colour> <shape> on a grey background"``; it was trained on the ``band`` split's 8
(shape, colour) pairs only. Its images are judged by the shipped 12x12 shapes classifier after
:func:`steerdiff.data.shapes.from_canvas` (centre crop, 2x2 average), exact on the training canvas.

* **Conformity**: the share of images whose classified shape and colour both match the prompt's.
* **Saturation excess**: mean HSV saturation of the generated images minus that of data images of the same
  pairs as the pipeline's VAE reproduces them (``decode(encode_images(x))``, :func:`reference_images`): the
  over-saturation that APG (Sadat et al., ICLR 2025, "Eliminating Oversaturation and Artifacts of High Guidance
  Scales in Diffusion Models") removes. The reference goes through the VAE because the decoder cannot draw the
  data's per-pixel noise, whose HSV saturation on the grey background dominates the raw data's mean saturation
  (0.116 raw, 0.067 after the round trip, with the same shape pixels): against raw data every sample would look
  under-saturated.
* **Composition of unseen pairs**: a held-out pair ``(s, c)`` is the parallelogram of three training captions,
  ``(s', c) & (s, c') & !(s', c')``: under conditionally independent attributes, ``p(x | s', c) p(x | s, c') /
  p(x | s', c') = p(x | s) p(x | c) / p(x)``, which is ``p(x | s, c)`` (Liu et al. 2022, "Compositional Visual
  Generation with Composable Diffusion Models", Sec. 4, conjunction and negation), against the single joint
  caption the text encoder has never seen.
* **Reward on decoded images**: DAS (Kim et al., ICML 2025, "Test-time Alignment of Diffusion Models without
  Reward Over-optimization") against best-of-N at equal cost per output, with the reward computed on the VAE's
  decoded images (gradients through the decoder).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ...core.noise import randn
from ...data import shapes
from ...metrics.saturation import mean_saturation

SHIPPED = "shapes_pipeline"
DEFAULT_STEPS = 30
"""Steps of the measurements (the diffusers call's default is 50; the Euler trailing grid at 30 is as good here)."""
DEFAULT_SCALE = 7.5
"""The default guidance: diffusers' ``guidance_scale`` default, classifier-free guidance ``u + 7.5 (c - u)``."""


def shipped_dir() -> Path:
    """The shipped pipeline's directory (``steerdiff/assets/shapes_pipeline``)."""
    return Path(__file__).resolve().parents[2] / "assets" / SHIPPED  # steerdiff/app/protocols -> steerdiff


def load_shipped():
    """The shipped pipeline as a :class:`steerdiff.pipelines.Pipeline` (FileNotFoundError when it is not there)."""
    from ...pipelines import load

    return load(shipped_dir())


def load_judge():
    """The shipped 12x12 shapes classifier (``steerdiff/assets/shapes_classifier``), in eval mode."""
    from ...models.io import load

    return load("shapes_classifier").eval().requires_grad_(False)


def classify(judge, images: Tensor) -> Tensor:
    """Predicted ``(shape, colour)`` ``[B, 2]`` of pipeline images ``[B, 3, 32, 32]`` in [-1, 1]."""
    with torch.no_grad():
        return judge.predict(shapes.from_canvas(images.float().clamp(-1, 1)))


def train_pairs() -> list[tuple[int, int]]:
    """The 8 (shape, colour) pairs the pipeline was trained on (the ``band`` split's training part)."""
    return shapes.split_combos("band", "train")


def held_out_pairs() -> list[tuple[int, int]]:
    """The 8 pairs it never saw (the ``band`` split's test part)."""
    return shapes.split_combos("band", "test")


def data_images(pairs: Sequence[tuple[int, int]], n: int, seed: int = 0) -> Tensor:
    """``n`` data images per pair on the pipeline's canvas ``[len(pairs) * n, 3, 32, 32]`` (pair-major): the
    reference of the saturation excess."""
    out = []
    for k, pair in enumerate(pairs):
        images, _ = shapes.generate(n, combos=[pair], seed=seed + k)
        out.append(shapes.to_canvas(images, generator=torch.Generator().manual_seed(seed + k)))
    return torch.cat(out)


def reference_images(pipeline, pairs: Sequence[tuple[int, int]], n: int, seed: int = 0) -> Tensor:
    """:func:`data_images` through the pipeline's VAE, ``decode(encode_images(x))`` (posterior mean): the data as the
    decoder can draw it, the reference of the saturation excess."""
    data = data_images(pairs, n, seed)
    return torch.cat([pipeline.decode(pipeline.encode_images(chunk)) for chunk in data.split(256)])


def pair_labels(pairs: Sequence[tuple[int, int]], n: int) -> Tensor:
    """Labels ``[len(pairs) * n, 2]`` (pair-major) of ``n`` images per pair."""
    return torch.tensor(list(pairs), dtype=torch.long).repeat_interleave(n, dim=0)


def conformity(pred: Tensor, labels: Tensor) -> float:
    """Share of images whose predicted shape and colour both equal the requested ones."""
    return float((pred == labels).all(1).float().mean())


def image_scores(images: Tensor, labels: Tensor, judge, reference: Tensor) -> dict:
    """Conformity, per-attribute accuracy, saturation, saturation excess over ``reference`` (images of the same
    captions, :func:`reference_images`) and the clipped share
    (pixel values at the decoder's clamp, |x| >= 0.999) of images ``[B, 3, 32, 32]`` requested as ``labels``."""
    pred = classify(judge, images)
    sat = mean_saturation(images)
    return {"conformity": conformity(pred, labels), "shape_acc": float((pred[:, 0] == labels[:, 0]).float().mean()),
            "colour_acc": float((pred[:, 1] == labels[:, 1]).float().mean()), "saturation": sat,
            "saturation_excess": sat - mean_saturation(reference),
            "clipped": float((images.abs() >= 0.999).float().mean())}


def prompt_samples(pipeline, pairs: Sequence[tuple[int, int]], n: int, *, steps: int = DEFAULT_STEPS,
                   scale: float = DEFAULT_SCALE, guidance=None, method: str | None = None, seed: int = 0,
                   batch: int = 64) -> tuple[Tensor, float]:
    """``n`` images per pair from its caption, pair-major, through :meth:`Pipeline.__call__` (classifier-free
    guidance at diffusers' ``guidance_scale = scale``, or the steerdiff guider ``guidance``); row ``j``'s initial
    latents are seeded ``seed + j``. Returns ``(images [-1, 1], NFE per image)``."""
    prompts = [shapes.caption(s, c) for s, c in pairs for _ in range(n)]
    noise = randn((len(prompts), *pipeline.latent_shape()), seeds=seed)
    images, nfe = [], 0.0
    for i in range(0, len(prompts), batch):
        kwargs = {"guidance_scale": scale} if guidance is None else {"guidance": guidance}
        with torch.no_grad():
            res = pipeline(prompts[i:i + batch], num_inference_steps=steps, latents=noise[i:i + batch],
                           method=method, output_type="latent", **kwargs)
            images.append(pipeline.decode(res.latents))  # [-1, 1] (output_type="pt" is in [0, 1])
        nfe = float(res.nfe)
    return torch.cat(images), nfe


# --------------------------------------------------------------------------------------------- composition
def parallelogram(pair: tuple[int, int], seen: Sequence[tuple[int, int]] | None = None) -> dict[tuple[int, int], float]:
    """Three seen pairs whose composition ``(s', c) & (s, c') & !(s', c')`` is the pair ``(s, c)``, as
    ``{pair: weight}``; the first such ``(s', c')`` in index order. ValueError when no seen pairs make one."""
    seen = list(train_pairs() if seen is None else seen)
    s, c = pair
    for s2 in range(len(shapes.SHAPES)):
        for c2 in range(len(shapes.COLOURS)):
            if s2 != s and c2 != c and {(s2, c), (s, c2), (s2, c2)} <= set(seen):
                return {(s2, c): 1.0, (s, c2): 1.0, (s2, c2): -1.0}
    raise ValueError(f"no three seen pairs compose {pair}: seen pairs {seen}")


def composed_samples(pipeline, pair: tuple[int, int], n: int, *, scale: float = DEFAULT_SCALE,
                     steps: int = DEFAULT_STEPS, seed: int = 0) -> tuple[Tensor, float]:
    """``n`` images of ``pair`` composed from seen captions (:func:`parallelogram`, :meth:`Compose.from_prompts` at
    ``scale``; the pipeline's Euler sampler and schedule). Returns ``(images, NFE per image)``."""
    from ...core.sampling import sample
    from ...guidance.compose import Compose

    terms = {shapes.caption(*q): w for q, w in parallelogram(pair).items()}
    comp = Compose.from_prompts(pipeline, terms, scale)
    noise = randn((n, *pipeline.latent_shape()), seeds=seed)
    with torch.no_grad():
        z, stats = sample(pipeline.denoiser, noise, pipeline.default_sigmas(steps), method="euler", guidance=comp,
                          cond=comp.cond(n), return_stats=True)
        return pipeline.decode(z), float(stats.nfe)


def composition_scores(pipeline, judge, pairs: Sequence[tuple[int, int]], n: int, *, scale: float = DEFAULT_SCALE,
                       steps: int = DEFAULT_STEPS, seed: int = 0) -> dict:
    """Conformity on ``pairs`` of the joint caption (CFG at ``scale``) and of the composition of seen captions, with
    their NFE, wall times and images (pair-major)."""
    labels = pair_labels(pairs, n)
    start = time.perf_counter()
    joint, joint_nfe = prompt_samples(pipeline, pairs, n, steps=steps, scale=scale, seed=seed)
    joint_s = time.perf_counter() - start
    start = time.perf_counter()
    parts = [composed_samples(pipeline, p, n, scale=scale, steps=steps, seed=seed + k * n)
             for k, p in enumerate(pairs)]
    comp_s = time.perf_counter() - start
    composed = torch.cat([x for x, _ in parts])
    return {"joint": {"conformity": conformity(classify(judge, joint), labels), "nfe": joint_nfe, "wall_s": joint_s,
                      "images": joint},
            "composed": {"conformity": conformity(classify(judge, composed), labels), "nfe": parts[0][1],
                         "wall_s": comp_s, "images": composed}}


# --------------------------------------------------------------------------------------------- reward alignment
def reward_runs(pipeline, pair: tuple[int, int], reward: Callable[[Tensor], Tensor], *, groups: int, budget: int,
                alpha: float, steps: int = DEFAULT_STEPS, seed: int = 0, c_b: float = 2.0,
                methods: Sequence[str] = ("das", "bon"), das_options: dict | None = None) -> dict:
    """DAS and best-of-N at the cost of ``budget`` reward-gradient particles per output (NFE + ``c_b`` VJP in
    forward-pass units: :func:`steerdiff.align.particles_at_cost`), both on the conditional model of ``pair``'s
    caption and the pipeline's schedule without its final 0, ``groups`` outputs each. DAS runs with ``das_options``
    (default: the library's gradient-free DAS, ``(1 + c_b) budget`` particles; ``{"gradient": True}``: ``budget``
    particles following the reward gradient through the VAE decoder), best-of-N with ``(1 + c_b) budget`` chains and
    the reward as a black box. The reward is ``reward`` of the decoded images (:func:`steerdiff.pipelines.on_images`).
    Returns per method the :class:`~steerdiff.align.AlignResult` summary, the decoded reward and images."""
    from ...align import best_of_n, das, particles_at_cost
    from ...pipelines import bind, on_images

    das_options = dict(das_options or {})

    den, _ = bind(pipeline, pipeline.encode([shapes.caption(*pair)]))
    sigmas = pipeline.default_sigmas(steps + 1)[:-1]
    out = {}
    for method in methods:
        rows = particles_at_cost(budget, gradient=method == "das" and das_options.get("gradient", False), c_b=c_b)
        noise = randn((groups * rows, *pipeline.latent_shape()), seeds=seed)
        labels = torch.zeros(groups, dtype=torch.long)
        kw = dict(particles=rows, cond=labels, generator=seed + 10**6)
        if method == "das":
            differentiable = das_options.get("gradient", False)
            res = das(den, on_images(pipeline, reward, differentiable=differentiable), noise, sigmas, alpha=alpha,
                      **kw, **das_options)
        else:
            res = best_of_n(den, on_images(pipeline, reward, differentiable=False), noise, sigmas, **kw)
        with torch.no_grad():
            images = pipeline.decode(res.samples.detach().float())
        out[method] = {"result": res, "images": images, "reward": float(reward(images).mean()),
                       "cost": float(res.cost(c_b)), "nfe": float(res.nfe), "vjp": float(res.nfe_grad),
                       "wall_s": float(res.wall_time)}
    return out
