"""Perturbed network passes for perturbation guiders (docs/methods/guidance.md, "Perturbation guiders"): context
managers that change chosen layers of a network for one call and restore them after.

* :func:`identity_self_attention`: the chosen self-attention layers attend each token to itself only (the attention
  map replaced by the identity, so the layer outputs ``to_out(to_v(h))``): Perturbed-Attention Guidance (Ahn et al.,
  "Self-Rectifying Diffusion Sampling with Perturbed-Attention Guidance", ECCV 2024, Sec. 3.2).

Layers are the self-attention modules of diffusers' UNets and transformers (duck-typed: a module with ``processor``,
``to_q``, ``to_v`` and ``is_cross_attention``; diffusers is not imported here), chosen as diffusers' PAG pipelines
choose them: a layer id selects every self-attention module whose qualified name it matches (``re.search``), where
an id ending in a number must match that number exactly (``"down_blocks.1"`` does not select
``down_blocks.10``). A layer id that selects nothing is an error naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import Tensor, nn


def is_self_attention(module: nn.Module) -> bool:
    """A diffusers attention module (``processor``, ``to_q``, ``to_v``) that is not cross-attention."""
    return (hasattr(module, "processor") and hasattr(module, "to_q") and hasattr(module, "to_v")
            and not getattr(module, "is_cross_attention", True))


def _fake_numeric_match(layer_id: str, name: str) -> bool:
    last_id, last_name = layer_id.split(".")[-1], name.split(".")[-1]
    return last_id.isnumeric() and last_name.isnumeric() and last_id == last_name


def select_self_attention(network: nn.Module, layers: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """The self-attention modules of ``network`` that the layer ids ``layers`` select (diffusers' PAG rule)."""
    if isinstance(layers, str) or not isinstance(layers, Sequence) or not layers or \
            not all(isinstance(layer, str) and layer for layer in layers):
        raise ValueError(f"layers must be a non-empty list of layer ids (regular expressions over module names, "
                         f"e.g. ['mid'] or ['down_blocks.2']), got {layers!r}")
    named = [(name, m) for name, m in network.named_modules() if is_self_attention(m)]
    if not named:
        raise ValueError(f"{type(network).__name__} has no self-attention layers to perturb (diffusers attention "
                         "modules with a processor)")
    chosen: dict[str, nn.Module] = {}
    for layer in layers:
        hits = [(n, m) for n, m in named if re.search(layer, n) is not None and not _fake_numeric_match(layer, n)]
        if not hits:
            raise ValueError(f"layer id {layer!r} selects no self-attention layer of {type(network).__name__}; its "
                             f"self-attention layers are {[n for n, _ in named][:8]}{' ...' if len(named) > 8 else ''}")
        chosen.update(hits)
    return list(chosen.items())


class IdentitySelfAttention:
    """An attention processor whose attention map is the identity: ``to_out(to_v(h))`` (group / spatial norms,
    the residual connection and the output rescale as diffusers' own processors)."""

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, temb: Tensor | None = None, *args, **kwargs) -> Tensor:
        residual = hidden_states
        if getattr(attn, "spatial_norm", None) is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        four_d = hidden_states.ndim == 4
        if four_d:
            b, c, h, w = hidden_states.shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
        if getattr(attn, "group_norm", None) is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        out = attn.to_out[1](attn.to_out[0](attn.to_v(hidden_states)))
        if four_d:
            out = out.transpose(-1, -2).reshape(b, c, h, w)
        if getattr(attn, "residual_connection", False):
            out = out + residual
        return out / getattr(attn, "rescale_output_factor", 1.0)


@contextmanager
def identity_self_attention(network: nn.Module, layers: Sequence[str]) -> Iterator[list[str]]:
    """Within the block, the self-attention layers ``layers`` selects use :class:`IdentitySelfAttention`; their
    processors are restored on exit (also on an exception). Yields the selected module names."""
    chosen = select_self_attention(network, layers)
    saved = [(m, m.processor) for _, m in chosen]
    perturbed = IdentitySelfAttention()
    try:
        for m, _ in saved:
            m.processor = perturbed
        yield [n for n, _ in chosen]
    finally:
        for m, processor in saved:
            m.processor = processor


def find_network(denoiser: object, max_depth: int = 6) -> nn.Module:
    """The ``nn.Module`` inside a (wrapped) denoiser that holds its attention layers: follows ``network``,
    ``module``, ``net``, ``model``, ``denoiser`` and ``inner`` attributes (steerdiff's NFE counter, the VP / flow
    denoisers and the pipeline's network wrapper) to the first module with self-attention layers.

    Raises:
        ValueError: none found (pass the network explicitly).
    """
    seen: set[int] = set()
    frontier = [denoiser]
    for _ in range(max_depth):
        nxt = []
        for obj in frontier:
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, nn.Module) and any(is_self_attention(m) for m in obj.modules()):
                return obj
            nxt += [getattr(obj, a, None) for a in ("network", "module", "net", "model", "denoiser", "inner")]
        frontier = nxt
    raise ValueError(f"found no network with self-attention layers inside the denoiser {type(denoiser).__name__}: "
                     "pass network= (the UNet or transformer) to the guider")
