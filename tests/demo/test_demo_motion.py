"""The demo's motion section (MotionDreamer, docs/methods/motiondreamer.md) in quick mode: it runs on the shipped
biped model, writes its stick-figure strips, and its edit keeps the reference's frames; its beat rows (the shipped
quadruped, unguided vs SMC-steered towards a beat sequence) are in results.json and on the page, and their beat-hit
rates are those of the stated draws, counted here independently."""

import json
import math

import pytest
import torch

from steerdiff.app.demo import run_demo
from steerdiff.models.io import ASSETS_DIR
from steerdiff.motion.dreamer import MotionDreamer


@pytest.fixture(scope="module")
def motion_quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("motion") / "rep"
    results = run_demo(out, quick=True, only=["motion"], progress=False)
    (s,) = [x for x in results["sections"] if x["key"] == "motion"]
    assert s["status"] == "ok", s.get("note")
    return out, s


def test_motion_section_quick(motion_quick):
    out, s = motion_quick
    assert [v["method"] for v in s["variants"]] == ["reference", "motiondreamer", "edit", "unguided", "smc"]
    for v in s["variants"]:
        assert (out / v["image"]).is_file()
    gen = s["variants"][1]["values"]
    assert 0 <= gen["coverage"] <= 1 and math.isfinite(gen["local_div"]) and gen["local_div"] > 0
    assert s["variants"][2]["values"]["kept_identical"] == "True"
    assert s["cpu_seconds"] < 15


def _hits(beats: list[int], x: torch.Tensor, tolerance: int = 2, min_gap: int = 4) -> int:
    """Requested beats met by a pause of ``x [T, F]`` (a local minimum of the frame speed below its median, pauses
    at least ``min_gap`` frames apart), written out here one frame at a time."""
    v = [float(torch.linalg.vector_norm(x[t + 1] - x[t])) for t in range(x.shape[0] - 1)]
    med = sorted(v)[(len(v) - 1) // 2]  # torch's median: the lower middle
    pauses = []
    for f in range(1, len(v) - 1):
        if v[f] <= v[f - 1] and v[f] <= v[f + 1] and v[f] < med and (not pauses or f - pauses[-1] >= min_gap):
            pauses.append(f)
    return sum(any(abs(b - p) <= tolerance for p in pauses) for b in beats)


def test_motion_section_beat_rows(motion_quick, page_parser):
    out, s = motion_quick
    rows = {v["method"]: v for v in s["variants"]}
    free, smc, cfg = rows["unguided"]["values"], rows["smc"]["values"], s["config"]
    beats, count, rounds, particles = cfg["beat frames"], cfg["count"], cfg["decoding rounds"], cfg["SMC particles"]
    assert len({b - a for a, b in zip(beats[:-1], beats[1:], strict=True)}) == 1 and 0 <= beats[0] and beats[-1] < 240
    # the numbers are in results.json, the strips and the beat-hit cells on the page
    (saved,) = [x for x in json.loads((out / "results.json").read_text())["sections"] if x["key"] == "motion"]
    assert saved["variants"] == s["variants"]
    page = page_parser(out / "index.html")
    assert {rows["unguided"]["image"], rows["smc"]["image"]} <= set(page.images)
    cells = {r["variant"]: r["cells"]["beat_hit"] for r in page.tables["motion"]}
    for v in (rows["unguided"], rows["smc"]):
        assert float(cells[v["name"]]["value"]) == pytest.approx(v["values"]["beat_hit"])
    # SMC costs its particles' evaluations per motion: rounds x particles against the unguided draw's rounds
    assert free["nfe"] == rounds and smc["nfe"] == particles * rounds
    assert all(0 <= r["coverage"] <= 1 for r in (free, smc))
    # the reported hit rates are those of the stated draws (redrawn through MotionDreamer.sample, the CLI's path, not
    # the section's direct align_to_beats call), counted with the independent count above
    md = MotionDreamer.load(ASSETS_DIR / cfg["beat model"])
    norm = md.tokenizer.normalize
    redraw = {"unguided": md.sample(count, 240, steps=rounds, seed=cfg["seed"]),
              "smc": md.sample(count, 240, steps=rounds, seed=cfg["seed"], beats=beats, particles=particles,
                               alpha=cfg["SMC alpha"], guidance_scale=None)}
    for method, feats in redraw.items():
        rate = sum(_hits(beats, norm(f)) for f in feats) / (count * len(beats))
        assert rows[method]["values"]["beat_hit"] == pytest.approx(rate, abs=1e-6), method
