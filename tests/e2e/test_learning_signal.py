"""A run that cannot learn says so where it runs (issue 51: 40 steps of reward 0 ended "0.0% -> 0.0%" with no word, and
OTB's report advised "use it where completions differ in length"): one warning after the first steps, the report's
count, and no method advice; a run with a reward contrast gets none of it. The counting: tests/test_learning_signal.py.
"""

from __future__ import annotations

import warnings

import pytest

from tests.helpers import method_trainer, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from trl_groupopt.trainer.learning_signal import FIRST_STEPS


def zero_reward(completions, **kwargs) -> list[float]:
    """The user's tasks: no completion is ever right."""
    return [0.0] * len(completions)


def _train(tmp_path, method, reward, steps=FIRST_STEPS + 1):
    tokenizer = tiny_tokenizer()
    trainer = method_trainer(method, tmp_path, tiny_model(tokenizer), tokenizer, reward_funcs=reward, max_steps=steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    said = [str(w.message) for w in caught if "learning signal" in str(w.message)]
    return trainer, said


@pytest.mark.parametrize("method", tested_methods())
def test_a_run_without_reward_contrast_warns_once_and_gets_no_method_advice(tmp_path, method, capsys):
    trainer, said = _train(tmp_path, method, zero_reward)
    assert len(said) == 1 and said[0].startswith(f"No learning signal on {FIRST_STEPS} of {FIRST_STEPS} optimizer")
    assert trainer.no_signal_steps == (FIRST_STEPS + 1, FIRST_STEPS + 1)
    report = trainer.mechanism_report
    if report is not None:
        assert report.never_acted == [] and "to make it act" not in report.text and "use it where" not in report.text
        assert report.text.endswith(f"No learning signal on {FIRST_STEPS + 1} of {FIRST_STEPS + 1} optimizer steps.")


def test_a_run_with_reward_contrast_says_nothing_of_it(tmp_path):
    from tests.helpers import length_reward

    trainer, said = _train(tmp_path, "otb", length_reward, steps=2)
    assert (
        said == [] and trainer.no_signal_steps == (0, 2) and "No learning signal" not in trainer.mechanism_report.text
    )
