"""Normalized Attention Guidance in the attention layers (Chen et al., "Normalized Attention Guidance: Universal
Negative Guidance for Diffusion Models", arXiv 2505.21179, Sec. 3; docs/methods/guidance.md, "NAG").

In chosen attention layers the image tokens' attention output is computed twice within one forward, once with the
positive text ``Z+`` and once with the negative text ``Z-``, and replaced by

    Z     = phi Z+ - (phi - 1) Z-                  (extrapolation; phi = 1 + s, the official code's nag_scale)
    Z     = Z * min(r, tau) / r,  r = |Z|_1 / |Z+|_1   (per token, over the features)
    Z_out = alpha Z + (1 - alpha) Z+

:func:`nag_attention` installs the processors for one call of a FLUX transformer (``FluxAttention``, diffusers
0.42's processor interface) and restores them on exit. The negative text rides along the positive one on the token
axis: a pre-hook on the network appends the negative ``encoder_hidden_states`` to the positive ones (``[B, 2T, D]``;
FLUX's text positions ``txt_ids`` doubled, all zeros as its pipeline makes them), so the text stream carries both
texts through the blocks while the image stream is computed once; every attention layer (chosen or not) keeps the
two texts apart: the image queries and the positive text attend to ``[positive text, image]``, the negative text to
``[negative text, image]`` and, for ``Z-``, the image queries to ``[negative text, image]``. Layers not chosen pass
``Z+`` on. This is the official code's design (its text stream doubled on the batch axis instead).

SD3's MM-DiT (``SD3Transformer2DModel``, joint attention ``[image, text]``) takes the same route: its text stream is
per token outside attention (a linear context embedder, AdaLayerNorms driven by the timestep embedding, feed-forward
layers) and has no positional code, so the negative text rides along the positive on the token axis and
:class:`NAGJointProcessor` keeps the two apart in every joint attention (the reference code's SD3 processor computes
the same attention with the text doubled on the batch axis). Image-only attentions (SD 3.5's dual attention
``attn2``) are untouched. UNets: :class:`NAGCrossProcessor` on the cross-attention layers.
diffusers is not imported at module import.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .perturb import attention_output, attention_tokens


def nag_combine(z_pos: Tensor, z_neg: Tensor, phi: float | Tensor, tau: float, alpha: float) -> Tensor:
    """NAG's feature rule (arXiv 2505.21179, Eq. 6-8): extrapolate ``phi Z+ - (phi - 1) Z-``, clip its per-token L1
    norm at ``tau`` times that of ``Z+``, blend with ``Z+`` by ``alpha``. ``phi`` is a float or a ``[B]`` tensor
    (one per sample); ``phi = 1`` gives ``Z+``."""
    if isinstance(phi, Tensor):
        phi = phi.to(device=z_pos.device, dtype=z_pos.dtype).reshape(-1, *([1] * (z_pos.ndim - 1)))
    z = z_pos + (phi - 1) * (z_pos - z_neg)
    n_pos = z_pos.abs().sum(-1, keepdim=True)
    n_z = z.abs().sum(-1, keepdim=True)
    # min(r, tau) / r = min(1, tau |Z+| / |Z|): no division by a zero |Z+|
    factor = (tau * n_pos / n_z.clamp_min(torch.finfo(z.dtype).tiny)).clamp(max=1.0)
    return torch.lerp(z_pos, z * factor, alpha)


def _sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    import torch.nn.functional as F  # noqa: N812

    # [B, S, H, d] -> attention over S
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2).flatten(2, 3).to(q.dtype)


class NAGFluxProcessor:
    """A ``FluxAttention`` processor over a sequence ``[positive text (T), negative text (T_neg), image]``: the two
    branches of :mod:`this module <steerdiff.models.nag>`, the image output :func:`nag_combine` d where ``guide``
    (a chosen layer), else ``Z+``. ``state`` holds ``phi``, ``tau``, ``alpha``, ``t_pos``, ``t_neg``."""

    def __init__(self, state: dict, guide: bool):
        self.state, self.guide = state, guide

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, image_rotary_emb=None) -> Tensor | tuple[Tensor, Tensor]:
        from diffusers.models.embeddings import apply_rotary_emb

        if attention_mask is not None:
            raise ValueError("NAG on FLUX attention does not combine with an attention mask")
        t_pos, t_neg = self.state["t_pos"], self.state["t_neg"]
        heads = lambda t: t.unflatten(-1, (-1, attn.head_dim))  # noqa: E731
        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        q, k = attn.norm_q(q), attn.norm_k(k)
        if encoder_hidden_states is not None:  # double stream: the text given apart
            cq = attn.norm_added_q(heads(attn.add_q_proj(encoder_hidden_states)))
            ck = attn.norm_added_k(heads(attn.add_k_proj(encoder_hidden_states)))
            cv = heads(attn.add_v_proj(encoder_hidden_states))
            q, k, v = torch.cat([cq, q], 1), torch.cat([ck, k], 1), torch.cat([cv, v], 1)
        if q.shape[1] <= t_pos + t_neg:
            raise ValueError(f"NAG expected a sequence [text ({t_pos}), negative text ({t_neg}), image], got "
                             f"{q.shape[1]} tokens")
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        t = t_pos + t_neg
        pos = torch.cat([torch.arange(t_pos, device=q.device), torch.arange(t, q.shape[1], device=q.device)])
        neg = torch.arange(t_pos, q.shape[1], device=q.device)
        out_pos = _sdpa(q[:, pos], k[:, pos], v[:, pos])  # [positive text, image]
        if self.guide:
            out_neg = _sdpa(q[:, neg], k[:, neg], v[:, neg])  # [negative text, image]
        else:  # only the negative text's own outputs are needed
            out_neg = _sdpa(q[:, t_pos:t], k[:, neg], v[:, neg])
        img = out_pos[:, t_pos:]
        if self.guide:
            img = nag_combine(img, out_neg[:, t_neg:], self.state["phi"], self.state["tau"], self.state["alpha"])
        text = torch.cat([out_pos[:, :t_pos], out_neg[:, :t_neg]], 1)
        if encoder_hidden_states is None:
            return torch.cat([text, img], 1)
        img = attn.to_out[1](attn.to_out[0](img.contiguous()))
        return img, attn.to_add_out(text.contiguous())


class NAGCrossProcessor:
    """A cross-attention processor (diffusers' ``Attention`` with ``is_cross_attention``: the text attention of SD /
    SDXL UNets) over a context ``[positive text (T), negative text (T_neg)]``: ``Z+`` attends to the positive text,
    ``Z-`` to the negative, the output :func:`nag_combine` d where ``guide``, else ``Z+`` (group / spatial norms,
    the residual connection and the output rescale as diffusers' ``AttnProcessor2_0``)."""

    def __init__(self, state: dict, guide: bool):
        self.state, self.guide = state, guide

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, temb: Tensor | None = None, *args, **kwargs) -> Tensor:
        if attention_mask is not None:
            raise ValueError("NAG on cross-attention does not combine with an attention mask")
        if encoder_hidden_states is None:
            raise ValueError("NAG's cross-attention processor needs encoder_hidden_states")
        t_pos = self.state["t_pos"]
        residual = hidden_states
        hidden_states, shape = attention_tokens(attn, hidden_states, temb)
        context = encoder_hidden_states
        if getattr(attn, "norm_cross", None):
            context = attn.norm_encoder_hidden_states(context)
        heads = lambda t: t.unflatten(-1, (attn.heads, -1))  # noqa: E731
        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(context)), heads(attn.to_v(context))
        if getattr(attn, "norm_q", None) is not None:
            q, k = attn.norm_q(q.transpose(1, 2)).transpose(1, 2), attn.norm_k(k.transpose(1, 2)).transpose(1, 2)
        out = _sdpa(q, k[:, :t_pos], v[:, :t_pos])
        if self.guide:
            out = nag_combine(out, _sdpa(q, k[:, t_pos:], v[:, t_pos:]), self.state["phi"], self.state["tau"],
                              self.state["alpha"])
        return attention_output(attn, attn.to_out[1](attn.to_out[0](out)), shape, residual)


