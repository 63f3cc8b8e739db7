"""``from_diffusers``: a diffusers UNet + VP scheduler as a denoiser, checked against diffusers' own loops.

Tiny UNets are built from configs with seeded random weights (nothing is downloaded). A random epsilon-UNet is
far from a trained one, so its trajectories reach |x| of several hundred; images are compared to 1e-4 of their
scale, ``max|ours - theirs| <= 1e-4 * max(1, max|theirs|)`` (float32 resolves about 6e-8 of the scale).

Units: diffusers integrates ``x_vp`` from ``x_T = z`` at its first timestep; ``sd.sample`` integrates
``x_sigma = x_vp * sqrt(1 + sigma^2)`` from ``noise * sigmas[0]``, so the same start is
``noise = z * sqrt(1 + s0^2) / s0``. Both end at sigma = 0, where the two units agree.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

import steerdiff as sd  # noqa: E402
from steerdiff.core.sigmas import vp_timesteps  # noqa: E402
from steerdiff.models.diffusers_adapter import from_diffusers  # noqa: E402

STEPS = 10  # divides num_train_timesteps, so diffusers' DDIM "previous timestep" is the next listed one
SPACINGS = [("leading", 1), ("trailing", 0)]
PREDICTIONS = ["epsilon", "v_prediction", "sample"]


def tiny_unet(channels: int = 3, seed: int = 0, **config) -> diffusers.UNet2DModel:
    torch.manual_seed(seed)
    kwargs = dict(
        sample_size=8,
        in_channels=channels,
        out_channels=channels,
        layers_per_block=1,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
    )
    kwargs.update(config)
    return diffusers.UNet2DModel(**kwargs).eval()


def tiny_cond_unet(seed: int = 0, cross_attention_dim: int = 12) -> diffusers.UNet2DConditionModel:
    torch.manual_seed(seed)
    return diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=4,
    ).eval()


@pytest.fixture(scope="module")
def unet():
    return tiny_unet(3)


@pytest.fixture(scope="module")
def cond_unet():
    return tiny_cond_unet()


def start_noise(shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def to_sigma_noise(z: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Standard-normal ``noise`` for ``sd.sample`` whose start ``noise * sigmas[0]`` is ``x_vp = z``."""
    s0 = float(sigmas[0])
    return z * math.sqrt(1 + s0**2) / s0


def scaled_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """``max|ours - theirs| / max(1, max|theirs|)``."""
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1))


def schedule(scheduler, spacing: str, min_alphabar: float = 0.0) -> torch.Tensor:
    offset = scheduler.config.steps_offset
    abar = scheduler.alphas_cumprod.clamp(min=min_alphabar)
    sigmas = sd.sigmas.from_alphas_cumprod(abar, STEPS, spacing=spacing, offset=offset)
    # The same timesteps as diffusers: the sigmas are the table's sigmas at exactly these steps.
    assert torch.equal(vp_timesteps(len(abar), STEPS, spacing, offset), scheduler.timesteps.cpu())
    return sigmas


def diffusers_loop(unet, scheduler, z, generators=None, **unet_kwargs) -> torch.Tensor:
    x = z.clone()
    for t in scheduler.timesteps:
        out = unet(x, t, **unet_kwargs).sample
        step_kwargs = {} if generators is None else {"generator": generators}
        x = scheduler.step(out, t, x, **step_kwargs).prev_sample
    return x


# --- parity with diffusers' schedulers --------------------------------------------------------------------------


@pytest.mark.parametrize("spacing,offset", SPACINGS)
@pytest.mark.parametrize("prediction_type", PREDICTIONS)
def test_ddim_matches_diffusers(unet, prediction_type, spacing, offset):
    scheduler = diffusers.DDIMScheduler(
        clip_sample=False,
        set_alpha_to_one=True,
        prediction_type=prediction_type,
        timestep_spacing=spacing,
        steps_offset=offset,
    )
    scheduler.set_timesteps(STEPS)
    sigmas = schedule(scheduler, spacing)
    z = start_noise((3, 3, 8, 8))
    with torch.inference_mode():
        theirs = diffusers_loop(unet, scheduler, z)
        ours = sd.sample(from_diffusers(unet, scheduler), to_sigma_noise(z, sigmas), sigmas, method="ddim")
    assert ours.dtype == theirs.dtype == torch.float32
    assert scaled_error(ours, theirs) <= 1e-4


