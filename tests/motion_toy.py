"""A lookup tokeniser for the motion tests: each token is ``d`` frames of a fixed codebook (exact to decode)."""

import torch


class LookupTokenizer:
    def __init__(self, num_tokens: int = 6, downsample: int = 4, features: int = 3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.codebook = torch.randn(num_tokens, downsample, features, generator=g)
        self.downsample = downsample

    def encode(self, features):
        w = features[: features.shape[0] // self.downsample * self.downsample].reshape(-1, self.downsample,
                                                                                         features.shape[-1])
        return ((w[:, None] - self.codebook[None]) ** 2).sum((-1, -2)).argmin(1)

    def decode(self, tokens):
        out = self.codebook[tokens]
        return out.reshape(*tokens.shape[:-1], -1, out.shape[-1])
