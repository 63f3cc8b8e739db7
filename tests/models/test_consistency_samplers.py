"""``lcm`` and ``tcd`` against diffusers' ``LCMScheduler`` / ``TCDScheduler`` loops on a tiny UNet with the same
noise (diffusers' ``randn_tensor`` in the scheduler module is replaced by our per-sample draws, in order).

Units as in test_diffusers_schedulers.py: diffusers' state is ``x_vp = x / sqrt(1 + sigma^2)``. LCM's boundary
condition (``c_skip``, ``c_out`` at the scaled timestep ``10 t``, ``sigma_data = 0.5``) is part of an LCM model, so
the steerdiff denoiser here wraps the UNet's ``D`` with it, as ComfyUI's "lcm" model sampling does."""

from __future__ import annotations

import math

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

import steerdiff as sd  # noqa: E402
from steerdiff.core import SampleNoise, make_generators  # noqa: E402
from steerdiff.core.sigmas import sigmas_from_alphas_cumprod  # noqa: E402
from steerdiff.models.diffusers_adapter import from_diffusers  # noqa: E402


@pytest.fixture(scope="module")
def unet():
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
        norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
    ).eval()


def _scaled(ours, theirs) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1))


def _run(unet, scheduler, method, steps, monkeypatch, module, step_kw=None, wrap=None, **opts):
    scheduler.set_timesteps(steps)
    table = sigmas_from_alphas_cumprod(scheduler.alphas_cumprod)
    sigmas = torch.cat([table[scheduler.timesteps.long()], table.new_zeros(1)])
    z = torch.randn((2, 3, 8, 8), generator=torch.Generator().manual_seed(0))
    same = SampleNoise(make_generators(7, 2))
    monkeypatch.setattr(module, "randn_tensor", lambda shape, **kw: same.randn(shape, torch.float32))
    with torch.no_grad():
        x = z.clone()
        for t in scheduler.timesteps:
            x = scheduler.step(unet(x, t).sample, t, x, **(step_kw or {})).prev_sample
        den = from_diffusers(unet, scheduler)
        s0 = float(sigmas[0])
        ours = sd.sample(wrap(den) if wrap else den, z * math.sqrt(1 + s0**2) / s0, sigmas, method=method,
                         generator=7, **opts)
        other = sd.sample(wrap(den) if wrap else den, z * math.sqrt(1 + s0**2) / s0, sigmas, method=method,
                          generator=8, **opts)
    if opts.get("tcd_final") == "table":  # ours ends at the table's first level, in sigma units: to diffusers' units
        ours, other = ours / math.sqrt(1 + float(table[0]) ** 2), other / math.sqrt(1 + float(table[0]) ** 2)
    return _scaled(ours, x), _scaled(other, x)


class _LCMBoundary:
    """An LCM model's consistency function: ``c_skip(t) x_vp + c_out(t) D`` in diffusers' units, i.e.
    ``c_skip x / sqrt(1 + sigma^2) + c_out D`` here (Luo et al. 2023, eq. 4; diffusers' ``timestep_scaling = 10``)."""

    def __init__(self, den):
        self.den = den

    def __getattr__(self, name):
        return getattr(self.den, name)

    def __call__(self, x, sigma, cond=None):
        t = self.den.sigma_to_t(sigma).round().to(x.dtype) * 10.0
        c_skip, c_out = 0.25 / (t**2 + 0.25), t / (t**2 + 0.25).sqrt()
        shape = (-1,) + (1,) * (x.ndim - 1)
        vp = x / (1 + sigma.to(x.dtype) ** 2).sqrt().view(shape)
        return c_skip.view(shape) * vp + c_out.view(shape) * self.den(x, sigma, cond)


@pytest.mark.parametrize("steps", [1, 4, 6])
def test_lcm_matches_diffusers_lcm_scheduler(unet, steps, monkeypatch):
    from diffusers.schedulers import scheduling_lcm

    final, other = _run(unet, diffusers.LCMScheduler(), "lcm", steps, monkeypatch, scheduling_lcm, wrap=_LCMBoundary)
    assert final < 1e-5, final
    if steps > 1:
        assert other > 1e-3  # the noise matters


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("steps", [2, 4])
def test_tcd_matches_diffusers_tcd_scheduler(unet, steps, gamma, monkeypatch):
    from diffusers.schedulers import scheduling_tcd

    final, other = _run(unet, diffusers.TCDScheduler(), "tcd", steps, monkeypatch, scheduling_tcd,
                        step_kw={"eta": gamma}, eta=gamma, tcd_final="table")
    assert final < 1e-5, final
    if gamma > 0:
        assert other > 1e-3


def test_lcm_and_tcd_on_the_mixture_from_infinity_and_limits():
    mix = sd.models.builtin_mixture("gmm2d")
    noise = sd.randn((16, 2), seeds=0, dtype=torch.float64)
    sig = sd.sigmas.karras(6, 0.002, 80.0)
    # gamma = 0 is DDIM; gamma = 1 is LCM (same draws)
    torch.testing.assert_close(sd.sample(mix, noise, sig, method="tcd", eta=0.0), sd.sample(mix, noise, sig,
                               method="ddim"), rtol=0, atol=1e-12)
    torch.testing.assert_close(sd.sample(mix, noise, sig, method="tcd", eta=1.0, generator=3),
                               sd.sample(mix, noise, sig, method="lcm", generator=3), rtol=0, atol=1e-12)
    for m in ("lcm", "tcd"):
        assert torch.isfinite(sd.sample(mix, noise, sd.sigmas.flow(4), method=m, generator=1)).all()
    with pytest.raises(ValueError, match="tcd_final"):
        sd.sample(mix, noise, sig, method="tcd", tcd_final="table")
