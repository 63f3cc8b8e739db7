"""Perturbed network passes for perturbation guiders (docs/methods/guidance.md, "Perturbation guiders"): context
managers that change chosen layers of a network for one call and restore them after.

* :func:`identity_self_attention`: the chosen self-attention layers attend each token to itself only (the attention
  map replaced by the identity, so the layer outputs ``to_out(to_v(h))``): Perturbed-Attention Guidance (Ahn et al.,
  "Self-Rectifying Diffusion Sampling with Perturbed-Attention Guidance", ECCV 2024, Sec. 3.2);
  :func:`perturbed_attention` extends it to SD3's joint attention and FLUX's attention (identity among the image
  tokens, as diffusers' ``PAGJointAttnProcessor2_0``).
* :func:`skip_blocks`: chosen transformer blocks return their input (skip-layer guidance).
* :func:`blurred_queries`: the queries of chosen self-attention layers blurred by a Gaussian (SEG, Hong, NeurIPS
  2024).

Layers are the self-attention modules of diffusers' UNets and transformers (duck-typed: a module with ``processor``,
``to_q``, ``to_v`` and ``is_cross_attention``; diffusers is not imported here) and the shipped DiT's
``blocks.<i>.attn`` (:class:`steerdiff.models.dit.DiTAttention`, a processor over the fused ``qkv``), chosen as
diffusers' PAG pipelines choose them: a layer id selects every self-attention module whose qualified name it matches
(``re.search``), where an id ending in a number must match that number exactly (``"down_blocks.1"`` does not select
``down_blocks.10``). A layer id that selects nothing is an error naming it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn


def is_self_attention(module: nn.Module) -> bool:
    """A diffusers attention module (``processor``, ``to_q``, ``to_v``) that is not cross-attention (FLUX's
    ``FluxAttention``, which has no ``is_cross_attention``, is self- or joint attention)."""
    return (hasattr(module, "processor") and hasattr(module, "to_q") and hasattr(module, "to_v")
            and not getattr(module, "is_cross_attention", type(module).__name__ != "FluxAttention"))


def is_fused_attention(module: nn.Module) -> bool:
    """The shipped DiT's hookable self-attention (:class:`steerdiff.models.dit.DiTAttention`: a ``processor`` called as
    ``processor(attn, h, qkv, proj)`` with the block's fused q/k/v projection)."""
    return hasattr(module, "processor") and getattr(module, "fused_qkv", False) is True


def _attention_layer(module: nn.Module) -> bool:
    return is_self_attention(module) or is_fused_attention(module)


def _fake_numeric_match(layer_id: str, name: str) -> bool:
    last_id, last_name = layer_id.split(".")[-1], name.split(".")[-1]
    return last_id.isnumeric() and last_name.isnumeric() and last_id == last_name


