"""Every registered sampler on a tiny SD (VP, eps) and SD3 (flow, from sigma = inf) pipeline.

Truths checked: the samples are finite and the pipeline's NFE equals the sampler registry's count for the schedule
(``SamplerSpec.nfe``), the conditional model alone (``guidance_scale=1``) and doubled under CFG.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SAMPLERS

STEPS = 3
# Samplers that need an option a pipeline cannot supply (a covariance model trained for this denoiser).
RUNNABLE = [n for n in SAMPLERS.names() if not SAMPLERS.get(n).required]


@pytest.fixture(scope="module", params=["sd", "sd3"])
def pipe(request, tiny):
    return sd.pipelines.from_diffusers(tiny.sd("ddim") if request.param == "sd" else tiny.sd3())


@pytest.mark.parametrize("method", RUNNABLE)
def test_every_sampler_runs_on_the_pipeline_with_the_registry_nfe(pipe, method):
    spec = SAMPLERS.get(method)
    sig = pipe.default_sigmas(STEPS)
    if sig[0] == float("inf") and not spec.inf_start:
        sig = sig[1:]  # a sampler not written for the pure-noise level starts at the next one
    steps = len(sig) - 1
    out = pipe(["a red disk", "a square"], sigmas=sig, method=method, guidance_scale=1.0, output_type="latent",
               generator=[torch.Generator().manual_seed(s) for s in (0, 1)])
    assert torch.isfinite(out.latents).all()
    assert out.nfe == spec.nfe(steps)
    cfg = pipe(["a red disk", "a square"], sigmas=sig, method=method, guidance_scale=3.0, output_type="latent",
               generator=[torch.Generator().manual_seed(s) for s in (0, 1)])
    assert torch.isfinite(cfg.latents).all() and cfg.nfe == 2 * spec.nfe(steps)


def test_the_covariance_samplers_are_the_ones_left_out():
    # and the learned solver, which brings its own schedule (steerdiff/core/learned_solver.py)
    assert {n for n in SAMPLERS.names() if SAMPLERS.get(n).required} <= {"ocm-ddim", "ocm-ddpm", "learned"}