@pytest.mark.parametrize("spacing,offset", [*SPACINGS, ("linspace", 0)])
@pytest.mark.parametrize("prediction_type", PREDICTIONS)
def test_ddpm_matches_diffusers_with_the_same_noise(unet, prediction_type, spacing, offset):
    # Our ddpm draws row i's noise from generator i ([C, H, W] per row); given a list of generators diffusers'
    # DDPMScheduler draws [1, C, H, W] per row from the same generators: identical noise at every step.
    scheduler = diffusers.DDPMScheduler(
        variance_type="fixed_small",
        clip_sample=False,
        prediction_type=prediction_type,
        timestep_spacing=spacing,
        steps_offset=offset,
    )
    scheduler.set_timesteps(STEPS)
    sigmas = schedule(scheduler, spacing)
    z = start_noise((3, 3, 8, 8))
    seeds = [100, 101, 102]
    with torch.inference_mode():
        theirs = diffusers_loop(unet, scheduler, z, [torch.Generator().manual_seed(s) for s in seeds])
        D = from_diffusers(unet, scheduler)
        ours = sd.sample(D, to_sigma_noise(z, sigmas), sigmas, method="ddpm", generator=seeds)
    assert scaled_error(ours, theirs) <= 1e-4
    # The noise matters (the check is not vacuous): other seeds give other samples.
    with torch.inference_mode():
        other = sd.sample(D, to_sigma_noise(z, sigmas), sigmas, method="ddpm", generator=7)
    assert scaled_error(other, theirs) > 1e-2


@pytest.mark.parametrize("beta_schedule,alphabar_T", [("scaled_linear", 2.0**-24), ("linear", None)])
def test_zero_terminal_snr_v_prediction_matches_diffusers(unet, beta_schedule, alphabar_T):
    # alphabar_T = 0 (sigma = inf) becomes 2^-24 (sigma = 4096, as in diffusers' EulerDiscreteScheduler) or,
    # where alphabar_{T-1} is not above that (linear betas), alphabar_{T-1} / 4.
    scheduler = diffusers.DDIMScheduler(
        beta_schedule=beta_schedule,
        clip_sample=False,
        prediction_type="v_prediction",
        rescale_betas_zero_snr=True,
        timestep_spacing="trailing",
    )
    scheduler.set_timesteps(STEPS)
    assert float(scheduler.alphas_cumprod[-1]) == 0
    D = from_diffusers(unet, scheduler)
    if alphabar_T is None:
        alphabar_T = float(scheduler.alphas_cumprod[-2]) / 4
    assert float(D.sigmas[-1]) == pytest.approx(((1 - alphabar_T) / alphabar_T) ** 0.5, rel=1e-12)
    assert torch.all(D.sigmas[1:] > D.sigmas[:-1])
    # from_alphas_cumprod rejects alphabar = 0: the schedule is read off the denoiser's own table.
    sigmas = torch.cat([D.sigmas[scheduler.timesteps], D.sigmas.new_zeros(1)])
    z = start_noise((2, 3, 8, 8))
    with torch.inference_mode():
        ours = sd.sample(D, to_sigma_noise(z, sigmas), sigmas, method="ddim")
        exact_zero = diffusers_loop(unet, scheduler, z)
        scheduler.alphas_cumprod[-1] = alphabar_T
        same_table = diffusers_loop(unet, scheduler, z)
    assert scaled_error(ours, same_table) <= 1e-4
    # Against alphabar_T = 0 itself the first x0 estimate differs by sqrt(alphabar_T) * z (<= 2.4e-4 * z).
    assert scaled_error(ours, exact_zero) <= 10 * alphabar_T**0.5


