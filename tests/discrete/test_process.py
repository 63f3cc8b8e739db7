"""Forward processes and reverse steps against closed forms: marginals, Bayes' rule by enumeration."""

import pytest
import torch

import steerdiff.discrete as dd


@pytest.mark.parametrize("name", ["absorbing", "uniform", "marginal"])
@pytest.mark.parametrize("schedule", ["linear", "cosine", "loglinear"])
def test_posterior_is_bayes_rule_over_x0(name, schedule):
    # p(x_s | x_t) must equal sum_x0 p0(x0) q(x_t | x_s) q(x_s | x0) / q(x_t | x0), computed here by brute force.
    k = 3
    proc = dd.make_process(name, k, schedule=schedule, **({"pi": [0.5, 0.3, 0.2]} if name == "marginal" else {}))
    g = torch.Generator().manual_seed(0)
    t, s = 0.7, 0.3
    qs, qt = proc.transition(s), proc.transition(t)  # [K, S]
    a = proc.alpha(t) / proc.alpha(s)
    q_st = a * torch.eye(proc.num_states, dtype=torch.float64) + (1 - a) * proc.m[None]  # [S, S]: x_s -> x_t
    for i in range(proc.num_states):
        p0 = torch.rand(k, generator=g, dtype=torch.float64)
        if proc.absorbing and i < k:
            p0 = torch.nn.functional.one_hot(torch.tensor(i), k).double()  # carry-over: x0 = x_t when unmasked
        p0 = p0 / p0.sum()
        ref = sum(p0[x0] * q_st[:, i] * qs[x0] / qt[x0, i] for x0 in range(k) if qt[x0, i] > 0)
        got = proc.posterior(torch.tensor([[i]]), p0[None, None], t, s)[0, 0]
        torch.testing.assert_close(got.double(), ref / ref.sum(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["absorbing", "uniform"])
def test_noise_draws_the_forward_marginal(name):
    proc = dd.make_process(name, 3, schedule="cosine")
    n, t = 40000, 0.6
    x0 = torch.full((n, 1), 1, dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    xt = proc.noise(x0, t, torch.rand(n, 1, generator=g), torch.rand(n, 1, generator=g))
    freq = torch.bincount(xt.flatten(), minlength=proc.num_states).double() / n
    torch.testing.assert_close(freq, proc.transition(t)[1], atol=0.01, rtol=0)


def test_schedules_invert_and_registries_name_the_choices():
    for name in dd.SCHEDULES.names():
        sch = dd.make_schedule(name)
        assert sch.alpha(0.0) == pytest.approx(1.0)
        for t in (0.1, 0.5, 0.9):
            assert sch.t_of_alpha(sch.alpha(t)) == pytest.approx(t)
    assert {"absorbing", "uniform", "marginal"} <= set(dd.PROCESSES.names())
    with pytest.raises(ValueError, match="process must be one of"):
        dd.make_process("gaussian", 3)
    with pytest.raises(ValueError, match="pi"):
        dd.make_process("marginal", 3, pi=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="num_classes"):
        dd.make_process("uniform", 1)


def test_table_denoiser_is_the_enumerated_posterior():
    # At t -> 0 under the absorbing process with nothing masked, p(x0 | x_t) is x_t itself; all masked: the marginals.
    proc = dd.make_process("absorbing", 3, schedule="linear")
    tab = dd.random_table(3, 3, seed=0)
    model = dd.TableModel(tab, 3, proc)
    seqs = dd.all_sequences(3, 3)
    p = model(torch.full((1, 3), 3), torch.tensor([1.0]))[0]
    marg = torch.stack([torch.stack([tab[seqs[:, pos] == v].sum() for v in range(3)]) for pos in range(3)])
    torch.testing.assert_close(p, marg)
    p = model(seqs[5:6], torch.tensor([0.5]))[0]
    torch.testing.assert_close(p, torch.nn.functional.one_hot(seqs[5], 3).double())
