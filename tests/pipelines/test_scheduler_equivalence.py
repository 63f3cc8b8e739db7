"""``method=None`` computes what the diffusers pipeline computes, for every scheduler and option it ships, or refuses.

The rule (docs/methods/pipelines.md, "Schedules, samplers and guidance"): with ``method=None`` a
:class:`~steerdiff.pipelines.Pipeline` either computes what the wrapped diffusers pipeline computes from the same
initial latents (and, for a stochastic scheduler, the same noise: a list of generators, one per image, which
diffusers' ``randn_tensor`` and steerdiff's per-row noise draw from in the same order), or raises a ValueError
naming the scheduler option (or the scheduler) it has no equivalent for. The reference is the diffusers pipeline's
own ``__call__`` on the tiny random-weight pipelines of ``tests/tiny_pipelines.py``; tolerance 1e-4 relative, as in
``test_pipelines_vs_diffusers.py``. Each case states its outcome (``None``: equal; a string: the option named in the
refusal), so a conversion that silently starts refusing fails too.
"""

import inspect

import pytest
import torch

import steerdiff as sd

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:the schedule starts at sigma")

PROMPTS = ["a cat", "dog"]
SCALE = 3.0
SD = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")  # SD 1.x's training schedule
NOCLIP = dict(clip_sample=False)

