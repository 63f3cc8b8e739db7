"""The shared config round trip and cosine schedule (steerdiff.train.config)."""

import json
import math
from dataclasses import dataclass

import pytest

from steerdiff.constrain.namm import NAMMConfig
from steerdiff.train.config import config_from_dict, config_to_dict, cosine_lr
from steerdiff.train.trainer import TrainConfig


@dataclass
class _Toy:
    a: int = 1
    betas: tuple[float, float] = (0.9, 0.99)


def test_from_dict_rejects_unknown_keys_naming_them():
    with pytest.raises(ValueError, match=r"unknown toy keys \['lr_typo'\]; known: \['a', 'betas'\]"):
        config_from_dict(_Toy, {"a": 2, "lr_typo": 1e-3}, "toy")
    assert config_from_dict(_Toy, {"a": 2}) == _Toy(a=2)


@pytest.mark.parametrize("cls", [TrainConfig, NAMMConfig])
def test_json_round_trip_rebuilds_an_equal_config(cls):
    cfg = cls(steps=123, lr=3e-4)
    text = json.dumps(config_to_dict(cfg))
    assert cls.from_dict(json.loads(text)) == cfg and cls.from_dict(json.loads(text)).to_dict() == json.loads(text)


def test_cosine_schedule_endpoints_warmup_and_monotone_decay():
    lr, steps, warm, floor = 2e-3, 1000, 100, 0.05
    sched = [cosine_lr(lr, s, steps, warmup_steps=warm, min_lr_ratio=floor) for s in range(steps + 20)]
    assert sched[0] == pytest.approx(lr / warm) and sched[warm - 1] == pytest.approx(lr)
    assert sched[warm] == pytest.approx(lr)  # cosine starts at the peak
    # halfway through the decay the cosine factor is 1/2
    assert sched[warm + (steps - warm) // 2] == pytest.approx(lr * (floor + (1 - floor) / 2))
    assert sched[steps] == pytest.approx(lr * floor) and sched[-1] == sched[steps]  # held at the floor
    decay = sched[warm:steps + 1]
    assert all(b <= a for a, b in zip(decay, decay[1:], strict=False))
    # no warm-up, no floor: the plain half cosine
    assert cosine_lr(1.0, 250, 1000, min_lr_ratio=0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_train_config_constant_schedule_keeps_its_warmup():
    cfg = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, lr_schedule="constant")
    assert cfg.lr_at(0) == pytest.approx(1e-4) and cfg.lr_at(9) == pytest.approx(1e-3) and cfg.lr_at(99) == 1e-3
    assert NAMMConfig(lr_schedule="constant", lr=5e-4).lr_at(7) == 5e-4
