"""The structured condition (TextCond) through the core guidance hook and the guiders.

Independent truths: CFG on a structured condition equals ``u + w (c - u)`` computed from two separate denoiser calls
(on the condition and on its null); ``w = 1`` is the conditional call; a row's result does not depend on the rest of
its batch (per-sample negative prompts stay with their sample); integer labels still go through unchanged.
"""

import pytest
import torch

import steerdiff as sd
from steerdiff.core.guided import GuidedDenoiser, cond_and_null
from steerdiff.core.sampling import check_sample_inputs
from steerdiff.pipelines import TextCond


def _cond(b=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = {"emb": torch.randn(b, 4, 2, generator=g), "pooled": torch.randn(b, 2, generator=g)}
    neg = {"emb": torch.randn(b, 4, 2, generator=g), "pooled": torch.randn(b, 2, generator=g)}
    return TextCond(pos, TextCond(neg))


class Recorder:
    """A denoiser whose output depends on the condition rows; records the conditions it was called with."""

    def __init__(self):
        self.calls = []

    def __call__(self, x, sigma, cond=None):
        self.calls.append(cond)
        shift = cond["emb"].mean(dim=(1, 2)) + cond["pooled"].sum(1)
        return x / (1 + sigma[:, None] ** 2) + shift[:, None]


def test_textcond_rows():
    c = _cond(3)
    assert c.batch_size == 3 and set(c) == {"emb", "pooled"}
    both = TextCond.cat([c, c.null_like()])
    assert both.batch_size == 6
    torch.testing.assert_close(both["emb"][3:], c.null["emb"])
    picked = c.index([2, 0, 2])
    torch.testing.assert_close(picked["pooled"], c["pooled"][[2, 0, 2]])
    torch.testing.assert_close(picked.null["pooled"], c.null["pooled"][[2, 0, 2]])
    tiled = c.repeat(2)
    torch.testing.assert_close(tiled["emb"][3:], c["emb"])
    assert c.repeat_interleave(2)["emb"].shape[0] == 6
    assert c.to(torch.float64)["emb"].dtype == torch.float64
    assert sd.core.denoiser.null_cond_like(c) is c.null


def test_textcond_gather_is_index_without_host_reads():
    """gather (the accelerator's per-step path of StructuredRows) selects the rows index selects, reading nothing."""
    from host_sync import HostSyncCounter

    c = _cond(3)
    rows = torch.tensor([2, 0, 2, 1])
    with HostSyncCounter() as counter:
        got = c.gather(rows)
    assert counter.reads == 0
    want = c.index(rows)
    for k in c:
        assert torch.equal(got[k], want[k]) and torch.equal(got.null[k], want.null[k])


def test_textcond_bad_input():
    with pytest.raises(ValueError, match="batch size"):
        TextCond({"a": torch.zeros(2, 3), "b": torch.zeros(3, 3)})
    with pytest.raises(TypeError, match="tensor"):
        TextCond({"a": [1, 2]})
    with pytest.raises(ValueError, match="structure"):
        TextCond({"a": torch.zeros(2, 3)}, TextCond({"a": torch.zeros(2, 4)}))
    with pytest.raises(ValueError, match="no null"):
        TextCond({"a": torch.zeros(2, 3)}).null_like()
    with pytest.raises(ValueError, match="rows must lie"):
        _cond(2).index([2])
    with pytest.raises(ValueError, match="one structure"):
        TextCond.cat([_cond(2), TextCond({"a": torch.zeros(2, 3)})])


def test_cond_and_null_stacks_one_doubled_batch():
    c, d = _cond(3), Recorder()
    x, s = torch.randn(3, 5), torch.full((3,), 2.0)
    d_c, d_u = cond_and_null(d, x, s, c)
    assert len(d.calls) == 1 and d.calls[0].batch_size == 6
    torch.testing.assert_close(d.calls[0]["emb"], torch.cat([c["emb"], c.null["emb"]]))
    torch.testing.assert_close(d_c, Recorder()(x, s, c))
    torch.testing.assert_close(d_u, Recorder()(x, s, c.null))


@pytest.mark.parametrize("make", [lambda w: sd.guidance.CFG(w), lambda w: sd.guidance.APG(w),
                                  lambda w: sd.guidance.CFGRescale(w, phi=0.7)])
def test_guiders_on_a_structured_condition(make):
    c, x, s = _cond(3), torch.randn(3, 5), torch.full((3,), 2.0)
    ref_c, ref_u = Recorder()(x, s, c), Recorder()(x, s, c.null)
    d = Recorder()
    out = GuidedDenoiser(d, make(2.5), c)(x, s)
    assert out.shape == x.shape
    assert len(d.calls) == 1 and d.calls[0].batch_size == 6  # one doubled batch: cond rows, then their nulls
    torch.testing.assert_close(d.calls[0]["pooled"], torch.cat([c["pooled"], c.null["pooled"]]))
    if isinstance(make(1.0), sd.guidance.CFG):
        torch.testing.assert_close(out, ref_u + 2.5 * (ref_c - ref_u))
    d1 = Recorder()
    torch.testing.assert_close(GuidedDenoiser(d1, make(1.0), c)(x, s), ref_c)  # w = 1: the conditional model


def test_cfg_on_a_structured_condition_is_batch_independent():
    # Each row's negative prompt (null) stays with its row: row i of a batch of 3 equals row i run alone.
    c, x, s = _cond(3), torch.randn(3, 5), torch.full((3,), 2.0)
    full = GuidedDenoiser(Recorder(), sd.guidance.CFG(3.0), c)(x, s)
    for i in range(3):
        alone = GuidedDenoiser(Recorder(), sd.guidance.CFG(3.0), c.index([i]))(x[i:i + 1], s[i:i + 1])
        torch.testing.assert_close(full[i:i + 1], alone)


def test_sample_accepts_a_structured_condition_and_checks_its_rows():
    c = _cond(2)
    noise = torch.randn(2, 5)
    out = sd.sample(Recorder(), noise, sd.sigmas.karras(3), method="euler", cond=c, guidance=sd.guidance.CFG(2.0))
    assert out.shape == noise.shape and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="3 rows"):
        check_sample_inputs(Recorder(), noise, _cond(3))
    with pytest.raises(ValueError, match="integer tensor"):
        check_sample_inputs(Recorder(), noise, torch.zeros(2))  # float tensors are still refused
