"""SVDQuant W4A4 (Li et al., ICLR 2025) beside RTN, SmoothQuant, SVD-only, W4A16 and W8A8: checks T2, T3, T4, T5
and T6 of docs/methods/svdquant.md ("Validation").

    OMP_NUM_THREADS=1 python benchmarks/svdquant.py --part t2      # synthetic outlier layer, m = n = 1024
    OMP_NUM_THREADS=1 python benchmarks/svdquant.py --part t3      # digits UNet end to end (+ LoRA, T5 sizes)
    OMP_NUM_THREADS=1 python benchmarks/svdquant.py --part shapes  # shapes UNet + tiny diffusers UNet2DModel
    OMP_NUM_THREADS=1 python benchmarks/svdquant.py --part diffusers  # the tiny diffusers UNet2DModel alone
    OMP_NUM_THREADS=1 python benchmarks/svdquant.py --part t6      # CPU kernel latency ratios (one run)
    python benchmarks/svdquant.py --part report                    # svdquant.md + PSNR-vs-bits plot

Each part writes ``benchmarks/results/svdquant/svdquant_<part>.json``; ``report`` merges them into ``svdquant.json``,
``svdquant.md`` and ``svdquant_psnr_bits.png`` there. W4A4 is **simulated** on CPU (no CPU W4A4 kernel exists);
W4A16 and W8A8 run PyTorch's real low-bit CPU kernels. Sampling rows report NFE; every variant uses the same noise,
labels and sampler (DDIM, 20 Karras steps, NFE 20 per sample), and the fp32 model is the reference.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
import steerdiff.quant as sq
from steerdiff.models.io import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

STEPS, SAMPLER = 20, "ddim"
NFE = STEPS  # ddim: one evaluation per step


def _dump(part: str, obj) -> None:
    path = write_json(results_dir("svdquant") / f"svdquant_{part}.json", {**obj, "meta": provenance()})
    print(f"wrote {path}", flush=True)


# ---------------------------------------------------------------------------------------------- T2


def outlier_problem(m, n, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, m, generator=g)
    x[:, :8] *= 30
    w = torch.randn(n, m, generator=g) / m**0.5
    w[:, 8:12] *= 10
    lin = torch.nn.Sequential(torch.nn.Linear(m, n))
    with torch.no_grad():
        lin[0].weight.copy_(w)
        lin[0].bias.zero_()
    return lin, x[: tokens // 2], x[tokens // 2:]


def part_t2(size: int) -> dict:
    lin, xc, xt = outlier_problem(size, size, 4096)
    with torch.no_grad():
        y = lin(xt)

    def err(q):
        with torch.no_grad():
            return float((q(xt) - y).pow(2).sum() / y.pow(2).sum())

    rows = []

    def run(label, fmt, method, **kw):
        t = time.perf_counter()
        # T2 validates the paper's method: the official search (the default "auto" is hybrid at 1024 wide)
        q = sq.quantize(lin, method, calib=xc, fmt=fmt, search="exact", **kw)
        info = sq.quant_info(q)
        spec = next(iter(info["layers"].values()))
        row = {"variant": label, "fmt": fmt, "method": method, "rank": kw.get("rank", 0), "rel_error": err(q),
               "bits_per_weight": sq.bits_per_weight(spec) if spec["type"] == "SVDQLayer" else None,
               "refine_iters": len(info["report"][0]["refine_errors"]) if info["report"] else 0,
               "alpha_beta": [info["report"][0].get("alpha"), info["report"][0].get("beta")] if info["report"]
               else None, "seconds": time.perf_counter() - t, **{k: v for k, v in kw.items() if k != "rank"}}
        rows.append(row)
        print(row, flush=True)

    for fmt in ("int4", "nvfp4"):
        fast = {} if fmt == "int4" else {"num_grids": 10, "svd": "lowrank"}
        run("naive W4A4 (RTN)", fmt, "rtn")
        run("SmoothQuant a=0.5", fmt, "smoothquant", alpha=0.5)
        run("SmoothQuant searched", fmt, "smoothquant", **fast)
        run("SVD-only r=32", fmt, "svd", rank=32, **fast)
        run("SVDQuant r=32", fmt, "svdquant", rank=32, **fast)
    # rank sweep with the fast preset: num_grids 10 (deepcompressor's fast.yaml) and torch.svd_lowrank (much faster
    # on a 1024-wide layer, with a small change of the error)
    for r in (0, 4, 8, 16):
        run(f"SVDQuant r={r} (fast)", "int4", "svdquant", rank=r, num_grids=10, svd="lowrank")
    run("SVDQuant r=32 (fast)", "int4", "svdquant", rank=32, num_grids=10, svd="lowrank")
    e = {r["variant"]: r["rel_error"] for r in rows if r["fmt"] == "int4"}
    en = {r["variant"]: r["rel_error"] for r in rows if r["fmt"] == "nvfp4"}
    sweep = [e[f"SVDQuant r={r} (fast)"] for r in (0, 4, 8, 16, 32)]
    checks = {
        "svdq <= 0.5 naive": e["SVDQuant r=32"] <= 0.5 * e["naive W4A4 (RTN)"],
        "svdq < smoothquant searched": e["SVDQuant r=32"] < e["SmoothQuant searched"],
        "svdq <= svd-only": e["SVDQuant r=32"] <= e["SVD-only r=32"],
        "e(r) non-increasing (5%)": all(b <= 1.05 * a for a, b in zip(sweep, sweep[1:], strict=False)),
        "nvfp4 svdq < naive nvfp4": en["SVDQuant r=32"] < en["naive W4A4 (RTN)"],
    }
    return {"m": size, "n": size, "tokens": 4096, "calib_tokens": 2048, "rows": rows, "checks": checks}


# ---------------------------------------------------------------------------------------------- T3


def _images(model, noise, cond, callback=None):
    with torch.no_grad():
        t = time.perf_counter()
        out, stats = sd.sample(model, noise, sd.sigmas.karras(STEPS, 0.002, 80.0), method=SAMPLER, cond=cond,
                               callback=callback, return_stats=True)
        return out, stats.nfe, time.perf_counter() - t


def _lpips_like(clf, a, b) -> float:
    """'digit-LPIPS' (T3): channel-normalised squared feature differences over the classifier's trunk."""
    total, ha, hb = 0.0, a.float(), b.float()
    with torch.no_grad():
        for layer in clf.trunk:
            ha, hb = layer(ha), layer(hb)
            if isinstance(layer, (torch.nn.ReLU, torch.nn.GELU, torch.nn.SiLU)):
                na = ha / (ha.norm(dim=1, keepdim=True) + 1e-10)
                nb = hb / (hb.norm(dim=1, keepdim=True) + 1e-10)
                total += float((na - nb).pow(2).sum(1).mean())
    return total


def _model_bits(q) -> tuple[float | None, float | None]:
    """(bits per weight over the quantized layers, quantized-layer bytes / fp32 bytes)."""
    bits = weights = fp32 = 0
    for spec in sq.quant_info(q)["layers"].values():
        n, cin, (kh, kw) = spec["out_channels"], spec["in_channels"], spec["kernel"]
        m = cin * kh * kw
        if spec["type"] == "SVDQLayer":
            b = 8 * sq.formula_bytes(spec) - 32 * n  # bias excluded (it stays fp32 everywhere)
        elif spec["type"] == "W4A16Layer":
            mp = m + spec["pad"]
            b = 4 * n * mp + 24 * n * mp // spec["group"]  # codes + fp16 scales + uint8 zeros
        else:
            b = 8 * n * m + 32 * n
        bits, weights, fp32 = bits + b, weights + n * m, fp32 + 32 * n * m
    return bits / weights, bits / fp32


def evaluate_variants(model, variants, n_fd, n_mse, seed, feat_clf, real_feats, calib, lora=False):
    from steerdiff.metrics.images import class_accuracy, classifier_features, frechet_distance

    k = model.num_classes[0]
    noise = sd.randn((n_fd, *model.sample_shape), seeds=seed)
    cond = torch.arange(n_fd) % k
    steps = []

    def keep(d):
        steps.append((d["x"][:n_mse].clone(), torch.full((n_mse,), float(d["sigma"]))))

    models = {}
    ref, nfe, wall = _images(model, noise, cond, callback=keep)
    ref = ref.clamp(-1, 1)
    ref_feats = classifier_features(feat_clf, ref)
    rows = [{"variant": "fp32", "method": "fp32", "nfe": nfe, "wall_s": wall, "bits_per_weight": 32.0,
             "fd": frechet_distance(real_feats, ref_feats) if real_feats is not None else 0.0,
             "class_acc": class_accuracy(feat_clf, ref, cond) if feat_clf.classes[0] == k else None}]
    print(rows[-1], flush=True)
    for label, method, kw in variants:
        t, c = time.perf_counter(), time.process_time()
        q = sq.quantize(model, method, calib=calib, **kw)
        calib_s, calib_cpu_s = time.perf_counter() - t, time.process_time() - c
        out, nfe, wall = _images(q, noise, cond)
        out = out.clamp(-1, 1)
        mse = float(((out[:n_mse] - ref[:n_mse]) / 2).pow(2).mean())  # images in [0, 1]
        with torch.no_grad():
            eps = [float((((x - q(x, s, cond[:n_mse])) - (x - model(x, s, cond[:n_mse]))) / s[0]).pow(2).mean())
                   for x, s in steps]
        feats = classifier_features(feat_clf, out)
        bits, ratio = _model_bits(q)
        models[label] = q
        row = {"variant": label, "method": method,
               "fmt": kw.get("fmt", "int4") if method in sq.api.W4A4_METHODS else None, "rank": kw.get("rank"),
               "nfe": nfe, "wall_s": wall, "calib_s": calib_s, "calib_cpu_s": calib_cpu_s, "mse": mse,
               "psnr": 10 * math.log10(1 / mse),
               "eps_mse": sum(eps) / len(eps), "lpips_digit": _lpips_like(feat_clf, out[:n_mse], ref[:n_mse]),
               "fd": frechet_distance(real_feats if real_feats is not None else ref_feats, feats),
               "class_acc": class_accuracy(feat_clf, out, cond) if feat_clf.classes[0] == k else None,
               "bits_per_weight": bits, "layer_bytes_vs_fp32": ratio}
        rows.append(row)
        print({k2: (round(v, 5) if isinstance(v, float) else v) for k2, v in row.items()}, flush=True)
    return rows, models


