"""MotionDreamer's generator (steerdiff/motion/generator.py): the masking law, what a local model learns from one
token sequence, CFG's identities, editing keeps the kept tokens."""

import math

import pytest
import torch

from steerdiff.models.local_transformer import LocalMaskedTransformer
from steerdiff.motion import GeneratorConfig, edit_tokens, generate, random_mask, train_generator


def test_random_mask_follows_the_cosine_ratio():
    m = random_mask((20000, 10), torch.Generator().manual_seed(0))
    count = m.sum(1).double()
    assert int(count.min()) >= 1 and int(count.max()) <= 10
    # P(count <= k) = P(ceil(10 cos(pi u / 2)) <= k) = P(u >= 2/pi acos(k/10)) = 1 - 2/pi acos(k / 10)
    for k in (2, 5, 8):
        exact = 1 - 2 / math.pi * math.acos(k / 10)
        assert abs(float((count <= k).double().mean()) - exact) < 0.015


def _branching_chain(n: int, seed: int) -> torch.Tensor:
    """0 -> {1, 2} at random, 1 -> 3, 2 -> 3, 3 -> 0: many valid sequences, a fixed local grammar."""
    g = torch.Generator().manual_seed(seed)
    x = [0]
    while len(x) < n:
        x.append({0: 1 + int(torch.randint(0, 2, (1,), generator=g)), 1: 3, 2: 3, 3: 0}[x[-1]])
    return torch.tensor(x)


VALID = {(0, 1), (0, 2), (1, 3), (2, 3), (3, 0)}


def test_local_model_learns_the_local_grammar_and_does_not_copy():
    ref = _branching_chain(48, 0)
    model, log = train_generator(ref, 4, GeneratorConfig(window=1, dim=32, depth=2, heads=2, steps=300, batch=16))
    # one token per round and confidence order without Gumbel noise: the any-order chain of the learnt
    # conditionals, no parallel-decoding error (noisy choice favours accepting draws of low probability)
    out = generate(model, 48, 6, steps=48, seed=0, choice_temperature=0.0)
    pairs = [(int(a), int(b)) for row in out for a, b in zip(row[:-1], row[1:], strict=True)]
    assert sum(p in VALID for p in pairs) / len(pairs) > 0.95
    assert not any(torch.equal(row, ref) for row in out)  # 2^12 valid sequences: a copy would be memorisation
    assert len({tuple(r.tolist()) for r in out}) >= 4  # diverse (a copying model gives 1)
    assert log["train_cpu_s"] > 0


def test_edit_keeps_tokens_and_cfg_identities():
    torch.manual_seed(0)
    m = LocalMaskedTransformer(5, dim=16, depth=1, heads=2, window=2, cond_kind="frames", cond_values=2).eval()
    ref = torch.randint(0, 5, (20,))
    e = edit_tokens(m, ref, 6, 11, count=3, seed=4)
    assert torch.equal(e[:, :6], ref[:6].expand(3, -1)) and torch.equal(e[:, 11:], ref[11:].expand(3, -1))
    assert int(e.max()) < 5  # the span is filled
    beats = torch.randint(0, 2, (2, 20))
    null = torch.full_like(beats, -1)
    # CFG with w = 0 is the unconditional model; w = 1 the conditional one (steerdiff.discrete.CFG's convention)
    assert torch.equal(generate(m, 20, 2, cond=beats, guidance_scale=0.0), generate(m, 20, 2, cond=null))
    assert torch.equal(generate(m, 20, 2, cond=beats, guidance_scale=1.0), generate(m, 20, 2, cond=beats))
    with pytest.raises(ValueError, match="start:end"):
        edit_tokens(m, ref, 5, 30)
    with pytest.raises(ValueError, match="tokens must lie"):
        train_generator(torch.tensor([0, 9]), 4)


def test_cond_token_drop_nulls_positions_independently(monkeypatch):
    # what the network sees in training: whole rows null with p = cond_drop, and then each position with
    # p = cond_token_drop, so a position is null with 1 - (1 - 0.2)(1 - 0.5) = 0.6; rows that keep some flags vary
    seen = []
    forward = LocalMaskedTransformer.forward

    def spy(self, x, cond=None, window=-1):
        seen.append(cond.clone())
        return forward(self, x, cond, window)

    monkeypatch.setattr(LocalMaskedTransformer, "forward", spy)
    flags = torch.ones(16, dtype=torch.long)
    train_generator(torch.arange(16) % 4, 4, GeneratorConfig(steps=20, batch=32, dim=8, heads=2, depth=1,
                                                             cond_drop=0.2, cond_token_drop=0.5),
                    cond=flags, cond_kind="frames", cond_values=2)
    c = torch.cat(seen)  # [20 * 32, 16]
    null = (c == -1).double()
    assert abs(float(null.mean()) - 0.6) < 0.03  # 10240 positions: sd of the mean ~0.01 (rows correlate)
    partial = (null.sum(1) > 0) & (null.sum(1) < 16)
    assert float(partial.double().mean()) > 0.7  # rows with flags and nulls mixed (all-null rows: ~0.2)
