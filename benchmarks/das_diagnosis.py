"""Why DAS loses to best-of-N on digits with ``class:3`` (alpha 0.1), and which fix wins (issue 23).

The demo's setting: the shipped digits UNet (null label), reward ``log p(3 | x)`` under the shipped classifier,
alpha 0.1, Karras grid of 25 stochastic steps ending at sigma_min = 0.002, cost per output ``NFE + 2 VJP``.

Parts (results in ``benchmarks/results/das_diagnosis/``; ``docs/methods/das_diagnosis.md`` reads them):

* ``diag`` (diagnosis seed, default 0 = the benchmark's first seed): DAS at P = 8 with a callback and two recording
  wrappers around the SMC steps: per step the ESS and resampling, the largest normalised weight and the spread of the
  log-weights (and of the proposal's ``log p - log q`` term alone), the tempering level, the norm of the twist's drift
  ``delta = tau^2 lambda_{i+1} grad r / alpha`` beside the plain step ``mu - x`` and the noise ``tau sqrt(d)``, the
  norms of ``grad_x r(D(x))`` and of the classifier's own gradient ``grad_D r(D)``, the cosine between gradients of
  nearby particles, and the classifier's p(3) / hit rate / FID-digits (to the test split, and to the plain chains)
  of the Tweedie estimates ``D(x_t)`` for DAS and for plain chains from the same noise. Plus the cost split.
* ``select``: the leading candidates on two validation seeds (100, 101); ``mixtures``: the candidates on P1-P4
  against DAS's fast-tier bounds; ``reference``: refresh the reference block of the json files from the cached pool.
* ``fixes`` (validation seed, default 100): best-of-N, SIR, FK steering and DAS variants at equal cost per output
  (600 = 8 gradient particles or 24 gradient-free ones), scored against the tilted target: the mean target reward
  beside the reference's, and the FID-digits to the reference, i.e. the weighted Gaussian of a large pool of plain
  samples weighted ``∝ exp(r / alpha)`` (self-normalised importance resampling in the limit of many draws; its ESS
  is reported, and a floor: the FID of as many importance-resampled draws from a disjoint half of the pool).
* ``test`` (test seeds 0, 1, 2, never used for selection; 64 outputs per seed unless ``--test-groups``): default DAS
  (P = 8), the candidate ``das(gradient=False, tempering="adaptive")`` (P = 24), FK steering ``difference``
  (P = 24), best-of-N (K = 24) and reward guidance (one chain per output, rho 1, 2, 4, 8, as ``benchmarks/das.py``)
  at cost 600 per output, for ``class:3``, ``ink`` and ``symmetry`` with ``benchmarks/das.py``'s alphas, each
  against its own tilted reference; the issue's criterion for the candidate (``test.json``).
* ``clipsweep`` (validation seed, default 100; 128 outputs unless ``--clip-groups``): gradient DAS (P = 8) with
  ``shift_clip`` 0.05, 0.1, 0.2, 0.5 (a cap in noise norms, so independent of the reward's scale) on the three
  rewards, beside default DAS (no cap), best-of-N (K = 24) and ``das(gradient=False, tempering="adaptive")``
  (P = 24) (``clipsweep.json``).

    python benchmarks/das_diagnosis.py --part all          # diag, fixes, select, mixtures, test, tables, plots
    python benchmarks/das_diagnosis.py --part test --test-groups 128   # the test seeds (~14 min, one thread)
    python benchmarks/das_diagnosis.py --part clipsweep    # shift_clip on three rewards, seed 100 (~7 min)
    python benchmarks/das_diagnosis.py --part table        # tables and plots from the json only
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

import steerdiff as sd
import steerdiff.align.das  # noqa: F401  (the module; the package attribute is the function)
from steerdiff.align import best_of_n, fk_steering, sir, tempering_schedule
from steerdiff.align import das as library_das
from steerdiff.align.best_of_n import plain_chains
from steerdiff.align.rewards import ClassLogProb
from steerdiff.align.run_setup import ModelCalls
from steerdiff.align.smc import ancestral_coeffs
from steerdiff.app.protocols.das import PAPER_DAS
from steerdiff.metrics.images import classifier_features, frechet_distance, frechet_from_stats, pairwise_diversity

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

das_module = sys.modules["steerdiff.align.das"]
smc_module = sys.modules["steerdiff.align.smc"]  # accept_weights looks reweight up here
# Every configuration here is named relative to the paper's sampler (reward-gradient proposal, exponential
# tempering), the library default when this diagnosis was run; "DAS paper" is that sampler unchanged. The library's
# default since (gradient-free, adaptive) is the row "DAS gradient=False adaptive".
das = partial(library_das, **PAPER_DAS)
bench = importlib.import_module("das")  # benchmarks/das.py: plain_pool, reference features, held-out classifier

ALPHA, TARGET, STEPS, C_B, P = 0.1, 3, 25, 2.0, 8
LIVE = -10.0  # log normalised weight below which a particle counts as dead (W < 4.5e-5)
OUT = results_dir("das_diagnosis")


def grid(steps: int = STEPS) -> torch.Tensor:
    return sd.sigmas.karras(steps + 1, 0.002, 80.0)[:-1]  # the demo's grid: ends at sigma_min, every step stochastic


def load():
    model = sd.models.load("digits").eval().requires_grad_(False)
    clf = sd.models.load("digits_classifier").eval().requires_grad_(False)
    return model, clf, ClassLogProb(clf, TARGET)


def noise_for(groups: int, rows: int, seed: int) -> tuple[torch.Tensor, int]:
    """The benchmark's seeding convention (``benchmarks/das.py``: noise seeds ``seed * 10^6``, generator + 5e5)."""
    return sd.randn((groups * rows, 1, 8, 8), seeds=seed * 10**6), seed * 10**6 + 5 * 10**5


# ------------------------------------------------------------------------------------------------ diagnosis
class Recorder:
    """Wraps ``smc.reweight`` and ``das``'s ``propose`` (module attributes, restored afterwards) to keep the weights
    *before* resampling and the proposal's ``log p - log q`` term, which the callback (after resampling) lacks."""

    def __init__(self):
        self.weigh, self.ratio, self.increments = [], [], []

    def __enter__(self):
        self._rw, self._pr = smc_module.reweight, das_module.propose

        def reweight(log_weights, increment, bad=None):
            w = self._rw(log_weights, increment, bad)
            lw = w.log_weights
            live = lw > LIVE  # particles with a normalised weight above e^-10 (the rest count as dead)
            spread = torch.where(live, lw, torch.nan).numpy()
            self.increments.append(increment.clone())
            self.weigh.append({
                "max_weight": float(lw.exp().amax(1).mean()),
                "dead_frac": float((~live).double().mean()),
                "logw_sd_live": float(np.nanmean(np.nanstd(spread, 1))),
                "logw_range": float((lw.amax(1) - torch.where(torch.isfinite(lw), lw, lw.amax(1, keepdim=True))
                                     .amin(1)).median()),
            })
            return w

        def propose(*a, **k):
            x, r = self._pr(*a, **k)
            self.ratio.append(None if r is None else r)
            return x, r

        smc_module.reweight, das_module.propose = reweight, propose
        return self

    def __exit__(self, *exc):
        smc_module.reweight, das_module.propose = self._rw, self._pr


def _cosines(g: torch.Tensor, x: torch.Tensor, groups: int) -> dict:
    """Mean cosine between gradients: within a group (distinct states), to the nearest other state in the batch,
    and over all pairs (unrelated particles)."""
    gf, xf = g.double().flatten(1), x.double().flatten(1)
    u = gf / gf.norm(dim=1, keepdim=True).clamp_min(1e-300)
    cos = u @ u.T
    dist = torch.cdist(xf, xf)
    distinct = dist > 1e-9
    same_group = torch.arange(len(g))[:, None] // (len(g) // groups) == torch.arange(len(g))[None] // (len(g) // groups)
    within = cos[distinct & same_group]
    d = torch.where(distinct, dist, torch.inf)
    nn = d.argmin(1)
    ok = torch.isfinite(d.min(1).values)
    return {"cos_within_group": float(within.mean()) if within.numel() else math.nan,
            "cos_nearest": float(cos[torch.arange(len(g)), nn][ok].mean()),
            "cos_all_pairs": float(cos[distinct].mean()),
            "nearest_dist": float(d.min(1).values[ok].mean())}


