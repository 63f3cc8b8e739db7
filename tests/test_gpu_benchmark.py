"""benchmarks/gpu.py on CPU: the published configurations it builds (checked on the ``meta`` device against the
models' published parameter counts), and a reduced ``--tiny`` run end to end with the structure of its output.

Independent truth: the parameter counts the model cards and diffusers' loaded checkpoints give (SD 1.5's UNet
859,520,964; SDXL's UNet 2,567,463,684; SD3-medium's MMDiT 2,028,328,000; FLUX.1-dev's transformer
11,901,408,320).
"""

import json

import pytest
import torch
from script_modules import load_script

import steerdiff as sd

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")  # 2-step tiny schedules


@pytest.fixture(scope="module")
def gpu():
    return load_script("benchmarks/gpu.py")


PUBLISHED = {"sd15": 859_520_964, "sdxl": 2_567_463_684, "sd3": 2_028_328_000, "flux": 11_901_408_320}


@pytest.mark.parametrize("family", list(PUBLISHED))
def test_published_denoiser_configs_have_the_published_parameter_counts(gpu, family):
    with gpu.building(torch.device("meta"), torch.bfloat16):  # no memory: shapes only
        net = gpu.build_denoiser(family)
    assert gpu.parameter_count(net) == PUBLISHED[family]
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}  # created in the target dtype, no fp32 copy


def test_full_pipelines_build_in_their_dtype_and_wrap(gpu, tmp_path):
    from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

    write_clip_tokenizer(tmp_path)
    shapes = {"sd15": (4, 64, 64), "sdxl": (4, 128, 128), "sd3": (16, 128, 128), "flux": (4096, 64)}
    for family, spec in gpu.full_specs().items():
        pipe = gpu.build_full(family, tmp_path, torch.device("meta"), spec.dtype, t5_layers=1)
        for name, module in pipe.components.items():
            if isinstance(module, torch.nn.Module):
                assert {p.dtype for p in module.parameters()} == {spec.dtype}, (family, name)
                assert {p.device.type for p in module.parameters()} == {"meta"}, (family, name)
        sch = pipe.scheduler  # built outside the device context: on the CPU in float32, as diffusers makes it
        for v in vars(sch).values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                assert v.device.type == "cpu" and v.dtype in (torch.float32, torch.float64), family
        p = sd.pipelines.from_diffusers(pipe)
        assert p.latent_shape(spec.size, spec.size) == shapes[family]


def test_tiny_run_writes_the_tables(gpu, tmp_path):
    report = gpu.main(["--tiny", "--families", "sd15", "--sections", "call,apg,das,forward,syncs",
                       "--repeats", "1", "--steps", "2", "--threads", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_tiny_cpu.json").read_text())
    md = (tmp_path / "gpu_tiny_cpu.md").read_text()
    assert saved["tiny"] is True and saved["device"] == "cpu" and "CPU, tiny" in saved["label"]
    assert md.startswith("# GPU benchmark (CPU, tiny pipelines")
    rows = saved["results"]
    assert len(rows) == len(report["results"])
    assert not [r for r in rows if r.get("error")], [r for r in rows if r.get("error")]
    by = {}
    for r in rows:
        by.setdefault(r["section"], []).append(r)
    assert [r["batch"] for r in by["call"]] == [1, 4]
    for r in by["call"]:
        assert r["order"] == ["diffusers", "steerdiff"] and len(r["steerdiff"]["times_s"]) == 1
        assert r["steerdiff"]["ratio_of_medians"] == pytest.approx(
            r["steerdiff"]["median_s"] / r["diffusers"]["median_s"])
        assert r["steerdiff"]["peak_bytes"] > 0
    assert [r["particles"] for r in by["das"]] == [4, 8]
    assert by["apg"][0]["order"] == ["cfg", "apg"] and by["forward"][0]["forwards"] == 2
    runs = {r["run"]: r for r in by["syncs"]}
    assert set(runs) == {"diffusers call", "steerdiff call", "sd.sample", "das P=4"}
    assert all(r["per_step"] == r["syncs"] / 2 for r in runs.values())
    assert "| sd15 | call | batch 4 |" in md


def test_bad_section_is_refused(gpu):
    with pytest.raises(SystemExit, match="--sections: nope"):
        gpu.main(["--tiny", "--sections", "call,nope"])
