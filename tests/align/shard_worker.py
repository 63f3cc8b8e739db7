"""One rank of the sharded-SMC tests (started by ``tests/align/test_align_sharded.py`` through ``launch_ranks``).

``python shard_worker.py OUT MODE``: joins the gloo group from the launcher's variables and runs the cases of
MODE. Each case runs the sampler twice in this process, once with one process (``dist=SINGLE``) and once sharded
over the group, and writes ``OUT/rank<r>.json``: per case, whether every field of the two results is bitwise equal
(and the largest difference where not), the layout, and the bytes this rank communicated.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch

torch.set_num_threads(1)

import steerdiff as sd  # noqa: E402
from steerdiff.align import best_of_n, das, fk_steering, online_das, tds  # noqa: E402
from steerdiff.align.rewards import Linear  # noqa: E402
from steerdiff.app.protocols.das import IsotropicMixture, validation_sigmas  # noqa: E402
from steerdiff.distributed import SINGLE  # noqa: E402
from steerdiff.models import GaussianMixture  # noqa: E402

FIELDS = ("samples", "rewards", "log_weights", "ess", "lambdas", "resampled", "log_evidence", "nonfinite")


def mixture():
    return IsotropicMixture(GaussianMixture([0.3, 0.7], [[-2.0, 0.0, 1.0], [2.0, 1.0, -1.0]], 0.4))


def compare(single, sharded, shard_rows) -> dict:
    out = {"equal": {}, "max_abs": {}}
    for name in FIELDS:
        a, b = getattr(single, name), getattr(sharded, name)
        if a is None or b is None:
            out["equal"][name] = a is None and b is None
            continue
        same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(torch.nan_to_num(a.double(), 7.0, 8.0, 9.0),
                                                                       torch.nan_to_num(b.double(), 7.0, 8.0, 9.0))
        out["equal"][name] = bool(same)
        if not same and a.shape == b.shape:
            out["max_abs"][name] = float((a.double() - b.double()).abs().nan_to_num(0).max())
    mine = single.particles_final[shard_rows]
    out["equal"]["particles_final"] = bool(torch.equal(mine, sharded.particles_final))
    out["equal"]["nfe"] = single.nfe == sharded.nfe and single.nfe_grad == sharded.nfe_grad
    out["nfe"] = [single.nfe, sharded.nfe]
    out["comm"] = sharded.extras.get("communication")
    return out


def rows_of(ctx, groups, particles, shard_by="auto"):
    from steerdiff.align.shard import ParticleShard

    return ParticleShard(ctx, groups, particles, shard_by).rows


def nan_at(denoiser, target: torch.Tensor, sigma: float):
    """``denoiser`` that returns NaN for the rows equal to ``target`` at ``sigma`` (a particle that goes
    non-finite wherever it lives)."""

    def d(x, s, cond=None):
        out = denoiser(x, s, cond)
        hit = (x == target).flatten(1).all(1) & (s == sigma)
        if hit.any():
            out = out.clone()
            out[hit] = float("nan")
        return out

    return d


def run_pair(ctx, fn, noise, groups, shard_by="auto", **kw):
    single = fn(noise=noise, dist=SINGLE, **kw)
    sharded = fn(noise=noise, dist=ctx, shard_by=shard_by, **kw)
    res = compare(single, sharded, rows_of(ctx, groups, kw["particles"], shard_by))
    res["layout"] = (sharded.extras.get("communication") or {}).get("layout")
    return res


def smc_cases(ctx) -> dict:
    mix, sig = mixture(), validation_sigmas(12)
    r = Linear([1.0, 0.5, -0.25])
    cases = {}
    for p in (8, 16):
        for thr in (0.5, 1.0):
            noise = sd.randn((p, 3), seeds=100, dtype=torch.float64)
            base = dict(denoiser=mix, reward=r, sigmas=sig, alpha=0.5, particles=p, generator=7, ess_threshold=thr)
            cases[f"das_P{p}_thr{thr}"] = run_pair(ctx, das, noise, 1, **base)
            cases[f"das_grad_P{p}_thr{thr}"] = run_pair(ctx, partial(das, gradient=True, tempering="exp"), noise, 1,
                                                        **base)
            fk = {k: v for k, v in base.items() if k != "ess_threshold"}
            cases[f"fk_P{p}_thr{thr}"] = run_pair(ctx, partial(fk_steering, ess_threshold=thr), noise, 1, **fk)
    # heavy weights and multinomial resampling: many particles take an ancestor from the other rank
    noise = sd.randn((16, 3), seeds=100, dtype=torch.float64)
    heavy = dict(denoiser=mix, reward=r, sigmas=sig, alpha=0.05, particles=16, generator=7, ess_threshold=1.0,
                 resampler="multinomial")
    cases["das_P16_multinomial_moves"] = run_pair(ctx, partial(das, gradient=True, tempering="exp"), noise, 1,
                                                  **heavy)
    cases["fk_P16_multinomial_moves"] = run_pair(ctx, fk_steering, noise, 1, **heavy)
    # several groups: whole groups per rank (auto), and particles spread over ranks
    noise = sd.randn((4 * 8, 3), seeds=3, dtype=torch.float64)
    kw = dict(denoiser=mix, reward=r, sigmas=sig, alpha=0.5, particles=8, generator=11, cond=None)
    cases["das_G4_auto"] = run_pair(ctx, das, noise, 4, **kw)
    cases["das_G4_particles"] = run_pair(ctx, das, noise, 4, shard_by="particles", **kw)
    cases["tds_G4_particles"] = run_pair(ctx, tds, noise, 4, shard_by="particles", **kw)
    cases["fk_G4_particles_weighted"] = run_pair(ctx, partial(fk_steering, output="weighted"), noise, 4,
                                                 shard_by="particles", **kw)
    cases["das_G4_resample_out"] = run_pair(ctx, partial(das, output="resample"), noise, 4,
                                            shard_by="particles", **kw)
    cases["best_of_n_G4_particles"] = run_pair(
        ctx, best_of_n, noise, 4, shard_by="particles",
        **{k: v for k, v in kw.items() if k != "alpha"})
    # a particle that goes non-finite on the last rank (particle P - 1 of group 0 lives there in this layout)
    noise = sd.randn((16, 3), seeds=5, dtype=torch.float64)
    step = 4
    for p_kw, name in ((dict(), "das"), (dict(gradient=True, tempering="exp"), "das_grad")):
        seen = {}
        das(mix, r, noise, sig, alpha=0.5, particles=16, generator=7, dist=SINGLE,
            callback=lambda info, seen=seen: seen.setdefault(info["i"], info["x"].clone()), **p_kw)
        bad = nan_at(mix, seen[step][15].clone(), float(sig[step]))
        res = run_pair(ctx, partial(das, **p_kw), noise, 1, denoiser=bad, reward=r, sigmas=sig, alpha=0.5,
                       particles=16, generator=7)
        single = das(bad, r, noise, sig, alpha=0.5, particles=16, generator=7, dist=SINGLE, **p_kw)
        res["killed"] = int(single.nonfinite.sum())
        cases[f"{name}_nonfinite_on_rank1"] = res
    # flow models through a flow SDE's moves (issue 38: particle methods on flow models, sharded like the rest): the
    # mixture as a velocity network, on a flow grid from sigma = inf, RBF's diffusion g = 2 t
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from exact_refs import mixture_as_flow

    from steerdiff.core.flow_sde import FlowSDE

    noise = sd.randn((2 * 8, 3), seeds=21, dtype=torch.float64)
    flow = dict(denoiser=mixture_as_flow(mix), reward=r, sigmas=sd.sigmas.flow(12, shift=3.0), alpha=0.5, particles=8,
                generator=13, sde=FlowSDE("rbf", 2.0))
    cases["das_flow_sde_G2_particles"] = run_pair(ctx, das, noise, 2, shard_by="particles", **flow)
    cases["fk_flow_sde_G2_particles"] = run_pair(ctx, fk_steering, noise, 2, shard_by="particles", **flow)
    return cases


def unet_cases(ctx) -> dict:
    """The digits UNet: bit-identical when the micro-batch divides each rank's rows of a group."""
    from steerdiff.align.rewards import ink
    from steerdiff.models.io import ASSETS_DIR, load

    model = load(ASSETS_DIR / "digits")
    sig = sd.sigmas.karras(6, 0.002, 80.0, 7.0)
    noise = sd.randn((2 * 8, *model.sample_shape), seeds=0)
    kw = dict(denoiser=model, reward=ink, sigmas=sig, alpha=0.1, particles=8, generator=0,
              cond=torch.tensor([3, 5]))
    return {"unet_das_particles_b4": run_pair(ctx, partial(das, batch_size=4), noise, 2, shard_by="particles",
                                              **kw),
            "unet_das_groups_b8": run_pair(ctx, partial(das, batch_size=8), noise, 2, shard_by="groups", **kw),
            "unet_das_particles_b512": run_pair(ctx, das, noise, 2, shard_by="particles", **kw)}


