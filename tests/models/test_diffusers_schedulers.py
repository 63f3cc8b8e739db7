"""``dpmpp_2m`` and ``unipc`` through the diffusers adapter against diffusers' own multistep schedulers.

A tiny ``UNet2DModel`` (random weights from a config, as in test_diffusers_adapter.py) is sampled by diffusers'
``DPMSolverMultistepScheduler`` (``algorithm_type="dpmsolver++"``, ``solver_order=2``) and
``UniPCMultistepScheduler`` loops, and by ``sd.sample`` on the same timesteps: our sigmas are the training table's
``sqrt((1 - abar) / abar)`` at ``scheduler.timesteps``, then 0 (diffusers' ``final_sigmas_type="zero"``). Units as in
test_diffusers_adapter.py: diffusers starts from ``x_vp = z``, we from ``noise * sigmas[0]`` with
``noise = z sqrt(1 + s0^2) / s0``; both end at sigma = 0, where the units agree. Images agree to 1e-4 of their scale.
Step counts below and above 15 cover diffusers' ``lower_order_final`` rule (it applies below 15 steps, and always on
the final step to sigma = 0).
"""

from __future__ import annotations

import math

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

import steerdiff as sd  # noqa: E402
from steerdiff.core.sigmas import sigmas_from_alphas_cumprod  # noqa: E402
from steerdiff.models.diffusers_adapter import from_diffusers  # noqa: E402


@pytest.fixture(scope="module")
def unet():
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
        norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
    ).eval()


def _our_sigmas(scheduler) -> torch.Tensor:
    table = sigmas_from_alphas_cumprod(scheduler.alphas_cumprod)  # float64
    return torch.cat([table[scheduler.timesteps.long()], table.new_zeros(1)])


def _compare(unet, scheduler, method, steps, **opts) -> tuple[float, float]:
    """(error of the final images, largest error of the states entering each step), both scaled."""
    scheduler.set_timesteps(steps)
    sigmas = _our_sigmas(scheduler)
    torch.testing.assert_close(sigmas.float(), scheduler.sigmas.float(), rtol=1e-5, atol=0)  # the same levels
    z = torch.randn((2, 3, 8, 8), generator=torch.Generator().manual_seed(0))
    theirs_states, our_states = [], []
    with torch.no_grad():
        x = z.clone()
        for t in scheduler.timesteps:
            theirs_states.append(x)
            x = scheduler.step(unet(x, t).sample, t, x).prev_sample
        s0 = float(sigmas[0])
        ours = sd.sample(from_diffusers(unet, scheduler), z * math.sqrt(1 + s0**2) / s0, sigmas, method=method,
                         callback=lambda d: our_states.append(d["x"] / math.sqrt(1 + d["sigma"] ** 2)), **opts)
    states = max(_scaled(a, b) for a, b in zip(our_states, theirs_states, strict=True))
    return _scaled(ours, x), states


def _scaled(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1))


@pytest.mark.parametrize("steps", [8, 20])
@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_dpmpp_2m_matches_diffusers_dpm_solver_multistep(unet, prediction_type, steps):
    scheduler = diffusers.DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2,
                                                      prediction_type=prediction_type)
    final, states = _compare(unet, scheduler, "dpmpp_2m", steps)
    assert final < 1e-4 and states < 1e-4, (final, states)


@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("variant", ["bh1", "bh2"])
@pytest.mark.parametrize("steps", [6, 20])
def test_unipc_matches_diffusers_unipc_multistep(unet, variant, order, steps):
    scheduler = diffusers.UniPCMultistepScheduler(solver_order=order, solver_type=variant, predict_x0=True,
                                                  lower_order_final=True)
    final, states = _compare(unet, scheduler, "unipc", steps, variant=variant, order=order)
    assert states < 1e-4, states
    if variant == "bh1" and math.isnan(final):
        # diffusers' last step to sigma = 0 has h = inf and computes B(h) * 0 = -inf * 0 (its predictor term with
        # no history): NaN. Its output there is D at the state entering the step (compared above through that
        # state); ours is that limit, x = D.
        return
    assert final < 1e-4, final


def test_the_comparison_can_fail(unet):
    # Another solver on the same timesteps is far from diffusers' UniPC loop: the 1e-4 criterion discriminates.
    scheduler = diffusers.UniPCMultistepScheduler(solver_order=2)
    assert min(_compare(unet, scheduler, "dpmpp_2m", 6)) > 1e-3
