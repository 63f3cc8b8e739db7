"""train_namm, MirrorDenoiser / MirrorOperator, save / load, and clear errors for bad inputs."""

import math
import warnings

import pytest
import torch

import steerdiff as sd
from steerdiff.constrain import (
    NAMM,
    ConstraintWarning,
    ICNNMap,
    ResidualMLP,
    TotalBrightness,
    train_namm,
    unit_circle_data,
    unit_circle_distance,
)
from steerdiff.constrain.io import load_namm, save_namm
from steerdiff.constrain.mirror import MirrorDenoiser, MirrorOperator, train_mirror_model
from steerdiff.inverse.operators import Inpaint, Matrix
from steerdiff.io import CheckpointError
from steerdiff.models.mlp import MLP
from steerdiff.models.precond import EDMPrecond

CFG = {"steps": 30, "batch_size": 64, "lr": 1e-3}


@pytest.fixture(scope="module")
def circle_namm():
    torch.manual_seed(0)
    x = unit_circle_data(512, seed=0)
    return train_namm(x, unit_circle_distance, ICNNMap(dim=2, hidden=8), ResidualMLP(dim=2, hidden=16), CFG)


def _mixture_on(namm, trained_on=None):
    gm = sd.models.GaussianMixture(torch.tensor([1.0]), torch.zeros(1, 2), torch.eye(2)[None] * 0.5)
    return MirrorDenoiser(gm, namm, trained_on=namm.fingerprint if trained_on is None else trained_on)


def test_train_namm_history_clamp_ema_and_loss_decrease():
    torch.manual_seed(0)
    x = unit_circle_data(1024, seed=1)
    namm = train_namm(x, unit_circle_distance, ICNNMap(dim=2, hidden=8), ResidualMLP(dim=2, hidden=16),
                      {"steps": 30, "batch_size": 64, "lr": 3e-3, "ema_decay": 0.9, "log_every": 10})
    assert namm.forward_map.is_convex()  # the clamp ran after every step (the EMA of non-negative weights)
    first, last = namm.history[0], namm.history[-1]
    assert [h["step"] for h in namm.history] == [10, 20, 30]
    assert last["loss"] < first["loss"]
    assert not namm.training and namm.config["steps"] == 30


