"""The run tells its story (issue 30), trained: every registered method's mechanism report (the definition the stress
benchmark counts with, per optimizer step), ECHO's report when its clip acts and when it never does, and what
`trl-groupopt train --method echo --max_steps 16` leaves behind (results.json's report, the card's held-out accuracy,
the held-out curve). The pieces without training: tests/test_mechanism.py, tests/test_reporting.py,
tests/trainers/test_mechanism_report.py, tests/hub/test_model_card.py."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from benchmarks import stress
from tests.helpers import clone_model, method_trainer, tiny_model, tiny_tokenizer
from tests.selection import tested_methods
from trl_groupopt import get_method
from trl_groupopt.cli import main as cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_model(tokenizer, seed=3), tmp_path_factory.mktemp("report")


def _train(tiny, method, name, **overrides):
    """3 optimizer steps off-policy (2 per generation, 2 micro-batches each), every step logged; returns the trainer,
    the report's warnings and stdout."""
    tokenizer, model, tmp = tiny
    trainer = method_trainer(method, tmp / name, clone_model(model), tokenizer, num_examples=32, max_steps=3,
                             steps_per_generation=4, gradient_accumulation_steps=2, disable_tqdm=True,
                             **overrides)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return trainer, [str(w.message) for w in caught if "optimizer steps" in str(w.message)]


def _as_stress_run(method: str, log_history) -> dict:
    """A stress-benchmark run record (`benchmarks.stress.run_one`'s `mechanism` series) from a trainer's log."""
    keys = {key for entry in log_history for key in entry if key.startswith(stress.MECHANISM_PREFIXES)}
    series = {key: {"steps": [e["step"] for e in log_history if e.get(key) is not None],
                    "values": [e[key] for e in log_history if e.get(key) is not None]} for key in keys}  # fmt: skip
    return {"method": method, "mechanism": series}


@pytest.mark.parametrize("method", tested_methods())
def test_every_method_reports_whether_its_mechanism_acted(tiny, method, capsys):
    """The trainer's count, step by step, is the stress benchmark's count on the logged steps (logging_steps=1): one
    definition; `acted/<method>` is logged every step; the report is printed, or warned when it never acted."""
    trainer, warned = _train(tiny, method, f"method-{method}")
    report = trainer.mechanism_report
    mechanism = get_method(method).mechanism
    if mechanism is None:  # a method registered without a definition: no report, nothing warned
        assert report is None and not warned and trainer.state.global_step == 3
        return
    (outcome,) = report.outcomes
    assert outcome.mechanism is mechanism and report.method == method
    assert outcome.steps == 3, outcome.text  # measured on every optimizer step
    counted = stress.mechanism_acted([_as_stress_run(method, trainer.state.log_history)])
    assert (counted["what"], counted["steps"], counted["acted"]) == (mechanism.what, outcome.steps, outcome.acted)
    logged = [e[mechanism.metric] for e in trainer.state.log_history if mechanism.metric in e]
    assert len(logged) == 3 and sum(logged) == outcome.acted
    for entry in trainer.state.log_history:  # the per-step metric is the definition applied to the step's log
        if mechanism.metric in entry:
            assert entry[mechanism.metric] == float(mechanism.acted_on(entry))
    printed = capsys.readouterr().out
    if outcome.never_acted:
        assert warned == [" ".join(report.text.splitlines())] and report.text not in printed  # warned in one line
    else:
        assert not warned and report.text in printed
    assert f"{mechanism.name} acted on {outcome.acted} of 3 optimizer steps" in report.text


def test_echo_report_when_the_batch_clip_acts_and_when_it_never_does(tiny, capsys):
    """A batch clip narrower than R's spread acts and is reported; one wider never acts, warns and says what ran."""
    tight, warned = _train(tiny, "echo", "echo-tight", batch_epsilon=1e-4)
    (outcome,) = tight.mechanism_report.outcomes
    assert outcome.acted > 0 and not warned
    assert f"ECHO's batch clip acted on {outcome.acted} of 3 optimizer steps (R within [" in capsys.readouterr().out
    wide, warned = _train(tiny, "echo", "echo-wide", batch_epsilon=0.9)
    (outcome,) = wide.mechanism_report.outcomes
    assert outcome.acted == 0 and outcome.steps == 3
    low, high = outcome.observed["R"]
    assert 0.1 < low <= high < 1.9
    (message,) = warned
    assert message.startswith(f"ECHO's batch clip acted on 0 of 3 optimizer steps (R within [{low:.4f}, {high:.4f}])")
    assert "trained as token-clipped DAPO plus the coupling term" in message and "to make it act," in message


