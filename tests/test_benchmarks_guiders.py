"""benchmarks/guiders.py --quick end to end: every guider gets its row, and the cost columns follow the equal-NFE
rule's arithmetic (independent truth: Heun with N steps evaluates 2N - 1 times, its last step being Euler's; CFG
doubles the batch; PAG / SEG add a third row per evaluation; the weak model of AutoGuidance is evaluated once per
evaluation of the model; CFG's matched row spends 3N rows-per-image over 2 rows per step, ceil(3N / 2) steps).
"""

import json
import math

import pytest
from script_modules import load_script

import steerdiff as sd

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/guiders.py")


def _needs(*names):
    missing = [n for n in names if n not in sd.models.shipped_models()]
    if missing:
        pytest.skip(f"not shipped: {missing}")


def test_quick_digits_rows_and_costs(bench, tmp_path):
    _needs("digits", "digits_classifier", "digits_weak")
    res = bench.main(["--quick", "--parts", "digits", "--out", str(tmp_path)])["digits"]
    steps = res["steps"]
    heun = 2 * steps - 1
    rows = {r["guider"]: r for r in res["rows"]}
    assert set(rows) == {"plain", *bench.GUIDERS["digits"]}
    assert rows["plain"]["nfe"] == heun
    for name in ("cfg", "cfg_rescale", "apg", "tcfg", "fdg", "mambo"):
        assert rows[name]["nfe"] == 2 * heun, name
    # CFG-Zero* zero-initialises the first step: no network call there (one Heun step = 2 evaluations saved).
    assert rows["cfg_zero_star"]["nfe"] == 2 * (heun - 2)
    assert rows["autoguidance"]["nfe"] == heun and rows["autoguidance"]["weak_nfe"] == heun
    for r in res["rows"]:
        for key in ("precision", "recall", "accuracy", "clip_fraction"):
            assert 0.0 <= r[key] <= 1.0, (r["guider"], key)
        assert r["fid"] >= 0 and r["wall_s"] >= 0
    # FDG runs with unequal band weights: it must not reduce to CFG (equal weights would be CFG exactly).
    assert rows["fdg"]["fid"] != rows["cfg"]["fid"]
    saved = json.loads((tmp_path / "guiders_digits.json").read_text())
    assert saved["quick"] and saved["meta"]["command"].startswith("python benchmarks/guiders.py")
    text = (tmp_path / "guiders_digits.md").read_text()
    assert "Equal NFE" in text and "| autoguidance |" in text


def test_combine_merges_parts_and_refuses_duplicates(bench, tmp_path):
    meta = {"command": "python benchmarks/guiders.py --parts x", "date": "2026-01-01"}
    empty = {"skipped": "test"}
    for stem, parts in (("a", ["digits"]), ("b", ["pipeline", "shapes"])):
        (tmp_path / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": {p: empty for p in parts}}))
    res = bench.main(["--combine", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path)])
    assert set(res) == {"digits", "shapes", "pipeline"}
    text = (tmp_path / "guiders.md").read_text()
    assert text.index("## digits") < text.index("## shapes") < text.index("## pipeline")
    with pytest.raises(SystemExit, match="more than one file"):
        bench.main(["--combine", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--out", str(tmp_path)])


def test_combine_merges_runs_split_by_scale_or_guider(bench, tmp_path):
    meta = {"command": "python benchmarks/guiders.py --parts shapes", "date": "2026-01-01"}
    settings = {"n": 4, "steps": 3, "sampler": "heun", "seed": 0, "rgb": True, "n_real": 8}

    def row(guider, w, fid):
        return {"guider": guider, "w": w, "steps": 3, "weak_nfe": None, "fid": fid, "precision": 0.5, "recall": 0.5,
                "accuracy": 1.0, "clip_fraction": 0.0, "clip_fraction_1.1": 0.0, "saturation_offset": 0.0,
                "nfe": 10, "wall_s": 1.0}

    def write(name, rows, **changed):
        res = {**settings, **changed, "rows": rows}
        (tmp_path / name).write_text(json.dumps({"meta": meta, "results": {"shapes": res}}))
        return str(tmp_path / name)

    w5 = write("w5.json", [row("plain", 1.0, 0.1), row("cfg", 5.0, 0.5), row("apg", 5.0, 0.4)])
    w2 = write("w2.json", [row("plain", 1.0, 0.1), row("apg", 2.0, 0.3), row("cfg", 2.0, 0.2)])
    res = bench.main(["--combine", w5, w2, "--out", str(tmp_path)])["shapes"]
    assert [(r["guider"], r["w"]) for r in res["rows"]] == [("plain", 1.0), ("cfg", 2.0), ("apg", 2.0),
                                                            ("cfg", 5.0), ("apg", 5.0)]
    assert (tmp_path / "guiders.md").read_text().count("\nRun: ") == 2
    again = write("again.json", [row("plain", 1.0, 0.1), row("cfg", 5.0, 0.6)])
    with pytest.raises(SystemExit, match="cfg w=5 is in more than one file"):
        bench.main(["--combine", w5, again, "--out", str(tmp_path)])
    other = write("other.json", [row("plain", 1.0, 0.1), row("cfg", 10.0, 0.6)], steps=20)
    with pytest.raises(SystemExit, match="different settings"):
        bench.main(["--combine", w5, other, "--out", str(tmp_path)])


@pytest.mark.slow
def test_quick_pipeline_perturbation_costs(bench, tmp_path):
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    from steerdiff.app.protocols import shapes_pipeline as sp

    if not (sp.shipped_dir() / "model_index.json").is_file():
        pytest.skip("shipped pipeline not built")
    res = bench.main(["--quick", "--parts", "pipeline", "--out", str(tmp_path)])["pipeline"]
    steps = res["steps"]
    rows = {r["guider"]: r for r in res["rows"]}
    assert not [r for r in res["rows"] if "error" in r]
    assert rows["cfg"]["nfe"] == 2 * steps  # the pipeline's Euler: one evaluation per step
    assert rows["pag"]["nfe"] == rows["seg"]["nfe"] == 3 * steps
    assert res["matched_steps"] == math.ceil(3 * steps / 2)
    assert rows["cfg @NFE"]["steps"] == res["matched_steps"] and rows["cfg @NFE"]["nfe"] == 2 * res["matched_steps"]
    for r in res["rows"]:
        assert 0.0 <= r["conformity"] <= 1.0
