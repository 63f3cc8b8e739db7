"""Style descriptors and independent evaluators of the RB-Modulation digits protocol (RB-Modulation, Rout et al., ICLR
2025; docs/methods/rb_modulation.md "The digits protocol").

* :class:`ThicknessDescriptor` (the primary Psi): robust hand-crafted stroke features
  ``h(x) = [mean((x+1)/2), mean(sigmoid(x/0.1)), mean|d_h x| + mean|d_v x|]``, divided by their standard deviation
  over the three-style training set; cost ``1/2 ||(h(u) - h(ref)) / std||^2`` (``cost="squared"``).
* :class:`StyleCNN` (the secondary Psi, a CSD analogue): a small CNN with a 16-d L2-normalised style head (trained
  through a linear probe on the 3 style labels) and a 10-way content head; cost ``1 - cos``.
* :func:`fit_evaluators`: pixel logistic regressions (scikit-learn) for digit class and for style, trained on the
  three-style set: the independent judges of a stylised sample.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.io import register_model
from .styles import STYLES, styled_digits


def thickness_features(x: Tensor) -> Tensor:
    """``[mean((x+1)/2), mean(sigmoid(x/0.1)), mean|d_h x| + mean|d_v x|]`` per image ``[B, 3]`` (images in
    [-1, 1], any ``[B, C, H, W]``)."""
    ink = ((x + 1) / 2).flatten(1).mean(1)
    soft = torch.sigmoid(x / 0.1).flatten(1).mean(1)
    tv = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1) + (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(
        1).mean(1)
    return torch.stack([ink, soft, tv], dim=1)


class ThicknessDescriptor(nn.Module):
    """``h(x) / std``: :func:`thickness_features` standardised by their training std (the primary Psi of the digits
    protocol).

    Args:
        std: the per-feature standard deviation ``[3]``; None computes it over the three-style digits
            (:func:`~steerdiff.control.styles.styled_digits`).
    """

    def __init__(self, std: Tensor | None = None):
        super().__init__()
        if std is None:
            x, _, _ = styled_digits("all")
            std = thickness_features(x).std(0)
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).reshape(3))

    def forward(self, x: Tensor) -> Tensor:
        return thickness_features(x) / self.std.to(x.dtype)


@register_model()
class StyleCNN(nn.Module):
    """A small CNN with a style head (16-d, L2-normalised) and a content head (10 classes): the CSD analogue.

    ``forward(x)`` returns the normalised style embedding ``[B, style_dim]``; ``content_logits(x)`` the 10 logits;
    ``style_logits(x)`` the linear probe on the style embedding that trains it (3 styles).
    """

    def __init__(self, channels: int = 32, style_dim: int = 16, styles: int = len(STYLES), classes: int = 10):
        super().__init__()
        self.config = {"channels": channels, "style_dim": style_dim, "styles": styles, "classes": classes}
        c = channels
        self.trunk = nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.GELU(), nn.Conv2d(c, c, 3, padding=1), nn.GELU(),
                                   nn.AvgPool2d(2), nn.Conv2d(c, 2 * c, 3, padding=1), nn.GELU())
        self.style_head = nn.Linear(2 * c, style_dim)
        self.probe = nn.Linear(style_dim, styles)
        self.content_head = nn.Linear(2 * c, classes)

    def _features(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != 1:
            raise ValueError(f"x must be [B, 1, H, W], got {tuple(x.shape)}")
        return self.trunk(x).mean(dim=(2, 3))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.style_head(self._features(x)), dim=1)

    def style_logits(self, x: Tensor) -> Tensor:
        return self.probe(self.forward(x)) * 10.0  # a fixed temperature: normalised embeddings have norm 1

    def content_logits(self, x: Tensor) -> Tensor:
        return self.content_head(self._features(x))


def train_style_cnn(steps: int = 1500, batch_size: int = 256, lr: float = 1e-3, seed: int = 0) -> StyleCNN:
    """Train :class:`StyleCNN` on the three-style digits: cross-entropy of the style probe plus that of the content
    head (Adam; ``steps`` steps; the protocol's 1500)."""
    x, y, s = styled_digits("all")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = StyleCNN()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=gen)
        loss = F.cross_entropy(net.style_logits(x[idx]), s[idx]) + F.cross_entropy(net.content_logits(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


class Evaluators:
    """Pixel logistic regressions (scikit-learn) for digit class and for style, fitted on the three-style digits.

    ``digit(x)`` and ``style(x)`` return predicted labels (numpy int arrays) for images ``[B, 1, 8, 8]``.
    """

    def __init__(self, seed: int = 0):
        from sklearn.linear_model import LogisticRegression

        x, y, s = styled_digits("all")
        flat = x.flatten(1).numpy()
        self.digit_model = LogisticRegression(max_iter=2000, random_state=seed).fit(flat, y.numpy())
        self.style_model = LogisticRegression(max_iter=2000, random_state=seed).fit(flat, s.numpy())

    @staticmethod
    def _flat(x: Tensor) -> np.ndarray:
        return x.detach().clamp(-1, 1).flatten(1).cpu().numpy()

    def digit(self, x: Tensor) -> np.ndarray:
        return self.digit_model.predict(self._flat(x))

    def style(self, x: Tensor) -> np.ndarray:
        return self.style_model.predict(self._flat(x))


def fit_evaluators(seed: int = 0) -> Evaluators:
    """The independent digit-class and style evaluators of the digits protocol."""
    return Evaluators(seed)
