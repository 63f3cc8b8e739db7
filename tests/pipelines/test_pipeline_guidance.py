"""The pipeline layer sits above the method packages and guides through them: the default classifier-free
guidance is :class:`steerdiff.guidance.CFG`, any registered guider (one registered at run time too) works on a
pipeline, and the row mapping of :func:`steerdiff.pipelines.bind` is core's
(:class:`steerdiff.core.guided.StructuredRows`), not a copy.

Independent truth for the run-time guider (it returns the null branch ``D_u``): the pipeline's conditional model on
empty prompts (the null of a prompt without a negative is the empty prompt's encoding), without guidance.
"""

from pathlib import Path

import pytest
import torch
from script_modules import load_script

import steerdiff as sd
from steerdiff.core.guided import StructuredRows
from steerdiff.guidance import CFG, GUIDERS, Guider, register_guider

pytest.importorskip("diffusers")

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")  # few-step tiny schedules

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_graph.py"
METHOD_PACKAGES = ("guidance", "align", "inverse", "covariance", "constrain", "quant", "geometry", "control",
                   "temporal")


def _import_graph():
    return load_script(SCRIPT, "import_graph")


def test_pipelines_sit_above_the_method_packages_and_use_guidance():
    graph = _import_graph()
    layer = graph.LAYER_OF["pipelines"]
    assert all(graph.LAYER_OF[p] < layer for p in METHOD_PACKAGES) and layer < graph.LAYER_OF["app"]
    edges = graph.import_edges()
    assert ("pipelines", "guidance") in edges  # the pipeline's CFG is guidance's
    assert not [src for src, dst in edges if dst == "pipelines" and src != "app"]  # only the app imports it
    assert graph.violations(edges) == []


def test_the_default_guidance_is_guidance_cfg(tiny, monkeypatch):
    p = sd.pipelines.from_diffusers(tiny.sd())
    seen = []
    real = sd.pipelines.pipeline.sample

    def spy(*args, **kwargs):
        seen.append(kwargs["guidance"])
        return real(*args, **kwargs)

    monkeypatch.setattr(sd.pipelines.pipeline, "sample", spy)
    p("a cat", num_inference_steps=2, guidance_scale=4.0, output_type="latent")
    p("a cat", num_inference_steps=2, guidance_scale=1.0, output_type="latent")
    assert isinstance(seen[0], CFG) and seen[0].scale == 4.0
    assert seen[1] is None  # s <= 1: the conditional model alone, as in diffusers


def test_a_guider_registered_at_run_time_works_on_a_pipeline(tiny):
    @register_guider("null_branch_test")
    class NullBranch(Guider):
        """The null branch D_u alone (a test guider)."""

        name = "null_branch_test"

        def combine(self, d_cond, d_null, x, sigma, step=None):
            return d_null

    try:
        p = sd.pipelines.from_diffusers(tiny.sd())
        latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(3))
        guider = sd.guidance.build_guider("null_branch_test", 2.0)
        with torch.no_grad():
            ours = p(["a cat", "dog"], num_inference_steps=3, guidance=guider, latents=latents, output_type="latent")
            want = p(["", ""], num_inference_steps=3, guidance_scale=1.0, latents=latents, output_type="latent")
        assert ours.nfe == 2 * want.nfe  # one doubled batch per step
        torch.testing.assert_close(ours.latents, want.latents, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(ours.latents, p(["a cat", "dog"], num_inference_steps=3, guidance_scale=1.0,
                                                  latents=latents, output_type="latent").latents, atol=1e-4)
    finally:
        GUIDERS.remove("null_branch_test")


def test_bind_uses_cores_row_mapping(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd())
    cond = p.encode(["a cat", "dog"], ["blurry", "red"])
    den, labels = sd.pipelines.bind(p, cond)
    assert isinstance(den, StructuredRows) and labels.tolist() == [0, 1]
    z = torch.randn((4, *p.latent_shape()), generator=torch.Generator().manual_seed(0))
    s = torch.full((4,), 3.0)
    with torch.no_grad():
        out = den(z, s, torch.tensor([1, -1, -1, 0]))
        # label 1 -> "dog"; -1 at positions 1 and 2 -> the nulls of rows 1 and 0 ("red", "blurry"); 0 -> "a cat"
        want = p.denoiser(z, s, sd.pipelines.TextCond.cat([cond.index([1]), cond.null.index([1, 0]),
                                                           cond.index([0])]))
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"cond row labels must lie in -1..1"):
        den(z, s, torch.tensor([0, 1, 2, 0]))
