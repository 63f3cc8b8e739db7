"""Dense prediction with diffusion priors: DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image
Segmentation via Probing Diffusion Capacity"; docs/methods/diffdis.md) and its baselines."""

from .codec import LatentCodec, finetune_mask_decoder
from .diffdis import (
    EDGE,
    MASK,
    SIGMA_T,
    CrossTaskAttention,
    DiffDIS,
    DiffDISNet,
    FinetuneConfig,
    SegmentCond,
    build,
    finetune,
    predict_latents,
    pretrain_prior,
    task_features,
)

__all__ = [
    "EDGE",
    "MASK",
    "SIGMA_T",
    "CrossTaskAttention",
    "DiffDIS",
    "DiffDISNet",
    "FinetuneConfig",
    "LatentCodec",
    "SegmentCond",
    "build",
    "finetune",
    "finetune_mask_decoder",
    "predict_latents",
    "pretrain_prior",
    "task_features",
]

from .segmenter import Segmenter, load_segmenter, read_metadata, save_segmenter, time_per_image  # noqa: E402

__all__ += ["Segmenter", "load_segmenter", "read_metadata", "save_segmenter", "time_per_image"]