class NAGJointProcessor:
    """A joint-attention processor (SD3's MM-DiT: diffusers' ``Attention`` with context projections ``add_q_proj``,
    run by ``JointAttnProcessor2_0``) over a context ``[positive text (T), negative text (T_neg)]``. SD3 orders the
    joint sequence ``[image, text]``: the image queries and the positive text attend to ``[image, positive text]``
    (``Z+``: SD3's own attention), the negative text and, for ``Z-``, the image queries to ``[image, negative
    text]``, as the reference code's ``NAGJointAttnProcessor2_0`` (its negative text on the batch axis); the image
    output :func:`nag_combine` d where ``guide``, else ``Z+``. q/k norms where the module has them (SD 3.5); a block
    with ``context_pre_only`` (SD3's last) returns the text outputs unprojected, as diffusers' processor."""

    def __init__(self, state: dict, guide: bool):
        self.state, self.guide = state, guide

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if attention_mask is not None:
            raise ValueError("NAG on joint attention does not combine with an attention mask")
        if encoder_hidden_states is None:
            raise ValueError("NAG's joint-attention processor needs encoder_hidden_states (a joint attention call)")
        t_pos, t_neg = self.state["t_pos"], self.state["t_neg"]
        if encoder_hidden_states.shape[1] != t_pos + t_neg:
            raise ValueError(f"NAG expected the context [text ({t_pos}), negative text ({t_neg})], got "
                             f"{encoder_hidden_states.shape[1]} tokens")
        heads = lambda t: t.unflatten(-1, (attn.heads, -1))  # noqa: E731  [B, S, H, d]

        def normed(t: Tensor, name: str) -> Tensor:
            norm = getattr(attn, name, None)  # RMS / layer norms over the head dim: layout-free
            return t if norm is None else norm(t)

        q = normed(heads(attn.to_q(hidden_states)), "norm_q")
        k = normed(heads(attn.to_k(hidden_states)), "norm_k")
        v = heads(attn.to_v(hidden_states))
        cq = normed(heads(attn.add_q_proj(encoder_hidden_states)), "norm_added_q")
        ck = normed(heads(attn.add_k_proj(encoder_hidden_states)), "norm_added_k")
        cv = heads(attn.add_v_proj(encoder_hidden_states))
        n = q.shape[1]
        pos, neg = slice(0, t_pos), slice(t_pos, t_pos + t_neg)
        out_pos = _sdpa(torch.cat([q, cq[:, pos]], 1), torch.cat([k, ck[:, pos]], 1), torch.cat([v, cv[:, pos]], 1))
        kv_neg = torch.cat([k, ck[:, neg]], 1), torch.cat([v, cv[:, neg]], 1)
        if self.guide:
            out_neg = _sdpa(torch.cat([q, cq[:, neg]], 1), *kv_neg)
            img = nag_combine(out_pos[:, :n], out_neg[:, :n], self.state["phi"], self.state["tau"],
                              self.state["alpha"])
            text_neg = out_neg[:, n:]
        else:  # only the negative text's own outputs are needed
            img, text_neg = out_pos[:, :n], _sdpa(cq[:, neg], *kv_neg)
        text = torch.cat([out_pos[:, n:], text_neg], 1)
        if not getattr(attn, "context_pre_only", False):
            text = attn.to_add_out(text)
        return attn.to_out[1](attn.to_out[0](img)), text


