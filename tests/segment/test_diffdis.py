"""DiffDIS (docs/methods/diffdis.md): the widened network starts as the prior, task embeddings and the cross-task
attention act as specified, one-step inference is deterministic and per image, save/load round-trips."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import steerdiff as sd
from steerdiff.data import dis
from steerdiff.models.precond import EDMPrecond
from steerdiff.segment import (
    EDGE,
    MASK,
    DiffDIS,
    DiffDISNet,
    FinetuneConfig,
    LatentCodec,
    SegmentCond,
    Segmenter,
    build,
    finetune,
    load_segmenter,
    predict_latents,
    save_segmenter,
    task_features,
)
from steerdiff.segment.diffdis import prior_unet


def _prior(seed: int = 0, size: int = 8) -> EDMPrecond:
    torch.manual_seed(seed)
    prior = EDMPrecond(prior_unet(size, 4, channels=(8, 16)), sigma_data=1.0)
    with torch.no_grad():  # the UNet's output conv starts at zero: give it weights so outputs are informative
        prior.net.conv_out.weight.normal_(0, 0.1)
        prior.net.conv_out.bias.normal_(0, 0.1)
    return prior


def _randomise(model: DiffDIS) -> None:
    """Non-zero task embedding, attention gates and input kernel on both inputs (as after training)."""
    with torch.no_grad():
        model.net.unet.conv_in.weight.normal_(0, 0.2)
        model.net.task_mlp[-1].weight.normal_(0, 0.5)
        model.net.dbia_mid.gate.fill_(0.7)
        model.net.dbia_out.gate.fill_(0.7)


@pytest.mark.parametrize("rule", ["noise", "image", "marigold"])
def test_widened_network_is_the_prior_at_start(rule):
    """The widened input convolution is linear, so each rule has a closed form: the prior applied to the noisy mask
    input (``noise``), to the image latent (``image``), or to their average (``marigold``: the kernel halved on
    both)."""
    # float64: the widened conv sums over 8 input channels instead of 4, so only rounding may differ.
    prior = _prior().double()
    reference = copy.deepcopy(prior.net)
    model = build(prior, 1.0, FinetuneConfig(condition_init=rule))
    x = torch.randn(3, 4, 8, 8, dtype=torch.float64)
    image = torch.randn(3, 4, 8, 8, dtype=torch.float64)
    c_noise = torch.tensor([-0.5, 0.1, 0.6], dtype=torch.float64)
    seen = {"noise": x, "image": image, "marigold": (x + image) / 2}[rule]
    expected = reference(seen, c_noise)
    for edge in (False, True):
        cond = SegmentCond.for_images(image, edge=edge)
        xx, cc = (torch.cat([x, x]), torch.cat([c_noise, c_noise])) if edge else (x, c_noise)
        out = model.net(xx, cc, cond)
        torch.testing.assert_close(out[:3], expected, rtol=0, atol=1e-12)
    # The zero slice's input really enters once trained: a non-zero kernel everywhere changes the output.
    with torch.no_grad():
        model.net.unet.conv_in.weight.normal_(0, 0.1)
    out = model.net(x, c_noise, SegmentCond.for_images(image, edge=False))
    assert not torch.allclose(out, expected)
    # The prior itself is untouched (build works on a copy).
    torch.testing.assert_close(prior.net(seen, c_noise), expected, rtol=0, atol=0)
    assert abs(expected).max() > 0.01  # the comparison is not between zeros
    with pytest.raises(ValueError, match="condition_init"):
        DiffDISNet(copy.deepcopy(reference), condition_init="both")


def test_embedding_shift_tells_the_network_sigma_embed_at_sigma_t():
    """``D(x, sigma) = c_skip x + c_out F(c_in x, ln(sigma sigma_embed / sigma_t) / 4)`` (EDM's scalings of the true
    sigma): written out here with the network called directly."""
    from steerdiff.models.precond import edm_scalings

    model = build(_prior().double(), 0.8, FinetuneConfig(sigma_embed=0.5))
    _randomise(model)
    assert model.sigma_embed == 0.5
    x, image = torch.randn(2, 4, 8, 8, dtype=torch.float64), torch.randn(2, 4, 8, 8, dtype=torch.float64)
    cond = SegmentCond.for_images(image, edge=False)
    for sigma in (model.sigma_t, 2.0):
        s = torch.full((2,), sigma, dtype=torch.float64)
        c_skip, c_out, c_in, _ = edm_scalings(s, 0.8)
        told = torch.full((2,), math.log(sigma * 0.5 / model.sigma_t) / 4, dtype=torch.float64)
        expected = c_skip[:, None, None, None] * x + c_out[:, None, None, None] * model.net(
            c_in[:, None, None, None] * x, told, cond)
        torch.testing.assert_close(model(x, s, cond), expected, rtol=1e-12, atol=1e-12)
    # None: no shift (the network is told ln(sigma_t) / 4 at sigma_t); the diffusion objective never shifts.
    plain = build(_prior(), 0.8, FinetuneConfig(sigma_embed=None))
    assert plain.sigma_embed is None and plain._noise_shift == 0.0
    assert build(_prior(), 0.8, FinetuneConfig(sigma_embed=0.5, objective="diffusion")).sigma_embed is None
    for bad in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="sigma_embed"):
            DiffDIS(plain.net, 0.8, sigma_embed=bad)


def test_task_embedding_changes_the_output_only_once_trained():
    s1, c1 = math.sin(1.0), math.cos(1.0)  # [sin l, cos l] of the one-hot l: mask [0, 1], edge [1, 0]
    torch.testing.assert_close(task_features(torch.tensor([MASK, EDGE])),
                               torch.tensor([[0.0, s1, 1.0, c1], [s1, 0.0, c1, 1.0]]))
    model = build(_prior(), 1.0, FinetuneConfig())
    x, image = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    sigma = torch.full((2,), 2.0)
    as_mask = model(x, sigma, SegmentCond(image, torch.tensor([MASK, MASK])))
    as_edge = model(x, sigma, SegmentCond(image, torch.tensor([EDGE, EDGE])))
    torch.testing.assert_close(as_mask, as_edge, rtol=0, atol=0)  # the zero-initialised last layer
    _randomise(model)
    as_mask = model(x, sigma, SegmentCond(image, torch.tensor([MASK, MASK])))
    as_edge = model(x, sigma, SegmentCond(image, torch.tensor([EDGE, EDGE])))
    assert (as_mask - as_edge).abs().max() > 1e-3


def test_cross_task_attention_pairs_each_image_with_its_own_edge_row():
    model = build(_prior(), 1.0, FinetuneConfig())
    _randomise(model)
    image = torch.randn(3, 4, 8, 8)
    cond = SegmentCond.for_images(image)  # rows: mask 0, 1, 2, then edge 0, 1, 2
    x = torch.randn(6, 4, 8, 8)
    sigma = torch.full((6,), 3.0)
    base = model(x, sigma, cond)
    x2 = x.clone()
    x2[4] += 1.0  # edge row of image 1
    moved = model(x2, sigma, cond)
    assert (moved[1] - base[1]).abs().max() > 1e-4  # image 1's mask sees its edge row ...
    torch.testing.assert_close(moved[[0, 2, 3, 5]], base[[0, 2, 3, 5]], rtol=0, atol=1e-6)  # ... nobody else does
    with torch.no_grad():  # with the gates at zero (the start), the edge rows do not reach the mask rows at all
        model.net.dbia_mid.gate.zero_()
        model.net.dbia_out.gate.zero_()
    torch.testing.assert_close(model(x2, sigma, cond)[:3], model(x, sigma, cond)[:3], rtol=0, atol=0)


def test_one_step_is_deterministic_and_per_image():
    model = build(_prior(), 1.0, FinetuneConfig())
    _randomise(model)
    image = torch.randn(4, 4, 8, 8)
    m1, e1 = predict_latents(model, image, seed=3)
    m2, e2 = predict_latents(model, image, seed=3)
    assert m1.shape == (4, 4, 8, 8) and e1.shape == (4, 4, 8, 8)
    torch.testing.assert_close(m1, m2, rtol=0, atol=0)
    torch.testing.assert_close(e1, e2, rtol=0, atol=0)
    mask_only, edge_none = predict_latents(model, image, seed=3, edge=False)
    assert edge_none is None and mask_only.shape == (4, 4, 8, 8)
    # Row i uses the noise of seed + i: the first two images alone give the same result as in the batch of 4.
    first, _ = predict_latents(model, image[:2], seed=3)
    torch.testing.assert_close(first, m1[:2], rtol=0, atol=1e-5)
    # The multi-step ablation is the same denoiser under steerdiff.sample: two Euler steps by hand.
    two, _ = predict_latents(model, image, seed=3, steps=2, sigma_min=0.5, edge=False)
    s0, s1 = sd.sigmas.karras(2, 0.5, model.sigma_t)[:2].tolist()
    cond = SegmentCond.for_images(image, edge=False)
    x = s0 * sd.randn(tuple(image.shape), seeds=3)
    d0 = model(x, s0, cond)
    x1 = d0 + (s1 / s0) * (x - d0)
    torch.testing.assert_close(two, model(x1, s1, cond), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="steps"):
        predict_latents(model, image, steps=0)


def test_low_precision_model_follows_its_dtype():
    model = build(_prior(), 1.0, FinetuneConfig())
    _randomise(model)
    image = torch.randn(2, 4, 8, 8)
    full, _ = predict_latents(model, image)
    half, _ = predict_latents(model.to(torch.bfloat16), image)
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    assert (half - full).abs().max() < 0.1 * full.abs().max()


def test_bad_conditions_are_refused():
    with pytest.raises(ValueError, match="task"):
        SegmentCond(torch.randn(2, 4, 8, 8), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="even"):
        SegmentCond(torch.randn(3, 4, 8, 8), torch.tensor([0, 0, 1]), paired=True)
    model = build(_prior(), 1.0, FinetuneConfig())
    with pytest.raises(TypeError, match="SegmentCond"):
        model(torch.randn(2, 4, 8, 8), 1.0, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="init"):
        build(_prior(), 1.0, FinetuneConfig(init="imagenet"))
    with pytest.raises(TypeError, match="UNet"):
        DiffDISNet(torch.nn.Linear(2, 2))


def test_one_step_finetuning_fits_a_tiny_set():
    torch.manual_seed(0)
    image = torch.randn(4, 4, 8, 8)
    mask = torch.tanh(image[:, :1].repeat(1, 4, 1, 1))  # a target that is a function of the image latent
    edge = -mask
    cfg = FinetuneConfig(steps=150, batch_size=4, lr=3e-3)
    model = build(_prior(), float(mask.std()), cfg)
    before = (predict_latents(model, image)[0] - mask).pow(2).mean()
    finetune(model, image, mask, edge, cfg)
    after = (predict_latents(model, image)[0] - mask).pow(2).mean()
    assert after < 0.5 * before


def test_finetuning_callback_logs_a_curve_without_changing_the_training():
    """The callback sees the model every ``every`` steps and after the last, in eval mode without gradients, and the
    trained weights equal those of the same run without it (it draws no random numbers of the training)."""
    torch.manual_seed(0)
    image = torch.randn(4, 4, 8, 8)
    mask, edge = torch.tanh(image[:, :1].repeat(1, 4, 1, 1)), -torch.tanh(image[:, 1:2].repeat(1, 4, 1, 1))
    cfg = FinetuneConfig(steps=5, batch_size=2)
    plain, logged = build(_prior(), 1.0, cfg), build(_prior(), 1.0, cfg)
    finetune(plain, image, mask, edge, cfg)
    seen = []

    def callback(step: int, model: DiffDIS) -> dict:
        seen.append((step, model.training, torch.is_grad_enabled()))
        return {"err": float((predict_latents(model, image)[0] - mask).pow(2).mean())}

    info = finetune(logged, image, mask, edge, cfg, callback, every=2)
    assert seen == [(2, False, False), (4, False, False), (5, False, False)]
    assert [row["step"] for row in info["curve"]] == [2, 4, 5] and info["eval_cpu_s"] >= 0
    for a, b in zip(plain.state_dict().values(), logged.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert "curve" not in finetune(build(_prior(), 1.0, cfg), image, mask, edge, cfg)


def _tiny_codec() -> LatentCodec:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4,
                        layers_per_block=1, sample_size=16)
    return LatentCodec(vae).eval()


def test_codec_shapes_and_segmenter_round_trip(tmp_path):
    codec = _tiny_codec()
    batch = dis.generate(2, 32, seed=0)  # h43a's procedural set (images in [-1, 1], binary masks)
    z = codec.encode(batch.image)
    assert z.shape == (2, 4, 16, 16)
    assert codec.encode_map(batch.mask).shape == (2, 4, 16, 16)
    maps = codec.decode_map(z)
    assert maps.shape == (2, 1, 32, 32) and maps.min() >= 0 and maps.max() <= 1
    with pytest.raises(ValueError, match="images"):
        codec.encode(batch.image[:, :2])
    with pytest.raises(ValueError, match="multiples"):
        codec.encode(torch.zeros(1, 3, 31, 31))  # the tiny VAE downsamples by 2
    model = build(_prior(size=16), 1.0, FinetuneConfig())
    _randomise(model)
    seg = Segmenter(codec, model)
    mask, edges = seg.segment(batch.image)
    assert mask.shape == edges.shape == (2, 1, 32, 32)
    save_segmenter(seg, tmp_path / "seg", {"note": "test"}, dtype=torch.float32)
    back = load_segmenter(tmp_path / "seg")
    mask2, edges2 = back.segment(batch.image)
    torch.testing.assert_close(mask2, mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(edges2, edges, rtol=0, atol=1e-6)
    with pytest.raises(sd.io.CheckpointError):
        load_segmenter(tmp_path)


@pytest.mark.parametrize("steps,ensemble", [(1, 1), (2, 2)])
def test_mask_only_inference_skips_the_edge_decoder_and_keeps_the_mask(steps, ensemble):
    """``edges=False``: the mask is bit-identical to the full path's (the edge rows still run through the denoiser,
    where the cross-task attention couples them to the mask rows), and the decoder sees exactly the mask latents
    of the ensemble's members (each member's draw as a call of its own would make it), where the full path decodes
    the edge latents too."""
    codec = _tiny_codec()
    batch = dis.generate(2, 32, seed=0)
    model = build(_prior(size=16), 1.0, FinetuneConfig())
    _randomise(model)
    seg = Segmenter(codec, model)
    seen = []
    hook = codec.post_quant_conv.register_forward_hook(lambda _m, args, _out: seen.append(args[0].clone()))
    try:
        full_mask, full_edges = seg.segment(batch.image, steps=steps, ensemble=ensemble, seed=3)
        full_rows = sum(x.shape[0] for x in seen)
        seen.clear()
        mask, edges = seg.segment(batch.image, steps=steps, ensemble=ensemble, seed=3, edges=False)
    finally:
        hook.remove()
    assert edges is None and full_edges is not None
    assert torch.equal(mask, full_mask)
    assert full_rows == 2 * 2 * ensemble and sum(x.shape[0] for x in seen) == 2 * ensemble
    with torch.no_grad():  # the latents the decoder must have seen: each member's mask rows, one call per member
        z = codec.encode(batch.image)
        want = [predict_latents(model, z, steps=steps, edge=True, seed=3 + k * 2) for k in range(ensemble)]
    torch.testing.assert_close(torch.cat(seen), torch.cat([m for m, _ in want]) / codec.scaling_factor,
                               rtol=1e-5, atol=1e-6)
    # the output-space average of the members' decoded maps
    with torch.no_grad():
        ref_mask = torch.stack([codec.decode_map(m) for m, _ in want]).mean(0)
        ref_edge = torch.stack([codec.decode_map(e) for _, e in want]).mean(0)
    torch.testing.assert_close(mask, ref_mask, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full_edges, ref_edge, rtol=1e-5, atol=1e-6)
    # without the cross-task attention (mask rows alone), the mask would differ: the edge rows are not idle
    if steps == 1 and ensemble == 1:
        with torch.no_grad():
            alone = codec.decode_map(predict_latents(model, z, steps=1, edge=False, seed=3)[0])
        assert (alone - mask).abs().max() > 1e-4
    with pytest.raises(ValueError, match="edges"):
        seg.segment(batch.image, edges=1)


def test_decoded_mask_loss_is_l1_plus_the_pixel_regressors_bce_and_soft_iou():
    """Inside the clamp, the BCE + soft IoU part equals the pixel regressor's loss on the logits of the same map."""
    from steerdiff.segment import decoded_mask_loss, segmentation_loss

    torch.manual_seed(0)
    raw = torch.rand(3, 1, 8, 8, dtype=torch.float64) * 1.8 - 0.9  # p in (0.05, 0.95): no clamping
    mask = (torch.rand(3, 1, 8, 8) > 0.7).double()
    p = (raw + 1) / 2
    expected = (raw - (2 * mask - 1)).abs().mean() + segmentation_loss(torch.logit(p), mask)
    torch.testing.assert_close(decoded_mask_loss(raw, mask), expected)


