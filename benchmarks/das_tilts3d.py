"""The library's default DAS on exact 3-D tilts (issue 38, "The default DAS, looked at again").

``docs/methods/das.md``, "The default on 3-D exact tilts", reads the output. For each problem of
``steerdiff.app.protocols.das.TILTS_3D`` (anisotropic 3-D mixtures with a quadratic and a linear reward):

* ``reference``: the 100-step chain's own tilted law, from a pool of plain chains weighted ``∝ exp(r / alpha)``
  (its mean reward and mode weights beside the closed form: the part of every sampler's error that is the chain's);
* ``methods``: the default DAS (gradient-free, adaptive), gradient-free DAS with the ``exp`` schedule, SIR and the
  paper's DAS at the protocol's equal cost (``run_method``: a budget of B gradient particles is 2B gradient-free
  particles or chains), budgets 16 and 64, seed 1;
* ``trace``: the default's lambda path, ESS and resampling rate per step.

Exploratory parts (the numbers of the diagnosis; ``--case`` is ``T3q``, ``T3l`` or a seed of :func:`random_case`,
the generator the 3-D cases were searched with; T3q is case 12 rounded):

* ``pool``: 10^5 plain chains; at each step the intermediate target ``∝ exp(r(D(x_i)) / alpha)`` as weights, and
  the share of its mass on chains that *end* in each mode;
* ``minimal``: an independent 30-line twisted SMC (same twist, multinomial resampling) at ESS thresholds 0.5 and 1;
* ``variants``: the default with other resamplers / thresholds, ``exp``, ``zero`` (one case, P, groups);
* ``validation``: random cases (``--cases 0 10``): the default, ``exp``, the adaptive schedule capped by the ``exp``
  levels, SIR.

    python benchmarks/das_tilts3d.py                 # the main part, ~3 min of CPU on one thread
    python benchmarks/das_tilts3d.py --groups 512 --budgets 16
    python benchmarks/das_tilts3d.py --part pool --case 12
    python benchmarks/das_tilts3d.py --part minimal --case 12 --particles 128 --groups 256
    python benchmarks/das_tilts3d.py --part variants --case 12 --particles 128 --groups 256
    python benchmarks/das_tilts3d.py --part validation --cases 0 10 --groups 256 --particles 32 --seed 1
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align import das, sir, tempering_schedule
from steerdiff.align.rewards import Quadratic
from steerdiff.app.protocols.das import LIBRARY_DAS, TILTS_3D, evaluate, run_method, validation_sigmas
from steerdiff.metrics import mode_weight_error
from steerdiff.models import GaussianMixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import results_dir, write_json  # noqa: E402

METHODS = {
    "default DAS (gradient-free, adaptive)": ("das", LIBRARY_DAS),
    "gradient-free DAS, exp schedule": ("das", {"gradient": False, "tempering": "exp"}),
    "SIR": ("sir", {}),
    "paper DAS (gradient, exp)": ("das", {}),
}


def chain_reference(prob, n: int = 100_000) -> dict:
    """Plain chains (``tempering="zero"``: no intermediate weight) weighted by ``exp(r / alpha)``."""
    noise = sd.randn((n, 3), seeds=777, dtype=torch.float64)
    res = das(prob.mixture, prob.reward, noise, validation_sigmas(100), alpha=prob.alpha, particles=n, generator=1,
              output="weighted", tempering="zero", batch_size=None)
    x = res.samples.double()
    r = prob.reward(x)
    w = torch.softmax(r / prob.alpha, 0)
    mean = float((w * r).sum())
    ess = float(1 / (w**2).sum())
    comp = prob.tilted.responsibilities(x).argmax(-1)
    modes = torch.zeros(prob.tilted.n_components, dtype=torch.float64).index_add_(0, comp, w)
    return {"mean_reward": mean, "se": float((w * (r - mean) ** 2).sum().sqrt()) / math.sqrt(ess), "ess": ess,
            "modes": modes.tolist(), "exact_reward": prob.exact_reward, "exact_modes": prob.tilted.weights.tolist()}


def trace(prob, groups: int, budget: int) -> dict:
    res = run_method(prob, "das", groups, seed=1, particles=budget, fast=False, **LIBRARY_DAS)
    return {"sigma": validation_sigmas(100)[:-1].tolist(), "lambda": res.lambdas.double().mean(1).tolist(),
            "ess_over_p": (res.ess.double().mean(1) / res.particles).tolist(),
            "resampled": res.resampled.double().mean(1).tolist()}


def random_case(seed: int):
    """The generator the 3-D cases were searched with: 3-5 components, means ``2.5 N(0, I)``, covariance
    eigenvalues log-uniform in [0.02, 3] in random bases; even seeds a quadratic reward (curvatures 1 / 0.3 / 0.05
    in a random basis, centre ``N(0, I)``), odd seeds a unit linear one; alpha 0.5 / 1 / 2 by ``seed % 3``."""
    g = torch.Generator().manual_seed(seed)
    k = 3 + int(torch.randint(0, 3, (1,), generator=g))
    means = 2.5 * torch.randn(k, 3, generator=g, dtype=torch.float64)
    w = 1.0 + 2 * torch.rand(k, generator=g, dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(k, 3, 3, generator=g, dtype=torch.float64)).Q
    ev = torch.exp(torch.empty(k, 3, dtype=torch.float64).uniform_(math.log(0.02), math.log(3.0), generator=g))
    mix = GaussianMixture(w, means, q @ torch.diag_embed(ev) @ q.mT)
    alpha = [0.5, 1.0, 2.0][seed % 3]
    if seed % 2 == 0:
        c = torch.randn(3, generator=g, dtype=torch.float64)
        qa = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64)).Q
        reward = Quadratic.around(qa @ torch.diag(torch.tensor([1.0, 0.3, 0.05], dtype=torch.float64)) @ qa.T, c=c)
    else:
        a = torch.randn(3, generator=g, dtype=torch.float64)
        reward = Quadratic(torch.zeros(3), a / a.norm())
    return f"case {seed} ({'quad' if seed % 2 == 0 else 'lin'}, K={k}, alpha={alpha})", mix, reward, alpha


def get_case(spec: str):
    if spec in TILTS_3D:
        prob = TILTS_3D[spec]()
        return spec, prob.mixture, prob.reward, prob.alpha
    return random_case(int(spec))


class _CappedAdaptive:
    """The adaptive lambda capped by fixed levels (a candidate fix; patched in for the ``validation`` part only)."""

    def __init__(self, original, levels):
        self.original, self.levels, self.i = original, levels, 0

    def __call__(self, logw, base, rho, lo, target, iters=40):
        cap = float(self.levels[self.i])
        self.i += 1
        lam = self.original(logw, base, rho, lo, target, iters)
        return torch.minimum(lam, torch.maximum(lo, torch.full_like(lam, cap)))


def sigma_levels(s: float, steps: int = 100) -> list[float]:
    """The sigma-bounded levels ``min(1, (s / sigma_i)^2)`` on the protocol grid (das.md, "Tried: a sigma-bounded
    lambda"): the look-ahead twist stays weak while the posterior covariance it omits is wide."""
    return (s / validation_sigmas(steps)[:steps].double()).pow(2).clamp(max=1.0).tolist()


def run_case(mix, reward, alpha, P: int, groups: int, seed: int, kw: dict | None, cap=False) -> dict:
    """One sampler (``kw`` None: SIR; else DAS with ``kw``) on a case; gap of the mean reward, TV, mode shares.
    ``cap``: True caps the adaptive lambda by the ``exp`` levels, a list of levels by those."""
    noise = sd.randn((groups * P, 3), seeds=seed * 10**7, dtype=torch.float64)
    gen = seed * 10**7 + 5 * 10**6
    module = sys.modules["steerdiff.align.das"]
    original = module._adaptive_lambda
    if cap:
        levels = tempering_schedule("exp", 100) if cap is True else torch.tensor(cap + [1.0], dtype=torch.float64)
        module._adaptive_lambda = _CappedAdaptive(original, levels)
    try:
        if kw is None:
            res = sir(mix, reward, noise, validation_sigmas(100), alpha=alpha, particles=P, generator=gen)
        else:
            res = das(mix, reward, noise, validation_sigmas(100), alpha=alpha, particles=P, generator=gen, **kw)
    finally:
        module._adaptive_lambda = original
    tilted = reward.tilt(mix, alpha)
    x = res.samples.double()
    r = reward(x)
    comp = tilted.responsibilities(x).argmax(-1)
    return {"gap": float(r.mean()) - reward.expected(tilted), "se": float(r.std()) / math.sqrt(groups),
            "mode_tv": mode_weight_error(x, tilted),
            "modes": (torch.bincount(comp, minlength=tilted.n_components).double() / groups).tolist()}


def part_pool(spec: str, n: int) -> dict:
    name, mix, reward, alpha = get_case(spec)
    tilted = reward.tilt(mix, alpha)
    sig = validation_sigmas(100)
    seen = {}

    def keep(info):
        if info["i"] % 5 == 0:
            seen[info["i"]] = info["denoised"].double().clone()

    noise = sd.randn((n, 3), seeds=123, dtype=torch.float64)
    res = das(mix, reward, noise, sig, alpha=alpha, particles=n, generator=1, output="weighted", tempering="zero",
              batch_size=None, callback=keep)
    final = tilted.responsibilities(res.samples.double()).argmax(-1)
    rows = []
    for i, d in sorted(seen.items()):
        w = torch.softmax(reward(d) / alpha, 0)
        share = torch.zeros(tilted.n_components, dtype=torch.float64).index_add_(0, final, w)
        rows.append({"i": i, "sigma": float(sig[i]), "ess": float(1 / (w**2).sum()),
                     "share_by_final_mode": share.tolist()})
        print(f"{name} i={i:3d} sigma={float(sig[i]):7.3f} twisted target's mass by final mode "
              f"{[round(v, 3) for v in share.tolist()]}", flush=True)
    w = torch.softmax(reward(res.samples.double()) / alpha, 0)
    end = torch.zeros(tilted.n_components, dtype=torch.float64).index_add_(0, final, w).tolist()
    print(f"{name} final {[round(v, 3) for v in end]} exact {[round(v, 3) for v in tilted.weights.tolist()]}")
    return {"case": name, "steps": rows, "final": end, "exact": tilted.weights.tolist()}


def part_minimal(spec: str, P: int, groups: int) -> dict:
    """An SMC written apart from the library: twist ``exp(r(D(x_i)) / alpha)`` at full strength (what the adaptive
    default runs), the ancestral kernel, multinomial resampling below the ESS threshold, weighted mode shares."""
    name, mix, reward, alpha = get_case(spec)
    tilted = reward.tilt(mix, alpha)
    sig = validation_sigmas(100).tolist()
    out = {}
    for thr in (0.5, 1.0):
        g = torch.Generator().manual_seed(7)
        x = sig[0] * torch.randn(groups, P, 3, generator=g, dtype=torch.float64)
        logw = torch.zeros(groups, P, dtype=torch.float64)
        prev = torch.zeros(groups, P, dtype=torch.float64)
        for i in range(len(sig) - 1):
            s0, s1 = sig[i], sig[i + 1]
            d = mix(x.reshape(-1, 3), torch.tensor(s0)).reshape(groups, P, 3)
            cur = reward(d.reshape(-1, 3)).reshape(groups, P) / alpha
            logw, prev = logw + cur - prev, cur
            W = torch.softmax(logw, 1)
            do = 1 / (W**2).sum(1) < thr * P
            if do.any():
                idx = torch.multinomial(W[do], P, replacement=True, generator=g)
                x[do] = torch.gather(x[do], 1, idx[..., None].expand(-1, -1, 3))
                d[do] = torch.gather(d[do], 1, idx[..., None].expand(-1, -1, 3))
                prev[do] = torch.gather(prev[do], 1, idx)
                logw[do] = 0.0
            tau = math.sqrt(s1**2 * (s0**2 - s1**2) / s0**2)
            x = d + (s1**2 / s0**2) * (x - d) + tau * torch.randn(groups, P, 3, generator=g, dtype=torch.float64)
        W = torch.softmax(logw + reward(x.reshape(-1, 3)).reshape(groups, P) / alpha - prev, 1)
        comp = tilted.responsibilities(x.reshape(-1, 3)).argmax(-1).reshape(groups, P)
        share = [float((W * (comp == k)).sum(1).mean()) for k in range(tilted.n_components)]
        out[str(thr)] = share
        print(f"{name} minimal SMC P={P} threshold {thr}: weighted mode shares {[round(v, 3) for v in share]} "
              f"exact {[round(v, 3) for v in tilted.weights.tolist()]}", flush=True)
    return {"case": name, "particles": P, "groups": groups, "shares": out, "exact": tilted.weights.tolist()}


VARIANTS = {"default": {}, "multinomial": {"resampler": "multinomial"}, "systematic": {"resampler": "systematic"},
            "ess_threshold=1": {"ess_threshold": 1.0}, "ess_threshold=0.2": {"ess_threshold": 0.2},
            "exp": {"tempering": "exp"}, "zero (SIR)": {"tempering": "zero"}}


def part_variants(spec: str, P: int, groups: int, seed: int) -> dict:
    name, mix, reward, alpha = get_case(spec)
    out = {}
    for label, kw in VARIANTS.items():
        out[label] = o = run_case(mix, reward, alpha, P, groups, seed, kw)
        print(f"{name} P={P} {label}: gap {o['gap']:+.3f} ± {o['se']:.3f} TV {o['mode_tv']:.3f} modes "
              f"{[round(v, 3) for v in o['modes']]}", flush=True)
    return {"case": name, "particles": P, "groups": groups, "seed": seed, "rows": out}


def part_validation(lo: int, hi: int, P: int, groups: int, seed: int) -> dict:
    cands = {"default": ({}, False), "exp": ({"tempering": "exp"}, False), "adaptive<=exp": ({}, True),
             "SIR": (None, False), "sigma(s=1)": ({"tempering": sigma_levels(1.0)}, False),
             "adaptive<=sigma(s=1)": ({}, sigma_levels(1.0))}
    out = {}
    for s in range(lo, hi):
        name, mix, reward, alpha = random_case(s)
        out[name] = row = {k: run_case(mix, reward, alpha, P, groups, seed, kw, cap) for k, (kw, cap) in cands.items()}
        print(f"{name:32s} " + " | ".join(f"{k} {o['gap']:+.3f}±{o['se']:.3f} tv {o['mode_tv']:.3f}"
                                           for k, o in row.items()), flush=True)
    return {"particles": P, "groups": groups, "seed": seed, "cases": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=1024)
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--pool", type=int, default=100_000)
    ap.add_argument("--part", default="main", choices=["main", "pool", "minimal", "variants", "validation"])
    ap.add_argument("--case", default="T3q")
    ap.add_argument("--cases", type=int, nargs=2, default=[0, 10])
    ap.add_argument("--particles", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out_dir = results_dir("das_tilts3d")
    if args.part == "pool":
        write_json(out_dir / f"pool_{args.case}.json", part_pool(args.case, args.pool))
        return
    if args.part == "minimal":
        write_json(out_dir / f"minimal_{args.case}.json", part_minimal(args.case, args.particles, args.groups))
        return
    if args.part == "variants":
        write_json(out_dir / f"variants_{args.case}.json",
                   part_variants(args.case, args.particles, args.groups, args.seed))
        return
    if args.part == "validation":
        write_json(out_dir / "validation.json", part_validation(*args.cases, args.particles, args.groups, args.seed))
        return
    out = {"groups": args.groups, "seed": 1, "problems": {}}
    for name, make in TILTS_3D.items():
        prob = make()
        t = time.process_time()
        entry = {"reference": chain_reference(prob, args.pool), "methods": {}}
        print(name, "reference", entry["reference"], f"({time.process_time() - t:.0f} s)", flush=True)
        for label, (method, kw) in METHODS.items():
            for budget in args.budgets:
                t = time.process_time()
                res = run_method(prob, method, args.groups, seed=1, particles=budget, fast=False, **kw)
                ev = evaluate(prob, res.samples)
                x = res.samples.double()
                row = {"particles": res.particles, "cost": res.cost(1.0), "gap": ev["mean_reward"] - ev["exact_reward"],
                       "se": float(prob.reward(x).std()) / math.sqrt(x.shape[0]), "relerr": ev["relerr"],
                       "mode_tv": ev["mode_tv"], "cpu_s": time.process_time() - t}
                entry["methods"].setdefault(label, {})[str(budget)] = row
                print(f"{name} {label} budget {budget} (P = {res.particles}): gap {row['gap']:+.3f} ± {row['se']:.3f} "
                      f"TV {row['mode_tv']:.3f}", flush=True)
        entry["trace"] = trace(prob, 256, 16)
        out["problems"][name] = entry
    write_json(out_dir / "tilts3d.json", out)


if __name__ == "__main__":
    main()
