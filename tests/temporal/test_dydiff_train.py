"""The DyDiff training objective (A.3/A.6 of shared/methods/temporal_geometry_control.md) and the trainer hooks it
uses: data streams with exact resume, the linear-decay learning rate, and the refusal of an unregistered objective."""

import pytest
import torch

from steerdiff.data.advection import training_stream
from steerdiff.models import EDMPrecond, FrameContext, FrameMixer
from steerdiff.temporal import DyDiffDenoiser, dydiff_loss, mixing_matrix, theta_bar
from steerdiff.train import TrainConfig, edm_loss, objective_for, train
from steerdiff.train.edm import edm_weight


def tiny(r, seed=0, frames=10, frame=(32,)):
    torch.manual_seed(seed)
    net = FrameMixer(frames, list(frame), 4, width=16, blocks=1, fourier_dim=8, emb_dim=16)
    with torch.no_grad():
        net.out.weight.normal_(0, 0.2)
    return DyDiffDenoiser(EDMPrecond(net, sigma_data=1.0), r=r)


def test_r0_loss_is_the_conditional_edm_loss():
    model, x0 = tiny(0.0), training_stream(0)(0, 8)
    a = dydiff_loss(model, x0, torch.Generator().manual_seed(3))
    b = edm_loss(model.denoiser, x0, FrameContext(x0[:, :4]), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_loss_matches_explicit_mixing():
    model, x0 = tiny(0.5), training_stream(0)(0, 8)
    got = dydiff_loss(model, x0, torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)  # the same draws, in the same order: sigma, then eps
    sigma = (-1.2 + 1.2 * torch.randn(8, generator=g)).exp()
    eps = torch.randn(x0.shape, generator=g)
    loss = 0.0
    for i in range(8):
        m = mixing_matrix(float(theta_bar(sigma[i], 0.5)), 10).float()
        x_sigma = m @ (x0[i] + sigma[i] * eps[i])
        with torch.no_grad():
            d = model.denoiser(x_sigma[None], sigma[i : i + 1], FrameContext(x0[i : i + 1, :4]))[0]
        loss = loss + edm_weight(sigma[i], 1.0) * ((d - m @ x0[i]) ** 2).mean()
    assert got.item() == pytest.approx(float(loss) / 8, rel=1e-4)


def test_stream_training_resumes_exactly(tmp_path):
    cfg = dict(steps=6, batch_size=4, lr=1e-3, lr_schedule="linear", decay_fraction=0.5, min_lr_ratio=0.0,
               warmup_steps=0, ema_decay=0.0, p_uncond=0.0, objective="dydiff", checkpoint_every=3, log_every=1)
    stream = training_stream(1)
    full = train(tiny(0.5), stream, cfg, tmp_path / "full", progress=False)
    half = train(tiny(0.5), stream, cfg, tmp_path / "split", progress=False, stop_after=3)
    assert half.step == 3 and not half.finished
    resumed = train(tiny(0.5, seed=9), stream, cfg, tmp_path / "split", resume=True, progress=False)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]
    sa, sb = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # linear decay over the last half: lr of step k (0-based) is lr * (1 - (k - 3) / 3) from step 3 on
    assert [round(h["lr"], 8) for h in full.history] == [1e-3, 1e-3, 1e-3, 1e-3, round(1e-3 * 2 / 3, 8),
                                                          round(1e-3 / 3, 8)]
    with pytest.raises(ValueError, match="model config differs"):  # another r is another model
        train(tiny(0.1), stream, cfg, tmp_path / "split", resume=True, progress=False)


def test_stream_batches_are_fresh_and_pure():
    stream = training_stream(2)
    assert torch.equal(stream(5, 4), stream(5, 4))
    assert not torch.equal(stream(5, 4), stream(6, 4))


def test_objective_selection_and_errors():
    assert objective_for(TrainConfig(objective="dydiff")).name == "dydiff"
    with pytest.raises(ValueError, match="objective must be"):
        TrainConfig(objective="dydif")
    with pytest.raises(ValueError, match="decay_fraction"):
        TrainConfig(lr_schedule="linear", decay_fraction=0.0)
    with pytest.raises(ValueError, match="DyDiffDenoiser"):
        dydiff_loss(EDMPrecond(FrameMixer(10, [32], 4), 1.0), torch.zeros(2, 10, 32))
    with pytest.raises(ValueError, match="x0 must have shape"):
        dydiff_loss(tiny(0.5), torch.zeros(2, 9, 32))


def test_recipe_trains_through_train_from_config(tmp_path):
    import json

    import steerdiff as sd
    from steerdiff.train import train_from_config

    recipe = json.loads(open(sd.train.recipes.resolve_config("advection_dydiff")).read())
    recipe["model"]["config"]["net"]["config"]["net"]["config"].update(width=8, blocks=1)
    recipe["train"].update(steps=2, batch_size=2, checkpoint_every=1)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(recipe))
    result = train_from_config(path, out_dir=tmp_path / "run", progress=False)
    assert result.finished
    back = sd.temporal.load_forecaster(tmp_path / "run" / "final")
    assert back.r == 0.5 and back.n_context == 4 and back.sample_shape == (10, 32)
