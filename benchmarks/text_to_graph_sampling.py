"""Sampling-side levers of text-to-graph with CFG alone (``docs/methods/lggm.md``, "Sampling-side levers (CFG
alone)").

The text-to-graph benchmark (``benchmarks/text_to_graph.py``) measures the share of samples meeting a prompt's
asked node count, average degree and domain with logit CFG at a constant scale ``w``. This script measures other
ways to *sample* the same model at the same prompts (no SMC, no best-of-N), one row per variant given as a JSON
object (keys below, all optional but ``w``); the prompts are the benchmark's (``--seed`` picks the set: 5000 is the
benchmark's, other seeds give fresh sets to select on).

* ``w``: the CFG scale, ``log p_u + w (log p_c - log p_u)`` per pair (Ho & Salimans 2022; Chang et al. 2023, "Muse";
  ``docs/methods/discrete.md``, "Guidance"); ``steps``: ancestral steps (default 50; NFE = 2 ``steps``, or 3
  ``steps`` for ``w_dom``, or twice that with the corrector); ``tp``: the ancestral grid's ``time_power``, times
  ``(1 - i / steps) ** tp`` (default 1: equal steps; :func:`steerdiff.discrete.sampling.ancestral_grid`, DeFoG's
  time distortion; with ``fix`` too, not with ``corr``, ``fix_at`` or ``decode``).
* a schedule over time: the scale is ``w`` for ``lo <= t <= hi`` and ``w_out`` elsewhere (guidance in a limited
  interval, Kynkaenniemi et al., NeurIPS 2024, Sec. 3);
* ``temp``: a temperature on the guided logits, ``softmax(l / temp)``; ``t_end`` and ``temp_end``: another
  temperature where ``t <= t_end`` (``temp_end = 0``: the per-pair argmax of ``p(G_0 | G_t)``, so with ``t_end``
  below the second-to-last grid time the last step returns the denoised estimate's mode, as a DDPM's last step
  returns its mean);
* ``corr`` (with ``corr_lo``, ``corr_hi``): after each reverse step ``t -> s`` with ``corr_lo <= s <= corr_hi``,
  ``corr`` forward-backward corrector moves: re-noise ``x_s`` to ``t`` by the forward kernel ``q(x_t | x_s)`` and
  take the reverse step again (a Gibbs-like corrector that leaves the model's time-``s`` marginal invariant when the
  model is exact; Campbell et al., NeurIPS 2022, Sec. 4.2, predictor-corrector for discrete diffusion); one more
  evaluation per move;
* ``fix`` (with ``fix_t``, ``fix_thr``, ``fix_k``, ``fix_mode``; defaults 0.05, 0.5, 1, ``"argmax"``): after the
  run, ``fix`` sweeps of the confidence corrector (:func:`steerdiff.discrete.corrector.correct`) with the same
  guider: at time ``fix_t``, the ``fix_k`` pairs per graph whose sampled type the guided denoiser gives the lowest
  probability, below ``fix_thr``, re-decided (argmax or a draw); one more guided evaluation per sweep; ``fix_w``:
  another CFG scale for the end sweeps only (a stronger prompt may doubt pairs the sampling scale is sure of);
* ``fix_at`` (with ``fix_at_n``, default 1; ``fix_thr`` / ``fix_k`` as above): the same corrector *inside* the
  chain (:func:`in_chain_corrector`): after the first step landing at or below each listed time ``s``, ``fix_at_n``
  argmax sweeps on ``x_s`` asking the denoiser at ``s``, so later reverse steps re-draw around the re-decided pairs;
  one more guided evaluation per time and sweep (the sampler's randomness is untouched);
* ``decode: "remask"`` (absorbing-process models; with ``eta``, ``loop``, ``loop_k``, ``remask_by``, ``tau``;
  defaults 0, 0, 1, ``"confidence"``, 4.5): confidence-ordered decoding with remasking
  (:func:`steerdiff.discrete.remask.remask_decode`) over ``steps`` steps plus ``loop``, each pair count's own
  cosine schedule; NFE 2 (``steps`` + ``loop``). Without it an absorbing model runs the ancestral sampler;
* ``w_dom``: guidance on the domain word apart from the statistics (composed CFG, Liu et al., ECCV 2022, Sec. 3):
  ``log p_u + w (log p_stats - log p_u) + w_dom (log p_full - log p_stats)``, ``p_stats`` conditioned on the prompt
  without its domain word (``w_dom = w`` is plain CFG at ``w``).

Ancestral rows draw from :func:`steerdiff.discrete.graph.sample_graphs` with ``generator=--sample-seed`` (0 by
default, as the benchmark's CFG rows: the constant-CFG row reproduces them); the corrector rows from one
``torch.Generator`` seeded ``123 + --sample-seed``. Rows are appended to ``--out`` as JSON lines, with the
per-domain (domain valid, all three) rates.

    OMP_NUM_THREADS=1 python benchmarks/text_to_graph_sampling.py --seed 7000 --configs '{"w": 2}' '{"w": 2, "corr": 1}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from steerdiff.data.graphs import DOMAINS, describe, generate
from steerdiff.discrete.corrector import correct
from steerdiff.discrete.graph import GraphProcess, flat_denoiser, sample_graphs
from steerdiff.discrete.graph_train import process_of
from steerdiff.discrete.guidance import null_like
from steerdiff.discrete.lggm import prompt, round_degree
from steerdiff.discrete.process import categorical
from steerdiff.discrete.remask import remask_decode
from steerdiff.metrics.graphs import graph_conformity
from steerdiff.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance  # noqa: E402

TINY = 1e-30


class ScheduledCFG:
    """Logit CFG with a scale per time (``w`` inside ``[lo, hi]``, ``w_out`` outside) and temperatures (``temp``;
    ``temp_end`` where ``t <= t_end``, 0 = argmax); always the doubled batch (NFE 2 per step)."""

    def __init__(self, w: float, lo: float = 0.0, hi: float = 1.0, w_out: float = 1.0, temp: float = 1.0,
                 t_end: float = -1.0, temp_end: float = 1.0):
        self.w, self.lo, self.hi, self.w_out, self.temp = w, lo, hi, w_out, temp
        self.t_end, self.temp_end = t_end, temp_end

    def scale(self, t: Tensor) -> Tensor:
        inside = (t >= self.lo) & (t <= self.hi)
        return torch.where(inside, torch.full_like(t, self.w), torch.full_like(t, self.w_out))

    def wrap(self, denoiser):
        def guided(x: Tensor, t: Tensor, cond=None) -> Tensor:
            both = denoiser(torch.cat([x, x]), torch.cat([t, t]), torch.cat([cond, null_like(cond)]))
            pc, pu = both.chunk(2)
            lc, lu = pc.float().clamp_min(TINY).log(), pu.float().clamp_min(TINY).log()
            logits = lu + self.scale(t)[:, None, None] * (lc - lu)
            late = (t <= self.t_end)[:, None, None]
            if self.temp_end == 0:
                sharp = (logits == logits.max(-1, keepdim=True).values).float()
                sharp = sharp / sharp.sum(-1, keepdim=True)
            else:
                sharp = torch.softmax(logits / self.temp_end, -1)
            return torch.where(late, sharp, torch.softmax(logits / self.temp, -1))

        return guided


class ComposedCFG:
    """``softmax(log p_u + w (log p_stats - log p_u) + w_dom (log p_full - log p_stats))``: the domain word guided
    apart from the statistics (NFE 3 per step). ``cond_stats``: the prompts without their domain word, row-aligned."""

    def __init__(self, w: float, w_dom: float, cond_stats: Tensor):
        self.w, self.w_dom, self.cond_stats = w, w_dom, cond_stats

    def wrap(self, denoiser):
        def guided(x: Tensor, t: Tensor, cond=None) -> Tensor:
            three = denoiser(torch.cat([x, x, x]), torch.cat([t, t, t]),
                             torch.cat([cond, self.cond_stats, null_like(cond)]))
            pf, ps, pu = (p.float().clamp_min(TINY).log() for p in three.chunk(3))
            return torch.softmax(pu + self.w * (ps - pu) + self.w_dom * (pf - ps), -1)

        return guided


def corrected(denoiser, process: GraphProcess, steps: int, counts: Tensor, cond: Tensor, guider, moves: int = 1,
              lo: float = 0.0, hi: float = 1.0, seed: int = 123):
    """Ancestral sampling with ``moves`` forward-backward corrector moves after each step landing in ``[lo, hi]``
    (see the module docstring); one generator for every draw."""
    b = len(counts)
    gen = torch.Generator().manual_seed(seed)
    x = process.pad(process.prior((b, process.length), torch.rand(b, process.length, generator=gen)), counts)
    den = guider.wrap(flat_denoiser(denoiser, process))

    def reverse(x: Tensor, t: float, s: float) -> Tensor:
        p0 = den(x, torch.full((b,), t), cond)
        return categorical(process.posterior(x, p0, t, s), torch.rand(x.shape, generator=gen))

    for i in range(steps):
        t, s = 1 - i / steps, 1 - (i + 1) / steps
        x = reverse(x, t, s)
        if s > 0 and lo <= s <= hi:
            for _ in range(moves):
                keep = torch.full((b,), process.alpha(t) / process.alpha(s))
                x = process.noise_rows(x, keep, torch.rand(x.shape, generator=gen), torch.rand(x.shape, generator=gen))
                x = reverse(x, t, s)
    return process.unflatten(x)


def in_chain_corrector(flat, process: GraphProcess, steps: int, times, sweeps: int, cond: Tensor, guider,
                       threshold: float = 0.5, per_sweep: int = 1):
    """A :func:`steerdiff.discrete.sample` callback running ``sweeps`` confidence-corrector sweeps (argmax) inside
    the chain: after the first step landing at or below each time of ``times`` (in ``(0, 1)``), on the state
    ``x_s`` with the denoiser asked at ``s``, so the later reverse steps re-draw around the re-decided pairs. The
    corrected state replaces the chain's in place (the sampler keeps its own randomness, so rows share the
    uncorrected run's draws up to the first move)."""
    times = sorted(float(v) for v in times)
    if not times or not all(0.0 < v < 1.0 for v in times):
        raise ValueError(f"fix_at must be a non-empty list of times in (0, 1), got {times!r}")
    grid = [1 - (i + 1) / steps for i in range(steps)]
    at = {min(i for i, s in enumerate(grid) if s <= v + 1e-12) for v in times}
    if len(at) < len(times):
        raise ValueError(f"fix_at {times!r} lands twice on one step of a {steps}-step grid")

    def hook(state: dict) -> None:
        if state["i"] in at:
            x = state["x"]
            x.copy_(correct(flat, process, x, sweeps=sweeps, t=state["s"], threshold=threshold, per_sweep=per_sweep,
                            cond=cond, guidance=guider))

    return hook