def _is_flux_attention(m: nn.Module) -> bool:
    return type(m).__name__ == "FluxAttention" and hasattr(m, "processor")


def _is_joint_attention(m: nn.Module) -> bool:
    return (hasattr(m, "processor") and hasattr(m, "to_q") and getattr(m, "add_q_proj", None) is not None
            and not _is_flux_attention(m))


def _is_cross_attention(m: nn.Module) -> bool:
    return hasattr(m, "processor") and hasattr(m, "to_q") and getattr(m, "is_cross_attention", False) is True


def select_nag_layers(network: nn.Module, layers: Sequence[str] | None) -> tuple[list[nn.Module], list[str]]:
    """The network's attention modules NAG replaces (FLUX's ``FluxAttention``; else SD3's joint attentions; else the
    cross-attention layers of a UNet) and the names of those ``layers`` selects (regular expressions over module
    names, a trailing number matching a whole index; None: all). A layer id that selects nothing, or a network
    without such layers, is an error naming it."""
    named: list[tuple[str, nn.Module]] = []
    for kind in (_is_flux_attention, _is_joint_attention, _is_cross_attention):
        named = named or [(n, m) for n, m in network.named_modules() if kind(m)]
    if not named:
        raise ValueError(f"NAG runs on FLUX transformers (FluxAttention layers), SD3 transformers (joint attention) "
                         f"and UNets with cross-attention; {type(network).__name__} has none of them")
    if layers is None:
        return [m for _, m in named], [n for n, _ in named]
    chosen: dict[str, nn.Module] = {}
    for layer in layers:
        hits = [(n, m) for n, m in named if re.search(f"(?:{layer})(?![0-9])", n) is not None]
        if not hits:
            raise ValueError(f"layer id {layer!r} selects no attention layer of {type(network).__name__}; its "
                             f"attention layers are {[n for n, _ in named][:8]}{' ...' if len(named) > 8 else ''}")
        chosen.update(hits)
    return [m for _, m in named], list(chosen)


