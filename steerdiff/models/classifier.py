"""Small CNN image classifiers whose penultimate features define the image metrics (docs/methods/conventions.md,
"Measuring").

One network, one or more heads: the digits classifier has one head (10 classes); the coloured-shapes classifier
(docs/methods/coind.md, "The coloured-shapes data") has two (shape, colour). ``features(x)`` returns the penultimate
embedding used for feature-space FID, precision/recall and diversity; ``forward(x)`` returns the logits of every head
concatenated (``logits_per_head`` splits them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .io import register_model


@register_model()
class ImageClassifier(nn.Module):
    """Conv-GELU blocks, global average pooling, a ``feature_dim`` embedding, one linear head per label slot.

    Args:
        in_channels: image channels.
        classes: number of classes of each head, e.g. ``[10]`` or ``[4, 4]``.
        channels: conv widths; each block after the first halves the resolution.
        feature_dim: width of the feature embedding.
        dropout: dropout before the heads (training only).
    """

    def __init__(
        self,
        in_channels: int = 1,
        classes: list[int] | tuple[int, ...] = (10,),
        channels: list[int] | tuple[int, ...] = (32, 64, 128),
        feature_dim: int = 64,
        dropout: float = 0.2,
    ):
        super().__init__()
        self.config = {"in_channels": in_channels, "classes": list(classes), "channels": list(channels),
                       "feature_dim": feature_dim, "dropout": dropout}
        layers: list[nn.Module] = []
        cin = in_channels
        for i, c in enumerate(channels):
            if i > 0:
                layers.append(nn.AvgPool2d(2, ceil_mode=True))
            layers += [nn.Conv2d(cin, c, 3, padding=1), nn.GroupNorm(min(8, c), c), nn.GELU(),
                       nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(min(8, c), c), nn.GELU()]
            cin = c
        self.trunk = nn.Sequential(*layers)
        self.embed = nn.Sequential(nn.Linear(cin, feature_dim), nn.GELU())
        self.drop = nn.Dropout(dropout)
        self.heads = nn.ModuleList(nn.Linear(feature_dim, k) for k in classes)

    @property
    def classes(self) -> list[int]:
        return self.config["classes"]

    def _check(self, x: Tensor) -> None:
        if x.ndim != 4 or x.shape[1] != self.config["in_channels"]:
            raise ValueError(f"x must be [B, {self.config['in_channels']}, H, W], got {tuple(x.shape)}")

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``[B, feature_dim]``."""
        self._check(x)
        return self.embed(self.trunk(x).mean((2, 3)))

    def forward(self, x: Tensor) -> Tensor:
        """Concatenated logits of all heads ``[B, sum(classes)]``."""
        h = self.drop(self.features(x))
        return torch.cat([head(h) for head in self.heads], 1)

    def logits_per_head(self, logits: Tensor) -> list[Tensor]:
        return list(logits.split(self.classes, 1))

    @torch.no_grad()
    def predict(self, x: Tensor, batch_size: int = 512) -> Tensor:
        """Predicted labels ``[B]`` (one head) or ``[B, heads]``, in eval mode."""
        was_training = self.training
        self.eval()
        try:
            preds = []
            for chunk in x.split(batch_size):
                logits = self.logits_per_head(self(chunk))
                preds.append(torch.stack([lg.argmax(1) for lg in logits], 1))
        finally:
            self.train(was_training)
        out = torch.cat(preds)
        return out[:, 0] if len(self.classes) == 1 else out