def _tweedie_stats(clf, d: torch.Tensor, test_f) -> tuple[dict, torch.Tensor]:
    xc = d.float().clamp(-1, 1)
    with torch.no_grad():
        logp = torch.log_softmax(clf(xc), -1)
    f = classifier_features(clf, xc)
    return {"p3": float(logp[:, TARGET].exp().mean()), "hit": float((logp.argmax(1) == TARGET).double().mean()),
            "fid_test": frechet_distance(test_f, f)}, f


def part_diag(groups: int, seed: int) -> dict:
    model, clf, reward = load()
    sig = grid()
    sigl = sig.tolist()
    lam = tempering_schedule("exp", STEPS)
    test_f = classifier_features(clf, sd.data.digits.load_digits("test")[0])
    noise, gen = noise_for(groups, P, seed)
    d_dim = noise[0].numel()
    real3_f = bench.reference_features(clf, "class:3")
    steps: list[dict] = []
    feats_das: list[torch.Tensor] = []
    roots = torch.arange(P).repeat(groups, 1)  # the initial particle each current particle descends from

    def callback(info):
        nonlocal roots
        i, s, s1 = info["i"], info["sigma"], info["sigma_next"]
        if info["ancestors"] is not None:
            anc = info["ancestors"]
            roots = roots.gather(1, anc)
            n_anc = torch.tensor([len(set(a.tolist())) for a in anc])[info["resampled"]]
        else:
            n_anc = None
        x, dn, g = info["x"], info["denoised"], info["grad"]
        keep, tau = ancestral_coeffs(s, s1, 1.0)
        row = {"i": i, "sigma": s, "lambda": float(info["lambda"].mean()), "ess_frac": float(info["ess"].mean()) / P,
               "resampled_frac": float(info["resampled"].double().mean()),
               "reward_D_mean": float(info["reward"].mean()),
               "distinct_ancestors": math.nan if n_anc is None or not len(n_anc) else float(n_anc.double().mean()),
               "root_lineages": float(torch.tensor([len(set(r.tolist())) for r in roots]).double().mean()),
               "plain_step_norm": float(((1 - keep) * (dn - x)).flatten(1).norm(dim=1).mean()),
               "noise_norm": tau * math.sqrt(d_dim)}
        # The classifier's own gradient at the Tweedie estimate, grad_D r(D).
        dd = dn.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            (gd,) = torch.autograd.grad(reward(dd).sum(), dd)
        row["grad_D_norm"] = float(gd.flatten(1).norm(dim=1).median())
        if g is not None:
            gx = g * ALPHA  # the callback's grad is grad_x r / alpha
            gn = gx.flatten(1).norm(dim=1)
            delta = tau**2 * float(lam[i + 1]) * g
            dnorm = delta.flatten(1).norm(dim=1)
            row.update(grad_x_norm=float(gn.median()), grad_x_norm_p90=float(gn.quantile(0.9)),
                       drift_norm=float(dnorm.median()), drift_norm_p90=float(dnorm.quantile(0.9)),
                       drift_over_noise=float((dnorm / (tau * math.sqrt(d_dim))).median()),
                       drift_over_noise_max=float((dnorm / (tau * math.sqrt(d_dim))).max()),
                       drift_over_noise_p99=float((dnorm / (tau * math.sqrt(d_dim))).quantile(0.99)),
                       **_cosines(gx, x, groups))
        st, f = _tweedie_stats(clf, dn, test_f)
        st["fid_real3"] = frechet_distance(real3_f, f)
        row.update({f"das_{k}": v for k, v in st.items()})
        feats_das.append(f)
        steps.append(row)

    t0 = time.perf_counter()
    with Recorder() as rec:
        res = das(model, reward, noise, sig, alpha=ALPHA, particles=P, generator=gen, batch_size=256,
                  callback=callback)
    print(f"diag DAS run {time.perf_counter() - t0:.0f}s", flush=True)
    ratios = rec.ratio
    for k, row in enumerate(steps):
        row.update(rec.weigh[k])
        r = ratios[k - 1] if k >= 1 else None  # the move into step k
        inc = rec.increments[k]
        row["increment_sd"] = float(inc.std(1).mean())
        if r is not None:
            rr = r.view(groups, P)
            row["log_pq_sd"] = float(rr.std(1).mean())
            row["log_pq_mean"] = float(rr.mean())
            row["twist_term_sd"] = float((inc - rr).std(1).mean())
    final = rec.weigh[-1]
    # Plain chains from the same noise (same per-row generators): their Tweedie estimates at each sigma.
    plain_rows: list[dict] = []

    def plain_cb(info):
        st, f = _tweedie_stats(clf, info["denoised"], test_f)
        st["fid_real3"] = frechet_distance(real3_f, f)
        st["fid_to_das"] = frechet_distance(f, feats_das[info["i"]])
        plain_rows.append(st)

    calls = ModelCalls(model, reward, 256)
    x_plain = plain_chains(calls, noise, sigl, None, 1.0, sd.core.make_generators(gen, noise.shape[0]), False,
                           plain_cb, "plain")
    for row, pr in zip(steps, plain_rows, strict=True):
        row.update({f"plain_{k}": v for k, v in pr.items()})
    with torch.no_grad():
        r_plain = reward(x_plain).double().view(groups, P)
        r_das_final = res.extras["reward_mean_per_step"][-1]
        r_das_particles = reward(res.particles_final).double().view(groups, P)
    good = math.log(0.5)
    out = {
        "config": {"groups": groups, "particles": P, "steps": STEPS, "alpha": ALPHA, "seed": seed,
                   "grid": "karras(26, 0.002, 80)[:-1]", "d": d_dim},
        "steps": steps,
        "final": {"ess_frac": float(res.ess[-1].mean()) / P, **final,
                  "target_reward": float(res.rewards.mean()), "hit": float((res.rewards > good).double().mean()),
                  "mean_particle_reward": float(r_das_final.mean()),
                  "groups_with_a_3_das": float((r_das_particles > good).any(1).double().mean()),
                  "groups_with_a_3_plain_P8": float((r_plain > good).any(1).double().mean()),
                  "plain_hit": float((r_plain > good).double().mean()),
                  "resampling_events_per_group": float(res.resampled.double().sum(0).mean()),
                  "root_lineages_at_end": steps[-1]["root_lineages"],
                  "output_reward_quantiles_10_25_50": [float(q) for q in res.rewards.quantile(
                      torch.tensor([0.1, 0.25, 0.5], dtype=res.rewards.dtype))],
                  "output_reward_mean_non3": float(res.rewards[res.rewards <= good].mean()),
                  "plain_reward_mean_non3": float(r_plain[r_plain <= good].mean())},
        "cost": {"nfe": res.nfe, "nfe_grad": res.nfe_grad, "cost": res.cost(C_B),
                 "vjp_share_of_cost": C_B * res.nfe_grad / res.cost(C_B), "wall_s": res.wall_time,
                 "model_s": res.model_time, "smc_s": res.smc_time,
                 "equal_cost_gradient_free_particles": int(round(res.cost(C_B) / STEPS))},
        "env": provenance(),
    }
    write_json(OUT / "diag.json", out)
    return out


# ------------------------------------------------------------------------------------------------ reference
def reference(model, clf, reward, pool: int, alpha: float = ALPHA, cross=None) -> dict:
    """Weighted pool stats: the tilted target's mean reward and feature Gaussian, its ESS, and a floor.

    ``alpha`` and ``cross`` (held-out reward of clamped images, default the held-out log p(3)) let the ``test`` part
    build the reference of any digits reward."""
    cache = Path("/tmp") / f"das_diag_pool_{pool}.pt"
    if cache.exists():
        x = torch.load(cache)
    else:
        t0 = time.perf_counter()
        x = bench.plain_pool(model, STEPS, pool)
        torch.save(x, cache)
        print(f"pool of {pool} plain samples: {time.perf_counter() - t0:.0f}s", flush=True)
    with torch.no_grad():
        r = reward(x).double()
    f = classifier_features(clf, x.clamp(-1, 1))
    w = torch.softmax(r / alpha, 0)

    def stats(wv, fv):
        mu = (wv[:, None] * fv).sum(0)
        c = fv - mu
        cov = (wv[:, None] * c).T @ c / (1 - (wv**2).sum())
        return mu.numpy(), cov.numpy()

    mu, cov = stats(w, f)
    # Floor: reference from one half, n importance-resampled draws from the other half.
    half = pool // 2
    wa, wb = torch.softmax(r[:half] / alpha, 0), torch.softmax(r[half:] / alpha, 0)
    mua, cova = stats(wa, f[:half])
    g = torch.Generator().manual_seed(11)
    floors = {}
    for n in (64, 128, 256):
        vals = []
        for _ in range(5):
            idx = torch.multinomial(wb, n, replacement=True, generator=g)
            fb = f[half:][idx]
            vals.append(frechet_from_stats(mua, cova, fb.mean(0).numpy(), np.cov(fb.numpy(), rowvar=False)))
        floors[str(n)] = float(np.mean(vals))
    # E|f_i - f_j| over two distinct weighted draws, on the (at most 8192) largest weights: a large pool's full
    # distance matrix does not fit in memory, and the rest carries no weight (the mass kept is reported).
    top = w.argsort(descending=True)[:8192]
    wt = w[top] / w[top].sum()
    div = float(wt @ torch.cdist(f[top], f[top]) @ wt / (1 - (wt**2).sum()))
    with torch.no_grad():
        if cross is None:
            cross = bench.heldout_classifier()[0](x.clamp(-1, 1))[:, TARGET].double()
        else:
            cross = cross(x.clamp(-1, 1)).double()
    return {"pool": pool, "ess": float(1 / (w**2).sum()), "target_reward": float(w @ r), "diversity": div,
            "diversity_weight_kept": float(w[top].sum()),
            "cross_reward": float(w @ cross),
            "plain_target_reward": float(r.mean()), "hit": float(w @ (r > math.log(0.5)).double()),
            "fid_floor_sir_draws": floors, "mu": mu, "cov": cov}


