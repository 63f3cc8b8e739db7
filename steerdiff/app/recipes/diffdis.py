"""The shipped DiffDIS segmenter (``steerdiff/assets/diffdis``; docs/methods/diffdis.md, "Inference and the shipped
model"): how it is made, stage by stage.

    python -m steerdiff.app.recipes.diffdis --out runs/diffdis      # scripts/make_assets.py --only diffdis installs it

1. Data: :func:`steerdiff.data.dis.generate` (``n_train`` procedural 64x64 images with thin structures, seed 0).
2. Codec: the shipped shapes pipeline's VAE, fine-tuned whole (encoder and decoder) on the training images and
   their maps for ``vae_steps`` (it was trained on grey-background shapes and reconstructs these images worse
   than a flat grey image: the reconstruction error before and after is recorded), then it encodes images, masks
   and edge maps.
3. Mask decoder: the VAE decoder fine-tuned further on mask and edge latents (the ceiling, decoded ground-truth
   mask latents, is recorded before and after).
4. Prior: an unconditional latent UNet pre-trained with the EDM objective on the image latents (DiffDIS's Stable
   Diffusion, at this machine's scale).
5. DiffDIS fine-tuning (Yu et al., ICLR 2025, Sec. 3): one step at ``sigma_t``, mask and edge rows in one batch,
   the prior's input kernel on the image latent and the noise embedding told ``sigma_embed`` (the
   ``FinetuneConfig`` defaults; docs/methods/diffdis.md, "Diagnosis: what limited the one-step model")
   (``--pixel-loss W`` adds the decoded-mask loss, :func:`steerdiff.segment.diffdis.decoded_mask_loss`; off in the
   recipe).
6. The light mask decoder (:func:`steerdiff.segment.decoders.train_light_decoder`; docs/methods/diffdis.md, "The
   light mask decoder"), on the codec's latents of the training masks, written to ``<out>/light_decoder/``. It
   depends on the codec alone, so ``--light-decoder DIR`` makes it for the codec of an existing segmenter folder,
   into ``<out>/light_decoder/`` (the shipped one's was made so from ``steerdiff/assets/diffdis`` and copied
   there).
7. The light image encoder (:func:`steerdiff.segment.encoders.train_light_encoder`; docs/methods/diffdis.md, "The
   light image encoder"), distilled from the codec's VAE encoder on the training images, written to
   ``<out>/light_encoder/``; ``--light-encoder DIR`` makes it alone for an existing segmenter folder, as stage 6.

Stage 1 (codec and prior) is written to ``<out>_base`` first (the untrained DiffDIS on the prior, which is the prior
exactly, plus ``prior/``), so that ``benchmarks/diffdis.py --base`` can start from it.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...data import dis
from ...models.io import load as load_model
from ...segment import (
    FinetuneConfig,
    LatentCodec,
    Segmenter,
    build,
    finetune,
    finetune_codec,
    finetune_mask_decoder,
    load_light_decoder,
    load_light_encoder,
    load_segmenter,
    pretrain_prior,
    read_metadata,
    reconstruction_mse,
    save_light_decoder,
    save_light_encoder,
    save_segmenter,
    train_light_decoder,
    train_light_encoder,
)
from ...segment.encoders import distillation_error, vae_targets

ASSET = "diffdis"
PIPELINE_VAE = Path(__file__).resolve().parents[2] / "assets" / "shapes_pipeline" / "vae"
RECIPE = {"n_train": 1024, "size": 64, "vae_steps": 100, "vae_batch_size": 8, "decoder_steps": 100,
          "prior_steps": 1200, "finetune_steps": 300, "batch_size": 16, "seed": 0}
COMMAND = "python scripts/make_assets.py --only diffdis  (python -m steerdiff.app.recipes.diffdis --out runs/diffdis)"
LIGHT_RECIPE = {"channels": [48, 24, 16], "steps": 600, "batch_size": 32, "lr": 2e-3, "distill": 1.0,
                "n_distill": 1024, "noise": 0.3, "seed": 0}
"""The light mask decoder's training (:func:`steerdiff.segment.decoders.train_light_decoder` arguments)."""
LIGHT_COMMAND = ("python -m steerdiff.app.recipes.diffdis --light-decoder steerdiff/assets/diffdis --out runs/light "
                 "(then runs/light/light_decoder copied to steerdiff/assets/diffdis/light_decoder)")
