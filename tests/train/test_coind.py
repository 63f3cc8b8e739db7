"""CoInD objective (docs/methods/coind.md, "The CI training objective"; U8 of "Exact composition checks (U6-U8)"),
its trainer option, and the learned 2-D test C1-C3 (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from steerdiff.guidance.coind_objective import ci_labels, ci_loss, ci_residual, coind_loss
from steerdiff.io import read_json
from steerdiff.models.gmm import GaussianMixture
from steerdiff.models.io import build_model
from steerdiff.models.mlp import MLP
from steerdiff.models.precond import EDMPrecond
from steerdiff.train import TrainConfig, edm_loss, train
from steerdiff.train.checkpoint import latest_checkpoint

LEVELS = (-2.0, 0.0, 2.0)
ROOT = Path(__file__).resolve().parents[2]


def grid_mixture(support=None) -> GaussianMixture:
    """U6's factorised mixture (means (u_a, v_b), s = 0.3); ``support`` keeps only some combos (U7 ii)."""
    combos = [(a, b) for a in range(3) for b in range(3) if support is None or support(a, b)]
    means = [[LEVELS[a], LEVELS[b]] for a, b in combos]
    return GaussianMixture(torch.ones(len(combos)), means, 0.09, labels=combos)


def probe(n: int = 500, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sigma = torch.logspace(-2, 1.5, 8, dtype=torch.float64).repeat_interleave(n // 8 + 1)[:n]
    x = torch.randn(n, 2, dtype=torch.float64, generator=g) * (4 + sigma[:, None] ** 2).sqrt()
    y = torch.randint(3, (n, 2), generator=g)
    slot = torch.randint(2, (n,), generator=g)
    return x, sigma, y, slot


def test_label_builder_matches_spec():
    y = torch.tensor([[1, 2], [0, 3], [2, 1]])
    y_minus, y_only, y_null, y_full = ci_labels(y, torch.tensor([0, 1, 1]))
    assert y_minus.tolist() == [[-1, 2], [0, -1], [2, -1]]  # slot i null, others kept
    assert y_only.tolist() == [[1, -1], [-1, 3], [-1, 1]]  # only slot i kept
    assert y_null.tolist() == [[-1, -1]] * 3 and torch.equal(y_full, y)
    with pytest.raises(ValueError, match="m >= 2"):
        ci_labels(torch.tensor([[1], [2]]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="slot values"):
        ci_labels(y, torch.tensor([0, 2, 1]))


def test_u8_ci_loss_zero_for_factorised_oracle():
    x, sigma, y, slot = probe()
    gmm = grid_mixture()
    r = ci_residual(gmm, x, sigma, y, slot)
    assert float(r.abs().max()) < 1e-10 * (1 + float(x.abs().max()))
    assert float(ci_loss(gmm, x, sigma, y, slot, 0.5)) < 1e-18


def test_u8_ci_loss_positive_for_partial_support_marginals():
    partial = grid_mixture(lambda a, b: (b - a) % 3 in (0, 1))
    x, sigma, y, slot = probe()
    keep = ((y[:, 1] - y[:, 0]) % 3 != 2)  # labels the partial mixture knows
    loss = float(ci_loss(partial, x[keep], sigma[keep], y[keep], slot[keep], 0.5))
    assert loss > 1e-3


def test_coind_loss_adds_lambda_times_ci_on_the_same_draws():
    torch.manual_seed(0)
    model = EDMPrecond(MLP(dim=2, hidden=[16], num_classes=[3, 3], cond_dim=4, fourier_dim=8, noise_dim=8))
    x0 = torch.randn(32, 2)
    y = torch.randint(3, (32, 2))
    y_drop = y.clone()
    y_drop[::3, 0] = -1
    total, l_ci = coind_loss(model, x0, y, y_drop, 2.5, torch.Generator().manual_seed(7), ci_fraction=0.5)
    base = edm_loss(model, x0, y_drop, torch.Generator().manual_seed(7))  # same sigma, noise draw order
    assert torch.allclose(total, base + 2.5 * l_ci, rtol=1e-6)
    # Recompute L_CI by hand on the first 16 rows with the generator's next draw for the slots.
    g = torch.Generator().manual_seed(7)
    sigma = (-1.2 + 1.2 * torch.randn(32, generator=g)).exp()
    noise = torch.randn(32, 2, generator=g)
    slot = torch.randint(2, (16,), generator=g)
    xs = x0 + sigma[:, None] * noise
    want = ci_loss(model, xs[:16], sigma[:16], y[:16], slot, 0.5)
    assert torch.allclose(l_ci, want.detach(), rtol=1e-6)
    with pytest.raises(ValueError, match="ci_fraction"):
        coind_loss(model, x0, y, y, 1.0, ci_fraction=0.0)


def small_model(seed: int = 0) -> EDMPrecond:
    torch.manual_seed(seed)
    return EDMPrecond(MLP(dim=2, hidden=[16, 16], num_classes=[2, 2], cond_dim=4, fourier_dim=8, noise_dim=8))


def quad_data(n: int = 100):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(2, (n, 2), generator=g)
    return (2.0 * y - 1.0) + 0.1 * torch.randn(n, 2, generator=g), y


COINDCFG = dict(steps=10, batch_size=16, warmup_steps=2, checkpoint_every=4, log_every=2, p_null=0.2,
                coind_lambda=1.0, ci_fraction=0.5)


def test_trainer_coind_resume_is_bit_identical(tmp_path):
    x, y = quad_data()
    full = train(small_model(), (x, y), COINDCFG, tmp_path / "full", progress=False)
    assert all("l_ci" in h and h["l_ci"] >= 0 for h in full.history)
    train(small_model(), (x, y), COINDCFG, tmp_path / "split", progress=False, stop_after=6)
    resumed = train(small_model(seed=9), (x, y), COINDCFG, tmp_path / "split", resume=True, progress=False)
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]


def test_trainer_lambda_changes_training_and_validates(tmp_path):
    x, y = quad_data()
    vanilla = train(small_model(), (x, y), dict(COINDCFG, coind_lambda=0.0), tmp_path / "v", progress=False)
    coind = train(small_model(), (x, y), COINDCFG, tmp_path / "c", progress=False)
    assert "l_ci" not in vanilla.history[0]
    w_v, w_c = vanilla.model.state_dict(), coind.model.state_dict()
    assert any(not torch.equal(w_v[k], w_c[k]) for k in w_v)
    with pytest.raises(ValueError, match="coind_lambda"):
        TrainConfig(coind_lambda=-1.0)
    with pytest.raises(ValueError, match="ci_fraction"):
        TrainConfig(ci_fraction=1.5)
    with pytest.raises(ValueError, match=r"multi-attribute labels"):
        train(small_model(), (x, y[:, 0]), COINDCFG, tmp_path / "one", progress=False)


def test_resume_accepts_checkpoints_written_before_the_coind_fields(tmp_path):
    x, y = quad_data()
    cfg = dict(COINDCFG, coind_lambda=0.0, ci_fraction=1.0)
    train(small_model(), (x, y), cfg, tmp_path / "old", progress=False, stop_after=4)
    state_path = latest_checkpoint(tmp_path / "old") / "state.json"
    state = json.loads(state_path.read_text())
    for key in ("coind_lambda", "ci_fraction"):
        del state["config"][key]
    state_path.write_text(json.dumps(state))
    resumed = train(small_model(), (x, y), cfg, tmp_path / "old", resume=True, progress=False)
    assert resumed.finished


@pytest.mark.parametrize("coind, vanilla", [("shapes_coind", "shapes_band_vanilla"),
                                             ("shapes_coind_long", "shapes_band_vanilla_long"),
                                             ("shapes_nonuniform_coind", "shapes_nonuniform_vanilla"),
                                             ("shapes_dit_band_coind", "shapes_dit_band_vanilla")])
def test_coind_recipe_pairs_differ_only_in_the_ci_term(coind, vanilla):
    recipes = {n: read_json(ROOT / "configs" / f"{n}.json") for n in (coind, vanilla)}
    cfgs = {n: TrainConfig.from_dict(r["train"]) for n, r in recipes.items()}
    assert cfgs[coind].coind_lambda > 0 and cfgs[vanilla].coind_lambda == 0
    a, b = recipes.values()
    assert a["data"] == b["data"] and a["model"] == b["model"] and a["data"]["name"].startswith("shapes:")
    ca, cb = cfgs[coind].to_dict(), cfgs[vanilla].to_dict()
    assert {k for k in ca if ca[k] != cb[k]} <= {"coind_lambda", "ci_fraction"}
    assert cfgs[coind].p_null > 0 and tuple(build_model(a["model"]).num_classes) == (4, 4)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learned_2d_coind_c1_c3(tmp_path, seed):
    """The learned 2-D test (C1-C3; docs/methods/coind.md) with the "small" recipe (hidden 128, batch 512, 2500
    steps)."""
    from steerdiff.app.protocols.coind import criteria, evaluate_2d, train_2d

    res = {lam: evaluate_2d(train_2d(lam, seed, tmp_path / f"lam{lam:g}")[0]) for lam in (0.0, 1.0)}
    got = criteria(res[0.0], res[1.0])
    assert got == {"C1": True, "C2": True, "C3": True}, (got, res)
