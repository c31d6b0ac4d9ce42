"""A run that cannot learn says so (trl_groupopt/trainer/learning_signal.py): the step count, the one warning, and the
mechanism report without method advice for a run that never had a signal. In training: tests/e2e/test_learning_signal.py.
"""

from __future__ import annotations

from trl_groupopt.methods.mechanism import MechanismTracker
from trl_groupopt.methods.registry import get_method
from trl_groupopt.trainer.learning_signal import FIRST_STEPS, LearningSignal


def test_a_step_has_a_signal_when_a_rollout_it_trained_on_had_one():
    signal = LearningSignal()
    signal.rollout(1.0)  # one rollout, two optimizer steps: both without
    assert signal.end_step(10) is None and signal.end_step(10) is None
    signal.rollout(0.75)  # a group with contrast
    signal.end_step(10)
    signal.rollout(1.0)
    signal.rollout(0.5)  # two rollouts in one step, one with contrast
    signal.end_step(10)
    signal.rollout(float("nan"))  # nothing scored: no signal
    signal.end_step(10)
    assert signal.counts == (3, 5)


def test_the_first_steps_without_a_signal_warn_once_naming_causes_and_fixes():
    signal = LearningSignal()
    said = []
    for _ in range(2 * FIRST_STEPS):
        signal.rollout(1.0)
        said.append(signal.end_step(40))
    assert said[FIRST_STEPS - 1] is not None and [s for s in said if s] == [said[FIRST_STEPS - 1]]
    text = said[FIRST_STEPS - 1]
    assert text.startswith(f"No learning signal on {FIRST_STEPS} of {FIRST_STEPS} optimizer steps")
    for cause in ("never produces the answer format", "beyond the model", "returns a constant", "To try"):
        assert cause in text
    assert signal.end_run() is None  # once per run


def test_a_share_of_the_run_without_a_signal_warns_at_its_end():
    signal = LearningSignal()
    for frac in [0.5] + [1.0] * 5 + [0.5] * 4:  # 5 of 10: the stated share
        signal.rollout(frac)
        assert signal.end_step(10) is None
    assert signal.end_run().startswith("No learning signal on 5 of 10 optimizer steps")
    mostly = LearningSignal()
    for frac in [0.5] * 6 + [1.0] * 4:
        mostly.rollout(frac)
        mostly.end_step(10)
    assert mostly.end_run() is None and mostly.counts == (4, 10)


def test_a_short_run_warns_after_its_last_step():
    signal = LearningSignal()
    signal.rollout(1.0)
    signal.end_step(2)
    assert signal.end_step(2) is not None


def test_the_counts_survive_a_resume():
    signal = LearningSignal()
    for _ in range(3):
        signal.rollout(1.0)
        signal.end_step(40)
    resumed = LearningSignal()
    resumed.restore(signal.state())
    resumed.rollout(1.0)
    resumed.end_step(40)
    resumed.rollout(1.0)
    assert resumed.end_step(40) is not None and resumed.counts == (5, 5)


def _report(method: str, no_signal):
    mechanism = get_method(method).mechanism
    tracker = MechanismTracker([mechanism])
    for key in mechanism.keys:
        tracker.record(key, 0.0)
    tracker.end_step()
    return tracker.report(method, "grpo", no_signal)


def test_a_run_without_any_signal_gets_no_method_advice():
    """Was: OTB's report advised "use it where completions differ in length" on a run whose rewards were all 0."""
    for method in ("otb", "dfpo", "echo", "ctpo"):
        advised = _report(method, (0, 40))
        silent = _report(method, (40, 40))
        assert "No learning signal" not in advised.text
        assert silent.never_acted == [] and "to make it act" not in silent.text
        assert "no optimizer step had a learning signal" in silent.text
        assert silent.text.endswith("No learning signal on 40 of 40 optimizer steps.")
        assert silent.to_dict()["no_signal_steps"] == 40
    assert "No learning signal on 3 of 40" in _report("otb", (3, 40)).text


def test_compare_says_how_many_steps_had_no_signal(tmp_path, monkeypatch):
    """compare's table and progress line count each method's steps without a learning signal (results.json's
    `no_signal_steps`, copied into the run's record)."""
    from trl_groupopt.comparison import driver, report, trainrun

    def fake(spec, method, seed, env, before=None, track=None, device=None):
        return {"method": method, "seed": seed, "accuracy_before": 0.0, "accuracy_after": 0.0, "heldout_examples": 8,
                "steps": 3, "acted": None, "no_signal_steps": 3 if method == "otb" else 1, "wall_s": 1.0,
                "cpu_s": 0.5, "output_dir": "x"}  # fmt: skip

    monkeypatch.setattr(trainrun, "run_one", fake)
    driver.compare("grpo,otb", 2, tmp_path / "cmp", max_steps=3)
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "Optimizer steps without a learning signal (every group's rewards equal), over all runs: grpo 2 of 6; " \
           "otb 6 of 6." in text  # fmt: skip
    assert report.describe(fake(None, "otb", 0, None)).startswith(
        "accuracy 0.0% -> 0.0%, no learning signal on 3 of 3"
    )
