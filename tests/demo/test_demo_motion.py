"""The demo's motion section (MotionDreamer, docs/methods/motiondreamer.md) in quick mode: it runs on the shipped
biped model, writes its stick-figure strips, and its edit keeps the reference's frames."""

import math

from steerdiff.app.demo import run_demo


def test_motion_section_quick(tmp_path):
    results = run_demo(tmp_path / "rep", quick=True, only=["motion"], progress=False)
    (s,) = [x for x in results["sections"] if x["key"] == "motion"]
    assert s["status"] == "ok", s.get("note")
    assert [v["method"] for v in s["variants"]] == ["reference", "motiondreamer", "edit"]
    for v in s["variants"]:
        assert (tmp_path / "rep" / v["image"]).is_file()
    gen = s["variants"][1]["values"]
    assert 0 <= gen["coverage"] <= 1 and math.isfinite(gen["local_div"]) and gen["local_div"] > 0
    assert s["variants"][2]["values"]["kept_identical"] == "True"
    assert s["cpu_seconds"] < 15