def test_text_conditioned_ddim_matches_diffusers(cond_unet):
    scheduler = diffusers.DDIMScheduler(clip_sample=False, steps_offset=1)
    scheduler.set_timesteps(STEPS)
    sigmas = schedule(scheduler, "leading")
    emb = torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(3))  # K=2 prompts + the null row
    cond = torch.tensor([1, -1, 0])
    z = start_noise((3, 4, 8, 8))
    with torch.inference_mode():
        theirs = diffusers_loop(cond_unet, scheduler, z, encoder_hidden_states=emb[[1, 2, 0]])
        D = from_diffusers(cond_unet, scheduler, condition_embeddings=emb)
        ours = sd.sample(D, to_sigma_noise(z, sigmas), sigmas, method="ddim", cond=cond)
    assert scaled_error(ours, theirs) <= 1e-4


# --- the denoiser itself ----------------------------------------------------------------------------------------


def vp_reference(unet_out, x, sigma, prediction_type):
    """D from a VP network output, written directly from diffusers' formulas in VP units."""
    abar = 1 / (1 + sigma**2)
    x_vp = x * abar.sqrt()
    if prediction_type == "epsilon":
        x0 = (x_vp - (1 - abar).sqrt() * unet_out) / abar.sqrt()
    elif prediction_type == "v_prediction":
        x0 = abar.sqrt() * x_vp - (1 - abar).sqrt() * unet_out
    else:
        x0 = unet_out
    return x0


@pytest.mark.parametrize("prediction_type", PREDICTIONS)
def test_denoiser_matches_vp_formulas_at_table_timesteps(unet, prediction_type):
    scheduler = diffusers.DDPMScheduler(prediction_type=prediction_type)
    D = from_diffusers(unet, scheduler)
    t = torch.tensor([0, 10, 500, 999])
    sigma = ((1 - scheduler.alphas_cumprod[t]) / scheduler.alphas_cumprod[t]).sqrt()
    x = start_noise((4, 3, 8, 8), 5) * (1 + sigma[:, None, None, None] ** 2).sqrt()
    with torch.inference_mode():
        s = sigma[:, None, None, None]
        out = unet(x / (1 + s**2).sqrt(), t).sample
        expected = vp_reference(out, x, s, prediction_type)
        got = D(x, sigma)
    assert scaled_error(got, expected) <= 1e-5


def test_quantize_false_agrees_at_table_sigmas(unet):
    scheduler = diffusers.DDIMScheduler(clip_sample=False)
    sigmas = sd.sigmas.from_alphas_cumprod(scheduler.alphas_cumprod, STEPS)
    z = start_noise((2, 3, 8, 8))
    with torch.inference_mode():
        a = sd.sample(from_diffusers(unet, scheduler), z, sigmas, method="ddim")
        b = sd.sample(from_diffusers(unet, scheduler, quantize=False), z, sigmas, method="ddim")
        # Between table entries the network sees a fractional timestep (and a different output).
        x = z[:1] * 3.0
        mid = from_diffusers(unet, scheduler, quantize=False)(x, torch.tensor([3.0]))
    assert scaled_error(a, b) <= 1e-4
    assert torch.isfinite(mid).all()


def test_runs_unet_in_its_dtype_and_returns_x_dtype():
    scheduler = diffusers.DDIMScheduler()
    unet32 = tiny_unet(3, seed=1)
    unet64 = tiny_unet(3, seed=1).double()
    x = start_noise((2, 3, 8, 8))
    sigma = torch.tensor([2.0, 0.5])
    with torch.inference_mode():
        d32 = from_diffusers(unet32, scheduler)(x, sigma)
        d64 = from_diffusers(unet64, scheduler)(x, sigma)  # float32 x through a float64 UNet
        d64_from64 = from_diffusers(unet64, scheduler)(x.double(), sigma.double())
    assert d32.dtype == d64.dtype == torch.float32 and d64_from64.dtype == torch.float64
    assert scaled_error(d64, d32) <= 1e-5


