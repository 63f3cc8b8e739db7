"""AutoGuidance (Karras et al., NeurIPS 2024): D = D_weak + w (D_model - D_weak), both conditional.

Independent truths: the closed form on two analytic denoisers (w = 0 is the weak model, w = 1 the model, and every
w the line through them), the cost accounting (one model evaluation per guided call, one weak evaluation counted
separately), and the shipped weak digits model loading by name.
"""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import AutoGuidance, build_guider


class Line:
    """D(x, sigma, c) = a x / (1 + sigma^2) + b c: conditional, no null needed."""

    num_classes = (4,)

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __call__(self, x, sigma, cond):
        return self.a * x / (1 + sigma.view(-1, 1) ** 2) + self.b * cond.view(-1, 1).to(x.dtype)


def test_closed_form_and_endpoints():
    strong, weak = Line(1.0, 0.5), Line(0.7, 0.1)
    x = torch.randn(4, 3, dtype=torch.float64)
    sigma = torch.full((4,), 2.0, dtype=torch.float64)
    cond = torch.arange(4)
    for w in (0.0, 1.0, 2.5):
        got = AutoGuidance(w, weak=weak).guide(strong, x, sigma, cond)
        want = weak(x, sigma, cond) + w * (strong(x, sigma, cond) - weak(x, sigma, cond))
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(AutoGuidance(1.0, weak=weak).guide(strong, x, sigma, cond), strong(x, sigma, cond))


def test_cost_and_per_sample_scales():
    strong, weak = Line(1.0, 0.5), Line(0.7, 0.1)
    noise = sd.randn((4, 3), seeds=0, dtype=torch.float64)
    g = AutoGuidance([0.0, 1.0, 2.0, 3.0], weak=weak)
    x, stats = sd.sample(strong, noise, sd.sigmas.karras(5, 0.01, 10.0), method="euler", cond=torch.arange(4),
                         guidance=g, return_stats=True)
    assert stats.nfe == 5 and g.weak_evaluations == 5  # one model and one weak evaluation per step
    for b, w in enumerate([0.0, 1.0, 2.0, 3.0]):
        one = sd.sample(strong, noise[b:b + 1], sd.sigmas.karras(5, 0.01, 10.0), method="euler",
                        cond=torch.arange(4)[b:b + 1], guidance=AutoGuidance(w, weak=weak))
        torch.testing.assert_close(x[b:b + 1], one, rtol=1e-12, atol=1e-12)


def test_shipped_weak_digits_model_by_name():
    g = build_guider("autoguidance", 2.0, weak="digits_weak")
    assert g.config["weak"] == "digits_weak"
    model = sd.models.load("digits")
    weak_params = sum(p.numel() for p in g.weak.parameters())
    assert weak_params < sum(p.numel() for p in model.parameters()) / 3  # a smaller version of the same task
    x = sd.sample(model, sd.randn((4, 1, 8, 8), seeds=0), sd.sigmas.karras(6, 0.002, 80.0), cond=torch.arange(4),
                  guidance=g)
    assert torch.isfinite(x).all()


def test_bad_input():
    with pytest.raises(TypeError, match="weak must be"):
        AutoGuidance(2.0, weak=3)
    with pytest.raises(sd.io.CheckpointError):
        AutoGuidance(2.0, weak="no_such_model")


def _shipped(name):
    from steerdiff.models.io import ASSETS_DIR

    if name not in sd.models.shipped_models():
        pytest.skip(f"{name} is not shipped (scripts/make_assets.py --only {name})")
    return ASSETS_DIR / name


def test_shipped_weak_shapes_model_checkpoint_and_recipe():
    """shapes_weak ships as safetensors, its architecture is the one its committed recipe builds, and it is a
    smaller network of the same task as the shapes model (same input, classes and preconditioning)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    folder = _shipped("shapes_weak")
    files = {p.name for p in folder.iterdir()}
    assert "model.safetensors" in files and not {n for n in files if n.endswith((".pt", ".pth", ".bin", ".ckpt"))}
    metrics = json.loads((folder / "metrics.json").read_text())
    recipe_path = Path(__file__).resolve().parents[2] / metrics["recipe"]
    recipe = json.loads(recipe_path.read_text())
    assert json.loads((folder / "config.json").read_text())["config"] == recipe["model"]["config"]
    assert metrics["train_steps"] == recipe["train"]["steps"]
    weak, strong = sd.models.load("shapes_weak"), sd.models.load("shapes")
    state = load_file(folder / "model.safetensors")
    assert sum(v.numel() for v in state.values()) == sum(p.numel() for p in weak.parameters())
    assert tuple(weak.num_classes) == tuple(strong.num_classes) and weak.sigma_data == strong.sigma_data
    assert sum(p.numel() for p in weak.parameters()) < sum(p.numel() for p in strong.parameters()) / 3


def test_shipped_weak_shapes_model_denoises_and_guides():
    """The weak model is a trained conditional denoiser of the shapes data: at sigma = 0.5 it beats the estimate an
    untrained EDM network gives (F = 0: D = c_skip x, the best scalar shrinkage for data of std sigma_data) and the
    true labels help it more than shifted ones; AutoGuidance with it is the line through the two models."""
    from steerdiff.data.shapes import generate

    _shipped("shapes_weak")
    weak, strong = sd.models.load("shapes_weak").eval(), sd.models.load("shapes").eval()
    x0, y = generate(256, "full", "test", seed=4321)
    x0, y = torch.as_tensor(x0), torch.as_tensor(y)
    label = y[:, 0] * 4 + y[:, 1]
    sigma = torch.full((256,), 0.5)
    x = x0 + 0.5 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mse = ((weak(x, sigma, label) - x0) ** 2).mean()
        shrink = weak.sigma_data**2 / (weak.sigma_data**2 + 0.25)
        assert mse < 0.5 * ((shrink * x - x0) ** 2).mean()
        assert mse < ((weak(x, sigma, (label + 1) % 16) - x0) ** 2).mean()
        g = build_guider("autoguidance", 2.5, weak="shapes_weak")
        got = g.guide(strong, x[:8], sigma[:8], label[:8])
        want = weak(x[:8], sigma[:8], label[:8]) + 2.5 * (strong(x[:8], sigma[:8], label[:8])
                                                          - weak(x[:8], sigma[:8], label[:8]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert g.weak_evaluations == 1 and g.config["weak"] == "shapes_weak"
