"""DAS beside TDS, reward guidance, best-of-N and SIR at equal NFE (``docs/methods/das.md``: "Baselines", "Cost in
NFE", "Validation problems and pass criteria").

Parts (each writes ``benchmarks/results/das/das_<part>.json``; ``das.md`` there collects the tables of all parts run
so far):

* ``gmm``: the validation protocol P1-P4 and MO against the closed-form tilted mixtures, every method at the protocol's
  equal cost (c_b = 1) and its pass criteria (``--tier full``: 4096 / 2048 groups, 2 seeds).
* ``digits``: the shipped digits UNet (null condition) with rewards ``class:3``, ``ink`` and ``symmetry``; for DAS,
  reward guidance and best-of-N at equal cost (``c_b = 2``): target reward, held-out (cross) reward, diversity
  (mean pairwise classifier-feature distance) and FID-digits against the test split, over 3 seeds, plus a curve of
  target reward against NFE. The cross reward is an independently trained classifier (sklearn logistic regression
  on the train split): its log-probability of the target class for ``class:K``, its largest class log-probability
  (how recognisable the digit is) for ``ink`` and ``symmetry``.
* ``overhead``: share of DAS's wall time in SMC bookkeeping (weights, ESS, tempering, resampling) on the digits
  UNet, and DAS's wall time over reward guidance's (the same model calls, no SMC) measured in one run.

    python benchmarks/das.py --part gmm --tier full
    python benchmarks/das.py --part digits [--seeds 3] [--groups 64] [--particles 8] [--steps 25]
    python benchmarks/das.py --part overhead
    python benchmarks/das.py --part all
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import steerdiff as sd
from steerdiff.align import best_of_n, das, particles_at_cost, reward_guidance
from steerdiff.align.rewards import ClassLogProb, heldout_digits_classifier, ink, symmetry
from steerdiff.app.protocols.das import PAPER_DAS, validate
from steerdiff.metrics.images import classifier_features, frechet_distance, pairwise_diversity

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402


def _write(name: str, obj: dict) -> None:
    write_json(results_dir("das") / f"das_{name}.json", obj)


# ------------------------------------------------------------------------------------------------ gmm
def part_gmm(tier: str, sliced: bool) -> dict:
    start = time.perf_counter()
    report = validate(tier, sliced=sliced, log=lambda s: print(s, flush=True))
    report["wall_time_s"] = time.perf_counter() - start
    report["env"] = provenance()
    _write("gmm", report)
    return report


def _run_line(out: dict) -> list[str]:
    return [f"Run: {provenance_line(out['env'])}", ""] if "env" in out else []


def table_gmm(report: dict) -> str:
    from steerdiff.app.protocols.das import TIERS, checks_from_results

    cols = ["das", "tds", "guidance(rho=0.5)", "guidance(rho=1)", "guidance(rho=2)", "bon", "sir", "exact"]
    rows = [(name, *(f"{res[c]['relerr']:.3f} / {res[c]['mode_tv']:.3f}" if c in res else "-" for c in cols))
            for name, res in report["results"].items() if name != "MO"]
    lines = [f"### Mixtures: relative reward error / mode-weight TV (tier {report['tier']}, seed mean)", "",
             *_run_line(report),
             markdown_table(["problem", "DAS", "TDS", "guidance rho=0.5", "rho=1", "rho=2", "BoN K=32", "SIR K=32",
                             "exact samples"], rows)]
    if "MO" in report["results"]:
        mo = [(w, f"{r['r1_mean']:.3f} ({r['r1_exact']:.3f})", f"{r['r2_mean']:.3f} ({r['r2_exact']:.3f})",
               f"{r['mode_tv']:.3f}") for w, r in report["results"]["MO"].items()]
        lines += ["", markdown_table(["MO (DAS)", "E[r1] (exact)", "E[r2] (exact)", "mode TV"], mo)]
    checks = [(c["name"], f"{c['value']:.4f}", f"{c['bound']:.4f}", "yes" if c["passed"] else "NO")
              for c in checks_from_results(report["results"], TIERS[report["tier"]]["slack"])]
    lines += ["", markdown_table(["criterion (seed mean)", "DAS", "bound, or the other method's value", "pass"],
                                 checks)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ digits
def heldout_classifier():
    """Logistic regression on the train split's pixels: a differentiable cross reward model (torch)."""
    return heldout_digits_classifier()


