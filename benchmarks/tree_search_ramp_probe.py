"""Issue 38's tempered look-ahead on the digits: the probe runs that chose ``sweep12r``
(``docs/methods/tree_search.md``, "Tempered look-ahead"; ``benchmarks/results/tree_search/digits_target.md``).

Also the widened sweeps' probes (``widen``; ``docs/methods/tree_search.md``, "Widening a sweep"; one line per setting
in ``digits_widen_probes.jsonl``, the later ones with ``groups_without_the_digit``: groups none of whose terminals
is the digit).

Each argument is a JSON object of :func:`steerdiff.align.tree_search` settings for ``expand="sweep"`` (``particles``,
``nfe`` and any of ``lookahead`` (default 1), ``lookahead_ramp``, ``lookahead_every``, ``split_sigma``, ``widen``) plus
``groups`` (default 32) and ``seed`` (default 0; the noise and generators of ``tree_search.py --part digits``); one
line per setting: the distance of the mean ``class:3`` reward to the exact tilted reference (-0.0016914, from
``digits_variants.json``), the outputs that are a wrong digit (reward < -0.5), CPU seconds and reward calls. Seed 0
with 128 groups holds seed 0's 32 groups of the benchmark and 96 more, none of seeds 1 and 2's.

    OMP_NUM_THREADS=1 python benchmarks/tree_search_ramp_probe.py \\
        '{"particles": 12, "nfe": 300, "lookahead": 0.5, "lookahead_ramp": 1.0, "split_sigma": 20.0, "groups": 128}'
    OMP_NUM_THREADS=1 python benchmarks/tree_search_ramp_probe.py '{"particles": 4, "widen": [[5.0, 40], [0.7, 6]],
        "nfe": 298, "lookahead": 0.5, "lookahead_ramp": 1.0, "split_sigma": 5.0, "seed": 10, "groups": 128}'
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch

import steerdiff as sd
from steerdiff.align.rewards import ClassLogProb
from steerdiff.align.tree_search import tree_search

REF = -0.0016913511765366245  # digits_variants.json's exact_target_reward (benchmarks/das.py's exact_reference)


def main() -> None:
    torch.set_num_threads(1)
    steps = 25
    model, clf = sd.models.load("digits"), sd.models.load("digits_classifier")
    reward, alpha = ClassLogProb(clf, 3), 0.1
    sig = sd.sigmas.karras(steps + 1, 0.002, 80.0)[:-1]
    for spec in sys.argv[1:]:
        kw = json.loads(spec)
        seed, nfe, p, groups = kw.pop("seed", 0), kw.pop("nfe"), kw.pop("particles"), kw.pop("groups", 32)
        kw = {k: tuple(tuple(q) if isinstance(q, list) else q for q in v) if isinstance(v, list) else v
              for k, v in kw.items()}
        t = time.process_time()
        res = tree_search(model, reward, sd.randn((groups * p, 1, 8, 8), seeds=seed * 10**6), sig, alpha=alpha,
                          particles=p, nfe=nfe, generator=seed * 10**6 + 5 * 10**5, batch_size=256, expand="sweep",
                          **{"lookahead": 1.0, **kw})
        r = res.rewards.double()
        best = res.extras["candidate_rewards"].nan_to_num(-math.inf).max(1).values  # each group's best terminal
        print(json.dumps({"spec": json.loads(spec), "distance": abs(float(r.mean()) - REF),
                          "wrong_digits": int((r < -0.5).sum()), "min_reward": float(r.min()),
                          "groups_without_the_digit": int((best < -0.5).sum()),
                          "cpu_s": round(time.process_time() - t, 2), "reward_evals": res.reward_evals,
                          "nfe": res.nfe}), flush=True)


if __name__ == "__main__":
    main()
