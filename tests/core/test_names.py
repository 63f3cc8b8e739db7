"""The name map (steerdiff.core.names): A1111 / ComfyUI names run what the k-diffusion function they name computes,
on the schedule A1111 builds (float64 exact mixture, the same noise); diffusers class names map to what
steerdiff.pipelines runs for that scheduler; unknown names are refused with close matches."""

from __future__ import annotations

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SampleNoise, make_generators, sampler_from_name
from steerdiff.core.names import COMFY_SAMPLERS, COMFY_SCHEDULES, known_names
from steerdiff.core.sigmas import SCHEDULES, sigmas_from_alphas_cumprod
from steerdiff.models import builtin_mixture
from tests.core.test_samplers_vs_kdiffusion import _err, _kd_model, _load_kdiffusion_sampling

# SD 1.x's training table (scaled-linear betas 0.00085..0.012): sigma 0.0292 .. 14.61, what A1111 samples on.
_BETAS = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
TABLE = sigmas_from_alphas_cumprod(torch.cumprod(1 - _BETAS, 0))
N, DIM, STEPS = 16, 16, 8


@pytest.fixture(scope="module")
def K():
    return _load_kdiffusion_sampling()


@pytest.fixture(scope="module")
def gmm16d():
    return builtin_mixture("gmm16d")


def _kd_sigmas(K, schedule, n):
    """A1111's ``get_sigmas``: k-diffusion's schedule functions on the model's range, or (``normal``) its
    ``DiscreteSchedule.get_sigmas``: ``linspace(t_max, 0, n)`` through the table, log-linear in between."""
    lo, hi = float(TABLE[0]), float(TABLE[-1])
    if schedule in ("karras", "exponential"):
        fn = K.get_sigmas_karras if schedule == "karras" else K.get_sigmas_exponential
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # k-diffusion builds its grids in the default dtype
        try:
            return fn(n, lo, hi, device="cpu")
        finally:
            torch.set_default_dtype(default)
    t = torch.linspace(len(TABLE) - 1, 0, n, dtype=torch.float64)
    i = t.floor().long().clamp(max=len(TABLE) - 2)
    w = t - i
    log = TABLE.log()
    return torch.cat([((1 - w) * log[i] + w * log[i + 1]).exp(), torch.zeros(1, dtype=torch.float64)])


def _a1111_sigmas(K, schedule, steps, discard):
    """A1111's ``sd_samplers_kdiffusion.get_sigmas``: ``steps + 1`` levels then drop the next-to-last if the sampler
    has ``discard_next_to_last_sigma``."""
    if not discard:
        return _kd_sigmas(K, schedule, steps)
    s = _kd_sigmas(K, schedule, steps + 1)
    return torch.cat([s[:-2], s[-1:]])