def digit_rewards(clf):
    return {"class:3": (ClassLogProb(clf, 3), 0.1), "ink": (ink, 0.01), "symmetry": (symmetry, 0.05)}


def cross_reward(name: str, logp, x: torch.Tensor) -> torch.Tensor:
    lp = logp(x)
    return lp[:, int(name.split(":")[1])] if name.startswith("class:") else lp.max(1).values


def reference_features(clf, name: str):
    """FID reference: the real 3s (train + test) for ``class:3`` (the tilted target is a class-3 law), else the
    test split."""
    if name.startswith("class:"):
        x, y = sd.data.digits.load_digits("all")
        return classifier_features(clf, x[y == int(name.split(":")[1])])
    return classifier_features(clf, sd.data.digits.load_digits("test")[0])


def _metrics(name, samples, reward, logp, clf, real_f, n_fid):
    x = samples.float()
    with torch.no_grad():
        r = reward(x).double()
        c = cross_reward(name, logp, x.clamp(-1, 1)).double()
    f = classifier_features(clf, x.clamp(-1, 1))
    return {"target_reward": float(r.mean()), "cross_reward": float(c.mean()),
            "diversity": pairwise_diversity(f[:n_fid]), "fid_digits": frechet_distance(real_f, f[:n_fid]),
            "n": int(x.shape[0])}


def plain_pool(model, steps: int, pool: int) -> torch.Tensor:
    """``pool`` plain (unsteered) samples of ``model``, seeded apart from the methods' runs: the base of the
    importance-weighted exact reference."""
    from steerdiff.align.best_of_n import plain_chains
    from steerdiff.align.run_setup import ModelCalls

    sig = sd.sigmas.karras(steps + 1, 0.002, 80.0)[:-1].tolist()
    calls = ModelCalls(model, ink, 256)
    return plain_chains(calls, sd.randn((pool, 1, 8, 8), seeds=10**8), sig, None, 1.0,
                        sd.core.make_generators(10**8 + 7, pool), False, None, "pool")


def exact_reference(model, clf, logp, rewards: dict, steps: int, pool: int = 1536) -> dict:
    """The exact tilted law estimated by importance weights ``∝ exp(r / alpha)`` on a pool of plain samples:
    E[r], E[cross], and the expected feature distance of two independent draws (its diversity)."""
    x = plain_pool(model, steps, pool)
    f = classifier_features(clf, x.clamp(-1, 1))
    dist = torch.cdist(f, f)
    out = {"pool": pool}
    for name, (reward, alpha) in rewards.items():
        with torch.no_grad():
            r = reward(x).double()
            c = cross_reward(name, logp, x.clamp(-1, 1)).double()
        w = torch.softmax(r / alpha, 0)
        div = float(w @ dist @ w / (1 - (w**2).sum()))  # E|f_i - f_j| over two distinct weighted draws
        out[name] = {"target_reward": float(w @ r), "cross_reward": float(w @ c), "diversity": div,
                     "ess": float(1 / (w**2).sum()), "plain_target_reward": float(r.mean()),
                     "plain_diversity": pairwise_diversity(f)}
        print(f"exact reference {name}: {out[name]}", flush=True)
    return out


def run_digits_method(method, model, reward, alpha, groups, particles, steps, seed, c_b, scale=1.0):
    """One method at equal cost per group: DAS (the paper's, gradient proposal) P particles; guidance P chains;
    best-of-N and the library's gradient-free DAS (``das_default``) K = P (1 + c_b) chains / particles."""
    sig = sd.sigmas.karras(steps + 1, 0.002, 80.0)[:-1]
    k = particles_at_cost(particles, gradient=method in ("das", "guidance"), c_b=c_b)
    noise = sd.randn((groups * k, 1, 8, 8), seeds=seed * 10**6)
    kw = dict(generator=seed * 10**6 + 5 * 10**5, batch_size=256)
    if method == "das":  # the paper's sampler, as when das.md was made (the library's default: das_diagnosis.py)
        return das(model, reward, noise, sig, alpha=alpha, particles=k, **PAPER_DAS, **kw)
    if method == "das_default":
        return das(model, reward, noise, sig, alpha=alpha, particles=k, **kw)
    if method == "guidance":
        return reward_guidance(model, reward, noise, sig, alpha=alpha, scale=scale, particles=k, **kw)
    return best_of_n(model, reward, noise, sig, particles=k, **kw)


