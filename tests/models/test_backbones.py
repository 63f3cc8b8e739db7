"""Backbones (MLP, UNet, DiT), condition slots with null rows, and EDM preconditioning numerics."""

import math

import pytest
import torch
from torch import nn

from steerdiff.models.dit import DiT
from steerdiff.models.embed import SlotEmbedding, check_cond, sincos_2d
from steerdiff.models.mlp import MLP
from steerdiff.models.precond import EDMPrecond, edm_scalings
from steerdiff.models.unet import UNet


def tiny(kind: str, num_classes=None) -> nn.Module:
    if kind == "mlp":
        return MLP(dim=3, hidden=[16, 16], num_classes=num_classes, cond_dim=4, fourier_dim=8, noise_dim=8)
    if kind == "unet":
        return UNet(
            img_size=8,
            in_channels=2,
            channels=[8, 16],
            num_res_blocks=1,
            num_classes=num_classes,
            emb_dim=16,
            fourier_dim=8,
            norm_groups=4,
        )
    return DiT(
        img_size=8,
        in_channels=2,
        patch_size=2,
        width=16,
        depth=1,
        heads=2,
        num_classes=num_classes,
        fourier_dim=8,
    )


def perturb(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere (the zero-initialised output layers would hide every difference)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


KINDS = ["mlp", "unet", "dit"]
CONDS = [None, 5, [3, 4]]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_classes", CONDS)
def test_output_shapes(kind, num_classes):
    net = tiny(kind, num_classes)
    model = EDMPrecond(net)
    b = 4
    x = torch.randn(b, *model.sample_shape)
    sigma = torch.tensor([0.01, 0.5, 2.0, 80.0])
    conds = [None]
    if num_classes == 5:
        conds += [torch.tensor([0, 4, -1, 2]), torch.tensor([[0], [4], [-1], [2]])]
    elif num_classes == [3, 4]:
        conds += [torch.tensor([[0, 3], [-1, 1], [2, -1], [-1, -1]])]
    else:
        conds += [torch.full((b,), -1)]  # an unconditional model takes an all-null condition
    for cond in conds:
        assert net(x, sigma.log() / 4, cond).shape == x.shape
        assert model(x, sigma, cond).shape == x.shape


@pytest.mark.parametrize("kind", KINDS)
def test_null_condition_semantics(kind):
    net = perturb(tiny(kind, [3, 4]))
    x = torch.randn(2, *net.sample_shape)
    c_noise = torch.tensor([0.1, -0.3])
    with torch.no_grad():
        out_none = net(x, c_noise, None)
        out_null = net(x, c_noise, torch.full((2, 2), -1))
        out_last = net(x, c_noise, torch.tensor([[2, 3], [2, 3]]))
        out_a = net(x, c_noise, torch.tensor([[0, -1], [0, -1]]))
        out_b = net(x, c_noise, torch.tensor([[1, -1], [1, -1]]))
    assert torch.equal(out_none, out_null)
    # -1 is its own learned row, not Python's "last element" and not a neighbouring slot's null.
    assert not torch.allclose(out_null, out_last)
    assert not torch.allclose(out_a, out_b)


def test_slot_embedding_indices():
    emb = SlotEmbedding([3, 4], dim=2)
    assert emb.table.num_embeddings == 3 + 1 + 4 + 1
    cond = torch.tensor([[-1, -1], [0, 0], [2, 3]])
    with torch.no_grad():
        emb.table.weight.copy_(torch.arange(9.0)[:, None].expand(9, 2))
    rows = emb(cond)[..., 0]
    assert rows.tolist() == [[3, 8], [0, 4], [2, 7]]


@pytest.mark.parametrize("kind", KINDS)
def test_condition_validation_errors(kind):
    net = tiny(kind, [3, 4])
    x = torch.randn(2, *net.sample_shape)
    c_noise = torch.zeros(2)
    bad = [
        (torch.tensor([[0.0, 1.0], [1.0, 1.0]]), "dtype"),
        (torch.tensor([[0, 1]]), "batch size"),
        (torch.tensor([0, 1]), r"\[B, 2\]"),
        (torch.tensor([[0, 1, 1], [0, 1, 1]]), r"\[B, 2\]"),
        (torch.tensor([[3, 0], [0, 0]]), r"cond\[0, 0\] = 3"),
        (torch.tensor([[0, 0], [0, -2]]), r"cond\[1, 1\] = -2"),
    ]
    for cond, match in bad:
        with pytest.raises(ValueError, match=match) as info:
            net(x, c_noise, cond)
        assert "cond" in str(info.value)
    with pytest.raises(TypeError, match="cond"):
        net(x, c_noise, [[0, 1], [1, 1]])
    with pytest.raises(ValueError, match="x must have shape"):
        net(torch.randn(2, 5, 5), c_noise, None)


def test_unconditional_model_rejects_labels():
    net = tiny("mlp", None)
    with pytest.raises(ValueError, match="unconditional"):
        net(torch.randn(2, 3), torch.zeros(2), torch.tensor([0, -1]))


def test_check_cond_forms():
    assert check_cond(None, (5,), 3).tolist() == [[-1], [-1], [-1]]
    assert check_cond(torch.tensor([1, 2], dtype=torch.int32), (5,), 2).dtype == torch.long
    assert check_cond(None, (), 2).shape == (2, 0)


@pytest.mark.parametrize(
    "sigma, sd, expected",
    [
        (0.5, 0.5, (0.5, 0.25 / math.sqrt(0.5), 1 / math.sqrt(0.5), math.log(0.5) / 4)),
        (1.0, 0.5, (0.2, 0.5 / math.sqrt(1.25), 1 / math.sqrt(1.25), 0.0)),
        (80.0, 1.0, (1 / 6401, 80 / math.sqrt(6401), 1 / math.sqrt(6401), math.log(80) / 4)),
    ],
)
def test_edm_scalings_hand_values(sigma, sd, expected):
    got = edm_scalings(torch.tensor([sigma], dtype=torch.float64), sd)
    for g, e in zip(got, expected, strict=True):
        assert abs(g.item() - e) <= 1e-12 * max(1.0, abs(e))


@pytest.mark.parametrize("kind", KINDS)
def test_zero_output_network_gives_c_skip_x(kind):
    model = EDMPrecond(tiny(kind, 5), sigma_data=0.7)
    x = torch.randn(3, *model.sample_shape, dtype=torch.float64)
    sigma = torch.tensor([0.002, 1.0, 80.0], dtype=torch.float64)
    d = model(x, sigma, torch.tensor([1, -1, 4]))
    c_skip = 0.7**2 / (sigma**2 + 0.7**2)
    assert d.dtype == torch.float64  # scalings in the sampler's dtype, network in its own
    assert torch.equal(d, c_skip.reshape(-1, *[1] * (x.ndim - 1)) * x)


class Recorder(nn.Module):
    """Raw network returning ones and remembering what it was given."""

    sample_shape = (2, 3)

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def forward(self, x, c_noise, cond):
        self.seen = (x, c_noise, cond)
        return torch.ones_like(x)


def test_precond_passes_scaled_inputs():
    net = Recorder()
    model = EDMPrecond(net, sigma_data=0.5)
    x = torch.randn(2, 2, 3, dtype=torch.float64)
    sigma = torch.tensor([0.3, 4.0], dtype=torch.float64)
    cond = torch.tensor([1, -1])
    d = model(x, sigma, cond)
    s2 = sigma**2 + 0.25
    assert torch.allclose(net.seen[0], x / s2.sqrt()[:, None, None], rtol=1e-15)
    assert torch.allclose(net.seen[1], sigma.log() / 4, rtol=1e-15)
    assert net.seen[2] is cond
    expected = (0.25 / s2)[:, None, None] * x + (sigma * 0.5 / s2.sqrt())[:, None, None]
    assert torch.allclose(d, expected, rtol=1e-14)
    assert model.sample_shape == (2, 3)
    assert model(x, 0.3, cond).shape == x.shape  # a scalar sigma is broadcast
    with pytest.raises(ValueError, match="x must have shape"):
        model(torch.randn(2, 3, 2, dtype=torch.float64), sigma)


def test_dit_patchify_roundtrip_and_position_code():
    net = tiny("dit", [3, 4])
    x = torch.randn(2, 2, 8, 8)
    tokens = net.patchify(x)
    assert tokens.shape == (2, 16, 2 * 2 * 2)
    assert torch.equal(net.unpatchify(tokens), x)
    # Token 1 is the patch at row 0, columns 2..3.
    assert torch.equal(tokens[0, 1].reshape(2, 2, 2).permute(2, 0, 1), x[0, :, 0:2, 2:4])
    pos = sincos_2d(4, 4, 16)
    assert pos.shape == (16, 16) and net.pos.shape == (16, 16)
    assert len({tuple(r.tolist()) for r in pos}) == 16  # every image position is distinct
    # Pure context: with the image-token inputs fixed, the output depends on the condition tokens.
    perturb(net)
    with torch.no_grad():
        a = net(x, torch.zeros(2), torch.tensor([[0, 0], [0, 0]]))
        b = net(x, torch.zeros(2), torch.tensor([[1, 0], [1, 0]]))
    assert not torch.allclose(a, b)


def test_configs_rebuild_identical_architecture():
    for kind in KINDS:
        net = tiny(kind, [3, 4])
        clone = type(net)(**net.config)
        assert {k: v.shape for k, v in clone.state_dict().items()} == {k: v.shape for k, v in net.state_dict().items()}


def test_default_sizes():
    unet = UNet(num_classes=10)
    dit = DiT(num_classes=10)
    n_unet = sum(p.numel() for p in unet.parameters())
    n_dit = sum(p.numel() for p in dit.parameters())
    assert 300_000 <= n_unet <= 1_500_000
    assert 200_000 <= n_dit <= 1_500_000
    shapes_unet = UNet(img_size=12, in_channels=3, num_classes=[4, 4])
    assert shapes_unet(torch.randn(2, 3, 12, 12), torch.zeros(2), torch.tensor([[0, 3], [-1, 1]])).shape == (
        2,
        3,
        12,
        12,
    )
    with pytest.raises(ValueError, match="img_size"):
        UNet(img_size=10, channels=[8, 8, 8])
    with pytest.raises(ValueError, match="patch_size"):
        DiT(img_size=12, patch_size=5)


def test_mlp_image_shape_raw_noise_equals_flat_mlp():
    """The image MLP of the inverse-problem digits prior (a) (docs/methods/inverse.md, "The digits protocol"): images
    flattened inside, c_noise = log(sigma)/4 as one input column. Same weights on flattened input give the same numbers;
    the raw noise column is the first-layer input."""
    img = perturb(MLP(dim=12, hidden=[16, 16], noise_input="raw", image_shape=[3, 2, 2]))
    flat = MLP(dim=12, hidden=[16, 16], noise_input="raw")
    flat.load_state_dict(img.state_dict())
    x, c = torch.randn(5, 3, 2, 2), torch.randn(5)
    out = img(x, c)
    assert out.shape == x.shape
    torch.testing.assert_close(out.reshape(5, 12), flat(x.reshape(5, 12), c), rtol=0, atol=0)
    # the raw column: first layer = W[:, :12] x + W[:, 12] c_noise + b
    first = img.body[0]
    manual = x.reshape(5, 12) @ first.weight[:, :12].T + c[:, None] * first.weight[:, 12] + first.bias
    torch.testing.assert_close(img.body[1](manual), img.body[:2](torch.cat([x.reshape(5, 12), c[:, None]], 1)))
    assert img.config["noise_input"] == "raw" and img.config["image_shape"] == [3, 2, 2]
    assert "noise_input" not in flat.config or flat.config["noise_input"] == "raw"
    assert "image_shape" not in MLP(dim=3).config  # older configs read back unchanged


def test_mlp_image_options_bad_input():
    with pytest.raises(ValueError, match="image_shape"):
        MLP(dim=12, image_shape=[1, 3, 3])
    with pytest.raises(ValueError, match="noise_input"):
        MLP(dim=4, noise_input="sin")
    with pytest.raises(ValueError, match=r"x must have shape \[B, 1, 2, 2\]"):
        MLP(dim=4, image_shape=[1, 2, 2])(torch.randn(2, 4), torch.zeros(2))
