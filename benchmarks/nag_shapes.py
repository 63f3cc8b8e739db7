"""NAG on the shipped shapes pipeline (docs/methods/guidance.md, "NAG"): for each of the 8 training pairs
``(shape, colour)``, ``n`` images from its caption with the negative prompt naming its colour (e.g. ``"red"``); the
shipped shapes classifier's share of images still of that colour, against the plain conditional model, CFG 7.5, and
CFG 7.5 with the same negative prompt as its null (2 rows per step).

    PYTHONPATH=$PWD python benchmarks/nag_shapes.py [n]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import steerdiff
from steerdiff.app.protocols import shapes_pipeline as sp
from steerdiff.core.noise import randn
from steerdiff.data import shapes
from steerdiff.guidance import NAG
from steerdiff.pipelines import load


def main(n: int = 16) -> None:
    pipe = load(Path(steerdiff.__file__).parent / "assets" / sp.SHIPPED)
    judge = sp.load_judge()
    settings = [("conditional (w = 1)", 1.0, None, False), ("CFG 7.5", 7.5, None, False)]
    settings += [(f"NAG phi = {phi:g}", 1.0, NAG(phi), True) for phi in (3.0, 5.0, 10.0)]
    settings += [("NAG phi = 10, tau = 10, alpha = 1", 1.0, NAG(10.0, nag_tau=10.0, nag_alpha=1.0), True)]
    settings += [("CFG 7.5, negative as the null", 7.5, None, True)]
    for name, cfg, guider, negative in settings:
        share, shape_acc, nfe = [], [], 0.0
        for k, (s, c) in enumerate(sp.train_pairs()):
            kw = dict(num_inference_steps=sp.DEFAULT_STEPS, latents=randn((n, *pipe.latent_shape()), seeds=1000 * k),
                      output_type="latent", guidance_scale=cfg)
            if negative:
                kw["negative_prompt"] = [shapes.COLOURS[c]] * n
            if guider is not None:
                kw["guidance"] = guider
            with torch.no_grad():
                res = pipe([shapes.caption(s, c)] * n, **kw)
                pred = sp.classify(judge, pipe.decode(res.latents))
            share.append(float((pred[:, 1] == c).float().mean()))
            shape_acc.append(float((pred[:, 0] == s).float().mean()))
            nfe = float(res.nfe)
        print(f"{name:32s} share of the named colour {sum(share) / len(share):.3f}  shape accuracy "
              f"{sum(shape_acc) / len(shape_acc):.3f}  NFE {nfe:g}  per pair {[round(x, 2) for x in share]}",
              flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
