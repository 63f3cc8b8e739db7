"""steerdiff on CUDA in float16 / bfloat16 (issue 36): no host synchronisation in ``sd.sample``, a pipeline call or
a DAS run; latents drawn as diffusers draws them (no generator, a CPU or a CUDA generator, a list of generators);
a compiled UNet that does not recompile per step; the half-precision call against diffusers' own in that dtype.

Independent truth: diffusers' pipeline ``__call__`` on the same pipeline, in the same dtype, with the same
generators (its ``randn_tensor`` draws on the generator's device and moves the result); CUDA's sync debug mode.
Skipped without CUDA (``STEERDIFF_GPU_TEST_DEVICE=cpu`` runs them on the CPU: tests/gpu/conftest.py).
"""

import pytest
import torch

import steerdiff as sd

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:the schedule starts at sigma")]

PROMPTS = ["a red disk", "a blue square"]
STEPS = 4
SCALE = 3.0
HALF = [torch.float16, torch.bfloat16]


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _pipeline(tiny, family, device, dtype):
    build = {"sd": lambda: tiny.sd("euler"), "sdxl": tiny.sdxl, "sd3": tiny.sd3, "flux": tiny.flux}[family]
    pipe = build().to(device, dtype)
    return pipe, sd.pipelines.from_diffusers(pipe)


def _kw(family):
    kw = {"num_inference_steps": STEPS, "guidance_scale": 3.5 if family == "flux" else SCALE}
    return kw | ({"height": 16, "width": 16, "max_sequence_length": 6} if family == "flux" else {})


def _reference(pipe, family, **kw):
    with torch.no_grad():
        return pipe(PROMPTS, output_type="latent", **_kw(family), **kw).images


# ------------------------------------------------------------------------------------------------ no host sync
@pytest.mark.parametrize("dtype", HALF)
def test_sample_makes_no_host_sync(tiny, device, dtype, no_sync):
    pipe, p = _pipeline(tiny, "sd", device, dtype)
    cond = p.encode(PROMPTS)
    sigmas = p.default_sigmas(STEPS).to(device)
    noise = sd.randn((2, *p.latent_shape()), seeds=0).to(device, dtype)
    with no_sync(), torch.no_grad():
        out = sd.sample(p.denoiser, noise * sigmas[0], sigmas, method="euler", cond=cond,
                        guidance=sd.guidance.CFG(SCALE))
    assert out.device == noise.device and out.dtype == dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("family, dtype", [("sd", torch.float16), ("sd", torch.bfloat16), ("sdxl", torch.float16),
                                           ("sd3", torch.bfloat16), ("flux", torch.bfloat16)])
def test_pipeline_call_makes_no_host_sync(tiny, device, family, dtype, no_sync):
    pipe, p = _pipeline(tiny, family, device, dtype)
    kw = _kw(family)
    latents = torch.randn((2, *p.latent_shape(kw.get("height"), kw.get("width"))),
                          generator=torch.Generator().manual_seed(5)).to(device, dtype)
    p(PROMPTS, latents=latents, output_type="latent", **kw)  # warm-up (first-call caches, lazy inits)
    with no_sync():
        out = p(PROMPTS, latents=latents, output_type="latent", **kw)
    assert out.images.device == latents.device and out.images.dtype == dtype


@pytest.mark.parametrize("dtype", HALF)
def test_das_makes_no_host_sync(tiny, device, dtype, no_sync):
    pipe, p = _pipeline(tiny, "sd", device, dtype)
    den, labels = sd.pipelines.bind(p, p.encode(PROMPTS[:1]))
    sigmas = p.default_sigmas(STEPS).to(device)
    noise = sd.randn((4, *p.latent_shape()), seeds=0).to(device, dtype)

    def reward(z):
        return -z.float().flatten(1).pow(2).mean(1)

    with no_sync():
        res = sd.align.das(den, reward, noise, sigmas, alpha=0.1, particles=4, cond=labels.to(device),
                           gradient=False, generator=torch.Generator(device).manual_seed(0))
    assert res.samples.device == noise.device
    assert torch.isfinite(res.samples.float()).all()


# ------------------------------------------------------------------------------------------------ latents
@pytest.mark.parametrize("where", ["none", "cpu", "cuda", "list"])
def test_latents_are_drawn_as_diffusers_draws_them(tiny, device, where):
    pipe, p = _pipeline(tiny, "sd", device, torch.float16)

    def gens():
        if where == "none":
            return None
        if where == "list":
            return [torch.Generator("cpu").manual_seed(1), torch.Generator(device).manual_seed(2)]
        return torch.Generator("cpu" if where == "cpu" else device).manual_seed(3)

    if where == "none":
        torch.manual_seed(0)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(0)
    ours = p(PROMPTS, generator=gens(), output_type="latent", **_kw("sd"))
    assert ours.images.device.type == device.type and ours.images.dtype == torch.float16
    if where == "none":  # the global generator: only the device and the values' sanity can be compared
        assert torch.isfinite(ours.images.float()).all()
        return
    ref = _reference(pipe, "sd", generator=gens())
    assert _rel(ours.images, ref) < 2e-2


# ------------------------------------------------------------------------------------------------ half precision
@pytest.mark.parametrize("family, dtype", [("sd", torch.float16), ("sd", torch.bfloat16), ("sdxl", torch.float16),
                                           ("sd3", torch.bfloat16), ("flux", torch.bfloat16)])
def test_half_precision_call_matches_diffusers_and_keeps_the_model(tiny, device, family, dtype):
    pipe, p = _pipeline(tiny, family, device, dtype)
    net = p.network
    kw = _kw(family)
    latents = torch.randn((2, *p.latent_shape(kw.get("height"), kw.get("width"))),
                          generator=torch.Generator().manual_seed(5)).to(device, dtype)
    ours = p(PROMPTS, latents=latents, output_type="latent", **kw)
    ref = _reference(pipe, family, latents=latents.clone())
    assert _rel(ours.images, ref) < 3e-2
    assert {q.dtype for q in net.parameters()} == {dtype}  # the user's model is not upcast in place
    assert {q.device.type for q in net.parameters()} == {device.type}


# ------------------------------------------------------------------------------------------------ compile
def test_compiled_unet_runs_without_recompiling(tiny, device):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    pipe, p = _pipeline(tiny, "sd", device, torch.float16)
    kw = _kw("sd")
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(5)).to(device,
                                                                                                 torch.float16)
    eager = p(PROMPTS, latents=latents, output_type="latent", **kw).images
    p.network.compile(backend="inductor" if device.type == "cuda" else "eager")
    first = p(PROMPTS, latents=latents, output_type="latent", **kw).images  # compiles here
    graphs = counters["stats"]["unique_graphs"]
    again = p(PROMPTS, latents=latents * 0.5, output_type="latent", num_inference_steps=STEPS + 2,
              guidance_scale=SCALE).images
    cond = p.encode(PROMPTS)
    sigmas = p.default_sigmas(STEPS + 1).to(device)
    with torch.no_grad():
        sample = sd.sample(p.denoiser, latents * sigmas[0], sigmas, method="euler", cond=cond,
                           guidance=sd.guidance.CFG(SCALE))
    assert counters["stats"]["unique_graphs"] == graphs, "the compiled network recompiled for another step or call"
    assert _rel(first, eager) < 2e-2
    assert torch.isfinite(again.float()).all() and torch.isfinite(sample.float()).all()
