"""A fixed "generation batch" and fixed off-policy log-ratios, for invariance tests that bypass generation.

Generation is random and its samples change with the world size, so the invariance tests feed every run the same
precomputed global batch (each process its contiguous slice, as TRL's `process_slice` does) and a behaviour policy
defined by the token log-ratios it produces at the initial parameters: `old = logp_initial - log_ratio`, hence
`log r = logp - old = log_ratio` exactly at the first (and only) step.

Pure torch: no TRL import, so a pytest process can use it without paying for TRL.
"""

from __future__ import annotations

import torch
from torch import Tensor

NUM_GROUPS = 4
GROUP_SIZE = 4
PROMPT_LEN = 6
COMPLETION_LEN = 8
NUM_ROWS = NUM_GROUPS * GROUP_SIZE  # 16: two whole groups (8 rows) per process on 2 processes
HALF = NUM_ROWS // 2  # rows of one process (2 processes), or of one micro-batch (2 accumulation steps)

# Off-policy scenarios: per-row shift of the token log-ratios plus token noise (see `log_ratios`).
#   mixed:     rows shifted in [-0.25, 0.25], token noise 0.15: token clips (0.2 / 0.28) act on some tokens only,
#              and a 0.05 / 0.08 sequence clip (DFPO) on some sequences only.
#   split:     first half +0.3, second half -0.3: each half's ECHO batch ratio R is clipped (e^{+-0.3} vs 1 +- 0.2),
#              the union's (mean ~0) is not.
#   shifted:   first half +0.4, second half +0.3: every R (halves and union) is clipped above.
#   unclipped: first half +0.05, second half -0.05: no R is clipped (halves or union).
SCENARIOS = ("mixed", "split", "shifted", "unclipped")


def group_batch(vocab_size: int, pad_token_id: int, seed: int = 0) -> dict[str, Tensor]:
    """(NUM_ROWS, ...) tensors in the layout `_generate_and_score_completions` returns, for NUM_GROUPS groups.

    Every row of a group carries the same (left-padded) prompt; completions are ragged (right padding), and the two
    halves hold different token counts (so per-half normalisers differ: see the bnpo cases). `rewards_per_func` is
    (NUM_ROWS, 1) raw rewards (one reward function); `advantages` are their group-centred, std-scaled values (TRL's
    default `scale_rewards="group"` form).
    """
    g = torch.Generator().manual_seed(seed)
    low = 4  # skip the special tokens
    prompts = torch.randint(low, vocab_size, (NUM_GROUPS, PROMPT_LEN), generator=g)  # (K, P)
    prompt_mask = torch.ones(NUM_GROUPS, PROMPT_LEN, dtype=torch.long)  # (K, P)
    prompt_mask[1, :2] = 0  # a left-padded prompt
    prompt_mask[3, :1] = 0
    prompts = prompts.masked_fill(prompt_mask == 0, pad_token_id)
    prompt_ids = prompts.repeat_interleave(GROUP_SIZE, dim=0)  # (N, P)
    prompt_mask = prompt_mask.repeat_interleave(GROUP_SIZE, dim=0)  # (N, P)

    completion_ids = torch.randint(low, vocab_size, (NUM_ROWS, COMPLETION_LEN), generator=g)  # (N, T)
    # ragged lengths, fixed: a one-token completion, and 49 vs 29 tokens in the two halves
    lengths = torch.tensor([8, 5, 6, 5, 7, 8, 3, 7, 1, 4, 2, 8, 3, 5, 2, 4])  # (N,)
    completion_mask = (torch.arange(COMPLETION_LEN)[None, :] < lengths[:, None]).long()  # (N, T)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_token_id)

    rewards = torch.rand(NUM_ROWS, generator=g) * 2  # (N,)
    grouped = rewards.view(NUM_GROUPS, GROUP_SIZE)  # (K, G)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)  # (N,)
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "rewards_per_func": rewards.unsqueeze(1),  # (N, 1)
        "num_items_in_batch": completion_mask.sum(),  # () tokens of the whole generation batch
    }
    assert batch["completion_mask"][:HALF].sum() != batch["completion_mask"][HALF:].sum()
    return batch


def log_ratios(scenario: str, seed: int = 1) -> Tensor:
    """(NUM_ROWS, COMPLETION_LEN) token log-ratios log(pi_theta / pi_old) at the initial parameters."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(NUM_ROWS, COMPLETION_LEN, generator=g)  # (N, T)
    if scenario == "mixed":
        shift = (torch.rand(NUM_ROWS, generator=g) - 0.5) * 0.5  # (N,) in [-0.25, 0.25]
        return shift[:, None] + 0.15 * noise
    halves = {"split": (0.3, -0.3), "shifted": (0.4, 0.3), "unclipped": (0.05, -0.05)}
    if scenario not in halves:
        raise ValueError(f"unknown scenario {scenario!r}; use one of {SCENARIOS}")
    first, second = halves[scenario]
    shift = torch.tensor([first] * HALF + [second] * HALF)  # (N,)
    return shift[:, None] + 0.05 * noise


def echo_log_batch_ratio(log_ratio: Tensor, mask: Tensor) -> float:
    """log R of ECHO (Eq. 6): the token-mean log-ratio over `mask`."""
    return float((log_ratio * mask).sum() / mask.sum())
