"""Sharded SMC on two gloo processes: DAS, TDS, FK steering, best-of-N and online DAS give bit-identical results
to the one-process run (the reference is computed in each worker, in the same process and thread count), with and
without resampling at every step, with particles that move between ranks, with a particle that goes non-finite on
one rank; bad input raises on every rank; a rank that dies makes the other raise instead of hanging.

The workers are ``shard_worker.py`` (beside this file), started by ``launch_ranks`` (``tests/conftest.py``).
"""

import json
import re
import sys
from pathlib import Path

import pytest

from steerdiff.align.shard import ParticleShard, choose_layout
from steerdiff.distributed import SINGLE, DistContext

WORKER = Path(__file__).with_name("shard_worker.py")


def _launch(run_ranks, tmp_path, modes, timeout=150, env=None):
    ranks = run_ranks([sys.executable, str(WORKER), str(tmp_path), modes], world=2, timeout=timeout, env=env,
                      fresh=tmp_path)
    return ranks, [json.loads((tmp_path / f"rank{r}.json").read_text()) if (tmp_path / f"rank{r}.json").exists()
                   else None for r in range(2)]


@pytest.fixture(scope="module")
def results(run_ranks, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    ranks, res = _launch(run_ranks, out, "smc,unet,online,errors")
    for r in ranks:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{r.stderr[-3000:]}"
    return res


def _unequal(case):
    return [name for name, same in case["equal"].items() if not same]


def test_sharded_smc_is_bit_identical_to_one_process(results):
    for rank_result in results:
        cases = rank_result["smc"]
        # P = 8 and 16, resampling when the ESS falls and at every step, DAS (both proposals) and FK steering
        for p in (8, 16):
            for thr in (0.5, 1.0):
                for name in (f"das_P{p}_thr{thr}", f"das_grad_P{p}_thr{thr}", f"fk_P{p}_thr{thr}"):
                    assert cases[name]["layout"] == "particles"
                    assert _unequal(cases[name]) == [], (name, cases[name])
        for name, case in cases.items():
            assert _unequal(case) == [], (name, case)
        assert cases["das_G4_auto"]["layout"] == "groups"
        assert cases["das_G4_particles"]["layout"] == "particles"
        for name in ("das_flow_sde_G2_particles", "fk_flow_sde_G2_particles"):  # flow SDE moves; NFE per output
            assert cases[name]["layout"] == "particles" and cases[name]["nfe"][0] == 8 * 12, (name, cases[name])


def test_resampling_moves_particles_between_ranks_and_stays_identical(results):
    for rank_result in results:
        for name in ("das_P16_multinomial_moves", "fk_P16_multinomial_moves"):
            case = rank_result["smc"][name]
            assert _unequal(case) == []
            comm = case["comm"]
            assert comm["moved_bytes"] > 0, comm
            # what moves is a share of the population's state; the gathered scalars are reported beside it
            assert comm["moved_bytes_per_step"] < comm["state_bytes"], comm
        # a whole-group layout never moves a particle
        assert rank_result["smc"]["das_G4_auto"]["comm"]["moved_bytes"] == 0


def test_a_particle_nonfinite_on_one_rank_is_killed_identically(results):
    for rank_result in results:
        for name in ("das_nonfinite_on_rank1", "das_grad_nonfinite_on_rank1"):
            case = rank_result["smc"][name]
            assert case["killed"] >= 1, case
            assert _unequal(case) == [], case


def test_unet_identical_when_micro_batches_align(results):
    for rank_result in results:
        cases = rank_result["unet"]
        assert _unequal(cases["unet_das_particles_b4"]) == []
        assert _unequal(cases["unet_das_groups_b8"]) == []
        # With micro-batches of 512 the one process evaluates 16 rows at once and each rank 8: the network's
        # rounding depends on the batch size, so the results agree closely but need not be bitwise equal.
        diff = cases["unet_das_particles_b512"]["max_abs"]
        assert all(v < 1e-4 for v in diff.values()), diff


def test_online_das_sharded(results):
    for rank_result in results:
        assert _unequal(rank_result["online"]["online_das"]) == []


def test_bad_input_raises_the_same_error_on_every_rank(results):
    errs = [{k: re.sub(r"this is rank \d", "this is rank N", v) for k, v in r["errors"].items()} for r in results]
    assert errs[0] == errs[1]
    e = errs[0]
    assert e["indivisible"].startswith("ValueError") and "divides neither" in e["indivisible"]
    assert "different arguments (alpha" in e["disagree"]
    assert "generator must be an int seed" in e["no_generator"]
    assert "shard_by must be one of" in e["bad_layout"]


def test_a_dead_rank_makes_the_others_raise(run_ranks, tmp_path):
    ranks, res = _launch(run_ranks, tmp_path, "dies", timeout=90, env={"SD_TEST_TIMEOUT": "30"})
    assert ranks[1].returncode == 17
    assert ranks[0].returncode == 0, ranks[0].stderr[-2000:]
    assert res[0]["dies"]["raised"] == "DistributedError", res[0]
    assert ranks[0].seconds < 60


# ------------------------------------------------------------------------------------------------ layouts (no group)
def test_layouts_partition_the_rows():
    for world in (2, 4):
        for groups, particles in ((4, 8), (1, 8), (3, 4)):
            layout = choose_layout(world, groups, particles)
            shards = [ParticleShard(DistContext(rank=r, world=world), groups, particles) for r in range(world)]
            rows = sorted(int(i) for s in shards for i in s.rows)
            assert rows == list(range(groups * particles)), (world, groups, particles)
            assert all(s.layout == layout for s in shards)
            if layout == "groups":  # whole groups per rank
                assert all(len({int(i) // particles for i in s.rows}) == groups // world for s in shards)


def test_chunks_follow_the_global_cut():
    shard = ParticleShard(DistContext(rank=1, world=2), 2, 8, "particles")  # rows 4-7 and 12-15
    assert [(c.start, c.stop) for c in shard.chunks(None)] == [(0, 4), (4, 8)]
    assert [(c.start, c.stop) for c in shard.chunks(2)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [(c.start, c.stop) for c in shard.chunks(512)] == [(0, 4), (4, 8)]
    single = ParticleShard(SINGLE, 2, 8)
    assert [(c.start, c.stop) for c in single.chunks(6)] == [(0, 6), (6, 12), (12, 16)]


def test_layout_errors():
    with pytest.raises(ValueError, match="divides neither"):
        choose_layout(2, 3, 5)
    with pytest.raises(ValueError, match="shard_by='groups' needs"):
        choose_layout(2, 3, 4, "groups")
    with pytest.raises(ValueError, match="shard_by must be one of"):
        choose_layout(2, 2, 2, "rows")


def test_same_batches_says_when_micro_batches_match_one_process():
    def both(groups, particles, layout, b):
        return [ParticleShard(DistContext(rank=r, world=2), groups, particles, layout).same_batches(b)
                for r in range(2)]

    assert both(2, 8, "particles", 4) == [True, True]  # rows 0-3 | 4-7 per group: whole one-process batches
    assert both(2, 8, "particles", 8) == [False, False]  # one process batches 8 rows, a rank holds 4 of them
    assert both(4, 8, "groups", 16) == [True, True]
    assert both(4, 8, "groups", 512) == [False, False]
    assert ParticleShard(SINGLE, 2, 8).same_batches(3)
