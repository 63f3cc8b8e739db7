"""Demo section: reward alignment on the shipped digits model: DAS (the library's default and the paper's gradient
proposal) vs best-of-N vs reward-gradient guidance vs noise search and tree search (DTS*) at equal cost per output,
each scored by its distance to the tilted target (``docs/methods/das.md``, "Cost in NFE";
``docs/methods/das_diagnosis.md``; the full comparison with TDS, SIR, FK steering and exact references is
``benchmarks/das.py`` and ``benchmarks/das_diagnosis.py``; of the search methods, ``benchmarks/search.py``).

Target ``p(x0) exp(r(x0) / alpha)`` with ``r`` the shipped classifier's log-probability of the digit 3 and
``alpha = 0.1``, on the unconditional (null-label) model. Cost per output is ``NFE + c_b * VJP`` forward-pass units
with ``c_b = 2`` (a backward pass through the network costs about two forward passes): a budget of P gradient
particles buys the paper's DAS P particles, the library's gradient-free DAS and best-of-N ``3P`` particles or chains
(:func:`steerdiff.align.particles_at_cost`), and reward guidance one chain with ``P`` times the steps.

The distance to the tilted target is the FID-digits of the outputs to the feature Gaussian of a pool of plain
samples weighted ``∝ exp(r / alpha)`` (:func:`steerdiff.metrics.images.weighted_gaussian`; its ESS is reported):
the reward alone cannot tell a sampler of the target from one that collapses onto the few most rewarded images.
"""

from __future__ import annotations

import torch

from ..registry import section
from ..report import Column, Figure, SectionResult, Variant

ALPHA = 0.1
TARGET = 3
C_B = 2.0
# The variants compared: label, registered aligner (steerdiff.align.ALIGNERS) and its options. An aligner without
# particles per output (reward guidance) runs one chain with ``budget`` times the steps.
VARIANTS = {"das": ("DAS", "das", {}),
            "das_paper": ("DAS (paper: gradient proposal)", "das", {"gradient": True, "tempering": "exp"}),
            "bon": ("best-of-N", "best_of_n", {}),
            "guidance": ("reward guidance", "reward_guidance", {"scale": 1.0}),
            "noise": ("noise search (zero-order)", "noise_search", {"search": "zero_order"}),
            "dts_star": ("tree search (DTS*)", "tree_search", {"mode": "dts_star"})}
# Search methods spend a budget in NFE per output over rows of starting noise: they get ``budget`` rows and the NFE of
# the gradient-free particles at equal cost (``particles_at_cost(budget) * steps``), spent over search rounds or tree
# rollouts (docs/methods/search.md, docs/methods/tree_search.md).
NFE_BUDGET_OPTION = {"noise_search": "budget", "tree_search": "nfe"}
METHODS = {key: label for key, (label, _, _) in VARIANTS.items()}
CONFIGS = {True: {"groups": 4, "steps": 6, "budgets": (2,), "pool": 128},
           False: {"groups": 24, "steps": 25, "budgets": (2, 4, 8), "pool": 2048}}


def _grid(steps: int) -> torch.Tensor:
    from ....core import sigmas

    return sigmas.karras(steps + 1, 0.002, 80.0)[:-1]  # ends at sigma_min > 0: every step stochastic


def _rows(method: str, budget: int) -> int:
    from ....align import ALIGNERS, particles_at_cost

    _, aligner, options = VARIANTS[method]
    if not ALIGNERS.get(aligner).particles:
        return 1
    if aligner in NFE_BUDGET_OPTION:
        return budget
    return particles_at_cost(budget, gradient=bool(options.get("gradient", False)), c_b=C_B)


def run_method(method: str, model, reward, groups: int, budget: int, steps: int, seed: int):
    """One method at the cost of ``budget`` gradient particles per output; returns its :class:`AlignResult`."""
    from ....align import ALIGNERS, particles_at_cost
    from ....align import run as run_aligner
    from ....core import randn

    if method not in VARIANTS:
        raise ValueError(f"method must be one of {sorted(VARIANTS)}, got {method!r}")
    _, aligner, options = VARIANTS[method]
    spec = ALIGNERS.get(aligner)
    rows = _rows(method, budget)
    noise = randn((groups * rows, 1, 8, 8), seeds=seed)
    kw = dict(particles=rows, generator=seed + 10**6, batch_size=256) | ({"alpha": ALPHA} if "alpha" in spec.options
                                                                          else {})
    grid = _grid(steps if spec.particles else steps * budget)
    if aligner in NFE_BUDGET_OPTION:
        kw[NFE_BUDGET_OPTION[aligner]] = particles_at_cost(budget, gradient=False, c_b=C_B) * steps
    return run_aligner(aligner, model, reward, noise, grid, **kw, **options)


