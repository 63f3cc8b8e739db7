"""Inference-time search and SMC side by side: every registered aligner on the same seeds and budgets, against cost on
three axes (``docs/methods/search.md``, "The comparison").

Methods are read from the aligner registry (``steerdiff.align.ALIGNERS``), so a newly registered one (``tree_search``)
appears without an edit here; ``noise_search`` runs once per search rule (random, zero-order, paths), and
``tree_search`` once more with issue 38's sweeps (``tree_search[sweep]``: ``expand="sweep", lookahead=1``). Each
method runs at several budgets (``--particles``: the particles, chains or candidates behind one output; noise
search spends the same NFE as ``P`` Euler chains, with 4 candidates per round and as many rounds as that budget
buys).

Problems:

* the exact mixtures P1-P4 and MO (``steerdiff/app/protocols/das.py``) with their closed-form tilted targets: mean
  reward, its bias against the tilted mean ``E_pi[r]`` (an optimiser such as best-of-N or noise search is biased
  towards ``max r``; a sampler of the tilt is not), relative reward error and mode-weight total variation to the
  tilt (with the floor of the same number of exact samples);
* the shipped digits UNet with ``class:3`` (alpha 0.1): target reward, held-out reward (an independent logistic
  regression's log-probability of class 3) and the tilted mean ``E_pi[r]`` estimated by self-normalised importance
  weights on a pool of plain samples;
* the shipped shapes UNet with the shapes classifier's shape head (class 0, alpha 0.1), the same way;
* ``pipeline`` (not in the default ``--parts``): the shipped shapes text-to-image pipeline
  (``steerdiff/assets/shapes_pipeline``, bound to its captions as ``benchmarks/das_vs_plain.py --pipeline`` and
  ``steerdiff align --pipeline`` run it: conditional model, no CFG, its own sigma grid without the final 0) with the
  CLI's ``red`` reward of the decoded images (``sd.pipelines.on_images``: every verifier call is a VAE decode plus the
  reward, so the verifier's seconds are not negligible), alpha 0.002 (``benchmarks/shapes_pipeline.py``'s choice);
  held-out reward: the shapes classifier's log-probability of the colour red (its colour head, an independent
  judge of the same intent); tilted mean per prompt by self-normalised importance weights on a pool of plain
  samples (with its ESS). Its files get the stem ``search[_quick]_pipeline`` (``--tag``), so the other parts' files
  are not overwritten.

Cost per output (one group) on three x-axes: ``nfe`` (denoiser rows), ``nfe_vjp = nfe + c_b nfe_grad`` (c_b = 1 on
the mixtures, 2 on the networks) and wall seconds including the verifier (``wall_time / groups``; the verifier's
share beside it; and this process's CPU seconds per output, which a loaded machine does not inflate). Writes
``benchmarks/results/search/search[_quick].json``, ``search[_quick].md`` and, with matplotlib,
``search[_quick]_<problem>.png``.

    python benchmarks/search.py --quick          # about 2 CPU minutes (one thread)
    python benchmarks/search.py                  # more groups and budgets
    python benchmarks/search.py --quick --parts pipeline   # search_quick_pipeline.*
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align import ALIGNERS
from steerdiff.align.rewards import ClassLogProb, heldout_digits_classifier
from steerdiff.app.protocols.das import PROBLEMS, IsotropicMixture, mo, validation_sigmas
from steerdiff.core.registry import SAMPLERS
from steerdiff.metrics import mode_weight_error

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

SKIP = {"reward_guidance": "one chain per output, its cost set by steps not particles (benchmarks/das.py has it)"}
SEARCHES = ("random", "zero_order", "paths")


def variants(candidates: int) -> list[tuple[str, str, dict]]:
    """``(label, registered name, fixed options)`` for every registered aligner, noise search once per rule."""
    out = []
    for name, spec in ALIGNERS.items():
        if name in SKIP or not spec.particles:
            continue
        if name == "noise_search":
            out += [(f"noise_search[{s}]", name, {"search": s}) for s in SEARCHES]
        else:
            out.append((name, name, {}))
        if name == "das":  # the paper's DAS beside the library's default: the VJP axis
            out.append(("das[gradient]", name, {"gradient": True, "tempering": "exp"}))
        if name == "tree_search":  # issue 38's opt-in sweeps (P chains per iteration resampled by DAS's look-ahead)
            out.append(("tree_search[sweep]", name, {"expand": "sweep", "lookahead": 1.0}))
    return out


def call(name: str, fixed: dict, denoiser, reward, alpha: float, p: int, noise_fn, sigmas, seed: int,
         candidates: int, cond=None, batch_size: int | None = None):
    """One run of ``name`` with ``p`` particles (chains, candidates) per output; None where the budget does not suit
    the method (noise search: ``p`` a multiple of its candidates per round)."""
    spec = ALIGNERS.get(name)
    opts = dict(fixed)
    if name == "noise_search":
        if p % candidates:
            return None
        # the NFE of p plain chains: p // candidates rounds for random and zero-order, more (cheaper) path rounds
        opts.update(particles=candidates, budget=p * SAMPLERS.get("euler").nfe(len(sigmas) - 1))
        rows = candidates
    else:
        opts["particles"] = p
        rows = p
    if "alpha" in spec.options:
        opts["alpha"] = alpha
    for key, value in (("generator", seed * 10**6 + 12345), ("batch_size", batch_size), ("cond", cond)):
        if key in spec.options and value is not None:
            opts[key] = value
    cpu = time.process_time()
    res = sd.align.run(name, denoiser, reward, noise_fn(rows), sigmas, **opts)
    res.extras["cpu_s"] = time.process_time() - cpu  # this process's CPU seconds (one thread): load-independent
    return res


def costs(res, groups: int, c_b: float) -> dict:
    axes = res.cost_axes(c_b)
    return {"nfe": axes["nfe"], "nfe_grad": res.nfe_grad, "nfe_vjp": axes["nfe_vjp"],
            "wall_s": res.wall_time / groups, "verifier_s": res.verifier_time / groups,
            "cpu_s": res.extras["cpu_s"] / groups,
            "reward_evals": res.reward_evals}


# ------------------------------------------------------------------------------------------------ mixtures
def mixture_problems() -> dict:
    probs = {name: make() for name, make in PROBLEMS.items()}
    probs["MO"] = mo(0.5)
    return probs


def run_mixtures(args, log) -> list[dict]:
    rows = []
    sig = validation_sigmas(args.steps)
    for pname, pr in mixture_problems().items():
        den, d = IsotropicMixture(pr.mixture), pr.mixture.dim
        exact = pr.exact_reward
        floor = mode_weight_error(pr.tilted.sample(args.groups, torch.Generator().manual_seed(3)), pr.tilted)
        for label, name, fixed in variants(args.candidates):
            for p in args.particles:
                per_seed = []
                for seed in range(args.seeds):
                    def noise_fn(k, seed=seed, d=d):
                        return sd.randn((args.groups * k, d), seeds=seed * 10**7, dtype=torch.float64)

                    try:
                        res = call(name, fixed, den, pr.sampler_reward, pr.alpha, p, noise_fn, sig, seed,
                                   args.candidates)
                    except Exception as err:  # a new aligner with other needs: reported, not fatal
                        log(f"{pname} {label} P={p}: {type(err).__name__}: {err}")
                        traceback.print_exc()
                        res = None
                    if res is None:
                        break
                    x = res.samples.reshape(-1, d).double()
                    x = x[torch.isfinite(x).all(1)]
                    mean_r = float(pr.reward(x).mean())
                    m = {"mean_reward": mean_r, "bias": mean_r - exact, "relerr": abs(mean_r - exact) / abs(exact),
                         "mode_tv": mode_weight_error(x, pr.tilted), **costs(res, args.groups, 1.0)}
                    for k, q in enumerate(pr.objectives):
                        m[f"r{k + 1}_bias"] = float(q(x).mean()) - q.expected(pr.tilted)
                    per_seed.append(m)
                if not per_seed:
                    continue
                row = {"problem": pname, "method": label, "P": p, "exact_reward": exact, "mode_tv_floor": floor,
                       **{k: sum(s[k] for s in per_seed) / len(per_seed) for k in per_seed[0]}}
                rows.append(row)
                log(f"{pname:>4} {label:>22} P={p:>3}: bias {row['bias']:+.3f} relerr {row['relerr']:.3f} "
                    f"tv {row['mode_tv']:.3f} nfe {row['nfe']:.0f} vjp {row['nfe_grad']:.0f} "
                    f"wall {1e3 * row['wall_s']:.2f} ms/output")
    return rows


# ------------------------------------------------------------------------------------------------ networks
def tilt_reference(model, reward, alpha, sig, pool, cond=None, extra=None) -> dict:
    """``E_pi[r]`` (and ``E_pi[extra]``) for ``pi ∝ p exp(r / alpha)`` by self-normalised importance weights on
    ``pool`` plain ancestral samples."""
    noise = sd.randn((pool, *model.sample_shape), seeds=99 * 10**6)
    res = sd.align.best_of_n(model, reward, noise, sig, particles=pool, generator=99 * 10**6 + 1, batch_size=256)
    x = res.particles_final
    with torch.no_grad():
        r = reward(x).double()
        w = torch.softmax(r / alpha, 0)
        out = {"tilt_reward": float(w @ r), "tilt_ess": float(1 / (w**2).sum()), "plain_reward": float(r.mean())}
        if extra is not None:
            out["tilt_heldout"] = float(w @ extra(x).double())
    return out


def run_network(args, log, pname, model, reward, alpha, heldout=None) -> list[dict]:
    rows = []
    sig = sd.sigmas.karras(args.net_steps + 1, 0.002, 80.0)[:-1]
    ref = tilt_reference(model, reward, alpha, sig, args.pool, extra=heldout)
    log(f"{pname}: tilt reference {ref}")
    for label, name, fixed in variants(args.candidates):
        for p in args.net_particles:
            def noise_fn(k):
                return sd.randn((args.net_groups * k, *model.sample_shape), seeds=7 * 10**6)

            try:
                res = call(name, fixed, model, reward, alpha, p, noise_fn, sig, 0, args.candidates, batch_size=256)
            except Exception as err:
                log(f"{pname} {label} P={p}: {type(err).__name__}: {err}")
                traceback.print_exc()
                res = None
            if res is None:
                continue
            x = res.samples.reshape(-1, *model.sample_shape)
            with torch.no_grad():
                r = float(reward(x).double().mean())
                h = float(heldout(x).double().mean()) if heldout is not None else math.nan
            row = {"problem": pname, "method": label, "P": p, "mean_reward": r, "bias": r - ref["tilt_reward"],
                   "heldout_reward": h, "tilt_reward": ref["tilt_reward"], "tilt_heldout": ref.get("tilt_heldout"),
                   **costs(res, args.net_groups, 2.0)}
            rows.append(row)
            log(f"{pname:>6} {label:>22} P={p:>3}: reward {r:.3f} (tilt {ref['tilt_reward']:.3f}) heldout {h:.3f} "
                f"nfe {row['nfe']:.0f} vjp {row['nfe_grad']:.0f} wall {1e3 * row['wall_s']:.1f} ms/output "
                f"(verifier {1e3 * row['verifier_s']:.2f})")
    return rows


def digits(args, log) -> list[dict]:
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    logp, _ = heldout_digits_classifier()
    return run_network(args, log, "digits", model, ClassLogProb(clf, 3), 0.1, heldout=lambda x: logp(x)[:, 3])


def shapes(args, log) -> list[dict]:
    model, clf = sd.models.load("shapes"), sd.models.load("shapes_classifier")
    return run_network(args, log, "shapes", model, ClassLogProb(clf, 0, head=0), 0.1)


# ------------------------------------------------------------------------------------------------ pipeline
PIPELINE_SKIP: dict[str, str] = {}
"""Aligners the pipeline part leaves out (registered with ``pipelines=False``), with the reason: filled as it runs."""
PIPELINE_ALPHA = 0.002
"""Tilt of the pipeline part: ``benchmarks/shapes_pipeline.py``'s (selected there among 0.002 / 0.005 / 0.02); the
redness of decoded images varies by a few hundredths between samples, so ``1 / alpha = 500`` makes the tilt visible."""


def pipeline(args, log) -> list[dict]:
    """Every aligner on the shipped shapes pipeline's ``red`` reward of decoded images (the module docstring)."""
    from steerdiff.align.rewards import redness
    from steerdiff.app.protocols.shapes_pipeline import load_judge, load_shipped, train_pairs
    from steerdiff.data import shapes

    pipe, judge = load_shipped(), load_judge()
    pairs = train_pairs()[:args.pipe_prompts]  # "a red square", "a green square", ... (seen captions)
    prompts = [shapes.caption(s, c) for s, c in pairs]
    den, labels = sd.pipelines.bind(pipe, pipe.encode(prompts))
    reward = sd.pipelines.on_images(pipe, redness)  # the verifier: decode + redness (differentiable: TDS, DAS[grad])
    red = shapes.COLOURS.index("red")
    held = ClassLogProb(judge, red, head=1)

    def heldout(images):  # the judge's log P(colour = red) on its 12x12 crop of the decoded image
        return held(shapes.from_canvas(images.float().clamp(-1, 1)))

    sig = pipe.default_sigmas(args.pipe_steps + 1)[:-1]
    shape = pipe.latent_shape()
    n = args.pipe_groups  # outputs per prompt
    cond = labels.repeat_interleave(n)  # group g's prompt
    alpha = PIPELINE_ALPHA

    # tilted means per prompt from a pool of plain samples (best-of-N with one chain per output is plain sampling)
    pool = sd.align.best_of_n(den, reward, sd.randn((len(prompts) * args.pipe_pool, *shape), seeds=99 * 10**6),
                              sig, particles=1, cond=labels.repeat_interleave(args.pipe_pool),
                              generator=99 * 10**6 + 1, batch_size=256)
    with torch.no_grad():
        images = torch.cat([pipe.decode(z) for z in pool.samples.detach().float().split(256)])
        r, h = redness(images).double().view(len(prompts), -1), heldout(images).double().view(len(prompts), -1)
    w = torch.softmax(r / alpha, 1)
    ref = {"tilt_reward": float((w * r).sum(1).mean()), "tilt_heldout": float((w * h).sum(1).mean()),
           "tilt_ess": (1 / (w**2).sum(1)).tolist(), "plain_reward": float(r.mean()),
           "plain_heldout": float(h.mean())}
    log(f"pipeline: prompts {prompts}, tilt reference from {args.pipe_pool} plain samples per prompt: {ref}")
    rows = []
    for label, name, fixed in variants(args.candidates):
        if not ALIGNERS.get(name).pipelines:
            PIPELINE_SKIP[label] = "registered with pipelines=False"
            continue
        for p in args.pipe_particles:
            def noise_fn(k):
                return sd.randn((len(prompts) * n * k, *shape), seeds=7 * 10**6)

            try:
                res = call(name, fixed, den, reward, alpha, p, noise_fn, sig, 0, args.candidates, cond=cond,
                           batch_size=256)
            except Exception as err:  # a new aligner with other needs: reported, not fatal
                log(f"pipeline {label} P={p}: {type(err).__name__}: {err}")
                traceback.print_exc()
                res = None
            if res is None:
                continue
            with torch.no_grad():
                images = pipe.decode(res.samples.detach().float())
                rm, hm = float(redness(images).double().mean()), float(heldout(images).double().mean())
            row = {"problem": "shapes_pipeline", "method": label, "P": p, "mean_reward": rm,
                   "bias": rm - ref["tilt_reward"], "heldout_reward": hm, "tilt_reward": ref["tilt_reward"],
                   "tilt_heldout": ref["tilt_heldout"], "tilt_ess": ref["tilt_ess"],
                   "plain_reward": ref["plain_reward"], "plain_heldout": ref["plain_heldout"],
                   **costs(res, len(prompts) * n, 2.0)}
            rows.append(row)
            log(f"pipeline {label:>22} P={p:>3}: red {rm:.4f} (tilt {ref['tilt_reward']:.4f}) heldout {hm:.3f} "
                f"nfe {row['nfe']:.0f} vjp {row['nfe_grad']:.0f} wall {1e3 * row['wall_s']:.0f} ms/output "
                f"(verifier {1e3 * row['verifier_s']:.0f}) cpu {1e3 * row['cpu_s']:.0f}")
    return rows