GUIDANCE_SCALES = (1.0, 2.0, 4.0, 8.0)
KEYS = ("target_reward", "cross_reward", "diversity", "fid_digits", "cost")


def part_digits(seeds: int, groups: int, particles: int, steps: int, c_b: float, curve: bool) -> dict:
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    logp, lr_acc = heldout_classifier()
    rewards = digit_rewards(clf)
    out = {"config": {"seeds": seeds, "groups": groups, "particles": particles, "steps": steps, "c_b": c_b,
                      "sigma": "karras(steps+1)[:-1], 80 -> 0.002", "heldout_lr_test_accuracy": lr_acc,
                      "guidance_scales": GUIDANCE_SCALES},
           "rewards": {}, "env": provenance()}
    out["exact_reference"] = exact_reference(model, clf, logp, rewards, steps)
    for name, (reward, alpha) in rewards.items():
        real_f = reference_features(clf, name)
        rows = out["rewards"][name] = {"alpha": alpha, "methods": {}}
        plan = [("das", 1.0), ("bon", 1.0)] + [("guidance", r) for r in GUIDANCE_SCALES]
        for method, scale in plan:
            label = method if method != "guidance" else f"guidance(rho={scale:g})"
            runs, pooled = [], []
            for seed in range(seeds):
                res = run_digits_method(method, model, reward, alpha, groups, particles, steps, seed, c_b, scale)
                x = res.samples if method != "guidance" else res.samples[::particles]  # one chain per group
                m = _metrics(name, x, reward, logp, clf, real_f, groups)
                m.update(nfe=res.nfe, nfe_grad=res.nfe_grad, cost=res.cost(c_b), wall_time_s=res.wall_time)
                if method == "guidance":  # every chain, for the reward means (same expectation, less noise)
                    m["target_reward_all_chains"] = float(res.rewards.mean())
                runs.append(m)
                pooled.append(x)
                print(f"{name:>9} {label:>17} seed {seed}: target {m['target_reward']:.4f} cross "
                      f"{m['cross_reward']:.3f} div {m['diversity']:.3f} fid {m['fid_digits']:.2f} "
                      f"cost/output {m['cost']:.0f} ({res.wall_time:.0f}s)", flush=True)
            mean = {k: float(np.mean([r[k] for r in runs])) for k in KEYS}
            std = {k + "_std": float(np.std([r[k] for r in runs])) for k in KEYS[:-1]}
            pooled_m = _metrics(name, torch.cat(pooled), reward, logp, clf, real_f, groups * seeds)
            rows["methods"][label] = {"mean": mean | std, "pooled": pooled_m, "per_seed": runs}
        rows["claim"] = _claims(rows["methods"])
        _write("digits", out)
    if curve:
        out["curve"] = digits_curve(model, clf, logp, steps, c_b)
    _write("digits", out)
    return out


def _claims(methods: dict) -> dict:
    """DAS vs untuned guidance (rho = 1) and vs the smallest swept rho whose target reward reaches DAS's."""
    d = methods["das"]["mean"]

    def versus(label):
        g = methods[label]["mean"]
        return {"against": label, "target_ge": d["target_reward"] >= g["target_reward"],
                "diversity_gt": d["diversity"] > g["diversity"], "cross_ge": d["cross_reward"] >= g["cross_reward"]}

    out = {"untuned": versus("guidance(rho=1)")}
    reach = [f"guidance(rho={r:g})" for r in GUIDANCE_SCALES
             if methods[f"guidance(rho={r:g})"]["mean"]["target_reward"] >= d["target_reward"]]
    out["matched"] = versus(reach[0]) if reach else {"against": None, "note": "no swept rho reaches DAS's reward"}
    return out