# (scheduler class, config, steps, expected): expected None = equal to diffusers; a string = refused, naming it.
CASES = [
    ("DDIMScheduler", dict(NOCLIP, set_alpha_to_one=False, steps_offset=1), 4, None),
    ("DDIMScheduler", dict(NOCLIP, set_alpha_to_one=True), 5, None),
    ("DDIMScheduler", dict(NOCLIP, timestep_spacing="trailing"), 4, None),
    ("DDIMScheduler", dict(NOCLIP, timestep_spacing="trailing"), 3, "timestep_spacing"),
    ("DDIMScheduler", dict(NOCLIP, timestep_spacing="linspace"), 4, "timestep_spacing"),
    ("DDIMScheduler", dict(clip_sample=True), 4, "clip_sample"),
    ("DDIMScheduler", dict(NOCLIP, thresholding=True), 4, "thresholding"),
    ("DDPMScheduler", dict(NOCLIP, steps_offset=1), 4, None),
    ("DDPMScheduler", dict(NOCLIP, timestep_spacing="trailing"), 4, None),
    ("DDPMScheduler", dict(NOCLIP, variance_type="fixed_large"), 4, "variance_type"),
    ("DDPMScheduler", dict(), 4, "clip_sample"),  # DDPM's default clips x0
    ("EulerDiscreteScheduler", dict(timestep_spacing="linspace"), 4, None),
    ("EulerDiscreteScheduler", dict(timestep_spacing="leading", steps_offset=1), 4, None),
    ("EulerDiscreteScheduler", dict(timestep_spacing="trailing"), 4, None),
    ("EulerDiscreteScheduler", dict(interpolation_type="log_linear"), 4, "interpolation_type"),
    ("EulerDiscreteScheduler", dict(use_karras_sigmas=True), 4, "use_karras_sigmas"),
    ("EulerDiscreteScheduler", dict(final_sigmas_type="sigma_min"), 4, "final_sigmas_type"),
    ("EulerAncestralDiscreteScheduler", dict(timestep_spacing="linspace"), 4, None),
    ("EulerAncestralDiscreteScheduler", dict(timestep_spacing="leading", steps_offset=1), 4, None),
    ("EulerAncestralDiscreteScheduler", dict(timestep_spacing="trailing"), 4, None),
    ("LMSDiscreteScheduler", dict(timestep_spacing="linspace"), 5, None),
    ("LMSDiscreteScheduler", dict(timestep_spacing="leading", steps_offset=1), 5, None),
    ("LMSDiscreteScheduler", dict(timestep_spacing="trailing"), 5, None),
    ("LMSDiscreteScheduler", dict(use_karras_sigmas=True), 5, "use_karras_sigmas"),
    ("HeunDiscreteScheduler", dict(timestep_spacing="linspace"), 4, None),
    ("HeunDiscreteScheduler", dict(timestep_spacing="leading", steps_offset=1), 4, None),
    ("HeunDiscreteScheduler", dict(timestep_spacing="trailing"), 4, None),
    ("HeunDiscreteScheduler", dict(clip_sample=True), 4, "clip_sample"),
    *[("DPMSolverMultistepScheduler", dict(algorithm_type=a, solver_order=o, solver_type=t), n, None)
      for a in ("dpmsolver++", "sde-dpmsolver++") for o in (1, 2) for t in ("midpoint", "heun") for n in (4,)],
    *[("DPMSolverMultistepScheduler", dict(solver_order=3, solver_type=t, lower_order_final=lo), n, None)
      for t in ("midpoint", "heun") for lo in (True, False) for n in (5, 16)],
    ("DPMSolverMultistepScheduler", dict(timestep_spacing="leading", steps_offset=1), 6, None),
    ("DPMSolverMultistepScheduler", dict(timestep_spacing="trailing"), 6, None),
    ("DPMSolverMultistepScheduler", dict(euler_at_final=True), 6, None),
    ("DPMSolverMultistepScheduler", dict(lower_order_final=False), 6, None),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver++", solver_order=1), 4, None),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver", final_sigmas_type="sigma_min"), 4,
     "algorithm_type"),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver", final_sigmas_type="sigma_min"), 4,
     "algorithm_type"),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++", solver_order=3), 4, "solver_order"),
    *[("DPMSolverMultistepScheduler", dict(final_sigmas_type="sigma_min", algorithm_type=a, solver_order=o,
                                            solver_type=t), n, None)
      for a in ("dpmsolver++", "sde-dpmsolver++") for o, t in ((1, "midpoint"), (2, "midpoint"), (2, "heun"))
      for n in (6, 16)],
    ("DPMSolverMultistepScheduler", dict(final_sigmas_type="sigma_min", euler_at_final=True), 16, None),
    ("DPMSolverMultistepScheduler", dict(final_sigmas_type="sigma_min", lower_order_final=False), 6, None),
    ("DPMSolverMultistepScheduler", dict(final_sigmas_type="sigma_min", algorithm_type="dpmsolver",
                                         solver_order=1), 4, None),
    ("DPMSolverMultistepScheduler", dict(final_sigmas_type="sigma_min", solver_order=3), 4, "final_sigmas_type"),
    ("DPMSolverMultistepScheduler", dict(thresholding=True), 4, "thresholding"),
    ("DPMSolverMultistepScheduler", dict(use_karras_sigmas=True), 4, "use_karras_sigmas"),
    ("DPMSolverMultistepScheduler", dict(use_lu_lambdas=True), 4, "use_lu_lambdas"),
    *[("UniPCMultistepScheduler", dict(solver_order=o, solver_type=t), 5, None)
      for o in (1, 2, 3) for t in ("bh1", "bh2")],
    ("UniPCMultistepScheduler", dict(timestep_spacing="trailing"), 5, None),
    ("UniPCMultistepScheduler", dict(disable_corrector=[0]), 5, "disable_corrector"),
    ("UniPCMultistepScheduler", dict(predict_x0=False), 5, "predict_x0"),
    ("UniPCMultistepScheduler", dict(lower_order_final=False), 5, "lower_order_final"),
    ("UniPCMultistepScheduler", dict(final_sigmas_type="sigma_min"), 5, "final_sigmas_type"),
    ("UniPCMultistepScheduler", dict(use_karras_sigmas=True), 5, "use_karras_sigmas"),
    ("PNDMScheduler", dict(skip_prk_steps=True), 4, "PNDMScheduler"),
    ("DEISMultistepScheduler", dict(), 4, "DEISMultistepScheduler"),
    ("KDPM2DiscreteScheduler", dict(), 4, "KDPM2DiscreteScheduler"),
    ("KDPM2AncestralDiscreteScheduler", dict(), 4, "KDPM2AncestralDiscreteScheduler"),
    ("DPMSolverSinglestepScheduler", dict(), 4, "DPMSolverSinglestepScheduler"),
    ("DPMSolverSDEScheduler", dict(), 4, "DPMSolverSDEScheduler"),
    ("EDMEulerScheduler", dict(), 4, "EDMEulerScheduler"),
]
STOCHASTIC = {"DDPMScheduler", "EulerAncestralDiscreteScheduler"}


