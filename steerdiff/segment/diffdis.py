"""DiffDIS: one-step dichotomous segmentation with a latent diffusion prior and an edge task beside the mask
(docs/methods/diffdis.md, "DiffDIS").

Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity":

* **Image latent as condition** (Sec. 3.1): the denoiser's input is the noisy mask latent concatenated with the
  image latent along channels; the first convolution of the pre-trained UNet is widened to take it. By default the
  prior's kernel goes on the image latent and the noisy-mask slice starts at zero (the widened network is the prior
  applied to the image at the start); the official code repeats the old kernel and halves it (Marigold's rule);
  both, and the earlier rule (kernel on the noisy input, image slice zero), are :data:`CONDITION_INITS`
  (docs/methods/diffdis.md, "Diagnosis: what limited the one-step model").
* **One-step denoising at a fixed timestep** (Sec. 3.2): training adds noise at the top of the schedule
  (``t = T``; here ``sigma = sigma_t``) and regresses the clean mask latent from a single evaluation; inference
  is the same single evaluation. The multi-step ablation runs the same model through a sampler from ``sigma_t``.
  The level the noise embedding is told can be shifted (``sigma_embed``, :class:`DiffDIS`): the small prior's
  features of an image are poor at ``sigma_t``.
* **Edge task in the same batch with batch-discriminative embeddings** (Sec. 3.3): the batch holds the mask rows
  then the edge rows of the same images; a task label ``l`` (one-hot, mask or edge) is embedded as
  ``[sin l, cos l]`` by a two-layer MLP and added to the noise-level embedding. The last layer starts at zero, so
  the embedding adds nothing until it is trained.
* **Detail-balancing interactive attention** (Sec. 3.3, DBIA): each stream's features attend to the other
  stream's features of the same image (mask queries over edge keys and values, and back), so the edge stream's
  detail reaches the mask. The official code adds a third attention per transformer block initialised from its
  self-attention; the backbone here has no attention, so :class:`CrossTaskAttention` is inserted after the
  bottleneck and at the full latent resolution, its residual gated by a scalar that starts at zero (the network
  is still exactly the prior at the start).
* Loss: mean squared error of the mask and the edge latents (their sum), as the official ``run_train.py``.
  Optionally (``FinetuneConfig.pixel_loss``, off by default) a loss on the predicted mask latent decoded by the
  frozen mask decoder, in pixels (:func:`decoded_mask_loss`): DiffDIS's latent MSE cannot see wires thinner than a
  latent pixel (docs/methods/diffdis.md, "Pixel-space loss through the mask decoder").

Left out: the scale-wise conditional injection of multi-scale image latents (SWCI), pyramid noise and the
cut-mix augmentation; the VAE's decoder is fine-tuned for masks (:mod:`steerdiff.segment.codec`).

The prior is a :class:`steerdiff.models.UNet` over image latents, pre-trained here with the EDM objective
(:func:`pretrain_prior`). :class:`DiffDIS` is a denoiser ``D(x, sigma, cond)`` in the EDM convention (Karras et al.
2022 preconditioning) with a structured condition :class:`SegmentCond` (image latents, task labels), so the
multi-step ablation and the multi-step diffusion segmenter run through :func:`steerdiff.sample`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.denoiser import append_dims, as_sigma_batch
from ..core.noise import randn
from ..core.sampling import sample
from ..core.sigmas import karras
from ..models.precond import EDMPrecond, edm_scalings
from ..models.unet import ResBlock, UNet
from ..train.edm import edm_loss, edm_weight, sample_sigmas

MASK, EDGE = 0, 1
TASKS = ("mask", "edge")
SIGMA_T = 10.0
"""The fixed noise level of one-step training and inference (the top of the prior's range, as DiffDIS's t = 999)."""
CONDITION_INITS = ("image", "noise", "marigold")
"""Where the prior's input kernel goes when the input convolution is widened (:class:`DiffDISNet`)."""
DBIA_INITS = ("gate", "zero_proj")
"""How the cross-task attentions start silent (:class:`CrossTaskAttention`)."""


