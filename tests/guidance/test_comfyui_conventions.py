"""Conversions from ComfyUI's guidance nodes to steerdiff's guiders (steerdiff.guidance.conventions), each against
the node's formula written out here from its code (comfy_extras/nodes_apg.py, nodes_pag.py, nodes_slg.py,
nodes_tcfg.py, nodes_cfg.py; comfy/model_sampling.py): APG, PAG (on a tiny diffusers UNet's middle block), SLG (an
Euler run of a tiny DiT with the node's sigma window), TCFG (eps and flow models); CFG-Zero*, a different operator,
checked to differ by exactly the documented term."""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.guidance import APG, PAG, SLG, TCFG
from steerdiff.guidance.cfg_zero_star import CFGZeroStar
from steerdiff.guidance.conventions import (
    apg_from_comfyui,
    comfyui_flow_percent_to_sigma,
    pag_from_comfyui,
    slg_from_comfyui,
    slg_window_from_comfyui,
    tcfg_from_comfyui,
)

SHAPE = (3, 4, 6, 6)


def _rand(seed, shape=SHAPE):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


# --- APG: the node is a pre-CFG hook, followed by ComfyUI's CFG -------------------------------------------------------

def _comfy_apg(conds, unconds, cfg, eta, norm_threshold, momentum):
    dims, running, out = [-1, -2, -3], 0, []
    for cond, uncond in zip(conds, unconds, strict=True):
        guidance = cond - uncond
        if momentum > 0:
            running = guidance if not torch.is_tensor(running) else momentum * running + guidance
            guidance = running
        if norm_threshold > 0:
            n = guidance.norm(p=2, dim=dims, keepdim=True)
            guidance = guidance * torch.minimum(torch.ones_like(n), norm_threshold / n)
        unit = torch.nn.functional.normalize(cond, dim=dims)
        par = (guidance * unit).sum(dim=dims, keepdim=True) * unit
        modified_cond = uncond + (guidance - par) + eta * par + (cond - uncond) / cfg
        out.append(uncond + cfg * (modified_cond - uncond))  # comfy/samplers.py cfg_function
    return out


@pytest.mark.parametrize("cfg, eta, thr, mom", [(4.0, 1.0, 5.0, 0.0), (6.5, 0.3, 2.0, 0.6), (2.5, 0.0, 0.0, 0.2)])
def test_apg(cfg, eta, thr, mom):
    conds, unconds = [_rand(10 + j) for j in range(3)], [_rand(20 + j) for j in range(3)]
    want = _comfy_apg(conds, unconds, cfg, eta, thr, mom)
    g = APG(**apg_from_comfyui(cfg, eta=eta, norm_threshold=thr, momentum=mom))
    x, sigma = _rand(1), torch.full((3,), 2.0, dtype=torch.float64)
    rows = enumerate(zip(conds, unconds, want, strict=True))
    errs = [_rel(g.combine(c, u, x, sigma, step=j), w) for j, (c, u, w) in rows]
    print(f"APG vs ComfyUI node (cfg {cfg}): max rel diff {max(errs):.1e}")
    assert max(errs) < 1e-12
    with pytest.raises(ValueError, match="eta"):
        apg_from_comfyui(4.0, eta=2.0)
    with pytest.raises(ValueError, match="momentum"):
        apg_from_comfyui(4.0, momentum=1.0)


# --- TCFG and CFG-Zero*: functions of (x, D_c, D_u) ------------------------------------------------------------------

def _comfy_tcfg(x, cond_d, uncond_d, cfg):
    """The node's pre-CFG hook (SVD of [x - D_u; x - D_c], the null score's part along v1) and ComfyUI's CFG."""
    b = x.shape[0]
    cs, us = (x - cond_d).reshape(b, 1, -1), (x - uncond_d).reshape(b, 1, -1)
    _, _, vh = torch.linalg.svd(torch.cat([us, cs], 1), full_matrices=False)
    v1 = vh[:, 0:1]
    uncond_td = x - ((us @ v1.transpose(-2, -1)) * v1).reshape(x.shape)
    return uncond_td + cfg * (cond_d - uncond_td)


