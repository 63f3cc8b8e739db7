"""DiffDIS's edge task, paired by seed (docs/methods/diffdis.md, "The edge task's contribution").

Reads the seed files that ``benchmarks/diffdis.py`` wrote (``seeds/seed<k>_<tag>.json`` in each folder given) and,
for each comparison ``a minus b`` (default: ``diffdis`` and ``diffdis_zproj`` against ``no_edge``,
``diffdis_zproj`` against ``diffdis``, and each edge arm against itself with the interaction shut), the per-seed
differences of band F, max F, MAE, weighted F, S, mean E and HCE on the seeds both arms have, their mean +-
standard error over seeds, the count of seeds where ``a`` is better, the exact two-sided sign-flip (paired
permutation) p-value of the mean difference over all ``2^n`` sign patterns, and the exact two-sided sign-test
p-value. ``<arm> [dbia off]`` is the same trained model scored with its cross-task attentions' gates set to zero
at inference, where the run recorded it. Also, where recorded, how open each arm's cross-task attentions ended
(``train.dbia``: gate, output-projection norm, their product). Writes ``edge_ablation.md`` / ``.json``.

    python benchmarks/diffdis_edge_ablation.py --folders benchmarks/results/diffdis/prior1200 \
        benchmarks/results/diffdis/edge_ablation --out benchmarks/results/diffdis/edge_ablation
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, write_json, write_text  # noqa: E402

METRICS = {"bandF": 1, "maxF": 1, "MAE": -1, "wF": 1, "S": 1, "meanE": 1, "HCE": -1}  # +1: higher is better
COMPARISONS = (("diffdis", "no_edge"), ("diffdis_zproj", "no_edge"), ("diffdis_zproj", "diffdis"),
               # the interaction's own share: each model against itself with its gates shut at inference
               ("diffdis", "diffdis [dbia off]"), ("diffdis_zproj", "diffdis_zproj [dbia off]"))
OFF = " [dbia off]"


def load_rows(folders: list[Path]) -> dict[tuple[str, int], dict]:
    """Every VAE-decoded row of the seed files in ``folders`` by ``(arm, seed)``; a pair seen twice must agree."""
    rows: dict[tuple[str, int], dict] = {}
    for folder in folders:
        for f in sorted((folder / "seeds").glob("seed*.json")):
            run = json.loads(f.read_text())
            for r in run["rows"]:
                if r.get("decoder", "vae") != "vae":
                    continue
                key = (r["arm"], r["seed"])
                if key in rows and abs(rows[key]["bandF"] - r["bandF"]) > 1e-9:
                    raise SystemExit(f"{key} appears twice with different scores ({f})")
                rows[key] = {**r, "file": str(f)}
                if "dbia_off" in r:  # benchmarks/diffdis.py's score_dbia_off: the same model, gates shut
                    rows[(r["arm"] + OFF, r["seed"])] = {**r["dbia_off"], "arm": r["arm"] + OFF, "seed": r["seed"],
                                                         "file": str(f)}
    return rows


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided p-value of the mean of paired differences under random signs (all ``2^n`` patterns)."""
    obs = abs(sum(diffs))
    hits = sum(abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= obs - 1e-12
               for signs in itertools.product((1, -1), repeat=len(diffs)))
    return hits / 2 ** len(diffs)


def sign_test_p(wins: int, n: int) -> float:
    """Exact two-sided binomial p-value of ``wins`` of ``n`` under p = 1/2."""
    k = min(wins, n - wins)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def compare(rows: dict, a: str, b: str) -> dict | None:
    """Paired statistics of ``a`` minus ``b`` on their common seeds (``None`` when they share none)."""
    seeds = sorted({s for (arm, s) in rows if arm == a} & {s for (arm, s) in rows if arm == b})
    if not seeds:
        return None
    out = {"a": a, "b": b, "seeds": seeds, "metrics": {}}
    for m, sign in METRICS.items():
        d = [rows[(a, s)][m] - rows[(b, s)][m] for s in seeds]
        n = len(d)
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else float("nan")
        wins = sum(sign * x > 0 for x in d)
        out["metrics"][m] = {"diffs": d, "mean": mean, "sd": sd, "se": sd / math.sqrt(n), "better": wins, "n": n,
                             "t": mean / (sd / math.sqrt(n)) if n > 1 and sd > 0 else float("nan"),
                             "sign_flip_p": sign_flip_p(d), "sign_test_p": sign_test_p(wins, n)}
    return out


