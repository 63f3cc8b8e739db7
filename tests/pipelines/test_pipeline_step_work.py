"""The pipeline loop's per-step work (issue 36: no more than diffusers' loop): the network's device and dtype are
found once per call, not at every step, and a call still follows a network moved between calls.

Independent truths: the number of walks over the network's parameters does not grow with the number of steps; a
call after ``pipe.to(float64)`` runs the network in float64 (its own dtype, read again) and matches a float64
pipeline built from scratch.
"""

import pytest
import torch

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