def online_cases(ctx) -> dict:
    mix, sig = mixture(), validation_sigmas(8)
    oracle = Linear([1.0, 0.0, 0.0])
    a = online_das(mix, oracle, sig, (3,), alpha=0.5, rounds=2, queries=2, particles=8, dtype=torch.float64,
                   dist=SINGLE)
    b = online_das(mix, oracle, sig, (3,), alpha=0.5, rounds=2, queries=2, particles=8, dtype=torch.float64,
                   dist=ctx, shard_by="particles")
    return {"online_das": {"equal": {"queries": all(torch.equal(x, y) for x, y in zip(a.queries, b.queries,
                                                                                        strict=True)),
                                     "nfe": a.nfe == b.nfe}}}


def errors(ctx) -> dict:
    """Bad input: each must raise the same error on every rank (no hang)."""
    mix, sig, r = mixture(), validation_sigmas(6), Linear([1.0, 0.0, 0.0])
    out = {}

    def attempt(name, **kw):
        args = dict(denoiser=mix, reward=r, noise=sd.randn((6, 3), seeds=0, dtype=torch.float64), sigmas=sig,
                    alpha=0.5, particles=6, generator=0, dist=ctx)
        args.update(kw)
        try:
            das(**args)
            out[name] = "no error"
        except (ValueError, TypeError) as err:
            out[name] = f"{type(err).__name__}: {err}"

    attempt("indivisible", particles=3, noise=sd.randn((3, 3), seeds=0, dtype=torch.float64), shard_by="auto")
    attempt("disagree", alpha=0.5 + 0.25 * ctx.rank, particles=4, noise=sd.randn((4, 3), seeds=0,
                                                                                    dtype=torch.float64))
    attempt("no_generator", generator=None, particles=4, noise=sd.randn((4, 3), seeds=0, dtype=torch.float64))
    attempt("bad_layout", shard_by="rows", particles=4, noise=sd.randn((4, 3), seeds=0, dtype=torch.float64))
    return out