def digits_curve(model, clf, logp, steps, c_b, groups: int = 32) -> dict:
    """Target reward (class:3) against cost per output: DAS over P, best-of-N over K, guidance over steps."""
    reward, alpha = ClassLogProb(clf, 3), 0.1
    curve = {"das": [], "bon": [], "guidance": []}
    for p in (2, 4, 8, 16):
        res = run_digits_method("das", model, reward, alpha, groups, p, steps, 0, c_b)
        curve["das"].append({"particles": p, "cost": res.cost(c_b), "target_reward": float(res.rewards.mean())})
    for k in (3, 6, 12, 24, 48):
        res = run_digits_method("bon", model, reward, alpha, groups, k / (1 + c_b), steps, 0, c_b)
        curve["bon"].append({"K": k, "cost": res.cost(c_b), "target_reward": float(res.rewards.mean())})
    for n in (10, 25, 50, 100):
        res = run_digits_method("guidance", model, reward, alpha, groups * 4, 1, n, 0, c_b)
        curve["guidance"].append({"steps": n, "cost": res.cost(c_b), "target_reward": float(res.rewards.mean())})
    for k, v in curve.items():
        print(k, [(round(p["cost"]), round(p["target_reward"], 3)) for p in v], flush=True)
    return curve


def table_digits(out: dict) -> str:
    cfg = out["config"]
    rows = []
    for name, by_method in out["rewards"].items():
        label = f"{name} ({by_method['alpha']:g})"
        for m, r in by_method["methods"].items():
            a = r["mean"]
            rows.append((label, m, f"{a['cost']:.0f}", f"{a['target_reward']:.4f} ± {a['target_reward_std']:.4f}",
                         f"{a['cross_reward']:.3f} ± {a['cross_reward_std']:.3f}",
                         f"{a['diversity']:.3f} ± {a['diversity_std']:.3f}", f"{a['fid_digits']:.1f}",
                         f"{r['pooled']['fid_digits']:.1f}"))
        ref = out.get("exact_reference", {}).get(name)
        if ref:
            rows.append((label, f"exact target (weighted pool of {out['exact_reference']['pool']}, ESS "
                         f"{ref['ess']:.0f})", "", f"{ref['target_reward']:.4f}", f"{ref['cross_reward']:.3f}",
                         f"{ref['diversity']:.3f}", "", ""))
    yn = {True: "yes", False: "NO"}
    claims = []
    for name, by_method in out["rewards"].items():
        for kind, c in by_method.get("claim", {}).items():
            if c.get("against"):
                claims.append((name, f"{kind}: {c['against']}", yn[c["target_ge"]], yn[c["diversity_gt"]],
                               yn[c["cross_ge"]]))
            else:
                claims.append((name, kind, c["note"], "", ""))
    lines = [f"### Digits (UNet, null condition): {cfg['seeds']} seeds x {cfg['groups']} outputs, DAS P="
             f"{cfg['particles']}, {cfg['steps']} steps, equal cost per output (c_b = {cfg['c_b']:g}); mean ± sd "
             "over seeds", "", *_run_line(out),
             markdown_table(["reward (alpha)", "method", "cost/output", "target reward", "cross reward", "diversity",
                             "FID-digits (per seed)", "FID-digits (pooled)"], rows), "",
             markdown_table(["reward", "DAS vs", "target >=", "diversity >", "cross >="], claims)]
    if "curve" in out:
        lines += ["", "Target reward (class:3, alpha 0.1) against cost per output (forward-pass units):", ""]
        for k, v in out["curve"].items():
            lines.append(f"* {k}: " + ", ".join(f"{p['cost']:.0f} -> {p['target_reward']:.3f}" for p in v))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ overhead
