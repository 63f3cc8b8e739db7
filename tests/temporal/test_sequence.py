"""All-at-once sequence generation (steerdiff.temporal.generate, steerdiff.models.sequence) and its autoregressive
baseline: invariants of the relative-position denoiser, the generators' contracts, training resume, bad input."""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
from steerdiff.models.sequence_attention import (
    band_attention,
    blocked_attention,
    dense_band_attention,
    global_context_bias,
    local_band_attention,
    local_band_bias,
)
from steerdiff.temporal import SequenceCond, generate_autoregressive, generate_sequence, sequence_model
from steerdiff.temporal.sequence_train import SequenceTrainConfig, train_sequence, training_batch

TINY = {"width": 16, "depth": 2, "heads": 2, "window": 3, "fourier_dim": 8}


def _random_model(seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny model with every weight random (the zero-initialised adaLN and output layers too, else D = c_skip x)."""
    torch.manual_seed(seed)
    model = sequence_model(**{**TINY, **kw}).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def _inputs(b: int, s: int, seed: int = 1, k: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, s, 2, generator=g, dtype=torch.float64)
    sig = torch.randn(b, s, 2, generator=g, dtype=torch.float64)
    ctx = torch.randn(b, k, 2, generator=g, dtype=torch.float64) if k else None
    return x, sig, ctx


def test_denoiser_is_shift_equivariant_away_from_the_ends():
    model = _random_model()
    reach = model.net.receptive_field  # depth * window = 6
    x, sig, _ = _inputs(2, 40)
    sigma = torch.tensor([0.7, 3.0], dtype=torch.float64)
    with torch.no_grad():
        a = model(x[:, 0:30], sigma, SequenceCond(sig[:, 0:30]))  # absolute frames 0..29
        b = model(x[:, 10:40], sigma, SequenceCond(sig[:, 10:40]))  # absolute frames 10..39
    inner = slice(10 + reach, 30 - reach)  # frames at least `reach` from both ends of both windows
    torch.testing.assert_close(a[:, inner], b[:, inner.start - 10:inner.stop - 10], rtol=0, atol=1e-12)
    # Next to an end the two windows see different neighbourhoods, so the check above is not vacuous.
    assert (a[:, 10] - b[:, 0]).abs().max() > 1e-3


def test_receptive_field_is_depth_times_window():
    model = _random_model()
    reach = model.net.receptive_field
    x, sig, _ = _inputs(1, 30)
    t = 12
    with torch.no_grad():
        base = model(x, 1.0, SequenceCond(sig))
        far, near = x.clone(), x.clone()
        far[:, t + reach + 1] += 1.0
        near[:, t + reach] += 1.0
        assert torch.equal(model(far, 1.0, SequenceCond(sig))[:, t], base[:, t])
        assert (model(near, 1.0, SequenceCond(sig))[:, t] - base[:, t]).abs().max() > 1e-6


@pytest.mark.parametrize("n, window, block", [(1, 1, None), (7, 3, None), (40, 3, 4), (41, 5, 5), (100, 8, None),
                                              (50, 16, 16), (300, 2, None), (45, 6, 2), (30, 4, 1)])
def test_block_local_attention_equals_the_masked_dense_one(n, window, block):
    """Blocks of ``block`` tokens scoring the ``block + 2 window`` keys around them = the full masked n x n attention,
    at lengths that are and are not multiples of the block, at sequences shorter than one block and at blocks
    shorter than the window."""
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(3, 2 * window + 1, generator=g, dtype=torch.float64)
    dense = dense_band_attention(q, k, v, bias, window)
    torch.testing.assert_close(local_band_attention(q, k, v, bias, window, block), dense, rtol=0, atol=1e-12)
    torch.testing.assert_close(band_attention(q, k, v, bias, window), dense, rtol=0, atol=1e-12)


def test_block_local_attention_bounds_the_reach_by_the_window():
    """A key just past the window changes nothing, one at the window's edge does (at a length that takes the block
    path)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 400, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(2, 2 * 5 + 1, generator=g, dtype=torch.float64)
    base = local_band_attention(q, k, v, bias, 5)
    for j, moves in ((206, False), (205, True), (195, True), (194, False)):
        v2 = v.clone()
        v2[:, :, j] += 1.0
        changed = (local_band_attention(q, k, v2, bias, 5)[:, :, 200] - base[:, :, 200]).abs().max() > 1e-9
        assert bool(changed) == moves, j
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="block"):
            local_band_attention(q, k, v, bias, 5, block=bad)