def _pixel_setup(size: int = 32):
    codec = _tiny_codec()
    for p in codec.parameters():
        p.requires_grad_(True)
    batch = dis.generate(4, size, seed=0)
    with torch.no_grad():
        image, mask = codec.encode(batch.image), codec.encode_map(batch.mask)
    return codec, image, mask, batch.mask


def test_decoded_loss_gradient_reaches_the_unet_through_the_frozen_decoder():
    """With ``pixel_loss > 0`` the decoded mask's loss changes every trained tensor of the UNet relative to the
    latent loss alone (same seed and draws), and changes nothing when the decoder's output is cut from the graph;
    the decoder's weights stay as they were and its ``requires_grad`` flags are restored."""
    codec, image, mask, pixels = _pixel_setup()
    decoder_before = copy.deepcopy(codec.state_dict())

    def train(pixel_loss: float, decoder=codec) -> DiffDIS:
        cfg = FinetuneConfig(steps=2, batch_size=2, lr=1e-3, pixel_loss=pixel_loss)
        model = build(_prior(size=16), 1.0, cfg)
        finetune(model, image, mask, mask, cfg, decoder=decoder, mask_pixels=pixels)
        return model

    plain, pixel = train(0.0), train(5.0)
    changed = {k for (k, a), b in zip(plain.net.unet.named_parameters(), pixel.net.unet.parameters(), strict=True)
               if not torch.equal(a, b)}
    assert changed == {k for k, _ in plain.net.unet.named_parameters()}

    class Detached:  # the same decoded maps, cut from the graph: the pixel term then has no gradient
        def parameters(self):
            return codec.parameters()

        def decode_raw(self, z):
            return codec.decode_raw(z).detach()

    cut = train(5.0, Detached())
    for a, b in zip(plain.state_dict().values(), cut.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for k, v in codec.state_dict().items():
        assert torch.equal(v, decoder_before[k]), k
    assert all(p.requires_grad for p in codec.parameters())


def test_pixel_loss_is_refused_on_bad_values():
    codec, image, mask, pixels = _pixel_setup()
    model = build(_prior(size=16), 1.0, FinetuneConfig())
    for bad in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="pixel_loss"):
            finetune(model, image, mask, mask, FinetuneConfig(steps=1, pixel_loss=bad), decoder=codec,
                     mask_pixels=pixels)
    cfg = FinetuneConfig(steps=1, pixel_loss=1.0)
    with pytest.raises(ValueError, match="decoder"):
        finetune(model, image, mask, mask, cfg, mask_pixels=pixels)
    with pytest.raises(ValueError, match="mask_pixels"):
        finetune(model, image, mask, mask, cfg, decoder=codec)
    with pytest.raises(ValueError, match="mask_pixels"):
        finetune(model, image, mask, mask, cfg, decoder=codec, mask_pixels=pixels[:3])
    with pytest.raises(ValueError, match="one_step"):
        finetune(model, image, mask, mask, FinetuneConfig(steps=1, pixel_loss=1.0, objective="diffusion"),
                 decoder=codec, mask_pixels=pixels)
