"""Exact checks against Gaussian-mixture posteriors (docs/methods/inverse.md, "Exact-posterior checks"): G1, G2,
and the chi-square check of the measurement residual.

Measured with this code (see benchmarks/inverse.py for the full tables):

* G1 passes every rule (lr 0.25): DR mean-err 0.697 / TV 0.214 / diversity 0.29; HR 0.123 / 0.070 / 0.75; best
  DPS (s=0.2) 0.141 / 0.049, SW2 0.350 vs HR 0.312.
* G2 does **not** reproduce its first calibration (docs/methods/inverse.md, "Findings and amendments") on our
  draws of its problem (DR 0.31 / 0.11, HR 0.26 / 0.11 over seeds 0-5: ratio 0.86 / 0.96, rule <= 0.75; over 26
  seeds HR and DR are on a par). Most of these posteriors are unimodal (top component weight >= 0.97 for 16 of 26
  seeds), which cannot give the calibration's DR TV of 0.39-0.45, so the calibrated problems were not the ones the
  description gives. Kept as a strict xfail. Drawing ``x*`` from ``N(0, 4 I)`` instead of the prior
  (``g2_problem(..., x_star="wide")``, a benchmark diagnostic) moves DR into the calibrated range (0.82 / 0.34 on
  seeds 0-5) but not DPS (0.91 / 0.31 against the calibrated 0.21-0.23 / 0.04-0.06), so that is not the calibrated
  problem either, nor is any of eight other readings of the description (``V.G2_READINGS``:
  ``benchmarks/inverse.py --only g2-readings``); across them HR/DR mean-err stays in 0.75-0.98.
* Chi-square is a report, not a gate (DR, CR and HR never read sigma_y; DPS keeps it as a report too): exact
  posterior samples give 1.00 (closed form 0.999 on these 100 measurements); DR 0.14, CR 0.0004, HR 0.05 at the
  API's defaults (they interpolate the noisy data: sigma_y never enters their loss, as in the published code), DPS
  s=0.2 2.8 (its normalised step keeps a residual of the order of the step). ``test_chi2_direction_of_each_method``
  checks the direction; ``benchmarks/inverse.py`` prints the report.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols import inverse as V


@pytest.fixture(scope="module")
def g1_table():
    return V.run_suite(V.g1_problems(), V.g1_configs(lr=0.25))


def _fails(criteria):
    return {k: (round(v, 4), round(b, 4)) for k, (v, b, ok) in criteria.items() if not ok}


def test_g1_hr_beats_dr_keeps_diversity_and_is_within_10pc_of_tuned_dps(g1_table):
    crit = V.g1_criteria(g1_table, lr=0.25)
    assert not _fails(crit), _fails(crit)
    hr = g1_table["hr lr=0.25"]["mean"]
    assert hr["nfe"] == 100 and hr["nfe_vjp"] == 0 and g1_table["dps s=0.2"]["mean"]["nfe_vjp"] == 100


def test_g1_cr_is_diverse_and_lr_0p1_keeps_the_hr_over_dr_gap():
    table = V.run_suite(V.g1_problems(chains=500), {"dr": ("dr", {"lr": 0.1}), "hr": ("hr", {"lr": 0.1}),
                                                    "cr": ("cr", {"lr": 0.25})})
    dr, hr, cr = (table[k]["mean"] for k in ("dr", "hr", "cr"))
    assert hr["mean_err"] < 0.6 * dr["mean_err"] and hr["tv"] < 0.75 * dr["tv"]  # calibration run: ~2.5x at lr 0.1
    assert cr["diversity"] > 1.0 and cr["mean_err"] < 0.15  # calibration run: CR 0.077, diversity 1.36


@pytest.mark.xfail(strict=True, reason="G2's calibration does not reproduce: HR/DR = 0.86 (mean-err), 0.96 (TV) on "
                                       "seeds 0-5 of the problem as described; see the module docstring")
def test_g2_hr_at_most_three_quarters_of_dr():
    table = V.run_suite([V.g2_problem(s) for s in range(6)], V.g2_configs())
    assert all(ok for _, _, ok in V.g2_criteria(table).values()), V.g2_criteria(table)


def test_g2_runs_and_reports_dps():
    with pytest.raises(ValueError, match="x_star"):
        V.g2_problem(0, x_star="uniform")
    table = V.run_suite([V.g2_problem(s, chains=200) for s in range(2)], V.g2_configs())
    assert set(V.g2_criteria(table)) == {"HR mean_err <= 0.75 DR", "HR tv <= 0.75 DR"}
    assert all(table[k]["mean"]["nonfinite"] == 0 for k in table)


def test_g2_readings_change_only_what_they_name():
    text = V.g2_problem(3)
    same = V.g2_problem(3, mean_std=2.0, a_std=8**-0.5, noise_std=0.1)
    assert torch.equal(text.prior.means, same.prior.means) and torch.equal(text.operator.A, same.operator.A)
    assert torch.equal(text.y, same.y)
    # The same random draws, rescaled: the reading multiplies what it names and nothing else.
    wide_means = V.g2_problem(3, mean_std=4.0)
    torch.testing.assert_close(wide_means.prior.means, 2 * text.prior.means)
    assert torch.equal(wide_means.operator.A, text.operator.A)
    small_a = V.g2_problem(3, a_std=8**-0.5 / 2)
    torch.testing.assert_close(small_a.operator.A, text.operator.A / 2)
    squared = V.g2_problem(3, cov_squared=True)
    eig_text, eig_sq = (torch.linalg.eigvalsh(p.prior.covs) for p in (text, squared))
    torch.testing.assert_close(eig_sq, eig_text**2)
    assert V.g2_problem(3, noise_std=0.3).noise_std == 0.3
    assert V.g2_problem(3, m=1).y.shape == (1, 1)
    assert set(V.G2_CALIBRATION) == set(V.g2_configs())
    for name, overrides in V.G2_READINGS.items():
        assert V.g2_problem(0, chains=10, **overrides).prior.means.shape[0] == 4, name
    for bad in ({"mean_std": 0.0}, {"a_std": -1.0}, {"noise_std": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            V.g2_problem(0, **bad)


@pytest.fixture(scope="module")
def chi2_problem():
    return V.chi2_problem()[0]


def test_chi2_of_exact_posterior_samples_matches_the_noise_level(chi2_problem):
    lo, hi = V.CHI2_BAND
    assert lo < V.exact_chi2(chi2_problem, chains=4) < hi


def test_chi2_report_covers_every_method_against_the_exact_posteriors_own_value(chi2_problem):
    """Chi-square is a report for every method (DR/CR/HR never read sigma_y, DPS only through its step): the report
    names each method and the exact posterior's own value, in closed form and from exact samples through the same
    residual code as the methods; the two exact entries agree within their Monte Carlo error."""
    report = V.chi2_report(chi2_problem, V.CHI2_CONFIGS, chains=4)
    assert set(report) == {"exact", "exact samples", "ratio", *V.CHI2_CONFIGS}
    # 400 exact draws of chi2/dof (sd ~ sqrt(2 / m) = 0.71 each): the mean's standard error is ~0.035
    assert report["exact samples"] == pytest.approx(report["exact"], abs=5 * (2 / 4) ** 0.5 / 400**0.5)
    for label, (method, options) in V.CHI2_CONFIGS.items():
        res = sd.inverse.solve(chi2_problem.prior, chi2_problem.operator, chi2_problem.y, method, chains=4,
                               noise_std=chi2_problem.noise_std, generator=0, **options)
        direct = res.chi2(chi2_problem.operator, chi2_problem.y).mean()  # InverseResult's own residual
        assert report[label] == pytest.approx(float(direct), rel=1e-9)
        assert report["ratio"][label] == pytest.approx(report[label] / report["exact"])


@pytest.mark.parametrize("label", list(V.CHI2_CONFIGS))
def test_chi2_direction_of_each_method(chi2_problem, label):
    """What the methods do instead: DR/CR/HR over-fit the noisy measurement, DPS under-fits it."""
    method, options = V.CHI2_CONFIGS[label]
    chi2 = V.method_chi2(chi2_problem, method, chains=4, **options)
    assert (chi2 > 1.5) if method == "dps" else (chi2 < 0.3)
