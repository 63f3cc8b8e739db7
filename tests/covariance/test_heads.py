"""OCM target and heads (docs/methods/ocm.md, "OCM objective"; unit test U2), training resume, and bad input
(docs/methods/conventions.md, "Errors")."""

import json
import math

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols.ocm import spec_mixture
from steerdiff.core.sigmas import vp_linear
from steerdiff.covariance import (
    CovarianceSource,
    InputHead,
    TrunkHead,
    cov_to_output,
    hutchinson_diag,
    load_head,
    load_head_for,
    ocm_target,
    output_to_cov,
    sample_gaussian,
    save_head,
    train_ocm,
    unet_trunk_head,
)
from steerdiff.covariance.kernel import mixture_diag_cov
from steerdiff.io import CheckpointError
from steerdiff.models import EDMPrecond, UNet


@pytest.mark.parametrize("sigma", [1.0, 3.0])
def test_u2_hutchinson_mean_and_variance(sigma):
    """U2: 20,000 single-probe estimates v * J^T v average to diag J (the closed-form Cov / sigma^2), and their
    variance is sum_{j != i} J_ji^2."""
    gmm = spec_mixture("gmm16d")
    g = torch.Generator().manual_seed(0)
    x0 = gmm.sample(1, generator=g)
    x1 = x0 + sigma * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    s1 = torch.full((1,), sigma, dtype=torch.float64)
    jac = gmm.posterior_cov(x1, s1)[0] / sigma**2  # exact J (symmetric)
    n = 20000
    x = x1.expand(n, 16).clone().requires_grad_(True)  # one row per probe: the batch gives independent probes
    tau = hutchinson_diag(gmm(x, torch.full((n,), sigma, dtype=torch.float64)), x, 1, g)
    diag = jac.diagonal()
    assert (tau.mean(0) - diag).abs().sum() / diag.abs().sum() < 0.02
    expected_var = (jac**2).sum(0) - diag**2
    big = expected_var > 1e-6
    ratio = tau.var(0)[big] / expected_var[big]
    assert ratio.min() > 0.95 and ratio.max() < 1.05


def test_direct_and_hess_targets_encode_the_same_covariance():
    """Both parameterisations map an exact diag J to c = sigma^2 diag J, and output_to_cov inverts cov_to_output."""
    sigma = torch.tensor([0.01, 0.3, 2.0, 150.0], dtype=torch.float64)
    tau = torch.rand(4, 5, dtype=torch.float64)
    for param in ("direct", "hess"):
        c = output_to_cov(ocm_target(tau, sigma, param, 0.5), sigma, param, 0.5)
        assert torch.allclose(c, sigma[:, None] ** 2 * tau, rtol=1e-12)
        assert torch.allclose(output_to_cov(cov_to_output(c, sigma, param, 0.5), sigma, param, 0.5), c, rtol=1e-12)


def test_zero_init_heads():
    sigma = torch.tensor([0.5, 2.0])
    x = torch.randn(2, 3)
    assert torch.equal(InputHead(3, param="direct").covariance(x, sigma), torch.zeros(2, 3))
    assert torch.allclose(InputHead(3, param="hess").covariance(x, sigma), sigma[:, None] ** 2 * torch.ones(2, 3))


def test_train_ocm_reduces_error_on_1d_mixture():
    """A short OCM run moves the head from c = 0 towards the closed-form diagonal (a cheap smoke version of the
    head-accuracy check)."""
    gmm = spec_mixture("gmm1d")
    res = train_ocm(gmm, gmm, steps=120, batch_size=128, lr=3e-3, seed=0, log_every=20)
    x = gmm.sample(2000, generator=torch.Generator().manual_seed(5))
    s = torch.full((2000,), 2.0, dtype=torch.float64)
    xs = x + 2.0 * torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    exact = mixture_diag_cov(gmm, xs, s)
    with torch.no_grad():
        pred = res.head.covariance(xs.float(), s.float()).double().clamp_min(0)
    rel = float((pred - exact).abs().sum() / exact.abs().sum())
    assert rel < 0.5, rel  # the zero-initialised head has relL1 = 1
    assert res.losses[-1] < res.losses[0]


