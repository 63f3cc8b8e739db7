"""A style-token in-context DiT for the functional AFA test (Rout et al., "RB-Modulation: Training-Free Stylization
using Reference-Based Modulation", ICLR 2025, attention feature aggregation; docs/methods/rb_modulation.md,
"Attention feature aggregation", its AFA test (d)).

Stable Cascade is trained with image-embedding condition tokens in its attention; AFA re-weights them at sampling
time without training. The digits analogue: :class:`StyleTokenDiT` is the in-context
:class:`~steerdiff.models.dit.DiT` plus ``k`` style tokens ``Y = Linear(style embedding)`` appended to the keys and
values of every attention (queries stay the DiT's sequence). Condition ``[B, 2]`` = (class, index into a bank of
style embeddings of training images, -1 = no style); training with slot dropout teaches the no-style model too. At
sampling time a reference embedding is given directly (:class:`StyleTokenDenoiser`), with plain joint attention or
with AFA (:func:`steerdiff.models.style_attention.afa_block`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.denoiser import append_dims, as_sigma_batch
from .dit import DiT
from .embed import check_cond
from .io import register_model
from .precond import EDMPrecond, edm_scalings
from .style_attention import afa_block, joint_block


@register_model()
class StyleTokenDiT(nn.Module):
    """``F(x_in, c_noise, cond [B, 2], style_embedding=None, afa=False)``: a DiT with ``n_tokens`` style tokens.

    Args:
        dit: the :class:`DiT` config (``num_classes`` is the class slot's).
        style_dim: width of a style embedding.
        n_tokens: style tokens per embedding.
        n_bank: rows of the bank of training style embeddings (the second condition slot indexes it).
    """

    def __init__(self, dit: dict, style_dim: int = 16, n_tokens: int = 4, n_bank: int = 1):
        super().__init__()
        self.config = {"dit": dict(dit), "style_dim": style_dim, "n_tokens": n_tokens, "n_bank": n_bank}
        self.dit = DiT(**dit)
        width = self.dit.config["width"]
        self.mapper = nn.Linear(style_dim, n_tokens * width)
        self.register_buffer("bank", torch.zeros(n_bank, style_dim))
        self.num_classes = (*self.dit.num_classes, n_bank)
        self.sample_shape = self.dit.sample_shape

    def style_tokens(self, emb: Tensor) -> Tensor:
        return self.mapper(emb).reshape(emb.shape[0], self.config["n_tokens"], -1)

    def forward(self, x: Tensor, c_noise: Tensor, cond: Tensor | None = None, style_embedding: Tensor | None = None,
                afa: bool = False, pooled_cond: bool = False) -> Tensor:
        net = self.dit
        cond = check_cond(cond, self.num_classes, x.shape[0], x.device)
        cls, ref = cond[:, :1], cond[:, 1]
        if style_embedding is not None:
            emb = style_embedding.to(x.dtype).expand(x.shape[0], -1)
            has = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        else:
            has = ref >= 0
            emb = self.bank[ref.clamp_min(0)].to(x.dtype)
        tokens = [net.noise_mlp(net.fourier(c_noise).to(x.dtype))[:, None], net.slots(cls).to(x.dtype)
                  + net.slot_type, net.patch_in(net.patchify(x)) + net.pos.to(x.dtype)]
        h = torch.cat(tokens, dim=1)
        any_style = bool(has.any())
        style = self.style_tokens(emb) if any_style else None
        for block in net.blocks:
            if not any_style:
                h = block(h)
            elif afa:
                if not bool(has.all()):
                    raise ValueError("afa=True needs a style for every row (pass style_embedding=)")
                h = afa_block(block, h, style, slice(1, 2) if pooled_cond else None)
            else:
                h = joint_block(block, h, style, has)
        return net.unpatchify(net.patch_out(net.norm_out(h)[:, 2:]))


class StyleTokenDenoiser(nn.Module):
    """``D(x, sigma, cond)`` of an ``EDMPrecond(StyleTokenDiT)`` with a fixed reference style embedding
    ``[1, style_dim]`` in joint attention (``afa=False``) or AFA (``afa=True``; ``pooled_cond``: the class token as
    AFA's pooled slot, see :mod:`steerdiff.control.afa`); ``cond``: class labels ``[B]``."""

    def __init__(self, model: EDMPrecond, style_embedding: Tensor, afa: bool = True, pooled_cond: bool = False):
        super().__init__()
        if not isinstance(model, EDMPrecond) or not isinstance(model.net, StyleTokenDiT):
            raise TypeError("StyleTokenDenoiser needs an EDMPrecond(StyleTokenDiT) model")
        self.model = model
        self.register_buffer("style_embedding", style_embedding.detach().reshape(1, -1))
        self.afa = bool(afa)
        self.pooled_cond = bool(pooled_cond)
        self.sample_shape = model.sample_shape
        self.sigma_data = model.sigma_data

    def forward(self, x: Tensor, sigma: Tensor | float, cond: Tensor | None = None) -> Tensor:
        sigma = as_sigma_batch(sigma, x)
        c_skip, c_out, c_in, c_noise = edm_scalings(sigma, self.sigma_data)
        cls = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device) if cond is None else cond.reshape(-1)
        full = torch.stack([cls, torch.full_like(cls, -1)], dim=1)
        f = self.model.net(append_dims(c_in, x.ndim) * x, c_noise, full, style_embedding=self.style_embedding,
                           afa=self.afa, pooled_cond=self.pooled_cond)
        return append_dims(c_skip, x.ndim) * x + append_dims(c_out, x.ndim) * f


def no_style(model: EDMPrecond):
    """``D(x, sigma, class)`` of the same model without style tokens (the second slot null)."""

    def denoiser(x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        cls = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device) if cond is None else cond.reshape(-1)
        return model(x, sigma, torch.stack([cls, torch.full_like(cls, -1)], dim=1))

    return denoiser