@pytest.mark.parametrize("n, k, window, block", [(7, 3, 3, 16), (40, 4, 3, 4), (41, 5, 5, 5), (132, 4, 8, 16),
                                                 (300, 4, 2, 16), (5, 4, 8, 16), (50, 20, 8, 16), (33, 1, 2, 3)])
def test_block_local_global_context_attention_equals_the_masked_dense_one(n, k, window, block):
    """With ``k`` global context tokens in front (also more than the window, so that context queries meet the band
    among themselves), the blocks' window keys plus the context keys = the dense attention of global_context_bias."""
    g = torch.Generator().manual_seed(n + k)
    q, kk, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for _ in range(3))
    rel, ctx = torch.randn(3, 2 * window + 1, generator=g, dtype=torch.float64), torch.randn(3, generator=g,
                                                                                            dtype=torch.float64)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, kk, v, attn_mask=global_context_bias(n, k, window, rel, ctx)[None])
    local = blocked_attention(q, kk, v, local_band_bias(n, window, block, rel, k, ctx), window, block, k)
    torch.testing.assert_close(local, dense, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="bias must end in"):  # a bias made for no context
        blocked_attention(q, kk, v, local_band_bias(n, window, block, rel), window, block, k)


def test_gradients_through_the_block_local_form_equal_the_dense_ones():
    """Padding rows of the last block see every key (no all ``-inf`` row, so no NaN enters the backward pass): the
    gradients of q, k, v and the bias table equal the dense form's, for a length that is not a multiple of the
    block."""
    g = torch.Generator().manual_seed(3)
    leaves = [torch.randn(2, 2, 37, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    rel = torch.randn(2, 2 * 3 + 1, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 2, 37, 4, generator=g, dtype=torch.float64)
    grads = []
    for attend in (dense_band_attention, local_band_attention):
        (attend(*leaves, rel, 3) * weight).sum().backward()
        grads.append([t.grad.clone() for t in (*leaves, rel)])
        for t in (*leaves, rel):
            t.grad = None
    for dense, local in zip(*grads, strict=True):
        assert torch.isfinite(local).all()
        torch.testing.assert_close(local, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("global_context, frames", [(False, 30), (True, 30), (False, 250), (True, 250)])
def test_kept_attention_bias_is_rebuilt_when_the_weights_change(global_context, frames):
    """Without gradient the attention bias is kept between calls; an optimizer step or load_state_dict (in place)
    must rebuild it: outputs then equal those of a fresh copy of the new weights, for the dense and block-local
    forms."""
    import copy

    model = _random_model(global_context=global_context)
    x, sig, ctx = _inputs(2, frames, k=3)
    cond = SequenceCond(sig, ctx)
    with torch.no_grad():
        before = model(x, 0.8, cond)
        assert torch.equal(model(x, 0.8, cond), before)  # the kept bias gives the same output
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x, 0.8, cond).square().mean().backward()  # with gradient: built afresh, in the graph
    assert all(b.rel_bias.grad.abs().max() > 0 for b in model.net.blocks)
    opt.step()
    with torch.no_grad():
        fresh = copy.deepcopy(model)
        fresh.net.blocks.apply(lambda m: m.__dict__.pop("_bias_cache", None))
        stepped = model(x, 0.8, cond)
        assert (stepped - before).abs().max() > 1e-6
        torch.testing.assert_close(stepped, fresh(x, 0.8, cond), rtol=0, atol=0)
        other = _random_model(seed=5, global_context=global_context)
        model.load_state_dict(other.state_dict())
        torch.testing.assert_close(model(x, 0.8, cond), other(x, 0.8, cond), rtol=0, atol=0)


def test_long_sequences_take_the_block_path_with_the_same_output():
    """A model call on 400 frames (block-local attention inside) equals the dense computation of the same weights."""
    from unittest import mock

    import steerdiff.models.sequence as seq  # the module whose blocks call blocked_attention

    model = _random_model()
    x, sig, _ = _inputs(1, 400)

    def run(local, frames):
        """The model's output with ``local_attention`` set, and whether the block-local form ran."""
        model.net.local_attention = local  # an instance attribute: the class default stays
        with mock.patch.object(seq, "blocked_attention", wraps=seq.blocked_attention) as spy:
            out = model(x[:, :frames], 0.8, SequenceCond(sig[:, :frames]))
        return out, spy.called

    with torch.no_grad():
        fast, fast_local = run(None, 400)
        slow, slow_local = run(False, 400)
        short_local, forced = run(True, 40)
        short, short_default = run(None, 40)
    assert (fast_local, slow_local, forced, short_default) == (True, False, True, False)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-10)
    torch.testing.assert_close(short_local, short, rtol=0, atol=1e-10)


def test_context_frames_act_as_the_frames_just_before_the_sequence():
    model = _random_model()
    reach = model.net.receptive_field
    x, sig, ctx = _inputs(2, 20, k=3)
    with torch.no_grad():
        with_ctx = model(x, 1.0, SequenceCond(sig, ctx))
        changed = ctx.clone()
        changed[:, 0] += 1.0  # the earliest context frame sits at relative position -3 from frame 0
        moved = model(x, 1.0, SequenceCond(sig, changed))
    assert torch.equal(moved[:, reach - 3 + 1:], with_ctx[:, reach - 3 + 1:])  # beyond its reach: untouched
    assert (moved[:, 0] - with_ctx[:, 0]).abs().max() > 1e-6


def test_save_and_load_round_trip(tmp_path):
    model = _random_model().float()
    x, sig, ctx = (t.float() for t in _inputs(2, 9, k=2))
    sd.models.save(model, tmp_path / "m")
    loaded = sd.models.load(tmp_path / "m")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, 0.5, SequenceCond(sig, ctx)), model(x, 0.5, SequenceCond(sig, ctx)))