# name -> (k-diffusion function, A1111 schedule, discard_next_to_last_sigma, k-diffusion kwargs, stochastic)
A1111 = {
    "DPM++ 2M Karras": ("sample_dpmpp_2m", "karras", False, {}, False),
    "DPM++ 2M": ("sample_dpmpp_2m", "karras", False, {}, False),  # 1.9's "Automatic" for it: Karras
    "Euler": ("sample_euler", "normal", False, {}, False),
    "Euler a": ("sample_euler_ancestral", "normal", False, {}, True),
    "Heun": ("sample_heun", "normal", False, {}, False),
    "LMS": ("sample_lms", "normal", False, {}, False),
    "LMS Karras": ("sample_lms", "karras", False, {}, False),
    "DPM2": ("sample_dpm_2", "karras", True, {}, False),
    "DPM2 a": ("sample_dpm_2_ancestral", "karras", True, {}, True),
    "DPM2 a Karras": ("sample_dpm_2_ancestral", "karras", True, {}, True),
    "DPM++ 2S a Karras": ("sample_dpmpp_2s_ancestral", "karras", False, {}, True),
    "DPM++ SDE Karras": ("sample_dpmpp_sde", "karras", False, {}, True),
    "DPM++ 2M SDE": ("sample_dpmpp_2m_sde", "exponential", False, {}, True),
    "DPM++ 2M SDE Karras": ("sample_dpmpp_2m_sde", "karras", False, {}, True),
    "DPM++ 2M SDE Heun": ("sample_dpmpp_2m_sde", "exponential", False, {"solver_type": "heun"}, True),
    "DPM++ 3M SDE Exponential": ("sample_dpmpp_3m_sde", "exponential", True, {}, True),
    "DPM++ 3M SDE Karras": ("sample_dpmpp_3m_sde", "karras", True, {}, True),
}
# ComfyUI sampler + scheduler -> (k-diffusion function, schedule, discard); ComfyUI's KSampler discards the
# next-to-last level for dpm_2, dpm_2_ancestral, uni_pc (DISCARD_PENULTIMATE_SIGMA_SAMPLERS).
COMFY = {
    ("dpmpp_2m", "karras"): ("sample_dpmpp_2m", "karras", False, {}, False),
    ("euler_ancestral", "normal"): ("sample_euler_ancestral", "normal", False, {}, True),
    ("euler", "exponential"): ("sample_euler", "exponential", False, {}, False),
    ("ddim", "normal"): ("sample_euler", "normal", False, {}, False),  # ComfyUI's ddim is its Euler
    ("dpm_2", "karras"): ("sample_dpm_2", "karras", True, {}, False),
    ("dpmpp_sde_gpu", "karras"): ("sample_dpmpp_sde", "karras", False, {}, True),
    ("dpmpp_3m_sde", "exponential"): ("sample_dpmpp_3m_sde", "exponential", False, {}, True),
}


def _schedule_kwargs(schedule):
    if schedule in ("karras", "exponential"):
        return {"sigma_min": float(TABLE[0]), "sigma_max": float(TABLE[-1])}
    return {"table": TABLE}


def _compare(K, gmm16d, choice, ref):
    fn, schedule, discard, kd_opts, stochastic = ref
    ours_sigmas = choice.sigmas(STEPS, **_schedule_kwargs(choice.schedule))
    kd_sigmas = _a1111_sigmas(K, schedule, STEPS, discard)
    assert ours_sigmas.shape == kd_sigmas.shape
    sig_err = float((ours_sigmas - kd_sigmas).abs().max() / kd_sigmas.max())
    noise = sd.randn((N, DIM), seeds=0, dtype=torch.float64)
    a = sd.sample(gmm16d, noise, ours_sigmas, method=choice.method, generator=100 if stochastic else None,
                  **choice.options)
    extra = {}
    if stochastic:
        same = SampleNoise(make_generators(100, N))
        extra["noise_sampler"] = lambda s, sn: same.randn((N, DIM), torch.float64)
    b = getattr(K, fn)(_kd_model(gmm16d), noise * kd_sigmas[0], kd_sigmas, disable=True, **kd_opts, **extra)
    return sig_err, _err(a, b)


@pytest.mark.parametrize("name", sorted(A1111))
def test_a1111_names_run_the_kdiffusion_sampler_they_name(K, gmm16d, name):
    sig_err, err = _compare(K, gmm16d, sampler_from_name(name), A1111[name])
    assert sig_err < 1e-12 and err < 1e-10, (sig_err, err)


@pytest.mark.parametrize("pair", sorted(COMFY), ids=lambda p: "+".join(p))
def test_comfyui_names_run_the_kdiffusion_sampler_they_name(K, gmm16d, pair):
    sig_err, err = _compare(K, gmm16d, sampler_from_name(*pair), COMFY[pair])
    assert sig_err < 1e-12 and err < 1e-10, (sig_err, err)


def test_the_comparison_discriminates(K, gmm16d):
    """Another sampler or schedule than the one named is far from k-diffusion's: the tests above can fail."""
    wrong_schedule = _compare(K, gmm16d, sampler_from_name("DPM++ 2M Exponential"), A1111["DPM++ 2M Karras"])
    assert wrong_schedule[0] > 1e-3
    wrong_discard = sampler_from_name("DPM2 Karras")
    wrong_discard = type(wrong_discard)(wrong_discard.method, {}, "karras")
    assert _compare(K, gmm16d, wrong_discard, A1111["DPM2"])[0] > 1e-3
    lms = sampler_from_name("LMS")
    euler = type(lms)("euler", {}, lms.schedule)
    assert _compare(K, gmm16d, euler, A1111["LMS"])[1] > 1e-3