ENCODER_RECIPE = {"channels": [16, 32, 64], "steps": 3000, "batch_size": 32, "lr": 2e-3, "flip": True,
                  "context": True, "seed": 0}
"""The light image encoder's training (:func:`steerdiff.segment.encoders.train_light_encoder` arguments)."""
ENCODER_COMMAND = ("python -m steerdiff.app.recipes.diffdis --light-encoder steerdiff/assets/diffdis --out "
                   "runs/light_enc (then runs/light_enc/light_encoder copied to "
                   "steerdiff/assets/diffdis/light_encoder)")


def shipped_dir() -> Path:
    """``steerdiff/assets/diffdis``."""
    return Path(__file__).resolve().parents[2] / "assets" / ASSET


def load_shipped(decoder: str = "vae", encoder: str = "vae") -> Segmenter:
    """The shipped segmenter with the mask decoder ``decoder`` (``steerdiff.segment.MASK_DECODERS``) and the image
    encoder ``encoder`` (``steerdiff.segment.IMAGE_ENCODERS``) (FileNotFoundError when it has not been made)."""
    d = shipped_dir()
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{d}: the DiffDIS segmenter is not there; make it with: {COMMAND}")
    return load_segmenter(d, decoder=decoder, encoder=encoder)


def pipeline_codec() -> LatentCodec:
    """The codec of the shipped shapes pipeline's VAE, decoder not yet fine-tuned."""
    from diffusers import AutoencoderKL

    return LatentCodec(AutoencoderKL.from_pretrained(PIPELINE_VAE).eval()).eval()


@torch.no_grad()
def encode_all(codec: LatentCodec, batch: dis.DISBatch, chunk: int = 128) -> dict[str, torch.Tensor]:
    """Latents of a data batch's images, masks and edges (``{"image", "mask", "edge"}``)."""
    out = {"image": [], "mask": [], "edge": []}
    for i in range(0, batch.image.shape[0], chunk):
        out["image"].append(codec.encode(batch.image[i:i + chunk]))
        out["mask"].append(codec.encode_map(batch.mask[i:i + chunk]))
        out["edge"].append(codec.encode_map(batch.edge[i:i + chunk]))
    return {k: torch.cat(v) for k, v in out.items()}


def _max_f(pred: torch.Tensor, gt: torch.Tensor) -> float:
    """Mean over images of the max over 255 thresholds of F_beta (beta^2 = 0.3), the DIS5K max-F (Qin et al. 2022)."""
    thr = torch.linspace(0, 1, 257)[1:-1]
    b = (pred.flatten(1)[:, None, :] >= thr[None, :, None]).float()
    g = gt.flatten(1)[:, None, :]
    tp = (b * g).sum(-1)
    prec = tp / b.sum(-1).clamp(min=1)
    rec = tp / g.sum(-1).clamp(min=1)
    f = 1.3 * prec * rec / (0.3 * prec + rec).clamp(min=1e-8)
    return float(f.mean(0).max())


@torch.no_grad()
def ceiling(codec: LatentCodec, maps: torch.Tensor) -> dict:
    """The decoded ground-truth latents' max-F and MAE: what no latent segmenter over this codec can beat."""
    dec = codec.decode_map(codec.encode_map(maps))
    return {"max_f": _max_f(dec, maps), "mae": float((dec - maps).abs().mean())}


