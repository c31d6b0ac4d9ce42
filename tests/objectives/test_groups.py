"""`common.Groups`, the group layout every group-coupled objective and estimator reduces over: the trainer's
contiguous layout (`view(K, G)`, nothing read from the device) and arbitrary ids (`from_ids`) give the same reductions."""

from __future__ import annotations

import pytest
import torch

from trl_groupopt.core.common import Groups, as_groups


def test_reductions_over_sparse_unordered_ids():
    ids = torch.tensor([7, 7, 3, 3, 3, 100, 7])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0])
    groups = Groups.from_ids(ids)
    assert groups.num_groups == 3 and groups.max_size == 3 and groups.size is None
    assert groups.rows(values, "sum").tolist() == [12.0, 12.0, 12.0, 12.0, 12.0, 6.0, 12.0]
    assert groups.rows(values, "amax").tolist() == [9.0, 9.0, 5.0, 5.0, 5.0, 6.0, 9.0]
    assert groups.rows(values, "amin").tolist() == [1.0, 1.0, 3.0, 3.0, 3.0, 6.0, 1.0]
    assert groups.rows(values, "mean").tolist() == pytest.approx([4.0, 4.0, 4.0, 4.0, 4.0, 6.0, 4.0])
    # the padded (K, G_max) view: groups in sorted-id order, members in batch order, padding filled
    assert groups.dense(values, fill=-1.0).tolist() == [[3.0, 4.0, 5.0], [1.0, 2.0, 9.0], [6.0, -1.0, -1.0]]


@pytest.mark.parametrize("trailing", [(), (5,)])
def test_contiguous_layout_matches_ids(trailing):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(12, *trailing, generator=gen, dtype=torch.float64)
    contiguous = Groups.contiguous(12, 4)
    by_ids = Groups.from_ids(torch.arange(12) // 4 * 3 + 5)
    assert contiguous.num_groups == by_ids.num_groups == 3
    for reduce in ("sum", "mean", "amin", "amax"):
        torch.testing.assert_close(
            contiguous.reduce(values, reduce), by_ids.reduce(values, reduce), rtol=0, atol=1e-15
        )
    torch.testing.assert_close(contiguous.rows(values, "sum"), by_ids.rows(values, "sum"), rtol=0, atol=1e-15)
    if not trailing:
        assert torch.equal(contiguous.dense(values), by_ids.dense(values))


def test_layout_errors():
    with pytest.raises(ValueError, match="whole groups of 4"):
        Groups.contiguous(6, 4)
    with pytest.raises(ValueError, match="integer"):
        Groups.from_ids(torch.zeros(4))
    with pytest.raises(ValueError, match=r"group_ids must be \(4,\)"):
        as_groups(torch.zeros(3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="cover 8 rows"):
        as_groups(Groups.contiguous(8, 4), 4)
    assert Groups.from_ids(torch.zeros(0, dtype=torch.long)).num_groups == 0
