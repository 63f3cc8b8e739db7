"""SVDQuant's default ``search="auto"`` (docs/methods/svdquant.md, "Fast search"): per group, ``hybrid`` when the
stacked weight ``[n, K]`` has ``min(n, K) >= AUTO_WIDTH`` and the group has more calibration rows than
``search_tokens``, ``exact`` otherwise; decided from shapes alone, recorded per group in the report."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from steerdiff.quant import quant_info, quantize
from steerdiff.quant.calibrate import AUTO_WIDTH, SEARCH_TOKENS, GroupCalibrator, SearchConfig, resolve_search
from steerdiff.quant.mapping import Group

W = AUTO_WIDTH


def meta_linear(cin: int, cout: int) -> nn.Linear:
    return nn.Linear(cin, cout, device="meta")


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


@pytest.mark.parametrize("modules, x, want", [
    ([meta_linear(W, W)], meta(SEARCH_TOKENS + 1, W), "hybrid"),  # wide, a real subsample
    ([meta_linear(W, W)], meta(SEARCH_TOKENS, W), "exact"),  # no subsample: hybrid would be exact anyway
    ([meta_linear(W - 1, 4 * W)], meta(4096, W - 1), "exact"),  # narrow input side
    ([meta_linear(4 * W, W - 1)], meta(4096, 4 * W), "exact"),  # narrow output side
    ([meta_linear(512, 512)], meta(128, 512), "exact"),  # a shipped MLP's group: 128 calibration rows
    ([meta_linear(W, W // 3 + 1) for _ in range(3)], meta(1, 4096, W), "hybrid"),  # q/k/v: n = 3 x (W/3 + 1)
    ([nn.Conv2d(W, W, 3, padding=1, device="meta")], meta(1, W, 64, 64), "hybrid"),  # SD 1.5's narrowest conv
    ([nn.Conv2d(128, 128, 3, padding=1, device="meta")], meta(16, 128, 16, 16), "exact"),  # K = 1152, n = 128
    ([nn.Conv2d(64, 64, 3, padding=1, device="meta")], meta(64, 64, 8, 8), "exact"),  # the digits' widest
])
def test_auto_resolves_by_width_and_rows(modules, x, want):
    """The rule on layers that exist only as shapes (meta device): nothing is computed to decide."""
    assert resolve_search("auto", modules, x) == want
    # explicit modes are kept as given, whatever the size
    for mode in ("exact", "hybrid", "sampled"):
        assert resolve_search(mode, modules, x) == mode


def test_auto_follows_search_tokens():
    """A larger scoring budget than the rows leaves nothing to subsample: exact."""
    mods, x = [meta_linear(W, W)], meta(4096, W)
    assert resolve_search("auto", mods, x, search_tokens=4096) == "exact"
    assert resolve_search("auto", mods, x, search_tokens=4095) == "hybrid"


def test_calibrator_resolves_a_large_group_without_calibrating():
    """A wide group's calibrator is set up for hybrid (its scoring rows a real subsample) before any candidate runs;
    a narrow one for exact (every row)."""
    g = torch.Generator().manual_seed(0)
    big, x = nn.Linear(W, W), torch.randn(4096, W, generator=g)
    cal = GroupCalibrator(Group("g", ["g"]), [big], x, SearchConfig(rank=8))
    assert cal.requested == "auto" and cal.cfg.search == "hybrid"
    assert cal.xs.shape[0] == SEARCH_TOKENS and cal.xs is not cal.x
    small = nn.Linear(64, 64)
    cal = GroupCalibrator(Group("g", ["g"]), [small], x[:, :64], SearchConfig(rank=8))
    assert cal.cfg.search == "exact" and cal.xs is cal.x


def test_unknown_search_is_refused_naming_the_argument():
    lin = nn.Linear(8, 8)
    with pytest.raises(ValueError, match=r"search must be one of 'auto', 'exact'.*got 'exactly'"):
        quantize(nn.Sequential(lin), "svdquant", calib=torch.randn(16, 8), search="exactly")
    with pytest.raises(ValueError, match=r"search must be one of .*got 'quick'"):
        GroupCalibrator(Group("g", ["g"]), [lin], torch.randn(16, 8), SearchConfig(rank=2, search="quick"))
    with pytest.raises(ValueError, match=r"search must be one of"):
        resolve_search("Auto", [lin], torch.randn(16, 8))


def _layers(q) -> dict[str, torch.Tensor]:
    return {k: v for k, v in q.state_dict().items()}


def _equal(a: dict, b: dict, prefix: str) -> bool:
    keys = [k for k in a if k.startswith(prefix)]
    return bool(keys) and all(torch.equal(a[k], b[k]) for k in keys)


def test_auto_is_exact_on_narrow_groups_and_hybrid_on_wide_ones():
    """A model with one narrow and one wide group: under auto, each group's layer is bit for bit the layer of the
    mode the rule names for it, and the report records that mode per group."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, W), nn.ReLU(), nn.Linear(W, W))
    xc = torch.randn(1024, 16)
    xc[:, :2] *= 20
    kw = {"rank": 8, "num_grids": 4, "num_iters": 3}
    q = {s: quantize(net, "svdquant", calib=xc, search=s, **kw) for s in ("auto", "exact", "hybrid")}
    rep = quant_info(q["auto"])["report"]
    assert [r["search_mode"] for r in rep] == ["exact", "hybrid"]
    assert [r["search_requested"] for r in rep] == ["auto", "auto"]
    # hybrid's own path ran on the wide group only: its refinement iterates re-scored on every row
    assert "refine_full_errors" not in rep[0] and "refine_full_errors" in rep[1]
    sd = {s: _layers(m) for s, m in q.items()}
    assert _equal(sd["auto"], sd["exact"], "0.") and _equal(sd["auto"], sd["hybrid"], "2.")