def test_generate_sequence_is_one_sampler_run_and_per_sample():
    model = _random_model().float()
    _, sig, ctx = (None if t is None else t.float() for t in _inputs(4, 11, k=2))
    with torch.no_grad():
        out, stats = generate_sequence(model, sig, ctx, steps=4, seed=3, return_stats=True)
        part = generate_sequence(model, sig[:2], ctx[:2], steps=4, seed=3)
    assert out.shape == (4, 11, 2) and stats["calls"] == 7  # heun: 2 evaluations per step, Euler on the last
    torch.testing.assert_close(out[:2], part, rtol=0, atol=1e-5)  # a sample does not depend on its batch


def _extrapolate(x, sigma, cond):
    """A denoiser that continues the last two context frames as a straight line (ignores x and the signal)."""
    last, step = cond.context[:, -1:], cond.context[:, -1:] - cond.context[:, -2:-1]
    return last + step * torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]


def test_autoregressive_chunks_condition_on_the_last_generated_frames():
    context = torch.tensor([[[0.0], [1.0], [2.0]]], dtype=torch.float64)  # frames ..., 0, 1, 2
    signal = torch.zeros(1, 17, 1, dtype=torch.float64)
    out, stats = generate_autoregressive(_extrapolate, signal, context, chunk=5, overlap=2, steps=3,
                                         return_stats=True)
    # Each chunk continues the line from the last two frames before it, so the whole output is 3, 4, ..., 19; a chunk
    # that read any other frames (the first context, its own noise) would break the line at a chunk border.
    torch.testing.assert_close(out[0, :, 0], torch.arange(3, 20, dtype=torch.float64), rtol=0, atol=1e-9)
    assert stats["calls"] == 4 * 5  # ceil(17 / 5) = 4 chunks of 5 evaluations (heun, 3 steps)


def test_autoregressive_chunks_see_their_own_signal_window_and_overlap_frames():
    seen = []

    def echo(x, sigma, cond):
        seen.append(cond.context.shape[1])
        return cond.signal.clone()

    signal = torch.randn(2, 13, 2, dtype=torch.float64)
    out = generate_autoregressive(echo, signal, torch.zeros(2, 6, 2, dtype=torch.float64), chunk=4, overlap=3, steps=2)
    torch.testing.assert_close(out, signal, rtol=0, atol=1e-12)
    assert set(seen) == {3}