def prompts_of(per_domain: int, seed: int, domains=None):
    """The benchmark's prompts (``benchmarks/text_to_graph.py``): per domain, fresh graphs of ``seed`` described."""
    prompts, asks = [], []
    for d in domains or DOMAINS.names():
        for g in generate(d, per_domain, seed):
            st = describe(g)
            prompts.append(prompt(d, st["nodes"], st["avg_degree"]))
            asks.append({"nodes": st["nodes"], "avg_degree": round_degree(st["avg_degree"]), "domain": d})
    return prompts, asks


def nfe(config: dict) -> int:
    """Denoiser evaluations per graph of a row's config (doubled CFG batch: 2 per evaluation, composed: 3; the
    corrector adds ``corr`` evaluations after every step landing in ``[corr_lo, corr_hi]`` except the last)."""
    steps = config.get("steps", 50)
    per = 3 if "w_dom" in config else 2
    lo, hi = config.get("corr_lo", 0.0), config.get("corr_hi", 1.0)
    moves = config.get("corr", 0) * sum(1 for i in range(1, steps) if lo <= 1 - i / steps <= hi)
    chain = len(config.get("fix_at", ())) * config.get("fix_at_n", 1)
    return per * (steps + moves + config.get("fix", 0) + chain + config.get("loop", 0))


