"""quantize() on our UNet and DiT, on any nn.Module of Linears, and on a diffusers UNet2DModel via the adapter:
layer mapping (docs/methods/svdquant.md, "Layer mapping"), still a denoiser under samplers and guiders,
calibration errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import steerdiff as sd
import steerdiff.quant as sq
from steerdiff.models.dit import DiT
from steerdiff.models.precond import EDMPrecond
from steerdiff.quant.layers import SVDQLayer


def _sample(model, cond=None, guidance=None, n=4, method="heun", steps=4):
    noise = sd.randn((n, *model.sample_shape), seeds=0)
    with torch.no_grad():
        return sd.sample(model, noise, sd.sigmas.karras(steps, 0.002, 80.0), method=method, cond=cond,
                         guidance=guidance, generator=1)


def test_digits_unet_mapping_and_samplers(digits, digits_calib):
    q = sq.quantize(digits, "svdquant", rank=4, calib=digits_calib, num_grids=2, num_iters=3)
    layers = sq.quant_info(q)["layers"]
    # ResBlock conv1/conv2 quantized; shortcut, time projection, conv_in/out, resampling convs stay fp (the mapping)
    assert set(layers) == {f"net.{p}.conv{i}" for p in
                           [f"down.{j}" for j in (0, 1, 3, 4)] + ["mid.0", "mid.1"] + [f"up.{j}" for j in
                                                                                      (0, 1, 2, 4, 5, 6)]
                           for i in (1, 2)}
    assert all(isinstance(q.net.get_submodule(p), SVDQLayer) for p in [k[4:] for k in layers])
    assert isinstance(q.net.conv_in, nn.Conv2d) and isinstance(q.net.down[1].emb, nn.Linear)
    assert q.net.down[0].conv1.shift == pytest.approx(0.2734375) and q.net.down[0].conv1.unsigned
    assert isinstance(q, EDMPrecond) and q.sample_shape == digits.sample_shape
    cond = torch.arange(4)
    ref = _sample(digits, cond)
    for method in ("euler", "heun", "ddim", "ddpm"):
        out = _sample(q, cond, method=method)
        assert torch.isfinite(out).all()
    out = _sample(q, cond)
    assert ((out - ref).abs().mean() < 0.2)  # close to the fp model's samples, not a different image
    guided = _sample(q, cond, guidance=sd.guidance.CFG(2.0))
    assert torch.isfinite(guided).all()


def test_w4a16_w8a8_digits_need_no_calibration(digits):
    for method in ("w4a16", "w8a8"):
        q = sq.quantize(digits, method)
        assert torch.isfinite(_sample(q, torch.arange(4))).all()


def test_dit_mapping():
    torch.manual_seed(0)
    dit = DiT(img_size=8, patch_size=2, width=64, depth=2, heads=4, num_classes=10)
    nn.init.normal_(dit.patch_out.weight, std=0.05)
    model = EDMPrecond(dit).eval().requires_grad_(False)
    calib = sq.trajectory_calibration(model, num_samples=16, n_trajectories=4, steps=3)
    q = sq.quantize(model, "svdquant", rank=4, calib=calib, num_grids=2, num_iters=2)
    assert set(sq.quant_info(q)["layers"]) == {f"net.blocks.{b}.{n}" for b in (0, 1)
                                               for n in ("qkv", "proj", "mlp.0", "mlp.3")}
    assert q.net.blocks[0].mlp[3].shift == pytest.approx(0.171875)
    assert isinstance(q.net.patch_in, nn.Linear) and isinstance(q.net.patch_out, nn.Linear)
    assert torch.isfinite(_sample(q, torch.arange(4), guidance=sd.guidance.CFG(1.5))).all()


def test_generic_module_tensor_and_callable_calibration():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
    x = torch.randn(256, 64)
    q1 = sq.quantize(mlp, "svdquant", rank=4, calib=x, num_grids=2, num_iters=2)
    q2 = sq.quantize(mlp, "svdquant", rank=4, calib=lambda: [x[:128], x[128:]], num_grids=2, num_iters=2)
    assert isinstance(q1[0], SVDQLayer) and isinstance(q1[2], SVDQLayer)
    with torch.no_grad():
        assert torch.equal(q1(x), q2(x))  # the same calibration tokens, given two ways
    with pytest.raises(ValueError, match="calib"):
        sq.quantize(mlp, "svdquant", rank=4, calib=torch.randn(10, 63), num_grids=2)
    with pytest.raises(ValueError, match="calib is required"):
        sq.quantize(mlp, "svdquant", rank=4)
    with pytest.raises(ValueError, match="method must be one of"):
        sq.quantize(mlp, "gptq")


def test_denoiser_calibration_of_wrong_shape_raises(digits):
    bad = [(torch.randn(4, 1, 7, 7), torch.ones(4), None)]
    with pytest.raises(ValueError, match="calib"):
        sq.quantize(digits, "svdquant", rank=4, calib=bad, num_grids=2)


def test_diffusers_unet2d_through_adapter(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(32, 64),
        norm_num_groups=8, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=16).eval()
    D = sd.models.from_diffusers(unet, diffusers.DDPMScheduler(num_train_timesteps=1000))
    calib = sq.trajectory_calibration(D, num_samples=16, n_trajectories=4, steps=4)
    q = sq.quantize(D, "svdquant", rank=4, calib=calib, num_grids=2, num_iters=3)
    r = sq.quantize(D, "rtn", calib=calib)
    layers = sq.quant_info(q)["layers"]
    attn = [p for p in layers if ".attentions." in p]
    assert {p.rsplit(".", 1)[-1] for p in attn} >= {"to_q", "to_k", "to_v", "0"}
    assert not any("conv_shortcut" in p or "time_emb_proj" in p or "conv_in" in p for p in layers)
    # q/k/v share one lambda and one L_down (deepcompressor's exclusive: false)
    blk = q.net.unet.get_submodule(attn[0].rsplit(".", 1)[0])
    assert torch.equal(blk.to_q.smooth_factor, blk.to_k.smooth_factor)
    assert torch.equal(blk.to_q.lora_down, blk.to_v.lora_down)
    x, sigma = calib[0][0][:8], calib[0][1][:8]
    with torch.no_grad():
        ref, yq, yr = D(x, sigma), q(x, sigma), r(x, sigma)
    eq, er = float((yq - ref).pow(2).mean()), float((yr - ref).pow(2).mean())
    assert eq < er  # SVDQuant closer to fp32 than naive W4A4 on the same calls
    assert torch.isfinite(_sample(q, method="ddim")).all()
    sq.save(q, tmp_path / "dq")
    back = sq.load(tmp_path / "dq", template=D)
    with torch.no_grad():
        assert torch.equal(back(x, sigma), yq)


def test_mlp_mapping_keeps_embedding_and_output_float_and_the_quantized_denoiser_runs():
    """An unconditional MLP has no parameter outside its Linears; quantizing every one of them left a network with
    no float parameter, from which the denoiser could not read its dtype (StopIteration on the first call)."""
    from .conftest import denoiser_inputs, tiny_mlp

    model = tiny_mlp()
    x, sigma, _ = denoiser_inputs(model, 64, 1, cond=False)
    q = sq.quantize(model, "svdquant", rank=4, calib=[(x, sigma)], num_grids=2, num_iters=2)
    layers = sq.quant_info(q)["layers"]
    assert set(layers) == {"net.body.0", "net.body.2"}
    assert layers["net.body.0"]["shift"] == 0.0 and layers["net.body.2"]["shift"] == pytest.approx(0.2734375)
    assert isinstance(q.net.noise_proj, nn.Linear) and isinstance(q.net.out, nn.Linear)
    xt, st, _ = denoiser_inputs(model, 16, 2, cond=False)
    with torch.no_grad():
        ref, out = model(xt, st), q(xt, st)
    assert float((out - ref).pow(2).sum() / ref.pow(2).sum()) < 0.05  # close to the fp denoiser
