"""The contract's inputs (float64 tensors from seeded generators), tolerances, and how properties are run."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: float32 versus float64, relative to the largest magnitude of the compared tensor.
FLOAT32_RTOL = 1e-4
#: Two computations of the same float64 quantity (another formula, another summation order).
FLOAT64_RTOL = 1e-9
GROUPS, GROUP_SIZE, LENGTH = 3, 4, 7  # K groups of G rows, T tokens: B = 12
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Case:
    """One input of the contract, float64: (B, T) log-probs, old log-probs and 0/1 int64 mask, (B,) advantages."""

    label: str  # names the input in a failure
    logps: Tensor
    old: Tensor
    advantages: Tensor
    mask: Tensor

    def tensors(self, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.logps.to(dtype), self.old.to(dtype), self.advantages.to(dtype), self.mask

    def where_masked(self, logps: Tensor, old: Tensor) -> Case:
        """This case with other log-probs (current and old) at the masked tokens."""
        valid = self.mask.bool()
        return Case(self.label, torch.where(valid, self.logps, logps), torch.where(valid, self.old, old),
                    self.advantages, self.mask)  # fmt: skip


def random_case(seed: int, *, log_ratio: float = 0.3, on_policy: bool = False) -> Case:
    """K groups of G rows: log-probs in [-3, -0.05], ragged rows (1..T valid tokens, a hole in one row), (B,)
    advantages summing to 0 in each group, as TRL's (pairs +-a, |a| >= 0.1, in random order), token log-ratios uniform in [-log_ratio, log_ratio] (0 on-policy)."""
    g = torch.Generator().manual_seed(seed)
    batch = GROUPS * GROUP_SIZE
    logps = -(torch.rand(batch, LENGTH, generator=g, dtype=torch.float64) * 2.95 + 0.05)
    lengths = torch.randint(1, LENGTH + 1, (batch,), generator=g)
    mask = (torch.arange(LENGTH) < lengths[:, None]).long()
    mask[0] = 1
    mask[0, LENGTH // 2] = 0  # a hole (a tool result inside a completion)
    magnitudes = torch.randn(GROUPS, GROUP_SIZE // 2, generator=g, dtype=torch.float64).abs() + 0.1
    pairs = torch.cat([magnitudes, -magnitudes], dim=1)  # (K, G) each group sums to 0 exactly, as TRL's advantages
    order = torch.stack([torch.randperm(GROUP_SIZE, generator=g) for _ in range(GROUPS)])
    advantages = pairs.gather(1, order).flatten()  # (B,)
    shift = (torch.rand(batch, LENGTH, generator=g, dtype=torch.float64) * 2 - 1) * log_ratio
    old = logps if on_policy else logps - shift
    kind = "on-policy" if on_policy else f"log-ratios within +-{log_ratio}"
    label = f"random seed {seed} ({kind}; row lengths {lengths.tolist()}, a hole in row 0)"
    return Case(label, logps, old.clone(), advantages, mask)


def extreme_cases() -> Iterator[Case]:
    """Log-ratios +20, -20, mixed +-20 and 0 times advantages +-1e6 (alternating rows) and 0; every case has an empty
    row (row 0) and a group whose rewards were all equal (group 1: advantages 0)."""
    base = random_case(0)
    sign = torch.ones(LENGTH, dtype=torch.float64)
    sign[1::2] = -1
    mask = base.mask.clone()
    mask[0] = 0
    for ratio_label, log_ratio in (("+20", 20.0), ("-20", -20.0), ("mixed +-20", 20.0 * sign), ("0", 0.0)):
        for adv_label, scale in (("+-1e6", 1e6), ("0", 0.0)):
            advantages = torch.full_like(base.advantages, scale)
            advantages[1::2] *= -1
            advantages[GROUP_SIZE : 2 * GROUP_SIZE] = 0.0
            label = (
                f"extreme: log-ratios {ratio_label}, advantages {adv_label}, row 0 empty, group 1 all-equal rewards"
            )
            yield Case(label, base.logps, base.logps - log_ratio, advantages, mask)


def permuted_within_groups(case: Case, seed: int) -> tuple[Case, Tensor]:
    """`case` with the rows of each group permuted, and the permutation (B,): new row b is old row ``order[b]``."""
    g = torch.Generator().manual_seed(seed)
    order = torch.cat([k * GROUP_SIZE + torch.randperm(GROUP_SIZE, generator=g) for k in range(GROUPS)])
    permuted = Case(case.label + f", rows permuted within groups as {order.tolist()}", case.logps[order],
                    case.old[order], case.advantages[order], case.mask[order])  # fmt: skip
    return permuted, order


def reward_case(seed: int) -> tuple[Tensor, Tensor]:
    """(B,) float32 rewards, multiples of 1/4 (exact in float32), and a ragged (B, T) mask from `random_case`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, (GROUPS * GROUP_SIZE,), generator=g).float() / 4, random_case(seed).mask


def mismatch(got: Tensor, want: Tensor, rtol: float) -> str | None:
    """None when ``|got - want| <= rtol * max |want|`` everywhere, else the largest difference."""
    error = (got.double() - want.double()).abs().max()
    scale = want.double().abs().max().clamp(min=torch.finfo(torch.float64).tiny)
    return None if error <= rtol * scale else f"off by {float(error):.3g} (largest |value| {float(scale):.3g})"


#: A property: its name, and its check, which returns one line per input that shows it failing.
Property = tuple[str, Callable[[Any], list[str]]]


def run_properties(subject: str, properties: Sequence[Property], argument: Any) -> None:
    """Run every property on `argument`; one AssertionError naming each that fails (its first failing input)."""
    lines = []
    for name, check in properties:
        try:
            failures = check(argument)
        except Exception as error:  # a property the objective cannot even run fails, saying why
            failures = [f"raised {type(error).__name__}: {error}"]
        if failures:
            more = f" (and {len(failures) - 1} more inputs)" if len(failures) > 1 else ""
            lines.append(f"- {name}: {failures[0]}{more}")
    if lines:
        raise AssertionError(f"{subject} fails {len(lines)} of {len(properties)} properties:\n" + "\n".join(lines))