def train_base(recipe: dict, out: Path) -> tuple[LatentCodec, object, dict, dict]:
    """Stages 1-4; writes ``out`` (the base: codec + the prior as an untrained DiffDIS, and ``out/prior``)."""
    t0, w0 = time.process_time(), time.time()
    data = dis.generate(recipe["n_train"], recipe["size"], seed=recipe["seed"])
    test = dis.generate(128, recipe["size"], seed=recipe["seed"], part="test")
    codec = pipeline_codec()
    log = {"image_variance": float(test.image.var()), "recon_mse_before": reconstruction_mse(codec, test.image),
           "ceiling_before": {"mask": ceiling(codec, test.mask), "edge": ceiling(codec, test.edge)}}
    if recipe.get("vae_steps", 0) > 0:  # a recipe without the key is the earlier one (the encoder as shipped)
        log["vae_finetune"] = finetune_codec(codec, data.image, torch.cat([data.mask, data.edge]),
                                             steps=recipe["vae_steps"], batch_size=recipe["vae_batch_size"],
                                             seed=recipe["seed"])
        log["recon_mse_after"] = reconstruction_mse(codec, test.image)
        log["ceiling_vae"] = {"mask": ceiling(codec, test.mask), "edge": ceiling(codec, test.edge)}
    print({k: log[k] for k in log if k.startswith(("recon", "image", "ceiling", "vae_"))}, flush=True)
    c0 = time.process_time()
    lat = encode_all(codec, data)
    log["encode_cpu_s"] = time.process_time() - c0
    log["mask_decoder"] = finetune_mask_decoder(codec, torch.cat([lat["mask"], lat["edge"]]),
                                                torch.cat([data.mask, data.edge]), steps=recipe["decoder_steps"],
                                                batch_size=recipe["batch_size"], seed=recipe["seed"])
    log["ceiling_after"] = {"mask": ceiling(codec, test.mask), "edge": ceiling(codec, test.edge)}
    print("ceiling after", log["ceiling_after"], flush=True)
    prior, log["prior"] = pretrain_prior(lat["image"], steps=recipe["prior_steps"], seed=recipe["seed"])
    print("prior", log["prior"], flush=True)
    mask_sd = float(lat["mask"].std())
    log["base_cpu_s"], log["base_wall_s"] = time.process_time() - t0, time.time() - w0
    base = Segmenter(codec, build(prior, mask_sd, FinetuneConfig(seed=recipe["seed"])))
    save_segmenter(base, out, {"stage": "base (the prior, widened; not fine-tuned)", "recipe": recipe, **log},
                   dtype=torch.float32, prior=prior)
    return codec, prior, lat, log


def load_base(base: Path) -> tuple[LatentCodec, object]:
    """The codec and the prior written by :func:`train_base` (or shipped beside the segmenter)."""
    return load_segmenter(base).codec, load_model(base / "prior")


def test_curve(codec: LatentCodec, n_test: int = 64, seed: int = 0):
    """A fine-tuning callback scoring one-step inference on ``n_test`` test images (the benchmark's test set):
    ``{"maxF", "MAE", "bandF"}`` (:func:`steerdiff.metrics.segmentation.dis_metrics`)."""
    from ...metrics.segmentation import dis_metrics
    from ...segment import predict_latents

    test = dis.generate(n_test, RECIPE["size"], seed=seed, part="test")
    z = codec.encode(test.image)

    def callback(step: int, model) -> dict:
        m, _ = predict_latents(model, z, steps=1, edge=True)
        row = dis_metrics(codec.decode_map(m).double(), test.mask, with_hce=False)
        print("step", step, {k: round(row[k], 4) for k in ("maxF", "MAE", "bandF")}, flush=True)
        return {k: row[k] for k in ("maxF", "MAE", "bandF")}

    return callback


CODEC_KEYS = ("image_variance", "recon_mse_before", "vae_finetune", "recon_mse_after", "ceiling_vae",
              "encode_cpu_s", "ceiling_before", "mask_decoder", "ceiling_after")
"""A base's records of stages 1-3 (the codec), which :func:`refit_prior` keeps."""