def test_train_ocm_resume_is_exact(tmp_path):
    gmm = spec_mixture("gmm2d")
    kw = dict(steps=12, batch_size=64, seed=3, checkpoint_every=5, log_every=4)

    def head():
        torch.manual_seed(0)
        return InputHead(2, hidden=16)

    full = train_ocm(gmm, gmm, head=head(), **kw)
    part = train_ocm(gmm, gmm, head=head(), checkpoint_dir=tmp_path / "ck", **dict(kw, steps=5))
    assert part.steps == 5
    resumed = train_ocm(gmm, gmm, head=head(), checkpoint_dir=tmp_path / "ck", resume=True, **kw)
    assert resumed.steps == 12 and resumed.losses == pytest.approx(full.losses)
    for (k, a), b in zip(full.head.state_dict().items(), resumed.head.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def _tiny_unet(seed):
    torch.manual_seed(seed)
    return EDMPrecond(UNet(img_size=8, channels=(8, 16), num_res_blocks=1, num_classes=10, emb_dim=16,
                           fourier_dim=8, norm_groups=4)).eval()


def test_trunk_head_reads_features_of_the_denoiser_pass_and_trains(tmp_path):
    den = _tiny_unet(0)
    head = unet_trunk_head(den, hidden=8, depth=1, data_range=(-1, 1))
    assert head.feature_module == "net.norm_out" and head.c_max == 1.0
    data = torch.rand(64, 1, 8, 8) * 2 - 1
    labels = torch.arange(64) % 10
    res = train_ocm(den, data, head, labels=labels, steps=3, batch_size=16, p_uncond=0.5)
    assert all(p.grad is None for p in den.parameters()) and not den.training
    assert any(p.abs().sum() > 0 for p in res.head.out.parameters())  # the zero-init output layer moved
    noise = sd.randn((4, 1, 8, 8), seeds=0)
    x, stats = sd.sample(den, noise, vp_linear(3), method="ocm-ddpm", covariance=res.head,
                         cond=torch.arange(4), generator=0, return_stats=True)
    assert x.shape == noise.shape and stats.nfe == 3 and x.abs().max() <= 1.0  # D clipped to data_range
    # Without the denoiser's pass the head has no features: a clear error.
    with pytest.raises(ValueError, match="trunk features"):
        head.covariance(noise, torch.ones(4))


def test_head_fingerprint_guards_the_pairing(tmp_path):
    den, other = _tiny_unet(0), _tiny_unet(1)  # same config, different weights
    head = unet_trunk_head(den, hidden=8, depth=1)
    save_head(head, tmp_path / "h", denoiser=den, denoiser_name="tiny")
    loaded = load_head(tmp_path / "h", den)
    for a, b in zip(head.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="different denoiser"):
        load_head(tmp_path / "h", other)
    noise = sd.randn((2, 1, 8, 8), seeds=0)
    with pytest.raises(CheckpointError, match="different denoiser"):
        sd.sample(other, noise, vp_linear(2), method="ocm-ddpm", covariance=loaded)
    with pytest.raises(ValueError, match="pass the denoiser"):
        load_head(tmp_path / "h")
    with pytest.raises(CheckpointError, match="no covariance head"):
        load_head_for("toy2d")
    # The optional sampling default travels with the head; a corrupt one is refused.
    head.last_step_var_max = 0.02
    save_head(head, tmp_path / "h2", denoiser=den)
    assert load_head(tmp_path / "h2", den).last_step_var_max == 0.02
    cfg = json.loads((tmp_path / "h2" / "config.json").read_text())
    cfg["sampling"] = {"last_step_var_max": -1}
    (tmp_path / "h2" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="last_step_var_max"):
        load_head(tmp_path / "h2", den)


class _Bad(CovarianceSource):
    def covariance(self, x, sigma, cond, denoised):
        c = torch.full_like(x, -0.5)
        c[0] = float("nan")
        return c


def test_negative_and_nonfinite_predictions_are_clamped_counted_and_warned():
    gmm = spec_mixture("gmm1d")
    noise = sd.randn((8, 1), seeds=0, dtype=torch.float64)
    sig = vp_linear(4)  # 3 steps predict c (the last is deterministic)
    with pytest.warns(RuntimeWarning, match="clamped 21 negative and 3 non-finite"):
        x, stats = sd.sample(gmm, noise, sig, method="ocm-ddpm", covariance=_Bad(), generator=0, return_stats=True)
    assert torch.isfinite(x).all() and stats.clamped == 24
    with pytest.warns(RuntimeWarning):
        res = sample_gaussian(gmm, noise, sig, kind="ddpm", covariance=_Bad(), generator=0)
    assert res.n_negative == 21 and res.n_nonfinite == 3
    # Clamped to 0 = beta-tilde, exactly: the same samples as core ddpm.
    ref = sd.sample(gmm, noise, sig, method="ddpm", generator=0)
    nan_row = 0
    assert torch.allclose(x[1:], ref[1:], atol=1e-10) and math.isfinite(float(x[nan_row]))


def test_bad_arguments_give_clear_errors():
    gmm = spec_mixture("gmm1d")
    noise = sd.randn((4, 1), seeds=0, dtype=torch.float64)
    sig = vp_linear(3)
    with pytest.raises(ValueError, match="needs covariance="):
        sd.sample(gmm, noise, sig, method="ocm-ddim")
    with pytest.raises(ValueError, match="covariance= applies"):
        sd.sample(gmm, noise, sig, method="heun", covariance=gmm)
    with pytest.raises(TypeError, match="covariance must be"):
        sd.sample(gmm, noise, sig, method="ocm-ddim", covariance=3.0)
    with pytest.raises(ValueError, match="guidance"):
        sd.sample(gmm, noise, sig, method="ocm-ddim", covariance=gmm, guidance=lambda *a: a[0],
                  cond=torch.zeros(4, dtype=torch.long))
    for steps in (0, -1, 2.5):
        with pytest.raises(ValueError, match="steps must be an integer"):
            vp_linear(steps)
    assert vp_linear(1).tolist() == pytest.approx([157.4, 0.0], abs=0.05)  # K = 1: one step, x0 = D
    x = sd.sample(gmm, noise, vp_linear(1), method="ocm-ddpm", covariance=gmm, generator=0)
    assert torch.allclose(x, gmm(noise * vp_linear(1)[0], torch.full((4,), float(vp_linear(1)[0]))))
    with pytest.raises(ValueError, match="param"):
        InputHead(2, param="eps")
    with pytest.raises(ValueError, match="steps"):
        train_ocm(gmm, gmm, steps=0)
    with pytest.raises(TypeError, match="head must be"):
        train_ocm(gmm, gmm, head=torch.nn.Linear(1, 1), steps=1)
    with pytest.raises(ValueError, match="data_range"):
        TrunkHead("net.norm_out", 8, 1, data_range=(1, -1))
