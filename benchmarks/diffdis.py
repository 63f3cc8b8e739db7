"""DiffDIS (Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation via Probing Diffusion Capacity")
against the multi-step diffusion segmenter and the from-scratch network, with its ablations
(docs/methods/diffdis.md, "Benchmark").

Every latent arm is the same network (:class:`steerdiff.segment.DiffDISNet` on the prior's UNet: equal parameters
exactly), on the same codec (the base's VAE: since the second wave fine-tuned on the images, then its decoder on
masks; earlier bases kept the shapes pipeline's encoder frozen), the same training
latents, steps and batch; only what the issue varies differs:

* ``diffdis``: prior init, one step at ``sigma_t``, mask + edge rows in one batch (DBIA on). Inferred in one step.
* ``diffdis_10step``: the same trained model, run through 10 Euler steps from ``sigma_t`` (the multi-step ablation).
* ``no_edge``: prior init, one step, the mask alone (the edge-task ablation).
* ``scratch``: the same network from random weights, trained as ``diffdis`` (the from-scratch regressor: at
  ``sigma_t`` the noisy input carries no signal, so one-step training is regression from the image latent).
* ``scratch_no_edge``: the same network from random weights on the mask rows alone (the plain regressor of the
  issue's baseline, without the edge rows that the ``scratch`` arm also has to fit).
* ``multistep``: prior init, the EDM diffusion objective on the mask latents, sampled with 20 Euler steps and an
  ensemble of 4 samples averaged (the multi-step diffusion segmenter).
* ``diffdis_zproj``: ``diffdis`` with the cross-task attentions started by a zero output projection (gate 1)
  instead of a zero gate (``FinetuneConfig.dbia_init="zero_proj"``; docs/methods/diffdis.md, "The edge task's
  contribution").
* ``diffdis_px``, ``scratch_px``: ``diffdis`` and ``scratch`` with the pixel-space loss through the frozen mask
  decoder (``FinetuneConfig.pixel_loss = --pixel-loss``; docs/methods/diffdis.md, "Pixel-space loss through the
  mask decoder").

Scores (``steerdiff.metrics.segmentation.dis_metrics`` on 64 test images at 64x64): max F, weighted F, S, mean E,
MAE, HCE proxy, edge-band F (2 px), and the CPU seconds per image of inference (VAE encode, the model, decode) in
all, for the masks alone (no edge decode: ``steerdiff segment --no-edges``) and in the denoiser alone.
``--multistep-grid 10,20,50:1,4,10`` also scores the trained ``multistep`` arm at every steps x ensemble setting,
its ensemble averaged in output space and in latent space, with each setting's mask-only CPU time and its ratio to
the one-step row's (docs/methods/diffdis.md, "Inference time").
``--decoders vae,light`` scores every trained arm with each mask decoder (``steerdiff.segment.MASK_DECODERS``;
the light one from ``--light-from``, default the shipped folder's ``light_decoder/``; rows ``<arm> [light]``): the
one-step and multi-step arms decode through the same decoder, so each comparison is at equal decoder
(docs/methods/diffdis.md, "The light mask decoder").
``--encoders vae,light`` likewise encodes the test images with each image encoder
(``steerdiff.segment.IMAGE_ENCODERS``; the light one from ``--light-from``'s ``light_encoder/``), every encoder
with every decoder of ``--decoders``; rows ``<arm> [<encoder> enc, <decoder> dec]`` where the encoder is not the
VAE's. Training is unchanged (the arms are fine-tuned on the VAE encoder's latents), so a light encoder is an
inference-time substitute for both the one-step and the multi-step arm (docs/methods/diffdis.md, "The light image
encoder").
Three seeds (initialisation, row and noise draws). Codec and prior come from the recipe's base
(``python -m steerdiff.app.recipes.diffdis``, written to ``<out>_base``) or the shipped ``steerdiff/assets/diffdis``.

    OMP_NUM_THREADS=1 python benchmarks/diffdis.py [--base DIR] [--seeds 0,1,2] [--steps 200] [--n-train 512]
    OMP_NUM_THREADS=1 python benchmarks/diffdis.py --seeds 1 &      # seeds in parallel, one file each
    OMP_NUM_THREADS=1 python benchmarks/diffdis.py --arms diffdis,multistep --decoders vae,light
    OMP_NUM_THREADS=1 python benchmarks/diffdis.py --arms diffdis,multistep --encoders vae,light --decoders light
    python benchmarks/diffdis.py --table-only                         # the table from seeds/seed*.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from steerdiff.app.recipes.diffdis import encode_all, load_base, shipped_dir
from steerdiff.data import dis
from steerdiff.metrics.segmentation import dis_metrics
from steerdiff.segment import (
    CONDITION_INITS,
    IMAGE_ENCODERS,
    MASK_DECODERS,
    FinetuneConfig,
    Segmenter,
    build,
    finetune,
    load_segmenter,
    predict_latents,
    read_metadata,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

ARMS = {  # name: (FinetuneConfig overrides, inference options)
    "diffdis": ({}, {"steps": 1}),
    "diffdis_10step": (None, {"steps": 10}),  # None: the diffdis model of the same seed
    "no_edge": ({"edge": False}, {"steps": 1}),
    "scratch": ({"init": "scratch"}, {"steps": 1}),
    "scratch_no_edge": ({"init": "scratch", "edge": False}, {"steps": 1}),  # the plain regressor: mask rows only
    "multistep": ({"objective": "diffusion", "edge": False}, {"steps": 20, "ensemble": 4}),
    # The pixel-space loss through the frozen mask decoder added to the latent one (weight --pixel-loss):
    "diffdis_px": ({"pixel_loss": "arg"}, {"steps": 1}),
    "scratch_px": ({"init": "scratch", "pixel_loss": "arg"}, {"steps": 1}),
    # DiffDIS with the cross-task attentions open from the start: zero output projection, gate 1
    # (FinetuneConfig.dbia_init; docs/methods/diffdis.md, "The edge task's contribution").
    "diffdis_zproj": ({"dbia_init": "zero_proj"}, {"steps": 1}),
}
PIXEL_ARMS = {  # h43a's pixel-space baselines (steerdiff.segment.baselines), UNet (16, 32, 64): 0.62 M parameters
    "pixel_regressor": {},
    "pixel_multistep": {"steps": 20, "ensemble": 4},
}
COLUMNS = ("maxF", "wF", "S", "meanE", "MAE", "HCE", "bandF", "cpu_s_per_image", "mask_only_cpu_s_per_image",
           "denoiser_cpu_s_per_image")


@torch.no_grad()
def score(seg: Segmenter, test: dis.DISBatch, opts: dict) -> dict:
    """DIS5K scores of ``seg.segment(test.image, **opts)``, with its CPU seconds per image in all (the edge maps
    decoded too, as ``steerdiff segment`` does by default), for the mask alone (``--no-edges``: no edge decode),
    and in the denoiser alone (the VAE encoder and the mask decoder are the same for every latent arm)."""
    steps, ensemble = opts.get("steps", 1), opts.get("ensemble", 1)
    n = test.image.shape[0]
    t0 = time.process_time()
    z = seg.encode(test.image)
    t1 = time.process_time()
    latents = [predict_latents(seg.model, z, steps=steps, edge=seg.edge, seed=k * n) for k in range(ensemble)]
    t2 = time.process_time()
    mask = torch.stack([seg.decode_map(m) for m, _ in latents]).mean(0)  # output space (Marigold's way)
    t3 = time.process_time()
    if seg.edge:  # DiffDIS decodes its edge maps too (the CLI's default): counted in the total
        torch.stack([seg.decode_map(e) for _, e in latents]).mean(0)
    t4 = time.process_time()
    rows_per_image = 2 if seg.edge else 1
    return {**dis_metrics(mask.double(), test.mask), "cpu_s_per_image": (t4 - t0) / n,
            "mask_only_cpu_s_per_image": (t3 - t0) / n,
            "denoiser_cpu_s_per_image": (t2 - t1) / n, "vae_cpu_s_per_image": ((t1 - t0) + (t4 - t2)) / n,
            "encode_cpu_s_per_image": (t1 - t0) / n, "decode_cpu_s_per_image": (t4 - t2) / n,
            "denoiser_rows_per_image": rows_per_image * steps * ensemble, "decode_s": t3 - t2}


@torch.no_grad()
def multistep_grid(seg: Segmenter, test: dis.DISBatch, steps_list: list[int], ensembles: list[int]) -> list[dict]:
    """The multi-step segmenter at every ``steps`` x ``ensemble`` setting, its ensemble averaged in output space
    (each member decoded, the maps averaged: Marigold's way) and in latent space (the members' latents averaged,
    decoded once), with the CPU seconds per image of each.

    Member ``k`` of every ensemble is the same draw (seed ``k * n``, as :func:`score`), so the members are sampled
    once per step count, up to the largest ensemble, and each member's denoiser and decoder CPU seconds are
    measured on its own: a setting's time is the encoder's plus the sum over exactly the calls it makes (the
    first ``ensemble`` members' sampling and decoding; one decode of the averaged latent in latent space)."""
    n = test.image.shape[0]
    t0 = time.process_time()
    z = seg.encode(test.image)
    enc = time.process_time() - t0
    rows = []
    for steps in steps_list:
        lat, maps, den, dec = [], [], [], []
        for k in range(max(ensembles)):
            t0 = time.process_time()
            m = predict_latents(seg.model, z, steps=steps, edge=False, seed=k * n)[0]
            t1 = time.process_time()
            maps.append(seg.decode_map(m))
            t2 = time.process_time()
            lat.append(m)
            den.append(t1 - t0)
            dec.append(t2 - t1)
        for e in ensembles:
            out_mask = torch.stack(maps[:e]).mean(0)
            t0 = time.process_time()
            lat_mask = seg.decode_map(torch.stack(lat[:e]).mean(0))
            lat_dec = time.process_time() - t0
            base = enc + sum(den[:e])
            for average, mask, cpu in (("output", out_mask, base + sum(dec[:e])), ("latent", lat_mask, base + lat_dec)):
                if average == "latent" and e == 1:
                    continue  # one member: the same map either way
                res = {k: v for k, v in dis_metrics(mask.double(), test.mask).items()}
                rows.append({"steps": steps, "ensemble": e, "average": average, **res,
                             "mask_only_cpu_s_per_image": cpu / n, "denoiser_cpu_s_per_image": sum(den[:e]) / n})
                print("grid", steps, e, average, {k: round(rows[-1][k], 4) for k in
                                                  ("maxF", "MAE", "bandF", "mask_only_cpu_s_per_image")}, flush=True)
    return rows


LEGACY = {"pixel_loss": 0.0, "condition_init": "noise", "sigma_embed": None}


def common(args) -> dict:
    """``FinetuneConfig`` fields set for every latent arm from the command line."""
    return {"condition_init": args.condition_init, "sigma_embed": args.sigma_embed}


def run_seed(seed: int, args, codec, prior, lat: dict, test: dis.DISBatch, arms: list[str],
             mask_pixels: torch.Tensor | None = None, decoders: dict | None = None,
             encoders: dict | None = None) -> tuple[list[dict], dict[str, Segmenter]]:
    """Train and score every arm at one seed (``mask_pixels``: the training masks, for the ``*_px`` arms), each
    latent arm once per image encoder of ``encoders`` and mask decoder of ``decoders`` (name -> module or ``None``
    for the VAE's; default the VAE's alone); the rows and the trained segmenters (VAE codec) by arm."""
    decoders = decoders if decoders is not None else {"vae": None}
    encoders = encoders if encoders is not None else {"vae": None}
    mask_sd = float(lat["mask"].std())
    trained: dict[str, Segmenter] = {}
    rows = []
    for arm in arms:
        if arm in PIXEL_ARMS:
            rows.append(run_pixel(arm, seed, args, test))
            continue
        over, opts = ARMS[arm]
        if over is None:
            seg = trained["diffdis"]
            info = {"shares": "diffdis"}
        elif arm == "diffdis" and args.diffdis_from is not None:
            seg, info = load_trained_diffdis(args.diffdis_from, seed, args)
            trained[arm] = seg
        else:
            over = {k: args.pixel_loss if v == "arg" else v for k, v in over.items()}
            cfg = FinetuneConfig(**{**asdict(FinetuneConfig()), "steps": args.steps, "seed": seed, **common(args),
                                    **over})
            model = build(prior, mask_sd, cfg)
            info = finetune(model, lat["image"], lat["mask"], lat["edge"], cfg, decoder=codec,
                            mask_pixels=mask_pixels)
            info["dbia"] = dbia_state(model)
            seg = Segmenter(codec, model, edge=cfg.edge)
            trained[arm] = seg
        for enc_name, encoder in encoders.items():
            for name, decoder in decoders.items():
                scored = seg if decoder is None and encoder is None else Segmenter(
                    seg.codec, seg.model, edge=seg.edge, decoder=decoder, encoder=encoder)
                res = {"arm": arm, "seed": seed, **score(scored, test, opts), "train": info, "inference": opts,
                       "parameters": seg.num_parameters(), "decoder": name}
                if enc_name != "vae":  # rows of the VAE encoder keep the seed files' earlier layout
                    res["encoder"] = enc_name
                if seg.edge and over is not None and opts.get("steps") == 1:
                    res["dbia_off"] = score_dbia_off(scored, test, opts)
                rows.append(res)
                print(label(res), seed, {k: round(res[k], 4) for k in COLUMNS if k in res}, flush=True)
    return rows, trained


def score_dbia_off(seg: Segmenter, test: dis.DISBatch, opts: dict) -> dict:
    """The trained model's scores with its cross-task attentions shut at inference (both gates set to 0 on a copy):
    what the mask rows take from the edge rows through the interaction, apart from what the shared weights learnt
    from the edge task (docs/methods/diffdis.md, "The edge task's contribution")."""
    import copy

    model = copy.deepcopy(seg.model)
    with torch.no_grad():
        model.net.dbia_mid.gate.zero_()
        model.net.dbia_out.gate.zero_()
    res = score(Segmenter(seg.codec, model, edge=True, decoder=seg.decoder, encoder=seg.encoder), test, opts)
    return {k: res[k] for k in ("maxF", "wF", "S", "meanE", "MAE", "HCE", "bandF")}


def dbia_state(model) -> dict:
    """How open each cross-task attention ended: its gate, the norm of its output projection, and their product
    (the branch's scale; docs/methods/diffdis.md, "The edge task's contribution")."""
    out = {}
    for name in ("dbia_mid", "dbia_out"):
        block = getattr(model.net, name)
        gate, proj = float(block.gate.detach()), float(block.proj.weight.detach().norm())
        out[name] = {"gate": gate, "proj_norm": proj, "scale": abs(gate) * proj}
    return out


def load_decoders(names: list[str], light_from: Path, codec) -> dict:
    """The mask decoders ``names`` (``MASK_DECODERS``) for ``codec``, each loaded from ``light_from`` (a segmenter
    folder) where it has files of its own."""
    return {name: MASK_DECODERS.get(name).load(light_from, codec) for name in names}


def load_encoders(names: list[str], light_from: Path, codec) -> dict:
    """The image encoders ``names`` (``IMAGE_ENCODERS``) for ``codec``, loaded from ``light_from`` as
    :func:`load_decoders`."""
    return {name: IMAGE_ENCODERS.get(name).load(light_from, codec) for name in names}


def variant(row: dict) -> str:
    """The bracket of a row's name: the mask decoder when it is not the VAE's (``light``), or, with an image
    encoder other than the VAE's, both (``light enc, vae dec``); empty for the VAE codec."""
    d, e = row.get("decoder", "vae"), row.get("encoder", "vae")
    if e != "vae":
        return f"{e} enc, {d} dec"
    return "" if d == "vae" else d


def label(row: dict) -> str:
    """A table row's name: the arm, with :func:`variant` in brackets when it is not the VAE codec."""
    v = variant(row)
    return row["arm"] if not v else f"{row['arm']} [{v}]"


def load_trained_diffdis(path: Path, seed: int, args) -> tuple[Segmenter, dict]:
    """The ``diffdis`` arm from a segmenter the recipe wrote (``python -m steerdiff.app.recipes.diffdis``), instead
    of training it again: the recipe trains exactly this arm (same prior, data, ``FinetuneConfig``, seed), so it
    is accepted only when its fine-tuning steps, seed, batch, learning rate and training-set size match."""
    meta = read_metadata(path)
    # Fields a segmenter's metadata predates had the behaviour of their absence (no pixel loss, the prior's kernel
    # on the noisy mask input, no embedding shift), not today's defaults.
    cfg, recipe = {**asdict(FinetuneConfig()), **LEGACY, **meta["finetune_config"]}, meta["recipe"]
    want = {**asdict(FinetuneConfig()), "steps": args.steps, "seed": seed, **ARMS["diffdis"][0], **common(args)}
    if cfg != want or recipe["n_train"] != args.n_train or recipe["size"] != 64 or recipe["seed"] != 0:
        raise ValueError(f"--diffdis-from {path}: trained with {cfg}, n_train={recipe['n_train']}; this run needs "
                         f"{want}, n_train={args.n_train}")
    info = {k: v for k, v in meta["finetune"].items()}
    info["loaded_from"] = str(path)
    return load_segmenter(path), info


def run_pixel(arm: str, seed: int, args, test: dis.DISBatch) -> dict:
    """One of h43a's pixel-space baselines, trained on the same images for the same steps."""
    from steerdiff.segment.baselines import BaselineConfig, train_diffusion_segmenter, train_regressor

    cfg = BaselineConfig(n_train=args.n_train, steps=args.steps, seed=seed)
    model, info = (train_regressor if arm == "pixel_regressor" else train_diffusion_segmenter)(cfg)
    opts = PIXEL_ARMS[arm]
    t0 = time.process_time()
    with torch.no_grad():
        mask, _ = model.segment(test.image, **opts)
    cpu = (time.process_time() - t0) / test.image.shape[0]
    res = {"arm": arm, "seed": seed, **dis_metrics(mask.double(), test.mask), "cpu_s_per_image": cpu,
           "denoiser_cpu_s_per_image": cpu, "train": {"cpu_s": info["cpu_seconds"]}, "inference": opts,
           "parameters": model.num_parameters()}
    print(arm, seed, {k: round(res[k], 4) for k in COLUMNS if k in res}, flush=True)
    return res


def build_table(out: Path) -> str:
    """``diffdis.md`` / ``diffdis.json`` from every ``seeds/seed<k>.json`` present (seeds may run in parallel)."""
    runs = [json.loads(f.read_text()) for f in sorted((out / "seeds").glob("seed*.json"))]
    if not runs:
        return ""
    names = sorted({variant(r) for run in runs for r in run["rows"]}, key=lambda v: (v != "", "enc" in v, v))
    arms = [f"{a} [{v}]" if v else a for v in names for a in (*ARMS, *PIXEL_ARMS)
            if any(label(r) == (f"{a} [{v}]" if v else a) for run in runs for r in run["rows"])]
    rows = {a: sorted((r for run in runs for r in run["rows"] if label(r) == a), key=lambda r: r["seed"])
            for a in arms}
    seeds = sorted({r["seed"] for a in arms for r in rows[a]})

    def mean(a: str, k: str) -> float:
        return sum(r.get(k, float("nan")) for r in rows[a]) / len(rows[a])

    def cell(a: str, k: str) -> str:
        if any(k not in r for r in rows[a]):
            return "-"  # a seed file written before the column existed
        v = torch.tensor([r[k] for r in rows[a]], dtype=torch.float64)
        if k.endswith("_per_image") or len(v) == 1:
            return f"{v.mean():.4f}"
        return f"{v.mean():.4f} ± {v.std():.4f}"

    table = markdown_table(("arm", "params", "seeds", *COLUMNS),
                           [(a, rows[a][0]["parameters"], len(rows[a]), *(cell(a, k) for k in COLUMNS))
                            for a in arms],
                           "l" + "r" * (len(COLUMNS) + 2))
    checks = []
    if {"diffdis", "multistep", "scratch"} <= set(arms):
        d, m, s = ({k: mean(a, k) for k in COLUMNS} for a in ("diffdis", "multistep", "scratch"))
        mask_ratio = m["mask_only_cpu_s_per_image"] / d["mask_only_cpu_s_per_image"]  # NaN for runs before the column
        checks = [f"one-step maxF >= multi-step: {d['maxF']:.4f} vs {m['maxF']:.4f} -> {d['maxF'] >= m['maxF']}",
                  f"one-step MAE <= multi-step: {d['MAE']:.4f} vs {m['MAE']:.4f} -> {d['MAE'] <= m['MAE']}",
                  f"CPU time per image, multi-step / one-step: {m['cpu_s_per_image'] / d['cpu_s_per_image']:.1f}x "
                  "in all with DiffDIS's edge maps decoded, "
                  + (f"{mask_ratio:.1f}x for the masks alone (`--no-edges`), " if mask_ratio == mask_ratio
                     else "(masks alone not timed in these runs), ")
                  + f"{m['denoiser_cpu_s_per_image'] / d['denoiser_cpu_s_per_image']:.1f}x in the "
                  "denoiser (target >= 10x)",
                  f"edge-band F, DiffDIS vs scratch: {d['bandF']:.4f} vs {s['bandF']:.4f} -> {d['bandF'] > s['bandF']}"]
        per_seed = [a["bandF"] > b["bandF"] for a, b in zip(rows["diffdis"], rows["scratch"], strict=False)]
        checks.append(f"edge-band F, DiffDIS > scratch per seed {seeds}: {per_seed}")
    others = [v for v in names if v]
    pairs = [("diffdis", "multistep"), *((f"diffdis [{v}]", f"multistep [{v}]") for v in others),
             *((f"diffdis [{v}]", "multistep") for v in others)]
    for one, multi in pairs:
        if {one, multi} <= set(arms):  # one step against multi-step, each with the decoder named
            d, m = ({k: mean(a, k) for k in COLUMNS} for a in (one, multi))
            checks.append(f"{one} vs {multi}: maxF {d['maxF']:.4f} vs {m['maxF']:.4f} -> {d['maxF'] >= m['maxF']}; "
                          f"MAE {d['MAE']:.4f} vs {m['MAE']:.4f} -> {d['MAE'] <= m['MAE']}; bandF {d['bandF']:.4f} "
                          f"vs {m['bandF']:.4f}; mask-only CPU time multi / one "
                          f"{m['mask_only_cpu_s_per_image'] / d['mask_only_cpu_s_per_image']:.1f}x "
                          f"(with edge maps {m['cpu_s_per_image'] / d['cpu_s_per_image']:.1f}x)")
            per_seed = [(round(a["maxF"] - b["maxF"], 4), round(a["MAE"] - b["MAE"], 4))
                        for a, b in zip(rows[one], rows[multi], strict=False)]
            checks.append(f"{one} minus {multi} per seed {seeds} (maxF, MAE): {per_seed}")
    for base in ("scratch", "scratch_no_edge"):
        if {"diffdis", base} <= set(arms):
            diffs = [(round(a["bandF"] - b["bandF"], 4), round(a["maxF"] - b["maxF"], 4), round(a["MAE"] - b["MAE"], 4))
                     for a, b in zip(rows["diffdis"], rows[base], strict=False)]
            checks.append(f"diffdis minus {base} per seed {seeds} (bandF, maxF, MAE): {diffs}")
    for one in ("diffdis", "diffdis_zproj"):
        if {one, "no_edge"} <= set(arms):
            per_seed = [(round(a["bandF"] - b["bandF"], 4), round(a["maxF"] - b["maxF"], 4),
                         round(a["MAE"] - b["MAE"], 4)) for a, b in zip(rows[one], rows["no_edge"], strict=False)]
            checks.append(f"edge task, {one} minus no_edge per seed {seeds} (bandF, maxF, MAE): {per_seed}")
    for a, b in (("diffdis_px", "scratch_px"), ("diffdis_px", "diffdis"), ("scratch_px", "scratch")):
        if {a, b} <= set(arms):  # the decoded-mask loss: prior vs scratch, and each against the latent loss alone
            common = sorted({r["seed"] for r in rows[a]} & {r["seed"] for r in rows[b]})
            ra = {r["seed"]: r for r in rows[a]}
            rb = {r["seed"]: r for r in rows[b]}
            diffs = [tuple(round(ra[k][m] - rb[k][m], 4) for m in ("maxF", "MAE", "bandF")) for k in common]
            checks.append(f"{a} minus {b} per seed {common} (maxF, MAE, bandF): {diffs}")
    checks += [f"{r['arm']} seed {r['seed']}: {r['source']}" for a in arms for r in rows[a] if "source" in r]
    checks += list(dict.fromkeys(  # once per arm and seed, not once per decoder
        f"{r['arm']} seed {r['seed']}: trained by the recipe, loaded from {r['train']['loaded_from']}"
        for a in arms for r in rows[a] if "loaded_from" in r.get("train", {})))
    grid_text = render_grid(runs, rows.get("diffdis", []))
    meta = runs[0]["provenance"]
    commands = sorted({f"OMP_NUM_THREADS=1 python benchmarks/diffdis.py {' '.join(run['argv'])}" for run in runs})
    text = (f"# DiffDIS vs multi-step and from-scratch (seeds {seeds}, mean ± std over seeds)\n\n"
            "Commands (each run once per seed with `--seeds K`, seeds in parallel; then `--table-only`):\n\n"
            + "".join(f"    {c}\n" for c in commands) + "\n"
            f"{provenance_line(meta)}\n\n{table}\n\n" + "\n".join(f"- {c}" for c in checks) + "\n" + grid_text)
    write_text(out / "diffdis.md", text)
    write_json(out / "diffdis.json", {"runs": runs, "checks": checks})
    return text


def _ratio(g: dict, d: dict | None, key: str) -> str:
    """A multi-step setting's mask-only time over the one-step row's ``key`` time, or "-" without one."""
    return f"{g['mask_only_cpu_s_per_image'] / d[key]:.1f}x" if d and key in d else "-"


def render_grid(runs: list[dict], diffdis_rows: list[dict]) -> str:
    """The multi-step settings table of every seed file with a ``grid`` (``--multistep-grid``): accuracy, mask-only
    CPU time per image, and that time over the one-step DiffDIS row's of the same seed (same process), for the
    masks alone and with DiffDIS's edge maps decoded."""
    one = {r["seed"]: r for r in diffdis_rows}
    text = ""
    for run in runs:
        grid, seed = run.get("grid"), run["seed"]
        if not grid:
            continue
        d = one.get(seed)
        body = [(g["steps"], g["ensemble"], g["average"], f"{g['maxF']:.4f}", f"{g['MAE']:.4f}", f"{g['bandF']:.4f}",
                 f"{1e3 * g['mask_only_cpu_s_per_image']:.1f}", _ratio(g, d, "mask_only_cpu_s_per_image"),
                 _ratio(g, d, "cpu_s_per_image")) for g in grid]
        if d:
            body.insert(0, (1, 1, "DiffDIS", f"{d['maxF']:.4f}", f"{d['MAE']:.4f}", f"{d['bandF']:.4f}",
                            f"{1e3 * d.get('mask_only_cpu_s_per_image', float('nan')):.1f}", "1.0x", "-"))
        table = markdown_table(("steps", "ensemble", "average", "maxF", "MAE", "bandF", "CPU ms / image (mask)",
                                "/ one-step (mask)", "/ one-step (mask + edges)"), body, "rrlrrrrrr")
        best = max(grid, key=lambda g: g["maxF"])
        beats = [g for g in grid if d and d["maxF"] >= g["maxF"] and d["MAE"] <= g["MAE"]]
        n_test = run["args"].get("n_test", 64)
        text += (f"\n## Multi-step settings, seed {seed} (the multistep arm's model; {n_test} test images)\n\n"
                 f"{table}\n\n"
                 f"- best multi-step max F: {best['steps']} steps x {best['ensemble']} ({best['average']} average), "
                 f"{best['maxF']:.4f} / MAE {best['MAE']:.4f}\n"
                 f"- one-step at least as accurate (max F and MAE) as {len(beats)} of {len(grid)} settings\n")
    return text


def _embed(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, default=shipped_dir(), help="directory with the codec and prior/")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=200, help="fine-tuning steps of every arm")
    p.add_argument("--n-train", type=int, default=512)
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--diffdis-from", type=Path, default=None,
                   help="take the diffdis arm of the (single) seed from a segmenter the recipe wrote with the same "
                        "steps, seed and n_train, instead of training it again")
    p.add_argument("--pixel-loss", type=float, default=1.0,
                   help="weight of the decoded-mask loss in the diffdis_px and scratch_px arms")
    p.add_argument("--condition-init", default=FinetuneConfig.condition_init, choices=CONDITION_INITS,
                   help="where the prior's input kernel goes (every latent arm)")
    p.add_argument("--sigma-embed", type=_embed, default=FinetuneConfig.sigma_embed,
                   help="the embedded noise level at sigma_t, or 'none' for sigma_t itself (one-step arms)")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default benchmarks/results/diffdis); runs with other settings go elsewhere, "
                        "since --table-only averages every seeds/seed*.json by arm name")
    p.add_argument("--multistep-grid", default=None, metavar="STEPS:ENSEMBLES",
                   help="also score the trained multistep arm at every setting, e.g. 10,20,50:1,4,10 (mask-only "
                        "CPU time per image, ensembles averaged in output and in latent space)")
    p.add_argument("--decoders", default="vae",
                   help=f"mask decoders to score every latent arm with, comma-separated ({MASK_DECODERS.names()})")
    p.add_argument("--encoders", default="vae",
                   help=f"image encoders to score every latent arm with, comma-separated ({IMAGE_ENCODERS.names()}); "
                        "each with every decoder of --decoders")
    p.add_argument("--light-from", type=Path, default=shipped_dir(),
                   help="the segmenter folder whose decoder and encoder files (light_decoder/, light_encoder/) "
                        "--decoders and --encoders load")
    p.add_argument("--tag", default="latent", help="name of this run's seed files (seeds/seed<k>_<tag>.json)")
    p.add_argument("--table-only", action="store_true", help="rebuild the table from the seed files")
    args = p.parse_args(argv)
    argv_used = [a for a in (argv if argv is not None else sys.argv[1:])]
    out = args.out if args.out is not None else results_dir("diffdis")
    if not args.table_only:
        seeds = [int(s) for s in args.seeds.split(",")]
        arms = args.arms.split(",")
        meta = provenance()
        codec, prior = load_base(args.base)
        data = dis.generate(args.n_train, 64, seed=0)
        test = dis.generate(args.n_test, 64, seed=0, part="test")
        lat = encode_all(codec, data)
        decoders = load_decoders(args.decoders.split(","), args.light_from, codec)
        encoders = load_encoders(args.encoders.split(","), args.light_from, codec)
        (out / "seeds").mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            rows, trained = run_seed(seed, args, codec, prior, lat, test, arms, data.mask, decoders, encoders)
            extra = {}
            if args.multistep_grid:
                if "multistep" not in trained:
                    raise SystemExit("--multistep-grid needs the multistep arm in --arms")
                steps_txt, ens_txt = args.multistep_grid.split(":")
                extra["grid"] = multistep_grid(trained["multistep"], test, [int(v) for v in steps_txt.split(",")],
                                               [int(v) for v in ens_txt.split(",")])
            i = argv_used.index("--seeds") if "--seeds" in argv_used else None
            shown = argv_used[:i] + argv_used[i + 2:] if i is not None else argv_used
            args_json = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
            write_json(out / "seeds" / f"seed{seed}_{args.tag}.json", {"seed": seed, "provenance": meta, "argv": shown,
                                                           "args": args_json, "rows": rows, **extra})
    print(build_table(out))


if __name__ == "__main__":
    main()
