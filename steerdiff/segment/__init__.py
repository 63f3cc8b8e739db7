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

# DiffDIS (docs/methods/diffdis.md, "DiffDIS"): the latent codec, the fine-tuned prior, one-step inference.
from .codec import LatentCodec, finetune_codec, finetune_mask_decoder, reconstruction_mse  # noqa: E402
from .decoders import (  # noqa: E402
    MASK_DECODERS,
    LightMaskDecoder,
    load_light_decoder,
    save_light_decoder,
    train_light_decoder,
)
from .diffdis import (  # noqa: E402
    CONDITION_INITS,
    DBIA_INITS,
    EDGE,
    MASK,
    SIGMA_T,
    CrossTaskAttention,
    DiffDIS,
    DiffDISNet,
    FinetuneConfig,
    SegmentCond,
    build,
    decoded_mask_loss,
    finetune,
    predict_latents,
    pretrain_prior,
    task_features,
)
from .encoders import (  # noqa: E402
    IMAGE_ENCODERS,
    LightImageEncoder,
    load_light_encoder,
    save_light_encoder,
    train_light_encoder,
)
from .segmenter import Segmenter, load_segmenter, read_metadata, save_segmenter  # noqa: E402

__all__ += [
    "EDGE",
    "MASK",
    "CONDITION_INITS",
    "DBIA_INITS",
    "SIGMA_T",
    "CrossTaskAttention",
    "DiffDIS",
    "DiffDISNet",
    "FinetuneConfig",
    "IMAGE_ENCODERS",
    "LatentCodec",
    "LightImageEncoder",
    "LightMaskDecoder",
    "MASK_DECODERS",
    "SegmentCond",
    "Segmenter",
    "build",
    "decoded_mask_loss",
    "finetune",
    "finetune_codec",
    "finetune_mask_decoder",
    "load_light_decoder",
    "load_light_encoder",
    "load_segmenter",
    "predict_latents",
    "pretrain_prior",
    "read_metadata",
    "reconstruction_mse",
    "save_light_decoder",
    "save_light_encoder",
    "save_segmenter",
    "task_features",
    "train_light_decoder",
    "train_light_encoder",
]