# ------------------------------------------------------------------------------------------------ report
def table(rows: list[dict]) -> str:
    head = ["problem", "method", "P", "NFE", "NFE+VJP", "wall ms/out", "verifier ms/out", "CPU ms/out", "mean r",
            "bias vs tilt", "relerr", "mode TV (floor)", "held-out r"]
    out = []
    for r in rows:
        tv = f"{r['mode_tv']:.3f} ({r['mode_tv_floor']:.3f})" if "mode_tv" in r else "-"
        out.append([r["problem"], r["method"], r["P"], f"{r['nfe']:.0f}", f"{r['nfe_vjp']:.0f}",
                    f"{1e3 * r['wall_s']:.2f}", f"{1e3 * r['verifier_s']:.3f}", f"{1e3 * r['cpu_s']:.2f}",
                    f"{r['mean_reward']:.3f}",
                    f"{r['bias']:+.3f}", f"{r['relerr']:.3f}" if "relerr" in r else "-", tv,
                    f"{r['heldout_reward']:.3f}" if not math.isnan(r.get("heldout_reward", math.nan)) else "-"])
    return markdown_table(head, out, "llrrrrrrrrrrr")


def plots(rows: list[dict], stem: str, log) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not available: no curves")
        return []
    written = []
    for problem in dict.fromkeys(r["problem"] for r in rows):
        sub = [r for r in rows if r["problem"] == problem]
        y_key, y_label = ("relerr", "relative reward error to the tilt") if "relerr" in sub[0] else \
            ("mean_reward", "mean reward (dashed: tilted mean)")
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for ax, (x_key, x_label) in zip(axes, (("nfe", "NFE per output"), ("nfe_vjp", "NFE + c_b VJP per output"),
                                               ("wall_s", "wall s per output (verifier included)")), strict=True):
            for method in dict.fromkeys(r["method"] for r in sub):
                pts = sorted((r[x_key], r[y_key]) for r in sub if r["method"] == method)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=method, ms=3)
            if y_key == "mean_reward":
                ax.axhline(sub[0]["tilt_reward"], ls="--", c="k", lw=0.8)
            ax.set_xscale("log")
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
        axes[0].legend(fontsize=7)
        fig.suptitle(problem)
        fig.tight_layout()
        path = results_dir("search") / f"{stem}_{problem.replace('(', '').replace(')', '').replace('=', '')}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path.name)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few groups and budgets: a few CPU minutes")
    ap.add_argument("--parts", default="mixtures,digits,shapes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default=None,
                    help="suffix of the output files (search[_quick]_TAG.*); default 'pipeline' when --parts has "
                         "pipeline, none otherwise")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    q = args.quick
    args.groups, args.seeds, args.steps = (128, 1, 20) if q else (512, 2, 50)
    args.particles = (4, 8, 16) if q else (4, 8, 16, 32, 64)
    args.candidates = 4
    args.net_groups, args.net_steps, args.pool = (16, 10, 512) if q else (64, 25, 2048)
    args.net_particles = (4, 8, 16) if q else (4, 8, 16, 32)
    # the pipeline part (quick): 2 prompts x 8 outputs, P = 4, 8, 10 steps, 512 plain samples per prompt for the tilt
    args.pipe_prompts, args.pipe_groups, args.pipe_steps, args.pipe_pool = (2, 8, 10, 512) if q else (4, 16, 15, 2048)
    args.pipe_particles = (4, 8) if q else (4, 8, 16)
    stem = "search_quick" if q else "search"
    tag = args.tag if args.tag is not None else ("pipeline" if "pipeline" in args.parts.split(",") else "")
    if tag:
        stem += f"_{tag}"
    started = time.process_time()
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    rows: list[dict] = []
    parts = args.parts.split(",")
    if "mixtures" in parts:
        rows += run_mixtures(args, log)
    if "digits" in parts:
        rows += digits(args, log)
    if "shapes" in parts:
        rows += shapes(args, log)
    if "pipeline" in parts:
        rows += pipeline(args, log)
    meta = provenance()
    config = {k: v for k, v in vars(args).items()}
    config["methods"] = [v[0] for v in variants(args.candidates)]
    config["skipped"] = SKIP | ({f"{k} (pipeline)": v for k, v in PIPELINE_SKIP.items()})
    config["cpu_seconds"] = time.process_time() - started
    write_json(results_dir("search") / f"{stem}.json", {"config": config, "rows": rows, "env": meta})
    pngs = plots(rows, stem, log)
    text = [f"# Search and SMC against cost ({'quick' if q else 'full'})", "", provenance_line(meta), "",
            f"Methods from the registry: {', '.join(config['methods'])}; skipped: "
            + "; ".join(f"{k} ({v})" for k, v in config["skipped"].items()) + ".",
            f"Mixtures: {args.groups} groups x {args.seeds} seed(s), {args.steps} steps, c_b = 1; networks: "
            f"{args.net_groups} groups, {args.net_steps} steps, c_b = 2, tilt reference from {args.pool} samples. "
            f"Noise search: {args.candidates} candidates per round, as many rounds as the NFE of P euler chains buys. "
            f"CPU seconds: {config['cpu_seconds']:.0f}.", ""]
    if "pipeline" in parts:
        text += [f"Pipeline: the shipped shapes pipeline, {args.pipe_prompts} prompts x {args.pipe_groups} outputs, "
                 f"{args.pipe_steps} steps (conditional model, no CFG), reward `red` of the decoded images, alpha "
                 f"{PIPELINE_ALPHA}, c_b = 2; the verifier (decode + reward) is timed inside the wall time; held-out "
                 f"r: the shapes classifier's log P(colour = red); tilt reference (bias column, dashed line) from "
                 f"{args.pipe_pool} plain samples per prompt by self-normalised weights"
                 + next((f" (tilted mean {r['tilt_reward']:.4f}, its ESS per prompt "
                        f"{', '.join(f'{e:.1f}' for e in r['tilt_ess'])}; plain mean {r['plain_reward']:.4f}; "
                        f"held-out: tilted {r['tilt_heldout']:.2f}, plain {r['plain_heldout']:.2f})"
                        for r in rows if r["problem"] == "shapes_pipeline"), "") + ".", ""]
    text += [table(rows), ""]
    text += [f"![{p}]({p})" for p in pngs]
    write_text(results_dir("search") / f"{stem}.md", "\n".join(text) + "\n")


if __name__ == "__main__":
    main()