# ------------------------------------------------------------------------------------------------ fixes
def fix_configs(grad_clips, shift_clips) -> list[tuple[str, str, int, dict]]:
    """(label, method, particles per output, kwargs); every row costs 600 per output (NFE + 2 VJP)."""
    k = int(P * (1 + C_B))
    cfg = [("best-of-N K=24", "bon", k, {}), ("SIR K=24", "sir", k, {}),
           ("FK difference P=24", "fk", k, {"potential": "difference"}),
           ("FK difference P=24, every 5", "fk", k, {"potential": "difference", "resample_every": 5}),
           ("FK max P=24", "fk", k, {"potential": "max"}),
           ("DAS paper P=8", "das", P, {}),
           ("(a) DAS gradient=False P=24", "das", k, {"gradient": False}),
           ("(a) DAS gradient=False P=24 adaptive", "das", k, {"gradient": False, "tempering": "adaptive"})]
    cfg += [(f"(b) DAS grad_clip={c:g} P=8", "das", P, {"grad_clip": c}) for c in grad_clips]
    cfg += [(f"(b) DAS shift_clip={c:g} P=8", "das", P, {"shift_clip": c}) for c in shift_clips]
    cfg += [("(c) DAS tempering=adaptive P=8", "das", P, {"tempering": "adaptive"}),
            ("(c) DAS tempering=1 (linear) P=8", "das", P, {"tempering": 1.0}),
            ("(c) DAS gamma=0.1 (lambda=1 at 29%) P=8", "das", P, {"gamma": 0.1}),
            ("(c) DAS tempering=constant (TDS) P=8", "das", P, {"tempering": "constant"}),
            # No VJP before the start: 12 and 15 gradient particles cost 612 and 615 per output.
            ("(d) DAS tempering_start=0.5 P=12", "das", 12, {"tempering_start": 0.5}),
            ("(d) DAS tempering_start=0.7 P=15", "das", 15, {"tempering_start": 0.7}),
            ("(d) DAS gradient=False tempering_start=0.5 P=24", "das", k, {"gradient": False,
                                                                            "tempering_start": 0.5})]
    return cfg


SELECT = [  # the candidates of the fixes table re-run on two validation seeds before one is chosen
    ("best-of-N K=24", "bon", 24, {}),
    ("FK difference P=24", "fk", 24, {"potential": "difference"}),
    ("DAS paper P=8", "das", P, {}),
    ("DAS grad_clip=0.03 P=8", "das", P, {"grad_clip": 0.03}),
    ("DAS grad_clip=0.05 P=8", "das", P, {"grad_clip": 0.05}),
    ("DAS grad_clip=0.1 P=8", "das", P, {"grad_clip": 0.1}),
    ("DAS grad_clip=0.05 tempering_start=0.5 P=12", "das", 12, {"grad_clip": 0.05, "tempering_start": 0.5}),
    ("DAS gradient=False adaptive P=24", "das", 24, {"gradient": False, "tempering": "adaptive"}),
    ("DAS gradient=False tempering_start=0.3 P=24", "das", 24, {"gradient": False, "tempering_start": 0.3}),
    ("DAS gradient=False tempering_start=0.5 P=24", "das", 24, {"gradient": False, "tempering_start": 0.5}),
    ("DAS gradient=False tempering_start=0.7 P=24", "das", 24, {"gradient": False, "tempering_start": 0.7}),
]


def part_select(groups: int, seeds, pool: int) -> dict:
    """The candidates on several validation seeds; mean and spread of the two headline metrics."""
    model, clf, reward = load()
    heldout, _ = bench.heldout_classifier()
    ref = reference(model, clf, reward, pool)
    out = {"config": {"groups": groups, "seeds": list(seeds), "pool": pool, "steps": STEPS, "alpha": ALPHA},
           "reference": {k: v for k, v in ref.items() if k not in ("mu", "cov")}, "rows": {}}
    for label, method, k, kw in SELECT:
        runs = []
        for seed in seeds:
            t0 = time.perf_counter()
            res = run_config(method, model, reward, groups, k, seed, kw)
            m = score(res.samples, reward, clf, heldout, ref)
            m.update(seed=seed, cost=res.cost(C_B), wall_s=time.perf_counter() - t0)
            runs.append(m)
            print(f"{label:>46} seed {seed}: reward {m['target_reward']:.4f} FID-ref {m['fid_to_reference']:.2f} "
                  f"cross {m['cross_reward']:.3f} ({m['wall_s']:.0f}s)", flush=True)
        agg = {key: float(np.mean([r[key] for r in runs])) for key in
               ("target_reward", "reward_gap_to_reference", "fid_to_reference", "hit", "cross_reward", "diversity",
                "cost")}
        agg |= {key + "_sd": float(np.std([r[key] for r in runs])) for key in
                ("target_reward", "fid_to_reference", "cross_reward")}
        out["rows"][label] = {"method": method, "particles": k, "options": kw, "mean": agg, "per_seed": runs}
        out["env"] = provenance()
        write_json(OUT / "select.json", out)
    return out


def part_reference(pool: int) -> None:
    """Recompute the reference (from the cached pool) and store it in the fixes / select json files."""
    model, clf, reward = load()
    ref = {k: v for k, v in reference(model, clf, reward, pool).items() if k not in ("mu", "cov")}
    print(ref, flush=True)
    for name in ("fixes.json", "select.json"):
        path = OUT / name
        if path.exists():
            o = json.loads(path.read_text())
            if o["config"]["pool"] == pool:
                o["reference"] = ref
                write_json(path, o)


MIXTURE_RUNS = [(16, {}), (16, {"grad_clip": 0.5}), (16, {"gradient": False, "tempering_start": 0.5}),
                (32, {"gradient": False, "tempering_start": 0.5}), (32, {"gradient": False, "tempering": "adaptive"})]


def part_mixtures() -> dict:
    """The digits candidates on P1-P4 (DAS's fast-tier sizes: 1024 groups in 2-D, 256 in 16-D; 100 steps, one
    seed) against DAS's fast-tier bounds; P = 32 without gradients is the protocol's equal cost (c_b = 1)."""
    from steerdiff.app.protocols.das import CRITERIA, PROBLEMS, IsotropicMixture, evaluate, validation_sigmas

    out = {"rows": [], "env": provenance()}
    for name in ("P1", "P2", "P3", "P4"):
        prob = PROBLEMS[name]()
        groups = 1024 if prob.mixture.dim == 2 else 256
        rel, tv = CRITERIA[name]
        for k, kw in MIXTURE_RUNS:
            x = sd.randn((groups * k, prob.mixture.dim), seeds=0, dtype=torch.float64)
            res = das(IsotropicMixture(prob.mixture), prob.sampler_reward, x, validation_sigmas(100), alpha=prob.alpha,
                      particles=k, generator=5 * 10**6, batch_size=None, **kw)
            ev = evaluate(prob, res.samples)
            row = {"problem": name, "particles": k, "options": kw, "relerr": ev["relerr"], "mode_tv": ev["mode_tv"],
                   "relerr_bound": rel + 0.05, "tv_bound": tv + 0.05,
                   "passed": ev["relerr"] <= rel + 0.05 and ev["mode_tv"] <= tv + 0.05}
            out["rows"].append(row)
            print(row, flush=True)
    write_json(OUT / "mixtures.json", out)
    return out


