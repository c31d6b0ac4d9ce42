"""Issue 46's data cases at the door, before any model loads: a role the chat template cannot render names its row;
content as a list of text parts (OpenAI's and TRL's form) is read as text; a `.json` laid out as columns is read as
columns; a JSON Lines line that is a JSON string, and broken JSON, are named with their line (and the right column);
characters the tokenizer cannot encode warn, naming them; over-long prompts announced as dropped are dropped; a
user's file gives up a held-out split that `train` scores (tests/e2e/test_cli_door.py trains on it)."""

from __future__ import annotations

import json
import re

import pytest

from trl_groupopt.cli import main as cli
from trl_groupopt.cli import script
from trl_groupopt.data import adapters


@pytest.fixture
def no_model_loads(monkeypatch):
    import transformers

    def model_would_load(*args, **kwargs):
        raise AssertionError("the run reached the trainer (the model would load) without failing at the door")

    monkeypatch.setattr(script, "run", model_would_load)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(model_would_load))


def _rows(n: int, form: str = "text") -> list[dict]:
    def prompt(i):
        text = f"Compute {i}+1"
        return text if form == "text" else [{"role": "user", "content": text}]

    return [{"prompt": prompt(i), "solution": str(i + 1)} for i in range(n)]


def _jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _datasets(path: str, *extra: str):
    script_args, training_args, model_args, _ = cli.parse("echo", ["--dataset_name", path, *extra])
    return adapters.load_datasets(script_args, model_args, training_args)


def _refused(path: str, says: str, tmp_path) -> str:
    with pytest.raises(ValueError) as refused:
        cli.train("echo", ["--dataset_name", path, "--output_dir", str(tmp_path / "out")])
    assert re.search(says, str(refused.value)), str(refused.value)
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()
    return str(refused.value)


def test_a_role_the_template_cannot_render_names_the_row(tmp_path, no_model_loads):
    """Was: "TemplateError: Unsupported role: robot", no row."""
    rows = _rows(5, "messages")
    rows[3]["prompt"] = [{"role": "robot", "content": "Compute 1+1"}]
    _refused(_jsonl(tmp_path / "robot.jsonl", rows), r"robot.jsonl: row 3: the model's chat template cannot render "
             r"this prompt \(roles \['robot'\]; TemplateError: Unsupported role: robot\)\. Use the roles", tmp_path)  # fmt: skip


def test_content_as_text_parts_is_read_as_text(tmp_path):
    """Was: "TypeError: can only concatenate str (not "list") to str" at the door's template."""
    rows = _rows(4, "messages")
    rows[1]["prompt"] = [{"role": "user", "content": [{"type": "text", "text": "Compute "}, {"type": "text",
                                                                                          "text": "1+1"}]}]  # fmt: skip
    train, _ = _datasets(_jsonl(tmp_path / "parts.jsonl", rows))
    assert (
        train[1]["prompt"] == [{"role": "user", "content": "Compute 1+1"}] and train[0]["prompt"] == rows[0]["prompt"]
    )


def test_a_part_that_is_not_text_names_the_row(tmp_path, no_model_loads):
    rows = _rows(4, "messages")
    rows[2]["prompt"] = [{"role": "user", "content": [{"type": "image", "url": "x.png"}]}]
    _refused(_jsonl(tmp_path / "image.jsonl", rows), r"row 2: 'prompt' message 0 content part 0 is .*'image'.*, not a "
             r"text part \{'type': 'text', 'text': \.\.\.\}", tmp_path)  # fmt: skip


def test_a_json_file_laid_out_as_columns_is_read_as_columns(tmp_path):
    """Was: one row whose prompt was the list of every prompt ("message 0 is not a {'role', 'content'} mapping")."""
    rows = _rows(6)
    path = tmp_path / "columns.json"
    path.write_text(json.dumps({"prompt": [r["prompt"] for r in rows], "solution": [r["solution"] for r in rows]}))
    train, _ = _datasets(str(path))
    assert len(train) == 6 and train[5]["prompt"] == [{"role": "user", "content": "Compute 5+1"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows, indent=2))  # a list of rows: as before
    assert len(_datasets(str(tmp_path / "rows.json"))[0]) == 6


def test_a_line_that_is_a_json_string_is_named(tmp_path, no_model_loads):
    """Was: "no rows could be read as json", no line."""
    lines = [*map(json.dumps, _rows(3)), '"just a string"', json.dumps(_rows(1)[0])]
    _refused(_jsonl(tmp_path / "string.jsonl", lines), r"string.jsonl: line 4 is a JSON string, not one JSON object: "
             r"write one row per line, e\.g\. \{", tmp_path)  # fmt: skip