@pytest.mark.parametrize("flow", [False, True])
def test_tcfg(flow):
    d_c, d_u, x = _rand(1), _rand(2), 3 * _rand(3)
    sigma = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)
    cfg = 5.0
    g = TCFG(**tcfg_from_comfyui(cfg, flow=flow))
    got = g.combine(d_c, d_u, x, sigma)
    # ComfyUI's state: x itself for an eps model (k-diffusion scaling), x_t = x / (1 + sigma) for a rectified flow
    x_node = x / (1 + sigma.reshape(-1, 1, 1, 1)) if flow else x
    want = _comfy_tcfg(x_node, d_c, d_u, cfg)
    print(f"TCFG vs ComfyUI node (flow={flow}): max rel diff {_rel(got, want):.1e}")
    assert _rel(got, want) < 1e-10
    # the other space is another operator
    other = TCFG(cfg, space="eps" if flow else "v").combine(d_c, d_u, x, sigma)
    assert _rel(other, want) > 1e-3


def test_cfg_zero_star_node_is_another_operator():
    """The node: alpha from the scores x_t - D (prop. to v), applied to D: ``alpha D_u + cfg (D_c - alpha D_u)``;
    steerdiff's CFG-Zero* (space v, no zero-init) applies it to v; in D they differ by (1 - alpha)(1 - cfg) x_t."""
    d_c, d_u, x = _rand(4), _rand(5), 3 * _rand(6)
    sigma = torch.tensor([0.3, 1.0, 4.0], dtype=torch.float64)
    cfg = 4.0
    x_t = x / (1 + sigma.reshape(-1, 1, 1, 1))
    pos, neg = (x_t - d_c).flatten(1), (x_t - d_u).flatten(1)
    alpha = ((pos * neg).sum(1) / ((neg ** 2).sum(1) + 1e-8)).reshape(-1, 1, 1, 1)
    cfg_result = d_u + cfg * (d_c - d_u)
    node = cfg_result + d_u * (alpha - 1.0) + cfg * d_u * (1.0 - alpha)
    ours = CFGZeroStar(cfg, zero_init_steps=0, space="v").combine(d_c, d_u, x, sigma)
    assert _rel(ours - node, (1 - alpha) * (1 - cfg) * x_t) < 1e-10
    assert (ours - node).abs().max() > 1e-2  # not a rounding difference


# --- PAG on a UNet's middle block ----------------------------------------------------------------------------------

def test_pag_on_the_unet_middle_block():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8, norm_num_groups=4, attention_head_dim=2).eval()
    emb = torch.randn(3, 5, 8)  # two prompts and the null (last row)

    class Den(torch.nn.Module):  # an EDM denoiser around the eps UNet, labels indexing the embeddings
        def __init__(self):
            super().__init__()
            self.unet = unet

        def forward(self, x, sigma, cond):
            s = sigma.reshape(-1, 1, 1, 1)
            e = emb[torch.where(cond < 0, 2, cond)]
            return x - s * self.unet(x / (1 + s ** 2).sqrt(), 500, encoder_hidden_states=e).sample

    den = Den()
    x, sigma, y = torch.randn(2, 4, 8, 8), torch.tensor([1.5, 3.0]), torch.tensor([0, 1])
    cfg, scale = 4.0, 2.5
    with torch.no_grad():
        got = PAG(**pag_from_comfyui(cfg, scale)).guide(den, x, sigma, y)
        d_c, d_u = den(x, sigma, y), den(x, sigma, torch.full_like(y, -1))
        # the node's perturbed pass: the middle block's self-attentions (attn1) return v (then to_out)
        attn1 = [m for m in unet.mid_block.modules() if type(m).__name__ == "BasicTransformerBlock"]
        saved = [b.attn1.processor for b in attn1]
        for b in attn1:
            b.attn1.processor = lambda attn, h, *a, **k: attn.to_out[1](attn.to_out[0](attn.to_v(h)))
        try:
            d_p = den(x, sigma, y)
        finally:
            for b, p in zip(attn1, saved, strict=True):
                b.attn1.processor = p
    want = d_u + cfg * (d_c - d_u) + scale * (d_c - d_p)
    print(f"PAG vs ComfyUI node: max rel diff {_rel(got, want):.1e}")
    assert attn1 and _rel(got, want) < 1e-5
    assert (d_p - d_c).abs().max() > 1e-4


# --- SLG: a tiny DiT, Euler, the node's sigma window ------------------------------------------------------------------

def _dit_model():
    from steerdiff.models.dit import DiT
    from steerdiff.models.precond import EDMPrecond

    torch.manual_seed(0)
    net = DiT(img_size=8, width=32, depth=3, heads=2, num_classes=10).eval()
    with torch.no_grad():
        for prm in net.parameters():
            prm.copy_(0.2 * torch.randn_like(prm))
    return EDMPrecond(net, sigma_data=0.5).eval()


