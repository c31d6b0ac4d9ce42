"""The mechanism report's definitions and counting (`trl_groupopt.methods.mechanism`, the methods' `MECHANISM`s): one
definition per method, shared by the trainers and the stress benchmark. The trainers' use of it (the `acted/<method>`
metric, `mechanism_report`, `train()`'s report) is in tests/trainers/test_mechanism_report.py and, trained,
tests/e2e/test_run_report.py."""

from __future__ import annotations

import math

import pytest

from benchmarks import stress
from trl_groupopt import METHODS
from trl_groupopt.methods.mechanism import Mechanism, MechanismTracker, Observed

TOY = Mechanism(
    method="toy",
    name="Toy's clip",
    what="a toy ratio was clipped",
    keys=("toy/clipped",),
    acts=lambda clipped: clipped > 0,
    observed=(Observed("R", "toy/ratio"), Observed("share", "toy/share", "mean")),
    inert="this run trained as the base objective",
    hint="lower toy_epsilon",
)
PAIR = Mechanism(method="pair", name="Pair's baseline", what="ours was below theirs", keys=("p/ours", "p/theirs"),
                 acts=lambda ours, theirs: ours < theirs, inert="it ran as the pair", hint="pair up")  # fmt: skip


def test_every_registered_method_has_one_definition_the_benchmark_shares():
    """The stress benchmark reads each method's spec: it summarises the keys the mechanism reads and keeps every
    step's value of them (`MECHANISM_PREFIXES`), and counts with the mechanism itself (`mechanism_acted`)."""
    assert set(stress.MECHANISM_METRICS) == set(METHODS)
    for name, spec in METHODS.items():
        mechanism = spec.mechanism
        assert mechanism is not None and mechanism.method == name, name
        assert mechanism.metric == f"acted/{name}" and mechanism.inert and mechanism.hint, name
        assert set(mechanism.watched_keys) | {spec.headline_metric} <= set(stress.MECHANISM_METRICS[name]), name
        assert all(key.startswith(stress.MECHANISM_PREFIXES) for key in stress.MECHANISM_METRICS[name]), name
        run = {"method": name, "mechanism": {key: {"steps": [1], "values": [0.0]} for key in mechanism.keys}}
        assert stress.mechanism_acted([run])["what"] == mechanism.what, name


def test_the_method_name_comes_from_the_spec_and_is_required_once():
    """`Mechanism.method` is set by the spec that holds it (the name is written once; the spec holds a bound copy,
    the frozen definition is not mutated), and a bound definition belongs to one method; a definition without `inert`
    / `hint` is refused (the report must say what ran and what to do)."""
    from trl_groupopt.methods.spec import MethodSpec

    mechanism = Mechanism(name="M", what="w", keys=("k",), acts=bool, inert="i", hint="h")
    assert mechanism.method == ""
    spec = MethodSpec(name="first", trainer_class="x:Y", paper="p", headline_metric="k", mechanism=mechanism)
    assert spec.mechanism.method == "first" and spec.mechanism.metric == "acted/first"
    assert mechanism.method == "" and spec.mechanism.bound_to("first") is spec.mechanism
    with pytest.raises(ValueError, match="belongs to method 'first', not 'second'"):
        MethodSpec(name="second", trainer_class="x:Y", paper="p", headline_metric="k", mechanism=spec.mechanism)
    with pytest.raises(ValueError, match="inert and hint"):
        Mechanism(name="M", what="w", keys=("k",), acts=bool, inert="", hint="h")


def test_tracker_state_round_trips_through_json():
    """What a checkpoint carries (`trainer_state.json`): a restored tracker continues the counts of the whole run."""
    import json

    tracker = MechanismTracker([TOY])
    for clipped in (0.0, 1.0, 0.0):
        tracker.record("toy/clipped", clipped)
        tracker.record("toy/ratio", 0.9 + clipped / 10)
        tracker.end_step()
    resumed = MechanismTracker([TOY])
    resumed.restore(json.loads(json.dumps(tracker.state())))
    resumed.record("toy/clipped", 1.0)
    resumed.record("toy/ratio", 1.2)
    resumed.end_step()
    (outcome,) = resumed.report("toy", "grpo").outcomes
    assert (outcome.steps, outcome.acted, outcome.observed["R"]) == (4, 2, (0.9, 1.2))


@pytest.mark.parametrize("residual, verdict", [(0.293, True), (0.26, False), (0.05, False)])
def test_dfpo_says_when_the_run_is_clipping_dominated(residual, verdict):
    """DFPO's definition carries its verdict (docs/dfpo.md): a cancellation residual within 10% of GSPO's on the same
    batches is a clipping-dominated run ("widen epsilon"), whether or not the transform acted."""
    tracker = MechanismTracker([METHODS["dfpo"].mechanism])
    for shrink in (0.5, 1.0):
        tracker.record("dfpo/shrink", shrink)
        tracker.record("dfpo/cancellation_residual", residual)
        tracker.record("dfpo/cancellation_residual_gspo", 0.292)
        tracker.end_step()
    text = tracker.report("dfpo", "grpo").text
    assert text.startswith("DFPO's in-group re-weighting acted on 1 of 2 optimizer steps")
    assert ("clipping-dominated" in text and "widen epsilon" in text) is verdict


@pytest.mark.parametrize(
    "method, values, acted",
    [
        ("echo", {"echo/batch_clipped": 0.0}, False),
        ("echo", {"echo/batch_clipped": 0.5}, True),
        ("ctpo", {"clip_ratio/region_mean": 0.01, "ctpo/dual_clip": 0.0}, True),
        ("ctpo", {"clip_ratio/region_mean": 0.0, "ctpo/dual_clip": 0.02}, True),  # issue 51: only the dual clip bound
        ("ctpo", {"clip_ratio/region_mean": 0.0, "ctpo/dual_clip": 0.0}, False),
        ("dfpo", {"dfpo/shrink": 1.0}, False),
        ("dfpo", {"dfpo/shrink": 0.999}, True),
        ("grpo_fix", {"dfpo/sym_clip_ratio": 0.0}, False),
        ("otb", {"otb/grad_second_moment": 1.0, "otb/grad_second_moment_group_mean_baseline": 2.0}, True),
        ("otb", {"otb/grad_second_moment": 2.0, "otb/grad_second_moment_group_mean_baseline": 2.0}, False),
        ("grpo", {"clip_ratio/region_mean": 0.0}, False),
    ],
)
def test_the_definitions(method, values, acted):
    mechanism = METHODS[method].mechanism
    assert mechanism.acted_on(values) is acted
    assert mechanism.acted_on({}) is None  # not logged: not measured
    assert mechanism.acted_on(dict.fromkeys(values, math.nan)) is None


