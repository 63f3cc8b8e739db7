"""The claim measurements against closed forms and brute force, the memorisation data set, the shipped models and
``steerdiff geometry``."""

import json
import math

import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
from steerdiff.app.cli import main
from steerdiff.app.protocols import geometry as gv
from steerdiff.app.recipes.geometry import duplicated_digits
from steerdiff.geometry import local_descriptors

F64 = torch.float64


def test_the_spread_volume_of_a_linear_map_is_its_log_volume_up_to_sampling_noise():
    torch.manual_seed(0)
    a = torch.randn(6, 6, dtype=F64)
    vol = gv.spread_volume(lambda z: z @ a.T, torch.randn(3, 6, dtype=F64), eps=1e-3, probes=4000, seed=0)
    truth = torch.linalg.slogdet(a)[1]
    # sample covariance of 4000 draws in 6-d: the log det is biased by about -d(d+1)/(4n) and noisy at ~0.05
    assert torch.allclose(vol, truth.expand(3), atol=0.15)


def test_laplacian_energy_of_a_quadratic_image_is_closed_form():
    i, j = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    img = (i**2 + 3 * j**2)[None, None].double()  # Laplacian 2 + 6 = 8 at every interior pixel
    assert float(gv.laplacian_energy(img)[0]) == pytest.approx(36 * 64)
    assert float(gv.laplacian_energy((i + 2 * j)[None, None])[0]) == 0.0  # linear: no Laplacian


def test_memorised_is_the_threshold_rule_by_brute_force():
    torch.manual_seed(1)
    unique = torch.randn(20, 1, 2, 2, dtype=F64)
    dup = unique[:3]
    samples = torch.cat([dup + 0.01, torch.randn(5, 1, 2, 2, dtype=F64) * 3])
    mem, dist, thr = gv.memorised(samples, dup, unique, fraction=0.3)
    nn_dist = [min(float((unique[a] - unique[b]).norm()) for b in range(20) if b != a) for a in range(20)]
    assert thr == pytest.approx(0.3 * float(torch.tensor(nn_dist).median()))
    for s in range(samples.shape[0]):
        d = min(float((samples[s] - dup[t]).norm()) for t in range(3))
        assert float(dist[s]) == pytest.approx(d) and bool(mem[s]) == (d < thr)
    assert mem[:3].all()


def test_auroc_and_rank_statistics_on_known_cases():
    assert gv.auroc(torch.tensor([0.1, 0.2, 0.8, 0.9]), torch.tensor([False, False, True, True])) == 1.0
    # positives 0.8, 0.1 vs negatives 0.9, 0.2: one of the four pairs is ordered right
    assert gv.auroc(torch.tensor([0.9, 0.2, 0.8, 0.1]), torch.tensor([False, False, True, True])) == 0.25
    assert math.isnan(gv.auroc(torch.tensor([0.1, 0.2]), torch.tensor([True, True])))
    assert gv.spearman(torch.arange(10.0), torch.arange(10.0) ** 3) == pytest.approx(1.0)
    assert gv.ks_test(torch.zeros(30), torch.ones(30))["p"] < 1e-10
    assert gv.mean_pairwise_l2(torch.tensor([[0.0, 0.0], [3.0, 4.0]])) == pytest.approx(5.0)


def test_the_duplicated_digits_set_has_the_stated_counts():
    data = duplicated_digits(n_unique=300, n_duplicated=10, copies=100, seed=0)
    assert data.unique.shape == (300, 1, 8, 8) and data.x.shape == (290 + 1000, 1, 8, 8)
    flat = data.x.flatten(1)
    for img in data.duplicated:
        assert int((flat == img.flatten()).all(1).sum()) >= 100
    again = duplicated_digits(seed=0)
    assert torch.equal(again.x, data.x)
    with pytest.raises(ValueError, match="n_duplicated"):
        duplicated_digits(n_unique=5, n_duplicated=6)


@pytest.mark.parametrize("name", ["digits_geometry", "digits_geometry_mem"])
def test_the_shipped_geometry_models_are_relu_generators(name):
    model = sd.models.load(name)
    assert model.net.config["activation"] == "relu" and model.sample_shape == (1, 8, 8)
    d = local_descriptors(model, sd.randn((2, 1, 8, 8), seeds=0), sigmas=sd.sigmas.karras(4, 0.002, 40.0),
                          n_vertices=8)
    assert d.info["piecewise_linear"] and d.units_per_layer == {"net.body.1": 1024, "net.body.3": 1024,
                                                                 "net.body.5": 1024}
    assert bool(torch.isfinite(d.psi).all())


def test_the_cli_writes_metrics_tensors_and_a_plot(tmp_path):
    out = tmp_path / "g"
    res = CliRunner().invoke(main, ["geometry", "--model", "digits_geometry", "--n", "3", "--steps", "4",
                                    "--vertices", "8", "--no-progress", "--out", str(out)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n"] == 3 and len(metrics["rows"]) == 3 and metrics["map"] == "generator"
    assert metrics["steps"] == 4 and metrics["k"] == 64 and metrics["D"] == 64
    assert (out / "geometry.png").stat().st_size > 0
    tensors = sd.io.load_tensors(out / "descriptors.safetensors")
    assert tensors["psi"].shape == (3,) and tensors["samples"].shape == (3, 1, 8, 8)
    assert [r["psi"] for r in metrics["rows"]] == pytest.approx(tensors["psi"].tolist())


def test_the_cli_denoiser_map_and_its_errors(tmp_path):
    run = CliRunner().invoke
    res = run(main, ["geometry", "--map", "denoiser", "--sigma", "0.5", "--n", "2", "--no-delta", "--no-progress",
                     "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "d" / "metrics.json").read_text())["sigma"] == 0.5
    for args, hint in ((["--map", "denoiser"], "--sigma"), (["--rank-tol", "0"], "--rank-tol"),
                       (["--sketch-dim", "65"], "--sketch-dim"), (["--vertices", "7"], "--vertices")):
        res = run(main, ["geometry", "--n", "1", "--out", str(tmp_path / "e"), *args])
        assert res.exit_code == 2 and hint in res.output, (args, res.output)


def test_the_mlp_takes_a_relu_activation_and_records_it_only_when_not_silu():
    relu = sd.models.MLP(dim=4, hidden=[8], activation="relu")
    assert isinstance(relu.body[1], torch.nn.ReLU) and relu.config["activation"] == "relu"
    plain = sd.models.MLP(dim=4, hidden=[8])
    assert isinstance(plain.body[1], torch.nn.SiLU) and "activation" not in plain.config
    with pytest.raises(ValueError, match="activation"):
        sd.models.MLP(dim=4, hidden=[8], activation="tanh")