def test_normal_schedule_is_kdiffusions_discrete_grid(K):
    for n in (1, 2, 7, 30, 1000):
        want = _kd_sigmas(K, "normal", n)
        assert float((SCHEDULES.get("normal")(n, TABLE) - want).abs().max() / want.max()) < 1e-13


# ------------------------------------------------------------------------------------------------------- diffusers
diffusers_cases = [
    ("DDIMScheduler", {}), ("DDPMScheduler", {}), ("EulerDiscreteScheduler", {}),
    ("EulerAncestralDiscreteScheduler", {}), ("LMSDiscreteScheduler", {}), ("HeunDiscreteScheduler", {}),
    ("FlowMatchEulerDiscreteScheduler", {}),
    *[("DPMSolverMultistepScheduler", dict(algorithm_type=a, solver_order=o, solver_type=t))
      for a in ("dpmsolver++", "sde-dpmsolver++") for o in (1, 2) for t in ("midpoint", "heun")],
    *[("DPMSolverMultistepScheduler", dict(solver_order=3, solver_type=t)) for t in ("midpoint", "heun")],
    *[("UniPCMultistepScheduler", dict(solver_order=o, solver_type=t)) for o in (1, 2, 3) for t in ("bh1", "bh2")],
]


@pytest.mark.parametrize("cls,config", diffusers_cases, ids=lambda v: str(v))
def test_diffusers_names_map_to_what_the_pipelines_run(cls, config):
    diffusers = pytest.importorskip("diffusers")
    from steerdiff.pipelines.families.base import SCHEDULER_METHODS, scheduler_plan

    noclip = {"clip_sample": False} if cls in ("DDIMScheduler", "DDPMScheduler") else {}  # their default clips x0
    scheduler = getattr(diffusers, cls).from_config({**config, **noclip})
    method, options = scheduler_plan(scheduler, SCHEDULER_METHODS[cls], None)
    choice = sampler_from_name(cls, **config)
    assert (choice.method, dict(choice.options)) == (method, options)
    # the sigma-grid flags become the schedule; the algorithm stays
    flagged = sampler_from_name(cls, use_karras_sigmas=True, **config)
    assert (flagged.method, dict(flagged.options), flagged.schedule) == (method, options, "karras")


def test_diffusers_flags_and_consistency_schedulers():
    c = sampler_from_name("DPMSolverMultistepScheduler", use_karras_sigmas=True, algorithm_type="sde-dpmsolver++")
    assert (c.method, dict(c.options), c.schedule) == ("dpmpp_2m_sde", {"eta": 1.0, "solver_type": "midpoint"},
                                                       "karras")
    assert sampler_from_name("LCMScheduler").method == "lcm"
    assert dict(sampler_from_name("TCDScheduler", eta=0.5).options) == {"eta": 0.5}
    assert sampler_from_name("EulerDiscreteScheduler", use_exponential_sigmas=True).schedule == "exponential"
    with pytest.raises(ValueError, match="does not translate"):
        sampler_from_name("EulerDiscreteScheduler", timestep_spacing="trailing")
    with pytest.raises(ValueError, match="at most one"):
        sampler_from_name("EulerDiscreteScheduler", use_karras_sigmas=True, use_beta_sigmas=True)
    with pytest.raises(ValueError, match="solver_order"):
        sampler_from_name("DPMSolverMultistepScheduler", algorithm_type="sde-dpmsolver++", solver_order=3)


# ---------------------------------------------------------------------------------------------- the table's shape
def test_every_name_maps_to_a_registered_sampler_and_schedule():
    for name in known_names():
        choice = sampler_from_name(name) if name[0].islower() or " " in name else sampler_from_name(name)
        assert choice.method in sd.core.SAMPLERS.names(), name
        assert choice.schedule in (None, "flow", *SCHEDULES.names()), name
        spec = sd.core.SAMPLERS.get(choice.method)
        assert set(choice.options) <= {*spec.options, *(("eta",) if spec.eta else ())}, name
    for sampler in COMFY_SAMPLERS:
        for scheduler in COMFY_SCHEDULES:
            assert sampler_from_name(sampler, scheduler).schedule == COMFY_SCHEDULES[scheduler]


