"""Build the shipped shapes text-to-image pipeline from a recipe (configs/shapes_pipeline.json).

docs/methods/pipelines.md, "The shipped pipeline: recipe". The parts are diffusers' and transformers' own classes, so
the result is an ordinary ``save_pretrained`` directory that ``diffusers.DiffusionPipeline.from_pretrained`` and
``sd.pipelines.load`` read:

* data: the procedural coloured shapes (``steerdiff.data.shapes``, 12x12) drawn from one split's training pairs,
  enlarged 2x by pixel repetition to 24x24 and padded with noisy grey background to the recipe's resolution (32);
  each image gets the caption "a <colour> <shape> on a grey background".
* tokenizer: CLIP byte-level BPE files (vocab.json + merges.txt) written here, with merges learned on the caption
  words (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units", BPE learning), so every
  caption word is one token; other text still tokenizes byte by byte.
* text encoder: a frozen ``CLIPTextModel`` from a small config with random weights (the UNet learns to read it).
* VAE: an ``AutoencoderKL`` trained on the images with an L2 reconstruction loss plus a small KL term (Kingma and
  Welling 2014, "Auto-Encoding Variational Bayes"; Rombach et al. 2022, "High-Resolution Image Synthesis with Latent
  Diffusion Models", Section 3.1, KL-regularised autoencoder); its ``scaling_factor`` is set to 1 / std of the
  training latents (Rombach et al. 2022, Appendix G).
* UNet: a ``UNet2DConditionModel`` trained on the VAE latents with the eps objective of Ho et al. 2020, "Denoising
  Diffusion Probabilistic Models", Algorithm 1, on the scheduler's discrete noise levels, with the caption replaced
  by the empty prompt with probability ``p_uncond`` (Ho and Salimans 2022, "Classifier-Free Diffusion Guidance",
  Algorithm 1), so classifier-free guidance works.
* scheduler: an ``EulerDiscreteScheduler`` config on the training levels (see :func:`make_scheduler`).

Training checkpoints atomically (safetensors + JSON, ``steerdiff.train.checkpoint``) under ``<work>/<part>/`` and
resumes from the newest one; a resumed run gives the same weights, bit for bit, as an uninterrupted one (all
randomness comes from one seeded generator per part whose state is checkpointed).

Usage::

    OMP_NUM_THREADS=2 python scripts/make_pipeline.py --out runs/shapes_pipeline/pipeline
    python scripts/make_pipeline.py --set vae.steps=4 --set unet.steps=4 --out /tmp/p   # overrides, dotted keys
    python scripts/make_pipeline.py --measure 5   # seconds per step of each part at the recipe's batch sizes
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer  # noqa: E402
from steerdiff.data import shapes  # noqa: E402
from steerdiff.io import atomic_dir, load_state_strict, write_json  # noqa: E402
from steerdiff.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402
from steerdiff.train.ema import EMA  # noqa: E402

DEFAULT_RECIPE = ROOT / "configs" / "shapes_pipeline.json"
BACKGROUND_WORDS = ("a", "on", "grey", "background")
PARTS = ("vae", "unet")


caption = shapes.caption  # "a <colour> <shape> on a grey background"


def all_captions() -> list[tuple[int, int, str]]:
    """Every (shape, colour, caption), shape-major."""
    return [(s, c, caption(s, c)) for s in range(len(shapes.SHAPES)) for c in range(len(shapes.COLOURS))]


def load_recipe(path: str | Path = DEFAULT_RECIPE, overrides: list[str] | None = None) -> dict:
    """Read a recipe and apply ``key.sub=value`` overrides (values parsed as JSON, else kept as strings)."""
    recipe = json.loads(Path(path).read_text())
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"--set expects key.sub=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = recipe
        *parents, leaf = key.split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                raise ValueError(f"--set {key}: {p!r} is not a section of the recipe")
            node = node[p]
        if leaf not in node:
            raise ValueError(f"--set {key}: the recipe has no key {leaf!r} there (known: {sorted(node)})")
        node[leaf] = value
    return recipe


# ----------------------------------------------------------------------------------------------------------- data
def make_images(data: dict, resolution: int) -> tuple[Tensor, Tensor]:
    """Training images ``[n, 3, R, R]`` in [-1, 1] and labels ``[n, 2]`` (shape, colour) of the recipe's split: the
    12x12 shapes on the pipeline's canvas (:func:`steerdiff.data.shapes.to_canvas`, border noise from a generator
    seeded ``data.seed + 1``)."""
    scale = int(data.get("scale", 2))
    shapes._canvas_pad(resolution, scale)  # the size check, before drawing the images
    images, labels = shapes.generate(int(data["n"]), split=data["split"], part="train", seed=int(data["seed"]))
    g = torch.Generator().manual_seed(int(data["seed"]) + 1)
    return shapes.to_canvas(images, resolution, scale, generator=g), labels


# ------------------------------------------------------------------------------------------------------ tokenizer
write_tokenizer_files = write_clip_tokenizer  # the builder's name for it


def caption_words() -> list[str]:
    return sorted({w for _, _, text in all_captions() for w in text.split()})


def make_tokenizer(directory: Path, max_tokens: int):
    """The CLIP tokenizer over the written files; checks that every caption word is a single token."""
    import transformers

    tok = transformers.CLIPTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"),
                                     model_max_length=max_tokens)
    for w in caption_words():
        ids = tok(w, add_special_tokens=False).input_ids
        if len(ids) != 1:
            raise RuntimeError(f"caption word {w!r} tokenizes into {len(ids)} tokens; the merges are wrong")
    longest = max(len(tok(text).input_ids) for _, _, text in all_captions())
    if longest > max_tokens:
        raise ValueError(f"text_encoder.max_tokens must be >= {longest} (the longest caption with BOS/EOS); "
                         f"got {max_tokens}")
    return tok


# ----------------------------------------------------------------------------------------------------------- parts
def make_text_encoder(tok, cfg: dict, seed: int):
    import transformers

    torch.manual_seed(seed)
    config = transformers.CLIPTextConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        hidden_size=cfg["hidden"], intermediate_size=2 * cfg["hidden"], num_attention_heads=cfg["heads"],
        num_hidden_layers=cfg["layers"], vocab_size=len(tok), max_position_embeddings=cfg["max_tokens"],
        projection_dim=cfg["hidden"])
    return transformers.CLIPTextModel(config).eval().requires_grad_(False)


def make_vae(cfg: dict, resolution: int, seed: int):
    import diffusers

    torch.manual_seed(seed)
    n = len(cfg["block_out_channels"])
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=tuple(cfg["block_out_channels"]),
        down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
        layers_per_block=cfg["layers_per_block"], latent_channels=cfg["latent_channels"],
        norm_num_groups=cfg["norm_num_groups"], sample_size=resolution, scaling_factor=1.0)


def make_unet(cfg: dict, latent_size: int, latent_channels: int, cross_dim: int, seed: int):
    import diffusers

    torch.manual_seed(seed)
    n = len(cfg["block_out_channels"])
    return diffusers.UNet2DConditionModel(
        sample_size=latent_size, in_channels=latent_channels, out_channels=latent_channels,
        block_out_channels=tuple(cfg["block_out_channels"]), layers_per_block=cfg["layers_per_block"],
        down_block_types=("CrossAttnDownBlock2D",) * (n - 1) + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n - 1),
        cross_attention_dim=cross_dim, attention_head_dim=cfg["attention_head_dim"],
        norm_num_groups=cfg["norm_num_groups"])


def make_scheduler(cfg: dict):
    """Euler (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based Generative Models", Algorithm 1
    without churn) on the DDPM training levels, with "trailing" timesteps by default: the first step is then the last
    training level even with few steps (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample Steps are
    Flawed", Section 3.3). Not DDIM: diffusers' DDIM with trailing spacing steps to ``t - 1000 // n``, which is not
    its next listed timestep when n does not divide 1000."""
    import diffusers

    return diffusers.EulerDiscreteScheduler(
        num_train_timesteps=cfg["num_train_timesteps"], beta_start=cfg["beta_start"], beta_end=cfg["beta_end"],
        beta_schedule=cfg["beta_schedule"], prediction_type="epsilon",
        timestep_spacing=cfg.get("timestep_spacing", "trailing"), steps_offset=1)


# -------------------------------------------------------------------------------------------------------- training
def train_part(name: str, model: torch.nn.Module, loss_fn, cfg: dict, work: Path, seed: int,
               halt_after: int | None = None, log=print) -> bool:
    """Train ``model`` for ``cfg["steps"]`` AdamW steps, resuming from and checkpointing to ``work/name``.

    With ``cfg["ema_decay"] > 0`` the model ends with the EMA of its weights (``steerdiff.train.ema.EMA``, with
    its warm-up ramp), which is what ships.

    ``loss_fn(step, generator)`` returns the loss of one batch, drawing all its randomness from ``generator``.
    Returns False when stopped early by ``halt_after`` (total steps done, after a checkpoint), else True.
    """
    run = work / name
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"],
                            weight_decay=cfg.get("weight_decay", 0.0))
    g = torch.Generator().manual_seed(seed)
    step, history = 0, []
    decay = float(cfg.get("ema_decay", 0.0))
    ema = EMA(model, decay) if decay > 0 else None
    ckpt = latest_checkpoint(run)
    if ckpt is not None:
        saved = load_checkpoint(ckpt)
        load_state_strict(model, saved["model"], str(ckpt))
        opt.load_state_dict(saved["optimizer"])
        g.set_state(saved["rng"]["generator"])
        step, history = saved["state"]["step"], saved["state"]["history"]
        if ema is not None:
            ema.load_state_dict(saved["ema"], step)
        log(f"[{name}] resumed from {ckpt} at step {step}")
    steps, every = int(cfg["steps"]), int(cfg["checkpoint_every"])
    model.train()
    t0, done_here = time.perf_counter(), 0
    while step < steps:
        lr = cfg["lr"] * min(1.0, (step + 1) / max(int(cfg.get("warmup_steps", 0)), 1))
        for group in opt.param_groups:
            group["lr"] = lr
        loss = loss_fn(step, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.get("grad_clip", 1.0))
        opt.step()
        if ema is not None:
            ema.update(model)
        step += 1
        done_here += 1
        if step % int(cfg.get("log_every", 50)) == 0 or step == steps:
            rate = (time.perf_counter() - t0) / done_here
            history.append({"step": step, "loss": loss.item()})
            log(f"[{name}] step {step}/{steps} loss {loss.item():.4f} {rate:.3f} s/step "
                f"eta {rate * (steps - step) / 60:.1f} min")
        if step % every == 0 or step == steps:
            shadow = {} if ema is None else ema.state_dict()
            save_checkpoint(run, step, model, shadow, opt, {"generator": g.get_state()},
                            {"part": name, "history": history, "config": cfg})
            if halt_after is not None and step >= halt_after and step < steps:
                log(f"[{name}] halted after step {step} (checkpointed)")
                return False
    if ema is not None:
        ema.copy_to(model)
    model.eval()
    return True


def _posterior(vae, x: Tensor) -> tuple[Tensor, Tensor]:
    moments = vae.quant_conv(vae.encoder(x)) if vae.quant_conv is not None else vae.encoder(x)
    mean, logvar = moments.chunk(2, dim=1)
    return mean, logvar.clamp(-30.0, 20.0)


def vae_loss_fn(vae, images: Tensor, cfg: dict):
    """L2 reconstruction of a sampled latent plus ``kl_weight`` x KL(q(z|x) || N(0, I)) per latent element."""
    def loss(step: int, g: Tensor) -> Tensor:
        idx = torch.randint(len(images), (cfg["batch_size"],), generator=g)
        x = images[idx]
        mean, logvar = _posterior(vae, x)
        z = mean + (0.5 * logvar).exp() * torch.randn(mean.shape, generator=g)
        rec = vae.decode(z).sample
        kl = 0.5 * (mean.square() + logvar.exp() - 1.0 - logvar).mean()
        return F.mse_loss(rec, x) + cfg["kl_weight"] * kl
    return loss


def unet_loss_fn(unet, scheduler, mean: Tensor, std: Tensor, scale: float, labels: Tensor, text: Tensor,
                 null: Tensor, cfg: dict):
    """eps-prediction loss at uniform discrete timesteps; caption -> empty prompt with probability p_uncond."""
    alphas = scheduler.alphas_cumprod.float()

    def loss(step: int, g: Tensor) -> Tensor:
        b = cfg["batch_size"]
        idx = torch.randint(len(mean), (b,), generator=g)
        z0 = (mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=g)) * scale
        t = torch.randint(len(alphas), (b,), generator=g)
        eps = torch.randn(z0.shape, generator=g)
        a = alphas[t].view(-1, 1, 1, 1)
        zt = a.sqrt() * z0 + (1 - a).sqrt() * eps
        drop = torch.rand(b, generator=g) < cfg["p_uncond"]
        cond = torch.where(drop.view(-1, 1, 1), null.expand(b, -1, -1), text[labels[idx, 0] * 4 + labels[idx, 1]])
        return F.mse_loss(unet(zt, t, encoder_hidden_states=cond).sample, eps)
    return loss


# ---------------------------------------------------------------------------------------------------------- build
def build(recipe: dict, out: str | Path, work: str | Path, halt_after: dict[str, int] | None = None,
          log=print) -> Path | None:
    """Build the pipeline directory ``out`` from ``recipe``; intermediate checkpoints go under ``work``.

    ``halt_after`` maps a part ("vae", "unet") to a step count after which to stop (after its checkpoint), to
    simulate an interruption; the call then returns None, and calling again resumes. Otherwise returns ``out``.
    """
    import diffusers

    out, work = Path(out), Path(work)
    halt_after = halt_after or {}
    unknown = set(halt_after) - set(PARTS)
    if unknown:
        raise ValueError(f"halt_after keys must be among {PARTS}; got {sorted(unknown)}")
    seed, res = int(recipe["seed"]), int(recipe["resolution"])
    torch.manual_seed(seed)
    images, labels = make_images(recipe["data"], res)
    log(f"data: {len(images)} images {tuple(images.shape[1:])}, split {recipe['data']['split']!r}")

    tok_dir = work / "tokenizer_files"
    write_tokenizer_files(tok_dir, caption_words())
    tcfg = recipe["text_encoder"]
    tok = make_tokenizer(tok_dir, int(tcfg["max_tokens"]))
    text_encoder = make_text_encoder(tok, tcfg, seed + 1)

    vcfg, ucfg = recipe["vae"], recipe["unet"]
    vae = make_vae(vcfg, res, seed + 2)
    if not train_part("vae", vae, vae_loss_fn(vae, images, vcfg), vcfg, work, seed + 3, halt_after.get("vae"), log):
        return None
    with torch.no_grad():
        parts = [_posterior(vae, chunk) for chunk in images.split(256)]
    mean = torch.cat([m for m, _ in parts])
    std = torch.cat([(0.5 * lv).exp() for _, lv in parts])
    scale = float(1.0 / (mean.square().mean() + std.square().mean() - mean.mean().square()).sqrt())
    vae.register_to_config(scaling_factor=scale)
    log(f"vae: latents {tuple(mean.shape[1:])}, scaling_factor {scale:.4f}")

    with torch.no_grad():
        prompts = [text for _, _, text in all_captions()] + [""]
        ids = tok(prompts, padding="max_length", max_length=tcfg["max_tokens"], truncation=True,
                  return_tensors="pt").input_ids
        hidden = text_encoder(ids).last_hidden_state
    text, null = hidden[:-1], hidden[-1:]
    scheduler = make_scheduler(recipe["scheduler"])
    unet = make_unet(ucfg, mean.shape[-1], mean.shape[1], tcfg["hidden"], seed + 4)
    loss = unet_loss_fn(unet, scheduler, mean, std, scale, labels, text, null, ucfg)
    if not train_part("unet", unet, loss, ucfg, work, seed + 5, halt_after.get("unet"), log):
        return None

    pipe = diffusers.StableDiffusionPipeline(
        vae=vae.eval(), text_encoder=text_encoder, tokenizer=tok, unet=unet.eval(), scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    with atomic_dir(out) as tmp:
        pipe.save_pretrained(str(tmp), safe_serialization=True)
    write_json(work / "recipe_used.json", recipe)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"wrote {out} ({size / 2**20:.2f} MiB)")
    return out


def measure(recipe: dict, steps: int, log=print) -> dict[str, float]:
    """Seconds per training step of each part at the recipe's batch sizes (after one warm-up step)."""
    res = int(recipe["resolution"])
    data = {**recipe["data"], "n": max(recipe["vae"]["batch_size"], recipe["unet"]["batch_size"]) * 4}
    images, labels = make_images(data, res)
    vcfg, ucfg, tcfg = recipe["vae"], recipe["unet"], recipe["text_encoder"]
    vae = make_vae(vcfg, res, 0)
    with torch.no_grad():
        mean, logvar = _posterior(vae, images[:1])
    hidden = torch.zeros(16, tcfg["max_tokens"], tcfg["hidden"])
    unet = make_unet(ucfg, mean.shape[-1], mean.shape[1], tcfg["hidden"], 0)
    sched = make_scheduler(recipe["scheduler"])
    m = torch.zeros(len(images), *mean.shape[1:])
    fns = {"vae": (vae, vae_loss_fn(vae, images, vcfg)),
           "unet": (unet, unet_loss_fn(unet, sched, m, m + 1, 1.0, labels, hidden, hidden[:1], ucfg))}
    result = {}
    for name, (model, fn) in fns.items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(0)
        for i in range(steps + 1):
            if i == 1:
                t0 = time.perf_counter()
            loss = fn(i, g)
            opt.zero_grad()
            loss.backward()
            opt.step()
        result[name] = (time.perf_counter() - t0) / steps
        n_params = sum(p.numel() for p in model.parameters())
        log(f"{name}: {result[name]:.3f} s/step at batch {recipe[name]['batch_size']}, {n_params / 1e6:.2f} M params; "
            f"planned {recipe[name]['steps']} steps -> {result[name] * recipe[name]['steps'] / 60:.1f} min")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(DEFAULT_RECIPE), help="recipe JSON")
    ap.add_argument("--out", help="pipeline directory to write (default: <recipe out_dir>/pipeline)")
    ap.add_argument("--work", help="checkpoint directory (default: <recipe out_dir>/work)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe value")
    ap.add_argument("--halt-after", action="append", default=[], metavar="PART=STEPS",
                    help="stop a part after this many steps (after its checkpoint); run again to resume")
    ap.add_argument("--measure", type=int, metavar="STEPS", help="only time STEPS training steps of each part")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.config, args.set)
    if args.measure:
        measure(recipe, args.measure)
        return 0
    halt = {}
    for item in args.halt_after:
        part, _, n = item.partition("=")
        if part not in PARTS or not n.isdigit():
            raise SystemExit(f"--halt-after expects PART=STEPS with PART in {PARTS}; got {item!r}")
        halt[part] = int(n)
    base = ROOT / recipe["out_dir"]
    done = build(copy.deepcopy(recipe), args.out or base / "pipeline", args.work or base / "work", halt)
    return 0 if done is not None else 3


if __name__ == "__main__":
    raise SystemExit(main())
