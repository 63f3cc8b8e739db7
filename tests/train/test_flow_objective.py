"""The rectified-flow objective: its closed-form optimum on a Gaussian, its equality with the 1/t^2-weighted
D-loss, its selection from the config, and exact resume through the generic loop."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from steerdiff.core import FlowDenoiser
from steerdiff.io import read_json
from steerdiff.models import MLP, FlowModel, GaussianMixture, UNet, build_model
from steerdiff.train import TrainConfig, objective_for, train
from steerdiff.train.flow import flow_loss, predict_velocity, sample_flow_times

ROOT = Path(__file__).resolve().parents[2]
MU, S = 0.7, 0.4  # 1-D data x0 ~ N(MU, S^2)


def exact_velocity(x_t, t, cond=None):
    """E[eps - x0 | x_t] for x0 ~ N(MU, S^2), x_t = (1 - t) x0 + t eps (jointly Gaussian: a linear regression)."""
    t = t.reshape(-1, *([1] * (x_t.ndim - 1))).to(x_t.dtype)
    var = (1 - t) ** 2 * S**2 + t**2
    return (t - (1 - t) * S**2) * (x_t - (1 - t) * MU) / var - MU


def minimal_loss(t: torch.Tensor) -> torch.Tensor:
    """Var(eps - x0 | x_t) at each t: Var(u) - Cov(u, x_t)^2 / Var(x_t), u = eps - x0."""
    return 1 + S**2 - (t - (1 - t) * S**2) ** 2 / ((1 - t) ** 2 * S**2 + t**2)


def expected_minimal_loss(sampling: str) -> float:
    """E_t[Var(eps - x0 | x_t)] by quadrature over the law of t (midpoint rule, fine grid)."""
    if sampling == "uniform":
        t = (torch.arange(200_000, dtype=torch.float64) + 0.5) / 200_000
        return float(minimal_loss(t).mean())
    z = torch.linspace(-9, 9, 200_001, dtype=torch.float64)
    w = torch.exp(-z**2 / 2) / math.sqrt(2 * math.pi) * (z[1] - z[0])
    return float((minimal_loss(torch.sigmoid(z)) * w).sum())


@pytest.mark.parametrize("sampling", ["logit_normal", "uniform"])
def test_exact_velocity_attains_the_closed_form_minimum(sampling):
    n = 400_000
    x0 = (MU + S * torch.randn(n, 1, generator=torch.Generator().manual_seed(1))).double()
    state = torch.Generator().manual_seed(2).get_state()

    def loss(fn):
        g = torch.Generator()
        g.set_state(state)  # the same t and noise draws for every field
        return float(flow_loss(FlowDenoiser(fn, t_scale=1.0), x0, generator=g, sampling=sampling))

    best = loss(exact_velocity)
    # MC error of a mean of ~400k per-sample losses of variance <~ 2 (E[(chi^2_1)^2] scale): ~0.004
    assert abs(best - expected_minimal_loss(sampling)) < 0.01
    # A perturbation delta adds E[delta^2] (the cross term vanishes at the conditional mean).
    shifted = loss(lambda x_t, t, cond=None: exact_velocity(x_t, t) + 0.2)
    scaled = loss(lambda x_t, t, cond=None: 1.1 * exact_velocity(x_t, t))
    assert abs(shifted - best - 0.04) < 0.005
    assert scaled > best + 1e-3


def test_generic_denoiser_path_uses_the_one_convention():
    """An EDM-convention denoiser (the exact mixture) goes through v = (x_t - D(x_t/(1-t), t/(1-t))) / t: its loss
    is the same closed-form minimum."""
    gmm = GaussianMixture(torch.ones(1), torch.full((1, 1), MU), torch.full((1, 1, 1), S**2))
    n = 200_000
    x0 = (MU + S * torch.randn(n, 1, generator=torch.Generator().manual_seed(3))).double()
    got = float(flow_loss(gmm, x0, generator=torch.Generator().manual_seed(4)))
    assert abs(got - expected_minimal_loss("logit_normal")) < 0.015
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    x_t = torch.tensor([[0.3], [-1.0], [2.0]], dtype=torch.float64)
    assert torch.allclose(predict_velocity(gmm, x_t, t), exact_velocity(x_t, t), atol=1e-10)


def tiny_flow_unet(seed: int = 0) -> FlowModel:
    torch.manual_seed(seed)
    net = UNet(img_size=4, in_channels=1, channels=[8], num_res_blocks=1, num_classes=3, emb_dim=16, fourier_dim=8,
               norm_groups=4)
    with torch.no_grad():  # the zero-initialised output conv would make every prediction 0
        net.conv_out.weight.normal_(0, 0.3)
    return FlowModel(net, t_scale=1.0)


def test_velocity_loss_equals_weighted_denoising_loss():
    """||v_hat - (eps - x0)||^2 == ||D_hat - x0||^2 / t^2, the D-side computed through the wrapper's forward."""
    model = tiny_flow_unet()
    x0 = torch.randn(64, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    cond = torch.randint(-1, 3, (64,), generator=torch.Generator().manual_seed(1))
    state = torch.Generator().manual_seed(5).get_state()
    g = torch.Generator()
    g.set_state(state)
    with torch.no_grad():
        v_loss = float(flow_loss(model, x0, cond, generator=g))
        g.set_state(state)  # redraw the same t and eps, in the same order
        t = sample_flow_times(64, g)
        eps = torch.randn(x0.shape, generator=g)
        tb = t[:, None, None, None]
        x_t = (1 - tb) * x0 + tb * eps
        d = model(x_t / (1 - tb), t / (1 - t), cond)
        d_loss = float(((d - x0) ** 2).flatten(1).mean(1).div(t**2).mean())
    assert v_loss > 0.1 and abs(v_loss - d_loss) < 1e-4 * v_loss


def test_config_selects_the_objective_and_refuses_bad_values():
    assert objective_for(TrainConfig()).name == "edm"
    assert objective_for(TrainConfig(objective="flow")).name == "flow"
    with pytest.raises(ValueError, match="objective must be 'edm' or 'flow'"):
        TrainConfig(objective="rectified")
    with pytest.raises(ValueError, match="flow_t_sampling must be one of"):
        TrainConfig(objective="flow", flow_t_sampling="lognormal")
    with pytest.raises(ValueError, match="flow_t_std positive"):
        TrainConfig(objective="flow", flow_t_std=0.0)
    with pytest.raises(ValueError, match="several objectives"):
        objective_for(TrainConfig(objective="flow", coind_lambda=1.0))
    with pytest.raises(ValueError, match="sampling must be one of"):
        sample_flow_times(4, sampling="beta")
    cfg = TrainConfig(objective="flow", flow_t_sampling="uniform", flow_t_mean=0.5)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_logit_normal_times_follow_their_law():
    t = sample_flow_times(100_000, torch.Generator().manual_seed(0), mean=0.5, std=0.8)
    logit = torch.log(t / (1 - t))
    assert abs(float(logit.mean()) - 0.5) < 0.01 and abs(float(logit.std()) - 0.8) < 0.01
    u = sample_flow_times(100_000, torch.Generator().manual_seed(0), sampling="uniform")
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.005


def test_digits_flow_recipe():
    recipe = read_json(ROOT / "configs" / "digits_flow.json")
    cfg = TrainConfig.from_dict(recipe["train"])
    assert objective_for(cfg).name == "flow" and cfg.p_uncond == 0.1
    model = build_model(recipe["model"])
    assert isinstance(model, FlowModel) and isinstance(model, FlowDenoiser) and model.prediction == "velocity"
    # the digits UNet's architecture, as configs/digits_unet.json
    edm_net = read_json(ROOT / "configs" / "digits_unet.json")["model"]["config"]["net"]
    assert recipe["model"]["config"]["net"] == edm_net
    assert model.sample_shape == (1, 8, 8) and model.num_classes == (10,)


CFG = dict(steps=8, batch_size=16, lr=3e-3, warmup_steps=2, checkpoint_every=4, log_every=2, p_uncond=0.2,
           ema_decay=0.9, seed=4, objective="flow")


def test_flow_training_resumes_bit_identically(tmp_path):
    x = torch.randn(40, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    cond = torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(1))
    full = train(tiny_flow_unet(), (x, cond), CFG, tmp_path / "full", progress=False)
    half = train(tiny_flow_unet(), (x, cond), CFG, tmp_path / "split", progress=False, stop_after=4)
    assert half.step == 4 and not half.finished
    resumed = train(tiny_flow_unet(seed=9), (x, cond), CFG, tmp_path / "split", resume=True, progress=False)
    assert resumed.finished and [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]
    for a, b in ((full.model, resumed.model), (full.raw_model, resumed.raw_model)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    final = load_file(str(tmp_path / "split" / "final" / "model.safetensors"))
    assert all(torch.equal(final[k], v) for k, v in full.model.state_dict().items())
    # a different objective is a different run: resuming it under "edm" is refused
    with pytest.raises(ValueError, match="objective"):
        train(tiny_flow_unet(), (x, cond), dict(CFG, objective="edm"), tmp_path / "split", resume=True,
              progress=False)


def test_flow_objective_learns_a_gaussian_velocity(tmp_path):
    """300 steps on 1-D Gaussian data bring a small MLP close to the exact velocity field: its mean squared error
    under the training law of (t, x_t) is under 2% of E[v*^2] (an untrained field is off by about 100%)."""
    torch.manual_seed(0)
    model = FlowModel(MLP(dim=1, hidden=[32, 32], fourier_dim=8, noise_dim=8), t_scale=1.0)
    x = MU + S * torch.randn(4096, 1, generator=torch.Generator().manual_seed(0))
    cfg = dict(steps=300, batch_size=512, lr=1e-2, warmup_steps=20, checkpoint_every=1000, log_every=50,
               p_uncond=0.0, ema_decay=0.9, seed=0, objective="flow")
    result = train(model, x, cfg, tmp_path / "g", progress=False)
    g = torch.Generator().manual_seed(7)
    t = sample_flow_times(20000, g)
    x0 = MU + S * torch.randn(20000, 1, generator=g)
    x_t = (1 - t[:, None]) * x0 + t[:, None] * torch.randn(20000, 1, generator=g)
    with torch.no_grad():
        exact = exact_velocity(x_t, t)
        err = (predict_velocity(result.model, x_t, t) - exact).pow(2).mean()
    assert float(err) < 0.02 * float(exact.pow(2).mean())
