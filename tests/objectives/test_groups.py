"""`common.Groups`, the group layout every group-coupled objective and estimator reduces over: the trainer's
consecutive runs of one size, reduced as `view(K, G)` (nothing read from the device), equal to a reduction group by
group."""

from __future__ import annotations

import pytest
import torch

from trl_groupopt.core.common import Groups


def test_reductions_of_consecutive_groups():
    values = torch.tensor([1.0, 2.0, 9.0, 3.0, 4.0, 5.0])
    groups = Groups.contiguous(6, 3)
    assert (groups.num_groups, groups.size) == (2, 3) and groups.covering(6) is groups
    assert groups.rows(values, "sum").tolist() == [12.0, 12.0, 12.0, 12.0, 12.0, 12.0]
    assert groups.rows(values, "amax").tolist() == [9.0, 9.0, 9.0, 5.0, 5.0, 5.0]
    assert groups.rows(values, "amin").tolist() == [1.0, 1.0, 1.0, 3.0, 3.0, 3.0]
    assert groups.rows(values, "mean").tolist() == pytest.approx([4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    assert groups.dense(values).tolist() == [[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]]  # (K, G): row b at [b // G, b % G]


@pytest.mark.parametrize("trailing", [(), (5,)])
def test_reductions_equal_a_loop_over_the_groups(trailing):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(12, *trailing, generator=gen, dtype=torch.float64)
    groups = Groups.contiguous(12, 4)
    for reduce in ("sum", "mean", "amin", "amax"):
        loop = torch.stack([getattr(values[4 * k : 4 * k + 4], reduce)(0) for k in range(3)])  # (K, ...)
        torch.testing.assert_close(groups.reduce(values, reduce), loop, rtol=0, atol=1e-15)
        torch.testing.assert_close(groups.rows(values, reduce), loop.repeat_interleave(4, 0), rtol=0, atol=1e-15)


def test_layout_errors():
    with pytest.raises(ValueError, match="whole groups of 4"):
        Groups.contiguous(6, 4)
    with pytest.raises(ValueError, match="whole groups of 0"):
        Groups.contiguous(4, 0)
    with pytest.raises(ValueError, match="cover 8 rows"):
        Groups.contiguous(8, 4).covering(4)
    assert Groups.contiguous(8, 4).covering(8).num_groups == 2
    assert Groups.contiguous(0, 4).num_groups == 0