def test_names_are_case_and_space_insensitive_for_a1111():
    assert sampler_from_name("  dpm++   2m KARRAS ") == sampler_from_name("DPM++ 2M Karras")
    assert sampler_from_name("DPM++ 2M", scheduler="Exponential").schedule == "exponential"


@pytest.mark.parametrize("name,match", [
    ("DPM++ 2M Karas", "DPM\\+\\+ 2M Karras|dpm\\+\\+ 2m karras"),
    ("eulr_ancestral", "euler_ancestral"),
    ("DPMSolverMultistepSchedular", "DPMSolverMultistepScheduler"),
])
def test_unknown_names_are_refused_with_close_matches(name, match):
    with pytest.raises(ValueError, match=f"unknown sampler name.*({match})"):
        sampler_from_name(name)


def test_known_names_without_an_equivalent_say_so():
    for name in ("DPM fast", "dpm_adaptive", "euler_cfg_pp", "PNDMScheduler", "seeds_2", "SASolverScheduler"):
        with pytest.raises(ValueError, match="no steerdiff equivalent"):
            sampler_from_name(name)
    with pytest.raises(ValueError, match="not a ComfyUI scheduler"):
        sampler_from_name("dpmpp_2m", "karras_typo")
    with pytest.raises(ValueError, match="already names its schedule"):
        sampler_from_name("DPM++ 2M Karras", scheduler="Exponential")
    with pytest.raises(ValueError, match="config flags"):
        sampler_from_name("Euler a", use_karras_sigmas=True)
    with pytest.raises(ValueError, match="caller's grid"):
        sampler_from_name("DDIMScheduler").sigmas(10)
    assert math.isinf(float(sampler_from_name("FlowMatchEulerDiscreteScheduler").sigmas(4)[0]))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # diffusers' numpy-2 copy= warning, once per step
@pytest.mark.parametrize("cls", ["KDPM2DiscreteScheduler", "EulerDiscreteScheduler", "HeunDiscreteScheduler"])
def test_diffusers_scheduler_loop_equals_the_mapped_sampler(gmm16d, cls):
    """diffusers' own loop (scale_model_input, step) on the exact mixture as an eps-model of its timestep (sigma
    read log-linearly from SD's table, as the scheduler's ``_sigma_to_t`` inverts), against ``sd.sample`` with the
    mapped sampler on the scheduler's (float32) levels: equal to float32 rounding. KDPM2 is the class the pipelines
    do not convert; Euler and Heun are the controls."""
    diffusers = pytest.importorskip("diffusers")
    sch = getattr(diffusers, cls).from_config(dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear"))
    sch.set_timesteps(6)
    log_table = TABLE.log()

    def sigma_of(t):
        lo = int(math.floor(float(t)))
        w = float(t) - lo
        return math.exp((1 - w) * float(log_table[lo]) + w * float(log_table[min(lo + 1, 999)]))

    noise = sd.randn((N, DIM), seeds=0, dtype=torch.float64)
    x = noise * float(sch.init_noise_sigma)
    for t in sch.timesteps:
        s = sigma_of(t)
        xs = sch.scale_model_input(x, t) * math.sqrt(1 + s * s)
        eps = (xs - gmm16d(xs, torch.full((N,), s, dtype=torch.float64), None)) / s
        x = sch.step(eps, t, x).prev_sample
    levels = torch.unique_consecutive(sch.sigmas.double())  # KDPM2 and Heun repeat each level for their 2nd stage
    choice = sampler_from_name(cls)
    ours = sd.sample(gmm16d, noise * float(sch.init_noise_sigma) / levels[0], levels, method=choice.method,
                     **choice.options)
    assert float((ours - x).abs().max() / x.abs().max()) < 1e-5