def test_learned_variance_output_uses_the_mean_half():
    scheduler = diffusers.DDPMScheduler(variance_type="learned_range")
    wide = tiny_unet(3, seed=2, out_channels=6)
    D = from_diffusers(wide, scheduler)
    x = start_noise((2, 3, 8, 8)) * 4
    sigma = torch.tensor([4.0, 4.0])
    with torch.inference_mode():
        t = D.sigma_to_t(sigma).float()
        eps = wide(x / (1 + 16.0) ** 0.5, t).sample[:, :3]
        assert torch.allclose(D(x, sigma), x - 4.0 * eps, atol=1e-5)


def test_sample_shape_from_config_and_override(unet):
    scheduler = diffusers.DDIMScheduler()
    assert from_diffusers(unet, scheduler).sample_shape == (3, 8, 8)
    with pytest.raises(ValueError, match="noise has sample shape"):
        sd.sample(from_diffusers(unet, scheduler), torch.randn(1, 3, 16, 16), torch.tensor([1.0, 0.0]))
    D = from_diffusers(unet, scheduler, sample_shape=(3, 16, 16))
    with torch.inference_mode():
        assert sd.sample(D, torch.randn(1, 3, 16, 16), torch.tensor([1.0, 0.0])).shape == (1, 3, 16, 16)
    with pytest.raises(ValueError, match="sample_shape"):
        from_diffusers(unet, scheduler, sample_shape=(1, 8, 8))


# --- conditions -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def class_unet():
    return tiny_unet(1, seed=3, num_class_embeds=4)  # classes 0..2, and 3 trained as the null class


def test_class_labels_and_null_class(class_unet):
    scheduler = diffusers.DDIMScheduler()
    D = from_diffusers(class_unet, scheduler, null_class=3)
    x = start_noise((3, 1, 8, 8)) * 2
    sigma = torch.full((3,), 2.0)
    with torch.inference_mode():
        null = D(x, sigma, torch.tensor([3, 3, 3]))
        assert torch.equal(D(x, sigma, torch.tensor([-1, -1, -1])), null)
        assert torch.equal(D(x, sigma), null)  # cond=None is all-null
        mixed = D(x, sigma, torch.tensor([0, -1, 2]))
        assert torch.equal(mixed[1], null[1]) and not torch.allclose(mixed[0], null[0])
        # Classifier-free guidance runs conditional and null rows as one doubled batch; scale 1 = conditional.
        cond = torch.tensor([0, 1, 2])
        sigmas = sd.sigmas.from_alphas_cumprod(scheduler.alphas_cumprod, 4)
        plain = sd.sample(D, x, sigmas, method="ddim", cond=cond)
        guided = sd.sample(D, x, sigmas, method="ddim", cond=cond, guidance=lambda c, u, x, s: u + 1.0 * (c - u))
    assert scaled_error(guided, plain) <= 1e-5


def test_null_without_null_class_is_an_error(class_unet):
    D = from_diffusers(class_unet, diffusers.DDIMScheduler())
    x, sigma = torch.randn(2, 1, 8, 8), torch.ones(2)
    with torch.inference_mode():
        D(x, sigma, torch.tensor([0, 2]))  # real labels are fine
        with pytest.raises(ValueError, match="null_class="):
            D(x, sigma, torch.tensor([0, -1]))
        with pytest.raises(ValueError, match="null_class="):
            D(x, sigma)
        with pytest.raises(ValueError, match="< 4"):
            D(x, sigma, torch.tensor([0, 4]))
        with pytest.raises(ValueError, match="integer tensor"):
            D(x, sigma, torch.tensor([0.0, 1.0]))
        with pytest.raises(ValueError, match=r"\[B\]=\[2\]"):
            D(x, sigma, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="num_class_embeds=4"):
        from_diffusers(class_unet, diffusers.DDIMScheduler(), null_class=4)


