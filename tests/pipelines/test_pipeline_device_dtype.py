"""Device and dtype follow the model in the pipeline wrapper (docs/methods/pipelines.md, "Device and dtype").

References: diffusers' own pipelines in the same dtype from the same latents, diffusers' ``randn_tensor`` for the
draws, a float32 copy of the VAE for the upcast decode. Device evidence on a CPU-only machine: the ``meta`` device
stands in for an accelerator (like CUDA, it refuses an op that mixes its tensors with CPU tensors other than 0-d
scalars), and a forward pre-hook on the network (the model double) asserts every tensor it is given is on the
network's device and, but the timestep (float32, as the diffusers pipelines pass it), in its dtype.

Tolerance of the half-precision comparisons. With unit roundoff ``u`` (float16: 2**-11, bfloat16: 2**-8), every
network evaluation rounds its input, weights and output at relative ``u``; over the steps (and CFG, which scales the
conditional-minus-unconditional difference by the guidance scale) these add to a few ``u``. diffusers' own half
run differs from its float32 run by 1.7-6 u on these pipelines, and ours from diffusers' half run by at most 2.4 u
(measured, float16 and bfloat16, SD / SDXL / SD3 / FLUX). The bound is 8 u relative for ours against diffusers in
the same dtype, and, since our sampler state is float32, ours must be no further from the float32 run than
diffusers' half run is (times 1.25).
"""

import warnings

import pytest
import torch

import steerdiff as sd
from steerdiff.core.noise import SampleNoise
from steerdiff.pipelines.pipeline import _randn

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")
from diffusers.utils.torch_utils import randn_tensor  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:the schedule starts at sigma"),
              pytest.mark.filterwarnings("ignore:There are modules"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
PROMPTS = ["a cat", "dog"]
STEPS = 3
SCALE = 3.0


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _modules(pipe):
    names = ("unet", "transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")
    return {n: getattr(pipe, n) for n in names if isinstance(getattr(pipe, n, None), torch.nn.Module)}


def _weights(pipe):
    """(name, dtype, data_ptr) of every parameter of every module: what the user loaded."""
    return {(m, n, p.dtype, p.data_ptr()) for m, module in _modules(pipe).items()
            for n, p in module.named_parameters()}


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, dict):
        for w in v.values():
            yield from _tensors(w)
    elif isinstance(v, (list, tuple)):
        for w in v:
            yield from _tensors(w)


class InputCheck:
    """The model double: a forward pre-hook recording every tensor argument of the network, and asserting it is on
    the network's device, floating-point ones in the network's dtype (the timestep: float32, as diffusers passes
    it; FLUX: the latents' dtype, as its pipeline rounds it)."""

    def __init__(self, network, timestep_names=("timestep",)):
        p = next(network.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.timestep_names = timestep_names
        self.calls = 0
        self.handle = network.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.calls += 1
        named = list(zip(("sample", "timestep"), args, strict=False)) + list(kwargs.items())  # UNet: positional
        for name, value in named:
            for t in _tensors(value):
                assert t.device == self.device, f"{name} on {t.device}, the network on {self.device}"
                if t.is_floating_point() and name not in self.timestep_names and name != "guidance":
                    assert t.dtype == self.dtype, f"{name} in {t.dtype}, the network in {self.dtype}"
        timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)
        assert timestep is not None and timestep.device == self.device


def _build(tiny, family):
    return {"sd": lambda: tiny.sd("euler"), "sdxl": tiny.sdxl, "sd3": lambda: tiny.sd3(t5=True),
            "flux": tiny.flux}[family]()


_SLOW = {("sdxl", torch.bfloat16), ("flux", torch.float16), ("flux", torch.bfloat16)}  # CPU half kernels: 10-25 s


@pytest.mark.parametrize("family, dtype", [
    pytest.param(f, d, marks=[pytest.mark.slow] if (f, d) in _SLOW else [], id=f"{f}-{str(d)[6:]}")
    for f in ("sd", "sdxl", "sd3", "flux") for d in (torch.float16, torch.bfloat16)])
def test_half_pipeline_matches_diffusers_in_that_dtype(tiny, family, dtype):
    pipe = _build(tiny, family)
    p = sd.pipelines.from_diffusers(pipe)
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(5))
    args = {"num_inference_steps": STEPS, "guidance_scale": SCALE, "output_type": "latent"}
    with torch.no_grad():
        ref32 = pipe(PROMPTS, latents=latents.clone(), **args).images
        pipe.to(dtype=dtype)
        ref = pipe(PROMPTS, latents=latents.to(dtype), **args).images
    before = _weights(pipe)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no upcast warning: nothing is upcast
        p = sd.pipelines.from_diffusers(pipe)
    check = InputCheck(p.network)
    try:
        ours = p(PROMPTS, latents=latents.to(dtype), progress=False, **args)
    finally:
        check.handle.remove()
    assert check.calls == STEPS
    assert _weights(pipe) == before  # the user's modules: same dtype, same storage
    assert ours.images.dtype == torch.float32  # the sampler's state (documented)
    u = UNIT_ROUNDOFF[dtype]
    assert _rel(ours.images, ref) < 8 * u
    assert _rel(ours.images, ref32) <= 1.25 * _rel(ref, ref32)