def refit_prior(recipe: dict, codec_from: Path, out: Path) -> tuple[LatentCodec, object, dict, dict]:
    """Stages 1-3 (data, codec, mask decoder) from ``codec_from`` (a base or a segmenter the recipe wrote with the
    same data, VAE and decoder steps), stage 4 (the prior, ``prior_steps``) run again; writes the base ``out`` as
    :func:`train_base` does. The base's CPU time is the codec stages' recorded CPU seconds plus this prior's (the
    wall time likewise), so the recorded training time is that of the whole recipe."""
    meta = read_metadata(codec_from)
    if "recipe" not in meta:
        raise ValueError(f"--codec-from {codec_from}: no recipe in its metadata (give a segmenter the recipe wrote, "
                         "or a base written since the recipe is recorded in it)")
    for key in ("n_train", "size", "vae_steps", "vae_batch_size", "decoder_steps", "batch_size", "seed"):
        if meta["recipe"].get(key) != recipe.get(key):
            raise ValueError(f"--codec-from {codec_from}: its codec was made with {key}={meta['recipe'].get(key)!r}, "
                             f"this recipe has {recipe.get(key)!r}")
    log = {k: meta[k] for k in CODEC_KEYS if k in meta}
    codec_cpu = log.get("vae_finetune", {}).get("cpu_s", 0.0) + log["encode_cpu_s"] + log["mask_decoder"]["cpu_s"]
    prior_wall = meta.get("base_wall_s", 0.0) * meta["prior"]["cpu_s"] / meta["base_cpu_s"]  # the old prior's share
    t0, w0 = time.process_time(), time.time()
    codec = load_segmenter(codec_from).codec
    data = dis.generate(recipe["n_train"], recipe["size"], seed=recipe["seed"])
    lat = encode_all(codec, data)
    prior, log["prior"] = pretrain_prior(lat["image"], steps=recipe["prior_steps"], seed=recipe["seed"])
    print("prior", log["prior"], flush=True)
    log["codec_from"] = str(codec_from)
    log["codec_cpu_s"], log["codec_wall_s"] = codec_cpu, meta.get("base_wall_s", 0.0) - prior_wall
    log["base_cpu_s"] = codec_cpu + (time.process_time() - t0)
    log["base_wall_s"] = log["codec_wall_s"] + (time.time() - w0)
    base = Segmenter(codec, build(prior, float(lat["mask"].std()), FinetuneConfig(seed=recipe["seed"])))
    save_segmenter(base, out, {"stage": "base (the prior, widened; not fine-tuned)", "recipe": recipe, **log},
                   dtype=torch.float32, prior=prior)
    return codec, prior, lat, log


def make(out: Path, recipe: dict | None = None, from_base: Path | None = None, eval_every: int = 0,
         codec_from: Path | None = None) -> dict:
    """All stages; writes the segmenter to ``out`` with ``prior/`` and returns its metadata. ``from_base``: take
    stages 1-4 (codec, prior) from a base directory written earlier (their CPU and wall times are counted).
    ``codec_from``: take stages 1-3 (the codec) from such a directory and pre-train the prior again
    (:func:`refit_prior`). ``eval_every``: score the 64 benchmark test images every so many fine-tuning steps (the
    curve goes in the metadata; its CPU time is left out of the training time)."""
    recipe = {**RECIPE, **(recipe or {})}
    start, wall = time.process_time(), time.time()
    base_dir = Path(f"{out}_base")
    if from_base is not None and codec_from is not None:
        raise ValueError("give from_base (codec and prior) or codec_from (codec only), not both")
    if codec_from is not None:
        codec, prior, lat, log = refit_prior(recipe, codec_from, base_dir)
        start -= log["codec_cpu_s"]  # the codec stages ran earlier: their recorded times are added
        wall -= log["codec_wall_s"]
    elif from_base is None:
        codec, prior, lat, log = train_base(recipe, base_dir)
    else:  # stages 1-4 from an earlier run's base: its times are in its metadata and are added here
        codec, prior = load_base(from_base)
        data = dis.generate(recipe["n_train"], recipe["size"], seed=recipe["seed"])
        lat = encode_all(codec, data)
        # Only the base stages' records: a full segmenter (the shipped one) also holds its own fine-tuning's.
        base_keys = ("encode_cpu_s", "ceiling_before", "mask_decoder", "ceiling_after", "prior", "base_cpu_s",
                     "base_wall_s", "image_variance", "recon_mse_before", "vae_finetune", "recon_mse_after",
                     "ceiling_vae")
        log = {k: v for k, v in read_metadata(from_base).items() if k in base_keys}
        log["base_from"] = str(from_base)
        if "base_cpu_s" not in log:  # a base written before the stage times were recorded: the stages' sum
            log["base_cpu_s"] = log["encode_cpu_s"] + log["mask_decoder"]["cpu_s"] + log["prior"]["cpu_s"]
        start -= log["base_cpu_s"]
        wall -= log.get("base_wall_s") or 0.0  # None when the base did not record it (counted as 0)
    cfg = FinetuneConfig(steps=recipe["finetune_steps"], batch_size=recipe["batch_size"], seed=recipe["seed"],
                         pixel_loss=recipe.get("pixel_loss", 0.0))
    model = build(prior, float(lat["mask"].std()), cfg)
    callback = test_curve(codec) if eval_every > 0 else None
    pixels = None
    if cfg.pixel_loss:  # the decoded-mask loss needs the training masks in pixels (the same draw as the latents)
        pixels = dis.generate(recipe["n_train"], recipe["size"], seed=recipe["seed"]).mask
    log["finetune"] = finetune(model, lat["image"], lat["mask"], lat["edge"], cfg, callback, eval_every,
                               decoder=codec, mask_pixels=pixels)
    print("finetune", log["finetune"], flush=True)
    meta = {"recipe": recipe, "finetune_config": asdict(cfg), "command": COMMAND, **log,
            "train_cpu_s": time.process_time() - start - log["finetune"].get("eval_cpu_s", 0.0),
            "train_wall_s": time.time() - wall - log["finetune"].get("eval_wall_s", 0.0),
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "vae": ("steerdiff/assets/shapes_pipeline/vae, " + (
                f"fine-tuned whole on the training images and maps ({recipe['vae_steps']} steps), then its decoder "
                "on mask and edge latents" if recipe.get("vae_steps", 0) > 0 else
                "encoder frozen; decoder fine-tuned for masks"))}
    save_segmenter(Segmenter(codec, model), out, meta, prior=prior)
    meta["light_decoder"] = make_light_decoder(out, Path(out) / "light_decoder", recipe.get("light"), codec)
    meta["light_encoder"] = make_light_encoder(out, Path(out) / "light_encoder", recipe.get("light_encoder"), codec)
    return meta


