"""`trl-groupopt compare` at its edges (issue 46), without training: no token in any file or printed line whatever
way it is spelled, a run that never outlives its driver, a damaged runs file read around (never a traceback), the
same settings however written, a data file edited in place, a held-out split that leaves too little to train on, a
failed run's real reason, Ctrl-C in one line, and the acted column's uncounted steps. The real runs:
tests/e2e/test_compare_edges.py."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from trl_groupopt.comparison import driver as compare_module
from trl_groupopt.comparison import runs as runfile
from trl_groupopt.comparison import trainrun

TOKEN = "hf_PLANTEDedgeTOKEN0123456789"
BASE = ["--methods", "grpo,otb", "--seeds", "2"]


def _fake_runs(monkeypatch, calls: list, *, envs: list | None = None, raise_at: dict | None = None,
               acted: dict | None = None) -> None:  # fmt: skip
    """Replace training: each (method, seed) 'trains' in no time; `raise_at[(method, seed)]` is raised there."""

    def fake(spec, method, seed, env, before=None, track=None, device=None):
        calls.append((method, seed))
        if envs is not None:
            envs.append(dict(env))
        if raise_at and (method, seed) in raise_at:
            raise raise_at.pop((method, seed))
        return {"method": method, "seed": seed, "accuracy_before": 0.18, "accuracy_after": 0.3 + 0.01 * seed,
                "heldout_examples": 8, "steps": 4, "acted": acted or {"what": "it acted", "steps": 4, "acted": 2},
                "wall_s": 1.0, "cpu_s": 0.5, "output_dir": "x"}  # fmt: skip

    monkeypatch.setattr(trainrun, "run_one", fake)


def _interrupted(argv: list[str]) -> int:
    """`main(argv)` where a run meets Ctrl-C: its exit status (a KeyboardInterrupt escaping it fails the test)."""
    try:
        return compare_module.main(argv)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped compare as a KeyboardInterrupt traceback")


def _no_token_in(out: Path, *texts: str) -> None:
    for path in out.rglob("*"):
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path
    for text in texts:
        assert TOKEN not in text


def _records(out: Path) -> list[tuple]:
    grid = runfile.Grid(("method", "seed"), None, None)
    return sorted(grid.key(r) for r in runfile.read_runs(out / "runs.jsonl", grid).records if "error" not in r)


# ------------------------------------------------------------------------------------------------ broken 3: secrets
@pytest.mark.parametrize("words", [["--hub_t", TOKEN], ["--hub-tok=" + TOKEN], ["--hub_toke", TOKEN]])
def test_an_abbreviated_hub_token_reaches_the_environment_and_no_file(words, tmp_path, monkeypatch, capsys):
    """train's parser reads `--hub_t X` as `--hub_token X` (argparse's abbreviations): compare must take it out too."""
    calls, envs = [], []
    _fake_runs(monkeypatch, calls, envs=envs)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "cmp"
    assert compare_module.main([*BASE, "--output_dir", str(out), *words, "--max_steps", "2"]) == 0
    assert len(envs) == 4 and all(e.get("HF_TOKEN") == TOKEN for e in envs)
    _no_token_in(out, *capsys.readouterr())


def test_the_printed_resume_command_after_ctrl_c_holds_no_token(tmp_path, monkeypatch, capsys):
    _fake_runs(monkeypatch, [], raise_at={("otb", 0): KeyboardInterrupt()})
    out = tmp_path / "cmp"
    assert _interrupted([*BASE, "--output_dir", str(out), "--hub_token", TOKEN]) == 130
    printed = capsys.readouterr()
    assert "resume with: trl-groupopt compare --methods grpo,otb" in printed.err
    _no_token_in(out, *printed)


def test_a_setup_line_holding_the_token_is_refused_before_anything_is_submitted(tmp_path, monkeypatch, capsys):
    from trl_groupopt.comparison import slurm

    monkeypatch.setattr(slurm, "check", lambda options: None)  # a cluster that takes the jobs (tests/slurm: real)
    monkeypatch.setattr(slurm.SlurmLauncher, "submit", lambda *a: pytest.fail("a job was submitted"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    argv = [*BASE, "--output_dir", str(tmp_path / "cmp"), "--launcher", "slurm", "--slurm_time", "9",
            "--slurm_setup", f"export HF_TOKEN={TOKEN}"]  # fmt: skip
    assert compare_module.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--slurm_setup holds a secret's value" in err and TOKEN not in err
    assert not (tmp_path / "cmp").exists()


def test_the_abbreviations_compare_takes_out_are_those_trains_parser_reads():
    from trl_groupopt.cli.script import MethodParser
    from trl_groupopt.comparison.argv import SECRET_ABBREVIATIONS

    parser = MethodParser("grpo", "train")
    for name, shortest in SECRET_ABBREVIATIONS.items():
        parsed = parser.parse_args_into_dataclasses([f"--{shortest}", "x"])
        assert [getattr(p, name, None) for p in parsed].count("x") == 1
        with pytest.raises(SystemExit):  # one letter less is ambiguous (or another option): not the secret
            parser.parse_args_into_dataclasses([f"--{shortest[:-1]}", "x"])


# ------------------------------------------------------------------------------------------------ broken 6: runs.jsonl
GOOD = '{"method": "otb", "seed": 1, "accuracy_before": 0.1, "accuracy_after": 0.2, "wall_s": 1, "cpu_s": 1}'


@pytest.mark.parametrize(
    ("damage", "where", "rerun"),
    [(GOOD[:40], "the last", [("otb", 1)]),  # a stop while the last line was written
     ("garbage \x00\xff", "middle", []),
     ('{"method": "otb"}', "middle", []),
     ("[1, 2]", "middle", []),
     ('{"method": "grpo", "seed": 0}', "middle", []),  # "finished" without an accuracy: not a run's record
     ('{"method": "grpo", "seed": 0, "settings": [1]}', "middle", []),
     ('{"invocation": 5}', "middle", [])],
)  # fmt: skip
def test_a_damaged_line_of_the_runs_file_is_skipped_with_a_warning(damage, where, rerun, tmp_path, monkeypatch,
                                                                   capsys):  # fmt: skip
    calls: list = []
    _fake_runs(monkeypatch, calls)
    out = tmp_path / "cmp"
    argv = [*BASE, "--output_dir", str(out)]
    assert compare_module.main(argv) == 0
    path = out / "runs.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if where == "the last":  # the record of otb-1 (the last run) cut short, the invocation line not yet written
        lines = [line for line in lines if '"otb", "seed": 1' not in line and "invocation" not in line]
        text = "".join(lines) + damage
    else:
        text = "".join(lines[:2]) + damage + "\n" + "".join(lines[2:])
    path.write_bytes(text.encode(errors="surrogateescape"))
    calls.clear()
    capsys.readouterr()
    assert compare_module.main(argv) == 0
    err = capsys.readouterr().err
    number = text.count("\n") + 1 if where == "the last" else 3
    assert f"runs.jsonl line {number} " in err and "skipped (the file keeps it)" in err, err
    assert calls == rerun  # the good records are all kept; a run whose record is damaged runs again, once
    assert damage.encode(errors="surrogateescape") in path.read_bytes()  # its bytes are kept
    assert _records(out) == [(m, s) for m in ("grpo", "otb") for s in (0, 1)]  # each run once
    assert len(json.loads((out / "compare.json").read_text())["runs"]) == 4
    calls.clear()
    assert compare_module.main(argv) == 0 and calls == []  # the line after a cut one is whole


def test_damaged_slurm_jobs_and_launcher_files_are_read_around(tmp_path, capsys):
    from trl_groupopt.comparison import slurm

    spec = trainrun.RunSpec(str(tmp_path), (), False, 8)
    launcher = slurm.SlurmLauncher(spec, slurm.SlurmOptions(time="10"), {}, {"train_args": []}, "cmd")
    launcher.jobs_path.parent.mkdir(parents=True)
    entry = {"method": "grpo", "seed": 0, "job_id": "7_0", "stderr": "/logs/7_0.err"}
    launcher.jobs_path.write_text(json.dumps(entry) + '\n[1]\n{"method": "otb", "seed": 0, "job_')
    assert launcher.jobs() == {("grpo", 0): entry}
    (tmp_path / "launcher.json").write_text('{"launcher": "sl')
    assert compare_module.main([*BASE, "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "launcher.json is damaged: delete it" in err


# ------------------------------------------------------------------------------------------------ weak: settings
def _data(path: Path, rows: int, offset: int = 0) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Compute {i}+1", "solution": str(i + 1)}) + "\n"
                            for i in range(offset, offset + rows)))  # fmt: skip
    return path


def test_the_same_settings_written_otherwise_join_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls: list = []
    _fake_runs(monkeypatch, calls)
    _data(tmp_path / "mine.jsonl", 40)
    given = ["--max_steps", "3", "--learning_rate", "1e-5", "--bf16", "--dataset_name", "mine.jsonl"]
    assert compare_module.main([*BASE, "--output_dir", "cmp", "--eval_examples", "8", *given]) == 0
    calls.clear()
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "mine.jsonl")
    for same in (["--dataset-name=./link.jsonl", "--bf16", "true", "--learning_rate=0.00001", "--max-steps=3"],
                 ["--max_steps=3", "--dataset_name", str(tmp_path / "mine.jsonl"), "--bf16=True", "--learning_rate",
                  "1e-05"]):  # fmt: skip
        assert compare_module.main([*BASE, "--output_dir", "cmp", "--eval_examples", "8", *same]) == 0, same
        assert calls == []  # every run is one of the folder's
    with pytest.raises(compare_module.CompareError, match=r"--max_steps 3 there, 5 here\): pass the train options"):
        compare_module.compare("grpo,otb", 2, "cmp", eval_examples=8, train_args=[*given[:-3], "--max_steps", "5",
                               "--dataset_name", "mine.jsonl"])  # fmt: skip


def test_a_folder_recorded_before_the_options_were_read_joins_them_reordered(tmp_path, monkeypatch):
    """Records written with `train_args` only (compare before issue 46) keep their folder valid."""
    _fake_runs(monkeypatch, [])
    out = tmp_path / "cmp"
    compare_module.compare("grpo,otb", 2, out, train_args=["--max_steps", "3", "--beta", "0.1"])
    path = out / "runs.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line.get("settings", {}).pop("train_options", None)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    calls: list = []
    _fake_runs(monkeypatch, calls)
    compare_module.compare("grpo,otb", 2, out, train_args=["--beta=0.1", "--max_steps=3"])
    assert calls == []


# ------------------------------------------------------------------------------------------------ weak: the split
def test_a_data_file_edited_in_place_is_refused_where_runs_trained_on_it(tmp_path, monkeypatch, capsys):
    calls: list = []
    _fake_runs(monkeypatch, calls)
    data, out = _data(tmp_path / "mine.jsonl", 40), tmp_path / "cmp"
    argv = [*BASE, "--output_dir", str(out), "--eval_examples", "8", "--dataset_name", str(data)]
    assert compare_module.main(argv) == 0
    heldout = (out / "data" / "heldout.jsonl").read_text()
    _data(data, 40, offset=100)  # the same file, other rows
    capsys.readouterr()
    calls.clear()
    assert compare_module.main(argv) == 2 and calls == []
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "changed since its held-out split was carved" in err and "another --output_dir" in err
    )
    assert (out / "data" / "heldout.jsonl").read_text() == heldout
    fresh = tmp_path / "fresh"  # carved, but no run used the split yet: carved again, and said
    argv = [*BASE, "--output_dir", str(fresh), "--eval_examples", "8", "--dataset_name", str(data)]
    compare_module.check(compare_module.parse_options(argv))
    from trl_groupopt.comparison.split import carve_heldout

    carve_heldout(compare_module.parse_options(argv), fresh / "data")
    _data(data, 40, offset=200)
    assert compare_module.main(argv) == 0 and "carving it again" in capsys.readouterr().out
    assert "Compute 2" in (fresh / "data" / "heldout.jsonl").read_text()  # rows of the file as it is now


def test_a_split_that_leaves_too_little_to_train_on_is_refused_and_a_split_is_said(tmp_path, monkeypatch, capsys):
    calls: list = []
    _fake_runs(monkeypatch, calls)
    data = _data(tmp_path / "mine.jsonl", 300)
    argv = [*BASE, "--output_dir", str(tmp_path / "cmp"), "--dataset_name", str(data)]
    assert compare_module.main([*argv, "--eval_examples", "200"]) == 2 and calls == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would hold out 200 of the 300 rows" in err and "leaving 100 to train on" in err
    assert "pass --eval_examples 150 or fewer" in err
    assert compare_module.main([*argv, "--eval_examples", "30"]) == 0
    printed = capsys.readouterr()
    assert "30 of 300 rows held out" in printed.out and "the other 270 train every run" in printed.out
    assert "Generating train split" not in printed.err  # the datasets library's bars: compare said it


def test_the_split_is_trains_own_and_the_one_compare_carved_before(tmp_path):
    """The shared helper (`data.heldout.split_heldout`, seed 0) holds out the rows compare's own shuffle did: the
    folders carved before it stay valid."""
    import datasets

    from trl_groupopt.comparison.options import Options
    from trl_groupopt.comparison.split import carve_heldout
    from trl_groupopt.data.heldout import split_heldout

    data = _data(tmp_path / "mine.jsonl", 50)
    options = Options(["grpo", "otb"], 2, str(tmp_path / "out"), eval_examples=12, train_args=["--dataset_name",
                                                                                                str(data)])  # fmt: skip
    carve_heldout(options, tmp_path / "out" / "data")
    rows = datasets.load_dataset("json", data_files=str(data), split="train")
    before = rows.shuffle(seed=0)  # compare's carve until issue 46
    before.select(range(12)).to_json(str(tmp_path / "old_heldout.jsonl"), lines=True)
    before.select(range(12, 50)).to_json(str(tmp_path / "old_train.jsonl"), lines=True)
    train, heldout = split_heldout(rows, 12)
    for name, part in (("heldout", heldout), ("train", train)):
        written = (tmp_path / "out" / "data" / f"{name}.jsonl").read_text()
        assert written == (tmp_path / f"old_{name}.jsonl").read_text()
        assert [json.loads(line)["prompt"] for line in written.splitlines()] == list(part["prompt"])


def test_heldout_prompts_are_sent_as_the_runs_trained_on_them(tmp_path):
    """Plain-string held-out prompts reach the model as train sends them: one user message under a chat template,
    the text itself with `--string_prompts raw`."""
    from trl_groupopt.data.offline import build_tokenizer

    _data(tmp_path / "heldout.jsonl", 3)
    tokenizer = build_tokenizer()
    assert tokenizer.chat_template is not None
    as_message = trainrun._heldout(tmp_path / "heldout.jsonl", tokenizer, "user_message")
    assert as_message[0]["prompt"] == [{"role": "user", "content": "Compute 0+1"}]
    raw = pytest.warns(UserWarning, match="bypass the tokenizer's chat template")
    with raw:
        assert trainrun._heldout(tmp_path / "heldout.jsonl", tokenizer, "raw")[0]["prompt"] == "Compute 0+1"


def test_runs_on_a_users_dataset_hold_no_rows_of_their_own_out(tmp_path):
    """compare scores the runs on its split: each run gets `--num_eval_examples 0`, or train would carve a tenth of
    compare's training part off again."""
    from trl_groupopt.comparison.options import Options
    from trl_groupopt.comparison.split import carve_heldout

    data = _data(tmp_path / "mine.jsonl", 200)
    options = Options(["grpo", "otb"], 2, str(tmp_path), eval_examples=20, train_args=["--dataset_name", str(data)])
    run_args, score_here = carve_heldout(options, tmp_path / "data")
    command = trainrun.RunSpec(str(tmp_path), tuple(run_args), score_here, 20).command("otb", 0)
    assert score_here and command[-2:] == ["--num_eval_examples", "0"]
    assert command[command.index("--dataset_name") + 1] == str(tmp_path / "data" / "train.jsonl")