def select_self_attention(network: nn.Module, layers: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """The self-attention modules of ``network`` that the layer ids ``layers`` select (diffusers' PAG rule)."""
    if isinstance(layers, str) or not isinstance(layers, Sequence) or not layers or \
            not all(isinstance(layer, str) and layer for layer in layers):
        raise ValueError(f"layers must be a non-empty list of layer ids (regular expressions over module names, "
                         f"e.g. ['mid'] or ['down_blocks.2']), got {layers!r}")
    named = [(name, m) for name, m in network.named_modules() if _attention_layer(m)]
    if not named:
        raise ValueError(f"{type(network).__name__} has no self-attention layers to perturb (diffusers attention "
                         "modules with a processor, or the shipped DiT's blocks.<i>.attn)")
    chosen: dict[str, nn.Module] = {}
    for layer in layers:
        hits = [(n, m) for n, m in named if re.search(layer, n) is not None and not _fake_numeric_match(layer, n)]
        if not hits:
            raise ValueError(f"layer id {layer!r} selects no self-attention layer of {type(network).__name__}; its "
                             f"self-attention layers are {[n for n, _ in named][:8]}{' ...' if len(named) > 8 else ''}")
        chosen.update(hits)
    return list(chosen.items())


def attention_tokens(attn: nn.Module, hidden_states: Tensor, temb: Tensor | None) -> tuple[Tensor, tuple | None]:
    """A diffusers attention module's input as tokens ``[B, N, C]`` after its spatial and group norms (as diffusers'
    own processors prepare it), and the ``(B, C, H, W)`` shape of a 4-D input (None for tokens)."""
    if getattr(attn, "spatial_norm", None) is not None:
        hidden_states = attn.spatial_norm(hidden_states, temb)
    shape = None
    if hidden_states.ndim == 4:
        shape = tuple(hidden_states.shape)
        hidden_states = hidden_states.view(shape[0], shape[1], -1).transpose(1, 2)
    if getattr(attn, "group_norm", None) is not None:
        hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
    return hidden_states, shape


def attention_output(attn: nn.Module, out: Tensor, shape: tuple | None, residual: Tensor) -> Tensor:
    """The inverse of :func:`attention_tokens` after the output projection: back to ``shape``, the residual
    connection and the output rescale, as diffusers' own processors finish."""
    if shape is not None:
        out = out.transpose(-1, -2).reshape(shape)
    if getattr(attn, "residual_connection", False):
        out = out + residual
    return out / getattr(attn, "rescale_output_factor", 1.0)


class IdentitySelfAttention:
    """An attention processor whose attention map is the identity: ``to_out(to_v(h))`` (group / spatial norms,
    the residual connection and the output rescale as diffusers' own processors)."""

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, temb: Tensor | None = None, *args, **kwargs) -> Tensor:
        tokens, shape = attention_tokens(attn, hidden_states, temb)
        out = attn.to_out[1](attn.to_out[0](attn.to_v(tokens)))
        return attention_output(attn, out, shape, hidden_states)


class IdentityFusedAttention:
    """PAG on the shipped DiT's attention (:class:`steerdiff.models.dit.DiTAttention`): the attention map is the
    identity over the whole sequence (condition tokens included, as PAG on a UNet's self-attention), so the layer
    outputs ``proj(v)`` with ``v`` the value third of the fused ``qkv`` projection."""

    def __call__(self, attn: nn.Module, h: Tensor, qkv: nn.Module, proj: nn.Module) -> Tensor:
        w = h.shape[-1]
        return proj(qkv(h)[..., 2 * w:])