class _Captured(Exception):
    pass


def capture_text(network: nn.Module, call) -> Tensor:
    """The ``encoder_hidden_states`` that ``call()`` hands the network, the network's forward stopped before it
    computes anything (a pre-hook records the input and aborts)."""
    got: list[Tensor] = []

    def hook(_module, args, kwargs):
        ehs = kwargs.get("encoder_hidden_states")
        if not isinstance(ehs, Tensor):
            raise ValueError("NAG needs the network called with encoder_hidden_states= (a text-conditioned "
                             "transformer)")
        got.append(ehs)
        raise _Captured

    handle = network.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        call()
    except _Captured:
        pass
    finally:
        handle.remove()
    if not got:
        raise ValueError(f"the denoiser did not call {type(network).__name__}: NAG cannot read the negative text")
    return got[0]


@contextmanager
def nag_attention(network: nn.Module, negative: Tensor, phi: float | Tensor, tau: float, alpha: float,
                  layers: Sequence[str] | None = None) -> Iterator[list[str]]:
    """Within the block, calls of ``network`` (a FLUX or SD3 transformer, or a UNet with cross-attention) apply NAG
    with
    the negative text ``negative``
    (``[B, T_neg, D]``, the network's ``encoder_hidden_states`` input for the negative prompt) in the attention
    layers ``layers`` selects (None: all); processors and hooks restored on exit (also on an exception). Yields the
    guided layers' names."""
    modules, names = select_nag_layers(network, layers)
    chosen = {id(m) for n, m in network.named_modules() if n in set(names)}
    state = {"phi": phi, "tau": tau, "alpha": alpha, "t_pos": None, "t_neg": negative.shape[1]}

    def pre(_module, args, kwargs):
        ehs = kwargs.get("encoder_hidden_states")
        if not isinstance(ehs, Tensor) or ehs.shape[0] != negative.shape[0] or ehs.shape[2:] != negative.shape[2:]:
            got = tuple(ehs.shape) if isinstance(ehs, Tensor) else type(ehs).__name__
            raise ValueError(f"NAG's negative text {tuple(negative.shape)} does not match the call's "
                             f"encoder_hidden_states {got}")
        state["t_pos"] = ehs.shape[1]
        kwargs = dict(kwargs)
        kwargs["encoder_hidden_states"] = torch.cat([ehs, negative.to(ehs)], 1)
        ids = kwargs.get("txt_ids")
        if isinstance(ids, Tensor):  # FLUX's text positions (zeros): one per text token
            kwargs["txt_ids"] = torch.cat([ids, ids.new_zeros(ids.shape[:-2] + (negative.shape[1], ids.shape[-1]))],
                                          -2)
        return args, kwargs

    saved = [(m, m.processor) for m in modules]
    handle = network.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        for m in modules:
            kind = (NAGFluxProcessor if _is_flux_attention(m) else NAGJointProcessor if _is_joint_attention(m)
                    else NAGCrossProcessor)
            m.processor = kind(state, id(m) in chosen)
        yield names
    finally:
        handle.remove()
        for m, processor in saved:
            m.processor = processor
