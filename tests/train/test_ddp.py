"""Data-parallel training (2 gloo processes on the CPU): equal to one process, exact resume, errors on every rank."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from script_modules import load_script

from steerdiff.distributed import SINGLE, DistContext
from steerdiff.train import TrainConfig, train
from steerdiff.train.checkpoint import latest_checkpoint, list_checkpoints
from steerdiff.train.ddp import local_chunks, resolve_shards

WORKER = Path(__file__).with_name("ddp_worker.py")
TOL = 1e-6  # relative, after 50 steps (the bound)


def _module(path: Path, name: str):
    return load_script(path, name)


# The worker's model / data builders, so that in-process checks use exactly the ranks' setup.
def _load_worker():
    return _module(WORKER, "_ddp_worker")


def _launch(launch_ranks, mode: str, out: Path, world: int = 2, timeout: float = 120.0, before=None, fresh=None):
    ranks = launch_ranks([sys.executable, str(WORKER), mode, str(out)], world=world, timeout=timeout, before=before,
                         fresh=fresh)
    for r in ranks:
        print(f"{mode} rank {r.rank}: rc {r.returncode}, {r.seconds:.1f} s")
    return ranks


def _check_ok(ranks) -> None:
    for r in ranks:
        assert r.returncode == 0, f"rank {r.rank} failed (rc {r.returncode}):\n{r.stderr[-3000:]}"


def _rel(a: dict, b: dict) -> float:
    """Largest ``max|a - b| / max|b|`` over the tensors (same keys)."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp_min(1e-30))
               for k in a)


def _bit_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def equal_run(run_ranks, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_equal")
    _check_ok(_launch(run_ranks, "equal", out, fresh=out))
    return out


@pytest.fixture(scope="module")
def killed_run(run_ranks, tmp_path_factory):
    """A 2-rank run killed at step 25 (checkpoint of step 20 on disk), then resumed; plus the error cases."""
    out = tmp_path_factory.mktemp("ddp_kill")
    killed = _launch(run_ranks, "kill", out)
    steps_on_disk = [s for s, _ in list_checkpoints(out / "split")]
    killed_copy = out / "split_as_killed"
    shutil.copytree(out / "split", killed_copy)

    def as_killed() -> None:  # a repeated launch (teardown abort) must resume from step 20 again, not from 50
        shutil.rmtree(out / "split")
        shutil.copytree(killed_copy, out / "split")

    resumed = _launch(run_ranks, "resume,errors", out, before=as_killed)
    return out, killed, steps_on_disk, resumed


def test_two_ranks_equal_one_process_with_the_same_global_batch(equal_run):
    out = equal_run
    for name in ("dit", "mlp"):  # DiT with dropout on a data set (2 chunks); MLP on a data stream (4 chunks)
        r0, r1 = load_file(out / f"{name}_rank0.safetensors"), load_file(out / f"{name}_rank1.safetensors")
        one = load_file(out / f"{name}_one.safetensors")
        assert _bit_equal(r0, r1), f"{name}: the ranks' weights or EMA differ"
        rel = _rel(r0, one)
        print(f"{name}: DDP 2 ranks vs one process: max relative difference {rel:.3g} (bit-equal: "
              f"{_bit_equal(r0, one)})")
        assert rel <= TOL, name
    # The comparison can fail: the same run with one chunk (other random streams) is far away.
    assert _rel(load_file(out / "dit_rank0.safetensors"), load_file(out / "dit_one_1shard.safetensors")) > 1e-2
    logs = [json.loads((out / f"losses_rank{r}.json").read_text()) for r in range(2)]
    assert logs[0]["dit"] == logs[1]["dit"] and logs[0]["mlp"] == logs[1]["mlp"]  # the same history everywhere
    assert logs[0]["dit"] == pytest.approx(logs[0]["dit_one"], rel=TOL)
    assert logs[1]["mlp"] == pytest.approx(logs[1]["mlp_one"], rel=1e-5)


def test_checkpoint_records_world_shards_and_every_chunk_stream(equal_run):
    ckpt = latest_checkpoint(equal_run / "ddp_mlp")
    state = json.loads((ckpt / "state.json").read_text())
    assert state["world"] == 2 and state["config"]["data_shards"] == 4
    rng = load_file(ckpt / "rng.safetensors")
    assert set(rng) == {"train", "torch"} | {f"{s}.{c}" for s in ("train", "torch") for c in (1, 2, 3)}
    # chunk streams are distinct (a chunk that reused another's generator would repeat its noise)
    assert len({bytes(rng[k].numpy()) for k in rng if k.startswith("train")}) == 4
    assert (equal_run / "ddp_mlp" / "final" / "config.json").is_file()


def test_kill_and_resume_under_ddp_equals_an_uninterrupted_run(killed_run, equal_run):
    out, killed, steps_on_disk, resumed = killed_run
    assert [r.returncode for r in killed] == [17, 17], [r.stderr[-2000:] for r in killed]
    assert steps_on_disk == [20]  # killed at step 25: the newest complete checkpoint is step 20
    _check_ok(resumed)
    uninterrupted = load_file(equal_run / "dit_rank0.safetensors")
    for r in range(2):
        # it continued from step 20 (not from scratch), with a model built from another seed
        assert json.loads((out / f"resumed_rank{r}.json").read_text())["steps_run"] == list(range(21, 51))
        assert _bit_equal(load_file(out / f"resumed_rank{r}.safetensors"), uninterrupted), f"rank {r}"


def test_bad_calls_raise_on_every_rank(killed_run):
    out, _, _, resumed = killed_run
    _check_ok(resumed)  # every case raised and was caught: nobody hung
    seen = [json.loads((out / f"errors_rank{r}.json").read_text()) for r in range(2)]
    for rank, errors in enumerate(seen):
        assert all(v.startswith("ValueError") for v in errors.values()), (rank, errors)
        assert "different arguments (config: ranks [0] vs [1])" in errors["config_differs"]
        assert "x: ranks [0] vs [1]" in errors["data_differs"]
        assert "batch_size (15) must be divisible by data_shards (2" in errors["batch_not_divisible"]
        assert "data_shards (3) must be a multiple of the number of processes (2)" in errors["shards_not_multiple"]


def test_resume_with_another_world_size_is_an_error(killed_run):
    out = killed_run[0]
    w = _load_worker()
    with pytest.raises(ValueError, match=r"written by a run on 2 process\(es\) but this run has 1"):
        train(w.dit_model(), w.dit_data(), w.dit_config(checkpoint_every=10), out / "split", resume=True,
              progress=False, dist=SINGLE)


def test_shard_arguments_are_checked():
    with pytest.raises(ValueError, match=r"batch_size \(10\) must be divisible by data_shards \(4\)"):
        TrainConfig(batch_size=10, data_shards=4)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="data_shards must be an integer >= 1 or None"):
            TrainConfig(data_shards=bad)
    with pytest.raises(ValueError, match=r"batch_size \(10\) must be divisible by data_shards \(4, the number of "):
        resolve_shards(None, 10, 4)
    with pytest.raises(ValueError, match=r"data_shards \(6\) must be a multiple of the number of processes \(4\)"):
        resolve_shards(6, 12, 4)
    assert resolve_shards(None, 12, 3) == 3 and resolve_shards(6, 12, 3) == 6
    assert local_chunks(6, DistContext(rank=1, world=3)) == [1, 4] and local_chunks(4, SINGLE) == [0, 1, 2, 3]