def table_mixtures(o: dict) -> str:
    rows = [(r["problem"], str(r["particles"]), ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "default",
             f"{r['relerr']:.3f} (<= {r['relerr_bound']:.2f})", f"{r['mode_tv']:.3f} (<= {r['tv_bound']:.2f})",
             "yes" if r["passed"] else "NO") for r in o["rows"]]
    return "\n".join(["### The candidates on the mixtures (fast-tier sizes, one seed, DAS's fast-tier bounds)", "",
                      f"Run: {provenance_line(o['env'])}", "",
                      markdown_table(["problem", "P", "options", "relerr", "mode TV", "pass"], rows)])


def table_select(o: dict) -> str:
    c, ref = o["config"], o["reference"]
    rows = []
    for label, r in sorted(o["rows"].items(), key=lambda kv: kv[1]["mean"]["fid_to_reference"]):
        m = r["mean"]
        rows.append((label, f"{m['cost']:.0f}", f"{m['target_reward']:.4f} ± {m['target_reward_sd']:.4f}",
                     f"{m['reward_gap_to_reference']:.4f}",
                     f"{m['fid_to_reference']:.2f} ± {m['fid_to_reference_sd']:.2f}", f"{m['hit']:.3f}",
                     f"{m['cross_reward']:.3f} ± {m['cross_reward_sd']:.3f}", f"{m['diversity']:.2f}"))
    return "\n".join([
        f"### Selection: candidates on validation seeds {c['seeds']} ({c['groups']} outputs per seed; mean ± sd over "
        "seeds, sorted by FID to the reference)", "", f"Run: {provenance_line(o['env'])}", "",
        f"Reference as above (pool {ref['pool']}, ESS {ref['ess']:.0f}, E[r] {ref['target_reward']:.4f}, held-out "
        f"log p(3) {ref.get('cross_reward', math.nan):.3f}, diversity {ref.get('diversity', math.nan):.2f}); FID floor "
        "of n exact draws: " + ", ".join(f"n={n}: {v:.2f}" for n, v in ref["fid_floor_sir_draws"].items()),
        "", markdown_table(["method", "cost", "target reward", "abs gap to ref", "FID to ref", "hit",
                            "held-out log p(3)", "diversity"], rows)])


def run_config(method, model, reward, groups, particles, seed, kw, alpha: float = ALPHA):
    noise, gen = noise_for(groups, particles, seed)
    common = dict(particles=particles, generator=gen, batch_size=256)
    if method == "bon":
        return best_of_n(model, reward, noise, grid(), **common)
    if method == "sir":
        return sir(model, reward, noise, grid(), alpha=alpha, **common)
    if method == "fk":
        return fk_steering(model, reward, noise, grid(), alpha=alpha, **common, **kw)
    return das(model, reward, noise, grid(), alpha=alpha, **common, **kw)


def score(samples, reward, clf, heldout, ref, cross=None) -> dict:
    """``cross``: held-out reward of clamped images (default: the held-out classifier's log p(3))."""
    x = samples.float()
    with torch.no_grad():
        r = reward(x).double()
        cross = (heldout(x.clamp(-1, 1))[:, TARGET] if cross is None else cross(x.clamp(-1, 1))).double()
    f = classifier_features(clf, x.clamp(-1, 1))
    return {"target_reward": float(r.mean()), "target_reward_se": float(r.std() / math.sqrt(len(r))),
            "reward_gap_to_reference": abs(float(r.mean()) - ref["target_reward"]),
            "hit": float((r > math.log(0.5)).double().mean()), "cross_reward": float(cross.mean()),
            "fid_to_reference": frechet_from_stats(ref["mu"], ref["cov"], f.mean(0).numpy(),
                                                   np.cov(f.numpy(), rowvar=False)),
            "diversity": pairwise_diversity(f), "n": int(len(r))}


def part_fixes(groups: int, seed: int, pool: int, grad_clips, shift_clips, only=None) -> dict:
    model, clf, reward = load()
    heldout, _ = bench.heldout_classifier()
    ref = reference(model, clf, reward, pool)
    print(f"reference: ESS {ref['ess']:.0f} of {pool}, E[r] {ref['target_reward']:.4f}, floors "
          f"{ref['fid_floor_sir_draws']}", flush=True)
    path = OUT / "fixes.json"
    out = json.loads(path.read_text()) if (only and path.exists()) else {"rows": {}}
    out["config"] = {"groups": groups, "seed": seed, "steps": STEPS, "alpha": ALPHA, "c_b": C_B, "pool": pool}
    out["reference"] = {k: v for k, v in ref.items() if k not in ("mu", "cov")}
    for label, method, k, kw in fix_configs(grad_clips, shift_clips):
        if only and not any(o in label for o in only):
            continue
        t0 = time.perf_counter()
        res = run_config(method, model, reward, groups, k, seed, kw)
        m = score(res.samples, reward, clf, heldout, ref)
        m.update(method=method, particles=k, options=kw, nfe=res.nfe, nfe_grad=res.nfe_grad, cost=res.cost(C_B),
                 wall_s=time.perf_counter() - t0)
        if res.ess is not None:
            m["mean_ess_frac"] = float(np.nanmean(res.ess[:-1].numpy())) / k
            m["final_ess_frac"] = float(res.ess[-1].mean()) / k
            m["resampling_events_per_group"] = float(res.resampled.double().sum(0).mean())
        out["rows"][label] = m
        print(f"{label:>52}: reward {m['target_reward']:.4f} (gap {m['reward_gap_to_reference']:.4f}) hit "
              f"{m['hit']:.3f} FID-ref {m['fid_to_reference']:.2f} cross {m['cross_reward']:.3f} cost {m['cost']:.0f}"
              f" ({m['wall_s']:.0f}s)", flush=True)
        out["env"] = provenance()
        write_json(path, out)
    return out


# ------------------------------------------------------------------------------------------------ test
TEST_SEEDS = (0, 1, 2)  # benchmarks/das.py's seeds; never used in fixes / select (seed 0 only in the diagnosis)
CANDIDATE = "DAS gradient=False adaptive P=24"
TEST = [  # (label, method, particles per output, kwargs); every row is accounted 600 per output (NFE + 2 VJP)
    ("DAS paper P=8", "das", P, {}),
    (CANDIDATE, "das", 24, {"gradient": False, "tempering": "adaptive"}),
    ("FK difference P=24", "fk", 24, {"potential": "difference"}),
    ("best-of-N K=24", "bon", 24, {}),
] + [(f"guidance rho={r:g} (1 chain)", "guidance", 1, {"scale": r}) for r in bench.GUIDANCE_SCALES]


def reward_references(model, clf, heldout, pool: int, rewards=None, pools: dict | None = None):
    """Yield ``(name, reward, alpha, cross, ref)`` for ``benchmarks/das.py``'s digits rewards (its alphas), or those
    in ``rewards``: the held-out reward of clamped images and the tilted reference of a pool of ``pool`` plain
    samples (``pools[name]`` for that reward instead, e.g. a larger pool for a reward whose tilt is far out)."""
    for name, (reward, alpha) in bench.digit_rewards(clf).items():
        if rewards and name not in rewards:
            continue

        def cross(x, name=name):
            return bench.cross_reward(name, heldout, x)

        n = (pools or {}).get(name, pool)
        ref = reference(model, clf, reward, n, alpha=alpha, cross=cross)
        print(f"{name} (alpha {alpha:g}) reference: ESS {ref['ess']:.0f} of {n}, E[r] {ref['target_reward']:.4f}, "
              f"cross {ref['cross_reward']:.3f}, floors {ref['fid_floor_sir_draws']}", flush=True)
        yield name, reward, alpha, cross, ref


def reference_block(alpha: float, ref: dict) -> dict:
    return {"alpha": alpha, "reference": {k: v for k, v in ref.items() if k not in ("mu", "cov")}, "rows": {}}


