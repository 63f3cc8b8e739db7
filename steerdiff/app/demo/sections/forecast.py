"""Demo section: forecasting with Dynamical Diffusion (Guo et al., ICLR 2025; docs/methods/dydiff.md): the shipped
``advection_dydiff`` (r = 0.5) and its equal-budget baseline ``advection_baseline`` (r = 0, standard conditional
diffusion) forecast 6 future frames of the 1-D stochastic advection-diffusion field from 4 context frames, beside
the exact oracle mean and persistence (the full three-seed comparison is ``benchmarks/dydiff.py``).

Both models run the same sampler (Heun, 12 steps, 23 NFE per member) from the same noise seeds; scores are on the
future frames of the fixed test set only.
"""

from __future__ import annotations

import time

import torch

from ..registry import SectionUnavailable, section
from ..report import Column, Figure, SectionResult, Variant

MODELS = {"advection_dydiff": "DyDiff (r = 0.5)", "advection_baseline": "Conditional diffusion (r = 0)"}
CONFIGS = {True: {"cases": 8, "members": 4, "panels": 3}, False: {"cases": 128, "members": 8, "panels": 6}}
STEPS = 12


@section("forecast", "Forecasting: Dynamical Diffusion vs conditional diffusion on an advection field",
         requires=("steerdiff.temporal",), order=80)
def run(ctx) -> SectionResult:
    """Each shipped forecaster on the test sequences; ensemble-mean MSE and fair CRPS beside oracle and persistence."""
    from ....data import advection
    from ....io import CheckpointError
    from ....metrics.forecast import crps_fair, ensemble_mse
    from ....temporal import forecast, load_forecaster
    from ....viz import fan_chart

    cfg = CONFIGS[ctx.quick]
    test = advection.test_set(1, n=cfg["cases"])
    context, truth = test[:, :4], test[:, 4:]
    oracle = advection.oracle_mean(context)
    models = {}
    for name in MODELS:
        try:
            models[name] = load_forecaster(name)
        except (CheckpointError, ValueError) as err:
            raise SectionUnavailable(f"the shipped forecaster {name} cannot be loaded ({err})") from err
    bar = ctx.bar(len(MODELS), "forecast")
    variants, ensembles = [], {}
    for name, label in MODELS.items():
        start = time.perf_counter()
        ens = forecast(models[name], context, members=cfg["members"], steps=STEPS, seed=ctx.seed * 10**6)
        wall = time.perf_counter() - start
        ensembles[label] = ens
        values = {"nfe": 2 * STEPS - 1, "wall_s": wall, "mse": float(ensemble_mse(ens, truth)),
                  "crps": float(crps_fair(ens, truth)), "members": cfg["members"]}
        full, rel = ctx.path(f"{name}.png")
        fan_chart(ens[0], full, truth[0], oracle[0], title=f"{label}: test case 0, {cfg['members']} members",
                  max_panels=cfg["panels"])
        variants.append(Variant(label, label, values, rel, f"{label}: bands of the members per lead time (blue), "
                                                        "oracle mean (dashed), truth (black)"))
        bar.update(1)
    for label, point in (("Oracle mean (exact)", oracle), ("Persistence", advection.persistence(context))):
        # a point forecast: its CRPS is its mean absolute error
        values = {"nfe": 0, "wall_s": 0.0, "mse": float(((point - truth) ** 2).mean()),
                  "crps": float((point - truth).abs().mean()), "members": 1}
        full, rel = ctx.path(f"{label.split()[0].lower()}.png")
        fan_chart(point[:1], full, truth[0], title=f"{label}: test case 0", max_panels=cfg["panels"])
        variants.append(Variant(label, "baseline", values, rel, f"{label} (a point forecast) and the truth"))
    dy, base = variants[0].values, variants[1].values
    findings = [
        f"DyDiff vs the baseline at equal budget: CRPS {dy['crps']:.4f} vs {base['crps']:.4f} "
        f"(ratio {dy['crps'] / base['crps']:.3f}), MSE {dy['mse']:.4f} vs {base['mse']:.4f} on {cfg['cases']} test "
        f"sequences.",
        f"The oracle mean reaches MSE {variants[2].values['mse']:.4f} (the irreducible error), persistence "
        f"{variants[3].values['mse']:.4f}.",
    ]
    return SectionResult(
        "forecast", "",
        about=("Dynamical Diffusion diffuses a whole sequence (context first, then future) with noise that mixes each "
               "frame with its predecessors, more strongly at higher noise, so denoising also moves forward in time. "
               "Here both shipped models share network, training budget, data and sampler; only the mixing ratio r "
               "differs (r = 0 is ordinary conditional diffusion)."),
        legend=("MSE: squared error of the ensemble mean over the 6 future frames (lower is better); CRPS: fair "
                "continuous ranked probability score of the ensemble (lower is better; for a point forecast its mean "
                "absolute error). The oracle mean is the exact conditional mean of the simulator, persistence "
                "repeats the last context frame. NFE: denoiser evaluations per member."),
        columns=[Column("nfe", "NFE", "d"), Column("wall_s", "wall s", ".2f"), Column("members", "members", "d"),
                 Column("mse", "MSE", ".4f", "lower"), Column("crps", "CRPS", ".4f", "lower")],
        variants=variants, findings=findings,
        figures=[Figure(_plot(ctx, ensembles, context, truth, oracle),
                        "Ensemble-mean MSE per lead time of both forecasters, the oracle mean and persistence.")],
        config={"models": ", ".join(MODELS), "test sequences": f"{cfg['cases']} (seed {advection.TEST_SEED})",
                "members": cfg["members"], "sampler": f"Heun, {STEPS} steps, Karras 0.002..80, rho 7",
                "noise seeds": f"from {ctx.seed * 10**6}"},
    )


def _plot(ctx, ensembles: dict, context: torch.Tensor, truth: torch.Tensor, oracle: torch.Tensor) -> str:
    from ....data import advection
    from ....viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    leads = range(1, truth.shape[1] + 1)
    for label, ens in ensembles.items():
        ax.plot(leads, ((ens.mean(1) - truth) ** 2).mean((0, 2)), "o-", label=label)
    ax.plot(leads, ((oracle - truth) ** 2).mean((0, 2)), "k--", label="oracle mean")
    ax.plot(leads, ((advection.persistence(context) - truth) ** 2).mean((0, 2)), "k:", label="persistence")
    ax.set_xlabel("lead time (frames)")
    ax.set_ylabel("MSE")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return ctx.plot(fig, "mse_per_lead.png")