def test_cli_train_under_two_ranks_rank0_speaks_and_equals_one_process(run_ranks, tmp_path):
    pytest.importorskip("steerdiff.data.toy2d")
    recipe = {
        "name": "tiny",
        "data": {"name": "toy2d:moons", "n": 256, "seed": 0},
        "model": {"class": "EDMPrecond", "config": {"sigma_data": 0.5, "net": {
            "class": "MLP", "config": {"dim": 2, "hidden": [16], "num_classes": None, "fourier_dim": 8}}}},
        "train": {"steps": 6, "batch_size": 64, "checkpoint_every": 3, "log_every": 3, "p_uncond": 0.0},
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(recipe))
    ranks = run_ranks([sys.executable, "-m", "steerdiff.app.cli", "train", str(path), "--out", str(tmp_path / "ddp"),
                          "--no-progress"], world=2, timeout=120,
                      before=lambda: shutil.rmtree(tmp_path / "ddp", ignore_errors=True))
    _check_ok(ranks)
    assert "trained 6 steps" in ranks[0].stdout and ranks[1].stdout == ""
    state = json.loads((latest_checkpoint(tmp_path / "ddp") / "state.json").read_text())
    assert state["world"] == 2 and state["config"]["data_shards"] == 2

    from steerdiff.app.cli import main

    res = CliRunner().invoke(main, ["train", str(path), "--out", str(tmp_path / "one"), "--no-progress", "--set",
                                    "data_shards=2"])
    assert res.exit_code == 0, res.output
    ddp, one = (load_file(next((tmp_path / d / "final").glob("*.safetensors"))) for d in ("ddp", "one"))
    assert _rel(ddp, one) <= TOL
