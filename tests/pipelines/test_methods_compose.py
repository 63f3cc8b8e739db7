"""Compose over prompts on tiny pipelines (``Compose.from_prompts``): ``"a red disk" & !"a square"``.

Independent truths: the composed denoiser equals ``u + scale sum_k w_k (c_k - u)`` computed from separate
denoiser calls on each prompt's condition and on the null; with weights (1, 0) a whole sampling run equals CFG on
the first prompt (steerdiff's CFG guider on ``Pipeline.encode``); the NFE is the composition's rows per step.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance.compose import Compose

STEPS = 4


@pytest.fixture(scope="module", params=["sd", "sd3"])
def pipe(request, tiny):
    return sd.pipelines.from_diffusers(tiny.sd("ddim") if request.param == "sd" else tiny.sd3())


def test_composed_denoiser_is_the_sum_of_separate_prompt_terms(pipe):
    terms = {"a red disk": 1.0, "a square": -0.5, "grey": 0.25}
    scale = 3.0
    comp = Compose.from_prompts(pipe, terms, scale)
    assert comp.expr == '"a red disk" & !0.5*"a square" & 0.25*"grey"'
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *pipe.latent_shape(), generator=g) * 2
    sigma = torch.full((2,), 2.0)
    guided = sd.core.guided.GuidedDenoiser(pipe.denoiser, comp, comp.cond(2))
    with torch.no_grad():
        got = guided(x, sigma)
        u = pipe.denoiser(x, sigma, pipe.encode(["a red disk"] * 2).null)
        want = u.clone()
        for text, w in terms.items():
            want += scale * w * (pipe.denoiser(x, sigma, pipe.encode([text] * 2)) - u)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert comp.rows_per_eval == 4


def test_weights_one_and_zero_are_cfg_on_that_prompt(pipe):
    noise = sd.randn((2, *pipe.latent_shape()), seeds=3)
    sig = pipe.default_sigmas(STEPS)
    comp = Compose.from_prompts(pipe, {"a red disk": 1.0, "a square": 0.0}, 4.0)
    with torch.no_grad():
        got, stats = sd.sample(pipe.denoiser, noise, sig, method="euler", guidance=comp, cond=comp.cond(2),
                               return_stats=True)
        want = sd.sample(pipe.denoiser, noise, sig, method="euler", cond=pipe.encode(["a red disk"] * 2),
                         guidance=sd.guidance.CFG(4.0))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert stats.nfe == 2 * STEPS  # one prompt term and the null per step


def test_bad_prompt_compositions(pipe):
    with pytest.raises(ValueError, match="non-zero"):
        Compose.from_prompts(pipe, {"a red disk": 0.0})
    with pytest.raises(ValueError, match="finite number"):
        Compose.from_prompts(pipe, {"a red disk": float("nan")})
    with pytest.raises(ValueError, match="mapping"):
        Compose.from_prompts(pipe, ["a red disk"])
    comp = Compose.from_prompts(pipe, {"a red disk": 1.0})
    noise = sd.randn((2, *pipe.latent_shape()), seeds=3)
    with pytest.raises(ValueError, match="compose.cond"):
        sd.sample(pipe.denoiser, noise, pipe.default_sigmas(2), guidance=comp, cond=pipe.encode(["x"] * 2))
