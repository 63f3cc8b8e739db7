"""diffusers UNets as steerdiff denoisers (``sd.models.from_diffusers``; docs/methods/conventions.md, "VP wrapping").

A diffusers ``UNet2DModel`` or ``UNet2DConditionModel`` and the discrete VP scheduler it was trained with
become a denoiser ``D(x, sigma, cond)``. This module only builds the network callable
``net(x_vp, t, cond)`` (conditions, dtypes, output channels); every conversion between the VP and sigma
conventions happens in :class:`steerdiff.core.vp.VPDenoiser`, so a diffusers model is sampled by the same
code as every other denoiser.

Conditions stay integer tensors (docs/methods/conventions.md, "Conditions"):

* ``UNet2DModel`` with a class embedding: ``cond [B]`` are class labels; ``-1`` maps to ``null_class``.
* ``UNet2DConditionModel``: ``condition_embeddings [K+1, seq, dim]`` holds precomputed
  ``encoder_hidden_states`` (e.g. a text encoder's output for K prompts) whose last row is the null
  (empty-prompt) embedding; ``cond [B]`` indexes its rows and ``-1`` selects the last one.

diffusers is an optional dependency, imported only when :func:`from_diffusers` is called.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..core.denoiser import NULL
from ..core.vp import PREDICTION_TYPES, VPDenoiser

_INSTALL_HINT = "from_diffusers needs the optional dependency diffusers: pip install 'steerdiff[diffusers]'"

# Zero-terminal-SNR schedules (rescale_betas_zero_snr=True) end in alphabar = 0, i.e. sigma = inf. That entry
# becomes a tiny positive value: 2^-24 (sigma_max = 4096, as in diffusers' EulerDiscreteScheduler), or a quarter
# of the smallest positive entry where 2^-24 is not below it, so that the table stays strictly decreasing.
_ZERO_SNR_ALPHABAR = 2.0**-24


def _version(t: Tensor) -> int:
    """In-place modification counter (-1 for inference tensors, which have none)."""
    return -1 if t.is_inference() else t._version


class _LabelCheck:
    """Validates integer condition labels ``[B]``, remembering the last tensor it accepted.

    The check reads the labels' range on the host. Samplers pass the same ``cond`` tensor at every step, so
    it runs once per trajectory, not once per step (no device sync inside the sampling loop). A tensor made
    under ``torch.inference_mode`` has no version counter, so its in-place edits go unnoticed; a label out of
    range then still fails, in the embedding lookup.
    """

    def __init__(self, n_labels: int | None, null_error: str | None, range_error: str | None = None):
        self.n_labels = n_labels  # labels must lie in [0, n_labels) (None: no upper bound)
        self.null_error = null_error  # why -1 is not allowed (None: it is)
        self.range_error = range_error or f"cond labels must be < {n_labels} for this model"
        self._last: tuple[Tensor, int] | None = None

    def __call__(self, cond: Tensor, batch: int) -> None:
        if self._last is not None and self._last[0] is cond and self._last[1] == _version(cond):
            return
        if not isinstance(cond, Tensor) or cond.dtype.is_floating_point or cond.dtype.is_complex:
            got = cond.dtype if isinstance(cond, Tensor) else type(cond).__name__
            raise ValueError(f"cond must be an integer tensor [B] of labels (-1 = null), got {got}")
        if cond.dtype == torch.bool or cond.shape != (batch,):
            got = f"{cond.dtype} {tuple(cond.shape)}"
            raise ValueError(f"cond must be an integer tensor of shape [B]=[{batch}], got {got}")
        lo, hi = (int(v) for v in torch.stack(torch.aminmax(cond)).tolist())
        if lo < NULL:
            raise ValueError(f"cond labels must be >= -1 (-1 = null), got {lo}")
        if lo == NULL and self.null_error is not None:
            raise ValueError(f"cond contains -1 (null) but {self.null_error}")
        if self.n_labels is not None and hi >= self.n_labels:
            raise ValueError(f"{self.range_error}, got {hi}")
        self._last = (cond, _version(cond))


class _ClassLabels:
    """``UNet2DModel`` conditions: none (unconditional), or ``class_labels`` with -1 -> ``null_class``."""

    def __init__(self, unet: Any, null_class: int | None):
        self.conditional = unet.class_embedding is not None
        self.null_class = null_class
        if self.conditional:
            is_table = isinstance(unet.class_embedding, torch.nn.Embedding)
            no_null = (
                None
                if null_class is not None
                else "the UNet has no null class: pass null_class= (the unconditional class index)"
            )
            self.check = _LabelCheck(unet.config.num_class_embeds if is_table else None, no_null)
        else:
            # No class embedding: the model is unconditional, so only the null condition is meaningful.
            no_class = "the UNet has no class embedding, so cond must be None or all -1"
            self.check = _LabelCheck(0, None, no_class)

    def __call__(self, cond: Tensor | None, batch: int, device: torch.device, dtype: torch.dtype) -> dict:
        if not self.conditional:
            if cond is not None:
                self.check(cond, batch)
            return {}
        if cond is None:
            if self.null_class is None:
                raise ValueError(
                    "cond=None means all-null, but this class-conditional UNet has no null class: "
                    "pass null_class= to from_diffusers or give class labels"
                )
            return {"class_labels": torch.full((batch,), self.null_class, dtype=torch.long, device=device)}
        self.check(cond, batch)
        labels = cond.to(device=device, dtype=torch.long)
        if self.null_class is not None:
            labels = torch.where(labels == NULL, self.null_class, labels)
        return {"class_labels": labels}


class _EmbeddingRows:
    """``UNet2DConditionModel`` conditions: ``cond`` selects rows of precomputed ``encoder_hidden_states``."""

    def __init__(self, embeddings: Tensor):
        self.embeddings = embeddings
        self.null_index = embeddings.shape[0] - 1  # the last row is the null (empty-prompt) embedding
        k = self.null_index
        self.check = _LabelCheck(k, None, f"cond labels must be < K={k} (rows of condition_embeddings)")
        self._cast: Tensor | None = None  # the table in the UNet's device and dtype

    def __call__(self, cond: Tensor | None, batch: int, device: torch.device, dtype: torch.dtype) -> dict:
        if self._cast is None or self._cast.device != device or self._cast.dtype != dtype:
            self._cast = self.embeddings.to(device=device, dtype=dtype)
        table = self._cast
        if cond is None:
            return {"encoder_hidden_states": table[self.null_index].expand(batch, *table.shape[1:])}
        self.check(cond, batch)
        index = torch.where(cond == NULL, self.null_index, cond).to(device=device, dtype=torch.long)
        return {"encoder_hidden_states": table[index]}


class _UNetNet:
    """``net(x_vp, t, cond) -> eps | v | x0`` for a diffusers UNet: dtypes, conditions, learned variance."""

    def __init__(self, unet: Any, conditions: _ClassLabels | _EmbeddingRows, channels: int, split: bool):
        self.unet = unet
        self.conditions = conditions
        self.channels = channels
        self.split = split  # out_channels = 2 C (learned variance): keep the mean prediction only
        self._dtypes: tuple[torch.dtype, torch.dtype] | None = None  # (first parameter's, compute dtype)

    def compute_dtype(self) -> torch.dtype:
        """The UNet's dtype as diffusers defines it (honouring layerwise-casting hooks).

        ``unet.dtype`` walks every submodule (~0.2 ms on a tiny UNet), so it is cached and recomputed only when
        the first parameter's dtype changes (``unet.to(torch.float16)`` after wrapping).
        """
        first = next(self.unet.parameters()).dtype
        if self._dtypes is None or self._dtypes[0] != first:
            self._dtypes = (first, self.unet.dtype)
        return self._dtypes[1]

    def __call__(self, x_vp: Tensor, t: Tensor, cond: Tensor | None = None) -> Tensor:
        dtype = self.compute_dtype()
        kwargs = self.conditions(cond, x_vp.shape[0], x_vp.device, dtype)
        # Timesteps in float32: exact for integers below 2^24; diffusers' time projection computes in float32.
        out = self.unet(x_vp.to(dtype), t.to(torch.float32), **kwargs).sample
        return out[:, : self.channels] if self.split else out


def from_diffusers(
    unet: Any,
    scheduler: Any,
    *,
    condition_embeddings: Tensor | None = None,
    null_class: int | None = None,
    quantize: bool = True,
    sample_shape: tuple[int, ...] | None = None,
) -> VPDenoiser:
    """Wrap a diffusers UNet and its VP scheduler as a denoiser ``D(x, sigma, cond=None) -> x0_hat``.

    The scheduler provides ``alphas_cumprod`` (the training schedule) and ``config.prediction_type``
    (``epsilon``, ``v_prediction`` or ``sample``); its sampling loop is not used. For example
    ``sd.sample(D, noise, sd.sigmas.from_alphas_cumprod(scheduler.alphas_cumprod, 50, "leading",
    scheduler.config.steps_offset), method="ddim")`` reproduces diffusers' ``DDIMScheduler`` loop (eta 0,
    ``clip_sample=False``, ``set_alpha_to_one=True``) in sigma units, ``x_sigma = x_vp * sqrt(1 + sigma^2)``.

    The UNet runs in the dtype of its parameters; the denoiser returns ``x``'s dtype. Of a UNet whose
    ``out_channels`` is twice ``in_channels`` (learned variance), the first half (the mean) is used.

    Args:
        unet: a ``diffusers.UNet2DModel`` or ``diffusers.UNet2DConditionModel``.
        scheduler: a diffusers scheduler with ``alphas_cumprod`` (DDPM, DDIM, PNDM, Euler, ...).
        condition_embeddings: ``UNet2DConditionModel`` only, and required there: a float tensor
            ``[K+1, seq, dim]`` of ``encoder_hidden_states`` whose last row is the null (empty-prompt)
            embedding; ``cond [B]`` with values in ``[-1, K)`` selects rows, ``-1`` the last one.
        null_class: ``UNet2DModel`` with a class embedding only: the class index meaning "no class", used
            for ``cond == -1`` and ``cond=None``. Without it a null condition is an error.
        quantize: evaluate the UNet at the nearest training timestep (True; exact for schedules made by
            :func:`steerdiff.sigmas.from_alphas_cumprod`) or at the interpolated timestep (False).
        sample_shape: per-sample shape ``(C, H, W)`` that samplers check the noise against; defaults to
            ``(in_channels, sample_size, sample_size)`` from the UNet's config. Set it to sample other sizes.

    Returns:
        A :class:`steerdiff.core.vp.VPDenoiser`; ``denoiser.net.unet`` is the wrapped UNet.

    Raises:
        ImportError: diffusers is not installed.
        TypeError: ``unet`` is not a supported class, or an argument has the wrong type.
        ValueError: unsupported scheduler or prediction type, bad ``condition_embeddings`` or ``null_class``.
    """
    try:
        from diffusers import UNet2DConditionModel, UNet2DModel
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e

    # The UNet.
    if not isinstance(unet, (UNet2DModel, UNet2DConditionModel)):
        got = type(unet).__name__
        raise TypeError(f"unet must be a diffusers UNet2DModel or UNet2DConditionModel, got {got}")
    config = unet.config
    if getattr(config, "time_embedding_type", "positional") == "fourier":
        raise ValueError("unet uses Fourier time embeddings (a score-SDE VE model); from_diffusers needs a VP model")
    channels, out_channels = int(config.in_channels), int(config.out_channels)
    if out_channels not in (channels, 2 * channels):
        raise ValueError(
            f"unet has in_channels={channels} but out_channels={out_channels}; expected them equal "
            "(or out_channels twice in_channels, for a learned variance)"
        )

    # The scheduler: only its training schedule and prediction type are used.
    alphas_cumprod = getattr(scheduler, "alphas_cumprod", None)
    if not isinstance(alphas_cumprod, Tensor):
        raise ValueError(
            f"scheduler ({type(scheduler).__name__}) has no alphas_cumprod tensor: from_diffusers needs the "
            "discrete VP schedule the UNet was trained with (e.g. DDPMScheduler, DDIMScheduler); "
            "flow-matching and VE schedulers are not supported"
        )
    prediction_type = getattr(getattr(scheduler, "config", None), "prediction_type", None)
    if prediction_type not in PREDICTION_TYPES:
        raise ValueError(f"scheduler.config.prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
    alphas_cumprod = _finite_terminal_snr(alphas_cumprod.detach().to("cpu", torch.float64))

    if not isinstance(quantize, bool):
        raise TypeError(f"quantize must be a bool, got {type(quantize).__name__}")
    if sample_shape is None:
        sample_shape = _default_sample_shape(unet, channels)
    else:
        sample_shape = tuple(int(s) for s in sample_shape)
        if len(sample_shape) != 3 or sample_shape[0] != channels:
            raise ValueError(f"sample_shape must be (C={channels}, H, W) for this unet, got {sample_shape}")

    # The conditions.
    conditions: _ClassLabels | _EmbeddingRows
    if isinstance(unet, UNet2DConditionModel):
        if null_class is not None:
            raise ValueError(
                "null_class applies to UNet2DModel only; for a UNet2DConditionModel the null condition is "
                "the last row of condition_embeddings"
            )
        if getattr(config, "addition_embed_type", None) is not None or unet.class_embedding is not None:
            raise ValueError(
                "unet needs conditioning inputs other than encoder_hidden_states (addition_embed_type or "
                "class_embed_type is set, as in SDXL); from_diffusers does not support them"
            )
        conditions = _EmbeddingRows(_check_embeddings(condition_embeddings, config.cross_attention_dim))
    else:
        if condition_embeddings is not None:
            raise ValueError(
                "condition_embeddings applies to UNet2DConditionModel only; a UNet2DModel takes class labels as cond"
            )
        _check_null_class(unet, null_class)
        conditions = _ClassLabels(unet, null_class)

    net = _UNetNet(unet, conditions, channels, split=out_channels == 2 * channels)
    return VPDenoiser(net, alphas_cumprod, prediction_type, quantize, sample_shape=sample_shape)


def _finite_terminal_snr(abar: Tensor) -> Tensor:
    """Replace ``alphabar = 0`` entries (infinite sigma) by a tiny value below every positive entry."""
    positive = abar[abar > 0]
    if positive.numel() == abar.numel() or positive.numel() == 0:
        return abar  # nothing to replace, or nothing usable (VPDenoiser then names the problem)
    smallest = float(positive.min())
    return torch.where(abar > 0, abar, _ZERO_SNR_ALPHABAR if _ZERO_SNR_ALPHABAR < smallest else smallest / 4)


def _default_sample_shape(unet: Any, channels: int) -> tuple[int, int, int] | None:
    size = unet.config.sample_size
    if size is None:
        return None
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return (channels, int(h), int(w))


def _check_embeddings(embeddings: Tensor | None, cross_attention_dim: Any) -> Tensor:
    if embeddings is None:
        raise ValueError(
            "condition_embeddings is required for a UNet2DConditionModel: a float tensor [K+1, seq, dim] of "
            "encoder_hidden_states whose last row is the null (empty-prompt) embedding"
        )
    if not isinstance(embeddings, Tensor) or not embeddings.is_floating_point():
        got = embeddings.dtype if isinstance(embeddings, Tensor) else type(embeddings).__name__
        raise TypeError(f"condition_embeddings must be a floating-point tensor [K+1, seq, dim], got {got}")
    if embeddings.ndim != 3 or embeddings.shape[0] < 1 or embeddings.shape[1] < 1:
        raise ValueError(
            f"condition_embeddings must have shape [K+1, seq, dim] (last row = null), got {tuple(embeddings.shape)}"
        )
    if isinstance(cross_attention_dim, int) and embeddings.shape[2] != cross_attention_dim:
        raise ValueError(
            f"condition_embeddings has dim {embeddings.shape[2]} but the unet's cross_attention_dim is "
            f"{cross_attention_dim} (expected [K+1, seq, {cross_attention_dim}])"
        )
    return embeddings.detach()


def _check_null_class(unet: Any, null_class: int | None) -> None:
    embed_type = unet.config.class_embed_type
    if unet.class_embedding is not None and embed_type not in (None, "timestep"):
        raise ValueError(
            f"unet has class_embed_type={embed_type!r}, which takes float vectors; from_diffusers passes "
            "integer class labels (class_embed_type None with num_class_embeds, or 'timestep')"
        )
    if null_class is None:
        return
    if unet.class_embedding is None:
        raise ValueError("null_class was given but the unet has no class embedding (it is unconditional)")
    if isinstance(null_class, bool) or not isinstance(null_class, int) or null_class < 0:
        raise ValueError(f"null_class must be a non-negative int class index, got {null_class!r}")
    n = unet.config.num_class_embeds
    if isinstance(unet.class_embedding, torch.nn.Embedding) and null_class >= n:
        raise ValueError(f"null_class must be < num_class_embeds={n}, got {null_class}")
