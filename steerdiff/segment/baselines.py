"""DiffDIS's baselines (docs/methods/diffdis.md, "Baselines"): the same UNet as a plain regressor, and multi-step
diffusion segmentation.

DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity",
Sec. 1 and 4.3) argues against two alternatives: a segmenter without a generative prior, and diffusion segmenters
that sample the mask over many steps and average an ensemble of samples (slow, stochastic). Both are built here
on steerdiff's :class:`~steerdiff.models.unet.UNet`, in pixel space:

* :class:`RegressorSegmenter`: ``logits = F(cat(0, image), c_noise = 0)[:, :1]``, trained from scratch with
  BCE + soft IoU (:func:`segmentation_loss`, the loss of DIS's IS-Net and DiffDIS's mask supervision in pixels).
* :class:`DiffusionSegmenter`: an EDM denoiser of the mask ``x0 = 2 mask - 1`` conditioned on the image by
  concatenation: ``D(x, sigma, image) = c_skip x + c_out F(cat(c_in x, image), c_noise)[:, :1]`` (Karras et al.
  2022 preconditioning, applied to the mask channel only), trained with the EDM loss; :meth:`segment` samples
  ``ensemble`` masks with ``steps`` Euler (or Heun) steps on a Karras schedule and averages ``(x + 1) / 2``.

Both take a UNet whose ``in_channels`` is 4 (mask or zero channel + RGB) and read output channel 0, so the two
baselines have exactly the same network, and :func:`seg_unet` builds it from the same constructor arguments
as any steerdiff UNet (``channels``, ``num_res_blocks``, ...; DiffDIS's own config is for the caller to match).

Interface (what the CLI, benchmark and DiffDIS code build on): ``model.segment(images [B, 3, H, W] in [-1, 1],
**options) -> (probabilities [B, 1, H, W] in [0, 1], None)`` (no edge map); ``num_parameters()``;
:func:`train_regressor` / :func:`train_diffusion_segmenter` ``(BaselineConfig, data=None) -> (model, info)`` with
``info["cpu_seconds"]`` and the loss log; :func:`save_baseline` / :func:`load_baseline` (safetensors +
``config.json``); :func:`time_per_image` (CPU seconds per image).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.noise import randn
from ..core.sampling import sample
from ..core.sigmas import karras
from ..data.dis import DISBatch, generate
from ..io import CheckpointError, atomic_dir, read_json, write_json
from ..io.tensors import load_state_strict, load_tensors, save_tensors
from ..models.precond import edm_scalings
from ..models.unet import UNet
from ..train.edm import edm_weight, sample_sigmas

FORMATS = {"regressor": "steerdiff.segment.regressor/1", "diffusion": "steerdiff.segment.diffseg/1"}
SAMPLE_METHODS = ("euler", "heun")


def seg_unet(size: int = 64, channels: Sequence[int] = (16, 32, 64), num_res_blocks: int = 1, **unet_kwargs) -> UNet:
    """The baselines' backbone: a :class:`UNet` over ``size x size`` with 4 input/output channels (mask or zero
    channel + RGB). ``unet_kwargs`` pass through (``emb_dim``, ``norm_groups``, ``dropout``, ...)."""
    return UNet(img_size=size, in_channels=4, channels=tuple(channels), num_res_blocks=num_res_blocks, **unet_kwargs)


def _check_images(images: Tensor, size: int) -> None:
    if not isinstance(images, Tensor) or images.ndim != 4 or tuple(images.shape[1:]) != (3, size, size):
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a tensor [B, 3, {size}, {size}] in [-1, 1], got {got}")


class RegressorSegmenter(nn.Module):
    """The UNet as a plain image -> mask regressor (no diffusion, no prior): ``logits = F(cat(0, x), 0)[:, :1]``."""

    kind = "regressor"

    def __init__(self, unet: UNet):
        super().__init__()
        if unet.sample_shape[0] != 4:
            raise ValueError(f"unet must have in_channels=4 (see seg_unet), got {unet.sample_shape[0]}")
        self.unet = unet
        self.size = unet.sample_shape[-1]

    def forward(self, images: Tensor) -> Tensor:
        """Mask logits ``[B, 1, H, W]``."""
        _check_images(images, self.size)
        x = torch.cat([torch.zeros_like(images[:, :1]), images], 1)
        return self.unet(x, torch.zeros(images.shape[0], device=images.device, dtype=images.dtype))[:, :1]

    @torch.no_grad()
    def segment(self, images: Tensor, **_: object) -> tuple[Tensor, None]:
        """``(sigmoid(logits), None)``; options of the diffusion segmenter are accepted and ignored."""
        dtype = next(self.parameters()).dtype
        return torch.sigmoid(self(images.to(dtype)).float()).to(images.dtype), None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def config(self) -> dict:
        return {"format": FORMATS[self.kind], "unet": self.unet.config}


class DiffusionSegmenter(nn.Module):
    """Image-conditioned EDM denoiser of the mask in [-1, 1] (module docstring) and its ensemble sampler.

    Args:
        unet: a 4-channel :func:`seg_unet`.
        sigma_data: the mask's standard deviation in [-1, 1] units (EDM's ``sigma_data``; :func:`train_diffusion_
            segmenter` sets it from the training masks, ``2 sqrt(p (1 - p))`` for foreground share ``p``).
    """

    kind = "diffusion"

    def __init__(self, unet: UNet, sigma_data: float = 0.7):
        super().__init__()
        if unet.sample_shape[0] != 4:
            raise ValueError(f"unet must have in_channels=4 (see seg_unet), got {unet.sample_shape[0]}")
        if not sigma_data > 0:
            raise ValueError(f"sigma_data must be > 0, got {sigma_data!r}")
        self.unet, self.sigma_data = unet, float(sigma_data)
        self.size = unet.sample_shape[-1]

    def forward(self, x: Tensor, sigma: Tensor, images: Tensor) -> Tensor:
        """``D(x, sigma | image)``: the denoised mask ``[B, 1, H, W]`` in the dtype of ``x``."""
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).expand(x.shape[0])
        c_skip, c_out, c_in, c_noise = (c.reshape(-1, 1, 1, 1) for c in edm_scalings(sigma, self.sigma_data))
        dtype = next(self.parameters()).dtype
        inp = torch.cat([(c_in * x).to(dtype), images.to(dtype)], 1)
        out = self.unet(inp, c_noise.flatten().to(dtype))[:, :1].to(x.dtype)
        return c_skip * x + c_out * out

    @torch.no_grad()
    def segment(self, images: Tensor, *, steps: int = 10, ensemble: int = 5, method: str = "euler", seed: int = 0,
                sigma_min: float = 0.002, sigma_max: float = 80.0) -> tuple[Tensor, None]:
        """Average of ``ensemble`` sampled masks, ``((x + 1) / 2).clamp(0, 1)`` each, and None (no edges).

        NFE per image = ``ensemble * steps`` (Euler) or ``ensemble * (2 steps - 1)`` (Heun). Sample ``k`` of image
        ``i`` starts from the noise of seed ``seed + k B + i``, so the draws do not depend on how images are batched
        within an ensemble member.
        """
        _check_images(images, self.size)
        if method not in SAMPLE_METHODS:
            raise ValueError(f"method must be one of {SAMPLE_METHODS}, got {method!r}")
        for name, v in (("steps", steps), ("ensemble", ensemble)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        b = images.shape[0]
        rep = images.repeat(ensemble, 1, 1, 1)
        noise = randn((ensemble * b, 1, self.size, self.size), seeds=seed, dtype=images.dtype,
                      device=str(images.device))

        def denoiser(x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
            return self(x, sigma, rep)

        sigmas = karras(steps, sigma_min, sigma_max)
        x = sample(denoiser, noise, sigmas, method=method)
        probs = ((x + 1) / 2).clamp(0, 1).reshape(ensemble, b, 1, self.size, self.size).mean(0)
        return probs.to(images.dtype), None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def config(self) -> dict:
        return {"format": FORMATS[self.kind], "unet": self.unet.config, "sigma_data": self.sigma_data}


def segmentation_loss(logits: Tensor, mask: Tensor) -> Tensor:
    """BCE-with-logits + soft IoU loss ``1 - (sum p m + 1) / (sum (p + m - p m) + 1)`` per image, batch mean."""
    bce = F.binary_cross_entropy_with_logits(logits, mask)
    p = torch.sigmoid(logits).flatten(1)
    m = mask.flatten(1)
    inter = (p * m).sum(1)
    iou = (inter + 1) / ((p + m - p * m).sum(1) + 1)
    return bce + (1 - iou).mean()


@dataclass
class BaselineConfig:
    """Training recipe shared by both baselines (small CPU defaults; a few CPU-minutes each at 64x64)."""

    size: int = 64  # image side
    n_train: int = 2000  # procedural training images (data.dis.generate, part "train")
    data_seed: int = 0  # seed of the training images
    steps: int = 300  # optimiser steps
    batch: int = 16
    lr: float = 2e-3  # Adam, cosine-decayed to 0
    seed: int = 0  # init, batches, flips, noise levels
    channels: Sequence[int] = field(default_factory=lambda: (16, 32, 64))
    num_res_blocks: int = 1
    log_every: int = 50
    device: str = "cpu"  # where the model trains (batches and noise are drawn on the CPU and moved there)

    def __post_init__(self) -> None:
        for name in ("size", "n_train", "steps", "batch", "num_res_blocks", "log_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        self.channels = tuple(int(c) for c in self.channels)


def _batches(data: DISBatch, cfg: BaselineConfig, gen: torch.Generator):
    n = data.image.shape[0]
    for _ in range(cfg.steps):
        idx = torch.randint(0, n, (cfg.batch,), generator=gen)
        x, m = data.image[idx], data.mask[idx]
        flip = torch.rand(cfg.batch, generator=gen) < 0.5  # horizontal flips: the data are mirror-symmetric
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        m = torch.where(flip[:, None, None, None], m.flip(-1), m)
        yield x.to(cfg.device, non_blocking=True), m.to(cfg.device, non_blocking=True)


def _train(model: nn.Module, loss_fn: Callable[[Tensor, Tensor, torch.Generator], Tensor], cfg: BaselineConfig,
           data: DISBatch, log: Callable[[str], None] | None) -> dict:
    gen = torch.Generator().manual_seed(cfg.seed)
    model.to(cfg.device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps)
    losses: list[float] = []
    t0, w0 = time.process_time(), time.perf_counter()
    model.train()
    running = 0.0
    for step, (x, m) in enumerate(_batches(data, cfg, gen), 1):
        loss = loss_fn(x, m, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running += loss.detach()
        if step % cfg.log_every == 0 or step == cfg.steps:  # host read only at log steps
            k = cfg.log_every if step % cfg.log_every == 0 else step % cfg.log_every
            losses.append(float(running) / k)
            running = 0.0
            if log is not None:
                log(f"step {step}/{cfg.steps} loss {losses[-1]:.4f}")
    model.eval()
    return {"cpu_seconds": time.process_time() - t0, "wall_seconds": time.perf_counter() - w0, "losses": losses,
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}}


def _data(cfg: BaselineConfig, data: DISBatch | None) -> DISBatch:
    data = data if data is not None else generate(cfg.n_train, size=cfg.size, seed=cfg.data_seed, part="train")
    if tuple(data.image.shape[1:]) != (3, cfg.size, cfg.size):
        raise ValueError(f"data images must be [N, 3, {cfg.size}, {cfg.size}] (cfg.size), got "
                         f"{tuple(data.image.shape)}")
    return data


def train_regressor(cfg: BaselineConfig | None = None, data: DISBatch | None = None,
                    log: Callable[[str], None] | None = None) -> tuple[RegressorSegmenter, dict]:
    """Train :class:`RegressorSegmenter` from scratch with :func:`segmentation_loss` (``data`` defaults to
    ``generate(cfg.n_train, cfg.size, cfg.data_seed)``). Returns the model (eval mode) and the training info."""
    cfg = cfg or BaselineConfig()
    data = _data(cfg, data)
    torch.manual_seed(cfg.seed)
    model = RegressorSegmenter(seg_unet(cfg.size, cfg.channels, cfg.num_res_blocks))
    info = _train(model, lambda x, m, g: segmentation_loss(model(x), m), cfg, data, log)
    return model, info


def train_diffusion_segmenter(cfg: BaselineConfig | None = None, data: DISBatch | None = None,
                              log: Callable[[str], None] | None = None) -> tuple[DiffusionSegmenter, dict]:
    """Train :class:`DiffusionSegmenter` with the EDM loss (``ln sigma ~ N(-1.2, 1.2^2)``, weight
    ``(sigma^2 + sd^2) / (sigma sd)^2``) on ``x0 = 2 mask - 1`` given the image."""
    cfg = cfg or BaselineConfig()
    data = _data(cfg, data)
    p = float(data.mask.mean())
    sigma_data = max(2 * (p * (1 - p)) ** 0.5, 0.05)
    torch.manual_seed(cfg.seed)
    model = DiffusionSegmenter(seg_unet(cfg.size, cfg.channels, cfg.num_res_blocks), sigma_data)

    def loss_fn(x: Tensor, m: Tensor, gen: torch.Generator) -> Tensor:
        x0 = 2 * m - 1
        sigma = sample_sigmas(x0.shape[0], gen, device=x0.device, dtype=x0.dtype)
        eps = torch.randn(x0.shape, generator=gen, dtype=x0.dtype).to(x0.device, non_blocking=True)
        noisy = x0 + sigma.reshape(-1, 1, 1, 1) * eps
        per = (model(noisy, sigma, x) - x0).square().flatten(1).mean(1)
        return (edm_weight(sigma, sigma_data) * per).mean()

    info = _train(model, loss_fn, cfg, data, log)
    info["sigma_data"] = sigma_data
    return model, info


def save_baseline(model: RegressorSegmenter | DiffusionSegmenter, directory: str | Path,
                  metadata: dict | None = None) -> Path:
    """Write ``config.json`` (format, UNet config, ``metadata``: training time, recipe command, ...) and
    ``model.safetensors`` atomically."""
    if not isinstance(model, (RegressorSegmenter, DiffusionSegmenter)):
        raise ValueError(f"model must be a RegressorSegmenter or DiffusionSegmenter, got {type(model).__name__}")
    directory = Path(directory)
    with atomic_dir(directory) as tmp:
        save_tensors(dict(model.state_dict()), tmp / "model.safetensors")
        write_json(tmp / "config.json", {**model.config(), "metadata": metadata or {}})
    return directory


def load_baseline(directory: str | Path, device: str | torch.device = "cpu") -> RegressorSegmenter | DiffusionSegmenter:
    """Read a directory written by :func:`save_baseline` (safetensors only), in eval mode."""
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{directory}: no config.json (not a segmentation baseline directory)")
    cfg = read_json(cfg_path)
    fmt = cfg.get("format")
    try:
        unet = UNet(**cfg["unet"])
        if fmt == FORMATS["regressor"]:
            model: RegressorSegmenter | DiffusionSegmenter = RegressorSegmenter(unet)
        elif fmt == FORMATS["diffusion"]:
            model = DiffusionSegmenter(unet, float(cfg["sigma_data"]))
        else:
            raise CheckpointError(f"{cfg_path}: format {fmt!r} is not one of {sorted(FORMATS.values())}")
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{cfg_path}: corrupt config ({err})") from err
    load_state_strict(model, load_tensors(directory / "model.safetensors"), str(directory / "model.safetensors"))
    return model.to(device).eval()


def time_per_image(fn: Callable[[Tensor], object], images: Tensor, repeats: int = 1) -> float:
    """CPU seconds per image of ``fn(images)`` (process time: other processes' load does not count; on a GPU,
    synchronise inside ``fn``)."""
    t0 = time.process_time()
    for _ in range(repeats):
        fn(images)
    return (time.process_time() - t0) / (repeats * images.shape[0])
