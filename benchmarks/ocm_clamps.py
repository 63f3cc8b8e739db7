"""Issue 40: FID-digits and the share of clamped (negative) predicted variances of OCM on the shipped digits UNet,
per step count, for a covariance head directory (the shipped ``digits_ocm`` by default). The demo's protocol
(``steerdiff/app/demo/sections/fewstep.py``): ``digits_samples`` with the one-grey-level last-step clip, classes
``i % 10``, feature FID against the test split (docs/methods/ocm.md, "Measured deviations").

    python benchmarks/ocm_clamps.py --n 2000 --steps 5,10,20,50 [--head DIR] [--method ocm-ddpm] [--seed 0]
"""

from __future__ import annotations

import argparse
import json

import torch

from steerdiff.app.recipes.ocm_digits import digits_samples
from steerdiff.covariance import load_head, load_head_for
from steerdiff.data.digits import load_digits
from steerdiff.metrics.images import classifier_features, frechet_distance
from steerdiff.models.io import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default=None, help="head directory (default: the shipped digits_ocm)")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--steps", default="5,10,20,50")
    ap.add_argument("--method", default="ocm-ddpm", choices=("ocm-ddpm", "ocm-ddim"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    den, clf = load("digits"), load("digits_classifier")
    head = load_head_for("digits", den) if args.head is None else load_head(args.head, den)
    ref = classifier_features(clf, load_digits("test")[0])
    for k in (int(s) for s in args.steps.split(",")):
        images, _, clamped = digits_samples(den, args.method, k, covariance=head, n=args.n, seed=args.seed,
                                            clip_pixel=1.0)
        entries = images.numel() * (k - 1)  # c is evaluated on every step but the last (x0 = D)
        print(json.dumps({"method": args.method, "steps": k, "n": args.n, "seed": args.seed,
                          "fid": frechet_distance(ref, classifier_features(clf, images)),
                          "clamped": clamped, "clamped_share": clamped / entries}), flush=True)


if __name__ == "__main__":
    main()