class BlurredFusedAttention:
    """SEG on the shipped DiT's attention: the image-token queries (the last ``attn.grid`` tokens) blurred by
    :func:`blur_queries` before the attention; the condition tokens' queries, and all keys and values, as before."""

    def __init__(self, sigma: float):
        self.sigma = sigma

    def __call__(self, attn: nn.Module, h: Tensor, qkv: nn.Module, proj: nn.Module) -> Tensor:
        import torch.nn.functional as F  # noqa: N812

        if attn.grid is None:
            raise ValueError("SEG on a DiT attention needs its image-token grid (attn.grid, set by the DiT)")
        b, n, w = h.shape
        q, k, v = qkv(h).chunk(3, dim=-1)
        m = attn.grid[0] * attn.grid[1]
        q = torch.cat([q[:, :n - m], blur_queries(q[:, n - m:], tuple(attn.grid), self.sigma)], dim=1)
        heads = lambda t: t.reshape(b, n, attn.heads, w // attn.heads).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        return proj(out.transpose(1, 2).reshape(b, n, w))


@contextmanager
def identity_self_attention(network: nn.Module, layers: Sequence[str]) -> Iterator[list[str]]:
    """Within the block, the self-attention layers ``layers`` selects use :class:`IdentitySelfAttention`; their
    processors are restored on exit (also on an exception). Yields the selected module names."""
    chosen = select_self_attention(network, layers)
    saved = [(m, m.processor) for _, m in chosen]
    perturbed, fused = IdentitySelfAttention(), IdentityFusedAttention()
    try:
        for m, _ in saved:
            m.processor = fused if is_fused_attention(m) else perturbed
        yield [n for n, _ in chosen]
    finally:
        for m, processor in saved:
            m.processor = processor


def find_network(denoiser: object, max_depth: int = 6, blocks: bool = False) -> nn.Module:
    """The ``nn.Module`` inside a (wrapped) denoiser that holds its attention layers: follows ``network``,
    ``module``, ``net``, ``model``, ``denoiser`` and ``inner`` attributes (steerdiff's NFE counter, the VP / flow
    denoisers and the pipeline's network wrapper) to the first module with self-attention layers (``blocks``: with
    transformer blocks, :func:`transformer_blocks`).

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
            if isinstance(obj, nn.Module) and (transformer_blocks(obj) if blocks else
                                               any(_attention_layer(m) for m in obj.modules())):
                return obj
            nxt += [getattr(obj, a, None) for a in ("network", "module", "net", "model", "denoiser", "inner")]
        frontier = nxt
    what = "transformer blocks" if blocks else "self-attention layers"
    raise ValueError(f"found no network with {what} inside the denoiser {type(denoiser).__name__}: "
                     "pass network= (the UNet or transformer) to the guider")


# --- skip-layer guidance: chosen transformer blocks skipped -------------------------------------------------------

BLOCK_STACKS = ("transformer_blocks", "single_transformer_blocks", "blocks", "layers")
"""Attribute names of the ``nn.ModuleList`` s that hold transformer blocks (diffusers' UNets, SD3 / FLUX, the
shipped DiTs); their elements are the blocks :func:`skip_blocks` can skip."""

_PAIR_BLOCKS = ("JointTransformerBlock", "FluxTransformerBlock", "FluxSingleTransformerBlock")
"""Blocks that take and return ``(encoder_hidden_states, hidden_states)`` (SD3's MM-DiT, FLUX's double and single
blocks); every other block maps ``hidden_states`` to a tensor of the same shape."""


def transformer_blocks(network: nn.Module) -> list[tuple[str, nn.Module]]:
    """The skippable blocks of ``network``: elements of a ``ModuleList`` named as in :data:`BLOCK_STACKS`."""
    out = []
    for name, m in network.named_modules():
        if isinstance(m, nn.ModuleList) and name.split(".")[-1] in BLOCK_STACKS:
            out += [(f"{name}.{i}", block) for i, block in enumerate(m)]
    return out


def select_blocks(network: nn.Module, layers: Sequence[int | str]) -> list[tuple[str, nn.Module]]:
    """The blocks ``layers`` selects: an int is an index into the network's main block stack (``transformer_blocks``
    or ``blocks``, as diffusers' ``skip_guidance_layers``); a string selects every block whose qualified name it
    matches (``re.search``, a trailing number matching a whole index, e.g. ``"single_transformer_blocks.3"``, or
    ``"mid"`` for a UNet's blocks)."""
    if isinstance(layers, (str, int)) or not isinstance(layers, Sequence) or not layers or not all(
            (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and x) for x in layers):
        raise ValueError(f"layers must be a non-empty list of block indices or block names, got {layers!r}")
    named = transformer_blocks(network)
    if not named:
        raise ValueError(f"{type(network).__name__} has no transformer blocks to skip (a ModuleList named one of "
                         f"{BLOCK_STACKS})")
    stack = next((getattr(network, a) for a in ("transformer_blocks", "blocks")
                  if isinstance(getattr(network, a, None), nn.ModuleList)), None)
    chosen: dict[str, nn.Module] = {}
    for layer in layers:
        if isinstance(layer, int):
            if stack is None or not -len(stack) <= layer < len(stack):
                raise ValueError(f"block index {layer} is out of range: {type(network).__name__} has "
                                 f"{0 if stack is None else len(stack)} top-level transformer blocks")
            hits = [(n, m) for n, m in named if m is stack[layer]]
        else:
            # a number in the id matches a whole index: "blocks.1" does not select blocks.10
            hits = [(n, m) for n, m in named if re.search(f"(?:{layer})(?![0-9])", n) is not None]
            if not hits:
                raise ValueError(f"layer id {layer!r} selects no transformer block of {type(network).__name__}; its "
                                 f"blocks are {[n for n, _ in named][:8]}{' ...' if len(named) > 8 else ''}")
        chosen.update(hits)
    return list(chosen.items())


def _skipped_forward(pair: bool):
    def forward(*args, **kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else (args[0] if args else kwargs.get("x"))
        if not pair:
            return hidden
        context = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[1]
        return context, hidden
    return forward


@contextmanager
def skip_blocks(network: nn.Module, layers: Sequence[int | str]) -> Iterator[list[str]]:
    """Within the block, the transformer blocks ``layers`` selects (:func:`select_blocks`) are skipped: each returns
    its input unchanged (SD3 / FLUX blocks their ``(encoder_hidden_states, hidden_states)``), as diffusers'
    ``SD3Transformer2DModel(..., skip_layers=...)`` does; restored on exit (also on an exception). Yields the names.
    Skip-layer guidance (Stability AI, SD 3.5; Hyung et al., "Spatiotemporal Skip Guidance", CVPR 2025)."""
    chosen = select_blocks(network, layers)
    try:
        for _, m in chosen:
            m.forward = _skipped_forward(type(m).__name__ in _PAIR_BLOCKS)
        yield [n for n, _ in chosen]
    finally:
        for _, m in chosen:
            m.__dict__.pop("forward", None)


# --- PAG on joint (MM-DiT) attention --------------------------------------------------------------------------------

def is_joint_attention(module: nn.Module) -> bool:
    """A joint (MM-DiT) attention module: image projections ``to_q/to_k/to_v`` and context projections
    ``add_q_proj/add_k_proj/add_v_proj`` (SD3's JointTransformerBlock attention)."""
    return is_self_attention(module) and getattr(module, "add_q_proj", None) is not None


class IdentityJointAttention:
    """PAG's perturbation of a joint attention (diffusers' ``PAGJointAttnProcessor2_0``): among the image tokens
    the attention map is the identity (each image token attends to itself and to the context tokens); the context
    tokens attend to everything as before. q/k norms are applied where the module has them (SD 3.5; diffusers' PAG
    processor omits them, so SD 3.5 differs from its PAG pipeline there)."""

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, *args, **kwargs):
        import torch.nn.functional as F  # noqa: N812

        if encoder_hidden_states is None:
            raise ValueError("IdentityJointAttention needs encoder_hidden_states (a joint attention call)")
        b, n_img = hidden_states.shape[0], hidden_states.shape[1]
        heads = attn.heads

        def split(t: Tensor) -> Tensor:
            return t.view(b, -1, heads, t.shape[-1] // heads).transpose(1, 2)

        q, k, v = split(attn.to_q(hidden_states)), split(attn.to_k(hidden_states)), split(attn.to_v(hidden_states))
        cq = split(attn.add_q_proj(encoder_hidden_states))
        ck = split(attn.add_k_proj(encoder_hidden_states))
        cv = split(attn.add_v_proj(encoder_hidden_states))
        def normed(t: Tensor, name: str) -> Tensor:
            norm = getattr(attn, name, None)
            return t if norm is None else norm(t)

        q, k, cq, ck = normed(q, "norm_q"), normed(k, "norm_k"), normed(cq, "norm_added_q"), normed(ck, "norm_added_k")
        q, k, v = torch.cat([q, cq], 2), torch.cat([k, ck], 2), torch.cat([v, cv], 2)
        n = q.shape[2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device)  # True: may attend
        mask[:n_img, :n_img] = torch.eye(n_img, dtype=torch.bool, device=q.device)  # image -> image: identity
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, n, -1).to(q.dtype)
        h, c = out[:, :n_img], out[:, n_img:]
        h = attn.to_out[1](attn.to_out[0](h))
        if not getattr(attn, "context_pre_only", False):
            c = attn.to_add_out(c)
        return h, c


def identity_image_mask(n: int, image: slice, device=None) -> Tensor:
    """The boolean attention mask (True: may attend) of PAG on a joint sequence of ``n`` tokens whose image tokens
    are ``image``: among image tokens only the diagonal; image tokens still see the other tokens, which see all."""
    mask = torch.ones(n, n, dtype=torch.bool, device=device)
    m = image.stop - image.start
    mask[image, image] = torch.eye(m, dtype=torch.bool, device=device)
    return mask


class IdentityImageAttention:
    """PAG on FLUX attention (``FluxAttention``): the module's own processor (rotary embeddings, q/k norms) run
    with :func:`identity_image_mask`, the joint sequence being ``[text, image]`` as FLUX orders it. Double-stream
    blocks pass the text as ``encoder_hidden_states``; single-stream blocks see the concatenation, whose text length
    ``text_len()`` gives (recorded from the network's ``encoder_hidden_states`` input)."""

    def __init__(self, processor, text_len):
        self.processor, self.text_len = processor, text_len

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, *args, **kwargs):
        if attention_mask is not None:
            raise ValueError("PAG on FLUX attention does not combine with an attention mask")
        if encoder_hidden_states is not None:
            n_txt, n = encoder_hidden_states.shape[1], encoder_hidden_states.shape[1] + hidden_states.shape[1]
        else:
            n_txt, n = self.text_len(), hidden_states.shape[1]
            if n_txt is None:
                raise ValueError("PAG on a single-stream FLUX block needs the text length: call the transformer "
                                 "with encoder_hidden_states=")
        mask = identity_image_mask(n, slice(n_txt, n), hidden_states.device)
        return self.processor(attn, hidden_states, encoder_hidden_states, mask, *args, **kwargs)


@contextmanager
def perturbed_attention(network: nn.Module, layers: Sequence[str]) -> Iterator[list[str]]:
    """PAG's perturbation on any diffusers network: the selected self-attention layers use
    :class:`IdentitySelfAttention`, SD3's joint attention :class:`IdentityJointAttention`, FLUX's attention
    :class:`IdentityImageAttention`; restored on exit. Yields the selected module names."""
    chosen = select_self_attention(network, layers)
    saved = [(m, m.processor) for _, m in chosen]
    text: list[int | None] = [None]

    def record(_module, args, kwargs):
        ehs = kwargs.get("encoder_hidden_states")
        text[0] = ehs.shape[1] if isinstance(ehs, Tensor) and ehs.ndim == 3 else None

    plain, joint, fused = IdentitySelfAttention(), IdentityJointAttention(), IdentityFusedAttention()
    handle = network.register_forward_pre_hook(record, with_kwargs=True)
    try:
        for m, processor in saved:
            if is_fused_attention(m):
                m.processor = fused
            elif type(m).__name__ == "FluxAttention":
                m.processor = IdentityImageAttention(processor, lambda: text[0])
            else:
                m.processor = joint if is_joint_attention(m) else plain
        yield [n for n, _ in chosen]
    finally:
        handle.remove()
        for m, processor in saved:
            m.processor = processor


# --- SEG: blurred self-attention queries ----------------------------------------------------------------------------

def seg_kernel_size(sigma: float) -> int:
    """The odd Gaussian kernel width of SEG's reference code: ``ceil(6 sigma) + 1`` made odd."""
    c = math.ceil(6 * sigma)
    return c + 1 - c % 2


def blur_queries(q: Tensor, grid: tuple[int, int], sigma: float) -> Tensor:
    """SEG's query smoothing (Hong, "Smoothed Energy Guidance", NeurIPS 2024, Sec. 3.3): the image-token queries
    ``q [B, H*W (+ more), C]`` as a ``C``-channel ``H x W`` image blurred by a 2-D Gaussian of std ``sigma`` (kernel
    :func:`seg_kernel_size`, clipped to the largest odd width <= side + 1 as the reference code, reflect padding);
    ``sigma = inf``: every query replaced by the spatial mean. Tokens after the ``H*W`` image tokens are kept."""
    import torch.nn.functional as F  # noqa: N812

    h, w = grid
    b, _, c = q.shape
    img = q[:, :h * w].transpose(1, 2).reshape(b, c, h, w)
    if math.isinf(sigma):
        img = img.mean(dim=(-2, -1), keepdim=True).expand(b, c, h, w)
    else:
        side = min(h, w)
        k = min(seg_kernel_size(sigma), side + 1 - side % 2)  # the reference's clip: pad k // 2 <= side / 2
        if k > 1:
            half = (k - 1) / 2
            x = torch.linspace(-half, half, k, device=q.device, dtype=torch.float32)
            pdf = torch.exp(-0.5 * (x / sigma) ** 2)
            k1 = (pdf / pdf.sum()).to(q.dtype)
            kernel = (k1[:, None] * k1[None, :]).expand(c, 1, k, k)
            img = F.conv2d(F.pad(img, [k // 2] * 4, mode="reflect"), kernel, groups=c)
    out = img.reshape(b, c, h * w).transpose(1, 2)
    return torch.cat([out, q[:, h * w:]], dim=1) if q.shape[1] > h * w else out


def _token_grid(n: int, size: tuple[int, int] | None) -> tuple[int, int]:
    """The ``H x W`` grid of ``n`` image tokens of an input of spatial ``size`` (a power-of-two downsampling or
    patching of it); a square grid when the size is unknown."""
    if size is not None:
        h, w = size
        f = 1
        while h // f * (w // f) > n and f <= max(h, w):
            f *= 2
        if h // f * (w // f) == n:
            return h // f, w // f
    r = math.isqrt(n)
    if r * r != n:
        raise ValueError(f"SEG cannot place {n} image tokens on a grid (input size {size}); its blur needs the "
                         "spatial layout of the queries")
    return r, r


@contextmanager
def blurred_queries(network: nn.Module, layers: Sequence[str], sigma: float) -> Iterator[list[str]]:
    """Within the block, the queries ``to_q(h)`` of the selected self-attention layers (UNet self-attention, the
    image tokens of SD3's joint attention and of FLUX's double- and single-stream attention) are blurred by
    :func:`blur_queries` at ``sigma``; the token grid follows the network's input (a pre-hook records the spatial
    size of a 4-D input; FLUX's packed 3-D latents are taken as a square grid, anything else is refused by name), and
    FLUX's single-stream queries ``[text, image]`` are blurred after the text (its length from the input's
    ``encoder_hidden_states``). Hooks are removed on exit."""
    if not (sigma > 0):
        raise ValueError(f"seg_blur_sigma must be > 0 (inf: the mean), got {sigma!r}")
    chosen = select_self_attention(network, layers)
    size: list[tuple[int, int] | None] = [None]
    text: list[int | None] = [None]

    def record(_module, args, kwargs):
        ehs = kwargs.get("encoder_hidden_states")
        text[0] = ehs.shape[1] if isinstance(ehs, Tensor) and ehs.ndim == 3 else None
        size[0] = None
        for t in (*args, *kwargs.values()):
            if isinstance(t, Tensor) and t.ndim >= 4:
                size[0] = (t.shape[-2], t.shape[-1])
                return

    def blur(_module, _inputs, q):
        if q.ndim != 3:
            return q
        return blur_queries(q, _token_grid(q.shape[1], size[0]), sigma)

    def blur_after_text(_module, _inputs, q):
        # FLUX single-stream attention: the queries of [text, image]; only the image part is blurred
        if text[0] is None:
            raise ValueError("SEG on a single-stream FLUX block needs the text length: call the transformer with "
                             "encoder_hidden_states=")
        n_txt = text[0]
        img = blur_queries(q[:, n_txt:], _token_grid(q.shape[1] - n_txt, size[0]), sigma)
        return torch.cat([q[:, :n_txt], img], dim=1)

    def single_stream(m: nn.Module) -> bool:
        return type(m).__name__ == "FluxAttention" and getattr(m, "add_q_proj", None) is None

    fused = [(m, m.processor) for _, m in chosen if is_fused_attention(m)]
    handles = [network.register_forward_pre_hook(record, with_kwargs=True)]
    try:
        handles += [m.to_q.register_forward_hook(blur_after_text if single_stream(m) else blur) for _, m in chosen
                    if not is_fused_attention(m)]
        for m, _ in fused:  # the shipped DiT: q comes out of the fused qkv projection, so a processor blurs it
            m.processor = BlurredFusedAttention(sigma)
        yield [n for n, _ in chosen]
    finally:
        for handle in handles:
            handle.remove()
        for m, processor in fused:
            m.processor = processor