def make_light_decoder(directory: Path, out: Path, light: dict | None = None, codec: LatentCodec | None = None) -> dict:
    """Stage 6: train the light mask decoder on the codec of the segmenter in ``directory`` (or ``codec``) over the
    latents of the recipe's training masks (the segmenter's recorded ``n_train``, ``size``, ``seed``) and write it
    to ``out`` with its recipe, command and CPU / wall seconds (data and encoding counted). Returns that
    metadata."""
    light = {**LIGHT_RECIPE, **(light or {})}
    recipe = {**RECIPE, **read_metadata(directory).get("recipe", {})}
    t0, w0 = time.process_time(), time.time()
    if codec is None:
        codec = load_segmenter(directory).codec
    data = dis.generate(recipe["n_train"], recipe["size"], seed=recipe["seed"])
    with torch.no_grad():
        lat = torch.cat([codec.encode_map(data.mask[i:i + 128]) for i in range(0, data.mask.shape[0], 128)])
    dec, info = train_light_decoder(codec, lat, data.mask, **light)
    test = dis.generate(128, recipe["size"], seed=recipe["seed"], part="test")
    with torch.no_grad():
        gt = codec.encode_map(test.mask)
        ceil = {"light": {"max_f": _max_f(dec.decode_map(gt), test.mask),
                          "mae": float((dec.decode_map(gt) - test.mask).abs().mean())},
                "vae": ceiling(codec, test.mask)}
    meta = {"recipe": light, "data": {k: recipe[k] for k in ("n_train", "size", "seed")}, "command": LIGHT_COMMAND,
            "train": info, "train_cpu_s": time.process_time() - t0, "train_wall_s": time.time() - w0,
            "threads": torch.get_num_threads(), "ceiling_test128": ceil}
    save_light_decoder(dec, out, meta)
    load_light_decoder(out, codec)  # it reads back for this codec
    print("light decoder", {k: meta[k] for k in ("train_cpu_s", "ceiling_test128")}, flush=True)
    return meta


def make_light_encoder(directory: Path, out: Path, light: dict | None = None,
                       codec: LatentCodec | None = None) -> dict:
    """Stage 7: distil the light image encoder from the VAE encoder of the segmenter in ``directory`` (or
    ``codec``) on the recipe's training images (the segmenter's recorded ``n_train``, ``size``, ``seed``) and write
    it to ``out`` with its recipe, command, CPU / wall seconds (data and targets counted) and its distillation
    error (mean squared error over the latents' variance) on the training rows and on 128 test images."""
    light = {**ENCODER_RECIPE, **(light or {})}
    recipe = {**RECIPE, **read_metadata(directory).get("recipe", {})}
    t0, w0 = time.process_time(), time.time()
    if codec is None:
        codec = load_segmenter(directory).codec
    data = dis.generate(recipe["n_train"], recipe["size"], seed=recipe["seed"])
    enc, info = train_light_encoder(codec, data.image, **light)
    train_cpu, train_wall = time.process_time() - t0, time.time() - w0
    test = dis.generate(128, recipe["size"], seed=recipe["seed"], part="test")
    test_error = distillation_error(enc, test.image, vae_targets(codec, test.image))
    meta = {"recipe": light, "data": {k: recipe[k] for k in ("n_train", "size", "seed")}, "command": ENCODER_COMMAND,
            "train": info, "train_cpu_s": train_cpu, "train_wall_s": train_wall,
            "threads": torch.get_num_threads(), "distillation_error_test128": test_error}
    save_light_encoder(enc, out, meta)
    load_light_encoder(out, codec)  # it reads back for this codec
    print("light encoder", {k: meta[k] for k in ("train_cpu_s", "distillation_error_test128")},
          {k: info[k] for k in ("train_error", "parameters")}, flush=True)
    return meta