def test_flow_percent_to_sigma():
    for p, shift in [(0.01, 3.0), (0.15, 3.0), (0.5, 1.0), (0.9, 6.0)]:
        u = 1 - p
        t = shift * u / (1 + (shift - 1) * u)  # comfy/model_sampling.py time_snr_shift(shift, 1 - percent)
        assert math.isclose(comfyui_flow_percent_to_sigma(p, shift), t / (1 - t), rel_tol=1e-12)
    assert comfyui_flow_percent_to_sigma(0.0) == math.inf and comfyui_flow_percent_to_sigma(1.0) == 0.0


@pytest.mark.parametrize("bounds", ["grid", "between", "empty"])
def test_slg_euler_run_equals_the_node(bounds):
    model = _dit_model()
    n = 8
    sigmas = sd.sigmas.karras(n, 0.05, 10.0).double()
    s = sigmas.tolist()
    hi, lo = {"grid": (s[1], s[4]), "between": ((s[2] + s[3]) / 2, (s[5] + s[6]) / 2),
              "empty": ((s[2] + s[3]) / 2, (s[2] + s[3]) / 2 + 1e-9)}[bounds]
    cfg, scale, layers = 3.0, 2.0, (1,)
    kw = slg_from_comfyui(cfg, sigmas, scale=scale, double_layers=layers, sigma_start=hi, sigma_end=lo)
    noise = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.tensor([2, 5])
    with torch.no_grad():
        got = sd.sample(model, noise, sigmas, method="euler", cond=y, guidance=SLG(**kw), progress=False)
        # the node: post-CFG, cfg_result + scale (D_c - D_p) where sigma_end <= sigma <= sigma_start
        net = model.net
        x, on = noise * s[0], []
        for i in range(n):
            sig = torch.full((2,), s[i], dtype=torch.float64)
            d_c, d_u = model(x, sig, y), model(x, sig, torch.full_like(y, -1))
            d = d_u + cfg * (d_c - d_u)
            if lo <= s[i] <= hi:
                on.append(i)
                block = net.blocks[1]
                block.forward = lambda h: h  # the skipped block (ComfyUI's patch returns its input)
                try:
                    d_p = model(x, sig, y)
                finally:
                    del block.forward
                d = d + scale * (d_c - d_p)
            x = x + (x - d) / s[i] * (s[i + 1] - s[i])
    print(f"SLG vs ComfyUI node ({bounds}: steps {on}): max rel diff {_rel(got, x):.1e}")
    assert _rel(got, x) < 1e-6
    assert on == {"grid": [1, 2, 3, 4], "between": [3, 4, 5], "empty": []}[bounds]
    assert [i for i in range(n) if n * kw["perturb_start"] < i < n * kw["perturb_stop"]] == on


def test_slg_refusals_and_layers():
    sigmas = sd.sigmas.karras(6, 0.1, 10.0)
    with pytest.raises(ValueError, match="first step"):
        slg_window_from_comfyui(math.inf, 0.0, sigmas)
    with pytest.raises(ValueError, match="rescaling_scale"):
        slg_from_comfyui(4.0, sigmas, 5.0, 0.0, rescaling_scale=0.5)
    kw = slg_from_comfyui(4.0, sigmas, double_layers=(0,), single_layers=(3,), sigma_start=5.0, sigma_end=1.0)
    assert kw["layers"] == (0, "single_transformer_blocks.3") and kw["scale"] == 4.0


def test_nag_node_feature_rule_is_nag_combine():
    """ComfyUI's NAGuidance patch on (Z+, Z-) (its operator differs in where Z- comes from and where it is applied,
    docs/methods/guidance.md; its feature rule and parameters are steerdiff's)."""
    from steerdiff.models.nag import nag_combine

    g = torch.Generator().manual_seed(0)
    z_pos, z_neg = (torch.randn(2, 7, 16, generator=g, dtype=torch.float64) for _ in range(2))
    for nag_scale, alpha, tau in [(5.0, 0.5, 1.5), (3.0, 0.25, 2.5), (10.0, 1.0, 10.0)]:
        guided = z_pos * nag_scale - z_neg * (nag_scale - 1.0)
        norm_pos = torch.norm(z_pos, p=1, dim=-1, keepdim=True).clamp_min(1e-6)
        norm_guided = torch.norm(guided, p=1, dim=-1, keepdim=True).clamp_min(1e-6)
        ratio = norm_guided / norm_pos
        node = guided * (torch.minimum(ratio, torch.full_like(ratio, tau)) / ratio) * alpha + z_pos * (1 - alpha)
        torch.testing.assert_close(nag_combine(z_pos, z_neg, nag_scale, tau, alpha), node, rtol=0, atol=1e-12)
