"""Training the metric classifiers (digits: 10 classes; shapes: shape and colour heads).

Cross-entropy per head, AdamW with cosine decay, and small random translations (±1 px, by padding with the
background value and cropping) so that the features are not brittle to the sub-pixel offsets of generated
images. Deterministic given the seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ..models.classifier import ImageClassifier
from .config import cosine_lr


def random_shift(x: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Translate each image by an integer offset in ``[-max_shift, max_shift]`` (edge-replicate padding)."""
    if max_shift == 0:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4, mode="replicate")
    dx = torch.randint(0, 2 * max_shift + 1, (b,), generator=generator)
    dy = torch.randint(0, 2 * max_shift + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None])[:, None, :, None].expand(b, x.shape[1], h, w + 2 * max_shift)
    out = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w)[None])[:, None, None, :].expand(b, x.shape[1], h, w)
    return out.gather(3, cols)


def train_classifier(
    images: Tensor,
    labels: Tensor,
    model: ImageClassifier,
    steps: int = 3000,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 1e-4,
    max_shift: int = 1,
    noise_std: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> ImageClassifier:
    """Fit ``model`` to ``(images, labels)`` (labels ``[N]`` or ``[N, heads]``); returns it in eval mode."""
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"images and labels disagree on N: {images.shape[0]} vs {labels.shape[0]}")
    labels = labels[:, None] if labels.ndim == 1 else labels
    if labels.shape[1] != len(model.classes):
        raise ValueError(f"labels have {labels.shape[1]} columns but the model has {len(model.classes)} heads")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    bar = tqdm(range(steps), disable=not progress, desc="classifier")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, step, steps, min_lr_ratio=0.0)
        idx = torch.randint(0, images.shape[0], (batch_size,), generator=g)
        x = random_shift(images[idx], max_shift, g)
        if noise_std > 0:
            x = x + noise_std * torch.rand(batch_size, 1, 1, 1, generator=g) * torch.randn(x.shape, generator=g)
        heads = model.logits_per_head(model(x))
        loss = sum(F.cross_entropy(lg, labels[idx, j]) for j, lg in enumerate(heads))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return model.eval()