def test_bad_distance_and_violating_data():
    x = unit_circle_data(64, seed=0)
    with pytest.raises(ValueError, match="distance must return one value per sample"):
        train_namm(x, lambda v: v.norm(dim=1, keepdim=True), config={"steps": 1})
    with pytest.raises(ValueError, match="NaN"):
        train_namm(x, lambda v: v.sum(1) * math.nan, config={"steps": 1})
    bad = x.clone()
    bad[:16] *= 2.0  # 16 of 64 points off the circle by 1
    with pytest.warns(ConstraintWarning, match=r"25\.0% of the training data violate the constraint"):
        train_namm(bad, unit_circle_distance, config={"steps": 1})
    with pytest.raises(ValueError, match="25.0% of the samples violate"):
        train_namm(bad, unit_circle_distance, config={"steps": 1}, on_violation="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_namm(x, unit_circle_distance, config={"steps": 1})  # clean data: no warning
    with pytest.raises(ValueError, match="data contains NaN"):
        train_namm(torch.full((4, 2), math.nan), unit_circle_distance, config={"steps": 1})
    with pytest.raises(ValueError, match="forward map acts on shape"):
        train_namm(x, unit_circle_distance, forward=ICNNMap(dim=3), config={"steps": 1})
    with pytest.raises(ValueError, match="unknown NAMM config keys"):
        train_namm(x, unit_circle_distance, config={"step": 1})


def test_mirror_denoiser_refuses_models_trained_without_the_map(circle_namm, tmp_path):
    plain = EDMPrecond(MLP(dim=2, hidden=[8]))
    with pytest.raises(ValueError, match="not trained in a NAMM mirror space"):
        MirrorDenoiser(plain, circle_namm)
    with pytest.raises(ValueError, match="trained on forward map 'abc'"):
        MirrorDenoiser(plain, circle_namm, trained_on="abc")
    sd.models.save(plain, tmp_path / "plain")
    with pytest.raises(CheckpointError, match="plain model checkpoint, not a NAMM directory"):
        load_namm(tmp_path / "plain")


def test_sample_decodes_mirror_samples(circle_namm):
    md = _mixture_on(circle_namm)
    noise = sd.randn((16, 2), seeds=0)
    sig = sd.sigmas.karras(8, 0.002, 10.0)
    x, stats, mirror = md.sample(noise, sig, return_stats=True, return_mirror=True)
    assert torch.allclose(mirror, sd.sample(md.denoiser, noise, sig))  # sampling happens in mirror space
    assert torch.allclose(x, circle_namm.decode(mirror))
    assert stats.nfe == sd.core.sampling.nfe_of("heun", 8)


def test_mirror_operator_and_solve(circle_namm):
    op = Matrix(torch.tensor([[1.0, 0.0]]))
    mop = MirrorOperator(op, circle_namm).bind((2,))
    xt = torch.randn(5, 2)
    with torch.no_grad():
        assert torch.allclose(mop.forward(xt), op.bind((2,)).forward(circle_namm.decode(xt)))
        y = torch.tensor([[0.6], [-0.8]])
        assert torch.allclose(mop.pinv(y), circle_namm.encode(op.bind((2,)).pinv(y)))
    md = _mixture_on(circle_namm)
    res = md.solve(op, torch.tensor([[0.6]]), method="hr", noise_std=0.05, chains=3, steps=10)
    assert res.samples.shape == (1, 3, 2) and res.nfe == 10
    assert torch.allclose(res.samples[0], circle_namm.decode(res.extras["mirror_samples"][0]))
    with pytest.raises(ValueError, match="maps act on"):
        MirrorOperator(Inpaint.center((1, 8, 8)), circle_namm)


def test_save_load_roundtrip_and_fingerprint_guard(circle_namm, tmp_path):
    model = EDMPrecond(MLP(dim=2, hidden=[8]))
    x = unit_circle_data(64, seed=0)
    res = train_mirror_model(circle_namm, model, x, {"steps": 2, "batch_size": 16, "warmup_steps": 1}, tmp_path / "r")
    assert res.model.namm_fingerprint == circle_namm.fingerprint
    save_namm(circle_namm, tmp_path / "bundle", mirror_model=res.model)
    namm2, mirror = load_namm(tmp_path / "bundle")
    assert namm2.distance is unit_circle_distance and namm2.fingerprint == circle_namm.fingerprint
    with torch.no_grad():
        assert torch.equal(namm2.encode(x), circle_namm.encode(x))
        assert torch.equal(namm2.decode(x), circle_namm.decode(x))
        assert torch.equal(mirror(x, torch.ones(64)), res.model(x, torch.ones(64)))
    MirrorDenoiser(mirror, namm2)  # accepted: trained on this map
    # a bundle whose forward map was swapped after the model was trained is refused
    other = NAMM(ICNNMap(dim=2, hidden=8), circle_namm.inverse_map, unit_circle_distance)
    with pytest.raises(ValueError, match="mirror_model was trained on forward map"):
        save_namm(other, tmp_path / "bad", mirror_model=res.model)
    sd.models.save(ICNNMap(dim=2, hidden=8), tmp_path / "bundle" / "forward")
    with pytest.raises(CheckpointError, match="fingerprint"):
        load_namm(tmp_path / "bundle")


def test_custom_distance_needs_to_be_given_on_load(tmp_path):
    namm = NAMM(ICNNMap(dim=2, hidden=4), ResidualMLP(dim=2, hidden=4), lambda v: v.norm(dim=1))
    save_namm(namm, tmp_path / "n")
    with pytest.raises(CheckpointError, match="pass distance= to load_namm"):
        load_namm(tmp_path / "n")
    namm2, mirror = load_namm(tmp_path / "n", distance=TotalBrightness(1.0))
    assert mirror is None and isinstance(namm2.distance, TotalBrightness)


def test_finetune_freezes_forward_map_and_uses_mirror_samples(circle_namm):
    import copy

    namm = copy.deepcopy(circle_namm)
    fp, g_before = namm.fingerprint, copy.deepcopy(namm.forward_map.state_dict())
    f_before = copy.deepcopy(namm.inverse_map.state_dict())
    x = unit_circle_data(256, seed=5)
    mdm = namm.encode(x).detach() + 0.3  # stand-in for MDM samples, shifted off the data manifold
    namm.finetune(x, mdm, {**CFG, "steps": 5})
    assert namm.fingerprint == fp  # g frozen: a mirror model trained on it stays valid
    assert all(torch.equal(v, g_before[k]) for k, v in namm.forward_map.state_dict().items())
    assert any(not torch.equal(v, f_before[k]) for k, v in namm.inverse_map.state_dict().items())
    assert namm.config["finetune_stages"][-1]["mdm_samples"] is True
    with pytest.raises(ValueError, match="mdm_samples has sample shape"):
        namm.finetune(x, torch.zeros(4, 3), {**CFG, "steps": 1})
