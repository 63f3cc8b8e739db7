"""Inference CPU time of one-step DiffDIS and of the multi-step diffusion segmenter, component by component
(docs/methods/diffdis.md, "Inference time"; Yu et al., ICLR 2025, "High-Precision Dichotomous Image Segmentation
via Probing Diffusion Capacity", Sec. 3.2: one step instead of a multi-step sampler).

Both paths run on the same segmenter in one process, one thread: the multi-step diffusion segmenter of
``benchmarks/diffdis.py`` (arm ``multistep``) is the same network and codec with the mask rows alone, so its
compute is the shipped model's with ``edge=False`` (the weights do not change the time). Per component, the
median over ``--repeats`` of the CPU seconds (``time.process_time``) per image, at each batch size:

* ``encode``: the VAE encoder on the images (once per image on both paths);
* ``denoiser``: every denoiser evaluation (one-step: one evaluation of the mask and edge rows together;
  multi-step: ``steps`` Euler evaluations of the mask rows of all ensemble members in one batch);
* ``mask decode``: the VAE decoder on the mask latents (multi-step: every member's, in one batch, for the
  output-space average: Marigold's way, and ``Segmenter.segment``'s);
* ``edge decode``: the VAE decoder on the edge latents (one-step with edge maps only).

and the whole pipeline end to end (``Segmenter.segment``), to check the components add up. Each repeat runs every
measured call once, in turn (interleaved), so that a change in the machine's load during the run moves the
components and the whole pipeline alike; the row "end to end minus the components" is then the pipeline's own
overhead (about 0.1 ms at batch 1: an earlier version, which timed each call's repeats back to back on a loaded
machine, showed 8.6 ms there that a quiet rerun did not reproduce). ``--decoder light`` decodes with the light mask
decoder (``steerdiff.segment.MASK_DECODERS``) on both paths (docs/methods/diffdis.md, "The light mask decoder");
``--encoder light`` encodes with the light image encoder (``steerdiff.segment.IMAGE_ENCODERS``) on both paths
(docs/methods/diffdis.md, "The light image encoder").

    OMP_NUM_THREADS=1 python benchmarks/diffdis_profile.py [--model DIR] [--batches 1,64] [--repeats 5] \
        [--decoder light] [--encoder light]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from steerdiff.app.recipes.diffdis import shipped_dir
from steerdiff.data import dis
from steerdiff.segment import IMAGE_ENCODERS, MASK_DECODERS, load_segmenter, predict_latents

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402


def cpu_median(fn, repeats: int) -> float:
    """Median over ``repeats`` calls of ``fn``'s CPU seconds (one warm-up call first)."""
    return cpu_medians({"fn": fn}, repeats)["fn"]


def cpu_medians(fns: dict, repeats: int) -> dict:
    """Median CPU seconds of each of ``fns`` (name -> callable) over ``repeats`` rounds, each round calling every
    function once in turn (after one warm-up round), so slow drifts of the machine hit every function alike."""
    for fn in fns.values():
        fn()
    times: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[k].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


@torch.no_grad()
def profile(seg, images: torch.Tensor, steps: int, ensemble: int, repeats: int) -> dict:
    """CPU seconds per image of each component of one-step DiffDIS and of the ``steps`` x ``ensemble`` multi-step
    segmenter on ``images``, and of both pipelines end to end."""
    n = images.shape[0]
    z = seg.encode(images)
    zs = z.repeat(ensemble, 1, 1, 1)  # the members in one batch, as Segmenter.segment runs them
    m1, e1 = predict_latents(seg.model, z, steps=1, edge=True)
    ms = predict_latents(seg.model, zs, steps=steps, edge=False)[0]
    fns = {
        "encode": lambda: seg.encode(images),
        "denoiser_one_step": lambda: predict_latents(seg.model, z, steps=1, edge=True),
        "decode": lambda: seg.decode_map(m1),
        "decode_edge": lambda: seg.decode_map(e1),
        "one_step_with_edges": lambda: seg.segment(images),
        "one_step_mask_only": lambda: seg.segment(images, edges=False),
    }
    one_times = cpu_medians(fns, repeats)
    multi_fns = {"denoiser_multi_step": lambda: predict_latents(seg.model, zs, steps=steps, edge=False),
                 "decode_multi_step": lambda: seg.decode_map(ms),
                 "multi_step": lambda: seg.segment(images, steps=steps, ensemble=ensemble)}
    multi_edge = seg.edge
    seg.edge = False  # the multi-step segmenter's rows: the mask alone (as benchmarks/diffdis.py's multistep arm)
    try:
        multi_times = cpu_medians(multi_fns, repeats)
    finally:
        seg.edge = multi_edge
    times = {k: v / n for k, v in {**one_times, **multi_times}.items()}
    e2e_keys = ("one_step_with_edges", "one_step_mask_only", "multi_step")
    e2e = {k: times[k] for k in e2e_keys}
    comp = {k: v for k, v in times.items() if k not in e2e_keys}
    one = {"encode": comp["encode"], "denoiser": comp["denoiser_one_step"], "mask decode": comp["decode"],
           "edge decode": comp["decode_edge"]}
    multi = {"encode": comp["encode"], "denoiser": comp["denoiser_multi_step"],
             "mask decode": comp["decode_multi_step"], "edge decode": 0.0}
    return {"batch": n, "steps": steps, "ensemble": ensemble, "components": comp, "one_step": one,
            "multi_step": multi, "end_to_end": e2e}