def t3_checks(rows, rank_label="SVDQuant r=8") -> dict:
    r = {row["variant"]: row for row in rows}
    sv, nv, sq_, fp = r[rank_label], r["naive W4A4 (RTN)"], r["SmoothQuant searched"], r["fp32"]
    return {"svdq mse <= 0.5 naive": sv["mse"] <= 0.5 * nv["mse"],
            "svdq mse < smoothquant searched": sv["mse"] < sq_["mse"],
            "svdq fd <= naive fd": sv["fd"] <= nv["fd"],
            "svdq fd <= 1.25 fd(fp32) + 0.05 fd(naive) (soft)": sv["fd"] <= 1.25 * fp["fd"] + 0.05 * nv["fd"],
            "psnr(w8a8) >= psnr(svdq)": r["W8A8"]["psnr"] >= sv["psnr"]}


VARIANTS = [
    ("naive W4A4 (RTN)", "rtn", {}),
    ("SmoothQuant a=0.5", "smoothquant", {"alpha": 0.5}),
    ("SmoothQuant searched", "smoothquant", {}),
    ("SVD-only r=8", "svd", {"rank": 8}),
    *[(f"SVDQuant r={r}", "svdquant", {"rank": r}) for r in (0, 4, 6, 8, 16, 32)],
    ("W4A16 (RTN asym g64, CPU int4 kernel)", "w4a16", {}),
    ("W8A8", "w8a8", {}),
    ("NVFP4 naive W4A4", "rtn", {"fmt": "nvfp4"}),
    ("NVFP4 SVDQuant r=8", "svdquant", {"fmt": "nvfp4", "rank": 8}),
]


def part_t3(n_fd: int, n_mse: int) -> dict:
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features

    model = load("digits").requires_grad_(False)
    clf = load("digits_classifier")
    real = classifier_features(clf, load_digits("test")[0])
    t = time.perf_counter()
    calib = sq.trajectory_calibration(model)  # 128 calls from 32 CFG(2) heun-20 trajectories ("Calibration data")
    calib_collect_s = time.perf_counter() - t
    rows, models = evaluate_variants(model, VARIANTS, n_fd, n_mse, 0, clf, real, calib)
    out = {"model": "digits (EDMPrecond UNet, shipped)", "sampler": SAMPLER, "steps": STEPS, "n_fd": n_fd,
           "n_mse": n_mse, "calibration": {"calls": 128, "trajectories": 32, "sampler": "heun 20 + CFG 2",
                                            "collect_s": calib_collect_s}, "rows": rows, "checks": t3_checks(rows)}
    # r = 6 is the largest rank whose quantized layers fit T5's 0.20 x fp32 on this model's 32/64-channel convs
    out["checks_r6"] = t3_checks(rows, "SVDQuant r=6")
    out["t5"] = part_t5(model, models["SVDQuant r=8"])
    out["t5_r6"] = part_t5(model, models["SVDQuant r=6"])
    out["lora"] = part_lora(model, models["SVDQuant r=8"])
    return out


def part_t3search(n_fd: int, n_mse: int, searches: tuple[str, ...] = ("exact", "fast")) -> dict:
    """T3's digits model, SVDQuant (``svd="fast"``) with ``search="exact"`` (every candidate of the 39-grid scored on
    every calibration row, the official search) beside ``search="fast"`` (the default: subsampled rows, coarse-to-fine
    grid)."""
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features

    model = load("digits").requires_grad_(False)
    clf = load("digits_classifier")
    real = classifier_features(clf, load_digits("test")[0])
    calib = sq.trajectory_calibration(model)
    variants = [(f"{'NVFP4 ' if fmt == 'nvfp4' else ''}SVDQuant r={r} search={search}", "svdquant",
                 {"rank": r, "search": search, **({"fmt": fmt} if fmt == "nvfp4" else {})})
                for fmt, r in (("int4", 8), ("nvfp4", 8), ("int4", 32)) for search in searches]
    rows, models = evaluate_variants(model, [*variants, ("naive W4A4 (RTN)", "rtn", {})], n_fd, n_mse, 0, clf, real,
                                     calib)
    for row in rows:
        q = models.get(row["variant"])
        if q is not None:
            row["calib_rel_error_mean"] = sum(r["rel_error"] for r in sq.quant_info(q)["report"]) / len(
                sq.quant_info(q)["report"])
    from steerdiff.quant.calibrate import SVD_SEED

    return {"model": "digits (EDMPrecond UNet, shipped)", "sampler": SAMPLER, "steps": STEPS, "n_fd": n_fd,
            "n_mse": n_mse, "threads": torch.get_num_threads(), "svd_seed": SVD_SEED, "rows": rows}


def part_t3svd(n_fd: int, n_mse: int) -> dict:
    """T3's digits model, SVDQuant with ``svd="full"`` (exact float64 SVDs) beside ``svd="fast"`` (the default)."""
    from steerdiff.data.digits import load_digits
    from steerdiff.metrics.images import classifier_features

    model = load("digits").requires_grad_(False)
    clf = load("digits_classifier")
    real = classifier_features(clf, load_digits("test")[0])
    calib = sq.trajectory_calibration(model)
    variants = [(f"{'NVFP4 ' if fmt == 'nvfp4' else ''}SVDQuant r={r} svd={svd}", "svdquant",
                 {"rank": r, "svd": svd, **({"fmt": fmt} if fmt == "nvfp4" else {})})
                for fmt, r in (("int4", 8), ("nvfp4", 8), ("int4", 32)) for svd in ("full", "fast")]
    rows, _ = evaluate_variants(model, [*variants, ("naive W4A4 (RTN)", "rtn", {})], n_fd, n_mse, 0, clf, real,
                                calib)
    return {"model": "digits (EDMPrecond UNet, shipped)", "sampler": SAMPLER, "steps": STEPS, "n_fd": n_fd,
            "n_mse": n_mse, "rows": rows}


