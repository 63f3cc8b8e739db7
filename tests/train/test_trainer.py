"""Trainer: learning on a tiny problem, exact resume, condition dropout, checkpoint format and safety."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from steerdiff.io import MARKER_NAME, flatten_optimizer_state, unflatten_optimizer_state
from steerdiff.models.dit import DiT
from steerdiff.models.io import load
from steerdiff.models.mlp import MLP
from steerdiff.models.precond import EDMPrecond
from steerdiff.train import TrainConfig, drop_condition, edm_loss, edm_weight, train
from steerdiff.train.checkpoint import list_checkpoints


def blobs(n: int = 512, seed: int = 0):
    """Two labelled 2-D Gaussian blobs with a second attribute slot (sign of the y coordinate)."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 2, generator=g) * 0.1 + torch.stack([label * 2.0 - 1.0, torch.zeros(n)], 1)
    x[:, 1] += torch.randn(n, generator=g) * 0.5
    return x, torch.stack([label, (x[:, 1] > 0).long()], 1)


def mlp_model(seed: int = 0) -> EDMPrecond:
    torch.manual_seed(seed)
    return EDMPrecond(MLP(dim=2, hidden=[32, 32], num_classes=[2, 2], cond_dim=4, fourier_dim=8, noise_dim=8))


def dit_model(seed: int = 0) -> EDMPrecond:
    torch.manual_seed(seed)
    return EDMPrecond(
        DiT(
            img_size=4,
            in_channels=1,
            patch_size=2,
            width=8,
            depth=1,
            heads=2,
            num_classes=3,
            fourier_dim=4,
            dropout=0.2,
        )
    )


CFG = dict(
    steps=12,
    batch_size=32,
    lr=3e-3,
    warmup_steps=3,
    checkpoint_every=4,
    log_every=2,
    p_uncond=0.1,
    p_null=0.2,
    ema_decay=0.9,
    seed=3,
)


def all_tensors(result):
    return {
        **{f"raw.{k}": v for k, v in result.raw_model.state_dict().items()},
        **{f"ema.{k}": v for k, v in result.model.state_dict().items()},
    }


def assert_identical(a, b):
    ta, tb = all_tensors(a), all_tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_loss_decreases(tmp_path):
    x, cond = blobs()
    model = mlp_model()
    g = torch.Generator().manual_seed(0)
    state = g.get_state()

    def fixed_loss(m):
        g.set_state(state)  # same sigmas and noise before and after
        with torch.no_grad():
            return edm_loss(m, x, cond, generator=g).item()

    before = fixed_loss(model)
    cfg = dict(CFG, steps=150, p_null=0.0, ema_decay=0.95, lr=5e-3, checkpoint_every=1000)
    result = train(model, (x, cond), cfg, tmp_path / "run", progress=False)
    assert result.finished and result.step == 150
    assert fixed_loss(result.model) < 0.6 * before
    assert result.history[-1]["loss"] < result.history[0]["loss"]


@pytest.mark.parametrize(
    "make, data",
    [
        (mlp_model, lambda: blobs(100)),
        (dit_model, lambda: (torch.randn(40, 1, 4, 4), torch.randint(0, 3, (40,)))),
    ],
)
def test_resume_is_bit_identical(tmp_path, make, data):
    x, cond = data()
    full = train(make(), (x, cond), CFG, tmp_path / "full", progress=False)
    # Part one stops after 6 steps (cleanly, with a checkpoint); a fresh model object resumes it.
    half = train(make(), (x, cond), CFG, tmp_path / "split", progress=False, stop_after=6)
    assert half.step == 6 and not half.finished and not (tmp_path / "split" / "final").exists()
    resumed = train(make(seed=123), (x, cond), CFG, tmp_path / "split", resume=True, progress=False)
    assert resumed.step == 12 and resumed.finished
    assert_identical(full, resumed)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]
    final = load_file(str(tmp_path / "split" / "final" / "model.safetensors"))
    for k, v in full.model.state_dict().items():
        assert torch.equal(final[k], v)


def test_crash_then_resume_is_bit_identical(tmp_path):
    x, cond = blobs(100)
    full = train(mlp_model(), (x, cond), CFG, tmp_path / "full", progress=False)

    def crash(info):
        if info["step"] == 7:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(mlp_model(), (x, cond), CFG, tmp_path / "crash", progress=False, callback=crash)
    assert [s for s, _ in list_checkpoints(tmp_path / "crash")] == [4]
    resumed = train(mlp_model(seed=5), (x, cond), CFG, tmp_path / "crash", resume=True, progress=False)
    assert_identical(full, resumed)
    loaded = load(tmp_path / "crash" / "final")
    for k, v in full.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_checkpoints_are_safetensors_and_json_only(tmp_path):
    x, cond = blobs(64)
    train(mlp_model(), (x, cond), dict(CFG, steps=8), tmp_path / "run", progress=False)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and p.name != MARKER_NAME]
    assert files and all(p.suffix in (".safetensors", ".json") for p in files)
    # No temporary leftovers; each checkpoint directory holds the marker (JSON) that lists its files.
    assert not [p for p in (tmp_path / "run").rglob(".*") if p.name != MARKER_NAME]
    state = json.loads(next((tmp_path / "run").rglob("state.json")).read_text())
    assert state["step"] == 8 and {"epoch", "offset", "config", "model", "optimizer"} <= set(state)
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [8]  # older ones pruned (keep_checkpoints=1)


