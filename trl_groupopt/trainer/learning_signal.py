"""Whether a run can learn: an optimizer step has no learning signal when every group of the rollouts it trains on got
equal rewards (TRL's ``frac_reward_zero_std`` = 1): every advantage, the loss and the update are then zero, whatever
the method. Counted over the whole run by the run's report callback (trl_groupopt/trainer/report.py: saved in
checkpoints, restored on resume), warned about once, and read by the mechanism report (no method advice for a run that
never had a signal) and ``results.json``. Pure Python."""

from __future__ import annotations

from typing import Any

__all__ = ["FIRST_STEPS", "SHARE", "LearningSignal", "no_signal_text"]

#: The run warns when its first this many optimizer steps all had no signal...
FIRST_STEPS = 5
#: ... or, at its end, when at least this share of its steps had none.
SHARE = 0.5

_CAUSES = (
    "Likely causes: the model never produces the answer format the reward reads (look at a few completions: "
    "log_completions=True); the task is beyond the model; a reward function that returns a constant. To try: a reward "
    "with partial credit (e.g. format_reward beside accuracy_reward), more num_generations or a higher temperature, "
    "easier prompts, or a model that already solves some of them"
)


def no_signal_text(none: int, steps: int) -> str:
    """The warning: how many steps had no learning signal, what that means, its likely causes and what to try."""
    return (
        f"No learning signal on {none} of {steps} optimizer steps: every group's completions got the same reward "
        f"(frac_reward_zero_std = 1), so every advantage, the loss and the update were 0. {_CAUSES}."
    )


class LearningSignal:
    """Counts the optimizer steps without a learning signal. The trainer reports each training rollout's
    ``frac_reward_zero_std`` (:meth:`rollout`); a step has no signal when every rollout it trained on had none (the
    steps of one rollout share it). :meth:`end_step` and :meth:`end_run` return the warning, once per run."""

    def __init__(self) -> None:
        self.steps, self.none, self.warned = 0, 0, False
        self._current: list[bool] = []  # the rollouts since the last step: whether each had a signal
        self._last = True  # the newest rollout's

    def state(self) -> dict[str, Any]:
        return {"steps": self.steps, "none": self.none, "warned": self.warned}

    def restore(self, state: dict[str, Any] | None) -> None:
        self.__init__()
        if state:  # a resumed run: count the whole run
            self.steps, self.none, self.warned = int(state["steps"]), int(state["none"]), bool(state["warned"])

    def rollout(self, frac_reward_zero_std: float) -> None:
        self._last = frac_reward_zero_std < 1.0  # NaN (nothing scored): no signal either
        self._current.append(self._last)

    def end_step(self, max_steps: int) -> str | None:
        signal = any(self._current) if self._current else self._last
        self._current = []
        self.steps += 1
        self.none += not signal
        early = self.steps == min(FIRST_STEPS, max_steps) if max_steps > 0 else self.steps == FIRST_STEPS
        return self._warning() if early and self.none == self.steps else None

    def end_run(self) -> str | None:
        return self._warning() if self.steps and self.none / self.steps >= SHARE else None

    def _warning(self) -> str | None:
        if self.warned:
            return None
        self.warned = True
        return no_signal_text(self.none, self.steps)

    @property
    def counts(self) -> tuple[int, int] | None:
        """(steps without a signal, steps), None before any step."""
        return (self.none, self.steps) if self.steps else None