def part_t5(model, q) -> dict:
    """Serialized bytes vs the T5 formula, per layer and whole model (digits, SVDQuant r=8)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = sq.save(q, Path(d) / "q")
        sizes = sq.tensor_bytes(path)
        file_bytes = (path / "model.safetensors").stat().st_size
    layers, eq = [], True
    for p, spec in sq.quant_info(q)["layers"].items():
        stored = sum(v for k, v in sizes.items() if k.startswith(p + "."))
        n, cin, (kh, kw) = spec["out_channels"], spec["in_channels"], spec["kernel"]
        fp32 = 4 * n * cin * kh * kw
        eq &= stored == sq.formula_bytes(spec)
        layers.append({"layer": p, "shape": [n, cin, kh, kw], "rank": spec["rank"], "pad": spec["pad"],
                       "bytes": stored, "formula": sq.formula_bytes(spec), "vs_fp32": stored / (fp32 + 4 * n),
                       "vs_fp16": stored / (fp32 / 2 + 2 * n), "bits_per_weight": sq.bits_per_weight(spec)})
    fp32_total = sum(v.numel() * 4 for v in model.state_dict().values())
    q_bytes = sum(r["bytes"] for r in layers)
    q_fp32 = sum(4 * r["shape"][0] * (math.prod(r["shape"][1:]) + 1) for r in layers)  # weights + bias
    extras = sum(4 * r["shape"][0] + (2 * r["shape"][1] if spec.get("smooth") else 0)  # fp32 bias, fp16 lambda
                 for r, spec in zip(layers, sq.quant_info(q)["layers"].values(), strict=True))
    return {"layers": layers, "all_equal_formula": eq, "model_bytes": sum(sizes.values()),
            "quantized_layers_vs_fp32": q_bytes / q_fp32,
            "quantized_layers_vs_fp32_without_lambda_bias": (q_bytes - extras) / q_fp32,
            "file_bytes": file_bytes, "fp32_model_bytes": fp32_total,
            "model_vs_fp32": sum(sizes.values()) / fp32_total}


def part_lora(model, q) -> dict:
    """T4 on digits: random rank-4 LoRA on every quantized conv; PSNR vs fp32+LoRA within 0.5 dB of no-LoRA."""
    import copy

    q = copy.deepcopy(q)
    g = torch.Generator().manual_seed(7)
    fpl, loras = copy.deepcopy(model), {}
    for p in sq.quant_info(q)["layers"]:
        conv = fpl.get_submodule(p)
        n, cin, kh, kw = conv.weight.shape
        scale = conv.weight.std().item()
        A = torch.randn(4, cin, kh, kw, generator=g) * 0.5 / math.sqrt(cin * kh * kw) ** 0.5
        B = torch.randn(n, 4, generator=g) * scale
        loras[p] = (A, B)
        with torch.no_grad():
            conv.weight += (B @ A.reshape(4, -1)).reshape(conv.weight.shape)
    codes = {p: q.get_submodule(p).codes.clone() for p in loras}
    noise = sd.randn((256, 1, 8, 8), seeds=0)
    cond = torch.arange(256) % 10

    def psnr(a, b):
        return 10 * math.log10(1 / float(((a.clamp(-1, 1) - b.clamp(-1, 1)) / 2).pow(2).mean()))

    fp0, _, _ = _images(model, noise, cond)
    q0, _, _ = _images(q, noise, cond)
    sq.merge_loras(q, loras, alpha=1.0)
    identical = all(torch.equal(codes[p], q.get_submodule(p).codes) for p in loras)
    fp1, _, _ = _images(fpl, noise, cond)
    q1, _, _ = _images(q, noise, cond)
    lora_effect = psnr(fp1, fp0)
    return {"nfe": NFE, "psnr_no_lora": psnr(q0, fp0), "psnr_lora": psnr(q1, fp1), "lora_effect_psnr": lora_effect,
            "codes_identical": identical, "within_0.5dB": abs(psnr(q1, fp1) - psnr(q0, fp0)) <= 0.5}


# ---------------------------------------------------------------------------------------------- shapes + diffusers


def part_shapes(n: int) -> dict:
    clf = load("shapes_classifier")
    model = load("shapes").requires_grad_(False)
    calib = sq.trajectory_calibration(model)
    variants = [v for v in VARIANTS if v[0] != "SmoothQuant a=0.5"]  # the digits table, rank sweep 0-32 included
    rows, _ = evaluate_variants(model, variants, n, min(n, 256), 0, clf, None, calib)
    return {"model": "shapes (EDMPrecond UNet 12x12x3, shipped); fd = FD to the fp32 model's samples",
            "rows": rows, "diffusers": part_diffusers()}


def part_diffusers() -> dict:
    """A tiny random-weight diffusers UNet2DModel (ResNet + self-attention) through from_diffusers."""
    import diffusers

    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=16).eval()
    D = sd.models.from_diffusers(unet, diffusers.DDPMScheduler(num_train_timesteps=1000))
    calib = sq.trajectory_calibration(D)
    noise = sd.randn((64, 1, 8, 8), seeds=0)
    sig = sd.sigmas.karras(STEPS, 0.002, 80.0)
    with torch.no_grad():
        ref = sd.sample(D, noise, sig, method=SAMPLER)
        x, s = calib[0][0], calib[0][1]
        dref = D(x, s)
    rows = []
    for label, method, kw in [("naive W4A4 (RTN)", "rtn", {}), ("SmoothQuant searched", "smoothquant", {}),
                              ("SVDQuant r=8", "svdquant", {"rank": 8}), ("W4A16", "w4a16", {}),
                              ("W8A8", "w8a8", {}), ("NVFP4 SVDQuant r=8", "svdquant", {"fmt": "nvfp4", "rank": 8})]:
        q = sq.quantize(D, method, calib=calib, **kw)
        with torch.no_grad():
            out = sd.sample(q, noise, sig, method=SAMPLER)
            dq = q(x, s)
        rows.append({"variant": label, "nfe": NFE, "sample_rel_mse": float((out - ref).pow(2).sum() / ref.pow(2).sum()),
                     "denoiser_rel_mse_on_calib": float((dq - dref).pow(2).sum() / dref.pow(2).sum()),
                     "bits_per_weight": _model_bits(q)[0], "layers": len(sq.quant_info(q)["layers"])})
        print(rows[-1], flush=True)
    return {"model": "diffusers UNet2DModel (32, 64) + AttnDown/Up, random weights, DDPM betas",
            "rows": rows}


# ---------------------------------------------------------------------------------------------- T6


def part_t6() -> dict:
    from steerdiff.quant.calibrate import svd_r
    from steerdiff.quant.layers import build_svdq_layer

    def timeit(f, reps):
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2]

    rows = []
    for m, T, r, reps in ((128, 256, 8, 50), (3072, 1024, 32, 5)):
        torch.manual_seed(0)
        lin = torch.nn.Linear(m, m)
        x = torch.randn(T, m)
        ld, lu = svd_r(lin.weight.detach(), r, "lowrank")
        layers = {
            "fp32 (F.linear)": lin,
            "W4A16 int4pack_mm_for_cpu": sq.W4A16Layer.from_float(lin),
            "W8A8 torch._int_mm": sq.W8A8Layer.from_float(lin),
            "W4A4 RTN (simulated)": build_svdq_layer(lin, wfmt="int4", afmt="int4", rank=0, smooth=None,
                                                     lora_down=None, lora_up=None),
            f"SVDQ W4A4 r={r} (simulated)": build_svdq_layer(lin, wfmt="int4", afmt="int4", rank=r,
                                                             smooth=torch.ones(m), lora_down=ld.float(),
                                                             lora_up=lu.float()),
        }
        times = {}
        with torch.no_grad():
            for _ in range(2):  # interleaved passes; the second is kept (this machine is shared and noisy)
                for name, layer in layers.items():
                    times[name] = timeit(lambda layer=layer, x=x: layer(x), reps)
        for name, t in times.items():
            rows.append({"m": m, "n": m, "T": T, "layer": name, "median_ms": 1e3 * t,
                         "ratio_vs_fp32": t / times["fp32 (F.linear)"]})
            print(rows[-1], flush=True)
        rows.append({"m": m, "n": m, "T": T, "layer": f"low-rank extra FLOPs r={r}",
                     "flop_fraction": r * (2 * m) / (m * m)})
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "kernels": sq.kernel_support(),
            "rows": rows}


# ---------------------------------------------------------------------------------------------- SD-size pair


def sd_pair(tokens: int = 512, seed: int = 0):
    """Two SD-size layers (1280 -> 5120 -> 1280, GELU between) with a few outlier input channels and weight
    columns (as T2), and ``tokens`` calibration rows plus as many held-out rows."""
    g = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(1280, 5120), torch.nn.GELU(), torch.nn.Linear(5120, 1280))
    with torch.no_grad():
        for lin in (net[0], net[2]):
            m = lin.in_features
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / m**0.5)
            lin.weight[:, 8:12] *= 10
            lin.bias.zero_()
    x = torch.randn(2 * tokens, 1280, generator=g)
    x[:, :8] *= 30
    return net, x[:tokens], x[tokens:]


def part_pair(svds: list[str], tokens: int = 512, methods=("rtn", "svdquant"), searches=("fast",), **opts) -> dict:
    """Calibration time and output error of the SD-size pair for each ``svd`` mode (the issue-36 measurement)."""
    net, xc, xt = sd_pair(tokens)
    with torch.no_grad():
        y = net(xt)
    rows = []
    for method in methods:
        for svd, search in ([(v, m) for v in svds for m in searches] if method != "rtn" else [("-", "-")]):
            kw = {} if svd == "-" else {"svd": svd, "search": search, **opts}
            t, c = time.perf_counter(), time.process_time()
            q = sq.quantize(net, method, calib=xc, **kw)
            secs, cpu = time.perf_counter() - t, time.process_time() - c
            with torch.no_grad():
                e = float((q(xt) - y).pow(2).sum() / y.pow(2).sum())
            rep = sq.quant_info(q)["report"]
            rows.append({"method": method, "svd": svd, "search": search, "seconds": secs, "cpu_s": cpu,
                         "rel_error_heldout": e,
                         "rel_error_calib": [r["rel_error"] for r in rep],
                         "refine_iters": [len(r["refine_errors"]) for r in rep],
                         "alpha_beta": [[r.get("alpha"), r.get("beta")] for r in rep]})
            print(rows[-1], flush=True)
    return {"layers": "Linear(1280, 5120), GELU, Linear(5120, 1280)", "calib_tokens": tokens, "options": opts,
            "threads": torch.get_num_threads(), "rows": rows}


# ---------------------------------------------------------------------------------------------- SD 1.5-size UNet

SD15_UNET = dict(  # diffusers' published SD 1.5 UNet config (runwayml/stable-diffusion-v1-5, unet/config.json)
    sample_size=64, in_channels=4, out_channels=4, center_input_sample=False, flip_sin_to_cos=True, freq_shift=0,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(320, 640, 1280, 1280), layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1,
    act_fn="silu", norm_num_groups=32, norm_eps=1e-5, cross_attention_dim=768, attention_head_dim=8)
TINY_UNET = dict(SD15_UNET, sample_size=16, block_out_channels=(32, 64, 64, 64), norm_num_groups=8,
                 cross_attention_dim=32, attention_head_dim=4)


def _eval_gflop(grp, modules, x) -> float:
    """FLOPs of one evaluation of a group's candidate (the quantized GEMM over its calibration rows, plus the
    attention core for q/k/v groups), in GFLOP: the per-candidate cost that no SVD speed-up removes."""
    k, n = modules[0].weight[0].numel(), sum(m.weight.shape[0] for m in modules)
    rows = x.shape[0] * (x.shape[2] * x.shape[3] if x.ndim == 4 else (x.shape[1] if x.ndim == 3 else 1))
    f = 2 * rows * k * n
    if grp.eval_fn is not None and x.ndim == 3:  # softmax(q k^T) v over each sample's tokens
        f += 4 * x.shape[0] * x.shape[1] ** 2 * modules[0].weight.shape[0]
    return f / 1e9


def part_unet(tiny: bool, svds: list[str], representative: bool, max_tokens: int = 4096,
              only: list[str] | None = None, device: str = "cpu", search: str = "fast") -> dict:
    """Calibration time of an SD 1.5-size UNet2DConditionModel (random weights, published config, no download).

    The UNet is built on the meta device and one forward there (batch 1, 64x64 latents, 77 text tokens) records the
    input shape of every group; each group's layers are then materialised on ``device`` with PyTorch's default
    initialisation when their turn comes (and dropped after), so the 3.4 GB model never sits in memory at once.
    Calibration inputs have the default size: ``max_tokens`` rows (whole samples for convs and attention, as
    ``subsample`` keeps them from 128 calls), Gaussian, through SiLU for the shifted (post-SiLU) inputs. The time
    is the calibration proper (smoothing search + refinement, what ``sq.quantize`` runs per group after recording
    the inputs, which costs 128 fp forwards). ``representative``: one group per distinct (input shape, weight
    shapes) is timed and counted for each group of that signature; ``only``: time these groups and scale their
    seconds per evaluation-GFLOP (:func:`_eval_gflop`) to all groups (an estimate, reported as such).
    """
    import diffusers

    from steerdiff.quant.calibrate import GroupCalibrator, SearchConfig
    from steerdiff.quant.layers import layer_geometry
    from steerdiff.quant.mapping import select_groups
    from steerdiff.quant.w4a4 import default_rank

    with torch.device("meta"):
        unet = diffusers.UNet2DConditionModel(**(TINY_UNET if tiny else SD15_UNET)).eval().requires_grad_(False)
    cfg = unet.config
    params = sum(p.numel() for p in unet.parameters())
    groups = select_groups(unet)
    shapes: dict[str, tuple] = {}
    def record(path):
        def hook(_m, args):
            shapes.setdefault(path, tuple(args[0].shape))
        return hook

    hooks = [unet.get_submodule(g.paths[0]).register_forward_pre_hook(record(g.paths[0])) for g in groups]
    with torch.device("meta"), torch.no_grad():
        unet(torch.randn(1, cfg.in_channels, cfg.sample_size, cfg.sample_size), torch.tensor([500.0]),
             encoder_hidden_states=torch.randn(1, 77, cfg.cross_attention_dim))
    for h in hooks:
        h.remove()
    print(f"unet: {params / 1e6:.1f}M params, {len(groups)} groups", flush=True)
    gen = torch.Generator(device=device).manual_seed(1)

    def calib_input(grp, modules):
        shape, conv = shapes[grp.paths[0]], layer_geometry(modules[0])["kind"] == "conv2d"
        if conv:  # whole maps [keep, C, H, W]
            keep = max(1, max_tokens // (shape[2] * shape[3]))
            full = (keep, *shape[1:])
        elif not grp.tokens:  # attention: whole samples [keep, L, C]
            full = (max(1, max_tokens // shape[1]), *shape[1:])
        else:  # token rows [max_tokens, C]
            full = (max_tokens, shape[-1])
        x = torch.randn(full, generator=gen, device=device)
        return torch.nn.functional.silu(x) if grp.shift else x

    def materialise(modules):
        torch.manual_seed(0)
        for m in modules:
            m.to_empty(device=device)
            m.reset_parameters()

    rows, seen = [], {}
    gflop = {}
    for grp in groups:
        modules = [unet.get_submodule(p) for p in grp.paths]
        shape = shapes[grp.paths[0]]
        conv = layer_geometry(modules[0])["kind"] == "conv2d"
        if conv:
            x = torch.empty(max(1, max_tokens // (shape[2] * shape[3])), *shape[1:], device="meta")
        elif not grp.tokens:
            x = torch.empty(max(1, max_tokens // shape[1]), *shape[1:], device="meta")
        else:
            x = torch.empty(max_tokens, shape[-1], device="meta")
        gflop[grp.name] = _eval_gflop(grp, modules, x)
    for svd in svds:
        for grp in groups:
            if only is not None and grp.name not in only:
                continue
            modules = [unet.get_submodule(p) for p in grp.paths]
            sig = (shapes[grp.paths[0]], tuple(tuple(m.weight.shape) for m in modules), grp.tokens)
            if representative and (svd, sig) in seen:
                rows.append({**seen[(svd, sig)], "group": grp.name, "measured": False})
                continue
            materialise(modules)
            x = calib_input(grp, modules)
            cfg_ = SearchConfig(rank=default_rank(modules), shift=True, svd=svd, search=search)
            if device != "cpu":
                torch.cuda.synchronize()
            t, c = time.perf_counter(), time.process_time()
            _, info = GroupCalibrator(grp, modules, x, cfg_).run()
            if device != "cpu":
                torch.cuda.synchronize()
            row = {"svd": svd, "search": search, "search_mode": info["search_mode"], "group": grp.name,
                   "kind": layer_geometry(modules[0])["kind"],
                   "weights": [list(m.weight.shape) for m in modules], "rows": list(x.shape), "rank": cfg_.rank,
                   "seconds": time.perf_counter() - t, "cpu_s": time.process_time() - c,
                   "refine_iters": len(info["refine_errors"]), "rel_error": info["rel_error"],
                   "eval_gflop": gflop[grp.name], "measured": True}
            for m in modules:
                m.to("meta")
            seen[(svd, sig)] = row
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    totals = {}
    for svd in svds:
        mine = [r for r in rows if r["svd"] == svd]
        meas = [r for r in mine if r["measured"]]
        rate = sum(r["seconds"] for r in meas) / max(sum(r["eval_gflop"] for r in meas), 1e-12)
        rate_cpu = sum(r["cpu_s"] for r in meas) / max(sum(r["eval_gflop"] for r in meas), 1e-12)
        totals[svd] = {"groups": len(groups), "groups_timed": len(meas), "timed_s": sum(r["seconds"] for r in meas),
                       "timed_cpu_s": sum(r["cpu_s"] for r in meas),
                       "total_s": sum(r["seconds"] for r in mine) if only is None else None,
                       "estimated_total_s": rate * sum(gflop.values()),
                       "estimated_total_cpu_s": rate_cpu * sum(gflop.values()),
                       "max_group_s": max((r["seconds"] for r in mine), default=None),
                       "median_group_s": sorted(r["seconds"] for r in mine)[len(mine) // 2] if mine else None}
        print(svd, totals[svd], flush=True)
    return {"model": "tiny UNet2DConditionModel" if tiny else "SD 1.5 UNet2DConditionModel (published config)",
            "params": params, "groups": len(groups), "max_tokens": max_tokens, "device": device, "search": search,
            "threads": torch.get_num_threads(), "representative": representative, "only": only,
            "eval_gflop_all_groups": sum(gflop.values()), "eval_gflop": gflop, "rows": rows, "totals": totals}


SHIPPED_QUANTIZABLE = ("digits", "shapes", "digits_flow", "digits_weak", "shapes_weak", "digits_mlp", "digits_styles",
                       "digits_geometry", "digits_styles_dit")


def _meta_sd_unet_inputs(config: dict, max_tokens: int):
    """An SD-size UNet2DConditionModel built on the meta device (no memory, no download), its groups and each
    group's calibration input as a meta tensor of the size ``quantize`` gives it (``max_tokens`` rows: whole maps
    of convs, whole samples of attention, token rows otherwise), from one meta forward (batch 1, 77 text tokens)."""
    import diffusers

    from steerdiff.quant.layers import layer_geometry
    from steerdiff.quant.mapping import select_groups

    with torch.device("meta"):
        unet = diffusers.UNet2DConditionModel(**config).eval().requires_grad_(False)
    groups = select_groups(unet)
    shapes: dict[str, tuple] = {}
    hooks = [unet.get_submodule(g.paths[0]).register_forward_pre_hook(
        lambda _m, args, p=g.paths[0]: None if shapes.setdefault(p, tuple(args[0].shape)) else None) for g in groups]
    cfg = unet.config
    with torch.device("meta"), torch.no_grad():
        unet(torch.randn(1, cfg.in_channels, cfg.sample_size, cfg.sample_size), torch.tensor([500.0]),
             encoder_hidden_states=torch.randn(1, 77, cfg.cross_attention_dim))
    for h in hooks:
        h.remove()
    inputs = {}
    for g in groups:
        shape = shapes[g.paths[0]]
        if layer_geometry(unet.get_submodule(g.paths[0]))["kind"] == "conv2d":
            full = (max(1, max_tokens // (shape[2] * shape[3])), *shape[1:])
        elif not g.tokens:
            full = (max(1, max_tokens // shape[1]), *shape[1:])
        else:
            full = (max_tokens, shape[-1])
        inputs[g.name] = torch.empty(full, device="meta")
    return unet, groups, inputs


def _resolved(root, groups, inputs: dict) -> list[dict]:
    from steerdiff.quant.calibrate import calibration_rows, resolve_search

    rows = []
    for g in groups:
        modules = [root.get_submodule(p) for p in g.paths]
        x = inputs[g.name]
        n, k = sum(m.weight.shape[0] for m in modules), modules[0].weight[0].numel()
        rows.append({"group": g.name, "n": n, "K": k, "rows": calibration_rows(x),
                     "search": resolve_search("auto", modules, x)})
    return rows


def part_auto(max_tokens: int = 4096) -> dict:
    """Dry run of ``search="auto"`` (no calibration): the mode each group of the SD 1.5-size UNet (meta device) and
    of every shipped model the CLI quantizes would get at the default calibration size. Shipped models: one forward
    of 128 inputs (the default ``num_samples`` calibration calls) records each group's input shape, cut to
    ``max_tokens`` rows as ``quantize`` does (:func:`steerdiff.quant.collect.subsample`); the shapes pipeline's UNet
    the same way at its 8x8 latents."""
    import diffusers

    from steerdiff.quant.collect import subsample
    from steerdiff.quant.layers import layer_geometry
    from steerdiff.quant.mapping import denoiser_root, select_groups

    t = time.process_time()
    unet, groups, inputs = _meta_sd_unet_inputs(SD15_UNET, max_tokens)
    sd_rows = _resolved(unet, groups, inputs)
    out = {"max_tokens": max_tokens, "sd15_unet": {"groups": len(groups), "rows": sd_rows,
                                                  "cpu_s": time.process_time() - t}}

    def shipped(root, run) -> list[dict]:
        gs = select_groups(root)
        store: dict[str, torch.Tensor] = {}
        hooks = [root.get_submodule(g.paths[0]).register_forward_pre_hook(
            lambda _m, args, p=g.paths[0]: None if store.setdefault(p, args[0]) is None else None) for g in gs]
        with torch.no_grad():
            run()
        for h in hooks:
            h.remove()
        ins = {g.name: subsample(store[g.paths[0]], max_tokens, g.tokens,
                                 conv=layer_geometry(root.get_submodule(g.paths[0]))["kind"] == "conv2d")
               for g in gs}
        return _resolved(root, gs, ins)

    models = {}
    for name in SHIPPED_QUANTIZABLE:
        m = load(name).requires_grad_(False)
        nc = tuple(getattr(m, "num_classes", ()) or ())
        x, sig = torch.randn(128, *m.sample_shape), torch.rand(128) * 10
        c = torch.zeros(128, dtype=torch.long) if len(nc) == 1 else None
        models[name] = shipped(denoiser_root(m), lambda m=m, x=x, sig=sig, c=c: m(x, sig, c))
    pipe_unet = diffusers.UNet2DConditionModel.from_pretrained(
        str(Path(sd.__file__).parent / "assets" / "shapes_pipeline" / "unet")).eval().requires_grad_(False)
    pc = pipe_unet.config
    models["shapes_pipeline (its UNet)"] = shipped(pipe_unet, lambda: pipe_unet(
        torch.randn(128, pc.in_channels, pc.sample_size, pc.sample_size), torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(128, 8, pc.cross_attention_dim)))
    out["shipped"] = {k: {"groups": len(v), "rows": v} for k, v in models.items()}
    summary = {"SD 1.5 UNet": sd_rows, **models}
    out["summary"] = {k: {"groups": len(v), "hybrid": sum(r["search"] == "hybrid" for r in v),
                          "exact": sum(r["search"] == "exact" for r in v),
                          "min_width": min(min(r["n"], r["K"]) for r in v),
                          "max_width": max(min(r["n"], r["K"]) for r in v),
                          "max_rows": max(r["rows"] for r in v)} for k, v in summary.items()}
    for k, v in out["summary"].items():
        print(k, v, flush=True)
    return out


def part_auto_times(repeats: int = 1) -> dict:
    """Per-group calibration CPU seconds of ``search="exact"`` and ``search="hybrid"`` on random groups from the
    narrow layers of the shipped models to the narrowest of SD 1.5 (one thread, 4096 calibration rows as the
    default ``max_tokens`` gives them, rank ``default_rank``): the measurements behind ``search="auto"``'s width
    rule (docs/methods/svdquant.md, "Fast search"). Modes alternate per group (exact, hybrid, exact, ...)."""
    from steerdiff.quant.calibrate import GroupCalibrator, SearchConfig
    from steerdiff.quant.mapping import SHIFT, Group
    from steerdiff.quant.w4a4 import default_rank

    cases = [  # (label, layer, calibration rows shape, shifted input)
        ("digits / shapes ResBlock conv, 64 ch, 8x8 maps", lambda: torch.nn.Conv2d(64, 64, 3, padding=1),
         (64, 64, 8, 8), True),
        ("shapes_pipeline conv, 128 -> 128 ch, 16x16 maps", lambda: torch.nn.Conv2d(128, 128, 3, padding=1),
         (16, 128, 16, 16), True),
        ("linear 128 x 128", lambda: torch.nn.Linear(128, 128), (4096, 128), False),
        ("linear 256 x 256", lambda: torch.nn.Linear(256, 256), (4096, 256), False),
        ("linear 320 x 320 (SD 1.5 to_out, narrowest SD group)", lambda: torch.nn.Linear(320, 320),
         (4096, 320), False),
        ("linear 512 x 512", lambda: torch.nn.Linear(512, 512), (4096, 512), False),
    ]
    rows = []
    for label, make, shape, shifted in cases:
        torch.manual_seed(0)
        layer = make().requires_grad_(False)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        grp = Group("g", ["g"], shift=SHIFT["silu"] if shifted else 0.0)
        if shifted:
            x = torch.nn.functional.silu(x)
        for rep in range(repeats):
            for search in ("exact", "hybrid"):
                cfg = SearchConfig(rank=default_rank([layer]), shift=True, search=search)
                t, c = time.perf_counter(), time.process_time()
                _, info = GroupCalibrator(grp, [layer], x, cfg).run()
                row = {"case": label, "search": search, "repeat": rep, "weight": list(layer.weight.shape),
                       "rows": list(x.shape), "rank": cfg.rank, "seconds": time.perf_counter() - t,
                       "cpu_s": time.process_time() - c, "rel_error": info["rel_error"],
                       "refine_iters": len(info["refine_errors"])}
                rows.append(row)
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return {"threads": torch.get_num_threads(), "rows": rows}


# ---------------------------------------------------------------------------------------------- report


def _fmt(v):
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(rows, cols) -> list[str]:
    return [markdown_table([c for c, _ in cols], [[_fmt(r.get(k)) for _, k in cols] for r in rows])]


def _run(part: dict) -> list[str]:
    return [f"Run: {provenance_line(part['meta'])}", ""] if "meta" in part else []


def write_report(results: Path) -> None:
    """Merge the part JSONs into ``svdquant.json``, ``svdquant.md`` and ``svdquant_psnr_bits.png``."""
    parts = {p: json.loads((results / f"svdquant_{p}.json").read_text())
             for p in ("t2", "t3", "shapes", "diffusers", "t6") if (results / f"svdquant_{p}.json").is_file()}
    write_json(results / "svdquant.json", parts)
    md = ["# SVDQuant W4A4 vs RTN, SmoothQuant, SVD-only, W4A16, W8A8 (checks T2-T6 of docs/methods/svdquant.md)", "",
          "W4A4 is **simulated** on CPU (fake quantization in float32: no CPU kernel multiplies 4-bit activations "
          "by 4-bit weights). W4A16 and W8A8 run PyTorch's real CPU kernels (`_weight_int4pack_mm_for_cpu`, "
          "`torch._int_mm`). Storage is real (packed 4-bit codes in safetensors). One thread, shared machine.", ""]
    if "t2" in parts:
        t2 = parts["t2"]
        md += [f"## T2 synthetic outlier layer (m = n = {t2['m']}, {t2['tokens']} tokens, calibrate on the first "
               f"{t2['calib_tokens']}; e = ||Y_q - Y||^2 / ||Y||^2 on the rest; no sampling, NFE n/a)", "", *_run(t2)]
        md += _table(t2["rows"], [("variant", "variant"), ("fmt", "fmt"), ("rank", "rank"), ("e", "rel_error"),
                                  ("bits/weight", "bits_per_weight"), ("(alpha, beta)", "alpha_beta"),
                                  ("refine iters", "refine_iters"), ("seconds", "seconds")])
        md += ["", "Checks: " + ", ".join(f"{k}: **{v}**" for k, v in t2["checks"].items()), ""]
    cols = [("variant", "variant"), ("NFE", "nfe"), ("bits/weight", "bits_per_weight"), ("MSE", "mse"),
            ("PSNR dB", "psnr"), ("eps-MSE/step", "eps_mse"), ("digit-LPIPS", "lpips_digit"), ("FD", "fd"),
            ("class acc", "class_acc"), ("calib s", "calib_s"), ("sample s", "wall_s")]
    if "t3" in parts:
        t3 = parts["t3"]
        md += [f"## T3 digits UNet end to end ({t3['sampler']} {t3['steps']} steps; MSE/PSNR/LPIPS on "
               f"{t3['n_mse']} images in [0,1] vs fp32; FD = Frechet distance of classifier features, "
               f"{t3['n_fd']} samples vs held-out digits)", "", *_run(t3)]
        md += _table(t3["rows"], cols)
        md += ["", "Checks (SVDQuant r=8): " + ", ".join(f"{k}: **{v}**" for k, v in t3["checks"].items()), ""]
    if "checks_r6" in parts.get("t3", {}):
        md += ["Checks (SVDQuant r=6): " + ", ".join(f"{k}: **{v}**" for k, v in parts["t3"]["checks_r6"].items()),
               ""]
    for key, rank in (("t5", 8), ("t5_r6", 6)):
        t5 = parts.get("t3", {}).get(key)
        if not t5:
            continue
        md += [f"## T5 true memory (digits, SVDQuant r={rank}; bytes read from the safetensors header)", ""]
        md += _table(t5["layers"], [("layer", "layer"), ("shape", "shape"), ("rank", "rank"), ("pad", "pad"),
                                    ("bytes", "bytes"), ("formula", "formula"), ("vs fp32", "vs_fp32"),
                                    ("vs fp16", "vs_fp16"), ("bits/weight", "bits_per_weight")])
        md += ["", f"All layers equal the formula: **{t5['all_equal_formula']}**; quantized layers "
               f"**{t5.get('quantized_layers_vs_fp32', float('nan')):.3f}** x fp32 "
               f"({t5.get('quantized_layers_vs_fp32_without_lambda_bias', float('nan')):.3f} without lambda and "
               f"bias; T5 asks <= 0.20); whole model {t5['model_bytes']} B vs fp32 {t5['fp32_model_bytes']} B = "
               f"{t5['model_vs_fp32']:.3f} (embeddings, shortcuts and resampling convs stay fp32).", ""]
    lo = parts.get("t3", {}).get("lora")
    if lo:
        md += ["## T4 LoRA merge (digits, random rank-4 LoRA on every quantized conv, alpha = 1, NFE "
               f"{lo['nfe']})", "", f"codes byte-identical after merge: **{lo['codes_identical']}**; PSNR vs "
               f"fp32: {lo['psnr_no_lora']:.2f} dB without LoRA, {lo['psnr_lora']:.2f} dB with (vs fp32+LoRA); "
               f"within 0.5 dB: **{lo['within_0.5dB']}** (the LoRA itself moves fp32 images to "
               f"{lo['lora_effect_psnr']:.1f} dB).", ""]
    if "shapes" in parts:
        sh = parts["shapes"]
        md += [f"## T3 shapes UNet (12x12x3; FD to the fp32 model's samples){sh.get('note', '')}", "", *_run(sh)]
        md += _table(sh["rows"], cols) + [""]
    dif = parts.get("diffusers") or parts.get("shapes", {}).get("diffusers")
    if dif:
        md += [f"## Tiny diffusers UNet2DModel through `from_diffusers` ({dif['model']})", "", *_run(dif)]
        md += _table(dif["rows"], [("variant", "variant"), ("NFE", "nfe"), ("layers", "layers"),
                                               ("bits/weight", "bits_per_weight"),
                                               ("sample rel. MSE", "sample_rel_mse"),
                                               ("denoiser rel. MSE (calib calls)", "denoiser_rel_mse_on_calib")])
        md += [""]
    if "t6" in parts:
        t6 = parts["t6"]
        md += [f"## T6 CPU latency, one run (torch {t6['torch']}, {t6['threads']} thread; kernels "
               f"{t6['kernels']}; no sampling, NFE n/a)", "", *_run(t6)]
        md += _table(t6["rows"], [("m=n", "m"), ("T", "T"), ("layer", "layer"), ("median ms", "median_ms"),
                                  ("ratio vs fp32", "ratio_vs_fp32"), ("low-rank FLOP fraction", "flop_fraction")])
        md += [""]
    write_text(results / "svdquant.md", "\n".join(md) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key in ("t3", "shapes"):
            if key not in parts:
                continue
            for r in parts[key]["rows"]:
                if r.get("psnr") is None:
                    continue
                mk = {"svdquant": "o", "rtn": "x", "smoothquant": "s", "svd": "^", "w4a16": "D", "w8a8": "P"}
                ax.scatter(r["bits_per_weight"], r["psnr"], marker=mk.get(r["method"], "."),
                           c="C0" if key == "t3" else "C1")
                ax.annotate(r["variant"].split(" (")[0], (r["bits_per_weight"], r["psnr"]), fontsize=6)
        ax.set_xlabel("bits per weight (quantized layers)")
        ax.set_ylabel("PSNR vs fp32 images (dB)")
        ax.set_title("PSNR vs bits per weight (blue: digits, orange: shapes)")
        fig.tight_layout()
        fig.savefig(results / "svdquant_psnr_bits.png", dpi=130)
    except ImportError as e:
        print(f"no plot: {e}")
    print(f"wrote {results / 'svdquant.md'}")


def write_fast_svd_report(results: Path) -> None:
    """``svdquant_fast_svd.md``: calibration time and quality, ``svd="full"`` against ``svd="fast"`` (issue 36)."""
    def get(name):
        f = results / f"svdquant_{name}.json"
        return json.loads(f.read_text()) if f.is_file() else None

    md = ["# SVDQuant calibration: exact (`svd=\"full\"`) vs fast (`svd=\"fast\"`, the default)", "",
          "CPU seconds are `time.process_time()` of the process (the shared machine ran 10-20 other jobs on its 2 "
          "cores, so wall time was 10-30x the CPU time and is shown only for the record).", ""]
    costs = get("costs")
    if costs:
        md += ["## Per-candidate cost, SD-size layer (`python benchmarks/svdquant_costs.py`; "
               f"{costs['layer']}, {costs['threads']} thread, CPU s)", ""]
        md += _table([{"mode": k, **costs[k]} for k in ("full", "fast") if k in costs],
                     [("svd", "mode"), ("stack W diag(lambda)", "stack"), ("SVD_r", "svd"), ("build layer", "build"),
                      ("evaluate", "error"), ("per candidate", "per_candidate")]) + [""]
    pairs = [p for p in (get("pair_before_1thread"), get("pair_after_1thread"), get("pair_before"), get("pair_after"),
                         get("pair"), get("pair_reduced")) if p]
    for p in pairs:
        for r in p["rows"]:
            r.setdefault("options", str(p.get("options") or "defaults"))
            r.setdefault("threads", p.get("threads"))
    if pairs:
        md += ["## The SD-size pair (1280 -> 5120 -> 1280, 512 calibration tokens, default rank 32; "
               "`python benchmarks/svdquant.py --part pair --svd full,fast`)", ""]
        rows = [r for p in pairs for r in p["rows"]]
        md += _table(rows, [("method", "method"), ("svd", "svd"), ("options", "options"), ("threads", "threads"),
                            ("wall s", "seconds"),
                            ("CPU s", "cpu_s"),
                            ("held-out rel. error", "rel_error_heldout"),
                            ("calib rel. error / layer", "rel_error_calib"),
                            ("refine iters", "refine_iters"), ("(alpha, beta)", "alpha_beta")]) + [""]
    t3 = get("t3svd")
    if t3:
        md += [f"## Quality on the shipped digits model (`python benchmarks/svdquant.py --part t3svd --n "
               f"{t3['n_fd']}`; {t3['sampler']} {t3['steps']} steps, MSE/PSNR on {t3['n_mse']} images vs fp32)", "",
               *_run(t3)]
        md += _table(t3["rows"], [("variant", "variant"), ("MSE", "mse"), ("PSNR dB", "psnr"),
                                  ("eps-MSE/step", "eps_mse"), ("FD", "fd"), ("calib s", "calib_s")]) + [""]
    for name in ("unet_subset", "unet_subset2", "unet", "unet_tiny"):
        u = get(name)
        if not u:
            continue
        md += [f"## {u['model']} ({u['params'] / 1e6:.0f}M params, {u['groups']} groups, max_tokens "
               f"{u['max_tokens']}, {u['threads']} thread, device {u['device']}; `--part unet"
               f"{' --tiny' if 'tiny' in name else ''}{' --only ...' if u.get('only') else ''}`)", "", *_run(u)]
        md += _table(u["rows"], [("svd", "svd"), ("group", "group"), ("weights", "weights"), ("rows", "rows"),
                                 ("rank", "rank"), ("eval GFLOP", "eval_gflop"), ("refine iters", "refine_iters"),
                                 ("wall s", "seconds"), ("CPU s", "cpu_s"), ("rel. error", "rel_error")])
        md += ["", f"Evaluation GFLOP of one pass over all {u['groups']} groups: {u['eval_gflop_all_groups']:.0f}.", ""]
        md += _table([{"svd": k, **v} for k, v in u["totals"].items()],
                     [("svd", "svd"), ("groups timed", "groups_timed"), ("timed CPU s", "timed_cpu_s"),
                      ("total s (all timed)", "total_s"), ("est. total wall s", "estimated_total_s"),
                      ("est. total CPU s", "estimated_total_cpu_s")]) + [""]
    write_text(results / "svdquant_fast_svd.md", "\n".join(md) + "\n")
    print(f"wrote {results / 'svdquant_fast_svd.md'}")


def _sampled_summary(get) -> list[str]:
    """Digits PSNR / eps-MSE / mean calibration error of ``search="sampled"`` beside ``exact`` per randomized-SVD
    seed (seed 0: ``t3search_exact_rerun`` + ``t3search_sampled``; seed k: ``t3search_seed<k>``, both modes in one
    run): the seeds show how far the exact search itself moves with the SVD's random draws alone."""
    runs = {0: [get("t3search_exact_rerun"), get("t3search_sampled")]}
    for k in (1, 2):
        runs[k] = [get(f"t3search_seed{k}")]
    rows = []
    for seed, parts in runs.items():
        got = {r["variant"]: r for p in parts if p for r in p["rows"]}
        for cfg in ("SVDQuant r=8", "NVFP4 SVDQuant r=8", "SVDQuant r=32"):
            e, m = got.get(f"{cfg} search=exact"), got.get(f"{cfg} search=sampled")
            if e and m:
                rows.append({"seed": seed, "cfg": cfg, "pe": e["psnr"], "pm": m["psnr"], "d": m["psnr"] - e["psnr"],
                             "ee": e["eps_mse"], "em": m["eps_mse"], "ce": e.get("calib_rel_error_mean"),
                             "cm": m.get("calib_rel_error_mean"), "te": e["calib_cpu_s"], "tm": m["calib_cpu_s"]})
    if not rows:
        return []
    md = ["## `search=\"sampled\"` against `exact` on the digits, per randomized-SVD seed", "",
          "`python benchmarks/svdquant.py --part t3search --n 64 --search sampled --tag _sampled` (seed 0, beside "
          "`svdquant_t3search_exact_rerun.json`) and `--search exact,sampled --svd-seed K --tag _seedK` (K = 1, 2). "
          "The seed changes only the randomized SVD's Gaussian draws; the spread of the exact rows across seeds is "
          "the noise of the measurement itself.", ""]
    md += _table(rows, [("seed", "seed"), ("config", "cfg"), ("PSNR exact", "pe"), ("PSNR sampled", "pm"),
                        ("sampled - exact dB", "d"), ("eps-MSE exact", "ee"), ("eps-MSE sampled", "em"),
                        ("calib err exact", "ce"), ("calib err sampled", "cm"), ("calib CPU s exact", "te"),
                        ("calib CPU s sampled", "tm")]) + [""]
    return md