# ------------------------------------------------------------------------------------------------ weak: failures, Ctrl-C
def test_a_failed_run_is_said_in_one_line_and_listed_with_its_reason(tmp_path, monkeypatch, capsys):
    reason = "exit status 1; DIR/runs/otb-0.log: ValueError: boom"
    _fake_runs(monkeypatch, [], raise_at={("otb", 0): RuntimeError(reason)})
    out = tmp_path / "cmp"
    assert compare_module.main([*BASE, "--output_dir", str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"method=otb seed=0: FAILED: RuntimeError: {reason}\n" in printed and "Traceback" not in printed
    assert f"- otb-0: RuntimeError: {reason}" in (out / "compare.md").read_text()


def test_a_full_disk_stops_compare_in_one_line(tmp_path, monkeypatch, capsys):
    _fake_runs(monkeypatch, [])

    def full(path, entry):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(runfile, "append_line", full)
    out = tmp_path / "cmp"
    assert compare_module.main([*BASE, "--output_dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the disk is full (No space left on device" in err and "free space" in err


def test_ctrl_c_says_what_was_kept_and_how_to_resume_in_one_line(tmp_path, monkeypatch, capsys):
    calls: list = []
    _fake_runs(monkeypatch, calls, raise_at={("otb", 0): KeyboardInterrupt()})
    out = tmp_path / "cmp"
    argv = [*BASE, "--output_dir", str(out), "--max_steps", "3"]
    assert _interrupted(argv) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"interrupted: 1 finished run(s) kept in {out / 'runs.jsonl'}" in err
    resume = err.split("resume with: ")[1].strip()
    assert resume.startswith("trl-groupopt compare --methods grpo,otb --seeds 2") and resume.endswith("--max_steps 3")
    calls.clear()
    assert compare_module.main(resume.split()[2:]) == 0 and calls == [("otb", 0), ("grpo", 1), ("otb", 1)]


# ------------------------------------------------------------------------------------------------ friction: acted
def test_the_acted_column_says_the_steps_it_did_not_count(tmp_path, monkeypatch, capsys):
    acted = {"what": "R was clipped", "steps": 4, "acted": 1, "undefined": 2}
    _fake_runs(monkeypatch, [], acted=acted)
    out = tmp_path / "cmp"
    result = compare_module.compare("grpo,otb", 2, out)
    assert result["comparisons"][0]["acted"] == {"what": "R was clipped", "steps": 8, "acted": 2, "fraction": 0.25,
                                                 "undefined": 4}  # fmt: skip
    table = (out / "compare.md").read_text()
    assert "| 2 of 8 optimizer steps (25%; not counted: 4 steps on which its metric was undefined): R was clipped |" in (
        table)  # fmt: skip
    assert "acted on 1 of 4 optimizer steps; not counted: 2 steps on which its metric was undefined" in (
        capsys.readouterr().out)  # fmt: skip


def test_a_runs_record_counts_the_steps_its_mechanism_report_did_not(tmp_path, monkeypatch):
    spec = trainrun.RunSpec(str(tmp_path), (), False, 8)
    mechanism = {"acted_means": "R was clipped", "steps": 4, "acted": 1, "undefined": 2, "undefined_steps": [1, 2]}

    def fake_launch(command, log, env, track=None):
        spec.folder("otb", 0).mkdir(parents=True)
        results = {"steps": 6, "accuracy_before": 0.1, "accuracy_after": 0.2, "mechanism": {"mechanisms": [mechanism]}}
        (spec.folder("otb", 0) / "results.json").write_text(json.dumps(results))
        return 1.0, 1.0

    monkeypatch.setattr(trainrun, "launch", fake_launch)
    record = trainrun.run_one(spec, "otb", 0, {})
    assert record["acted"] == {"what": "R was clipped", "steps": 4, "acted": 1, "undefined": 2}


# ------------------------------------------------------------------------------------------------ note 4: exit status
def test_a_folder_holding_other_methods_and_seeds_exits_0_when_this_comparison_is_complete(tmp_path, monkeypatch):
    calls: list = []
    _fake_runs(monkeypatch, calls)
    out = str(tmp_path / "cmp")
    assert compare_module.main(["--methods", "grpo,otb,dfpo", "--seeds", "3", "--output_dir", out]) == 0
    calls.clear()
    assert compare_module.main([*BASE, "--output_dir", out]) == 0 and calls == []


def test_ctrl_c_outside_the_slurm_wait_says_the_submitted_jobs_run_on(tmp_path, monkeypatch, capsys):
    from trl_groupopt.comparison import slurm

    monkeypatch.setattr(slurm, "check", lambda options: None)  # a cluster that takes the jobs (tests/slurm: real)

    def interrupted(self, keys):
        raise KeyboardInterrupt

    monkeypatch.setattr(slurm.SlurmLauncher, "run", interrupted)
    argv = [*BASE, "--output_dir", str(tmp_path / "cmp"), "--launcher", "slurm", "--slurm_time", "9"]
    assert _interrupted(argv) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(submitted jobs run on); resume with: trl-groupopt compare" in err
