"""Discrete samplers reproduce an exact table (total variation at Monte Carlo error), cost what they say, and keep
per-row randomness, device and dtype discipline."""

import pytest
import torch

import steerdiff.discrete as dd

L, K, N = 4, 3, 12000
TABLE = dd.random_table(L, K, seed=1)  # 81 sequences, strongly dependent positions


def _tv(proc, method, steps, n=N, seed=0):
    model = dd.TableModel(TABLE, L, proc)
    x, stats = dd.sample(model, proc, steps, shape=(n, L), method=method,
                         generator=torch.Generator().manual_seed(seed), return_stats=True)
    assert stats.nfe == dd.nfe_of(method, L, steps)
    return dd.total_variation(dd.empirical(x, K), TABLE)


FLOOR = dd.tv_floor(TABLE, N, quantile=0.999)  # the TV an exact sampler of N draws exceeds 1 time in 1000


@pytest.mark.parametrize("schedule", ["linear", "loglinear", "cosine"])
def test_one_token_per_step_unmasking_is_exact(schedule):
    assert _tv(dd.make_process("absorbing", K, schedule=schedule), "unmask", L) < FLOOR


def test_many_step_ancestral_reproduces_the_table_and_few_steps_do_not():
    absorbing = dd.make_process("absorbing", K, schedule="linear")
    uniform = dd.make_process("uniform", K, schedule="cosine")
    n = 6000
    floor = dd.tv_floor(TABLE, n, quantile=0.999)
    assert _tv(uniform, "ancestral", 64, n) < floor  # its exact law is 0.008 from the table (ancestral_law)
    # The factorised reverse step is wrong when several positions move at once: a control that the check can fail.
    assert _tv(absorbing, "ancestral", 2, n) > 3 * floor
    assert _tv(absorbing, "unmask", 1, n) > 3 * floor


def test_maskgit_reveals_on_its_cosine_schedule_and_fills_every_mask():
    proc = dd.make_process("absorbing", K, schedule="linear")
    grid = dd.SAMPLERS.get("maskgit").grid(proc, 16, 4)
    assert [st.reveal for st in grid] == [16 - 14, 14 - 11, 11 - 6, 6]  # floor(16 cos(pi i / 8))
    x = dd.sample(dd.TableModel(TABLE, L, proc), proc, 3, shape=(50, L), method="maskgit", generator=0)
    assert bool((x < K).all())


def test_rows_do_not_depend_on_the_batch():
    proc = dd.make_process("uniform", K, schedule="cosine")
    model = dd.TableModel(TABLE, L, proc)
    for method, p in (("ancestral", proc), ("unmask", dd.make_process("absorbing", K))):
        m = dd.TableModel(TABLE, L, p)
        big = dd.sample(m, p, 4, shape=(5, L), method=method, generator=[10, 11, 12, 13, 14])
        small = dd.sample(m, p, 4, shape=(2, L), method=method, generator=[12, 13])
        assert torch.equal(big[2:4], small)
    del model


def test_infilling_keeps_the_given_tokens():
    proc = dd.make_process("absorbing", K, schedule="linear")
    n = 6000
    x = torch.tensor([[0, K, 2, K]] * n)
    out = dd.sample(dd.TableModel(TABLE, L, proc), proc, 4, x=x, method="unmask",
                    generator=torch.Generator().manual_seed(7))
    assert bool((out[:, [0, 2]] == x[:, [0, 2]]).all()) and bool((out < K).all())
    # The filled-in positions follow the table conditioned on the given tokens.
    seqs = dd.all_sequences(L, K)
    cond = TABLE * ((seqs[:, 0] == 0) & (seqs[:, 2] == 2))
    cond = cond / cond.sum()
    assert dd.total_variation(dd.empirical(out, K), cond) < dd.tv_floor(cond, n, 0.999)


def test_probabilities_in_half_precision_and_bad_input():
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(TABLE, L, proc, dtype=torch.bfloat16)
    x = dd.sample(model, proc, 4, shape=(8, L), method="ancestral", generator=0)
    assert x.dtype == torch.long and bool((x < K).all())
    with pytest.raises(ValueError, match="absorbing"):
        dd.sample(model, dd.make_process("uniform", K), 4, shape=(2, L), method="unmask")
    with pytest.raises(ValueError, match=r"\[B, L, K\].*step 0"):
        dd.sample(lambda x, t, c: x.float(), proc, 4, shape=(2, L))
    with pytest.raises(ValueError, match="method must be one of"):
        dd.sample(model, proc, 4, shape=(2, L), method="euler")
    with pytest.raises(ValueError, match="steps"):
        dd.sample(model, proc, 0, shape=(2, L))