def test_unconditional_unet_accepts_only_null_conditions(unet):
    D = from_diffusers(unet, diffusers.DDIMScheduler())
    x, sigma = torch.randn(2, 3, 8, 8), torch.ones(2)
    with torch.inference_mode():
        assert torch.equal(D(x, sigma, torch.tensor([-1, -1])), D(x, sigma))
        with pytest.raises(ValueError, match="no class embedding"):
            D(x, sigma, torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="no class embedding"):
        from_diffusers(unet, diffusers.DDIMScheduler(), null_class=0)


def test_condition_embeddings_rows_and_null(cond_unet):
    scheduler = diffusers.DDIMScheduler()
    emb = torch.randn(4, 5, 12, generator=torch.Generator().manual_seed(0))  # K=3 prompts + null
    D = from_diffusers(cond_unet, scheduler, condition_embeddings=emb)
    assert D.sample_shape == (4, 8, 8)
    x = start_noise((3, 4, 8, 8)) * 3
    sigma = torch.tensor([3.0, 3.0, 3.0])
    with torch.inference_mode():
        t = D.sigma_to_t(sigma).float()
        x_vp = x / (1 + 9.0) ** 0.5
        by_hand = x - 3.0 * cond_unet(x_vp, t, encoder_hidden_states=emb[[2, 3, 0]]).sample
        assert scaled_error(D(x, sigma, torch.tensor([2, -1, 0])), by_hand) <= 1e-6
        null = x - 3.0 * cond_unet(x_vp, t, encoder_hidden_states=emb[3:].expand(3, 5, 12)).sample
        assert scaled_error(D(x, sigma, torch.tensor([-1, -1, -1])), null) <= 1e-6
        assert scaled_error(D(x, sigma), null) <= 1e-6
        with pytest.raises(ValueError, match="K=3"):
            D(x, sigma, torch.tensor([0, 1, 3]))


def test_condition_embeddings_errors(cond_unet, unet):
    scheduler = diffusers.DDIMScheduler()
    with pytest.raises(ValueError, match="condition_embeddings is required"):
        from_diffusers(cond_unet, scheduler)
    with pytest.raises(ValueError, match=r"condition_embeddings must have shape \[K\+1, seq, dim\]"):
        from_diffusers(cond_unet, scheduler, condition_embeddings=torch.randn(3, 12))
    with pytest.raises(ValueError, match="cross_attention_dim is 12"):
        from_diffusers(cond_unet, scheduler, condition_embeddings=torch.randn(3, 5, 7))
    with pytest.raises(TypeError, match="condition_embeddings must be a floating-point tensor"):
        from_diffusers(cond_unet, scheduler, condition_embeddings=torch.zeros(3, 5, 12, dtype=torch.long))
    with pytest.raises(ValueError, match="null_class applies to UNet2DModel only"):
        from_diffusers(cond_unet, scheduler, condition_embeddings=torch.randn(2, 5, 12), null_class=0)
    with pytest.raises(ValueError, match="condition_embeddings applies to UNet2DConditionModel only"):
        from_diffusers(unet, scheduler, condition_embeddings=torch.randn(2, 5, 12))


# --- argument errors --------------------------------------------------------------------------------------------


def test_bad_prediction_type(unet):
    scheduler = diffusers.DDIMScheduler()
    scheduler.register_to_config(prediction_type="flow")
    with pytest.raises(ValueError, match="prediction_type must be one of"):
        from_diffusers(unet, scheduler)


def test_scheduler_without_alphas_cumprod(unet):
    with pytest.raises(ValueError, match="no alphas_cumprod"):
        from_diffusers(unet, diffusers.FlowMatchEulerDiscreteScheduler())


def test_not_a_unet():
    with pytest.raises(TypeError, match="unet must be a diffusers UNet2DModel"):
        from_diffusers(torch.nn.Conv2d(3, 3, 1), diffusers.DDIMScheduler())


def test_missing_diffusers_gives_install_hint(monkeypatch, unet):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # makes `import diffusers` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'steerdiff\[diffusers\]'"):
        from_diffusers(unet, object())