def test_broken_json_names_the_line_and_the_column_within_it(tmp_path, no_model_loads):
    """Was: the right line but column 1 (the column after the line's newline)."""
    broken = '{"prompt": "Compute 1+1", "solution": "2"'  # 41 characters: the "," or "}" is due at column 42
    _refused(_jsonl(tmp_path / "broken.jsonl", [*map(json.dumps, _rows(3)), broken]),
             r"line 4 is not one JSON object: Expecting ',' delimiter at column 42\.", tmp_path)  # fmt: skip
    document = json.dumps(_rows(3), indent=1).replace('"solution": "2"', '"solution" "2"')
    (tmp_path / "broken.json").write_text(document)
    line = next(i for i, text in enumerate(document.splitlines(), 1) if '"solution" "2"' in text)
    _refused(str(tmp_path / "broken.json"), rf"broken.json: line {line} is not valid JSON: Expecting ':' delimiter at "
             r"column 14\.", tmp_path)  # fmt: skip


def test_characters_the_tokenizer_cannot_encode_warn_naming_them(tmp_path):
    """Was: every uppercase "W" silently became <unk> (the embedded policy's tokenizer has no capitals but in
    "Compute"; its vocabulary cannot change without retraining the policy, so the door says so)."""
    rows = _rows(10)
    rows[4]["prompt"] = "What is 4+1? Write it boxed"
    rows[7]["prompt"] = "Compute 7+1 — exactly"
    with pytest.warns(UserWarning, match=r"the model's tokenizer cannot encode 'W', '—' \(2 of 10 prompts, e\.g\. "
                      r"row 4\): each becomes <unk>, so the model never reads them"):  # fmt: skip
        _datasets(_jsonl(tmp_path / "upper.jsonl", rows))


def test_overlong_prompts_are_dropped_before_the_trainer_sees_them(tmp_path, monkeypatch):
    """Issue 46, broken 4: the warning said "Training goes on without them", and the prompt reached the policy."""
    rows = _rows(40)
    rows[17]["prompt"] = "Compute " + "1+" * 3000 + "1"
    seen = {}
    monkeypatch.setattr(
        script, "run", lambda method, s, t, m, demo, train, held_out, opened=None: seen.update(train=train)
    )
    with pytest.warns(UserWarning, match=r"1 of 40 rows \(2\.5%\) have prompts longer .*They are dropped"):
        cli.train("dfpo", ["--dataset_name", _jsonl(tmp_path / "long.jsonl", rows), "--output_dir",
                           str(tmp_path / "out"), "--max_steps", "6"])  # fmt: skip
    assert len(seen["train"]) == 39 and max(len(str(p)) for p in seen["train"]["prompt"]) < 100


def test_a_users_file_gives_up_a_held_out_split(tmp_path, capsys):
    """Was: training on one's own file printed no held-out accuracy (only the synthetic task had one)."""
    rows = _rows(300)
    train, held_out = _datasets(_jsonl(tmp_path / "data.jsonl", rows))
    assert (len(train), len(held_out)) == (270, 30)
    assert not set(train["solution"]) & set(held_out["solution"])  # disjoint rows
    assert "30 of 300 rows held out to score greedy accuracy before and after training; 270 train" in \
        capsys.readouterr().out  # fmt: skip
    again, held_again = _datasets(_jsonl(tmp_path / "data.jsonl", rows))
    assert held_again["solution"] == held_out["solution"]  # seeded: every rank, every run
    train, held_out = _datasets(str(tmp_path / "data.jsonl"), "--num_eval_examples", "0")
    assert (len(train), held_out) == (300, None)
    train, held_out = _datasets(str(tmp_path / "data.jsonl"), "--evaluate_accuracy", "false")
    assert (len(train), held_out) == (300, None)
    assert len(_datasets(_jsonl(tmp_path / "small.jsonl", _rows(60)))[0]) == 60  # under 100 rows: none
    with pytest.raises(ValueError, match=r"--num_eval_examples 300: .* has 300 usable rows; 300 held-out rows leave"):
        _datasets(str(tmp_path / "data.jsonl"), "--num_eval_examples", "300")
    from trl_groupopt.data import heldout

    assert heldout.default_heldout_size(5000) == 200 and heldout.default_heldout_size(99) == 0