def _hybrid_summary(get) -> list[str]:
    """``search="hybrid"`` beside ``sampled``: UNet groups timed back to back on the same machine (``sampled`` of the
    base commit, then ``sampled`` and ``hybrid`` of this one: ``unet_subset{,3}_search_*``) and the digits per
    randomized-SVD seed (hybrid: ``t3search_hybrid_seed<k>``; exact and sampled: the files of
    :func:`_sampled_summary`)."""
    md = []
    for sub, what in (("subset", "the five timed groups"), ("subset3", "three wider groups")):
        runs = [(k, get(f"unet_{sub}_search_{k}")) for k in ("sampled_base", "sampled_final", "hybrid_final")]
        runs = [(k, u) for k, u in runs if u]
        if len(runs) < 2:
            continue
        base = runs[0][1]
        by = {k: {r["group"]: r for r in u["rows"]} for k, u in runs}
        rows = []
        for r in base["rows"]:
            row = {"group": r["group"]}
            for k, _ in runs:
                row[f"c_{k}"], row[f"i_{k}"], row[f"e_{k}"] = (by[k][r["group"]][f] for f in
                                                                ("cpu_s", "refine_iters", "rel_error"))
            rows.append(row)
        tot = {"group": "total", **{f"c_{k}": sum(r[f"c_{k}"] for r in rows) for k, _ in runs}}
        rows.append(tot)
        for r in rows:
            for k, _ in runs[1:]:
                r[f"q_{k}"] = r[f"c_{k}"] / r[f"c_{runs[0][0]}"]
        md += [f"## `search=\"hybrid\"` against `sampled`: {what} of the SD 1.5 UNet, back to back", "",
               "`python benchmarks/svdquant.py --part unet --svd fast --search M --threads 1 --only <groups> "
               f"--tag _{sub}_search_<M>_<code>`: `sampled` of the base commit (20c55ab, run from an export of it), "
               "then `sampled` and `hybrid` of this commit, one after the other (one thread, `OMP_NUM_THREADS=1`; "
               "the machine was shared, so compare the CPU seconds of these runs, not their wall time). This "
               "commit's `sampled` is the base's bit for bit (the same errors); it is faster by the reused "
               "`W diag(lambda)` and the kept heap.", "", *_run(runs[-1][1])]
        cols = [("group", "group")]
        for k, _ in runs:
            cols.append((f"CPU s {k}", f"c_{k}"))
        for k, _ in runs[1:]:
            cols.append((f"{k} / {runs[0][0]}", f"q_{k}"))
        for k, _ in runs:
            cols += [(f"iters {k}", f"i_{k}"), (f"rel. error {k}", f"e_{k}")]
        md += _table(rows, cols) + [""]
    runs = {0: [get("t3search_exact_rerun"), get("t3search_sampled")], 1: [get("t3search_seed1")],
            2: [get("t3search_seed2")]}
    rows = []
    for seed, parts in runs.items():
        hyb = get(f"t3search_hybrid_seed{seed}")
        if not hyb:
            continue
        got = {r["variant"]: r for p in [*parts, hyb] if p for r in p["rows"]}
        for cfg in ("SVDQuant r=8", "NVFP4 SVDQuant r=8", "SVDQuant r=32"):
            e, m, y = (got.get(f"{cfg} search={k}") for k in ("exact", "sampled", "hybrid"))
            if e and m and y:
                rows.append({"seed": seed, "cfg": cfg, "pe": e["psnr"], "pm": m["psnr"], "ph": y["psnr"],
                             "d": y["psnr"] - e["psnr"], "ce": e.get("calib_rel_error_mean"),
                             "ch": y.get("calib_rel_error_mean"), "te": e["calib_cpu_s"], "tm": m["calib_cpu_s"],
                             "th": y["calib_cpu_s"]})
    if rows:
        md += ["## `search=\"hybrid\"` on the digits, per randomized-SVD seed", "",
               "`python benchmarks/svdquant.py --part t3search --n 64 --search hybrid --svd-seed K --tag "
               "_hybrid_seedK` (K = 0, 1, 2); exact and sampled from the runs of the table above (same seeds).", ""]
        md += _table(rows, [("seed", "seed"), ("config", "cfg"), ("PSNR exact", "pe"), ("PSNR sampled", "pm"),
                            ("PSNR hybrid", "ph"), ("hybrid - exact dB", "d"), ("calib err exact", "ce"),
                            ("calib err hybrid", "ch"), ("calib CPU s exact", "te"), ("calib CPU s sampled", "tm"),
                            ("calib CPU s hybrid", "th")]) + [""]
    return md