def part_overhead(groups: int = 16, particles: int = 16, steps: int = 25, repeats: int = 3) -> dict:
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    reward = ClassLogProb(clf, 3)
    rows = []
    for _ in range(repeats):  # interleaved, so machine noise hits all alike
        d = run_digits_method("das", model, reward, 0.1, groups, particles, steps, 0, 2.0)
        g = run_digits_method("guidance", model, reward, 0.1, groups, particles, steps, 0, 2.0)
        f = run_digits_method("das_default", model, reward, 0.1, groups, particles, steps, 0, 2.0)
        b = run_digits_method("bon", model, reward, 0.1, groups, particles, steps, 0, 2.0)
        rows.append({"das_wall": d.wall_time, "das_model": d.model_time, "das_smc": d.smc_time,
                     "guidance_wall": g.wall_time, "guidance_model": g.model_time,
                     "default_wall": f.wall_time, "default_model": f.model_time, "default_smc": f.smc_time,
                     "bon_wall": b.wall_time, "bon_model": b.model_time})
    med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    out = {"config": {"groups": groups, "particles": particles, "steps": steps, "repeats": repeats,
                      "default_particles": particles_at_cost(particles, gradient=False, c_b=2.0)},
           "median": med, "smc_bookkeeping_share": med["das_smc"] / med["das_wall"],
           "outside_model_share": 1 - med["das_model"] / med["das_wall"],
           "das_over_guidance_wall": med["das_wall"] / med["guidance_wall"],
           "default_smc_bookkeeping_share": med["default_smc"] / med["default_wall"],
           "default_outside_model_share": 1 - med["default_model"] / med["default_wall"],
           "default_over_bon_wall": med["default_wall"] / med["bon_wall"], "runs": rows, "env": provenance()}
    _write("overhead", out)
    print(json.dumps({k: v for k, v in out.items() if k not in ("runs", "env")}, indent=1))
    return out


def table_overhead(out: dict) -> str:
    m, c = out["median"], out["config"]
    rows = [(f"DAS, paper (P = {c['particles']}, gradient)", f"{m['das_wall']:.2f}", f"{m['das_model']:.2f}",
             f"{m['das_smc']:.3f}", f"{100 * out['smc_bookkeeping_share']:.2f}%",
             f"{100 * out['outside_model_share']:.2f}%", f"{out['das_over_guidance_wall']:.3f} (reward guidance)")]
    if "default_wall" in m:
        rows.append((f"DAS, library default (P = {c['default_particles']}, no gradient)", f"{m['default_wall']:.2f}",
                     f"{m['default_model']:.2f}", f"{m['default_smc']:.3f}",
                     f"{100 * out['default_smc_bookkeeping_share']:.2f}%",
                     f"{100 * out['default_outside_model_share']:.2f}%",
                     f"{out['default_over_bon_wall']:.3f} (best-of-N, same rows)"))
    return "\n".join([
        "### Overhead (digits UNet, medians; each DAS beside a baseline with the same model calls)", "",
        *_run_line(out),
        markdown_table(["sampler", "wall (s)", "in model calls (s)", "SMC bookkeeping (s)", "bookkeeping share",
                        "outside-model share", "wall / baseline wall"], rows)])


def write_markdown() -> None:
    out = results_dir("das")
    parts = []
    for name, fn in (("gmm", table_gmm), ("digits", table_digits), ("overhead", table_overhead)):
        path = out / f"das_{name}.json"
        if path.exists():
            parts.append(fn(json.loads(path.read_text())))
    write_text(out / "das.md", "# DAS benchmark\n\n" + "\n\n".join(parts) + "\n")
    print("\n\n".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["gmm", "digits", "overhead", "all", "table"], default="all")
    ap.add_argument("--tier", choices=["fast", "full"], default="full")
    ap.add_argument("--sliced", action="store_true", help="also sliced W1 against exact samples (slow)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--particles", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--c-b", type=float, default=2.0, help="cost of one VJP in forward passes")
    ap.add_argument("--no-curve", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.part in ("gmm", "all"):
        part_gmm(args.tier, args.sliced)
    if args.part in ("digits", "all"):
        part_digits(args.seeds, args.groups, args.particles, args.steps, args.c_b, not args.no_curve)
    if args.part in ("overhead", "all"):
        part_overhead()
    write_markdown()


if __name__ == "__main__":
    main()
