"""The demo's forecast section (DyDiff vs its baseline, docs/methods/dydiff.md) in quick mode: it runs, writes its
images and plot, and its numbers are the library's."""

import math

from steerdiff.app.demo import run_demo


def test_forecast_section_quick(tmp_path):
    results = run_demo(tmp_path / "rep", quick=True, only=["forecast"], progress=False)
    (s,) = [x for x in results["sections"] if x["key"] == "forecast"]
    assert s["status"] == "ok", s.get("note")
    assert [v["name"] for v in s["variants"]][:2] == ["DyDiff (r = 0.5)", "Conditional diffusion (r = 0)"]
    for v in s["variants"]:
        assert (tmp_path / "rep" / v["image"]).is_file()
        assert math.isfinite(v["values"]["mse"]) and math.isfinite(v["values"]["crps"])
    values = {v["name"]: v["values"] for v in s["variants"]}
    oracle, persistence = values["Oracle mean (exact)"], values["Persistence"]
    assert oracle["mse"] < persistence["mse"]
    for name in ("DyDiff (r = 0.5)", "Conditional diffusion (r = 0)"):
        assert values[name]["nfe"] == 23 and values[name]["mse"] < persistence["mse"]
    assert any(f["kind"] == "plot" for f in s["figures"]) and s["findings"]
    assert s["cpu_seconds"] < 10  # quick-mode budget: 5 s on an idle core, with margin for a loaded machine