def _id(case):
    cls, config, steps, expected = case
    opts = ",".join(f"{k}={v}" for k, v in config.items() if k != "clip_sample" or v)
    return f"{cls.replace('Scheduler', '')}[{opts}]-{steps}-{'refused' if expected else 'equal'}"


@pytest.fixture(scope="module")
def base(tiny):
    return tiny.sd("ddim")


def _pipe_with(base, cls, config):
    # Assigned after construction, as users swap schedulers (the constructor would rewrite clip_sample and
    # steps_offset of a scheduler config it deems outdated); from_config ignores what a class does not take.
    pipe = diffusers.StableDiffusionPipeline(**base.components)
    pipe.scheduler = getattr(diffusers, cls).from_config({**SD, **config})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _gens(seed=11):
    return [torch.Generator().manual_seed(seed + i) for i in range(len(PROMPTS))]


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _both(pipe, p, steps, stochastic, **kw):
    """(ours, diffusers') final latents from the same latents (and the same per-image generators)."""
    latents = torch.randn((len(PROMPTS), *p.latent_shape()), generator=torch.Generator().manual_seed(5))
    common = dict(num_inference_steps=steps, guidance_scale=SCALE, output_type="latent", **kw)
    with torch.no_grad():
        ref = pipe(PROMPTS, latents=latents.clone(), generator=_gens() if stochastic else None, **common).images
        ours = p(PROMPTS, latents=latents, generator=_gens() if stochastic else None, **common).images
    return ours, ref


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_method_none_equals_diffusers_or_refuses(base, case):
    cls, config, steps, expected = case
    if not hasattr(diffusers, cls):
        pytest.skip(f"diffusers has no {cls}")
    pipe = _pipe_with(base, cls, config)
    if expected is not None:
        with pytest.raises(ValueError, match=expected):  # when wrapped (EDM: no VP table) or called
            sd.pipelines.from_diffusers(pipe)(PROMPTS, num_inference_steps=steps, guidance_scale=SCALE,
                                              output_type="latent")
        return
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, steps, cls in STOCHASTIC or "sde" in config.get("algorithm_type", ""))
    if not bool(torch.isfinite(ref).all()):
        # UniPC bh1: diffusers' last step to sigma = 0 computes B(h) * 0 with h = inf (NaN, see
        # tests/models/test_diffusers_schedulers.py); ours is that step's limit, x = D. The states entering that
        # step (callback_on_step_end after step steps - 2, in the scheduler's units) are equal.
        assert config.get("solver_type") == "bh1" and bool(torch.isfinite(ours).all())
        states = {}

        def keep(name):
            def fn(_pipe, i, _t, kwargs):
                states[name, i] = kwargs["latents"].clone()
                return kwargs
            return fn

        latents = torch.randn((len(PROMPTS), *p.latent_shape()), generator=torch.Generator().manual_seed(5))
        kw = dict(num_inference_steps=steps, guidance_scale=SCALE, output_type="latent")
        with torch.no_grad():
            pipe(PROMPTS, latents=latents.clone(), callback_on_step_end=keep("theirs"), **kw)
            p(PROMPTS, latents=latents, callback_on_step_end=keep("ours"), **kw)
        assert _rel(states["ours", steps - 2], states["theirs", steps - 2]) < 1e-4
        return
    assert _rel(ours, ref) < 1e-4, _rel(ours, ref)


