"""MotionDreamer as one object: the motion tokeniser and the local masked generator of one reference motion, trained,
saved and sampled together (Wang et al., ICLR 2025, Sec. 3; ``docs/methods/motiondreamer.md``, "The generator" and
"Applications").

:func:`fit` trains the tokeniser (:func:`steerdiff.train.motion_vq.train_motion_vq`, codebook distribution
regularisation on or off) on the reference's features, encodes the reference, derives per-token beat flags from its
kinematic beats (:func:`steerdiff.motion.apps.kinematic_beats` on normalised features) and trains the generator
(:func:`steerdiff.motion.generator.train_generator`) conditioned on them with condition dropout, so one network is
the unconditional model and the beat-conditional one that classifier-free guidance combines. A saved model is a folder:
``tokenizer/`` and ``generator/`` (each ``config.json`` + ``model.safetensors``, :func:`steerdiff.models.save`) and
``motiondreamer.json`` (skeleton, frame rate, tokens of the reference, training log).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..io import write_json
from ..models import load as load_model
from ..models import save as save_model
from ..models.local_transformer import LocalMaskedTransformer
from ..train.motion_vq import MotionVQConfig, train_motion_vq
from .apps import align_to_beats, beat_flags, decode_batch, edit_motion, kinematic_beats
from .generator import GeneratorConfig, generate, train_generator

META_NAME = "motiondreamer.json"


@dataclass
class MotionDreamer:
    """A trained tokeniser + generator pair for one reference motion.

    Attributes:
        tokenizer: the motion VQ-VAE (``encode``, ``decode``, ``downsample``, ``normalize``).
        generator: the masked-token transformer (per-token beat condition, ``-1`` null).
        skeleton: the skeleton's name (``steerdiff.data.motion_synth.skeleton``).
        reference_tokens: ``[T']`` the reference's tokens.
        meta: fps, training logs and times.
    """

    tokenizer: object
    generator: LocalMaskedTransformer
    skeleton: str
    reference_tokens: Tensor
    meta: dict = field(default_factory=dict)

    @property
    def frames_per_token(self) -> int:
        return int(self.tokenizer.downsample)

    def beats_to_cond(self, beats: list[int] | Tensor, n_tokens: int, count: int) -> Tensor:
        """``[count, n_tokens]`` per-token beat flags of beat frames."""
        return beat_flags(beats, n_tokens, self.frames_per_token).expand(count, -1).clone()

    def sample(self, count: int, frames: int | None = None, *, steps: int = 12, seed: int = 0,
               beats: list[int] | Tensor | None = None, guidance_scale: float | None = 2.0, particles: int = 1,
               alpha: float = 0.02, choice_temperature: float = 1.0, temperature: float = 1.0,
               window: int | None = -1) -> Tensor:
        """``[count, frames, F]`` raw features of new motions (``frames`` rounded up to whole tokens, default the
        reference's length).

        With ``beats`` (frame indices) the motions are beat-aligned: ``particles > 1`` steers the sampler by SMC
        towards the beat reward (:func:`steerdiff.motion.apps.align_to_beats`, tilt temperature ``alpha``; the way
        that works on the shipped models, ``docs/methods/motiondreamer.md`` "Beat-aligned generation"), with CFG on
        the beat flags on top when ``guidance_scale`` is not None; ``particles=1`` is CFG at ``guidance_scale``
        alone (None: the beat-conditional model alone). ``choice_temperature``, ``temperature`` (token draws) and
        ``window`` (attention at sampling) are the sampling knobs of :func:`steerdiff.motion.generator.generate`
        (the steered path uses ``choice_temperature`` only)."""
        n_tok = self.reference_tokens.shape[0] if frames is None else -(-int(frames) // self.frames_per_token)
        if isinstance(particles, bool) or not isinstance(particles, int) or particles < 1:
            raise ValueError(f"particles must be a positive integer, got {particles!r}")
        cond = None if beats is None else self.beats_to_cond(beats, n_tok, count)
        if cond is not None and particles > 1:
            res = align_to_beats(self.generator, self.tokenizer, beats, n_tok, count=count, particles=particles,
                                 alpha=alpha, steps=steps, seed=seed, guidance_scale=guidance_scale,
                                 cond=None if guidance_scale is None else cond, choice_temperature=choice_temperature)
            return res.features if frames is None else res.features[:, :frames]
        tok = generate(self.generator, n_tok, count, steps=steps, seed=seed, cond=cond,
                       guidance_scale=guidance_scale if cond is not None else None,
                       choice_temperature=choice_temperature, temperature=temperature, window=window)
        out = decode_batch(self.tokenizer, tok)
        return out if frames is None else out[:, :frames]

    def edit(self, features: Tensor, start: int, end: int, *, count: int = 1, steps: int = 12, seed: int = 0):
        """Temporal editing (:func:`steerdiff.motion.apps.edit_motion`)."""
        return edit_motion(self.generator, self.tokenizer, features, start, end, count=count, steps=steps, seed=seed)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the folder layout of the module docstring."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_model(self.tokenizer, d / "tokenizer")
        save_model(self.generator, d / "generator")
        write_json(d / META_NAME, {"skeleton": self.skeleton, "reference_tokens": self.reference_tokens.tolist(),
                                   **self.meta})
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike, device: str = "cpu") -> MotionDreamer:
        d = Path(directory)
        if not (d / META_NAME).is_file():
            raise FileNotFoundError(f"{d} is not a saved MotionDreamer (no {META_NAME})")
        meta = json.loads((d / META_NAME).read_text())
        tok = load_model(d / "tokenizer", device).eval()
        gen = load_model(d / "generator", device).eval()
        ref = torch.tensor(meta.pop("reference_tokens"), dtype=torch.long)
        return cls(tok, gen, meta.pop("skeleton"), ref, meta)


def reference_beats(tokenizer, features: Tensor) -> Tensor:
    """Kinematic beats (frames) of ``features [T, F]``, on the tokeniser's normalised features."""
    return kinematic_beats(tokenizer.normalize(features.float()))


def fit(features: Tensor, skeleton: str, *, vq: MotionVQConfig | None = None, gen: GeneratorConfig | None = None,
        beats: bool = True, fps: float = 30.0, tokenizer=None, tokenizer_log: dict | None = None) -> MotionDreamer:
    """Train MotionDreamer on one motion's raw features ``[T, F]`` (see the module docstring).

    Args:
        features: the reference (:func:`steerdiff.data.motion.motion_features`).
        skeleton: its skeleton's name (stored with the model).
        vq: the tokeniser's config (``reg_weight=0``: no codebook regularisation, the ablation).
        gen: the generator's config (``window=None``: full attention, the ablation / baseline (a)).
        beats: condition the generator on per-token beat flags (dropout ``gen.cond_drop``).
        fps: the motion's frame rate (stored).
        tokenizer, tokenizer_log: a tokeniser already trained on ``features`` with ``vq`` and its log (reused,
            e.g. by the ablations that share one).
    """
    vq = vq or MotionVQConfig()
    gen = gen or GeneratorConfig()
    if tokenizer is None:
        res = train_motion_vq(features, vq)
        tokenizer, tokenizer_log = res.model, res.log
    tok_model = tokenizer.eval()
    tokens = tok_model.encode(features)
    cond, kw = None, {}
    if beats:
        cond = beat_flags(reference_beats(tok_model, features), tokens.shape[0], tok_model.downsample)
        kw = {"cond": cond, "cond_kind": "frames", "cond_values": 2}
    generator, log = train_generator(tokens, tok_model.config["codebook_size"], gen, **kw)
    vq_log = {k: v for k, v in (tokenizer_log or {}).items() if k != "curve"}
    meta = {"fps": fps, "tokenizer_log": vq_log, "generator_log": {k: v for k, v in log.items() if k != "losses"},
            "train_cpu_s": vq_log.get("cpu_seconds", 0.0) + log["train_cpu_s"],
            "configs": {"vq": asdict(vq), "generator": asdict(gen)}}
    return MotionDreamer(tok_model, generator, skeleton, tokens, meta)
