"""Per-step work of the pipeline loop, counted rather than timed: ATen ops and Python calls between network calls.

``benchmarks/pipeline_overhead.py``'s step gap is a wall time, which a loaded machine inflates many times over. This
counts what the gap is made of, which load does not change: on the same tiny pipelines, for steerdiff's call and
diffusers' own, every ATen op (a ``TorchDispatchMode``) and every Python function call (``sys.setprofile``) made
outside the network's forward, from the first network call to the end of the call (the decode is in both), divided
by the number of network calls. The dispatch mode's own Python frames are counted too (about 8 per op, on both
sides alike).

    python benchmarks/pipeline_step_ops.py [--steps 20] [--families sd3,sd]

Prints a markdown table (no files written).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import steerdiff as sd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table  # noqa: E402
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
    """``{"calls", "ops_per_call", "py_per_call", "ops"}`` of one ``call()``."""
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
            sys.setprofile(prof)
            try:
                call()
            finally:
                sys.setprofile(None)
    finally:
        for h in hooks:
            h.remove()
    n = state["calls"]
    return {"calls": n, "ops_per_call": sum(state["ops"].values()) / n, "py_per_call": state["py"] / n,
            "ops": state["ops"]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--scale", type=float, default=7.5)
    ap.add_argument("--families", default="sd3,sd")
    args = ap.parse_args(argv)
    d = _tokenizer_dir()
    rows = []
    for family in args.families.split(","):
        raw = _build(family, d)
        raw.set_progress_bar_config(disable=True)
        ours = sd.pipelines.from_diffusers(raw)
        ours.set_progress_bar_config(disable=True)
        prompts = (PROMPTS * args.batch)[: args.batch]
        latents = torch.randn((args.batch, *ours.latent_shape()), generator=torch.Generator().manual_seed(0))
        kw = {"num_inference_steps": args.steps, "guidance_scale": args.scale, "output_type": "pt"}
        for who, pipe in (("steerdiff", ours), ("diffusers", raw)):
            def call(pipe=pipe, prompts=prompts, latents=latents, kw=kw):
                return pipe(prompts, latents=latents.clone(), **kw)

            call()  # warm-up (cached schedules, first-call checks)
            c = count(ours.network, call)
            rows.append({"family": family, "who": who, **c})
    print(markdown_table(["family", "loop", "network calls", "ATen ops / call", "Python calls / call"],
                         [[r["family"], r["who"], r["calls"], f"{r['ops_per_call']:.1f}", f"{r['py_per_call']:.1f}"]
                          for r in rows], align="llrrr"))
    return rows


if __name__ == "__main__":
    main()
