"""The pipeline loop's per-step work (issue 36: no more than diffusers' loop): per step, no more Python calls and no
more ATen ops outside the network than the diffusers pipeline's own loop makes; the network's device and dtype are
found once per call, not at every step, and a call still follows a network moved between calls; the flattened
per-step path still names the step of a non-finite output.

Independent truths: diffusers' own call on the same pipeline and latents, counted the same way at test time (no
number is written here); the number of walks over the network's parameters does not grow with the number of steps;
a call after ``pipe.to(float64)`` runs the network in float64 (its own dtype, read again) and matches a float64
pipeline built from scratch; the step a NaN was planted at.
"""

import functools

import pytest
import torch
from script_modules import load_script

import steerdiff as sd
from steerdiff.pipelines import TextCond
from steerdiff.pipelines.families.base import _PLACED


def _counting_parameters(module):
    walks = []
    own = module.parameters

    def parameters(*a, **k):
        walks.append(1)
        return own(*a, **k)

    module.parameters = parameters
    return walks


def test_placement_is_found_once_per_call_not_per_step(tiny):
    p = sd.pipelines.from_diffusers(tiny.sd3())
    p.set_progress_bar_config(disable=True)
    walks = _counting_parameters(p.network)
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(0))
    counts = []
    for steps in (2, 6):
        walks.clear()
        out = p(["a", "b"], latents=latents.clone(), num_inference_steps=steps, guidance_scale=4.0,
                output_type="latent")
        assert out.nfe == 2 * steps
        counts.append(len(walks))
    assert counts[0] == counts[1] >= 1
    assert _PLACED.get() is None  # nothing kept after the call


@pytest.mark.filterwarnings("ignore:the schedule starts at sigma")  # 3 DDIM steps start low; both runs alike
def test_a_network_moved_between_calls_is_followed(tiny):
    raw = tiny.sd()
    p = sd.pipelines.from_diffusers(raw)
    p.set_progress_bar_config(disable=True)
    latents = torch.randn((1, *p.latent_shape()), generator=torch.Generator().manual_seed(1))
    p("a", latents=latents.clone(), num_inference_steps=3, output_type="latent")
    raw.to(torch.float64)
    seen = []

    def record(module, args, kwargs):
        seen.append(kwargs["encoder_hidden_states"].dtype)

    hook = p.network.register_forward_pre_hook(record, with_kwargs=True)
    out = p("a", latents=latents.clone(), num_inference_steps=3, output_type="latent").latents
    hook.remove()
    assert seen and all(d == torch.float64 for d in seen)
    fresh = sd.pipelines.from_diffusers(tiny.sd().to(torch.float64))
    fresh.set_progress_bar_config(disable=True)
    ref = fresh("a", latents=latents.clone(), num_inference_steps=3, output_type="latent").latents
    assert torch.equal(out, ref)


def test_textcond_membership():
    c = TextCond({"prompt_embeds": torch.zeros(2, 3)})
    assert "prompt_embeds" in c and "inpaint_channels" not in c and 3 not in c


@functools.cache
def _step_ops():
    """benchmarks/pipeline_step_ops.py, whose ``count`` this test uses: the same counting as the benchmark's table."""
    return load_script("benchmarks/pipeline_step_ops.py")


def _outside_network(network, call) -> tuple[int, int, int]:
    """``(network calls, Python calls, ATen ops)`` of ``call()`` made after the first network call and outside the
    network (``pipeline_step_ops.count``: ``sys.setprofile`` and a dispatch mode, in two passes)."""
    c = _step_ops().count(network, call)
    return c["calls"], c["py"], sum(c["ops"].values())


@pytest.mark.parametrize("family", ["sd3", "sd"])
@pytest.mark.filterwarnings("ignore:the schedule starts at sigma")
def test_per_step_work_is_no_more_than_diffusers(tiny, family):
    """The loop's own work per step (benchmarks/pipeline_step_ops.py, load-independent counts): a 2n-step call minus
    an n-step call, per step, for steerdiff's call and the diffusers pipeline's own on the same pipeline (CFG, one
    doubled network call per step on both sides; the CPU's default finite check included on steerdiff's)."""
    raw = tiny.sd3() if family == "sd3" else tiny.sd("ddim")
    ours = sd.pipelines.from_diffusers(raw)
    ours.set_progress_bar_config(disable=True)
    latents = torch.randn((2, *ours.latent_shape()), generator=torch.Generator().manual_seed(0))
    per_step = {}
    for who, pipe in (("steerdiff", ours), ("diffusers", raw)):
        counts = []
        for steps in (8, 4):
            def call(pipe=pipe, steps=steps):
                return pipe(["a", "b"], latents=latents.clone(), num_inference_steps=steps, guidance_scale=5.0,
                            output_type="latent")

            call()  # warm-up: first-call checks and caches on both sides
            counts.append(_outside_network(ours.network, call))
        (n8, py8, ops8), (n4, py4, ops4) = counts
        assert n8 - n4 == 4  # one doubled network call per step
        per_step[who] = ((py8 - py4) / 4, (ops8 - ops4) / 4)
    (py_ours, ops_ours), (py_theirs, ops_theirs) = per_step["steerdiff"], per_step["diffusers"]
    assert py_ours <= py_theirs, f"Python calls per step: steerdiff {py_ours} > diffusers {py_theirs}"
    assert ops_ours <= ops_theirs, f"ATen ops per step: steerdiff {ops_ours} > diffusers {ops_theirs}"


@pytest.mark.parametrize("mode", ["step", "end"])
def test_flattened_step_names_the_step_of_a_non_finite_output(tiny, mode):
    """The per-step path (sd.core.sampling.SampleModel.denoise) checks every guided output as the layered call did:
    a NaN from the network at one step raises a FloatingPointError naming that step, in either finite-check mode."""
    p = sd.pipelines.from_diffusers(tiny.sd3())
    p.set_progress_bar_config(disable=True)
    calls = []

    def poison(module, args, kwargs, out):
        calls.append(1)
        if len(calls) == 3:  # the third doubled call: sampler step 2 (taken on the flattened path)
            return (out[0] * float("nan"),) + tuple(out[1:])
        return out

    hook = p.network.register_forward_hook(poison, with_kwargs=True)
    latents = torch.randn((2, *p.latent_shape()), generator=torch.Generator().manual_seed(0))
    try:
        with sd.core.finite_check(mode), pytest.raises(FloatingPointError, match="at step 2 "):
            p(["a", "b"], latents=latents, num_inference_steps=5, guidance_scale=4.0, output_type="latent")
    finally:
        hook.remove()
    assert len(calls) == (3 if mode == "step" else 5)  # "step" stops there; "end" runs on and names it after
