"""Sweeps (``expand="sweep"``, ``steerdiff.align.tree_search``; ``docs/methods/tree_search.md`` "Sweeps") after
issue 38's bookkeeping rewrite (per-sweep ``[plans, K]`` device tensors, the tree's lists built at once) give, bit
for bit, what the per-node code they replaced gave:

* :meth:`Forest.add_sweep` against its definition: the nodes added one by one with :meth:`Forest.add` and every
  value backed up with :meth:`Forest.sweep_value`, on levels with NaN / ``-inf`` look-aheads and non-finite rewards;
* whole runs against main's outputs before the rewrite (commit b30c371), stored in ``tree_sweep_main.safetensors``
  (small cases on the 2-D mixture: several sweeps per tree started at different steps, a look-ahead window, a
  final ``sigma = 0``; integers exactly, floats to 8 units in the last place, since the file's CPU rounded ATen's
  vectorised ``log`` differently from others); ``PYTHONPATH=<a checkout> python
  tests/align/test_tree_sweep_identity.py`` writes that file from the checkout's code;
* no host read per denoising step: a sweep run's value reads do not grow with the grid's length.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch

import steerdiff as sd
from steerdiff.align.rewards import Quadratic
from steerdiff.align.tree_search import tree_search
from steerdiff.align.tree_state import Forest
from steerdiff.core.noise import randn
from steerdiff.io.tensors import load_tensors, save_tensors
from steerdiff.models import GaussianMixture

MIX2 = GaussianMixture([0.3, 0.7], [[-1.5, 0.5], [1.5, -0.5]], 0.3)
REFERENCE = Path(__file__).with_name("tree_sweep_main.safetensors")
LISTS = ("parent", "step", "value", "visits", "reward", "log_mu", "batches", "prior", "log_ratio")
STORED = ("parent", "value", "visits", "log_mu", "batches", "prior")  # the rest follow from these and the outputs


def _same(a, b) -> bool:
    """Equal lists of floats / ints, NaN equal to NaN (bitwise: ``repr`` round-trips a float64)."""
    return len(a) == len(b) and all(repr(float(x)) == repr(float(y)) for x, y in zip(a, b, strict=True))


def _node_by_node(f: Forest, g: int, n: int, levels, rewards) -> None:
    """The per-node code :meth:`Forest.add_sweep` replaced (one :meth:`Forest.add` per node)."""
    K, alpha, base = len(rewards), f.config["alpha"], f.size(g)
    prev = [f.add(g, n) for _ in range(K)]
    f.batches[g][n] += 1
    for c in prev:
        f.log_mu[g][c] = math.log(K)
    for anc, lmu, look in levels:
        for q, v in zip(prev, look, strict=True):
            f.batches[g][q] += 1
            if not math.isnan(v):
                f.prior[g][q] = v / alpha if math.isfinite(v) else -math.inf
                f.reward_evals[g] += 1
        nxt = [f.add(g, prev[int(a)]) for a in anc]
        for c, m in zip(nxt, lmu, strict=True):
            f.log_mu[g][c] = m
        prev = nxt
    for t, v in zip(prev, rewards, strict=True):
        f.reward[g][t] = v
        f.value[g][t] = v if math.isfinite(v) else (math.inf if v == math.inf else -math.inf)
        f.visits[g][t] += 1
        f.saturated[g][t] = True
    for q in reversed(range(base, f.size(g) - K)):
        f.value[g][q] = f.sweep_value(g, q)
    q = n
    while q >= 0:
        f.value[g][q] = f.sweep_value(g, q)
        f.visits[g][q] += K
        q = f.parent[g][q] if q > 0 else -1


def _levels(rng: random.Random, K: int, depth: int, window: set[int]):
    out = []
    for lvl in range(depth):
        anc = sorted(float(rng.randrange(K)) for _ in range(K))
        lmu = [math.log(K * rng.uniform(0.05, 0.9)) for _ in range(K)]
        look = [rng.choice([rng.gauss(-2.0, 1.0), -math.inf]) if lvl in window else math.nan for _ in range(K)]
        out.append((anc, lmu, look))
    return out


def test_add_sweep_builds_the_tree_the_per_node_code_built():
    rng = random.Random(3)
    K, steps = 4, 6
    config = {"alpha": 0.7, "particles": K, "sigmas": [float(s) for s in torch.linspace(5.0, 0.0, steps + 1)],
              "expand": "sweep", "split_sigma": [0.0, math.inf], "lookahead": 1.0}
    fast, slow = (Forest.empty(config, torch.zeros(2 * K, 2), 2) for _ in range(2))
    for g in range(2):
        # a sweep from the root (K chains over every step), then two from inner nodes at later steps
        plans = [(0, steps - 1, [1.5, -math.inf, math.nan, -0.5]), (3, steps - 2, [0.1, 0.2, math.inf, -1.0]),
                 (K * 2 + 1, steps - 3, [-3.0, -2.0, -1.0, 0.0])]
        for n, depth, rewards in plans:
            levels = _levels(rng, K, depth, window={0, 2, 3})
            fast.add_sweep(g, n, levels, list(rewards))
            _node_by_node(slow, g, n, levels, list(rewards))
    for name in LISTS:
        for g in range(2):
            assert _same(getattr(fast, name)[g], getattr(slow, name)[g]), (name, g)
    assert fast.children == slow.children and fast.saturated == slow.saturated
    assert fast.reward_evals == slow.reward_evals
    assert all(_same(fast.log_reach(g), slow.log_reach(g)) for g in range(2))


CASES = {  # name: (sigmas, groups, K, nfe, options)
    "window": (sd.sigmas.karras(10, 0.02, 20.0)[:-1], 2, 4, 150, {"lookahead": 1.0, "split_sigma": 2.0}),
    "final_zero": (sd.sigmas.karras(8, 0.02, 20.0), 2, 3, 80, {"lookahead": 0.7, "draws": 2}),
}


def _run(name: str):
    sig, groups, K, nfe, kw = CASES[name]
    return tree_search(MIX2, Quadratic.around([1.0, 2.0], [1.0, 0.0]), randn((groups * K, 2), seeds=3,
                       dtype=torch.float64), sig, alpha=0.3, particles=K, nfe=nfe, generator=11, expand="sweep", **kw)


def _tensors(name: str) -> dict[str, torch.Tensor]:
    res = _run(name)
    f = res.extras["tree"]
    out = {"samples": res.samples, "rewards": res.rewards, "log_weights": res.log_weights,
           "particles_final": res.particles_final, "log_evidence": res.log_evidence,
           "costs": torch.tensor([f.nfe, f.reward_evals, f.rollouts], dtype=torch.float64)}
    for key in STORED:
        out[key] = torch.tensor([v for vs in getattr(f, key) for v in vs], dtype=torch.float64)
    return {f"{name}.{k}": v for k, v in out.items()}


def test_sweep_runs_equal_mains_outputs_to_the_last_bits():
    want = load_tensors(REFERENCE)
    got = {k: v for name in CASES for k, v in _tensors(name).items()}
    assert sorted(got) == sorted(want)
    for k, v in got.items():
        w = want[k].to(v.dtype)
        assert v.shape == w.shape, k
        if not v.is_floating_point():
            assert torch.equal(v, w), k
            continue
        # Same NaN / +-inf pattern, and the finite values equal up to a few units in the last place: the file was
        # written on another CPU, and ATen's vectorised log / exp round the last bit differently across instruction
        # sets (seen on `log_mu`, 1 ulp). Any change of logic moves them by far more.
        assert torch.equal(v.isnan(), w.isnan()), k
        assert torch.equal(v.isinf() * v.sign(), w.isinf() * w.sign()), k
        fin = v.isfinite()
        ulps = 8 * torch.finfo(v.dtype).eps * w[fin].abs().clamp_min(1.0)
        assert bool(((v[fin] - w[fin]).abs() <= ulps).all()), (k, float((v[fin] - w[fin]).abs().max()))


def test_a_sweep_reads_the_host_a_fixed_number_of_times_whatever_the_grid():
    from tests.host_sync import HostSyncCounter

    reads = []
    for steps in (8, 16):
        with HostSyncCounter() as c:
            tree_search(MIX2, Quadratic.around([1.0, 2.0], [1.0, 0.0]), randn((4, 2), seeds=1, dtype=torch.float64),
                        sd.sigmas.karras(steps, 0.02, 20.0), alpha=0.3, particles=2, nfe=2 * steps, generator=1,
                        expand="sweep", lookahead=1.0)
        reads.append(c.reads)
    assert reads[0] == reads[1]


if __name__ == "__main__":
    save_tensors({k: v for name in CASES for k, v in _tensors(name).items()}, REFERENCE,
                 {"made_by": "tests/align/test_tree_sweep_identity.py"})
    print(f"wrote {REFERENCE}")