def part_test(groups: int, seeds, pool: int, rewards=None, pools: dict | None = None) -> dict:
    """The candidates on the test seeds for the three digits rewards of ``benchmarks/das.py`` (its alphas), each
    scored against its own tilted reference (the weighted pool as in ``reference``), mean and spread over seeds.

    Reward guidance runs as ``benchmarks/das.py`` runs it at cost 600: one guided chain per output (das.py runs
    P = 8 chains per group and keeps the first; the other seven do not change the output's law, so here one chain
    per output is run and the cost is accounted as das.py's 600)."""
    model, clf, _ = load()
    heldout, _ = bench.heldout_classifier()
    path = OUT / "test.json"
    out = json.loads(path.read_text()) if (rewards and path.exists()) else {"rewards": {}}
    out["config"] = {"groups": groups, "seeds": list(seeds), "pool": pool, "steps": STEPS, "c_b": C_B,
                     "candidate": CANDIDATE, "pools": {**out.get("config", {}).get("pools", {}), **(pools or {})},
                     "guidance_cost_note": "one chain per output, accounted 600 as in "
                     "benchmarks/das.py (8 chains per group, the first kept)"}
    for name, reward, alpha, cross, ref in reward_references(model, clf, heldout, pool, rewards, pools):
        block = out["rewards"][name] = reference_block(alpha, ref)
        for label, method, k, kw in TEST:
            runs, pooled = [], []
            for seed in seeds:
                t0 = time.perf_counter()
                if method == "guidance":
                    res = bench.run_digits_method("guidance", model, reward, alpha, groups, 1, STEPS, seed, C_B,
                                                  kw["scale"])
                    cost = res.cost(C_B) * P  # das.py's accounting: P chains per group at 600, one output
                else:
                    res = run_config(method, model, reward, groups, k, seed, kw, alpha=alpha)
                    cost = res.cost(C_B)
                m = score(res.samples, reward, clf, heldout, ref, cross=cross)
                m.update(seed=seed, cost=cost, cost_run=res.cost(C_B), wall_s=time.perf_counter() - t0)
                runs.append(m)
                pooled.append(res.samples)
                print(f"{name:>9} {label:>34} seed {seed}: reward {m['target_reward']:.4f} (gap "
                      f"{m['reward_gap_to_reference']:.4f}) FID-ref {m['fid_to_reference']:.2f} cross "
                      f"{m['cross_reward']:.3f} ({m['wall_s']:.0f}s)", flush=True)
            keys = ("target_reward", "reward_gap_to_reference", "fid_to_reference", "hit", "cross_reward",
                    "diversity", "cost")
            agg = {key: float(np.mean([r[key] for r in runs])) for key in keys}
            agg |= {key + "_sd": float(np.std([r[key] for r in runs])) for key in keys[:-1]}
            agg["fid_to_reference_pooled"] = score(torch.cat(pooled), reward, clf, heldout, ref,
                                                   cross=cross)["fid_to_reference"]
            block["rows"][label] = {"method": method, "particles": k, "options": kw, "mean": agg, "per_seed": runs}
            out["env"] = provenance()
            write_json(path, out)
        block["criterion"] = test_criterion(block["rows"])
        write_json(path, out)
    return out


def test_criterion(rows: dict, candidate: str = CANDIDATE) -> dict:
    """The issue's criterion for ``candidate``: |gap| smaller and FID to the reference lower than best-of-N's, FK
    steering's and reward guidance's (every swept rho), and its cross reward not below best-of-N's by more than the
    seed spread (the larger of the two sds)."""
    c = rows[candidate]["mean"]
    others = {lab: r["mean"] for lab, r in rows.items() if r["method"] in ("bon", "fk", "guidance")}
    out = {"candidate": candidate,
           "gap_lowest": all(c["reward_gap_to_reference"] < o["reward_gap_to_reference"] for o in others.values()),
           "fid_lowest": all(c["fid_to_reference"] < o["fid_to_reference"] for o in others.values()),
           "against": {lab: {"gap": c["reward_gap_to_reference"] < o["reward_gap_to_reference"],
                             "fid": c["fid_to_reference"] < o["fid_to_reference"]} for lab, o in others.items()}}
    b = rows["best-of-N K=24"]["mean"]
    spread = max(c["cross_reward_sd"], b["cross_reward_sd"])
    out["cross_ok"] = c["cross_reward"] >= b["cross_reward"] - spread
    out["cross_margin"] = c["cross_reward"] - b["cross_reward"]
    out["cross_spread"] = spread
    out["holds"] = out["gap_lowest"] and out["fid_lowest"] and out["cross_ok"]
    ranked = sorted(rows, key=lambda lab: rows[lab]["mean"]["fid_to_reference"])
    out["closest_by_fid"], out["closest_by_gap"] = ranked[0], min(
        rows, key=lambda lab: rows[lab]["mean"]["reward_gap_to_reference"])
    return out