FAMILIES = ("grid", "planar", "tree", "lobster", "community", "sbm", "regular", "erdos_renyi")


def render(path: str | Path) -> str:
    """The markdown table of the rows in a JSON-lines file written by :func:`main` (all three per family)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    body = [[r["seed"], r.get("sample_seed", 0), f"`{r['cfg']}`", nfe(json.loads(r["cfg"])), f"{r['domain']:.3f}",
             f"{r['all']:.3f}", *(f"{r['per'][d][1]:.2f}" if d in r["per"] else "-" for d in FAMILIES),
             f"{r['cpu']:.0f}"] for r in rows]
    head = ["prompt seed", "sample seed", "variant", "NFE", "domain valid", "all three", *FAMILIES, "CPU s"]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(str(x) for x in row) + " |" for row in body])


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="steerdiff/assets/graphs_lggm")
    ap.add_argument("--seed", type=int, default=7000, help="the prompt set (5000: the benchmark's)")
    ap.add_argument("--per-domain", type=int, default=20)
    ap.add_argument("--domains", nargs="*", default=None)
    ap.add_argument("--configs", nargs="+", default=[], help="JSON objects, one row each (module docstring)")
    ap.add_argument("--render", default=None, help="print the markdown table of this JSON-lines file and stop")
    ap.add_argument("--sample-seed", type=int, default=0, help="the sampling randomness: generator of the ancestral "
                    "rows (0: the benchmark's), corrector rows seeded 123 + this")
    ap.add_argument("--out", default=None, help="append the rows to this JSON-lines file")
    args = ap.parse_args(argv)
    if args.render:
        print(render(args.render))
        return []
    if not args.configs:
        ap.error("--configs is required (or --render)")
    torch.set_num_threads(1)
    model = load(args.model).eval()
    domains = args.domains or DOMAINS.names()
    prompts, asks = prompts_of(args.per_domain, args.seed, domains)
    counts = torch.tensor([a["nodes"] for a in asks])
    cond = model.tokenize(prompts)
    stats = model.tokenize([prompt(None, a["nodes"], a["avg_degree"]) for a in asks])
    stats = torch.cat([stats, torch.full((len(cond), cond.shape[1] - stats.shape[1]), -1)], 1)
    process = process_of(model, int(counts.max()))
    meta = provenance(argv, __file__)
    rows = []
    for text in args.configs:
        c = json.loads(text)
        steps = c.pop("steps", 50)
        tp = c.pop("tp", 1.0)
        corr = {k: c.pop(k) for k in ("corr", "corr_lo", "corr_hi") if k in c}
        fix = {k: c.pop(k) for k in ("fix", "fix_t", "fix_thr", "fix_k", "fix_mode", "fix_w") if k in c}
        chain = {k: c.pop(k) for k in ("fix_at", "fix_at_n") if k in c}
        dec = {k: c.pop(k) for k in ("decode", "eta", "loop", "loop_k", "remask_by", "tau") if k in c}
        guider = ComposedCFG(c["w"], c["w_dom"], stats) if "w_dom" in c else ScheduledCFG(**c)
        c0 = time.process_time()
        with torch.no_grad():
            if tp != 1.0 and (dec or corr):
                raise ValueError("tp (time_power) applies to the ancestral rows (with or without fix) only")
            if dec:
                if dec.pop("decode", None) != "remask" or not process.absorbing:
                    raise ValueError("remasking options need decode: 'remask' and an absorbing-process model")
                start = process.pad(torch.full((len(counts), process.length), process.mask_index), counts)
                flat = remask_decode(flat_denoiser(model.probs, process), process, start, steps,
                                     eta=dec.get("eta", 0.0), loop=dec.get("loop", 0), loop_k=dec.get("loop_k", 1),
                                     remask_by=dec.get("remask_by", "confidence"),
                                     choice_temperature=dec.get("tau", 4.5), cond=cond, guidance=guider,
                                     generator=args.sample_seed)
                graphs = process.unflatten(flat)
            elif corr:
                graphs = corrected(model.probs, process, steps, counts, cond, guider, corr.get("corr", 1),
                                   corr.get("corr_lo", 0.0), corr.get("corr_hi", 1.0), 123 + args.sample_seed)
            else:
                hook = None
                if chain:
                    hook = in_chain_corrector(flat_denoiser(model.probs, process), process, steps, chain["fix_at"],
                                              chain.get("fix_at_n", 1), cond, guider, fix.get("fix_thr", 0.5),
                                              fix.get("fix_k", 1))
                if tp != 1.0 and hook is not None:
                    raise ValueError("tp (time_power) is not combined with fix_at here")
                graphs = sample_graphs(model.probs, process, steps, num_nodes=counts, cond=cond, guidance=guider,
                                       generator=args.sample_seed, callback=hook, time_power=tp)
            if fix.get("fix", 0):
                fixed = correct(flat_denoiser(model.probs, process), process, process.flatten(graphs),
                                sweeps=fix["fix"], t=fix.get("fix_t", 0.05), threshold=fix.get("fix_thr", 0.5),
                                per_sweep=fix.get("fix_k", 1), mode=fix.get("fix_mode", "argmax"), cond=cond,
                                guidance=ScheduledCFG(fix["fix_w"]) if "fix_w" in fix else guider,
                                generator=torch.Generator().manual_seed(321 + args.sample_seed))
                graphs = process.unflatten(fixed)
        conf = graph_conformity(graphs, asks)
        per = {}
        for d in domains:
            ix = [i for i, a in enumerate(asks) if a["domain"] == d]
            pd = graph_conformity(graphs[ix], [asks[i] for i in ix])
            per[d] = (round(pd["domain"], 2), round(pd.get("all", 0.0), 2))
        row = {"seed": args.seed, "sample_seed": args.sample_seed, "cfg": text, "domain": round(conf["domain"], 3),
               "all": round(conf.get("all", 0), 3), "deg": round(conf["avg_degree"], 3),
               "cpu": round(time.process_time() - c0, 1), "per": per, "commit": (meta.get("git") or {}).get("commit")}
        if args.model != ap.get_default("model"):  # rows of another model say which
            row["model"] = args.model
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
