"""Dense prediction with diffusion priors: DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image
Segmentation via Probing Diffusion Capacity"; docs/methods/diffdis.md) and its baselines."""

__all__: list[str] = []

# Baselines (docs/methods/diffdis.md, "Baselines"): the plain UNet regressor and multi-step diffusion segmentation.
from .baselines import (  # noqa: E402
    BaselineConfig,
    DiffusionSegmenter,
    RegressorSegmenter,
    load_baseline,
    save_baseline,
    seg_unet,
    segmentation_loss,
    train_diffusion_segmenter,
    train_regressor,
)

__all__ += [
    "BaselineConfig",
    "DiffusionSegmenter",
    "RegressorSegmenter",
    "load_baseline",
    "save_baseline",
    "seg_unet",
    "segmentation_loss",
    "train_diffusion_segmenter",
    "train_regressor",
]
