"""MotionDreamer (Wang et al., ICLR 2025): one-motion masked generative transformer with local attention, its
applications (temporal editing, crowds, beat-aligned generation, SMC steering) and the single-motion diffusion
baseline (``docs/methods/motiondreamer.md``)."""

from .generator import GeneratorConfig, edit_tokens, generate, process_for, random_mask, train_generator

__all__ = ["GeneratorConfig", "edit_tokens", "generate", "process_for", "random_mask", "train_generator"]
