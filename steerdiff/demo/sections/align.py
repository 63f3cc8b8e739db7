"""Demo section: reward alignment on the shipped digits model: DAS vs best-of-N vs reward-gradient guidance at equal
cost per output (``docs/methods/das.md``, "Cost in NFE"; the full comparison with TDS, SIR and exact references is
``benchmarks/das.py``).

Target ``p(x0) exp(r(x0) / alpha)`` with ``r`` the shipped classifier's log-probability of the digit 3 and
``alpha = 0.1``, on the unconditional (null-label) model. Cost per output is ``NFE + c_b * VJP`` forward-pass units
with ``c_b = 2`` (a backward pass through the network costs about two forward passes): for a budget of P DAS
particles, best-of-N draws ``K = 3P`` plain chains and reward guidance runs one chain with ``P`` times the steps.
"""

from __future__ import annotations

import torch

from ..registry import section
from ..report import Column, Figure, SectionResult, Variant

ALPHA = 0.1
TARGET = 3
C_B = 2.0
METHODS = {"das": "DAS", "bon": "best-of-N", "guidance": "reward guidance"}
CONFIGS = {True: {"groups": 4, "steps": 8, "budgets": (2, 4)},
           False: {"groups": 24, "steps": 25, "budgets": (2, 4, 8)}}


def _grid(steps: int) -> torch.Tensor:
    from ...core import sigmas

    return sigmas.karras(steps + 1, 0.002, 80.0)[:-1]  # ends at sigma_min > 0: every step stochastic


def run_method(method: str, model, reward, groups: int, budget: int, steps: int, seed: int):
    """One method at the cost of ``budget`` DAS particles per output; returns its :class:`AlignResult`."""
    from ...align import best_of_n, das, reward_guidance
    from ...core import randn

    rows = {"das": budget, "bon": int(budget * (1 + C_B)), "guidance": 1}[method]
    noise = randn((groups * rows, 1, 8, 8), seeds=seed)
    kw = dict(particles=rows, generator=seed + 10**6, batch_size=256)
    if method == "das":
        return das(model, reward, noise, _grid(steps), alpha=ALPHA, **kw)
    if method == "bon":
        return best_of_n(model, reward, noise, _grid(steps), **kw)
    if method == "guidance":
        return reward_guidance(model, reward, noise, _grid(steps * budget), alpha=ALPHA, scale=1.0, **kw)
    raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")


@section("align", "Reward alignment: DAS vs best-of-N vs reward guidance at equal cost", requires=("steerdiff.align",),
         order=20)
def run(ctx) -> SectionResult:
    """Each method at each budget; reward under the classifier it optimises and under a held-out one."""
    from ...align.rewards import ClassLogProb, heldout_digits_classifier
    from ...metrics.images import classifier_features, pairwise_diversity
    from ...models.io import load

    cfg = CONFIGS[ctx.quick]
    groups, steps, budgets = cfg["groups"], cfg["steps"], cfg["budgets"]
    model = load("digits").eval().requires_grad_(False)
    clf = load("digits_classifier").eval().requires_grad_(False)
    reward = ClassLogProb(clf, TARGET)
    heldout, heldout_acc = heldout_digits_classifier()
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
            detail = {"das": f"P = {budget} particles", "bon": f"K = {int(budget * (1 + C_B))} chains",
                      "guidance": f"1 chain, {steps * budget} steps"}[method]
            values = {"budget": budget, "setting": detail, "nfe": res.nfe, "vjp": res.nfe_grad,
                      "cost": res.cost(C_B), "wall_s": res.wall_time, "reward": float(target.mean()),
                      "heldout": float(cross.mean()), "hit": float(hit.mean()), "diversity": pairwise_diversity(feats)}
            name = f"{label} ({detail})"
            image = ctx.grid(x, f"{method}_b{budget}.png", nrow=min(groups, 8))
            variants.append(Variant(name, label, values, image, f"{name}, cost {res.cost(C_B):.0f} per output"))
            bar.update(1)
    findings = []
    for budget in budgets:
        rows = {v.method: v.values for v in variants if v.values["budget"] == budget}
        best = max(rows, key=lambda m: rows[m]["reward"])
        costs = sorted({round(r["cost"]) for r in rows.values()})
        findings.append(f"Budget {budget} (cost per output {'/'.join(map(str, costs))}): highest reward {best} "
                        f"({rows[best]['reward']:.3f}); " + ", ".join(f"{m} {r['reward']:.3f} (held-out "
                                                                    f"{r['heldout']:.3f})" for m, r in rows.items())
                        + ".")
    figures = [Figure(_plot(ctx, variants), "Mean reward log p(3 | x) against cost per output (NFE + 2 VJP), shipped "
                      "classifier (left) and held-out classifier (right).")]
    return SectionResult(
        "align", "",
        about=("Reward alignment samples from the model tilted towards a reward, p(x) exp(r(x) / alpha), here the log-"
               "probability that the shipped classifier sees a 3, on the model sampled without a class label. DAS "
               "runs tempered sequential Monte Carlo over particles that follow the reward gradient; best-of-N keeps "
               "the highest-reward of K plain samples; reward guidance adds the reward gradient to one chain."),
        legend=("Every row at one budget costs the same per output (cost = NFE + 2 x VJP, forward-pass units). "
                "reward: mean log p(3 | x) under the classifier being optimised (higher is better, 0 is the "
                "maximum); held-out: the same under a logistic regression fit separately (higher is better; a gap "
                "to the reward means the sampler exploits the classifier); hit: share classified as 3 (higher is "
                "better); diversity: mean pairwise feature distance (higher is more varied)."),
        columns=[Column("budget", "budget P", "d"), Column("setting", "setting", ""),
                 Column("nfe", "NFE", ".0f"), Column("vjp", "VJP", ".0f"), Column("cost", "cost", ".0f"),
                 Column("wall_s", "wall s", ".2f"), Column("reward", "reward", ".3f", "higher"),
                 Column("heldout", "held-out", ".3f", "higher"), Column("hit", "hit", ".3f", "higher"),
                 Column("diversity", "diversity", ".2f", "higher")],
        variants=variants, findings=findings, figures=figures, group_by="budget",
        config={"model": "digits (shipped UNet, null label)", "reward": f"log p({TARGET} | x), shipped classifier",
                "alpha": ALPHA, "outputs per variant": groups, "steps": steps, "c_b": C_B,
                "held-out classifier test accuracy": round(heldout_acc, 3), "seeds": f"rows from seed {ctx.seed}"},
    )


def _plot(ctx, variants: list[Variant]) -> str:
    from ...viz import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for label in METHODS.values():
        rows = [v.values for v in variants if v.method == label]
        for ax, key in zip(axes, ("reward", "heldout"), strict=True):
            ax.plot([r["cost"] for r in rows], [r[key] for r in rows], "o-", label=label)
    for ax, title in zip(axes, ("reward (optimised classifier)", "held-out classifier"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("cost per output (NFE + 2 VJP)")
        ax.set_ylabel("mean log p(3 | x)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return ctx.plot(fig, "reward_vs_cost.png")