def test_training_batches_share_one_stream_and_cut_true_windows():
    from steerdiff.data.driven import driven_batch

    aao = SequenceTrainConfig(mode="all_at_once", batch_size=3, min_length=5, max_length=9, context=2, chunk=4,
                              overlap=2)
    ar = SequenceTrainConfig(**{**aao.to_dict(), "mode": "autoregressive"})
    truth = driven_batch(3, 9, seed=0, start=3 * 7, context=2)  # step 7's samples
    x, cond = training_batch(aao, 7)
    s = x.shape[1]
    assert 5 <= s <= 9
    torch.testing.assert_close(x, truth.frames[:, 2:2 + s])
    torch.testing.assert_close(cond.context, truth.frames[:, :2])
    x, cond = training_batch(ar, 7)
    assert x.shape == (3, 4, 2) and cond.context.shape == (3, 2, 2)
    for row in range(3):  # the window and its context are consecutive frames of the same true trajectory
        window = torch.cat([cond.context[row], x[row]])
        starts = [o for o in range(9 + 2 - 6 + 1) if torch.equal(truth.frames[row, o:o + 6], window)]
        assert len(starts) == 1 and torch.equal(cond.signal[row], truth.signal[row, starts[0] + 2:starts[0] + 6])


def test_training_resumes_exactly(tmp_path):
    cfg = SequenceTrainConfig(steps=4, batch_size=4, max_length=20, checkpoint_every=2, warmup_steps=1)
    quiet = {"log": lambda *_: None}
    torch.manual_seed(0)
    whole = sequence_model(**TINY)
    train_sequence(whole, cfg, **quiet)
    torch.manual_seed(0)
    killed = sequence_model(**TINY)
    train_sequence(killed, cfg, tmp_path, stop_at=2, **quiet)  # a run stopped after its step-2 checkpoint
    torch.manual_seed(1)  # a new process: other initial weights, all replaced by the checkpoint
    again = sequence_model(**TINY)
    result = train_sequence(again, cfg, tmp_path, **quiet)
    assert result["resumed_from"] == 2 and result["steps"] == 4
    for a, b in zip(whole.state_dict().values(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="another config"):
        train_sequence(sequence_model(**TINY), SequenceTrainConfig(**{**cfg.to_dict(), "lr": 3e-4}), tmp_path, **quiet)



def test_training_on_marker_frames_records_the_system_and_refuses_another(tmp_path):
    """A system whose frames carry the rest-point marker trains a 4-value-frame model; its checkpoint names the
    system, so resuming it under the default system is refused, and a 2-value model is refused by frame shape."""
    from steerdiff.data.driven import DrivenSpring

    system = DrivenSpring(anchor_std=0.5, marker_noise=0.1)
    cfg = SequenceTrainConfig(steps=2, batch_size=2, max_length=20, checkpoint_every=2, warmup_steps=1)
    quiet = {"log": lambda *_: None}
    x, cond = training_batch(cfg, 0, system)
    assert x.shape[-1] == 4 and cond.context.shape[-1] == 4
    result = train_sequence(sequence_model(frame_shape=(4,), **TINY), cfg, tmp_path, system, **quiet)
    assert result["steps"] == 2
    with pytest.raises(ValueError, match="another config, model or system"):
        train_sequence(sequence_model(frame_shape=(4,), **TINY), cfg, tmp_path, **quiet)
    with pytest.raises(ValueError, match="frame shape"):
        train_sequence(sequence_model(**TINY), cfg, None, system, **quiet)


@pytest.fixture
def model():
    return _random_model().float()


def test_signal_length_must_equal_the_requested_length(model):
    with pytest.raises(ValueError, match="length=12"):
        generate_sequence(model, torch.randn(1, 10, 2), length=12)
    with pytest.raises(ValueError, match="length=12"):
        generate_autoregressive(model, torch.randn(1, 10, 2), torch.zeros(1, 4, 2), length=12)


def test_denoiser_refuses_a_signal_of_another_length(model):
    with pytest.raises(ValueError, match="one signal row per frame"):
        model(torch.randn(2, 8, 2), 1.0, SequenceCond(torch.randn(2, 7, 2)))


def test_mismatched_frame_shapes_are_refused(model):
    with pytest.raises(ValueError, match="frame shape"):
        model(torch.randn(2, 8, 3), 1.0, SequenceCond(torch.randn(2, 8, 2)))
    with pytest.raises(ValueError, match="frame shape"):
        model(torch.randn(2, 8, 2), 1.0, SequenceCond(torch.randn(2, 8, 2), torch.randn(2, 4, 3)))
    with pytest.raises(ValueError, match="frame shape"):
        generate_sequence(model, torch.randn(1, 8, 2), torch.randn(1, 4, 2, 1))


@pytest.mark.parametrize("call, word", [
    (lambda m: m(torch.randn(2, 8, 2), 1.0, torch.zeros(2, dtype=torch.long)), "SequenceCond"),
    (lambda m: m(torch.randn(2, 8, 2), 1.0, SequenceCond(torch.randn(2, 8, 3))), "signal_dim"),
    (lambda m: SequenceCond(torch.full((1, 4, 2), float("nan"))), "finite"),
    (lambda m: SequenceCond(torch.randn(2, 4, 2), torch.randn(3, 1, 2)), "context"),
    (lambda m: generate_autoregressive(m, torch.randn(1, 8, 2), torch.zeros(1, 2, 2), overlap=4), "overlap"),
    (lambda m: generate_autoregressive(m, torch.randn(1, 8, 2), torch.zeros(1, 4, 2), chunk=0), "chunk"),
    (lambda m: generate_sequence(m, torch.randn(8, 2)), "signal"),
    (lambda m: SequenceCond(torch.randn(1, 4, 2)).null_like(), "guidance"),
    (lambda m: SequenceTrainConfig(mode="causal"), "mode"),
])
def test_bad_input_is_refused_by_name(model, call, word):
    with pytest.raises(ValueError, match=word):
        call(model)


def test_global_context_reaches_every_frame():
    """With global_context a frame far beyond depth * window from the known frames depends on them; without, not."""
    x, sig, ctx = _inputs(1, 40, k=3)
    for flag in (False, True):
        model = _random_model(global_context=flag)
        t = 3 * model.net.receptive_field  # frame 18 of 40: more than 3 receptive fields from the context
        ctx_var = ctx.clone().requires_grad_(True)
        out = model(x, 1.0, SequenceCond(sig, ctx_var))
        (grad,) = torch.autograd.grad(out[0, t].sum(), ctx_var)
        assert (grad.abs().max() > 1e-6) == flag


def test_global_context_keeps_frame_frame_attention_banded_and_shift_equivariant():
    model = _random_model(global_context=True)
    reach, window = model.net.receptive_field, model.net.window
    x, sig, ctx = _inputs(2, 40, k=3)
    sigma = torch.tensor([0.7, 3.0], dtype=torch.float64)
    with torch.no_grad():
        for c in (None, ctx):  # no context; the same context before both windows
            a = model(x[:, 0:30], sigma, SequenceCond(sig[:, 0:30], c))
            b = model(x[:, 10:40], sigma, SequenceCond(sig[:, 10:40], c))
            # Away from the ends (and, with context, beyond the window of it, where it enters without position).
            inner = slice(10 + reach + window, 30 - reach)
            torch.testing.assert_close(a[:, inner], b[:, inner.start - 10:inner.stop - 10], rtol=0, atol=1e-12)
        assert (a[:, 10] - b[:, 0]).abs().max() > 1e-3
        # Frames still reach other frames through the band only (the context tokens never attend to frames).
        t = 12
        base = model(x[:, :30], 1.0, SequenceCond(sig[:, :30], ctx))
        far = x[:, :30].clone()
        far[:, t + reach + 1] += 1.0
        assert torch.equal(model(far, 1.0, SequenceCond(sig[:, :30], ctx))[:, t], base[:, t])


def test_global_context_save_load_and_old_configs(tmp_path):
    model = _random_model(global_context=True).float()
    assert model.net.config["global_context"] is True
    x, sig, ctx = (t.float() for t in _inputs(2, 30, k=2))
    sd.models.save(model, tmp_path / "m")
    loaded = sd.models.load(tmp_path / "m")
    assert loaded.net.global_context
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, 0.5, SequenceCond(sig, ctx)), model(x, 0.5, SequenceCond(sig, ctx)))
    # The default (banded) model's config and weights are those written before the option existed.
    plain = sequence_model(**TINY)
    assert "global_context" not in plain.net.config
    assert not any("ctx_bias" in name for name in plain.state_dict())
    with pytest.raises(ValueError, match="global_context"):
        sequence_model(**TINY, global_context="yes")


@pytest.mark.parametrize("flag", [False, True])
def test_inference_in_groups_of_rows_is_exact(flag):
    """A batch over ``max_tokens`` is run in groups of rows at inference; the output is the one of a single pass."""
    model = _random_model(global_context=flag)
    x, sig, ctx = _inputs(7, 12, k=2)
    sigma = torch.linspace(0.1, 5.0, 7, dtype=torch.float64)
    with torch.no_grad():
        model.net.max_tokens = None
        whole = model(x, sigma, SequenceCond(sig, ctx))
        model.net.max_tokens = 30  # two rows (14 tokens each) at a time: groups 2, 2, 2, 1
        split = model(x, sigma, SequenceCond(sig, ctx))
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-12)