def test_tracker_counts_optimizer_steps_on_the_step_mean():
    tracker = MechanismTracker([TOY, PAIR])
    assert tracker.keys == {"toy/clipped", "toy/ratio", "toy/share", "p/ours", "p/theirs"}
    # step 1: two micro-batches, one clipped: the step's mean > 0 -> acted
    for value in (0.0, 1.0):
        tracker.record("toy/clipped", value)
    tracker.record("toy/ratio", 0.95)
    tracker.record("toy/share", 0.25)
    tracker.record("unrelated/key", 5.0)
    tracker.record("p/ours", 1.0)
    tracker.record("p/theirs", 3.0)
    assert tracker.end_step() == {"acted/toy": 1.0, "acted/pair": 1.0}
    # step 2: nothing clipped; the pair not measured (one key NaN)
    tracker.record("toy/clipped", 0.0)
    tracker.record("toy/ratio", 1.08)
    tracker.record("toy/share", 0.75)
    tracker.record("p/ours", math.nan)
    tracker.record("p/theirs", 1.0)
    assert tracker.end_step() == {"acted/toy": 0.0}
    # step 3: nothing logged at all
    assert tracker.end_step() == {}
    report = tracker.report("toy", "grpo")
    toy, pair = report.outcomes
    assert (toy.steps, toy.acted, pair.steps, pair.acted) == (2, 1, 1, 1)
    assert toy.observed == {"R": (0.95, 1.08), "share": 0.5}
    assert toy.text == "Toy's clip acted on 1 of 2 optimizer steps (R within [0.9500, 1.0800]; share: mean 0.5): " \
                       "a toy ratio was clipped on 50% of them. Not counted: 1 step (3) on which toy/clipped was " \
                       "undefined."  # fmt: skip
    assert pair.text.endswith("Not counted: 2 steps (2 and 3) on which p/ours or p/theirs was undefined.")
    assert report.never_acted == [] and report.text.endswith("\nAdvantage estimator: grpo.")
    data = report.to_dict()
    assert data["method"] == "toy" and data["advantage_estimator"] == "grpo"
    assert data["mechanisms"][0] | {"text": None} == {
        "method": "toy", "mechanism": "Toy's clip", "acted_means": "a toy ratio was clipped", "metric": "acted/toy",
        "steps": 2, "acted": 1, "fraction": 0.5, "observed": {"R": [0.95, 1.08], "share": 0.5}, "undefined": 1,
        "undefined_steps": [3], "text": None,
    }  # fmt: skip
    tracker.reset()
    assert tracker.report("toy", "grpo").outcomes[0].steps == 0


def test_report_of_a_mechanism_that_never_acted_says_what_ran_and_how_to_make_it_act():
    tracker = MechanismTracker([TOY])
    for ratio in (0.954, 1.008):
        tracker.record("toy/clipped", 0.0)
        tracker.record("toy/ratio", ratio)
        tracker.end_step()
    report = tracker.report("toy", "otb")
    (outcome,) = report.never_acted
    assert outcome.text == (
        "Toy's clip acted on 0 of 2 optimizer steps (R within [0.9540, 1.0080]): this run trained as the base "
        "objective; to make it act, lower toy_epsilon."
    )
    assert report.text == outcome.text + "\nAdvantage estimator: otb."
    unmeasured = MechanismTracker([PAIR]).report("pair", "grpo")
    assert not unmeasured.never_acted
    assert unmeasured.outcomes[0].text == "Pair's baseline: not measured (no optimizer step logged p/ours, p/theirs)."


def test_observed_stat_is_checked():
    with pytest.raises(ValueError, match="'range' or 'mean'"):
        Observed("R", "toy/ratio", "median")


def test_the_steps_on_which_the_metric_was_undefined_are_named():
    """Was: "acted on 9 of 19 optimizer steps" in a 20-step run, the 20th left out without a word (issue 46,
    friction). The undefined steps are counted, the first of them named, and both survive a checkpoint."""
    import json

    tracker = MechanismTracker([TOY])
    for step in range(1, 21):
        if step != 20:  # step 20 logs no defined value (e.g. no token the clip applies to)
            tracker.record("toy/clipped", float(step % 2))
        tracker.end_step(step)
    (outcome,) = tracker.report("toy", "grpo").outcomes
    assert (outcome.steps, outcome.acted, outcome.undefined, outcome.undefined_steps) == (19, 10, 1, (20,))
    assert outcome.text.startswith("Toy's clip acted on 10 of 19 optimizer steps")
    assert outcome.text.endswith("Not counted: 1 step (20) on which toy/clipped was undefined.")
    resumed = MechanismTracker([TOY])
    resumed.restore(json.loads(json.dumps(tracker.state())))
    for step in range(21, 31):
        resumed.end_step(step)
    (outcome,) = resumed.report("toy", "grpo").outcomes
    assert outcome.text.endswith("Not counted: 11 steps (20, 21, 22, 23, 24, ...) on which toy/clipped was undefined.")