def tilted_reference(model, clf, reward, pool: int, steps: int, seed: int) -> dict:
    """The target's feature Gaussian from ``pool`` plain samples (seeded apart from the methods' runs) weighted
    ``∝ exp(r / alpha)``, with its ESS and mean reward."""
    from ....align import best_of_n
    from ....core import randn
    from ....metrics.images import classifier_features, weighted_gaussian

    base = seed + 10**8
    plain = best_of_n(model, reward, randn((pool, 1, 8, 8), seeds=base), _grid(steps), particles=1,
                      generator=base + 10**6, batch_size=256)
    x = plain.samples.float()
    with torch.no_grad():
        r = reward(x).double()
    mu, cov, ess = weighted_gaussian(classifier_features(clf, x.clamp(-1, 1)), r / ALPHA)
    w = torch.softmax(r / ALPHA, 0)
    return {"mu": mu, "cov": cov, "ess": ess, "reward": float(w @ r), "pool": pool, "nfe": plain.nfe * pool}


@section("align", "Reward alignment and search: DAS, best-of-N, reward guidance, noise and tree search at equal cost",
         requires=("steerdiff.align",),
         order=20)
def run(ctx) -> SectionResult:
    """Each method at each budget; reward under the classifier it optimises and under a held-out one, and the
    distance to the tilted target."""
    from ....align.rewards import ClassLogProb, heldout_digits_classifier
    from ....metrics.images import classifier_features, frechet_from_stats, pairwise_diversity
    from ....models.io import load

    cfg = CONFIGS[ctx.quick]
    groups, steps, budgets = cfg["groups"], cfg["steps"], cfg["budgets"]
    model = load("digits").eval().requires_grad_(False)
    clf = load("digits_classifier").eval().requires_grad_(False)
    reward = ClassLogProb(clf, TARGET)
    heldout, heldout_acc = heldout_digits_classifier()
    ref = tilted_reference(model, clf, reward, cfg["pool"], steps, ctx.seed)
    bar = ctx.bar(len(budgets) * len(METHODS), "align")
    variants = []
    for budget in budgets:
        for method, label in METHODS.items():
            res = run_method(method, model, reward, groups, budget, steps, ctx.seed)
            x = res.samples.float()
            with torch.no_grad():
                target = reward(x).double()
                cross = heldout(x.clamp(-1, 1))[:, TARGET].double()
                hit = (clf.predict(x.clamp(-1, 1)) == TARGET).double()
            feats = classifier_features(clf, x.clamp(-1, 1))
            f = feats.numpy()
            fid = frechet_from_stats(ref["mu"], ref["cov"], f.mean(0), torch.from_numpy(f).T.cov().numpy())
            rows = _rows(method, budget)
            detail = {"das": f"P = {rows} particles, no gradient", "das_paper": f"P = {rows} gradient particles",
                      "bon": f"K = {rows} chains", "guidance": f"1 chain, {steps * budget} steps",
                      "noise": f"{rows} noises per round, {res.extras.get('rounds', '?')} rounds",
                      "dts_star": f"{rows} root children, {res.nfe:.0f} NFE"}[method]
            values = {"budget": budget, "setting": detail, "nfe": res.nfe, "vjp": res.nfe_grad,
                      "cost": res.cost(C_B), "wall_s": res.wall_time,
                      "verifier_s": res.verifier_time, "reward": float(target.mean()),
                      "gap": abs(float(target.mean()) - ref["reward"]), "fid_target": fid,
                      "heldout": float(cross.mean()), "hit": float(hit.mean()), "diversity": pairwise_diversity(feats)}
            name = f"{label} ({detail})"
            image = ctx.grid(x, f"{method}_b{budget}.png", nrow=min(groups, 8))
            variants.append(Variant(name, label, values, image, f"{name}, cost {res.cost(C_B):.0f} per output"))
            bar.update(1)
    findings = [f"Tilted target: {ref['pool']} plain samples weighted ∝ exp(r / {ALPHA:g}), ESS {ref['ess']:.0f}, "
                f"mean reward {ref['reward']:.4f}."]
    for budget in budgets:
        rows = {v.method: v.values for v in variants if v.values["budget"] == budget}
        closest = min(rows, key=lambda m: rows[m]["fid_target"])
        costs = sorted({round(r["cost"]) for r in rows.values()})
        findings.append(f"Budget {budget} (cost per output {'/'.join(map(str, costs))}): closest to the tilted "
                        f"target {closest} (FID {rows[closest]['fid_target']:.2f}); " + ", ".join(
                            f"{m} FID {r['fid_target']:.2f}, reward {r['reward']:.3f} (held-out {r['heldout']:.3f})"
                            for m, r in rows.items()) + ".")
    figures = [Figure(_plot(ctx, variants), "Distance to the tilted target (FID-digits, left) and mean reward log "
                      "p(3 | x) under the held-out classifier (right) against cost per output (NFE + 2 VJP).")]
    return SectionResult(
        "align", "",
        about=("Reward alignment samples from the model tilted towards a reward, p(x) exp(r(x) / alpha), here the log-"
               "probability that the shipped classifier sees a 3, on the model sampled without a class label. DAS "
               "runs tempered sequential Monte Carlo over particles; by default without the reward gradient "
               "(adaptive tempering, three times the particles for the cost of the paper's gradient proposal, which "
               "degenerates the weights on this model: docs/methods/das_diagnosis.md). Best-of-N keeps the "
               "highest-reward of K plain samples; reward guidance adds the reward gradient to one chain. Noise search "
               "(Ma et al. 2025) optimises the starting noise of a deterministic sampler (zero-order: neighbours of "
               "the best noise so far); tree search (DTS*, Jain et al. 2025) grows a tree of partial chains and "
               "returns its best leaf. Both are optimisers: they chase the reward's maximum, not the tilted law."),
        legend=("Every row at one budget costs the same per output (cost = NFE + 2 x VJP, forward-pass units; noise "
                "and tree search spend at most that: whole rounds, whole rollouts). "
                "FID to target: FID-digits of the outputs to the tilted target (a pool of plain samples weighted "
                "∝ exp(r / alpha); lower is better; the ESS of the pool is in the findings; few outputs per row "
                "make it noisy); gap: |mean reward - the target's| (lower is better); reward: mean log p(3 | x) "
                "under the classifier being optimised (higher is better, 0 is the maximum); held-out: the same "
                "under a logistic regression fit separately (higher is better; a gap to the reward means the "
                "sampler exploits the classifier); hit: share classified as 3 (higher is better); diversity: mean "
                "pairwise feature distance (higher is more varied); verifier s: seconds inside the reward (verifier) "
                "calls, a part of wall s."),
        columns=[Column("budget", "budget P", "d"), Column("setting", "setting", ""),
                 Column("nfe", "NFE", ".0f"), Column("vjp", "VJP", ".0f"), Column("cost", "cost", ".0f"),
                 Column("wall_s", "wall s", ".2f"), Column("verifier_s", "verifier s", ".3f"),
                 Column("fid_target", "FID to target", ".2f", "lower"),
                 Column("gap", "gap", ".4f", "lower"), Column("reward", "reward", ".3f", "higher"),
                 Column("heldout", "held-out", ".3f", "higher"), Column("hit", "hit", ".3f", "higher"),
                 Column("diversity", "diversity", ".2f", "higher")],
        variants=variants, findings=findings, figures=figures, group_by="budget",
        config={"model": "digits (shipped UNet, null label)", "reward": f"log p({TARGET} | x), shipped classifier",
                "alpha": ALPHA, "outputs per variant": groups, "steps": steps, "c_b": C_B,
                "tilted target": f"{ref['pool']} plain samples, ESS {ref['ess']:.0f}",
                "held-out classifier test accuracy": round(heldout_acc, 3), "seeds": f"rows from seed {ctx.seed}"},
    )


def _plot(ctx, variants: list[Variant]) -> str:
    from ....viz import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for label in METHODS.values():
        rows = [v.values for v in variants if v.method == label]
        for ax, key in zip(axes, ("fid_target", "heldout"), strict=True):
            ax.plot([r["cost"] for r in rows], [r[key] for r in rows], "o-", label=label)
    for ax, (title, ylabel) in zip(axes, (("distance to the tilted target", "FID-digits to target"),
                                          ("held-out classifier", "mean log p(3 | x)")), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("cost per output (NFE + 2 VJP)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return ctx.plot(fig, "reward_vs_cost.png")