def summary(meta: dict) -> dict:
    """The shipped folder's ``metrics.json``: the recipe, training CPU seconds (total and per stage), the image
    reconstruction errors and the ceilings, from a segmenter's metadata (:func:`make`'s return value)."""
    stages = {"vae": meta.get("vae_finetune", {}).get("cpu_s"), "encode": meta.get("encode_cpu_s"),
              "mask_decoder": meta["mask_decoder"]["cpu_s"], "prior": meta["prior"]["cpu_s"],
              "finetune": meta["finetune"]["cpu_s"]}
    keys = ("image_variance", "recon_mse_before", "recon_mse_after", "ceiling_before", "ceiling_vae", "ceiling_after")
    return {"command": COMMAND, "recipe": meta["recipe"], "train_cpu_s": meta["train_cpu_s"],
            "train_wall_s_loaded_machine": meta["train_wall_s"], "threads": meta["threads"],
            "stages_cpu_s": {k: v for k, v in stages.items() if v is not None},
            **{k: meta[k] for k in keys if k in meta},
            "finetune_curve": meta["finetune"].get("curve", [])}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/diffdis"))
    p.add_argument("--finetune-steps", type=int, default=None, help="override the recipe's fine-tuning steps")
    p.add_argument("--from-base", type=Path, default=None, help="reuse the codec and prior of a base directory")
    p.add_argument("--codec-from", type=Path, default=None,
                   help="reuse the codec of a base or segmenter directory and pre-train the prior again")
    p.add_argument("--prior-steps", type=int, default=None, help="override the recipe's prior pre-training steps")
    p.add_argument("--eval-every", type=int, default=0, help="score the test images every N fine-tuning steps")
    p.add_argument("--pixel-loss", type=float, default=None,
                   help="weight of the decoded-mask loss in fine-tuning (FinetuneConfig.pixel_loss; recipe: off)")
    p.add_argument("--quick", action="store_true", help="a tiny run (seconds) to check the recipe end to end")
    p.add_argument("--light-decoder", type=Path, default=None, metavar="DIR",
                   help="only stage 6: train the light mask decoder for the codec of the segmenter in DIR (written "
                        "to OUT/light_decoder)")
    p.add_argument("--light-encoder", type=Path, default=None, metavar="DIR",
                   help="only stage 7: distil the light image encoder from the VAE encoder of the segmenter in DIR "
                        "(written to OUT/light_encoder)")
    args = p.parse_args(argv)
    if args.light_decoder is not None or args.light_encoder is not None:
        if args.light_decoder is not None:
            make_light_decoder(args.light_decoder, args.out / "light_decoder",
                               {"steps": 2, "n_distill": 64} if args.quick else None)
        if args.light_encoder is not None:
            make_light_encoder(args.light_encoder, args.out / "light_encoder", {"steps": 2} if args.quick else None)
        return
    recipe = None
    if args.quick:
        recipe = {"n_train": 64, "vae_steps": 2, "vae_batch_size": 2, "decoder_steps": 2, "prior_steps": 2,
                  "finetune_steps": 2, "batch_size": 4, "light": {"steps": 2, "n_distill": 64},
                  "light_encoder": {"steps": 2}}
    if args.finetune_steps is not None:
        recipe = {**(recipe or {}), "finetune_steps": args.finetune_steps}
    if args.pixel_loss is not None:
        recipe = {**(recipe or {}), "pixel_loss": args.pixel_loss}
    if args.prior_steps is not None:
        recipe = {**(recipe or {}), "prior_steps": args.prior_steps}
    meta = make(args.out, recipe, args.from_base, args.eval_every, args.codec_from)
    print({k: meta[k] for k in ("train_cpu_s", "train_wall_s", "ceiling_after")})


if __name__ == "__main__":
    main()
