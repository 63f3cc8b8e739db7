"""A sigma-bounded tempering for gradient-free DAS, probed against the default on the 3-D exact tilts and the fast
validation tier (``docs/methods/das.md``, "The default on 3-D exact tilts", "Tried: a sigma-bounded lambda").

The levels ``lambda_i = min(1, (s / sigma_i)^2)`` keep the look-ahead twist ``r(D(x)) / alpha`` weak while the
posterior ``Cov[x0 | x_i]`` (of order ``sigma_i^2`` until the components separate) is wide, where the twist omits the
covariance term and misranks anisotropic components; ``s = 0`` runs the library default (adaptive). The levels are
the registered ``tempering="sigma"`` with ``gamma = s`` (``docs/methods/das.md``, "Tempering by sigma").

    python benchmarks/das_sigma_bound.py [--s 1] [--groups 1024] [--tilts-only]
"""

from __future__ import annotations

import argparse
import time

import torch

from steerdiff.app.protocols.das import LIBRARY_DAS, TILTS_3D, run_method, validate, validation_sigmas


def levels(s: float, steps: int = 100) -> list[float] | str:
    """``min(1, (s / sigma_i)^2)`` on the protocol's grid (``s = 0``: the default ``"adaptive"``)."""
    if s == 0:
        return "adaptive"
    sig = validation_sigmas(steps)[:steps].double()
    return (s / sig).pow(2).clamp(max=1.0).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s", type=float, default=1.0)
    ap.add_argument("--groups", type=int, default=1024)
    ap.add_argument("--tilts-only", action="store_true", help="the 3-D tilts only, not the fast validation tier")
    args = ap.parse_args()
    opts = {**LIBRARY_DAS, "tempering": levels(args.s)}
    for name in sorted(TILTS_3D):
        prob = TILTS_3D[name]()
        t = time.process_time()
        res = run_method(prob, "das", args.groups, seed=0, fast=False, **opts)
        tilted = prob.tilted
        comp = tilted.responsibilities(res.samples.double()).argmax(-1)
        f = torch.bincount(comp, minlength=tilted.n_components).double() / res.samples.shape[0]
        tv = 0.5 * float((f - tilted.weights).abs().sum())
        print(f"{name} s={args.s}: modes {[round(v, 3) for v in f.tolist()]} exact "
              f"{[round(v, 3) for v in tilted.weights.tolist()]} TV {tv:.3f} cpu {time.process_time() - t:.0f}s",
              flush=True)
    for prob in () if args.tilts_only else ("P1", "P2", "P3", "P4", "MO"):
        rep = validate("fast", problems=(prob,), methods=("das",), das_options=opts)
        print(prob, [(c["name"], round(c["value"], 3), round(c["bound"], 3), c["passed"]) for c in rep["checks"]],
              flush=True)


if __name__ == "__main__":
    main()