def task_features(task: Tensor) -> Tensor:
    """DiffDIS's batch-discriminative code of task labels ``[B]`` (0 mask, 1 edge): ``[sin l, cos l]`` of the
    one-hot ``l`` (mask ``[0, 1]``, edge ``[1, 0]``, as the official code), ``[B, 4]`` float."""
    onehot = torch.stack([(task == EDGE), (task == MASK)], dim=-1).float()
    return torch.cat([onehot.sin(), onehot.cos()], dim=-1)


class SegmentCond:
    """The structured condition of :class:`DiffDIS`: image latents ``[B, C, h, w]`` and task labels ``[B]``.

    ``paired`` says the batch is ``[mask rows of B/2 images; edge rows of the same images]``, the layout in which
    the cross-task attention runs; otherwise the rows are independent and it is skipped.
    """

    is_structured_cond = True

    def __init__(self, image: Tensor, task: Tensor, paired: bool = False):
        if not isinstance(image, Tensor) or image.ndim != 4:
            raise ValueError(f"image must be latents [B, C, h, w], got "
                             f"{tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__}")
        if not isinstance(task, Tensor) or task.shape != (image.shape[0],) or task.dtype.is_floating_point:
            raise ValueError(f"task must be an integer tensor [B]=[{image.shape[0]}] (0 mask, 1 edge)")
        if paired and image.shape[0] % 2:
            raise ValueError("a paired condition needs an even batch (mask rows then edge rows)")
        self.image, self.task, self.paired = image, task, bool(paired)

    @classmethod
    def for_images(cls, image: Tensor, edge: bool = True) -> SegmentCond:
        """Rows for the mask (and, with ``edge``, then the edge) of every image latent ``[B, C, h, w]``."""
        b = image.shape[0]
        if not edge:
            return cls(image, torch.full((b,), MASK, dtype=torch.long, device=image.device))
        task = torch.cat([torch.full((b,), MASK), torch.full((b,), EDGE)]).to(image.device)
        return cls(torch.cat([image, image]), task, paired=True)

    @property
    def batch_size(self) -> int:
        return self.image.shape[0]

    def null_like(self) -> SegmentCond:
        """No null exists for a segmentation condition (no guidance is trained); the same condition."""
        return self

    def index(self, rows) -> SegmentCond:
        return SegmentCond(self.image[rows], self.task[rows])

    @classmethod
    def cat(cls, conds: Sequence[SegmentCond]) -> SegmentCond:
        return cls(torch.cat([c.image for c in conds]), torch.cat([c.task for c in conds]))