@pytest.fixture(scope="module")
def digits_and_calib():
    from steerdiff.models.io import load
    from steerdiff.quant import trajectory_calibration

    model = load("digits").requires_grad_(False)
    return model, trajectory_calibration(model)  # the default calibration: 128 calls, 4096-row group inputs


def test_default_on_shipped_digits_is_exact_bit_for_bit(digits_and_calib):
    """The shipped digits model's widest groups (64 channels, 2048-4096 calibration rows) under the default search
    are the exact search's layers bit for bit, and the default did not take hybrid's path there (hybrid re-scores
    its refinement on every row; whether that picks other layers depends on the CPU's rounding: on some machines it
    ends on exact's grid point, so the layers alone cannot tell the two paths apart)."""
    from steerdiff.quant.mapping import select_groups

    model, calib = digits_and_calib
    groups = [g for g in select_groups(model) if g.name in ("net.mid.0.conv1", "net.up.0.conv1")]
    assert len(groups) == 2
    kw = {"rank": 8, "calib": calib, "groups": groups}
    default, exact = quantize(model, "svdquant", **kw), quantize(model, "svdquant", search="exact", **kw)
    hybrid = quantize(model, "svdquant", search="hybrid", **kw)
    assert [r["search_mode"] for r in quant_info(default)["report"]] == ["exact", "exact"]
    a, b, h = _layers(default), _layers(exact), _layers(hybrid)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all("refine_full_errors" not in r for r in quant_info(default)["report"])
    assert all("refine_full_errors" in r for r in quant_info(hybrid)["report"])
    assert a.keys() == h.keys()


@pytest.mark.slow
def test_default_on_whole_shipped_digits_is_exact_bit_for_bit(digits_and_calib):
    """Every group of the shipped digits model: the default calibration equals ``search="exact"`` bit for bit."""
    model, calib = digits_and_calib
    default, exact = (quantize(model, "svdquant", rank=8, calib=calib, **kw) for kw in ({}, {"search": "exact"}))
    a, b = _layers(default), _layers(exact)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {r["search_mode"] for r in quant_info(default)["report"]} == {"exact"}


def test_every_group_of_an_sd15_unet_gets_hybrid():
    """SD 1.5's published UNet config on the meta device (no memory, no weights): every one of its 92 groups, at
    the default calibration size (4096 rows), resolves to hybrid."""
    diffusers = pytest.importorskip("diffusers")
    from steerdiff.quant.layers import layer_geometry
    from steerdiff.quant.mapping import select_groups

    cfg = dict(block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
               layers_per_block=2, sample_size=64)
    with torch.device("meta"):
        unet = diffusers.UNet2DConditionModel(**cfg).eval()
    groups = select_groups(unet)
    shapes: dict[str, tuple] = {}

    def record(path):
        def hook(_m, args):
            shapes.setdefault(path, tuple(args[0].shape))
        return hook

    hooks = [unet.get_submodule(g.paths[0]).register_forward_pre_hook(record(g.paths[0])) for g in groups]
    with torch.device("meta"), torch.no_grad():
        unet(torch.randn(1, 4, 64, 64), torch.tensor([500.0]), encoder_hidden_states=torch.randn(1, 77, 768))
    for h in hooks:
        h.remove()
    modes = []
    for g in groups:
        mods = [unet.get_submodule(p) for p in g.paths]
        s = shapes[g.paths[0]]
        if layer_geometry(mods[0])["kind"] == "conv2d":  # whole maps up to 4096 pixels, as quantize keeps them
            x = meta(max(1, 4096 // (s[2] * s[3])), *s[1:])
        elif not g.tokens:  # whole sequences
            x = meta(max(1, 4096 // s[1]), *s[1:])
        else:
            x = meta(4096, s[-1])
        modes.append(resolve_search("auto", mods, x))
    assert len(groups) == 92 and modes == ["hybrid"] * 92