def test_the_comparison_discriminates(base):
    # The same pipeline with another sampler (or other noise) is far from diffusers: the 1e-4 criterion can fail.
    pipe = _pipe_with(base, "DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++"))
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, 4, True, method="dpmpp_2m")
    assert _rel(ours, ref) > 1e-2
    pipe = _pipe_with(base, "EulerAncestralDiscreteScheduler", {})
    p = sd.pipelines.from_diffusers(pipe)
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = pipe(PROMPTS, latents=latents.clone(), generator=_gens(), num_inference_steps=4, guidance_scale=SCALE,
                   output_type="latent").images
        ours = p(PROMPTS, latents=latents, generator=_gens(seed=50), num_inference_steps=4, guidance_scale=SCALE,
                 output_type="latent").images
    assert _rel(ours, ref) > 1e-2


def test_flow_match_euler_options(tiny):
    # SD3's FlowMatchEuler: equal at shift 3; the grid options it does not convert are refused by name.
    pipe = tiny.sd3(shift=3.0)
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, 4, False)
    assert _rel(ours, ref) < 1e-4
    for option in ("stochastic_sampling", "invert_sigmas", "use_karras_sigmas"):
        pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, **{option: True})
        with pytest.raises(ValueError, match=option):
            sd.pipelines.from_diffusers(pipe)(PROMPTS, num_inference_steps=4, output_type="latent")


# --- the five deviations of issue 36, each against diffusers itself (each failed before the fix) -------------------


def test_deviation_1_scheduler_options_select_the_sampler(base):
    # sde-dpmsolver++ was run as dpmpp_2m (relative error 0.36); now dpmpp_2m_sde with diffusers' noise.
    pipe = _pipe_with(base, "DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++"))
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, 4, True)
    assert _rel(ours, ref) < 1e-4
    assert p.scheduler_method(4) == "dpmpp_2m_sde" and p.scheduler_options(4)["eta"] == 1.0
    # UniPC's solver_order / solver_type become the sampler's order / variant.
    pipe = _pipe_with(base, "UniPCMultistepScheduler", dict(solver_order=3, solver_type="bh2"))
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, 5, False)
    assert _rel(ours, ref) < 1e-4
    assert p.scheduler_options(5) == {"variant": "bh2", "order": 3}


@pytest.mark.parametrize("cls", ["EulerAncestralDiscreteScheduler", "LMSDiscreteScheduler"])
def test_deviation_2_starting_noise_is_init_noise_sigma(base, cls):
    # Trailing spacing (integral timesteps): only the start differs. diffusers starts at latents * sigma_max
    # (init_noise_sigma for linspace / trailing spacing), not latents * sqrt(1 + sigma_max^2).
    pipe = _pipe_with(base, cls, dict(timestep_spacing="trailing"))
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, 4, cls in STOCHASTIC, method=_METHOD[cls])
    assert _rel(ours, ref) < 1e-4


_METHOD = {"EulerAncestralDiscreteScheduler": "euler_ancestral", "LMSDiscreteScheduler": "lms",
           "HeunDiscreteScheduler": "heun"}


@pytest.mark.parametrize("cls", list(_METHOD))
def test_deviation_3_fractional_timesteps_are_kept(base, cls):
    # Linspace spacing: timesteps such as 832.5; the network is called at diffusers' timesteps, not truncated ones.
    pipe = _pipe_with(base, cls, dict(timestep_spacing="linspace"))
    p = sd.pipelines.from_diffusers(pipe)
    seen = {"ours": [], "theirs": []}
    key = ["theirs"]
    handle = pipe.unet.register_forward_pre_hook(
        lambda m, args: seen[key[0]].append(float(torch.as_tensor(args[1]).reshape(-1)[0])))
    try:
        latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(5))
        kw = dict(num_inference_steps=3, guidance_scale=SCALE, output_type="latent")
        with torch.no_grad():
            pipe(PROMPTS, latents=latents.clone(), generator=_gens(), **kw)
            key[0] = "ours"
            p(PROMPTS, latents=latents, generator=_gens(), method=_METHOD[cls], **kw)
    finally:
        handle.remove()
    assert any(t != int(t) for t in seen["theirs"])  # the case has fractional timesteps
    torch.testing.assert_close(torch.tensor(seen["ours"]), torch.tensor(seen["theirs"]), rtol=0, atol=2e-3)


