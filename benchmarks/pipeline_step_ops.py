"""Per-step work of the pipeline loop, counted rather than timed: ATen ops and Python calls between network calls.

``benchmarks/pipeline_overhead.py``'s step gap is a wall time, which a loaded machine inflates many times over. This
counts what the gap is made of, which load does not change: on the same tiny pipelines (``shapes``: the shipped one),
for steerdiff's call and diffusers' own (CFG, one doubled network call per step), every ATen op (a
``TorchDispatchMode``) and every Python function call (``sys.setprofile``, in a second pass without the dispatch
mode, so that its own frames are not counted; built-in functions are not counted) made outside the network's
forward, from the first network call to the end of the call. steerdiff runs twice: with the CPU's default finite
check (one host read of a sum per step) and with the accelerators' (``sd.core.finite_check("end")``).

Per step: the difference between a ``--steps`` call and a ``--steps / 2`` call, divided by the difference in
network calls (what each further step costs; the decode and the per-call set-up cancel). Per call: the whole
call's count from the first network call on, divided by its network calls (the decode included), as earlier
versions of this script reported it (they counted the dispatch mode's frames in the Python calls, about 8 per op).

    python benchmarks/pipeline_step_ops.py [--steps 20] [--families shapes,sd,sd3]

Prints a markdown table and writes ``benchmarks/results/pipeline_step_ops/pipeline_step_ops.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import steerdiff as sd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402
from pipeline_overhead import PROMPTS, _build, _tokenizer_dir  # noqa: E402


class _Outside(TorchDispatchMode):
    """Counts ATen ops while ``state["on"]`` (after the first network call, outside the network)."""

    def __init__(self, state: dict):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.state["on"]:
            self.state["ops"][func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def count(network: torch.nn.Module, call) -> dict:
    """``{"calls", "ops", "py"}`` of one ``call()``: network calls, ATen ops by name and Python calls (two passes)
    made after the first network call and outside the network."""
    state = {"on": False, "calls": 0, "ops": Counter(), "py": 0}

    def pre(*_):
        state["on"] = False
        state["calls"] += 1

    def post(*_):
        state["on"] = True

    def prof(frame, event, arg):
        if event == "call" and state["on"]:
            state["py"] += 1

    hooks = [network.register_forward_pre_hook(pre), network.register_forward_hook(post)]
    try:
        with torch.no_grad(), _Outside(state):
            call()
        ops, calls = state["ops"], state["calls"]
        state.update(on=False, calls=0)
        with torch.no_grad():
            sys.setprofile(prof)
            try:
                call()
            finally:
                sys.setprofile(None)
    finally:
        for h in hooks:
            h.remove()
    return {"calls": calls, "ops": ops, "py": state["py"]}


def per_step(long: dict, short: dict) -> dict:
    """The counts of one more step: ``(long - short) / (long calls - short calls)``, and per network call of
    ``long``."""
    n = long["calls"] - short["calls"]
    ops = {k: (long["ops"][k] - short["ops"][k]) / n for k in set(long["ops"]) | set(short["ops"])}
    return {"ops_per_step": sum(ops.values()), "py_per_step": (long["py"] - short["py"]) / n,
            "ops_by_name_per_step": {k: v for k, v in sorted(ops.items()) if v},
            "ops_per_call": sum(long["ops"].values()) / long["calls"], "py_per_call": long["py"] / long["calls"],
            "network_calls": long["calls"]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--scale", type=float, default=7.5)
    ap.add_argument("--families", default="shapes,sd,sd3")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2 (per step = steps against steps / 2)")
    d = _tokenizer_dir()
    rows = []
    for family in args.families.split(","):
        raw = _build(family, d)
        raw.set_progress_bar_config(disable=True)
        ours = sd.pipelines.from_diffusers(raw)
        ours.set_progress_bar_config(disable=True)
        prompts = (PROMPTS * args.batch)[: args.batch]
        latents = torch.randn((args.batch, *ours.latent_shape()), generator=torch.Generator().manual_seed(0))
        for who, pipe, mode in (("steerdiff", ours, None), ("steerdiff, finite check at the end", ours, "end"),
                                ("diffusers", raw, None)):
            counts = []
            for steps in (args.steps, args.steps // 2):
                def call(pipe=pipe, steps=steps, prompts=prompts, latents=latents, mode=mode):
                    with contextlib.nullcontext() if mode is None else sd.core.finite_check(mode):
                        return pipe(prompts, latents=latents.clone(), num_inference_steps=steps,
                                    guidance_scale=args.scale, output_type="pt")

                call()  # warm-up (cached schedules, first-call checks)
                counts.append(count(ours.network, call))
            rows.append({"family": family, "scheduler": type(raw.scheduler).__name__, "who": who,
                         **per_step(*counts)})
    table = markdown_table(
        ["family", "scheduler", "loop", "ATen ops / step", "Python calls / step", "ATen ops / network call",
         "Python calls / network call"],
        [[r["family"], r["scheduler"], r["who"], f"{r['ops_per_step']:.1f}", f"{r['py_per_step']:.1f}",
          f"{r['ops_per_call']:.1f}", f"{r['py_per_call']:.1f}"] for r in rows], align="lllrrrr")
    ops = "\n".join(f"- {r['family']} {r['who']}: " + ", ".join(f"{k.removeprefix('aten::')} {v:g}"
                                                                 for k, v in r["ops_by_name_per_step"].items())
                    for r in rows)
    meta = provenance(argv, packages=("diffusers", "transformers"))
    text = (f"# Per-step work of the pipeline loop: steerdiff vs diffusers (counted)\n\n{provenance_line(meta)}\n\n"
            f"{table}\n\nPer step: a {args.steps}-step call minus a {args.steps // 2}-step call, per network call "
            f"(CFG {args.scale:g}, batch {args.batch}, one doubled network call per step on both sides); per network "
            "call: the whole call from the first network call on (the decode included). ATen ops outside the "
            "network (TorchDispatchMode); Python function calls outside the network (sys.setprofile, built-ins not "
            "counted). Load-independent: these are counts, not times. \"steerdiff\" is the default on the CPU (the "
            "finite check of every network output reads one sum per step: the sum is 1 of its ops, read by `tolist`, "
            "which dispatches none); \"finite check at the "
            "end\" is the default on an accelerator (`sd.core.finite_check(\"end\")`: one sum kept on the device "
            "per step, read once after the loop). diffusers checks nothing.\n\nATen ops per step by name:\n\n"
            f"{ops}\n")
    out = args.out or results_dir("pipeline_step_ops")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "pipeline_step_ops.json", {"provenance": meta, "args": vars(args) | {"out": str(out)},
                                                "rows": rows})
    write_text(out / "pipeline_step_ops.md", text)
    print(text)
    return rows


if __name__ == "__main__":
    main()