def _hybrid_estimate(get) -> list[str]:
    """Whole-UNet CPU estimate of ``search="hybrid"``: each group timed in the base ``sampled``'s whole in-order run
    (``unet_whole_sampled_partial``, 37 of 92 groups; 2100-2400 CPU s in all by its extrapolation) times the
    hybrid / base-sampled ratio measured back to back (:func:`_hybrid_summary`'s runs) for its (weights, rows)
    signature where one was timed, else for its kind (q/k/v, to_out, conv with >= 640 input channels, conv 320)."""
    whole = get("unet_whole_sampled_partial")
    sig: dict = {}
    kinds: dict = {}

    def kind(r):
        g = r["group"]
        return "qkv" if "qkv" in g else "to_out" if "to_out" in g else \
            "conv >= 640" if r["weights"][0][1] >= 640 else "conv 320"

    for sub in ("subset", "subset3"):
        b, h = get(f"unet_{sub}_search_sampled_base"), get(f"unet_{sub}_search_hybrid_final")
        if not (b and h):
            continue
        hb = {r["group"]: r for r in h["rows"]}
        for r in b["rows"]:
            for d, key in ((sig, (str(r["weights"]), str(r["rows"]))), (kinds, kind(r))):
                a, c = d.get(key, (0.0, 0.0))
                d[key] = (a + r["cpu_s"], c + hb[r["group"]]["cpu_s"])
    if not whole or not sig:
        return []
    ratio = {k: c / a for k, (a, c) in sig.items()}
    kratio = {k: c / a for k, (a, c) in kinds.items()}
    tb = sum(r["cpu_s"] for r in whole["rows"])
    tn = sum(r["cpu_s"] * ratio.get((str(r["weights"]), str(r["rows"])), kratio[kind(r)]) for r in whole["rows"])
    w = tn / tb
    return ["### Whole-UNet estimate of `hybrid`", "",
            "Ratios hybrid / base sampled by kind: " + ", ".join(f"{k} {v:.3f}" for k, v in kratio.items()) + ". "
            f"Applied per group (its signature's ratio where timed, else its kind's) to the {len(whole['rows'])} "
            f"groups timed in the base `sampled`'s whole run: {tb:.0f} -> {tn:.0f} CPU s (x{w:.3f}); the same factor "
            f"on that run's whole-UNet extrapolation (2100-2400 CPU s) gives {2100 * w:.0f}-{2400 * w:.0f} CPU s on "
            f"one thread, {2100 * w / 120:.1f}-{2400 * w / 120:.1f} minutes on two cores if two threads (or two "
            "processes calibrating different groups) scale fully. An estimate: no whole run of `hybrid` was made.",
            ""]