@pytest.mark.parametrize("name,schedule", [("uniform", "cosine"), ("absorbing", "linear")])
def test_ancestral_sampler_follows_its_enumerated_law_which_converges_to_the_table(name, schedule):
    proc = dd.make_process(name, K, schedule=schedule)
    model = dd.TableModel(TABLE, L, proc)
    laws = {s: dd.ancestral_law(model, proc, s) for s in (4, 16, 64)}
    tvs = [dd.total_variation(laws[s], TABLE) for s in (4, 16, 64)]
    assert tvs[0] > 0.05 and tvs[2] < tvs[1] < tvs[0] and tvs[2] < tvs[0] / 8  # O(1/steps)
    # The Monte Carlo sampler at 4 steps (far from the table) draws that exact law.
    x = dd.sample(model, proc, 4, shape=(N, L), method="ancestral", generator=torch.Generator().manual_seed(2))
    assert dd.total_variation(dd.empirical(x, K), laws[4]) < dd.tv_floor(laws[4], N, 0.999)


def test_maskgit_with_random_order_is_exact_and_greedy_order_is_not():
    # With choice noise dominating the confidence the reveal order is uniform: one per step is the exact chain again.
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(TABLE, L, proc)
    tvs = []
    for temp in (1e6, 0.0):
        x = dd.sample(model, proc, L, shape=(N, L), method="maskgit", choice_temperature=temp,
                      generator=torch.Generator().manual_seed(4))
        tvs.append(dd.total_variation(dd.empirical(x, K), TABLE))
    assert tvs[0] < FLOOR < tvs[1]


def test_logits_networks_and_bad_probabilities():
    proc = dd.make_process("uniform", K, schedule="cosine")
    model = dd.TableModel(TABLE, L, proc)
    net = dd.from_logits(lambda x, t, c: model(x, t, c).log().half())  # fp16 logits
    torch.testing.assert_close(net(torch.zeros(2, L, dtype=torch.long), torch.ones(2)).double(),
                               model(torch.zeros(2, L, dtype=torch.long), torch.ones(2)), atol=2e-3, rtol=0)
    x = dd.sample(net, proc, 8, shape=(4, L), generator=0)
    assert x.dtype == torch.long and bool((x < K).all())

    def broken(x, t, c):
        p = model(x, t, c)
        return p * float("nan") if float(t[0]) < 0.6 else p

    with pytest.raises(FloatingPointError, match="step 2"):
        dd.sample(broken, proc, 4, shape=(2, L), generator=0)


@pytest.mark.parametrize("power", [0.3, 4.0])
def test_time_power_sampler_draws_the_enumerated_law_of_its_distorted_grid(power):
    """``time_power`` moves the ancestral grid's times to ``(1 - i / steps) ** power`` (DeFoG's time distortion):
    the Monte Carlo sampler draws the law enumerated on that grid, not the equal-step one, and the distorted grid
    still converges to the table as the steps grow."""
    from steerdiff.discrete.sampling import ancestral_grid

    proc = dd.make_process("uniform", K, schedule="cosine")
    grid = ancestral_grid(proc, L, 3, time_power=power)
    assert [st.t for st in grid] == pytest.approx([(1 - i / 3) ** power for i in range(3)])
    assert [st.s for st in grid] == pytest.approx([(1 - (i + 1) / 3) ** power for i in range(3)])
    assert ancestral_grid(proc, L, 3, 1.0) == ancestral_grid(proc, L, 3)
    model = dd.TableModel(TABLE, L, proc)
    law, equal = dd.ancestral_law(model, proc, 3, time_power=power), dd.ancestral_law(model, proc, 3)
    floor = dd.tv_floor(law, N, quantile=0.999)
    x, stats = dd.sample(model, proc, 3, shape=(N, L), method="ancestral", time_power=power,
                         generator=torch.Generator().manual_seed(5), return_stats=True)
    emp = dd.empirical(x, K)
    assert dd.total_variation(emp, law) < floor
    assert dd.total_variation(emp, equal) > floor  # the equal-step law is 0.11-0.15 away: the check can fail
    assert stats.nfe == 3 and [st.t for st in stats.grid] == [st.t for st in grid]
    tvs = [dd.total_variation(dd.ancestral_law(model, proc, s, time_power=power), TABLE) for s in (4, 64)]
    assert tvs[1] < tvs[0] / 4 and tvs[1] < 0.05  # 16x the steps: 0.27 -> 0.046 at 0.3, 0.20 -> 0.015 at 4


def test_time_power_refuses_bad_values_and_the_unmasking_samplers():
    proc = dd.make_process("absorbing", K, schedule="linear")
    model = dd.TableModel(TABLE, L, proc)
    for bad in (0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ValueError, match="time_power"):
            dd.sample(model, proc, 4, shape=(2, L), method="ancestral", time_power=bad)
    for method in ("unmask", "maskgit"):
        with pytest.raises(ValueError, match="time_power applies to the 'ancestral'"):
            dd.sample(model, proc, 4, shape=(2, L), method=method, time_power=2.0)
    dd.sample(model, proc, 4, shape=(2, L), method="unmask", time_power=1.0)  # 1 is every grid's own