def table_test(o: dict) -> str:
    c = o["config"]
    yn = {True: "yes", False: "NO"}
    lines = [f"### Test seeds {c['seeds']}: the three digits rewards at equal cost 600 per output ({c['groups']} "
             "outputs per seed; mean ± sd over seeds, sorted by FID to the reference)", "",
             f"Run: {provenance_line(o['env'])}", "",
             "Reward guidance: one guided chain per output, accounted 600 as in `benchmarks/das.py`. FID is to the "
             "reward's tilted reference (the weighted pool's feature Gaussian); the pooled column uses the outputs "
             "of all seeds. Held-out reward: log p(3) of the logistic-regression classifier for class:3, its "
             "largest class log-probability for ink and symmetry.", ""]
    crit = []
    for name, b in o["rewards"].items():
        ref = b["reference"]
        rows = []
        for label, r in sorted(b["rows"].items(), key=lambda kv: kv[1]["mean"]["fid_to_reference"]):
            m = r["mean"]
            rows.append((label, f"{m['cost']:.0f}", f"{m['target_reward']:.4f} ± {m['target_reward_sd']:.4f}",
                         f"{m['reward_gap_to_reference']:.4f} ± {m['reward_gap_to_reference_sd']:.4f}",
                         f"{m['fid_to_reference']:.2f} ± {m['fid_to_reference_sd']:.2f}",
                         f"{m['fid_to_reference_pooled']:.2f}",
                         f"{m['cross_reward']:.3f} ± {m['cross_reward_sd']:.3f}", f"{m['diversity']:.2f}"))
        rows.append((f"tilted reference (pool {ref['pool']}, ESS {ref['ess']:.0f})", "", f"{ref['target_reward']:.4f}",
                     "", "floor " + ", ".join(f"n={n}: {v:.2f}" for n, v in ref["fid_floor_sir_draws"].items()), "",
                     f"{ref['cross_reward']:.3f}", f"{ref['diversity']:.2f}"))
        lines += [f"**{name}** (alpha {b['alpha']:g})", "",
                  markdown_table(["method", "cost", "target reward", "abs gap to ref", "FID to ref (per seed)",
                                  "FID to ref (pooled)", "held-out reward", "diversity"], rows), ""]
        if "criterion" in b:
            k = b["criterion"]
            crit.append((name, k["closest_by_fid"], k["closest_by_gap"], yn[k["gap_lowest"]], yn[k["fid_lowest"]],
                         f"{yn[k['cross_ok']]} ({k['cross_margin']:+.3f}, spread {k['cross_spread']:.3f})",
                         yn[k["holds"]]))
    if crit:
        lines += [f"Criterion for `{o['config']['candidate']}` against best-of-N, FK steering and reward guidance "
                  "(every rho):", "",
                  markdown_table(["reward", "closest (FID)", "closest (gap)", "gap lowest", "FID lowest",
                                  "cross >= BoN - spread", "holds"], crit)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ curve
CURVE_COSTS = (150, 300, 600, 1200)  # per output, NFE + 2 VJP: 6, 12, 24 and 48 gradient-free particles or chains
CURVE_METHODS = [("DAS (library default)", "das", {"gradient": False, "tempering": "adaptive"}),
                 ("best-of-N", "bon", {})]


def part_curve(groups: int, seeds, pool: int, costs=CURVE_COSTS, rewards=None, pools: dict | None = None,
               name: str = "curve") -> dict:
    """Target distance against cost (the issue's curve, 150 to 1200 per output) on the test seeds: the library's DAS
    and best-of-N at each cost, both gradient-free, so cost ``c`` buys ``c / steps`` particles or chains.
    Resumes: a (reward, method, cost, seed) run already in ``<name>.json`` under the same reference is kept; runs
    in parallel (one reward each) write separate files (``name``, e.g. ``curve_ink``), which the table merges."""
    model, clf, _ = load()
    heldout, _ = bench.heldout_classifier()
    path = OUT / f"{name}.json"
    out = json.loads(path.read_text()) if path.exists() else {"rewards": {}}
    out["config"] = {"groups": groups, "seeds": list(seeds), "pool": pool, "pools": pools or {}, "steps": STEPS,
                     "c_b": C_B, "costs": list(costs)}
    for rname, reward, alpha, cross, ref in reward_references(model, clf, heldout, pool, rewards, pools):
        old = out["rewards"].get(rname, {})
        same_ref = old.get("reference", {}).get("pool") == ref["pool"]
        block = out["rewards"][rname] = reference_block(alpha, ref)
        block["rows"] = old.get("rows", {}) if same_ref else {}
        for label, method, kw in CURVE_METHODS:
            for cost in costs:
                k = int(cost // STEPS)
                key = f"{label} @ {cost}"
                runs = [r for r in block["rows"].get(key, {}).get("per_seed", []) if r["seed"] in seeds]
                for seed in seeds:
                    if any(r["seed"] == seed for r in runs):
                        continue
                    t0 = time.perf_counter()
                    res = run_config(method, model, reward, groups, k, seed, kw, alpha=alpha)
                    m = score(res.samples, reward, clf, heldout, ref, cross=cross)
                    m.update(seed=seed, cost=res.cost(C_B), wall_s=time.perf_counter() - t0)
                    runs.append(m)
                    print(f"{rname:>9} {label:>22} cost {cost:>5} seed {seed}: gap {m['reward_gap_to_reference']:.4f} "
                          f"FID-ref {m['fid_to_reference']:.2f} ({m['wall_s']:.0f}s)", flush=True)
                    keys = ("target_reward", "reward_gap_to_reference", "fid_to_reference", "cross_reward", "cost")
                    agg = {q: float(np.mean([r[q] for r in runs])) for q in keys}
                    agg |= {q + "_sd": float(np.std([r[q] for r in runs])) for q in keys[:-1]}
                    block["rows"][key] = {"label": label, "method": method, "particles": k, "budget": cost,
                                          "options": kw, "mean": agg, "per_seed": runs}
                    out["env"] = provenance()
                    write_json(path, out)
        block["criterion"] = curve_criterion(block["rows"], costs)
        write_json(path, out)
    return out


def curve_criterion(rows: dict, costs) -> dict:
    """The issue's curve criterion: the cost at which DAS first reaches best-of-N's target distance at the largest
    cost (by FID to the reference and by |gap|), and whether that is at most half the largest cost."""
    das_label, bon_label = CURVE_METHODS[0][0], CURVE_METHODS[-1][0]
    top = max(costs)
    out = {}
    for metric in ("fid_to_reference", "reward_gap_to_reference"):
        target = rows[f"{bon_label} @ {top}"]["mean"][metric]
        reached = [c for c in sorted(costs) if rows[f"{das_label} @ {c}"]["mean"][metric] <= target]
        first = reached[0] if reached else None
        out[metric] = {"best_of_n_at_max_cost": target, "das_first_cost_reaching_it": first,
                       "holds": first is not None and first <= top / 2}
    return out


def table_curve(o: dict) -> str:
    c = o["config"]
    lines = [f"### Target distance against cost (test seeds {c['seeds']}, {c['groups']} outputs per seed; FID to the "
             "reward's tilted reference / abs gap of the mean target reward, mean ± sd over seeds)", "",
             f"Run: {provenance_line(o['env'])}", ""]
    yn = {True: "yes", False: "NO"}
    crit = []
    for name, b in o["rewards"].items():
        ref = b["reference"]
        labels = [m[0] for m in CURVE_METHODS]
        rows = []
        for label in labels:
            cells = [label]
            for cost in c["costs"]:
                r = b["rows"].get(f"{label} @ {cost}")
                cells.append("" if r is None else f"{r['mean']['fid_to_reference']:.2f} ± "
                             f"{r['mean']['fid_to_reference_sd']:.2f} / {r['mean']['reward_gap_to_reference']:.4f}")
            rows.append(tuple(cells))
        lines += [f"**{name}** (alpha {b['alpha']:g}; reference: pool {ref['pool']}, ESS {ref['ess']:.0f}, E[r] "
                  f"{ref['target_reward']:.4f}, FID floor n=128 {ref['fid_floor_sir_draws']['128']:.2f})", "",
                  markdown_table(["method", *[f"cost {x}" for x in c["costs"]]], rows), ""]
        if "criterion" in b:
            k = b["criterion"]
            for metric, v in k.items():
                crit.append((name, {"fid_to_reference": "FID", "reward_gap_to_reference": "abs gap"}[metric],
                             f"{v['best_of_n_at_max_cost']:.4g}", str(v["das_first_cost_reaching_it"]),
                             yn[v["holds"]]))
    if crit:
        lines += ["DAS reaches best-of-N's target distance at the largest cost at no more than half that cost:", "",
                  markdown_table(["reward", "distance", f"best-of-N at {max(c['costs'])}",
                                  "DAS first reaches it at cost", "holds"], crit)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ lookahead
def part_lookahead(chains: int, seed: int) -> dict:
    """How well the look-ahead reward ``r(D(x_t))`` that SMC weighs by predicts the final reward, per reward and
    sigma: Spearman correlation over plain chains (validation seed), and the share of the final top-decile chains
    among the look-ahead top decile. A weak or negative correlation at high sigma means early resampling on that
    reward selects lineages that do not end well (it spends diversity for nothing)."""
    from scipy.stats import spearmanr

    model, clf, _ = load()
    sig = grid().tolist()
    noise, gen = noise_for(chains, 1, seed)
    seen = []
    plain_chains(ModelCalls(model, lambda v: v.new_zeros(v.shape[0]), 256), noise, sig, None, 1.0,
                 sd.core.make_generators(gen, chains), False, lambda info: seen.append(info["denoised"].clone()), "la")
    final = seen[-1]  # the last step's D (the grid ends at sigma_min: D there is the output up to 0.002 noise)
    out = {"config": {"chains": chains, "seed": seed, "steps": STEPS}, "rewards": {}, "sigmas": sig[:-1]}
    for name, (reward, _alpha) in bench.digit_rewards(clf).items():
        with torch.no_grad():
            r_end = reward(final).double().numpy()
            rows = []
            for d in seen:
                r_t = reward(d).double().numpy()
                top_t, top_end = r_t >= np.quantile(r_t, 0.9), r_end >= np.quantile(r_end, 0.9)
                rows.append({"spearman": float(spearmanr(r_t, r_end).statistic),
                             "top_decile_overlap": float((top_t & top_end).sum() / max(top_end.sum(), 1))})
        out["rewards"][name] = rows
        print(name, " ".join(f"{r['spearman']:+.2f}" for r in rows), flush=True)
    out["env"] = provenance()
    write_json(OUT / "lookahead.json", out)
    return out


def table_lookahead(o: dict) -> str:
    sig = o["sigmas"]
    idx = [i for i in range(len(sig)) if i % 3 == 0 or i == len(sig) - 1]
    rows = [(name, *[f"{rows[i]['spearman']:+.2f} ({rows[i]['top_decile_overlap']:.2f})" for i in idx])
            for name, rows in o["rewards"].items()]
    return "\n".join([f"### Look-ahead reward r(D(x_t)) vs final reward ({o['config']['chains']} plain chains, seed "
                      f"{o['config']['seed']}): Spearman (share of the final top decile in the look-ahead top decile)",
                      "", f"Run: {provenance_line(o['env'])}", "",
                      markdown_table(["reward", *[f"sigma {sig[i]:.3g}" for i in idx]], rows)])


# ------------------------------------------------------------------------------------------------ clipsweep
SHIFT_CLIPS = (0.05, 0.1, 0.2, 0.5)  # caps on |delta| / (tau sqrt(d)): in noise norms, independent of r's scale
CLIPSWEEP_BASELINES = [("DAS paper P=8 (no cap)", "das", P, {}), ("best-of-N K=24", "bon", 24, {}),
                       ("DAS gradient=False adaptive P=24", "das", 24, {"gradient": False, "tempering": "adaptive"})]


def clipsweep_configs(shift_clips) -> list[tuple[str, str, int, dict]]:
    return [(f"DAS shift_clip={c:g} P=8", "das", P, {"shift_clip": c}) for c in shift_clips] + CLIPSWEEP_BASELINES


def part_clipsweep(groups: int, seed: int, pool: int, shift_clips=SHIFT_CLIPS, rewards=None) -> dict:
    """Gradient DAS (P = 8) with ``shift_clip`` on the validation seed for the three digits rewards
    (``benchmarks/das.py``'s alphas), beside best-of-N (K = 24) and ``das(gradient=False, tempering="adaptive")``
    (P = 24), all at cost 600 per output, each reward against its own tilted reference."""
    if seed in TEST_SEEDS:
        raise ValueError(f"clipsweep runs on a validation seed, not the test seeds {TEST_SEEDS}")
    model, clf, _ = load()
    heldout, _ = bench.heldout_classifier()
    path = OUT / "clipsweep.json"
    out = json.loads(path.read_text()) if (rewards and path.exists()) else {"rewards": {}}
    out["config"] = {"groups": groups, "seed": seed, "pool": pool, "steps": STEPS, "c_b": C_B,
                     "shift_clips": list(shift_clips)}
    for name, reward, alpha, cross, ref in reward_references(model, clf, heldout, pool, rewards):
        block = out["rewards"][name] = reference_block(alpha, ref)
        for label, method, k, kw in clipsweep_configs(shift_clips):
            t0 = time.perf_counter()
            res = run_config(method, model, reward, groups, k, seed, kw, alpha=alpha)
            m = score(res.samples, reward, clf, heldout, ref, cross=cross)
            m.update(method=method, particles=k, options=kw, cost=res.cost(C_B), wall_s=time.perf_counter() - t0)
            if res.ess is not None:
                m["mean_ess_frac"] = float(np.nanmean(res.ess[:-1].numpy())) / k
            block["rows"][label] = m
            print(f"{name:>9} {label:>34}: reward {m['target_reward']:.4f} (gap {m['reward_gap_to_reference']:.4f}) "
                  f"FID-ref {m['fid_to_reference']:.2f} cross {m['cross_reward']:.3f} ({m['wall_s']:.0f}s)", flush=True)
            out["env"] = provenance()
            write_json(path, out)
    return out


def table_clipsweep(o: dict) -> str:
    c = o["config"]
    lines = [f"### shift_clip across rewards (validation seed {c['seed']}, {c['groups']} outputs per configuration, "
             "cost 600 per output; gap / FID to the reward's tilted reference)", "",
             f"Run: {provenance_line(o['env'])}", ""]
    names = list(o["rewards"])
    rows = []
    for label, *_ in clipsweep_configs(c["shift_clips"]):
        cells = [label]
        for n in names:
            m = o["rewards"][n]["rows"].get(label)
            cells.append("-" if m is None else f"{m['reward_gap_to_reference']:.4f} / {m['fid_to_reference']:.2f}")
        rows.append(cells)
    rows.append(["tilted reference: ESS, E[r], FID floor n=" + str(c["groups"])]
                + [f"{o['rewards'][n]['reference']['ess']:.0f}, {o['rewards'][n]['reference']['target_reward']:.4f}, "
                   f"{o['rewards'][n]['reference']['fid_floor_sir_draws'].get(str(c['groups']), math.nan):.2f}"
                   for n in names])
    lines.append(markdown_table(["method"] + [f"{n} (alpha {o['rewards'][n]['alpha']:g}): gap / FID" for n in names],
                                rows))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ report
def _f(v, fmt=".3f"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def table_diag(d: dict) -> str:
    cols = [("i", "d"), ("sigma", ".3g"), ("lambda", ".3f"), ("ess_frac", ".2f"), ("resampled_frac", ".2f"),
            ("max_weight", ".2f"), ("dead_frac", ".2f"), ("distinct_ancestors", ".1f"), ("root_lineages", ".1f"),
            ("increment_sd", ".2f"), ("log_pq_sd", ".2f"), ("twist_term_sd", ".2f"), ("grad_D_norm", ".3g"),
            ("grad_x_norm", ".3g"), ("drift_norm", ".3g"), ("plain_step_norm", ".3g"), ("noise_norm", ".3g"),
            ("drift_over_noise", ".3g"), ("drift_over_noise_max", ".3g"), ("cos_nearest", ".2f"),
            ("cos_all_pairs", ".2f"), ("das_p3", ".3f"), ("plain_p3", ".3f"),
            ("das_fid_test", ".1f"), ("plain_fid_test", ".1f"), ("das_fid_real3", ".1f"),
            ("plain_fid_real3", ".1f"), ("plain_fid_to_das", ".1f")]
    rows = [[_f(r.get(c), f) for c, f in cols] for r in d["steps"]]
    fin, cost = d["final"], d["cost"]
    fin = {k: (", ".join(f"{q:.3f}" for q in v) if isinstance(v, list) else v) for k, v in fin.items()}
    lines = [f"### Diagnosis: DAS P={d['config']['particles']}, {d['config']['groups']} groups, seed "
             f"{d['config']['seed']}, {d['config']['steps']} steps", "", f"Run: {provenance_line(d['env'])}", "",
             markdown_table([c for c, _ in cols], rows), "",
             markdown_table(["final", "value"], [(k, v if isinstance(v, str) else _f(v, ".3f"))
                                                 for k, v in fin.items()]), "",
             markdown_table(["cost", "value"], [(k, _f(v, ".3f") if isinstance(v, float) else str(v))
                                                for k, v in cost.items()])]
    return "\n".join(lines)


def table_fixes(o: dict) -> str:
    ref = o["reference"]
    rows = []
    for label, m in sorted(o["rows"].items(), key=lambda kv: kv[1]["fid_to_reference"]):
        rows.append((label, f"{m['cost']:.0f}", f"{m['target_reward']:.4f} ± {m['target_reward_se']:.4f}",
                     f"{m['reward_gap_to_reference']:.4f}", f"{m['fid_to_reference']:.2f}", f"{m['hit']:.3f}",
                     f"{m['cross_reward']:.3f}", f"{m['diversity']:.2f}", _f(m.get("mean_ess_frac"), ".2f"),
                     _f(m.get("resampling_events_per_group"), ".1f")))
    c = o["config"]
    return "\n".join([
        f"### Fixes at equal cost per output (validation seed {c['seed']}, {c['groups']} outputs each, sorted by "
        "FID to the reference)", "", f"Run: {provenance_line(o['env'])}", "",
        f"Reference: {ref['pool']} plain samples weighted ∝ exp(r/alpha): ESS {ref['ess']:.0f}, E[r] "
        f"{ref['target_reward']:.4f} (plain {ref['plain_target_reward']:.3f}), hit {ref['hit']:.3f}, held-out log p(3) "
        f"{ref.get('cross_reward', math.nan):.3f}, diversity {ref.get('diversity', math.nan):.2f}; FID floor "
        f"(n importance-resampled draws from a disjoint half): "
        + ", ".join(f"n={n}: {v:.2f}" for n, v in ref["fid_floor_sir_draws"].items()), "",
        markdown_table(["method", "cost", "target reward ± se", "abs gap to ref", "FID to ref", "hit (p3>0.5)",
                        "held-out log p(3)", "diversity", "mean ESS/P", "resamplings/group"], rows)])


def plots(d: dict | None, o: dict | None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if d:
        s = d["steps"]
        sig = [r["sigma"] for r in s]
        fig, ax = plt.subplots(2, 3, figsize=(14, 7))
        a = ax[0, 0]
        a.plot(sig, [r["ess_frac"] for r in s], "o-", label="ESS / P (before resampling)")
        a.plot(sig, [r["max_weight"] for r in s], "s-", label="max normalised weight")
        a.plot(sig, [r["lambda"] for r in s], "^-", label="lambda_t")
        a.plot(sig, [r["resampled_frac"] for r in s], "x", label="share of groups resampled")
        a.set_title("weights and tempering")
        a = ax[0, 1]
        a.plot(sig, [r["increment_sd"] for r in s], "o-", label="sd of the log-weight increment")
        a.plot(sig, [r.get("log_pq_sd", np.nan) for r in s], "s-", label="  its log p/q (proposal) term")
        a.plot(sig, [r.get("twist_term_sd", np.nan) for r in s], "^-", label="  its twist term")
        a.plot(sig, [r["root_lineages"] for r in s], "k.-", label="surviving initial lineages (of 8)")
        a.set_yscale("symlog")
        a.set_title("weight degeneracy")
        a = ax[0, 2]
        a.plot(sig, [r.get("drift_norm", np.nan) for r in s], "o-", label="|twist drift| (median)")
        a.plot(sig, [r.get("drift_norm_p90", np.nan) for r in s], "o--", label="|twist drift| (p90)")
        a.plot(sig, [r["plain_step_norm"] for r in s], "s-", label="|plain step mu - x|")
        a.plot(sig, [r["noise_norm"] for r in s], "^-", label="noise tau sqrt(d)")
        a.set_yscale("log")
        b = a.twinx()
        b.plot(sig, [r.get("drift_over_noise_max", np.nan) for r in s], "k^:", label="max |drift| / noise")
        b.set_yscale("log")
        b.legend(fontsize=7, loc="upper right")
        a.set_title("how far the proposal moves")
        a = ax[1, 0]
        a.plot(sig, [r.get("grad_x_norm", np.nan) for r in s], "o-", label="|grad_x r(D(x))| (median)")
        a.plot(sig, [r["grad_D_norm"] for r in s], "s-", label="|grad_D r(D)| (median)")
        a.set_yscale("log")
        b = a.twinx()
        b.plot(sig, [r.get("cos_nearest", np.nan) for r in s], "k^:", label="cos nearest particle")
        b.plot(sig, [r.get("cos_all_pairs", np.nan) for r in s], "kx:", label="cos all pairs")
        b.set_ylim(-0.2, 1.05)
        b.legend(fontsize=7, loc="lower right")
        a.set_title("reward gradient")
        a = ax[1, 1]
        a.plot(sig, [r["das_p3"] for r in s], "o-", label="DAS p(3 | D(x_t))")
        a.plot(sig, [r["plain_p3"] for r in s], "s-", label="plain p(3 | D(x_t))")
        a.set_title("classifier on the Tweedie estimates")
        a = ax[1, 2]
        a.plot(sig, [r["das_fid_test"] for r in s], "o-", label="DAS D(x_t) to test split")
        a.plot(sig, [r["plain_fid_test"] for r in s], "s-", label="plain D(x_t) to test split")
        a.plot(sig, [r["das_fid_real3"] for r in s], "o--", label="DAS D(x_t) to real 3s")
        a.plot(sig, [r["plain_fid_real3"] for r in s], "s--", label="plain D(x_t) to real 3s")
        a.plot(sig, [r["plain_fid_to_das"] for r in s], "^-", label="DAS vs plain D(x_t)")
        a.set_title("FID-digits of the Tweedie estimates")
        for a in ax.flat:
            a.set_xscale("log")
            a.invert_xaxis()
            a.set_xlabel("sigma (sampling runs left to right)")
            a.grid(alpha=0.3)
            a.legend(fontsize=7, loc="best")
        fig.tight_layout()
        p = OUT / "diag_per_step.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    if o:
        fig, a = plt.subplots(figsize=(9, 6))
        for label, m in o["rows"].items():
            kind = m["method"]
            mk = {"bon": "s", "sir": "D", "fk": "^", "das": "o"}[kind]
            a.scatter(m["reward_gap_to_reference"] + 1e-4, m["fid_to_reference"], marker=mk, s=40)
            a.annotate(label, (m["reward_gap_to_reference"] + 1e-4, m["fid_to_reference"]), fontsize=6)
        fl = o["reference"]["fid_floor_sir_draws"].get(str(o["config"]["groups"]))
        if fl:
            a.axhline(fl, color="gray", ls=":", label=f"floor: {o['config']['groups']} exact draws")
            a.legend(fontsize=8)
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("|mean target reward - reference's|")
        a.set_ylabel("FID-digits to the tilted reference")
        a.set_title(f"equal cost per output 600 (NFE + 2 VJP), validation seed {o['config']['seed']}")
        a.grid(alpha=0.3)
        fig.tight_layout()
        p = OUT / "fixes.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    return paths


def write_report() -> None:
    d = json.loads((OUT / "diag.json").read_text()) if (OUT / "diag.json").exists() else None
    o = json.loads((OUT / "fixes.json").read_text()) if (OUT / "fixes.json").exists() else None
    sel = json.loads((OUT / "select.json").read_text()) if (OUT / "select.json").exists() else None
    mix = json.loads((OUT / "mixtures.json").read_text()) if (OUT / "mixtures.json").exists() else None
    te = json.loads((OUT / "test.json").read_text()) if (OUT / "test.json").exists() else None
    cs = json.loads((OUT / "clipsweep.json").read_text()) if (OUT / "clipsweep.json").exists() else None
    cu = None
    for path in sorted(OUT.glob("curve*.json")):  # curve.json, then curve_<reward>.json of parallel runs
        part = json.loads(path.read_text())
        cu = part if cu is None else {**cu, "rewards": {**cu["rewards"], **part["rewards"]}}
    la = json.loads((OUT / "lookahead.json").read_text()) if (OUT / "lookahead.json").exists() else None
    parts = [t(x) for t, x in ((table_diag, d), (table_fixes, o), (table_select, sel), (table_mixtures, mix),
                               (table_test, te), (table_clipsweep, cs), (table_curve, cu), (table_lookahead, la))
             if x]
    paths = plots(d, o)
    parts.append("Plots: " + ", ".join(f"`{Path(p).relative_to(Path(__file__).resolve().parents[1])}`"
                                       for p in paths))
    write_text(OUT / "das_diagnosis.md", "# DAS on digits, class:3: diagnosis\n\n" + "\n\n".join(parts) + "\n")
    print("\n\n".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all",
                    choices=["diag", "fixes", "select", "reference", "mixtures", "test", "clipsweep", "curve",
                             "lookahead", "all", "table"])
    ap.add_argument("--select-seeds", type=int, nargs="*", default=[100, 101])
    ap.add_argument("--select-groups", type=int, default=192)
    ap.add_argument("--groups", type=int, default=32, help="groups in the diagnosis run")
    ap.add_argument("--fix-groups", type=int, default=128, help="outputs per fix configuration")
    ap.add_argument("--seed", type=int, default=0, help="diagnosis seed")
    ap.add_argument("--val-seed", type=int, default=100, help="validation seed for the fixes")
    ap.add_argument("--pool", type=int, default=8192)
    ap.add_argument("--grad-clips", type=float, nargs="*", default=[0.02, 0.03, 0.05, 0.1])
    ap.add_argument("--shift-clips", type=float, nargs="*", default=[0.05, 0.1, 0.2])
    ap.add_argument("--test-seeds", type=int, nargs="*", default=list(TEST_SEEDS))
    ap.add_argument("--test-groups", type=int, default=64, help="outputs per seed in the test part")
    ap.add_argument("--test-rewards", nargs="*", help="run only these rewards of the test part (others kept)")
    ap.add_argument("--clip-groups", type=int, default=128, help="outputs per configuration in clipsweep")
    ap.add_argument("--clip-rewards", nargs="*", help="run only these rewards of the clipsweep part (others kept)")
    ap.add_argument("--only", nargs="*", help="run only the fix rows whose label contains one of these")
    ap.add_argument("--pool-for", nargs="*", default=[], metavar="REWARD=N",
                    help="a larger reference pool for one reward (test and curve parts), e.g. ink=65536")
    ap.add_argument("--curve-groups", type=int, default=128, help="outputs per seed and cost in the curve part")
    ap.add_argument("--curve-rewards", nargs="*", help="run only these rewards of the curve part (others kept)")
    ap.add_argument("--curve-out", default="curve", help="json name of the curve part (parallel runs: one each)")
    ap.add_argument("--lookahead-chains", type=int, default=1024, help="plain chains in the lookahead part")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    pools = {}
    for item in args.pool_for:
        name, _, n = item.partition("=")
        if not n.isdigit():
            ap.error(f"--pool-for takes REWARD=N, got {item!r}")
        pools[name] = int(n)
    torch.set_num_threads(args.threads)
    if args.part in ("diag", "all"):
        part_diag(args.groups, args.seed)
    if args.part in ("fixes", "all"):
        part_fixes(args.fix_groups, args.val_seed, args.pool, args.grad_clips, args.shift_clips, args.only)
    if args.part in ("select", "all"):
        part_select(args.select_groups, args.select_seeds, args.pool)
    if args.part in ("mixtures", "all"):
        part_mixtures()
    if args.part in ("test", "all"):
        part_test(args.test_groups, args.test_seeds, args.pool, args.test_rewards, pools)
    if args.part in ("clipsweep", "all"):
        part_clipsweep(args.clip_groups, args.val_seed, args.pool, SHIFT_CLIPS, args.clip_rewards)
    if args.part in ("curve", "all"):
        part_curve(args.curve_groups, args.test_seeds, args.pool, CURVE_COSTS, args.curve_rewards, pools,
                   args.curve_out)
    if args.part in ("lookahead", "all"):
        part_lookahead(args.lookahead_chains, args.val_seed)
    if args.part == "reference":
        part_reference(args.pool)
    write_report()


if __name__ == "__main__":
    main()