def test_sdxl_half_images_with_the_vae_upcast(tiny):
    # force_upcast (AutoencoderKL's default config) on a float16 VAE: the SDXL pipeline decodes in float32.
    pipe = _build(tiny, "sdxl").to(dtype=torch.float16)
    assert pipe.vae.config.force_upcast
    p = sd.pipelines.from_diffusers(pipe)
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(1), dtype=torch.float16)
    args = {"num_inference_steps": STEPS, "guidance_scale": SCALE, "output_type": "pt"}
    with torch.no_grad():
        ref = pipe(PROMPTS, latents=latents.clone(), **args).images
    before = _weights(pipe)
    ours = p(PROMPTS, latents=latents.clone(), progress=False, **args).images
    assert _weights(pipe) == before and pipe.vae.dtype == torch.float16
    assert ref.dtype == torch.float32  # diffusers decoded in float32
    torch.testing.assert_close(ours, ref, rtol=0, atol=8 * UNIT_ROUNDOFF[torch.float16])


@pytest.mark.parametrize("family, upcast", [("sdxl", True), ("sd", False)])
def test_decode_dtype_follows_the_vae_and_the_family(tiny, family, upcast):
    pipe = _build(tiny, family)
    vae32 = pipe.vae
    z = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    pipe.vae = type(vae32).from_config(vae32.config).eval()
    pipe.vae.load_state_dict(vae32.state_dict())
    pipe.vae.to(torch.float16)
    p = sd.pipelines.from_diffusers(pipe)
    before = {(n, t.dtype, t.data_ptr()) for n, t in pipe.vae.state_dict().items()}
    with torch.no_grad():
        ours = p.decode(z)
        if upcast:  # the float16 weights in float32: what diffusers' upcast gives
            vae32.load_state_dict({k: v.float() for k, v in pipe.vae.state_dict().items()})
            expected = vae32.decode(z / 0.5, return_dict=False)[0].clamp(-1, 1)
        else:  # decoded in float16
            expected = pipe.vae.decode((z / 0.5).half(), return_dict=False)[0].float().clamp(-1, 1)
    assert before == {(n, t.dtype, t.data_ptr()) for n, t in pipe.vae.state_dict().items()}
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6 if upcast else 2 * UNIT_ROUNDOFF[torch.float16])
    if upcast:  # and not what a float16 decode gives
        half = pipe.vae.decode((z / 0.5).half(), return_dict=False)[0].float().clamp(-1, 1)
        assert float((ours - half).abs().max()) > 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["none", "one", "list"])
def test_latents_are_drawn_as_randn_tensor(kind, dtype):
    shape = (3, 4, 5, 5)

    def gen():
        if kind == "none":
            torch.manual_seed(11)
            return None
        if kind == "one":
            return torch.Generator().manual_seed(11)
        return [torch.Generator().manual_seed(11 + i) for i in range(shape[0])]

    ours = _randn(shape, gen(), dtype, "cpu")
    ref = randn_tensor(shape, generator=gen(), device=torch.device("cpu"), dtype=dtype)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["none", "one", "list"])
def test_pipeline_draws_its_latents_as_diffusers(tiny, kind):
    # The pipelines' own draws (no latents=): diffusers' call and ours from the same generator state.
    pipe = tiny.sd("ddim")
    p = sd.pipelines.from_diffusers(pipe)

    def gen():
        if kind == "none":
            torch.manual_seed(3)
            return None
        if kind == "one":
            return torch.Generator().manual_seed(3)
        return [torch.Generator().manual_seed(3 + i) for i in range(2)]

    args = {"num_inference_steps": STEPS, "guidance_scale": SCALE, "output_type": "latent"}
    with torch.no_grad():
        ref = pipe(PROMPTS, generator=gen(), **args).images
    ours = p(PROMPTS, generator=gen(), progress=False, **args).images
    assert _rel(ours, ref) < 1e-4


def _meta_sd(tiny, dtype):
    """A tiny SD pipeline whose UNet lives on the meta device in ``dtype`` (the text encoder and VAE stay on the
    CPU, as with model offloading): a stand-in accelerator."""
    pipe = tiny.sd("euler")
    pipe.unet.to("meta", dtype)
    return pipe


