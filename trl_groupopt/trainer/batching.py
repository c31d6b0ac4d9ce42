"""What each micro-batch carries: whole groups with `group_ids` where the objective or estimator couples a group's
sequences, the raw `rewards` for estimators that read them, and for a method the rows of its equal-reward groups
(which `GroupOptTrainer.compute_advantages` gives advantage 0)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def group_ids_for_local_batch(num_rows: int, num_generations: int, process_index: int, device=None) -> Tensor:
    """(num_rows,) global group index of each local row: TRL's `RepeatSampler` yields each prompt `num_generations`
    times in a row, and each process holds a contiguous slice of the global generation batch."""
    # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): `process_slice` of the gathered batch
    if num_rows % num_generations != 0:
        raise ValueError(
            f"A process holds {num_rows} completions, not a multiple of num_generations={num_generations}: "
            "groups would straddle processes."
        )
    rows = process_index * num_rows + torch.arange(num_rows, device=device)
    return rows // num_generations


def shuffle_whole_groups(batch: dict[str, Any], group_ids: Tensor, generator: torch.Generator | None = None):
    """Permute whole groups of a generation batch, keeping each group's rows contiguous and in order (TRL's
    `shuffle_sequence_dict` would scatter groups across micro-batches)."""
    # mirrors trl.trainer.utils.shuffle_sequence_dict (trl 1.16.0): which values are permuted and how
    unique_groups, inverse = torch.unique_consecutive(group_ids, return_inverse=True)
    num_groups = unique_groups.numel()
    if torch.unique(group_ids).numel() != num_groups:
        raise ValueError("group_ids must be contiguous: the rows of one group must be adjacent")
    group_order = torch.randperm(num_groups, generator=generator)
    # Stable sort of each row's position in the new group order keeps the rows of a group in their order.
    new_rank = torch.empty_like(group_order)
    new_rank[group_order] = torch.arange(num_groups)
    row_order = torch.sort(new_rank[inverse.cpu()], stable=True).indices  # (N,)

    num_rows = group_ids.shape[0]

    def permute(value):
        if isinstance(value, Tensor) and value.ndim >= 1 and value.shape[0] == num_rows:
            return value[row_order.to(value.device)]
        if isinstance(value, list) and len(value) == num_rows:
            return [value[i] for i in row_order.tolist()]
        return value

    return {key: permute(value) for key, value in batch.items()}


#: The batch field marking, (N,) bool, the rows whose group's scored rewards are all equal (`equal_reward_rows`).
EQUAL_REWARDS = "equal_reward_rows"


def zero_equal_reward_rows(advantages: Tensor, equal: Tensor | None) -> Tensor:
    """The equal-reward rule: advantage 0 on the rows `equal` (B,) marks (a group without a reward contrast contributes
    exactly nothing); `advantages` itself where nothing is marked (None)."""
    return advantages if equal is None else torch.where(equal, 0.0, advantages)


def equal_reward_rows(rewards: Tensor, num_generations: int) -> Tensor:
    """(N,) True on the rows of every group whose scored `rewards` (N,) are all equal (NaN: unscored). TRL centres by
    the group mean, which float rounding does not always return exactly (float32: 0.3 six times leaves ~3e-8), then
    divides by ``std + 1e-4``: such a group would train with advantages ~3e-4 of one sign instead of 0."""
    grouped = rewards.view(-1, num_generations)  # (K, G)
    scored = ~torch.isnan(grouped)
    highest = torch.where(scored, grouped, -torch.inf).amax(dim=1)  # (K,)
    lowest = torch.where(scored, grouped, torch.inf).amin(dim=1)  # (K,); an all-unscored group: inf > -inf
    return (highest == lowest).repeat_interleave(num_generations)  # (N,)


def _groups_share_prompts(trainer, output: dict[str, Any], inputs, num_generations: int) -> bool:
    # Each rollout's `reset()` may extend its prompt: compare dataset rows.
    if trainer.environment_factories is not None:
        prompts = [x.get("prompt") for x in inputs]
        return all(p == prompts[i - i % num_generations] for i, p in enumerate(prompts))
    grouped = output["prompt_ids"].view(-1, num_generations, output["prompt_ids"].size(-1))  # (K, G, P)
    return torch.equal(grouped, grouped[:, :1].expand_as(grouped))


def add_batch_fields(trainer, output: dict[str, Any], inputs) -> dict[str, Any]:
    """TRL's batch with `group_ids` and raw `rewards` where needed, and for a method the rows of equal-reward groups
    (`EQUAL_REWARDS`; the batch's advantages stay TRL's)."""
    t = trainer
    num_rows = output["completion_ids"].shape[0]
    num_generations = t.group_size
    # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): `process_slice`
    start = t.accelerator.process_index * num_rows
    if t.whole_groups:
        output["group_ids"] = group_ids_for_local_batch(
            num_rows, num_generations, t.accelerator.process_index, output["completion_ids"].device
        )
        if not _groups_share_prompts(t, output, inputs, num_generations):
            raise RuntimeError(
                "Completions of one group carry different prompts: the sampler did not deliver whole groups to this "
                "process. Please report this with your accelerate and TRL versions."
            )
    if t.estimator.needs_raw_rewards:
        output["rewards"] = global_raw_rewards(t)[start : start + num_rows]
    if t.has_own_objective and t.multi_objective_aggregation == "sum_then_normalize":
        # The rows `compute_advantages` gives advantage 0 (the equal-reward rule): TRL's own GRPO keeps TRL's
        # advantages; "normalize_then_sum" centres over the whole batch, where an equal group has a signal.
        equal = equal_reward_rows(global_raw_rewards(t), num_generations)[start : start + num_rows]
        output[EQUAL_REWARDS] = equal.to(output["advantages"].device)
    return output


def global_raw_rewards(trainer) -> Tensor:
    """(N_global,) weighted sum of the reward functions (TRL's `reward`, before centring); NaN: unscorable."""
    # mirrors GRPOTrainer._generate_and_score_completions (trl 1.16.0): the `rewards` sum
    rewards_per_func = trainer._raw_rewards_per_func  # (N_global, F), kept by `_calculate_rewards`
    weights = trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)
    rewards = (rewards_per_func * weights).nansum(dim=1)  # (N_global,)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards
