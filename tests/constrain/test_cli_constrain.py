"""``steerdiff constrain`` (the click group of steerdiff/app/cli/constrain.py) on a tiny bundle."""

import json

import torch
from click.testing import CliRunner

from steerdiff.app.cli.constrain import constrain_cmd
from steerdiff.constrain import NAMM, ICNNMap, ResidualMLP, unit_circle_distance
from steerdiff.constrain.io import save_namm
from steerdiff.models.mlp import MLP
from steerdiff.models.precond import EDMPrecond


def test_sample_writes_metrics_and_refuses_plain_checkpoints(tmp_path):
    torch.manual_seed(0)
    namm = NAMM(ICNNMap(dim=2, hidden=4), ResidualMLP(dim=2, hidden=4), unit_circle_distance)
    model = EDMPrecond(MLP(dim=2, hidden=[8]))
    model.namm_fingerprint = namm.fingerprint
    save_namm(namm, tmp_path / "b", mirror_model=model)
    r = CliRunner().invoke(constrain_cmd, ["sample", "--model", str(tmp_path / "b"), "--n", "8", "--steps", "4",
                                           "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["nfe"] == 7 and m["n"] == 8 and m["constraint_mean"] >= 0  # heun, 4 steps: 2 * 4 - 1 evaluations
    import steerdiff as sd

    sd.models.save(model, tmp_path / "plain")
    r = CliRunner().invoke(constrain_cmd, ["sample", "--model", str(tmp_path / "plain"), "--out", str(tmp_path / "p")])
    assert r.exit_code != 0 and "not a NAMM directory" in r.output
    r = CliRunner().invoke(constrain_cmd, ["train", "digits_namm", "--stages", "bogus"])
    assert r.exit_code != 0 and "unknown stages" in r.output