def write_fast_search_report(results: Path) -> None:
    """``svdquant_fast_search.md``: calibration time and quality, ``search="exact"`` against ``search="fast"`` /
    ``"fastest"`` / ``"rescore"`` (issue 36)."""
    def get(name):
        f = results / f"svdquant_{name}.json"
        return json.loads(f.read_text()) if f.is_file() else None

    md = ["# SVDQuant calibration: exact smoothing search (`search=\"exact\"`, the default) vs `search=\"fast\"` "
          "/ `search=\"fastest\"` / `search=\"rescore\"` / `search=\"sampled\"`", "",
          "All with `svd=\"fast\"`. CPU seconds are `time.process_time()` of a one-thread process; the shared 2-core "
          "machine ran 7-17 other jobs, so wall time was 5-20x the CPU time and is shown only for the record. "
          "Regenerate this file with `python benchmarks/svdquant.py --part fast_search_report`.", ""]
    pair = get("pair_search")
    if pair:
        md += ["## The SD-size pair (1280 -> 5120 -> 1280, 512 calibration tokens, default rank 32; "
               "`python benchmarks/svdquant.py --part pair --svd fast --search exact,fast --threads 1 "
               "--tag _search`)", "", *_run(pair)]
        md += _table(pair["rows"], [("method", "method"), ("search", "search"), ("wall s", "seconds"),
                                    ("CPU s", "cpu_s"), ("held-out rel. error", "rel_error_heldout"),
                                    ("calib rel. error / layer", "rel_error_calib"),
                                    ("refine iters", "refine_iters"), ("(alpha, beta)", "alpha_beta")]) + [""]
    pair2 = get("pair_sampled")
    if pair2:
        md += ["## The SD-size pair, exact vs sampled (`python benchmarks/svdquant.py --part pair --svd fast --search "
               "exact,sampled --threads 1 --tag _sampled`; 512 tokens = the scoring budget, so `sampled` has no "
               "subsample here and must equal `exact`)", "", *_run(pair2)]
        md += _table(pair2["rows"], [("method", "method"), ("search", "search"), ("wall s", "seconds"),
                                     ("CPU s", "cpu_s"), ("held-out rel. error", "rel_error_heldout"),
                                     ("refine iters", "refine_iters"), ("(alpha, beta)", "alpha_beta")]) + [""]
    t3s = [(n, t) for n in ("t3search", "t3search_exact", "t3search_exact_rerun", "t3search_fast", "t3search_fastest",
                            "t3search_rescore", "t3search_sampled", "t3search_seed1", "t3search_seed2")
           if (t := get(n))]
    if t3s:
        md += ["## Quality on the shipped digits model (`python benchmarks/svdquant.py --part t3search --n 64 "
               "[--search exact|fast|fastest|rescore|sampled --tag _<mode>]`; ddim 20 steps, MSE/PSNR on 64 images "
               "vs fp32)", ""]
        for name, t3 in t3s:
            seed = f" (randomized-SVD seed {t3['svd_seed']})" if t3.get("svd_seed") else ""
            md += [f"`svdquant_{name}.json`{seed}" + (f": {t3['note']}" if "note" in t3 else ""), "", *_run(t3)]
            md += _table(t3["rows"], [("variant", "variant"), ("MSE", "mse"), ("PSNR dB", "psnr"),
                                      ("eps-MSE/step", "eps_mse"), ("FD", "fd"),
                                      ("mean calib rel. error / group", "calib_rel_error_mean"),
                                      ("calib CPU s", "calib_cpu_s")]) + [""]
    for name in ("unet_subset", "unet_subset2", "unet_subset_search_exact", "unet_subset_search_fast",
                 "unet_subset_search_fastest", "unet_subset_search_rescore", "unet_subset_search_sampled"):
        u = get(name)
        if not u:
            continue
        mode = u.get("search", "exact (before this change)")
        md += [f"## {u['model']}, search {mode} ({u['params'] / 1e6:.0f}M params, {u['groups']} groups, max_tokens "
               f"{u['max_tokens']}, {u['threads']} thread, device {u['device']}; `--part unet --only ...`)", "",
               *_run(u), *([u["note"], ""] if "note" in u else [])]
        md += _table(u["rows"], [("group", "group"), ("weights", "weights"), ("rows", "rows"),
                                 ("eval GFLOP", "eval_gflop"), ("refine iters", "refine_iters"),
                                 ("wall s", "seconds"), ("CPU s", "cpu_s"), ("rel. error", "rel_error")])
        md += ["", f"Evaluation GFLOP of one pass over all {u['groups']} groups: {u['eval_gflop_all_groups']:.0f}.", ""]
        md += _table([{"svd": k, **v} for k, v in u["totals"].items()],
                     [("groups timed", "groups_timed"), ("timed CPU s", "timed_cpu_s"),
                      ("est. total CPU s (timed CPU s per eval GFLOP x all groups)", "estimated_total_cpu_s")]) + [""]
    md += ["## Which half of the fast search moves the digits PSNR (NVFP4, rank 8; one run each)", "",
           "Calibrated with `search=\"fast\"` and one half switched off (the scoring subsample made larger than the "
           "data, or the coarse-to-fine grid replaced by the full grid), then `evaluate_variants` as in `t3search` "
           "(ad-hoc script, not kept): coarse-to-fine grid on every row 41.43 dB (eps-MSE 0.01599, FD 0.8675); full "
           "grid on the 512-row subsample 41.41 dB (0.01874, 0.8707); both (`fast`) 40.67 dB; exact 42.29 dB.", ""]
    md += ["## The tie-break (`search=\"rescore\"`): the subsample's top k candidates re-scored on every row", "",
           "Digits PSNR (dB, 64 images) for INT4 r=8 / NVFP4 r=8 / INT4 r=32: exact 40.70 / 42.29 / 53.12 "
           "(`svdquant_t3search_exact_rerun.json`), fastest 40.39 / 42.45 / 52.15, rescore (k = 3, the mode as "
           "shipped) 40.32 / 42.64 / 52.75 (`svdquant_t3search_rescore.json`). Variants, ad-hoc (`RESCORE_TOP` "
           "patched, `refine_full` forced; one run each, script not kept): k = 3 with the refinement on every row "
           "40.75 / 42.07 / 52.75; k = 5 40.83 / 42.71 / 52.75; k = 5 with the refinement on every row 40.65 / 42.28 / "
           "52.75; k = 21 (every candidate the coarse-to-fine grid visits, re-scored on every row) 40.83 / 42.98 / "
           "52.75. INT4 r=32 stays 0.37 dB below exact whatever k and the refinement rows, so that gap comes from "
           "the coarse-to-fine grid (or the warm-started SVD chain it implies), not from noisy subsample scores. "
           "Cost: on the five timed UNet groups rescore takes 37.2 CPU s against 29.2 for fastest (the big conv "
           "25.4 -> 31.9 s), estimated 1134 CPU s for the whole UNet against 890, about 81 CPU s per full "
           "re-scored candidate (one thread; about 570 s on two cores if two threads scale fully). "
           "Not the default: it is worse than exact on two of the three digits configurations.", ""]
    md += _sampled_summary(get)
    md += _hybrid_summary(get)
    md += _hybrid_estimate(get)
    w = get("unet_whole_sampled_partial")
    if w:
        md += [f"## {w['model']}, search sampled, the whole UNet in order, stopped at the deadline "
               f"({w['groups_timed']} of {w['groups']} groups; {w['threads']} thread, max_tokens "
               f"{w['max_tokens']})", "",
               w["note"], ""]
        md += _table(w["rows"], [("group", "group"), ("weights", "weights"), ("rows", "rows"),
                                 ("refine iters", "refine_iters"), ("wall s", "seconds"), ("CPU s", "cpu_s"),
                                 ("rel. error", "rel_error")])
        md += ["", f"Timed: {w['timed_cpu_s']:.1f} CPU s ({w['timed_wall_s']:.0f} s wall on the shared machine). The "
               f"untimed groups whose (input shape, weight shapes) a timed group shares (here or in the five-group "
               f"run above) add {w['remaining_by_signature_cpu_s']:.0f} CPU s at that group's time; "
               f"{len(w['unmeasured_signature_groups'])} groups have a signature that no run timed.", ""]
    write_text(results / "svdquant_fast_search.md", "\n".join(md) + "\n")
    print(f"wrote {results / 'svdquant_fast_search.md'}")

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", required=True,
                    choices=["t2", "t3", "shapes", "diffusers", "t6", "pair", "unet", "t3svd", "t3search", "report",
                             "fast_search_report", "fast_svd_report", "auto_times", "auto"])
    ap.add_argument("--size", type=int, default=1024, help="T2 layer width (T2's size: 1024)")
    ap.add_argument("--n", type=int, default=1000, help="samples for FD (T3's number: 1000); MSE uses the first 256")
    ap.add_argument("--svd", default="full,fast", help="pair: comma-separated svd modes to time")
    ap.add_argument("--tiny", action="store_true", help="unet: a tiny UNet2DConditionModel (quick check)")
    ap.add_argument("--representative", action="store_true",
                    help="unet: time one group per distinct shape and count it for each group of that shape")
    ap.add_argument("--only", default="", help="unet: comma-separated group names to time (the rest extrapolated)")
    ap.add_argument("--device", default="cpu", help="unet: where the layers are calibrated (cpu, cuda)")
    ap.add_argument("--max-tokens", type=int, default=4096, help="unet: calibration rows per group (default 4096)")
    ap.add_argument("--num-grids", type=int, default=None, help="pair: a reduced smoothing grid (default 20)")
    ap.add_argument("--num-iters", type=int, default=None, help="pair: fewer refinement iterations (default 100)")
    ap.add_argument("--search", default="fast", help="pair: comma-separated search modes; unet: one (default fast)")
    ap.add_argument("--tag", default="", help="pair: suffix of the result file (svdquant_pair<tag>.json)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 1; pair and unet: 2)")
    ap.add_argument("--svd-seed", type=int, default=None,
                    help="seed of the randomized SVD's draws (default 0): rerun with another to measure the noise")
    args = ap.parse_args()
    if args.svd_seed is not None:
        import steerdiff.quant.calibrate as _cal
        _cal.SVD_SEED = args.svd_seed
    torch.set_num_threads(args.threads or (2 if args.part in ("pair", "unet") else 1))
    if args.part == "fast_search_report":
        write_fast_search_report(results_dir("svdquant"))
    elif args.part == "fast_svd_report":
        write_fast_svd_report(results_dir("svdquant"))
    elif args.part == "report":
        write_report(results_dir("svdquant"))
    elif args.part == "t2":
        _dump("t2", part_t2(args.size))
    elif args.part == "t3":
        _dump("t3", part_t3(args.n, min(args.n, 256)))
    elif args.part == "shapes":
        _dump("shapes", part_shapes(min(args.n, 500)))
    elif args.part == "diffusers":
        _dump("diffusers", part_diffusers())
    elif args.part == "t3search":
        _dump(f"t3search{args.tag}", part_t3search(args.n, min(args.n, 256), tuple(args.search.split(","))))
    elif args.part == "auto":
        _dump("auto", part_auto(args.max_tokens))
    elif args.part == "auto_times":
        _dump("auto_times", part_auto_times())
    elif args.part == "t3svd":
        _dump("t3svd", part_t3svd(args.n, min(args.n, 256)))
    elif args.part == "unet":
        _dump(f"unet{'_tiny' if args.tiny else ''}{args.tag}",
              part_unet(args.tiny, args.svd.split(",") if args.svd != "full,fast" else ["fast"], args.representative,
                        args.max_tokens, args.only.split(",") if args.only else None, args.device, args.search))
    elif args.part == "pair":
        opts = {k: v for k, v in (("num_grids", args.num_grids), ("num_iters", args.num_iters)) if v is not None}
        _dump(f"pair{args.tag}", part_pair(args.svd.split(","), methods=("svdquant",) if opts else ("rtn", "svdquant"),
                                           searches=tuple(args.search.split(",")), **opts))
    else:
        _dump("t6", part_t6())
