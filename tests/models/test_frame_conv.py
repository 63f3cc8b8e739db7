"""FrameConv, the spatial frame backbone of the 2-D DyDiff field: shapes, circular translation equivariance,
chunked = unchunked, save / load, DyDiff through it unchanged, bad input."""

import pytest
import torch

import steerdiff as sd
from steerdiff.models import EDMPrecond, FrameContext, FrameConv
from steerdiff.models import frame_conv as fc
from steerdiff.temporal import DyDiffDenoiser, forecast


def random_conv(frames=5, shape=(6, 6), n_context=2, seed=0) -> FrameConv:
    torch.manual_seed(seed)
    net = FrameConv(frames, list(shape), n_context, channels=8, dilations=[1, 2], fourier_dim=8, emb_dim=16)
    with torch.no_grad():  # the output convolution starts at zero; make the network non-trivial
        net.out.weight.normal_(0, 0.3)
        net.out.bias.normal_(0, 0.1)
        net.pos.normal_(0, 0.3)
    return net.eval()


def test_shapes_and_context_matter():
    net = random_conv()
    x, s = torch.randn(3, 5, 6, 6), torch.rand(3)
    ctx = torch.randn(3, 2, 6, 6)
    with torch.no_grad():
        a = net(x, s, FrameContext(ctx))
        b = net(x, s, None)
    assert a.shape == x.shape
    assert not torch.allclose(a, b)  # the context channels reach the output


def test_circular_translation_equivariance():
    net = random_conv()
    x, s, ctx = torch.randn(2, 5, 6, 6), torch.rand(2), torch.randn(2, 2, 6, 6)
    shift = (2, -1)
    with torch.no_grad():
        out = net(x, s, FrameContext(ctx))
        moved = net(x.roll(shift, dims=(-2, -1)), s, FrameContext(ctx.roll(shift, dims=(-2, -1))))
    torch.testing.assert_close(moved, out.roll(shift, dims=(-2, -1)), atol=1e-5, rtol=1e-5)


def test_chunked_forward_equals_row_by_row(monkeypatch):
    net = random_conv()
    x, s, ctx = torch.randn(7, 5, 6, 6), torch.rand(7), torch.randn(7, 2, 6, 6)
    monkeypatch.setattr(fc, "CHUNK", 3)
    with torch.no_grad():
        chunked = net(x, s, FrameContext(ctx))
        rows = torch.cat([net(x[i:i + 1], s[i:i + 1], FrameContext(ctx[i:i + 1])) for i in range(7)])
    torch.testing.assert_close(chunked, rows, atol=1e-5, rtol=1e-5)


def test_dydiff_through_frameconv_save_load(tmp_path):
    dy = DyDiffDenoiser(EDMPrecond(random_conv(), sigma_data=1.0).eval(), r=0.5)
    y, s, c = torch.randn(2, 5, 6, 6), torch.tensor([0.5, 3.0]), torch.randn(2, 2, 6, 6)
    sd.models.save(dy, tmp_path / "m")
    back = sd.temporal.load_forecaster(tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(back(y, s, c), dy(y, s, c))
    ens = forecast(dy, c, members=2, steps=2)
    assert ens.shape == (2, 2, 3, 6, 6) and torch.isfinite(ens).all()
    # r = 0 is the wrapped network itself (A.9 test 3)
    plain = DyDiffDenoiser(dy.net, r=0.0)
    with torch.no_grad():
        assert torch.equal(plain(y, s, c), dy.net(y, s, FrameContext(c)))


def test_bad_input():
    net = random_conv()
    with pytest.raises(ValueError, match="x must have shape"):
        net(torch.randn(2, 5, 6, 7), torch.rand(2))
    with pytest.raises(ValueError, match="frame_shape"):
        FrameConv(5, [6], 2)
    with pytest.raises(ValueError, match="n_context"):
        FrameConv(5, [6, 6], 5)
    with pytest.raises(ValueError, match="kernel"):
        FrameConv(5, [6, 6], 2, kernel=2)
    with pytest.raises(ValueError, match="dilations"):
        FrameConv(5, [6, 6], 2, dilations=[0])
    with pytest.raises(ValueError, match="wraps more than once"):
        FrameConv(5, [6, 6], 2, dilations=[7])
