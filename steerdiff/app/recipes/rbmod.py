"""Training recipes of the RB-Modulation digits protocol (RB-Modulation, Rout et al., ICLR 2025;
docs/methods/rb_modulation.md "The digits protocol"): the three-style class-conditional generator
(``configs/rbmod_digits.json``, data ``digits_styles``) and the style-token DiT of the AFA test
(``configs/rbmod_style_dit.json``, data ``digits_styles_refs``), each an ordinary :func:`steerdiff.train.train` run."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ...control.styles import styled_digits
from ...train import TrainResult, train_from_config
from ...train.recipes import register_dataset


@register_dataset("digits_styles")
def digits_styles_data(split: str = "all") -> tuple[Tensor, Tensor]:
    """Recipe data ``digits_styles``: the digits in all three styles with class labels, no style labels."""
    x, y, _ = styled_digits(split)
    return x, y


@register_dataset("digits_styles_refs")
def digits_styles_refs_data(seed: int = 0) -> tuple[Tensor, Tensor]:
    """Recipe data ``digits_styles_refs``: the same images, condition (class, a same-style reference index)."""
    from ...control.styles import style_refs

    x, cond, _ = style_refs(seed)
    return x, cond


def fill_style_bank(model) -> None:
    """A :class:`~steerdiff.models.style_dit.StyleTokenDiT` backbone's bank: the shipped style CNN's embeddings of
    the three-style digits (row = image index of :func:`~steerdiff.control.styles.styled_digits`)."""
    from ...models.io import load

    net = getattr(model, "net", model)
    if not hasattr(net, "bank"):
        return
    x, _, _ = styled_digits("all")
    with torch.no_grad():
        net.bank.copy_(load("digits_styles_cnn").eval()(x))


def train_recipe(path: str | Path, resume: bool = False, out_dir: str | Path | None = None,
                 progress: bool = False) -> TrainResult:
    """Run a recipe (``configs/rbmod_digits.json`` or its bare name ``rbmod_digits``) with
    :func:`steerdiff.train.train_from_config`, the style bank filled first; the EMA lands in ``out_dir/final``."""
    return train_from_config(path, resume=resume, out_dir=out_dir, progress=progress, prepare_model=fill_style_bank)