def render(rows: list[dict], meta: dict, command: str, decoder: str = "vae", encoder: str = "vae") -> str:
    lines = [f"# DiffDIS inference time by component: one step vs multi-step ({rows[0]['steps']} Euler steps x "
             f"{rows[0]['ensemble']}-sample ensemble), image encoder: {encoder}, mask decoder: {decoder}\n",
             f"    OMP_NUM_THREADS=1 {command}\n", provenance_line(meta), ""]
    for r in rows:
        one, multi = r["one_step"], r["multi_step"]
        total_one, total_mask_only, total_multi = sum(one.values()), sum(one.values()) - one["edge decode"], sum(
            multi.values())
        body = [(k, f"{1e3 * one[k]:.2f}", f"{1e3 * multi[k]:.2f}",
                 f"{multi[k] / one[k]:.1f}x" if one[k] and multi[k] else "-") for k in one]
        body += [("sum, with edge maps", f"{1e3 * total_one:.2f}", f"{1e3 * total_multi:.2f}",
                  f"{total_multi / total_one:.1f}x"),
                 ("sum, mask only", f"{1e3 * total_mask_only:.2f}", f"{1e3 * total_multi:.2f}",
                  f"{total_multi / total_mask_only:.1f}x")]
        e = r["end_to_end"]
        body += [("end to end (`Segmenter.segment`), with edge maps", f"{1e3 * e['one_step_with_edges']:.2f}",
                  f"{1e3 * e['multi_step']:.2f}", f"{e['multi_step'] / e['one_step_with_edges']:.1f}x"),
                 ("end to end, mask only (`edges=False`)", f"{1e3 * e['one_step_mask_only']:.2f}",
                  f"{1e3 * e['multi_step']:.2f}", f"{e['multi_step'] / e['one_step_mask_only']:.1f}x"),
                 ("end to end minus the components (mask only)",
                  f"{1e3 * (e['one_step_mask_only'] - total_mask_only):.2f}",
                  f"{1e3 * (e['multi_step'] - total_multi):.2f}", "-")]
        lines += [f"## Batch of {r['batch']} (CPU ms per image, median of the repeats)\n",
                  markdown_table(("component", "one step", "multi-step", "multi / one"), body, "lrrr"), ""]
        vae = one["encode"] + one["mask decode"]
        lines.append(f"- one step, mask only: the codec (encode + one decode) is {100 * vae / total_mask_only:.0f}% "
                     f"of the time, the denoiser {100 * one['denoiser'] / total_mask_only:.0f}%; with the codec "
                     f"free, the ratio would be {multi['denoiser'] / one['denoiser']:.1f}x\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=shipped_dir(), help="a segmenter directory (default: the shipped)")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="the multi-step segmenter's Euler steps")
    p.add_argument("--ensemble", type=int, default=4, help="the multi-step segmenter's ensemble size")
    p.add_argument("--decoder", default="vae", choices=MASK_DECODERS.names(),
                   help="the mask decoder of both paths (steerdiff.segment.MASK_DECODERS)")
    p.add_argument("--encoder", default="vae", choices=IMAGE_ENCODERS.names(),
                   help="the image encoder of both paths (steerdiff.segment.IMAGE_ENCODERS)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/diffdis)")
    p.add_argument("--table-only", action="store_true", help="re-render profile.md from profile.json")
    args = p.parse_args(argv)
    out = args.out if args.out is not None else results_dir("diffdis")
    # The VAE's keeps its old name, the light decoder's too (profile_light); a light encoder adds "_enc-<name>".
    stem = "profile" if args.decoder == "vae" else f"profile_{args.decoder}"
    if args.encoder != "vae":
        stem += f"_enc-{args.encoder}"
    if args.table_only:
        import json

        saved = json.loads((out / f"{stem}.json").read_text())
        write_text(out / f"{stem}.md", render(saved["rows"], saved["provenance"], saved["command"],
                                              saved.get("decoder", "vae"), saved.get("encoder", "vae")))
        return
    torch.set_num_threads(1)
    meta = provenance()
    seg = load_segmenter(args.model, decoder=args.decoder, encoder=args.encoder)
    rows = []
    for b in (int(s) for s in args.batches.split(",")):
        images = dis.generate(b, 64, seed=0, part="test").image
        rows.append(profile(seg, images, args.steps, args.ensemble, args.repeats))
        print(rows[-1], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/diffdis_profile.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(rows, meta, command.strip(), args.decoder, args.encoder)
    write_text(out / f"{stem}.md", text)
    write_json(out / f"{stem}.json", {"provenance": meta, "rows": rows, "command": command.strip(),
                                       "decoder": args.decoder, "encoder": args.encoder})
    print(text)


if __name__ == "__main__":
    main()
