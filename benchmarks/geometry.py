"""Local geometry descriptors (psi, nu, delta) and geometry-reward guidance on the digits generators: claims 5-9 of
the CPU validation protocol, section B.5 of shared/methods/temporal_geometry_control.md ("What Secrets Do Your
Manifolds Hold?", Humayun et al., 2025; docs/methods/geometry.md).

Models: ``configs/geometry_digits.json`` (3 x 256 ReLU MLP EDM denoiser, all 1797 digits, sigma_data 0.6, 4000 steps,
batch 256) and ``configs/geometry_digits_mem.json`` (the same on 300 digits, 10 of them 100 x each); trained here in
``runs/geometry/`` (resumed) unless ``--model`` / ``--mem-model`` name saved ones. Map (a): 20-step EDM-DDIM (eta 0,
karras(20, 0.002, 40, rho 7)) from ``z`` (``x_T = 40 z``), k = D = 64, exact float64 Jacobians.

Parts (each writes ``benchmarks/results/geometry/<part>.json`` and is skipped on a rerun when that file exists):

* ``volume``: claim 5 (Spearman(spread volume, psi) >= 0.9, 150 latents, eps 1e-3, 128 probes) and claim 7 (the
  detail proxy: Spearman of psi and delta with the Laplacian energy; no criterion);
* ``memorisation``: claim 6 (AUROC(-psi -> memorised) >= 0.85 on 400 samples of the memorising model; nu under the
  three conventions by group);
* ``ood``: claim 8 (KS p < 0.01 for psi and delta, latents x 2.5 vs in-distribution, 60 each);
* ``guidance``: claim 9 (psi regressor Spearman >= 0.5 on held-out states with sigma <= 1; mean psi of the guided map
  increases over rho in {0, 1, 1.5, 3}; the share of confident pixel-classifier labels drops <= 5 points; FID-digits,
  mean pairwise L2 and NFE reported; rho also in {-1.5, -1}).

``geometry.json`` / ``geometry.md`` / ``geometry.png`` are rebuilt from the part files after every part.

    OMP_NUM_THREADS=1 python benchmarks/geometry.py                 # every part
    OMP_NUM_THREADS=1 python benchmarks/geometry.py --part ood      # one part
    OMP_NUM_THREADS=1 python benchmarks/geometry.py --quick --tag quick   # a small smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.app.protocols import geometry as gv
from steerdiff.app.recipes.geometry import duplicated_digits, train_recipe
from steerdiff.data.digits import load_digits
from steerdiff.geometry import GeneratorMap, local_descriptors
from steerdiff.geometry.reward import train_psi_regressor, trajectory_states
from steerdiff.guidance import RewardGuidance
from steerdiff.metrics.images import classifier_features, feature_scores
from steerdiff.models.io import load, save

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

PARTS = ("volume", "memorisation", "ood", "guidance")
GRID = {"steps": 20, "sigma_min": 0.002, "sigma_max": 40.0, "rho": 7.0}
RHOS = (-1.5, -1.0, 0.0, 1.0, 1.5, 3.0)
FULL = {"volume": 150, "probes": 128, "memorisation": 400, "ood": 60, "reward_latents": 3600, "reward_heldout": 400,
        "reward_steps": 5000, "guided_psi": 128, "guided_quality": 500}
QUICK = {"volume": 12, "probes": 80, "memorisation": 40, "ood": 12, "reward_latents": 40, "reward_heldout": 10,
         "reward_steps": 200, "guided_psi": 8, "guided_quality": 40}
# Guidance windows (the Guider's start fraction): "full" guides every step, as B.4 is written; "late" guides the
# second half of the 20-step grid only (sigma <= 1.14), where the regressor is validated (sigma <= 1) [ours].
WINDOWS = {"full": 0.0, "late": 0.5}
PASS_WINDOW = "late"


def sigmas() -> torch.Tensor:
    return sd.sigmas.karras(**GRID)


def get_model(path: str | None, recipe: str) -> torch.nn.Module:
    if path:
        return load(path).eval()
    return train_recipe(recipe, resume=True).model.eval()


def _stats(v: torch.Tensor) -> dict:
    v = v.double()
    return {"mean": float(v.mean()), "std": float(v.std()), "median": float(v.median())}


# ------------------------------------------------------------------------------------------------ parts
def part_volume(model, cfg: dict) -> dict:
    n = cfg["volume"]
    z = sd.randn((n, 1, 8, 8), seeds=0, dtype=torch.float64)
    d = local_descriptors(model, z, sigmas=sigmas(), progress=True)
    g = GeneratorMap(model, sigmas=sigmas()).to(torch.float64)
    vol = gv.spread_volume(g, z, eps=1e-3, probes=cfg["probes"], seed=1)
    lap = gv.laplacian_energy(d.outputs)
    rho5 = gv.spearman(vol, d.psi)
    return {"claim5": {"n": n, "eps": 1e-3, "probes": cfg["probes"], "spearman_volume_psi": rho5,
                       "pass": rho5 >= 0.9, "criterion": "Spearman >= 0.9",
                       "psi": _stats(d.psi), "spread_volume": _stats(vol),
                       "mean_abs_gap": float((vol - d.psi).abs().mean())},
            "claim7": {"n": n, "spearman_psi_laplacian": gv.spearman(d.psi, lap),
                       "spearman_delta_laplacian": gv.spearman(d.delta, lap), "criterion": "none (reported only)"},
            "descriptors": d.summary(), "rows": {"psi": d.psi.tolist(), "volume": vol.tolist(),
                                                  "delta": d.delta.tolist(), "laplacian": lap.tolist()}}


def part_memorisation(model, cfg: dict) -> dict:
    n = cfg["memorisation"]
    data = duplicated_digits(**{k: v for k, v in json.loads((ROOT / "configs" / "geometry_digits_mem.json")
                                                            .read_text())["data"].items() if k != "name"})
    z = sd.randn((n, 1, 8, 8), seeds=0, dtype=torch.float64)
    d = local_descriptors(model, z, sigmas=sigmas(), progress=True)
    mem, dist, thr = gv.memorised(d.outputs, data.duplicated, data.unique)
    groups = {}
    for name, mask in (("memorised", mem), ("not_memorised", ~mem)):
        if mask.any():
            groups[name] = {"n": int(mask.sum()), "psi": _stats(d.psi[mask]), "nu": _stats(d.nu[mask]),
                            "nu_rel": _stats(d.nu_rel[mask]), "nu_abs": _stats(d.nu_abs[mask]),
                            "effective_rank": _stats(d.effective_rank[mask]), "delta": _stats(d.delta[mask]),
                            "s1": _stats(d.singular_values[mask, 0])}
    auc = gv.auroc(-d.psi, mem)
    return {"claim6": {"n": n, "memorised": int(mem.sum()), "threshold": thr, "auroc_minus_psi": auc,
                       "auroc_minus_delta": gv.auroc(-d.delta.double(), mem),
                       "auroc_nu_rel": gv.auroc(d.nu_rel.double(), mem),
                       "pass": bool(auc >= 0.85), "criterion": "AUROC(-psi) >= 0.85", "groups": groups},
            "rows": {"psi": d.psi.tolist(), "memorised": mem.tolist(), "distance": dist.tolist(),
                     "delta": d.delta.tolist()}}


def part_ood(model, cfg: dict) -> dict:
    n = cfg["ood"]
    z_in = sd.randn((n, 1, 8, 8), seeds=1000, dtype=torch.float64)
    z_out = 2.5 * sd.randn((n, 1, 8, 8), seeds=2000, dtype=torch.float64)
    d_in = local_descriptors(model, z_in, sigmas=sigmas(), progress=True)
    d_out = local_descriptors(model, z_out, sigmas=sigmas(), progress=True)
    ks_psi, ks_delta = gv.ks_test(d_in.psi, d_out.psi), gv.ks_test(d_in.delta.double(), d_out.delta.double())
    return {"claim8": {"n_each": n, "scale": 2.5, "ks_psi": ks_psi, "ks_delta": ks_delta,
                       "pass": bool(ks_psi["p"] < 0.01 and ks_delta["p"] < 0.01), "criterion": "KS p < 0.01 (both)",
                       "in": {"psi": _stats(d_in.psi), "delta": _stats(d_in.delta), "nu_rel": _stats(d_in.nu_rel)},
                       "ood": {"psi": _stats(d_out.psi), "delta": _stats(d_out.delta),
                               "nu_rel": _stats(d_out.nu_rel)}},
            "rows": {"psi_in": d_in.psi.tolist(), "psi_ood": d_out.psi.tolist(), "delta_in": d_in.delta.tolist(),
                     "delta_ood": d_out.delta.tolist()}}


def part_guidance(model, cfg: dict) -> dict:
    sig = sigmas()
    n, n_held = cfg["reward_latents"], cfg["reward_heldout"]
    z = sd.randn((n, 1, 8, 8), seeds=5000)
    t0 = time.perf_counter()
    d = local_descriptors(model, z, sigmas=sig, delta_radius=None, progress=True)
    states = trajectory_states(model, z, sig)
    n_train = n - n_held
    tr = type(states)(x=states.x[:n_train], sigma=states.sigma, x0=states.x0[:n_train])
    r_phi, fit = train_psi_regressor(tr, d.psi[:n_train], steps=cfg["reward_steps"], seed=0, progress=True)
    save(r_phi, ROOT / "runs" / "geometry" / "psi_regressor")  # not a result: kept for inspection
    # held-out states with sigma <= 1: prediction vs the standardised psi of their sample
    keep = states.sigma <= 1.0
    xh = states.x[n_train:][:, keep]
    sh = states.sigma[keep]
    with torch.no_grad():
        pred = r_phi(xh.reshape(-1, 1, 8, 8).float(), sh.float().repeat(n_held)).double()
    target = ((d.psi[n_train:] - fit["psi_mean"]) / fit["psi_std"]).repeat_interleave(int(keep.sum()))
    spear_held = gv.spearman(pred, target)
    reward_s = time.perf_counter() - t0

    x_train, y_train = load_digits("train")
    pix = gv.pixel_classifier(x_train, y_train)
    clf = load("digits_classifier").eval()
    f_test = classifier_features(clf, load_digits("test")[0])
    n_psi, n_q = cfg["guided_psi"], cfg["guided_quality"]
    z_eval = sd.randn((n_q, 1, 8, 8), seeds=cfg.get("eval_seed", 9000))  # 9000: the latents the window was chosen on
    null = torch.full((n_q,), -1, dtype=torch.long)
    sweep = []
    for window, start in WINDOWS.items():
        for rho in RHOS:
            t = time.perf_counter()
            guide = RewardGuidance(r_phi, rho=rho, create_graph=True, start=start)
            dg = local_descriptors(model, z_eval[:n_psi].double(), sigmas=sig, guidance=guide, delta_radius=None,
                                   progress=True)
            with torch.no_grad():
                x, stats = sd.sample(model, z_eval, sig, method="ddim", cond=null, return_stats=True,
                                     guidance=RewardGuidance(r_phi, rho=rho, start=start))
            x = x.clamp(-1, 1)
            scores = feature_scores(f_test, classifier_features(clf, x))
            sweep.append({"window": window, "start": start, "rho": rho, "psi_mean": float(dg.psi.mean()),
                          "psi_std": float(dg.psi.std()), "nu_rel_mean": float(dg.nu_rel.double().mean()),
                          "confident_fraction": gv.confident_fraction(pix, x), "fid_digits": scores["fid"],
                          "precision": scores["precision"], "recall": scores["recall"],
                          "mean_pairwise_l2": gv.mean_pairwise_l2(x), "nfe": stats.nfe,
                          "seconds": time.perf_counter() - t})
            print(f"{window} rho {rho:+.1f}: psi {sweep[-1]['psi_mean']:.2f}, confident "
                  f"{sweep[-1]['confident_fraction']:.3f}, FID {scores['fid']:.3f}, L2 "
                  f"{sweep[-1]['mean_pairwise_l2']:.3f}, NFE {stats.nfe}", flush=True)
    verdicts = {}
    for window in WINDOWS:
        by = {row["rho"]: row for row in sweep if row["window"] == window}
        up = [by[r]["psi_mean"] for r in (0.0, 1.0, 1.5, 3.0)]
        drop = by[0.0]["confident_fraction"] - min(by[r]["confident_fraction"] for r in (1.0, 1.5, 3.0))
        verdicts[window] = {"psi_monotone_0_1_1.5_3": all(a < b for a, b in zip(up, up[1:], strict=False)),
                            "confident_drop_points": 100 * drop, "confident_pass": bool(100 * drop <= 5),
                            "l2_change_rho3": by[3.0]["mean_pairwise_l2"] - by[0.0]["mean_pairwise_l2"],
                            "fid_change_rho3": by[3.0]["fid_digits"] - by[0.0]["fid_digits"]}
    v = verdicts[PASS_WINDOW]
    monotone, drop = v["psi_monotone_0_1_1.5_3"], v["confident_drop_points"] / 100
    return {"claim9": {"regressor": {"train_samples": n_train, "heldout_samples": n_held, "steps": cfg["reward_steps"],
                                     "spearman_heldout_sigma_le_1": spear_held, "pass": spear_held >= 0.5,
                                     "train_loss": fit["loss"], "psi_mean": fit["psi_mean"],
                                     "psi_std": fit["psi_std"], "seconds": reward_s},
                       "sweep": sweep, "windows": WINDOWS, "verdicts": verdicts, "pass_window": PASS_WINDOW,
                       "psi_monotone_0_1_1.5_3": monotone,
                       "confident_drop_points": 100 * drop, "confident_pass": bool(100 * drop <= 5),
                       "pass": bool(spear_held >= 0.5 and monotone and 100 * drop <= 5),
                       "criterion": "regressor Spearman >= 0.5; psi increases over rho 0, 1, 1.5, 3; confident "
                                    "share drops <= 5 points",
                       "n_psi": n_psi, "n_quality": n_q, "fid_reference": "digits test split (359)"}}


# ------------------------------------------------------------------------------------------------ report
def report(out: Path, tag: str, meta: dict) -> None:
    parts = {p: json.loads((out / f"{p}{tag}.json").read_text()) for p in PARTS if (out / f"{p}{tag}.json").is_file()}
    claims = {k: v for part in parts.values() for k, v in part.items() if k.startswith("claim")}
    write_json(out / f"geometry{tag}.json", {"claims": claims, "meta": meta})
    rows = []
    if "claim5" in claims:
        c = claims["claim5"]
        rows.append(["5 volume vs spread", f"Spearman {c['spearman_volume_psi']:.3f} (n {c['n']})", c["criterion"],
                     "pass" if c["pass"] else "FAIL"])
    if "claim6" in claims:
        c = claims["claim6"]
        g = c["groups"]
        psi = ", ".join(f"{k} {v['psi']['mean']:.1f}" for k, v in g.items())
        rows.append(["6 memorisation", f"AUROC(-psi) {c['auroc_minus_psi']:.3f}; {c['memorised']}/{c['n']} memorised;"
                     f" mean psi {psi}", c["criterion"], "pass" if c["pass"] else "FAIL"])
        nus = "; ".join(f"{k}: nu {v['nu']['mean']:.1f}, nu_rel {v['nu_rel']['mean']:.1f}, nu_abs "
                        f"{v['nu_abs']['mean']:.1f}" for k, v in g.items())
        rows.append(["6 ranks (3 conventions)", nus, "none", "reported"])
    if "claim7" in claims:
        c = claims["claim7"]
        rows.append(["7 detail proxy", f"Spearman(psi, Laplacian) {c['spearman_psi_laplacian']:.3f}, "
                     f"Spearman(delta, Laplacian) {c['spearman_delta_laplacian']:.3f}", "none", "reported"])
    if "claim8" in claims:
        c = claims["claim8"]
        rows.append(["8 OOD (z x 2.5)", f"KS p psi {c['ks_psi']['p']:.2e}, delta {c['ks_delta']['p']:.2e}; psi in "
                     f"{c['in']['psi']['mean']:.1f} vs OOD {c['ood']['psi']['mean']:.1f}; delta "
                     f"{c['in']['delta']['mean']:.1f} vs {c['ood']['delta']['mean']:.1f}", c["criterion"],
                     "pass" if c["pass"] else "FAIL"])
    text = [f"# Local geometry descriptors on digits (spec B.5){' ' + tag if tag else ''}", "",
            markdown_table(["claim", "measured", "criterion", "result"], rows)]
    if "claim9" in claims:
        c = claims["claim9"]
        reg = c["regressor"]
        text += ["", f"## Claim 9: geometry-reward guidance ({c['n_psi']} latents for psi, {c['n_quality']} samples "
                 "for quality; equal NFE)", "",
                 f"psi regressor: Spearman {reg['spearman_heldout_sigma_le_1']:.3f} on held-out states with sigma <= 1 "
                 f"({reg['train_samples']} training and {reg['heldout_samples']} held-out samples; criterion >= 0.5: "
                 f"{'pass' if reg['pass'] else 'FAIL'}). Claim 9 as a whole: {'pass' if c['pass'] else 'FAIL'} "
                 f"(judged on window `{c['pass_window']}`)."]
        for window, v in c["verdicts"].items():
            text += ["", f"Window `{window}` (guidance from step fraction {c['windows'][window]}): psi increases over "
                     f"rho 0, 1, 1.5, 3: {'yes' if v['psi_monotone_0_1_1.5_3'] else 'NO'}; confident-label share drop "
                     f"{v['confident_drop_points']:.1f} points (criterion <= 5: "
                     f"{'pass' if v['confident_pass'] else 'FAIL'}); at rho 3 vs 0: mean pairwise L2 "
                     f"{v['l2_change_rho3']:+.3f}, FID-digits {v['fid_change_rho3']:+.2f}."]
        text += ["", markdown_table(["window", "rho", "mean psi", "confident >= 0.9", "FID-digits", "precision",
                                     "recall", "mean pairwise L2", "NFE"],
                                    [[r["window"], f"{r['rho']:+.1f}", f"{r['psi_mean']:.2f}",
                                      f"{r['confident_fraction']:.3f}", f"{r['fid_digits']:.3f}",
                                      f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['mean_pairwise_l2']:.3f}",
                                      f"{r['nfe']:g}"] for r in c["sweep"]], "lrrrrrrrr")]
    text += ["", "Runs (each part keeps the provenance of the command that computed it):", ""]
    text += [f"- `{name}`: {provenance_line(part.get('meta', {}))}, {part.get('seconds', 0):.0f} s"
             for name, part in parts.items()]
    write_text(out / f"geometry{tag}.md", "\n".join(text) + "\n")
    _plot(parts, out / f"geometry{tag}.png")


def _plot(parts: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    if "volume" in parts:
        r = parts["volume"]["rows"]
        axes[0].scatter(r["psi"], r["volume"], s=8)
        axes[0].set(xlabel="psi (Jacobian)", ylabel="spread volume", title="claim 5: volume vs spread")
    if "memorisation" in parts:
        r = parts["memorisation"]["rows"]
        psi, mem = torch.tensor(r["psi"]), torch.tensor(r["memorised"])
        axes[1].hist([psi[mem].numpy(), psi[~mem].numpy()], bins=30, label=["memorised", "not"], stacked=False)
        axes[1].set(xlabel="psi", title="claim 6: memorising model")
        axes[1].legend()
    if "ood" in parts:
        r = parts["ood"]["rows"]
        axes[2].scatter(r["psi_in"], r["delta_in"], s=8, label="z")
        axes[2].scatter(r["psi_ood"], r["delta_ood"], s=8, label="2.5 z")
        axes[2].set(xlabel="psi", ylabel="delta", title="claim 8: in vs out of distribution")
        axes[2].legend()
    if "guidance" in parts:
        sw = parts["guidance"]["claim9"]["sweep"]
        for window in dict.fromkeys(s.get("window", "full") for s in sw):
            rows = [s for s in sw if s.get("window", "full") == window]
            axes[3].plot([s["rho"] for s in rows], [s["psi_mean"] for s in rows], "o-", label=f"window {window}")
        axes[3].legend()
        axes[3].set(xlabel="rho", ylabel="mean psi of the guided map", title="claim 9: geometry-reward guidance")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=PARTS + ("all",), default="all")
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--tag", default="", help="suffix of the output files")
    parser.add_argument("--model", default=None, help="saved model for claims 5, 7, 8, 9 (default: train the recipe)")
    parser.add_argument("--mem-model", default=None, help="saved memorising model for claim 6")
    parser.add_argument("--force", action="store_true", help="recompute parts whose JSON exists")
    parser.add_argument("--eval-seed", type=int, default=9000,
                        help="seed of the guided-sampling latents of claim 9 (9000 chose the window; others confirm)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = {**(QUICK if args.quick else FULL), "eval_seed": args.eval_seed}
    tag = f"_{args.tag}" if args.tag else ""
    out = results_dir("geometry")
    meta = provenance() | {"config": cfg, "grid": GRID}
    todo = PARTS if args.part == "all" else (args.part,)
    for part in todo:
        path = out / f"{part}{tag}.json"
        if path.is_file() and not args.force:
            print(f"{part}: cached ({path.name})")
            continue
        t = time.perf_counter()
        if part == "memorisation":
            model = get_model(args.mem_model, "geometry_digits_mem")
        else:
            model = get_model(args.model, "geometry_digits")
        result = globals()[f"part_{part}"](model, cfg)
        result["seconds"] = time.perf_counter() - t
        result["meta"] = meta
        write_json(path, result)
        print(f"{part}: {json.dumps({k: v for k, v in result.items() if k.startswith('claim')})[:600]}", flush=True)
        report(out, tag, meta)
    report(out, tag, meta)
    print((out / f"geometry{tag}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