def test_deviation_4_ddim_last_step_takes_eta(base):
    # set_alpha_to_one=False (SD's config): diffusers' last step lands at alphas_cumprod[0] and adds noise of std
    # eta * sigma_t there too.
    pipe = _pipe_with(base, "DDIMScheduler", dict(NOCLIP, set_alpha_to_one=False, steps_offset=1))
    p = sd.pipelines.from_diffusers(pipe)
    ours, ref = _both(pipe, p, 4, True, eta=0.7)
    assert _rel(ours, ref) < 1e-4
    # the generators end where diffusers leaves them (its last draw included)
    a, b = _gens(), _gens()
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        pipe(PROMPTS, latents=latents.clone(), generator=a, num_inference_steps=4, eta=0.7, output_type="latent")
        p(PROMPTS, latents=latents, generator=b, num_inference_steps=4, eta=0.7, output_type="latent")
    assert all(torch.equal(x.get_state(), y.get_state()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("family", ["sd", "sdxl", "sd3", "flux"])
def test_deviation_5_call_defaults_are_the_pipelines(tiny, family):
    pipe = getattr(tiny, family)()
    p = sd.pipelines.from_diffusers(pipe)
    params = inspect.signature(type(pipe).__call__).parameters
    kw = {"height": 16, "width": 16, "max_sequence_length": 6} if family == "flux" else {}
    latents = torch.randn((2, *p.latent_shape(kw.get("height"), kw.get("width"))),
                          generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = pipe(PROMPTS, latents=latents.clone(), output_type="latent", **kw).images
        ours = p(PROMPTS, latents=latents, output_type="latent", progress=False, **kw)
    assert _rel(ours.images, ref) < 1e-4
    steps = params["num_inference_steps"].default
    assert ours.nfe == (steps if family == "flux" else 2 * steps)
    assert p._family.default_steps == steps  # the family holds diffusers' numbers
    assert p._family.default_guidance_scale == params["guidance_scale"].default


def test_eta_is_refused_where_the_scheduler_takes_none(base):
    # diffusers passes eta only to a scheduler whose step takes it (DDIM) and ignores it elsewhere.
    pipe = _pipe_with(base, "EulerAncestralDiscreteScheduler", {})
    p = sd.pipelines.from_diffusers(pipe)
    with pytest.raises(ValueError, match="eta= with method=None.*EulerAncestralDiscreteScheduler"):
        p(PROMPTS, num_inference_steps=2, eta=0.5, output_type="latent")
    p(PROMPTS, num_inference_steps=2, eta=0.5, method="euler_ancestral", output_type="latent", progress=False)


def test_explicit_sigmas_are_the_callers_grid(base):
    # With sigmas= the scheduler's step count does not apply: DDIM's linspace timestep jump is not refused.
    pipe = _pipe_with(base, "DDIMScheduler", dict(NOCLIP, timestep_spacing="linspace"))
    p = sd.pipelines.from_diffusers(pipe)
    with pytest.raises(ValueError, match="timestep_spacing"):
        p(PROMPTS, num_inference_steps=4, output_type="latent", progress=False)
    out = p(PROMPTS, sigmas=sd.sigmas.karras(4, 0.1, 10.0), output_type="latent", progress=False)
    assert out.nfe == 8 and bool(torch.isfinite(out.images).all())