def test_refuses_to_clobber_and_checks_resume_config(tmp_path):
    x, cond = blobs(64)
    train(mlp_model(), (x, cond), dict(CFG, steps=4), tmp_path / "run", progress=False)
    with pytest.raises(FileExistsError, match="resume=True"):
        train(mlp_model(), (x, cond), dict(CFG, steps=4), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match=r"differs from the checkpoint in \['lr'\]"):
        train(mlp_model(), (x, cond), dict(CFG, steps=8, lr=1.0), tmp_path / "run", resume=True, progress=False)
    # resume=True without any checkpoint starts from scratch, loudly.
    with pytest.warns(UserWarning, match="no checkpoint"):
        train(mlp_model(), (x, cond), dict(CFG, steps=2), tmp_path / "fresh", resume=True, progress=False)


def test_data_validation(tmp_path):
    with pytest.raises(ValueError, match="data: samples have shape"):
        train(mlp_model(), torch.randn(10, 3), CFG, tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="data: cond"):
        train(mlp_model(), (torch.randn(10, 2), torch.rand(10)), CFG, tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="unknown training config keys"):
        train(mlp_model(), torch.randn(10, 2), dict(CFG, learning_rate=1), tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="grad_clip must be > 0 or None"):
        TrainConfig.from_dict(dict(CFG, grad_clip=0.0))


def test_condition_dropout_rates():
    g = torch.Generator().manual_seed(0)
    n = 40_000
    single = torch.full((n,), 3)
    out = drop_condition(single, p_uncond=0.1, generator=g)
    assert out.shape == single.shape and torch.equal(single, torch.full((n,), 3))  # input untouched
    assert abs((out == -1).float().mean().item() - 0.1) < 0.01
    assert set(out.unique().tolist()) == {-1, 3}

    multi = torch.ones(n, 2, dtype=torch.long)
    out = drop_condition(multi, p_null=0.2, generator=g)
    null = out == -1
    assert abs(null[:, 0].float().mean().item() - 0.2) < 0.01 and abs(null[:, 1].float().mean().item() - 0.2) < 0.01
    assert abs(null.all(1).float().mean().item() - 0.04) < 0.006  # slots dropped independently

    out = drop_condition(multi, p_uncond=0.5, generator=g)
    assert torch.equal((out == -1).all(1), (out == -1).any(1))  # whole rows only
    assert abs((out == -1).all(1).float().mean().item() - 0.5) < 0.015
    assert drop_condition(None, 0.5, 0.5, g) is None
    assert torch.equal(drop_condition(multi, 0.0, 0.0, g), multi)


def test_optimizer_state_round_trip():
    model = mlp_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 2), torch.ones(4)).pow(2).sum().backward()
    opt.step()
    tensors, meta = flatten_optimizer_state(opt.state_dict())
    json.dumps(meta)
    restored = unflatten_optimizer_state(tensors, json.loads(json.dumps(meta)))
    original = opt.state_dict()
    assert restored["param_groups"] == original["param_groups"]
    for pid, entries in original["state"].items():
        for k, v in entries.items():
            assert torch.equal(restored["state"][pid][k], v)


def test_lr_schedule_and_edm_weight():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, lr_schedule="cosine", min_lr_ratio=0.1)
    assert cfg.lr_at(0) == pytest.approx(0.1) and cfg.lr_at(9) == pytest.approx(1.0)
    assert cfg.lr_at(10) == pytest.approx(1.0) and cfg.lr_at(100) == pytest.approx(0.1)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    sigma = torch.tensor([0.5, 1.0])
    assert torch.allclose(edm_weight(sigma, 0.5), torch.tensor([0.5 / 0.0625, 1.25 / 0.25]))


def test_train_from_config_recipe(tmp_path):
    pytest.importorskip("steerdiff.data.toy2d")
    from steerdiff.train import load_dataset, train_from_config

    recipe = {
        "name": "tiny",
        "data": {"name": "toy2d:moons", "n": 256, "seed": 0},
        "model": {
            "class": "EDMPrecond",
            "config": {
                "sigma_data": 0.5,
                "net": {
                    "class": "MLP",
                    "config": {"dim": 2, "hidden": [16], "num_classes": None, "fourier_dim": 8},
                },
            },
        },
        "train": {"steps": 6, "batch_size": 64, "checkpoint_every": 3, "log_every": 3, "p_uncond": 0.0},
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(recipe))
    result = train_from_config(path, out_dir=tmp_path / "run", progress=False)
    assert result.finished and (tmp_path / "run" / "final" / "config.json").is_file()
    again = train_from_config(path, out_dir=tmp_path / "run2", progress=False)
    assert_identical(result, again)  # the recipe alone fixes the initial weights and the whole run
    with pytest.raises(ValueError, match="unknown data"):
        load_dataset("mnist")
    with pytest.raises(FileNotFoundError, match="available recipes"):
        train_from_config(tmp_path / "missing")


def test_shipped_recipes_parse():
    from steerdiff.io import read_json
    from steerdiff.models.io import build_model

    root = Path(__file__).resolve().parents[2] / "configs"
    for name in ("digits_unet", "toy2d_mlp", "digits_mlp"):
        recipe = read_json(root / f"{name}.json")
        TrainConfig.from_dict(recipe["train"])
        model = build_model(recipe["model"])
        assert isinstance(model, EDMPrecond)


def test_digits_data_without_labels():
    from steerdiff.train import load_dataset

    x, y = load_dataset({"name": "digits", "labels": "none"})
    x2, y2 = load_dataset("digits")
    assert y is None and torch.equal(x, x2) and y2.shape == (x.shape[0],)
    with pytest.raises(ValueError, match="labels must be 'class' or 'none'"):
        load_dataset({"name": "digits", "labels": "pairs"})