def render(rows: dict, results: list[dict], commands: list[str]) -> str:
    arms = sorted({arm for arm, _ in rows if OFF not in arm}, key=lambda x: (x != "diffdis", x != "no_edge", x))
    seeds = sorted({s for _, s in rows})
    body = []
    for s in seeds:
        cells = [s]
        for arm in arms:
            r = rows.get((arm, s))
            cells.append("-" if r is None else f"{r['bandF']:.4f} / {r['maxF']:.4f} / {r['MAE']:.4f} / {r['wF']:.4f}")
        body.append(cells)
    per_seed = markdown_table(("seed", *(f"{a}: bandF / maxF / MAE / wF" for a in arms)), body, "r" + "r" * len(arms))
    text = ("# DiffDIS's edge task, paired by seed (docs/methods/diffdis.md, \"The edge task's contribution\")\n\n"
            "Commands:\n\n" + "".join(f"    {c}\n" for c in commands) + "\n## Scores per seed\n\n" + per_seed + "\n")
    for res in results:
        lines = []
        for m, st in res["metrics"].items():
            better = "higher" if METRICS[m] > 0 else "lower"
            lines.append((m, st["n"], f"{st['mean']:+.4f} ± {st['se']:.4f}", f"{st['t']:+.2f}",
                          f"{st['better']} / {st['n']} ({better})", f"{st['sign_flip_p']:.3f}",
                          f"{st['sign_test_p']:.3f}", " ".join(f"{x:+.4f}" for x in st["diffs"])))
        table = markdown_table(("metric", "seeds", "mean ± SE", "t", f"{res['a']} better", "sign-flip p",
                                "sign-test p", f"per seed {res['seeds']}"), lines, "lrrrrrrl")
        text += f"\n## {res['a']} minus {res['b']} (seeds {res['seeds']})\n\n{table}\n"
    opened = [(arm, s, r["train"]["dbia"]) for (arm, s), r in sorted(rows.items())
              if "dbia" in r.get("train", {}) and arm != "no_edge"]  # no_edge never runs the interaction
    if opened:
        body = [(arm, s, *(f"{d[k]['gate']:+.4f} / {d[k]['proj_norm']:.3f} / {d[k]['scale']:.4f}"
                           for k in ("dbia_mid", "dbia_out"))) for arm, s, d in opened]
        text += ("\n## How open the cross-task attentions ended (gate / output-projection norm / |gate| x norm)\n\n"
                 + markdown_table(("arm", "seed", "bottleneck (8x8)", "full latent (16x16)"), body, "lrrr") + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folders", type=Path, nargs="+", required=True, help="benchmarks/diffdis.py --out folders")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    wanted = {arm for pair in COMPARISONS for arm in pair}
    rows = {k: v for k, v in load_rows(args.folders).items() if k[0] in wanted}
    results = [r for a, b in COMPARISONS if (r := compare(rows, a, b)) is not None]
    argvs = {json.dumps(json.loads(Path(f).read_text())["provenance"]["argv"][1:]) for f in {r["file"] for r in
                                                                                          rows.values()}}
    commands = sorted(f"OMP_NUM_THREADS=1 python benchmarks/diffdis.py {' '.join(json.loads(a))}" for a in argvs)
    text = render(rows, results, commands)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "edge_ablation.md", text)
    write_json(args.out / "edge_ablation.json", {"comparisons": results, "rows": {f"{a}/{s}": {
        k: r[k] for k in (*METRICS, "file") if k in r} | {"train": r.get("train", {})}
        for (a, s), r in sorted(rows.items())}, "commands": commands})
    print(text)


if __name__ == "__main__":
    main()