def test_cli_run_states_the_report_and_the_heldout_accuracy(tmp_path):
    """`trl-groupopt train --method echo --max_steps 16`: results.json holds the mechanism report (steps acted /
    total) and the held-out curve; the card states the held-out accuracy before and after, and the report."""
    out = tmp_path / "echo"
    cli.main(["train", "--method", "echo", "--max_steps", "16", "--num_train_examples", "256",
              "--num_eval_examples", "32", "--heldout_eval_steps", "8", "--heldout_eval_examples", "16",
              "--output_dir", str(out)])  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    report = results["mechanism"]
    assert report["method"] == "echo" and report["advantage_estimator"] == "grpo"
    (echo,) = report["mechanisms"]
    assert echo["metric"] == "acted/echo" and echo["steps"] == 16 and 0 <= echo["acted"] <= 16
    assert echo["text"].startswith(f"ECHO's batch clip acted on {echo['acted']} of 16 optimizer steps (R within [")
    assert [step for step, _ in results["heldout_curve"]] == [0, 8, 16] and results["heldout_curve_examples"] == 16
    before, after = results["accuracy_before"], results["accuracy_after"]
    assert results["heldout_examples"] == 32 and not math.isnan(before) and not math.isnan(after)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert (
        f"Held-out greedy-decoding accuracy (32 prompts): **{before:.1%} before training, {after:.1%} after**." in card
    )
    assert echo["text"] in card and "licence" not in card and "license: apache-2.0" in card
    assert f'model="{out}"' in card  # the quick start loads the folder by absolute path
    state = json.loads((out / "trainer_state.json").read_text())
    logged = [e["heldout/accuracy"] for e in state["log_history"] if "heldout/accuracy" in e]
    assert logged == [accuracy for step, accuracy in results["heldout_curve"] if step > 0]


def test_the_report_of_a_resumed_run_counts_the_whole_run(tiny):
    """The report is saved in each checkpoint's `trainer_state.json` (`stateful_callbacks`) and restored on resume:
    a 4-step run resumed from a 2-step run's checkpoint reports all 4 steps (issue 38: not "acted on 0 of 2"), its
    counts those of the 2 saved steps plus the 2 resumed ones, and R's range covers the saved steps' range. (The
    2-step run's learning-rate schedule ends at step 2, so its first steps are not the 4-step run's.)"""
    tokenizer, model, tmp = tiny

    def run(name: str, max_steps: int, resume: bool = False):  # batch_epsilon: a clip R leaves, so it acts
        trainer = method_trainer("echo", tmp / name, clone_model(model), tokenizer, num_examples=32, save_steps=2,
                                 max_steps=max_steps, steps_per_generation=4, gradient_accumulation_steps=2,
                                 disable_tqdm=True, batch_epsilon=0.002, save_strategy="steps")  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train(resume_from_checkpoint=resume or None)
        return trainer

    (first,) = run("resume_cut", 2).mechanism_report.outcomes
    saved = json.loads((tmp / "resume_cut" / "checkpoint-2" / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["MechanismReportCallback"]["attributes"]["counts"]["counts"]["echo"] == [
        first.steps,
        first.acted,
    ]
    resumed = run("resume_cut", 4, resume=True)
    (whole,) = resumed.mechanism_report.outcomes
    logged = [e["acted/echo"] for e in resumed.state.log_history if "acted/echo" in e]  # the 2 saved, 2 resumed
    assert first.steps == 2 and first.acted == sum(logged[:2]) and len(logged) == whole.steps == 4
    assert whole.acted == sum(logged)
    (low, high), (first_low, first_high) = whole.observed["R"], first.observed["R"]
    assert low <= first_low and high >= first_high and whole.acted > 0
    assert "acted on" in resumed.mechanism_report.text and "of 4 optimizer steps" in resumed.mechanism_report.text