def dies(ctx) -> dict:
    """Rank 1 exits in the middle of a run; the others must raise, not hang."""
    mix, sig, r = mixture(), validation_sigmas(30), Linear([1.0, 0.0, 0.0])
    calls = {"n": 0}

    def d(x, s, cond=None):
        calls["n"] += 1
        if ctx.rank == 1 and calls["n"] == 5:
            os._exit(17)
        return mix(x, s, cond)

    try:
        das(d, r, sd.randn((8, 3), seeds=0, dtype=torch.float64), sig, alpha=0.5, particles=8, generator=0,
            dist=ctx, shard_by="particles")
        return {"raised": None}
    except Exception as err:  # the test checks the type name
        return {"raised": type(err).__name__, "message": str(err)[:300]}


MODES = {"smc": smc_cases, "unet": unet_cases, "online": online_cases, "errors": errors, "dies": dies}


def main() -> None:
    out, modes = Path(sys.argv[1]), sys.argv[2].split(",")
    ctx = sd.distributed.init(backend="gloo", timeout=float(os.environ.get("SD_TEST_TIMEOUT", "60")))
    result = {"rank": ctx.rank, "world": ctx.world}
    for mode in modes:
        result[mode] = MODES[mode](ctx)
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(result, indent=1))
    sd.distributed.shutdown()


if __name__ == "__main__":
    main()
