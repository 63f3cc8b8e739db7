"""SVDQuant of a pipeline's network (steerdiff.quant on ``Pipeline.network`` with ``Pipeline.calibration_inputs``).

Independent truth: the method's claim against its baseline (docs/methods/svdquant.md): the SVDQuant-quantized
pipeline's samples, from the same initial latents, are closer to the floating-point pipeline's than naive 4-bit
rounding's (RTN) are (by 3 dB, as tests/quant/test_flow_quant.py asks; measured: SD +8.5 dB, SD3 +7 dB); the
pipeline's own sampling path runs the quantized layers (they are in its network).
"""

import pytest
import torch

import steerdiff as sd
import steerdiff.quant as sq


def _psnr(a, b):
    return float(10 * torch.log10((b.max() - b.min()) ** 2 / ((a - b) ** 2).mean()))


@pytest.mark.parametrize("family", ["sd", "sd3"])
def test_svdquant_pipeline_beats_rtn(tiny, family):
    build = tiny.sd if family == "sd" else tiny.sd3
    prompts = ["a red disk", "a blue square"]
    fp = sd.pipelines.from_diffusers(build())
    calib = fp.calibration_inputs(prompts * 2, num_inference_steps=4, generator=torch.Generator().manual_seed(1))
    assert len(calib) == 4 and all(isinstance(c, dict) for c in calib)

    def draw(p):
        return p(prompts, num_inference_steps=6, generator=torch.Generator().manual_seed(0),
                 output_type="latent").latents

    ref = draw(fp)
    out = {}
    for method in ("svdquant", "rtn"):
        p = sd.pipelines.from_diffusers(build())
        sq.quantize(p.network, method, rank=4 if method == "svdquant" else None, calib=calib, num_grids=4,
                    num_iters=3, inplace=True)
        assert sq.quant_info(p.network)["layers"]  # the pipeline's network now holds quantized layers
        out[method] = draw(p)
        assert torch.isfinite(out[method]).all()
    assert _psnr(out["svdquant"], ref) > _psnr(out["rtn"], ref) + 3.0, (_psnr(out["svdquant"], ref),
                                                                        _psnr(out["rtn"], ref))
