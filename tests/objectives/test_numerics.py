"""`trl_groupopt.core.numerics`: the noise's rms and its share of a clip window, against hand computations, per
level (token, sequence, batch, prefix sum and mean)."""

from __future__ import annotations

import math

import pytest
import torch

from trl_groupopt.core.numerics import ClipWindow, clipped_by_noise, log_ratio_rms, noise_share, ratio_window_width

X = torch.tensor([[0.3, -0.4, 0.0], [0.2, float("nan"), float("inf")]])  # padding may hold non-finite values
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_log_ratio_rms_is_over_the_mask_only():
    assert log_ratio_rms(X, MASK).item() == pytest.approx(math.sqrt((0.09 + 0.16 + 0.04) / 4))
    assert log_ratio_rms(X, torch.zeros_like(MASK)).item() == 0.0  # an empty mask: 0, not NaN
    assert log_ratio_rms(X, MASK).dtype == torch.float32


def test_token_and_sequence_and_batch_levels_by_hand():
    token = ClipWindow("token_clip", 0.5)
    assert noise_share(X, MASK, token).item() == pytest.approx(math.sqrt(0.29 / 4) / 0.5)
    sequence_means = [(0.3 - 0.4) / 3, 0.2]
    expected = math.sqrt(sum(q * q for q in sequence_means) / 2) / 0.01
    assert noise_share(X, MASK, ClipWindow("sequence_clip", 0.01, "sequence")).item() == pytest.approx(expected)
    batch_mean = (0.3 - 0.4 + 0.2) / 4
    assert noise_share(X, MASK, ClipWindow("batch_clip", 0.2, "batch")).item() == pytest.approx(abs(batch_mean) / 0.2)
    empty = torch.tensor([[0, 0, 0], [1, 0, 0]])  # an empty row is no sequence
    assert noise_share(X, empty, ClipWindow("s", 1.0, "sequence")).item() == pytest.approx(0.2)


def test_clipped_by_noise_counts_the_quantities_beyond_their_bound():
    token = ClipWindow("token_clip", 0.25)  # |0.3|, |-0.4| beyond; 0.0, 0.2 within (padding not counted)
    assert clipped_by_noise(X, MASK, token).item() == pytest.approx(0.5)
    assert clipped_by_noise(X, MASK, ClipWindow("sequence_clip", 0.1, "sequence")).item() == pytest.approx(0.5)
    assert clipped_by_noise(X, MASK, ClipWindow("batch_clip", 0.2, "batch")).item() == 0.0


def test_prefix_levels_by_hand():
    x = torch.tensor([[0.1, 0.2, -0.3, 0.4]])
    mask = torch.tensor([[1, 0, 1, 1]])  # t counts valid tokens only: 1, 1, 2, 3
    # prefix sums on valid tokens: 0.1, -0.2, 0.2 at t = 1, 2, 3; bound 0.05 * t**0.5
    sums = [(0.1, 1), (-0.2, 2), (0.2, 3)]
    expected = math.sqrt(sum((s / (0.05 * t**0.5)) ** 2 for s, t in sums) / 3)
    window = ClipWindow("prefix_clip", 0.05, "prefix_sum", position_power=0.5)
    assert noise_share(x, mask, window).item() == pytest.approx(expected)
    # the geometric-mean mode at power -0.5 clips the same quantity: (L_t / t) / t**-0.5 == L_t / t**0.5
    mean = ClipWindow("prefix_clip", 0.05, "prefix_mean", position_power=-0.5)
    assert noise_share(x, mask, mean).item() == pytest.approx(expected)


def test_prefix_share_of_white_noise_is_the_token_rms_over_epsilon():
    """A random walk of T steps has rms sqrt(t) sigma: against CTPO's sqrt(t)-scaled bound the share is sigma/eps at
    every position, whatever T (the reason the noise matters at long T: docs/ctpo.md)."""
    gen = torch.Generator().manual_seed(0)
    x = 0.04 * torch.randn(4000, 64, generator=gen, dtype=torch.float64)
    share = noise_share(x, torch.ones_like(x), ClipWindow("prefix_clip", 0.025, "prefix_sum", 0.5)).item()
    assert share == pytest.approx(0.04 / 0.025, rel=0.02)


def test_ratio_window_width_is_the_narrower_log_side():
    assert ratio_window_width(0.2, 0.2) == pytest.approx(math.log(1.2))  # log(1.2) < -log(0.8)
    assert ratio_window_width(3e-4, 4e-4) == pytest.approx(-math.log(1 - 3e-4))
    assert ratio_window_width(1.0, 0.28) == pytest.approx(math.log(1.28))  # no lower bound


@pytest.mark.parametrize("kwargs", [dict(width=0.0), dict(width=-1.0), dict(width=0.1, level="sequence_token")])
def test_clip_window_refuses_a_bad_width_or_level(kwargs):
    with pytest.raises(ValueError, match="ClipWindow"):
        ClipWindow("w", **kwargs)
