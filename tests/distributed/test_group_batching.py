"""Group-aligned micro-batches: a permutation of whole groups, every micro-batch holds whole groups, `group_ids`
right, on 1 and 2 processes, with steps_per_generation (4) > gradient_accumulation_steps (2)."""

from collections import Counter

import pytest
import torch

from tests.distributed.harness import launch
from trl_groupopt.trainer.batching import group_ids_for_local_batch, shuffle_whole_groups

NUM_GENERATIONS = 2


def test_shuffle_whole_groups_is_a_permutation_of_groups():
    group_ids = torch.arange(12) // 3  # 4 groups of 3
    batch = {"x": torch.arange(12) * 10, "rows": [f"r{i}" for i in range(12)], "n": torch.tensor(5), "none": None}
    out = shuffle_whole_groups(batch, group_ids, generator=torch.Generator().manual_seed(3))
    new_ids = (out["x"] // 10) // 3
    assert sorted(out["x"].tolist()) == batch["x"].tolist()
    assert out["rows"] == [f"r{v // 10}" for v in out["x"].tolist()]
    assert out["n"] is batch["n"] and out["none"] is None
    # each group's rows are contiguous and in their original order
    for start in range(0, 12, 3):
        chunk = out["x"][start : start + 3] // 10
        assert (chunk // 3).unique().numel() == 1
        assert chunk.tolist() == sorted(chunk.tolist())
    assert new_ids.tolist() != group_ids.tolist()  # seed 3 gives a non-identity order


def test_shuffle_rejects_non_contiguous_groups():
    with pytest.raises(ValueError, match="contiguous"):
        shuffle_whole_groups({"x": torch.arange(4)}, torch.tensor([0, 1, 0, 1]))


def test_group_ids_for_local_batch():
    assert group_ids_for_local_batch(8, 4, 0).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert group_ids_for_local_batch(8, 4, 1).tolist() == [2, 2, 2, 2, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="multiple of num_generations"):
        group_ids_for_local_batch(6, 4, 0)


def _check_rank(result):
    steps_per_generation = 4
    batches = result["micro_batches"]
    assert len(batches) == 4  # 2 optimizer steps x 2 accumulation steps
    assert len(result["generations"]) == 1  # one generation batch serves 4 micro-batches
    generated = result["generations"][0]
    seen = []
    for batch in batches:
        counts = Counter(batch["group_ids"])
        assert all(c == NUM_GENERATIONS for c in counts.values()), counts  # whole groups only
        ids = batch["group_ids"]
        for i, gid in enumerate(ids):  # rows of a group adjacent and sharing the prompt
            first = ids.index(gid)
            assert ids[first : first + NUM_GENERATIONS] == [gid] * NUM_GENERATIONS
            assert batch["prompt_ids"][i] == batch["prompt_ids"][first]
        seen.extend(dict.fromkeys(ids))
    # the micro-batches of one generation use every generated group exactly once ...
    assert sorted(seen) == sorted(set(generated)) and len(seen) == len(set(seen))
    assert len(batches) <= steps_per_generation
    return seen


@pytest.mark.parametrize("world_size", [1, 2])
def test_group_batching_across_processes(tmp_path, world_size):
    results = launch("group_batching.py", world_size, tmp_path, "--world-size", str(world_size))
    orders = [_check_rank(r) for r in results]
    assert all(r["world_size"] == world_size for r in results)
    # ... and, over processes, the groups are disjoint and together the whole global generation batch
    all_groups = [g for order in orders for g in order]
    assert sorted(all_groups) == list(range(len(all_groups)))
    # ... in a shuffled order (fixed seed: TRL seeds the RNG; a regression to no shuffle would fail here)
    assert any(order != sorted(order) for order in orders)