class CrossTaskAttention(nn.Module):
    """DBIA's interaction (Yu et al. 2025, Sec. 3.3): ``h + gate * proj(attn(q(h), k(h'), v(h')))`` where ``h'`` is
    the other task's features of the same image (the two halves of a paired batch swapped).

    Either way the block starts as the identity (the network is the prior at the start); ``init`` says how:

    * ``"gate"``: ``gate = 0``, ``proj`` random. Every weight of the branch then has a gradient proportional to
      ``gate``, and the gate's own is the correlation of a random projection with the loss gradient, so the branch
      can stay shut (docs/methods/diffdis.md, "The edge task's contribution": gates 0.006 / -0.009 after 300
      steps).
    * ``"zero_proj"``: ``gate = 1``, ``proj`` zero (weights and bias), the zero-initialised output layer of
      ControlNet's zero convolutions and DiT's adaLN-Zero: ``proj``'s gradient is the attention output times the
      loss gradient, non-zero from the first step, and the official code's extra attention (initialised from the
      self-attention, added without a gate) is likewise open from the start.
    """

    def __init__(self, channels: int, heads: int = 2, groups: int = 8, init: str = "gate"):
        super().__init__()
        if channels % heads:
            raise ValueError(f"channels={channels} must be divisible by heads={heads}")
        if init not in DBIA_INITS:
            raise ValueError(f"init must be one of {DBIA_INITS}, got {init!r}")
        self.heads = heads
        self.norm_q = nn.GroupNorm(math.gcd(channels, groups), channels)
        self.norm_kv = nn.GroupNorm(math.gcd(channels, groups), channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.kv = nn.Conv2d(channels, 2 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)
        self.gate = nn.Parameter(torch.zeros(()))
        if init == "zero_proj":
            nn.init.zeros_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)
            with torch.no_grad():
                self.gate.fill_(1.0)

    def forward(self, h: Tensor) -> Tensor:
        b, c, hh, ww = h.shape
        half = b // 2
        other = torch.cat([h[half:], h[:half]])

        def heads(t: Tensor) -> Tensor:  # [B, C, H, W] -> [B, heads, HW, C/heads]
            return t.reshape(b, self.heads, c // self.heads, hh * ww).transpose(-1, -2)

        q = heads(self.q(self.norm_q(h)))
        k, v = self.kv(self.norm_kv(other)).chunk(2, dim=1)
        out = F.scaled_dot_product_attention(q, heads(k), heads(v))
        out = out.transpose(-1, -2).reshape(b, c, hh, ww)
        return h + self.gate * self.proj(out)


class DiffDISNet(nn.Module):
    """A pre-trained :class:`~steerdiff.models.UNet` turned into DiffDIS's backbone ``F(x_in, c_noise, cond)``.

    The prior's modules are kept (``self.unet``) with its input convolution widened from ``C`` to ``2 C`` channels
    (noisy mask latent, then the image latent), a task-embedding MLP (last layer zero) and two cross-task attentions
    (gates zero). Fully convolutional: any latent size divisible by the UNet's downsampling works (trained at one
    size, usable at another).

    Where the prior's input kernel goes (``condition_init``; docs/methods/diffdis.md, "Diagnosis: what limited the
    one-step model"):

    * ``"image"``: on the image latent's channels, the noisy mask latent's slice zero. At the start the network is
      the prior applied to the image latent, so the features it learnt for these images are what fine-tuning starts
      from; the noise (which carries nothing at ``sigma_t``) enters only once its slice is trained.
    * ``"noise"``: on the noisy mask latent's channels, the image slice zero (the network is exactly the prior on
      the mask input; the image enters only as its slice grows).
    * ``"marigold"``: the kernel on both, halved (the official code's rule, from Marigold).

    Args:
        unet: the prior's backbone (its weights are used, not copied).
        heads: attention heads of the cross-task attentions.
        condition_init: ``"image"``, ``"noise"`` or ``"marigold"`` (above). Only the initial weights differ; a
            saved network loads whatever its rule was.
        dbia_init: how the cross-task attentions start silent, ``"gate"`` or ``"zero_proj"``
            (:class:`CrossTaskAttention`; :data:`DBIA_INITS`). Only the initial weights differ.
    """

    def __init__(self, unet: UNet, heads: int = 2, condition_init: str = "image", dbia_init: str = "gate"):
        super().__init__()
        if not isinstance(unet, UNet):
            raise TypeError(f"unet must be a steerdiff.models.UNet, got {type(unet).__name__}")
        if unet.num_classes:
            raise ValueError("the prior must be unconditional (the task embedding takes the condition's place)")
        if condition_init not in CONDITION_INITS:
            raise ValueError(f"condition_init must be one of {CONDITION_INITS}, got {condition_init!r}")
        if dbia_init not in DBIA_INITS:
            raise ValueError(f"dbia_init must be one of {DBIA_INITS}, got {dbia_init!r}")
        self.unet = unet
        c = unet.sample_shape[0]
        old = unet.conv_in
        wide = nn.Conv2d(2 * c, old.out_channels, old.kernel_size, padding=old.padding)
        with torch.no_grad():
            wide.weight.zero_()
            if condition_init in ("noise", "marigold"):
                wide.weight[:, :c].copy_(old.weight)
            if condition_init in ("image", "marigold"):
                wide.weight[:, c:].copy_(old.weight)
            if condition_init == "marigold":
                wide.weight.mul_(0.5)
            wide.bias.copy_(old.bias)
        unet.conv_in = wide
        self.latent_channels = c
        emb_dim = unet.noise_mlp[-1].out_features
        self.task_mlp = nn.Sequential(nn.Linear(4, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        nn.init.zeros_(self.task_mlp[-1].weight)
        nn.init.zeros_(self.task_mlp[-1].bias)
        mid_ch = unet.mid[-1].conv2.out_channels
        out_ch = unet.conv_out.in_channels
        self.dbia_mid = CrossTaskAttention(mid_ch, heads, init=dbia_init)
        self.dbia_out = CrossTaskAttention(out_ch, heads, init=dbia_init)
        self.to(device=old.weight.device, dtype=old.weight.dtype)  # the new layers follow the prior's device/dtype

    def forward(self, x: Tensor, c_noise: Tensor, cond: SegmentCond) -> Tensor:
        u = self.unet
        if not isinstance(cond, SegmentCond):
            raise TypeError(f"cond must be a SegmentCond (image latents and task labels), got {type(cond).__name__}")
        if cond.image.shape != x.shape:
            raise ValueError(f"cond.image must match x {tuple(x.shape)}, got {tuple(cond.image.shape)}")
        emb = u.noise_mlp(u.fourier(c_noise).to(x.dtype))
        emb = F.silu(emb + self.task_mlp(task_features(cond.task).to(x.dtype)))
        h = u.conv_in(torch.cat([x, cond.image.to(x.dtype)], dim=1))
        hs = [h]
        for layer in u.down:
            h = layer(h, emb) if isinstance(layer, ResBlock) else layer(h)
            hs.append(h)
        for layer in u.mid:
            h = layer(h, emb)
        if cond.paired:
            h = self.dbia_mid(h)
        for layer in u.up:
            h = layer(torch.cat([h, hs.pop()], dim=1), emb) if isinstance(layer, ResBlock) else layer(h)
        if cond.paired:
            h = self.dbia_out(h)
        return u.conv_out(F.silu(u.norm_out(h)))


class DiffDIS(nn.Module):
    """The DiffDIS denoiser ``D(x, sigma, cond) = c_skip x + c_out F(c_in x, c_noise, cond)`` (EDM preconditioning,
    Karras et al. 2022, Table 1) over mask/edge latents, with ``cond`` a :class:`SegmentCond`.

    ``sigma_embed`` decouples the noise level the network's noise embedding is told from the noise actually added:
    ``c_noise = ln(sigma * sigma_embed / sigma_t) / 4``, a fixed shift of the embedded log-level, so the one-step
    evaluation at ``sigma_t`` runs the backbone as the prior ran at ``sigma_embed``. DiffDIS fixes ``t = 999`` (Yu et
    al. 2025, Sec. 3.2), where Stable Diffusion's features of the image condition are rich; the small prior here
    has useful features of an image only at low levels (at ``sigma_t`` it outputs about the data mean), which is
    what the shift reaches (docs/methods/diffdis.md, "Diagnosis: what limited the one-step model").

    Args:
        net: a :class:`DiffDISNet`.
        sigma_data: the standard deviation of the mask latents.
        sigma_t: the fixed one-step noise level (:data:`SIGMA_T`).
        sigma_embed: the level the embedding is told at ``sigma_t`` (``None``: ``sigma_t``, no shift).
    """

    def __init__(self, net: DiffDISNet, sigma_data: float, sigma_t: float = SIGMA_T, sigma_embed: float | None = None):
        super().__init__()
        if sigma_embed is not None and not (isinstance(sigma_embed, (int, float)) and not isinstance(sigma_embed, bool)
                                            and math.isfinite(sigma_embed) and sigma_embed > 0):
            raise ValueError(f"sigma_embed must be a finite number > 0 or None, got {sigma_embed!r}")
        self.net = net
        self.sigma_data = float(sigma_data)
        self.sigma_t = float(sigma_t)
        self.sigma_embed = None if sigma_embed is None else float(sigma_embed)
        # ln(sigma_embed / sigma_t) / 4: added to EDM's c_noise = ln(sigma) / 4 (a host number, fixed at build time).
        self._noise_shift = 0.0 if sigma_embed is None else math.log(self.sigma_embed / self.sigma_t) / 4

    @property
    def sigma_range(self) -> tuple[float, float]:
        return 0.0, self.sigma_t

    def forward(self, x: Tensor, sigma: Tensor | float, cond: SegmentCond) -> Tensor:
        sigma = as_sigma_batch(sigma, x)
        c_skip, c_out, c_in, c_noise = edm_scalings(sigma, self.sigma_data)
        # Scalings in the state's dtype (a sampler may run in float64), the network in its parameters' dtype.
        net_dtype = next(self.net.parameters()).dtype
        f = self.net((append_dims(c_in, x.ndim) * x).to(net_dtype), (c_noise + self._noise_shift).to(net_dtype), cond)
        return append_dims(c_skip, x.ndim) * x + append_dims(c_out, x.ndim) * f.to(x.dtype)


def prior_unet(latent_size: int, latent_channels: int = 4, channels: Sequence[int] = (32, 64),
               num_res_blocks: int = 1) -> UNet:
    """The backbone of the latent prior (an unconditional :class:`~steerdiff.models.UNet`)."""
    return UNet(img_size=latent_size, in_channels=latent_channels, channels=tuple(channels),
                num_res_blocks=num_res_blocks, num_classes=None)


def pretrain_prior(latents: Tensor, *, steps: int = 1500, batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                   channels: Sequence[int] = (32, 64), num_res_blocks: int = 1) -> tuple[EDMPrecond, dict]:
    """Pre-train the latent diffusion prior on image latents ``[N, C, h, w]`` with the EDM objective
    (:func:`steerdiff.train.edm.edm_loss`, Karras et al. 2022), the stand-in for DiffDIS's Stable Diffusion.

    Returns:
        The prior (an :class:`~steerdiff.models.EDMPrecond`) and ``{"steps", "final_loss", "cpu_s", "sigma_data"}``.
    """
    torch.manual_seed(seed)
    sigma_data = float(latents.std())
    model = EDMPrecond(prior_unet(latents.shape[-1], latents.shape[1], channels, num_res_blocks), sigma_data)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    t0 = time.process_time()
    loss = torch.zeros(())
    for step in range(steps):
        for group in opt.param_groups:  # cosine decay: a short run ends at a well-settled point
            group["lr"] = lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        idx = torch.randint(0, latents.shape[0], (batch_size,), generator=g)
        loss = edm_loss(model, latents[idx], None, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return model, {"steps": steps, "final_loss": float(loss.detach()), "cpu_s": time.process_time() - t0,
                   "sigma_data": sigma_data}


@dataclass
class FinetuneConfig:
    """DiffDIS fine-tuning (and its ablations and the equal-parameter baselines, all on the same network).

    objective: ``"one_step"`` (DiffDIS: regress the clean latent from noise at ``sigma_t``) or ``"diffusion"``
        (the multi-step diffusion segmenter: EDM log-normal noise levels and weighting, sampled with many steps).
    edge: train the edge task beside the mask in the same batch (DiffDIS) or the mask alone (ablation).
    init: ``"prior"`` (fine-tune the pre-trained prior) or ``"scratch"`` (the same network, random weights).
    pixel_loss: weight of :func:`decoded_mask_loss` (the predicted mask latents decoded by the frozen mask decoder,
        scored in pixels) added to the latent loss; ``0`` leaves DiffDIS's objective as it is. One-step only.
    condition_init: where the prior's input kernel goes (:class:`DiffDISNet`); the scratch network follows the same
        rule with its random kernel.
    sigma_embed: the level the noise embedding is told at ``sigma_t`` (:class:`DiffDIS`); one-step only (the
        diffusion objective keeps the plain embedding).
    dbia_init: how the cross-task attentions start silent (:class:`CrossTaskAttention`): ``"gate"`` (a zero
        scalar gate on a random projection) or ``"zero_proj"`` (a zero projection, gate 1).
    """

    objective: str = "one_step"  # "one_step" | "diffusion"
    edge: bool = True            # the auxiliary edge task (Sec. 3.3)
    init: str = "prior"          # "prior" | "scratch"
    steps: int = 600             # Adam steps
    batch_size: int = 16         # images per step (a paired batch holds 2x rows)
    lr: float = 5e-4             # Adam learning rate (cosine decay to 5%)
    sigma_t: float = SIGMA_T     # the one-step noise level
    seed: int = 0                # initialisation and row/noise draws
    pixel_loss: float = 0.0      # weight of decoded_mask_loss on the mask rows (0: the latent MSE alone)
    condition_init: str = "image"       # the prior's input kernel on the image latent (CONDITION_INITS)
    sigma_embed: float | None = 0.5     # the embedded level at sigma_t (None: sigma_t itself, DiffDIS's t = 999)
    dbia_init: str = "gate"             # the cross-task attentions' silent start (DBIA_INITS)


def build(prior: EDMPrecond, mask_sigma_data: float, config: FinetuneConfig) -> DiffDIS:
    """The DiffDIS denoiser on a copy of ``prior``'s backbone (or, with ``init="scratch"``, on a freshly
    initialised network of the same architecture)."""
    import copy

    if config.init not in ("prior", "scratch"):
        raise ValueError(f"init must be 'prior' or 'scratch', got {config.init!r}")
    torch.manual_seed(config.seed)
    unet = copy.deepcopy(prior.net)
    if config.init == "scratch":
        fresh = UNet(**unet.config)
        unet.load_state_dict(fresh.state_dict())
    sigma_embed = config.sigma_embed if config.objective == "one_step" else None
    return DiffDIS(DiffDISNet(unet, condition_init=config.condition_init, dbia_init=config.dbia_init),
                   mask_sigma_data, config.sigma_t, sigma_embed)


def decoded_mask_loss(raw: Tensor, mask: Tensor) -> Tensor:
    """The pixel-space loss of the decoder's raw output ``raw`` ``[B, 1, H, W]`` (about [-1, 1]; the map is
    ``(raw + 1) / 2``, as :meth:`LatentCodec.decode_map`) against binary masks ``[B, 1, H, W]``
    (docs/methods/diffdis.md, "Pixel-space loss through the mask decoder").

    ``|raw - (2 m - 1)|`` (mean) + BCE + soft IoU ``1 - (sum p m + 1) / (sum (p + m - p m) + 1)`` (per image, batch
    mean) of ``p = (raw + 1) / 2`` clamped to ``[1e-4, 1 - 1e-4]``: the BCE and soft IoU of the pixel regressor
    (:func:`steerdiff.segment.baselines.segmentation_loss`, IS-Net's supervision) on the map the segmenter outputs;
    the L1 term keeps a gradient where the clamp has none (a wire pixel decoded below -1), as the mask decoder's own
    fine-tuning loss (:func:`steerdiff.segment.codec.finetune_mask_decoder`).
    """
    p = ((raw + 1) / 2).clamp(1e-4, 1 - 1e-4)
    l1 = (raw - (2 * mask - 1)).abs().mean()
    bce = F.binary_cross_entropy(p, mask)
    pf, mf = p.flatten(1), mask.flatten(1)
    iou = ((pf * mf).sum(1) + 1) / ((pf + mf - pf * mf).sum(1) + 1)
    return l1 + bce + (1 - iou).mean()


def _check_pixel_loss(config: FinetuneConfig, decoder, mask_pixels: Tensor | None, n: int) -> bool:
    """Validate ``config.pixel_loss`` and what it needs; True when the pixel loss is on."""
    w = config.pixel_loss
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
        raise ValueError(f"pixel_loss must be a finite number >= 0, got {w!r}")
    if w == 0:
        return False
    if config.objective != "one_step":
        raise ValueError(f"pixel_loss needs objective='one_step' (got {config.objective!r}): the decoded loss "
                         "scores the one-step prediction")
    if decoder is None or not callable(getattr(decoder, "decode_raw", None)):
        raise ValueError("pixel_loss > 0 needs decoder= (a LatentCodec: its mask decoder, kept frozen)")
    if not isinstance(mask_pixels, Tensor) or mask_pixels.ndim != 4 or mask_pixels.shape[:2] != (n, 1):
        raise ValueError(f"pixel_loss > 0 needs mask_pixels=[N={n}, 1, H, W] (the masks in pixels), got "
                         f"{tuple(mask_pixels.shape) if isinstance(mask_pixels, Tensor) else mask_pixels!r}")
    return True


def finetune(model: DiffDIS, image: Tensor, mask: Tensor, edge: Tensor | None, config: FinetuneConfig,
             callback: Callable[[int, DiffDIS], dict] | None = None, every: int = 0, *,
             decoder=None, mask_pixels: Tensor | None = None) -> dict:
    """Fine-tune ``model`` in place on latents ``[N, C, h, w]`` of images, masks and edges (Yu et al. 2025, Sec. 3).

    ``one_step``: ``x = x0 + sigma_t eps`` for every row, loss ``|D(x, sigma_t) - x0|^2`` (mean) summed over the
    mask and, with ``config.edge``, the edge rows of the same images in the same batch. ``diffusion``: the EDM
    loss at log-normal noise levels (mask rows; with ``edge`` also edge rows), the multi-step segmenter.

    ``callback(step, model)``, called every ``every`` steps and after the last (``every > 0``; the model in eval
    mode, under ``torch.no_grad``), returns a dict logged as ``info["curve"]`` (e.g. test scores during training);
    its CPU time is not counted in ``cpu_s`` (it is ``info["eval_cpu_s"]``, wall ``info["eval_wall_s"]``).

    ``config.pixel_loss > 0`` adds ``pixel_loss * decoded_mask_loss(decoder.decode_raw(D_mask), mask_pixels)`` on
    the mask rows: ``decoder`` is the :class:`~steerdiff.segment.codec.LatentCodec` (its decoder is frozen during
    the run, its ``requires_grad`` flags restored after) and ``mask_pixels`` ``[N, 1, H, W]`` the masks whose
    latents are ``mask``. The gradient reaches the denoiser through the decoder.

    Returns:
        ``{"steps", "final_loss", "cpu_s"}`` (and ``"curve"`` with a callback).
    """
    if config.objective not in ("one_step", "diffusion"):
        raise ValueError(f"objective must be 'one_step' or 'diffusion', got {config.objective!r}")
    if config.edge and edge is None:
        raise ValueError("edge latents are needed when config.edge is True")
    n = image.shape[0]
    pixel = _check_pixel_loss(config, decoder, mask_pixels, n)
    frozen = [(p, p.requires_grad) for p in decoder.parameters()] if pixel else []
    try:
        for p, _ in frozen:  # only the denoiser trains; the decoder passes the gradient through
            p.requires_grad_(False)
        return _finetune(model, image, mask, edge, config, callback, every, decoder if pixel else None, mask_pixels)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)


def _finetune(model: DiffDIS, image: Tensor, mask: Tensor, edge: Tensor | None, config: FinetuneConfig,
              callback, every: int, decoder, mask_pixels: Tensor | None) -> dict:
    n = image.shape[0]
    # The task embedding learns 10x faster (the official run_train.py's class_embedding group): it starts at zero
    # and must split the mask and edge rows before anything task-specific can be learnt.
    task_params = list(model.net.task_mlp.parameters())
    ids = {id(p) for p in task_params}
    rest = [p for p in model.parameters() if id(p) not in ids]
    opt = torch.optim.Adam([{"params": rest, "lr": config.lr, "scale": 1.0},
                            {"params": task_params, "lr": 10 * config.lr, "scale": 10.0}])
    g = torch.Generator().manual_seed(config.seed + 1)
    model.train()
    t0 = time.process_time()
    loss = torch.zeros(())
    curve, cb_cpu, cb_wall = [], 0.0, 0.0
    for step in range(config.steps):
        for group in opt.param_groups:
            decay = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / config.steps))
            group["lr"] = group["scale"] * config.lr * decay
        idx = torch.randint(0, n, (config.batch_size,), generator=g)
        cond = SegmentCond.for_images(image[idx], edge=config.edge)
        x0 = torch.cat([mask[idx], edge[idx]]) if config.edge else mask[idx]
        noise = torch.randn(x0.shape, generator=g)
        rows = x0.shape[0]
        if config.objective == "one_step":
            sigma = torch.full((rows,), config.sigma_t)
            weight = torch.ones(rows)
        else:
            sigma = sample_sigmas(rows, g)
            weight = edm_weight(sigma, model.sigma_data)
        d = model(x0 + append_dims(sigma, x0.ndim) * noise, sigma, cond)
        per_row = (d - x0).pow(2).flatten(1).mean(1) * weight
        # Sum of the two tasks' mean losses (the official loss1 + loss2).
        loss = per_row.mean() * (2 if config.edge else 1)
        if decoder is not None:  # the mask rows are the first batch_size rows (SegmentCond.for_images)
            raw = decoder.decode_raw(d[:config.batch_size])
            loss = loss + config.pixel_loss * decoded_mask_loss(raw, mask_pixels[idx].to(raw.dtype))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if callback is not None and every > 0 and ((step + 1) % every == 0 or step + 1 == config.steps):
            c0, w0 = time.process_time(), time.time()
            model.eval()
            with torch.no_grad():
                curve.append({"step": step + 1, "loss": float(loss.detach()), **callback(step + 1, model)})
            model.train()
            cb_cpu, cb_wall = cb_cpu + time.process_time() - c0, cb_wall + time.time() - w0
    model.eval()
    info = {"steps": config.steps, "final_loss": float(loss.detach()), "cpu_s": time.process_time() - t0 - cb_cpu}
    if curve:
        info.update(curve=curve, eval_cpu_s=cb_cpu, eval_wall_s=cb_wall)
    return info


@torch.no_grad()
def predict_latents(model: DiffDIS, image: Tensor, *, steps: int = 1, edge: bool = True, seed: int = 0,
                    method: str = "euler", sigma_min: float = 0.02) -> tuple[Tensor, Tensor | None]:
    """Mask (and edge) latents for image latents ``[B, C, h, w]``.

    ``steps=1`` is DiffDIS's one-step inference: ``D(sigma_t eps, sigma_t)`` (Yu et al. 2025, Sec. 3.2), with
    per-image noise (row ``i`` of seed ``seed + i``: the output of an image does not depend on its batch).
    ``steps > 1`` integrates the same denoiser with :func:`steerdiff.sample` over a Karras grid from
    ``sigma_t`` to ``sigma_min`` (the multi-step ablation, and the multi-step diffusion segmenter).

    Returns:
        ``(mask_latents [B, C, h, w], edge_latents or None)``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    b = image.shape[0]
    cond = SegmentCond.for_images(image, edge=edge)
    eps = randn(tuple(image.shape), seeds=seed, dtype=image.dtype, device=image.device)
    if edge:  # the edge row of image i uses its own noise stream (seed shifted past the batch's mask rows)
        eps = torch.cat([eps, randn(tuple(image.shape), seeds=seed + 1_000_003, dtype=image.dtype,
                                    device=image.device)])
    if steps == 1:
        out = model(eps * model.sigma_t, torch.full((eps.shape[0],), model.sigma_t, dtype=image.dtype,
                                                    device=image.device), cond)
    else:
        sigmas = karras(steps, sigma_min, model.sigma_t).to(image.device)
        out = sample(model, eps, sigmas, method=method, cond=cond)
    return (out[:b], out[b:]) if edge else (out, None)
