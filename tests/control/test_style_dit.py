"""The style-token DiT of the functional AFA test (steerdiff.models.style_dit).

Independent truths: the plain DiT (rows without a style must be computed exactly as the DiT computes them, also when
other rows of the batch have one: the style keys are masked), and AFA's own block (afa=True runs afa_block).
"""

from __future__ import annotations

import pytest
import torch

from steerdiff.control.styles import style_refs
from steerdiff.models.precond import EDMPrecond
from steerdiff.models.style_dit import StyleTokenDiT

DIT = {"img_size": 8, "in_channels": 1, "patch_size": 2, "width": 32, "depth": 2, "heads": 4, "num_classes": 10}


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    m = StyleTokenDiT(DIT, style_dim=16, n_tokens=4, n_bank=6).double().eval()
    with torch.no_grad():
        m.dit.patch_out.weight.normal_(0, 0.2)
        m.bank.copy_(torch.nn.functional.normalize(torch.randn(6, 16, dtype=torch.float64), dim=1))
    return m


def _inputs():
    g = torch.Generator().manual_seed(2)
    return torch.randn(4, 1, 8, 8, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)


def test_no_style_rows_are_the_plain_dit(net):
    x, c = _inputs()
    cls = torch.tensor([0, 3, 7, -1])
    with torch.no_grad():
        plain = net.dit(x, c, cls)
        assert torch.equal(net(x, c, torch.stack([cls, torch.full_like(cls, -1)], 1)), plain)
        mixed = net(x, c, torch.stack([cls, torch.tensor([-1, 2, -1, 5])], 1))
    torch.testing.assert_close(mixed[[0, 2]], plain[[0, 2]], rtol=1e-10, atol=1e-10)  # masked style keys
    assert not torch.allclose(mixed[[1, 3]], plain[[1, 3]], atol=1e-4)


def test_afa_and_errors(net):
    x, c = _inputs()
    cond = torch.stack([torch.tensor([0, 3, 7, 1]), torch.full((4,), -1)], 1)
    emb = net.bank[:1]
    with torch.no_grad():
        joint = net(x, c, cond, style_embedding=emb)
        afa = net(x, c, cond, style_embedding=emb, afa=True)
    assert not torch.allclose(joint, afa, atol=1e-6)
    with pytest.raises(ValueError, match="afa=True needs a style for every row"):
        net(x, c, torch.stack([cond[:, 0], torch.tensor([-1, 2, -1, 5])], 1), afa=True)
    EDMPrecond(net, sigma_data=0.6)  # a valid backbone


def test_style_refs_pick_same_style_images():
    x, cond, s = style_refs(0)
    assert cond.shape == (x.shape[0], 2)
    assert torch.equal(s[cond[:, 1]], s)