@pytest.mark.parametrize("kind", ["none", "one", "list"])
def test_call_state_and_condition_live_on_the_networks_device(tiny, monkeypatch, kind):
    pipe = _meta_sd(tiny, torch.float16)
    p = sd.pipelines.from_diffusers(pipe)
    seen = {}

    def sample_double(denoiser, noise, sigmas, cond=None, **kwargs):
        # steerdiff.sample's first network evaluation, then the state as the result (meta tensors have no values,
        # and the sampler's finite checks read them).
        seen["noise"], seen["cond"], seen["generator"] = noise, cond, kwargs.get("generator")
        sigma = torch.full((noise.shape[0],), float(sigmas[0]), dtype=torch.float64, device=noise.device)
        seen["out"] = denoiser(noise, sigma.to(noise.dtype), cond)
        return noise, type("Stats", (), {"nfe": 1})()

    monkeypatch.setattr(sd.pipelines.pipeline, "sample", sample_double)
    generator = {"none": None, "one": torch.Generator().manual_seed(0),
                 "list": [torch.Generator().manual_seed(i) for i in range(2)]}[kind]
    check = InputCheck(p.network)
    try:
        out = p(PROMPTS, num_inference_steps=2, guidance_scale=1.0, generator=generator, output_type="latent",
                progress=False)
    finally:
        check.handle.remove()
    meta = torch.device("meta")
    assert check.calls == 1  # the network ran on meta: no CPU tensor reached it (it would have raised)
    assert seen["noise"].device == meta and seen["noise"].dtype == torch.float32
    assert seen["out"].device == meta and seen["out"].dtype == torch.float32
    assert all(v.device == meta and v.dtype == torch.float16 for v in seen["cond"].values())
    assert all(v.device == meta for v in seen["cond"].null.values())
    assert out.latents.device == meta
    assert seen["generator"] is generator  # stochastic samplers draw from it (SampleNoise, below)


def test_denoiser_moves_its_inputs_to_the_network(tiny):
    # Called directly (sd.sample on p.denoiser) with a condition on the text encoder's device.
    p = sd.pipelines.from_diffusers(_meta_sd(tiny, torch.bfloat16))
    cond = p.encode(PROMPTS)
    assert cond["prompt_embeds"].device.type == "cpu"
    x = torch.zeros((2, *p.latent_shape()), device="meta")
    check = InputCheck(p.network)
    try:
        out = p.denoiser(x, torch.full((2,), 2.0, device="meta"), cond)
    finally:
        check.handle.remove()
    assert check.calls == 1 and out.device.type == "meta" and out.dtype == torch.float32


def test_meta_device_refuses_mixed_inputs(tiny):
    # What makes the meta device evidence: the UNet on meta refuses a CPU condition, as a CUDA UNet would.
    pipe = _meta_sd(tiny, torch.float16)
    cond = sd.pipelines.from_diffusers(pipe).encode(["a"])
    with pytest.raises(RuntimeError, match="device"):
        pipe.unet(torch.zeros((1, 4, 8, 8), device="meta", dtype=torch.float16), torch.tensor([10.0], device="meta"),
                  encoder_hidden_states=cond["prompt_embeds"].half())


@pytest.mark.parametrize("generators", ["one", "list"])
def test_sampler_noise_from_cpu_generators_follows_the_state(generators):
    # A CPU generator with a model elsewhere: drawn on the CPU (diffusers' rule), then moved to the state's device.
    gens = [torch.Generator().manual_seed(0)] * 2 if generators == "one" else \
        [torch.Generator().manual_seed(i) for i in range(2)]
    on_meta = SampleNoise(gens).randn((2, 3), torch.float32, "meta")
    assert on_meta.device.type == "meta"
    fresh = [torch.Generator().manual_seed(0)] * 2 if generators == "one" else \
        [torch.Generator().manual_seed(i) for i in range(2)]
    assert SampleNoise(fresh).randn((2, 3), torch.float32, "cpu").device.type == "cpu"


def test_stochastic_sampler_with_a_cpu_generator_is_reproducible(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd("ddim"))
    runs = [p("a cat", num_inference_steps=STEPS, guidance_scale=SCALE, method="ddpm", output_type="latent",
              generator=torch.Generator().manual_seed(4), progress=False).images for _ in range(2)]
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_a_missing_half_kernel_is_refused_by_name(tiny):
    pipe = tiny.sd("ddim")
    pipe.unet.half()
    p = sd.pipelines.from_diffusers(pipe)

    def missing(module, x, t, cond):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")

    p.denoiser.net.call = missing
    with pytest.raises(RuntimeError, match=r"UNet2DConditionModel in torch.float16 on cpu.*pipe.to\(torch.float32\)"):
        p("a cat", num_inference_steps=2, output_type="latent", progress=False)
    assert next(pipe.unet.parameters()).dtype == torch.float16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_cuda_pipeline_with_a_cuda_or_cpu_generator_matches_diffusers(tiny, where):
    pipe = tiny.sd("euler").to("cuda", torch.float16)
    p = sd.pipelines.from_diffusers(pipe)
    args = {"num_inference_steps": STEPS, "guidance_scale": SCALE, "output_type": "latent"}
    with torch.no_grad():
        ref = pipe(PROMPTS, generator=torch.Generator(where).manual_seed(0), **args).images
    ours = p(PROMPTS, generator=torch.Generator(where).manual_seed(0), progress=False, **args)
    assert ours.latents.device.type == "cuda" and next(pipe.unet.parameters()).dtype == torch.float16
    assert _rel(ours.images, ref) < 8 * UNIT_ROUNDOFF[torch.float16]
