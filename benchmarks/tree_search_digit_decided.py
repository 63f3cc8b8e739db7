"""Issue 38, digits: where along the model's chain the digit is decided, and whether any look-ahead can see it
earlier (``docs/methods/tree_search.md``, "Widening a sweep"; ``benchmarks/results/tree_search/digits_target.md``).

Two measurements on the digits UNet's 25-step ancestral chain (Karras 80 -> 0.002, ``eta = 1``, the grid of
``tree_search.py --part digits``), reward ``class:3`` log-probability, "a 3" = final reward > -0.5:

* ``decided``: 96 states drawn by the chain at step ``j``, 16 independent continuations of each to the end: the
  spread over states of the fraction that ends a 3, against the spread a coin with the same mean would give alone
  (``binomial_sd``). Equal spreads: the state at ``sigma_j`` does not yet decide the digit (nothing to look ahead at).
* ``lookahead``: 512 chains; per step, the AUC with which each look-ahead predicts "ends a 3": DAS's one-step
  ``r(D(x, sigma))`` and a calibrated one, ``r`` of a ``k``-step deterministic (Euler / DDIM) rollout from the state to
  sigma 0.002 on a Karras sub-schedule (``k = 2, 3, 4``; ``k - 1`` NFE more per state than ``D``).

    OMP_NUM_THREADS=1 python benchmarks/tree_search_digit_decided.py   # ~150 CPU s; digit_decided.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align.rewards import ClassLogProb
from steerdiff.align.smc import propose

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import results_dir, write_json  # noqa: E402


class _Z:
    def __init__(self, z):
        self.z = z

    def randn_like(self, x):
        return self.z


def _auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """Mann-Whitney AUC of ``score`` for ``label`` (ties broken by order)."""
    o = torch.argsort(score)
    rank = torch.empty(len(score), dtype=torch.float64)
    rank[o] = torch.arange(len(score), dtype=torch.float64)
    n1 = label.sum()
    return float((rank[label].sum() - n1 * (n1 - 1) / 2) / (n1 * (len(label) - n1)))


def main() -> None:
    torch.set_num_threads(1)
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    reward = ClassLogProb(clf, 3)
    sig = [float(s) for s in sd.sigmas.karras(26, 0.002, 80.0)[:-1]]

    @torch.no_grad()
    def den(x, s):
        return model(x, s)

    def step(x, j, g):
        return propose(x, den(x, sig[j]), sig[j], sig[j + 1], 1.0, _Z(torch.randn(x.shape, generator=g)))[0]

    out = {"sigmas": sig, "decided": [], "lookahead": []}
    # decided: 96 states, 16 continuations each
    g = torch.Generator().manual_seed(7)
    S, C = 96, 16
    x = torch.randn(S, 1, 8, 8, generator=g) * sig[0]
    for j in range(16):
        if j in (4, 6, 8, 9, 10, 11, 12, 13, 14, 15):
            y = x.repeat_interleave(C, 0)
            for k in range(j, 25):
                y = step(y, k, g)
            with torch.no_grad():
                f = (reward(y).double().view(S, C) > -0.5).double().mean(1)
            m = float(f.mean())
            row = {"step": j, "sigma": sig[j], "p3": m, "sd_over_states": float(f.std()),
                   "binomial_sd": (m * (1 - m) / C) ** 0.5, "states_above_half": int((f > 0.5).sum()),
                   "states_never": int((f == 0).sum())}
            out["decided"].append(row)
            print(row, flush=True)
        x = step(x, j, g)
    # lookahead: 512 chains, AUC of r(D) and of k-step deterministic rollouts
    g = torch.Generator().manual_seed(123)
    x = torch.randn(512, 1, 8, 8, generator=g) * sig[0]
    states, dens = [], []
    for j in range(25):
        d = den(x, sig[j])
        states.append(x)
        dens.append(d)
        x = propose(x, d, sig[j], sig[j + 1], 1.0, _Z(torch.randn(x.shape, generator=g)))[0]
    with torch.no_grad():
        is3 = reward(x).double() > -0.5

    def rollout(x, s, k, d):
        sub = [float(v) for v in sd.sigmas.karras(k + 1, 0.002, s)][:k]
        for a in range(1, len(sub)):
            x = d + (sub[a] / sub[a - 1]) * (x - d)
            d = den(x, sub[a])
        return d

    for j in range(14):
        with torch.no_grad():
            row = {"step": j, "sigma": sig[j], "auc_D": _auc(reward(dens[j]).double(), is3)}
            for k in (2, 3, 4):
                row[f"auc_rollout_{k}"] = _auc(reward(rollout(states[j], sig[j], k, dens[j])).double(), is3)
        out["lookahead"].append(row)
        print(row, flush=True)
    out["p3_final"] = float(is3.double().mean())
    write_json(results_dir("tree_search") / "digit_decided.json", out)


if __name__ == "__main__":
    main()
