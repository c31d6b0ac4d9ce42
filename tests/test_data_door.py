"""Data at the door (issue 30): before any model loads, the training command fails (or warns) naming the file or
column and the fix, for an empty data file, a missing local model folder, unusable gold answers (empty or null, or
for gsm8k / math without their final-answer marker: counted against ``--max_unusable_answer_fraction``) and
plain-string prompts for a model whose tokenizer has a chat template. The README's example rows pass the same door.
(The one-line console errors and `--help`: tests/test_cli_help.py; training on wrapped prompts:
tests/e2e/test_cli_door.py.)"""

from __future__ import annotations

import json
import re
import warnings

import pytest

from tests.environment import REPO_ROOT
from trl_groupopt import cli, script
from trl_groupopt.offline import EMBEDDED_POLICY_PATH


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def no_model_loads(monkeypatch):
    """`cli.train` stops where the model would load: the door must have decided before."""

    def model_would_load(*args, **kwargs):
        raise AssertionError("the run reached the trainer (the model would load) without failing at the door")

    monkeypatch.setattr(script, "run", model_would_load)


def _datasets(method: str, argv: list[str]):
    """What `cli.train` would hand the trainer: (train, held-out) after the door's checks."""
    script_args, training_args, model_args, _ = cli.parse(method, argv)
    return cli.load_datasets(script_args, model_args, trust_remote_code=training_args.trust_remote_code)


# ------------------------------------------------------------------------------------------------ empty file
@pytest.mark.parametrize("content", ["", "\n  \n"], ids=["0 bytes", "blank lines"])
def test_an_empty_data_file_is_named(tmp_path, content, no_model_loads):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    says = rf"--dataset_name {re.escape(str(empty))} is empty.*e\.g\. \{{\"prompt\""
    with pytest.raises(ValueError, match=says):
        cli.load_raw_dataset(str(empty))  # was datasets' bare StopIteration
    with pytest.raises(ValueError, match=says):
        cli.train("echo", ["--dataset_name", str(empty), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_data_file_without_rows_is_named(tmp_path):
    header_only = tmp_path / "header.csv"
    header_only.write_text("prompt,solution\n")
    with pytest.raises(ValueError, match=rf"--dataset_name {re.escape(str(header_only))}: no rows could be read"):
        cli.load_raw_dataset(str(header_only))


# ------------------------------------------------------------------------------------------------ model path
@pytest.mark.parametrize("form", ["absolute", "./", "../", "existing parent"])
def test_a_missing_local_model_folder_says_no_such_folder(tmp_path, monkeypatch, form):
    (tmp_path / "models").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work" if form in ("./", "../") else tmp_path)
    path = {
        "absolute": str(tmp_path / "models" / "no-such-model"),
        "./": "./no-such-model",
        "../": "../models/no-such-model",
        "existing parent": "models/no-such-model",  # `models/` exists here: a local path, not a Hub id
    }[form]
    with pytest.raises(FileNotFoundError, match=rf"--model_name_or_path {re.escape(path)}: no such folder\. Give"):
        cli.parse("echo", ["--model_name_or_path", path])


def test_a_hub_model_id_is_not_taken_for_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, _, model_args, _ = cli.parse("echo", ["--model_name_or_path", "some-org/some-model"])
    assert model_args.model_name_or_path == "some-org/some-model"


# ------------------------------------------------------------------------------------------------ answers
def _half_missing(tmp_path, dataset_format: str, bad: int, total: int = 10) -> str:
    """`total` rows of `dataset_format`, the first `bad` of them with no usable answer."""
    rows = []
    for i in range(total):
        usable = i >= bad
        if dataset_format == "prompt-answer":
            rows.append({"prompt": f"Compute {i}+1", "solution": str(i + 1) if usable else ("" if i % 2 else None)})
        elif dataset_format == "gsm8k":
            rows.append({"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}" + (f"\n#### {i + 1}" * usable)})
        else:
            rows.append(
                {
                    "problem": f"Compute ${i}+1$.",
                    "solution": f"${i}+1=" + (f"\\boxed{{{i + 1}}}$" if usable else f"{i + 1}$"),
                }
            )
    return _jsonl(tmp_path / f"{dataset_format}.jsonl", rows)


@pytest.mark.parametrize(
    "dataset_format,column,why",
    [
        ("prompt-answer", "solution", r"5 empty or null"),
        ("gsm8k", "answer", r"5 without a final '#### <answer>' \(e\.g\. row 0: '0\+1=1'\)"),
        ("math", "solution", r"5 without a \\boxed\{<answer>\}"),
    ],
)
def test_unusable_answers_above_the_threshold_stop_the_run(tmp_path, no_model_loads, dataset_format, column, why):
    data = _half_missing(tmp_path, dataset_format, bad=5)
    argv = ["--dataset_name", data, "--dataset_format", dataset_format, "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError) as error:
        cli.train("echo", argv)
    message = str(error.value)
    assert f"--dataset_name {data}: 5 of 10 rows (50.0%) have no usable answer in '{column}'" in message
    assert re.search(why, message), message
    assert "--max_unusable_answer_fraction 0.1" in message


@pytest.mark.parametrize("dataset_format", ["prompt-answer", "gsm8k", "math"])
def test_unusable_answers_below_the_threshold_warn(tmp_path, dataset_format):
    data = _half_missing(tmp_path, dataset_format, bad=1)
    argv = ["--dataset_name", data, "--dataset_format", dataset_format]
    with pytest.warns(UserWarning, match=r"1 of 10 rows \(10\.0%\) have no usable answer.*Training goes on"):
        train, _ = _datasets("echo", argv)
    assert len(train) == 10  # the rows stay: the reward skips them (None)
    with pytest.raises(ValueError, match="more than --max_unusable_answer_fraction 0.05"):
        _datasets("echo", [*argv, "--max_unusable_answer_fraction", "0.05"])  # the threshold is the user's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _datasets("echo", ["--dataset_name", _half_missing(tmp_path, dataset_format, bad=0), "--dataset_format",
                           dataset_format])  # fmt: skip


def test_the_threshold_must_be_a_fraction():
    with pytest.raises(ValueError, match=r"max_unusable_answer_fraction must be within \[0, 1\], got 1.5"):
        cli.parse("echo", ["--max_unusable_answer_fraction", "1.5"])


# ------------------------------------------------------------------------------------------------ string prompts
STRING_ROWS = [{"prompt": "Compute 13+14-2", "solution": "25"}, {"prompt": "Compute 2+3", "solution": "5"}]


def test_string_prompts_reach_a_chat_model_as_one_user_message(tmp_path, capsys):
    data = _jsonl(tmp_path / "strings.jsonl", STRING_ROWS)
    train, _ = _datasets("echo", ["--dataset_name", data])  # the embedded policy's tokenizer has a chat template
    assert train[0]["prompt"] == [{"role": "user", "content": "Compute 13+14-2"}]
    assert train[0]["solution"] == "25"
    assert "each prompt is sent as one user message (--string_prompts raw keeps" in capsys.readouterr().out


def test_string_prompts_kept_raw_warn(tmp_path):
    data = _jsonl(tmp_path / "strings.jsonl", STRING_ROWS)
    with pytest.warns(
        UserWarning, match=r"'prompt' holds plain strings .* chat template.*--string_prompts user_message"
    ):
        train, _ = _datasets("echo", ["--dataset_name", data, "--string_prompts", "raw"])
    assert train[0]["prompt"] == "Compute 13+14-2"


def test_string_prompts_stay_strings_without_a_chat_template_or_when_already_templated(tmp_path):
    from transformers import AutoTokenizer

    base = tmp_path / "base-tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_POLICY_PATH)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(str(base))
    data = _jsonl(tmp_path / "strings.jsonl", STRING_ROWS)
    script_args, _, model_args, _ = cli.parse("echo", ["--dataset_name", data])
    model_args.model_name_or_path = str(base)  # only the tokenizer is read: no model is needed there
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, _ = cli.load_datasets(script_args, model_args)
    assert train[0]["prompt"] == "Compute 13+14-2"

    chat = AutoTokenizer.from_pretrained(EMBEDDED_POLICY_PATH)
    text = chat.apply_chat_template([{"role": "user", "content": "Compute 2+3"}], tokenize=False,
                                    add_generation_prompt=True)  # fmt: skip
    data = _jsonl(tmp_path / "templated.jsonl", [{"prompt": text, "solution": "5"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, _ = _datasets("echo", ["--dataset_name", data])
    assert train[0]["prompt"] == text  # already in the chat format: never wrapped twice


def test_conversational_and_synthetic_prompts_need_no_tokenizer(tmp_path, monkeypatch):
    import transformers

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("the tokenizer is only read for plain-string prompts")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "solution": r["solution"]} for r in STRING_ROWS]
    train, _ = _datasets("echo", ["--dataset_name", _jsonl(tmp_path / "chat.jsonl", rows)])
    assert train[0]["prompt"][0]["content"] == "Compute 13+14-2"
    train, held_out = _datasets("echo", ["--num_train_examples", "4", "--num_eval_examples", "4"])
    assert len(train) == 4 and len(held_out) == 4


# ------------------------------------------------------------------------------------------------ README rows
def _readme_rows() -> dict[str, dict]:
    """The README's table of one example row per --dataset_format."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"^\| `([\w-]+)`(?: \(default\))? \| `(\{.*\})` \|$", text, flags=re.M)
    return {name: json.loads(row) for name, row in found}


def test_readme_shows_one_row_per_format_and_each_passes_the_door(tmp_path):
    rows = _readme_rows()
    assert list(rows) == list(cli.DATASET_FORMATS) and rows == cli.EXAMPLE_ROWS
    for dataset_format, row in rows.items():
        data = _jsonl(tmp_path / f"{dataset_format}.jsonl", [row])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            train, _ = _datasets("echo", ["--dataset_name", data, "--dataset_format", dataset_format])
        assert train[0]["prompt"][-1] == {"role": "user", "content": next(iter(row.values()))}, dataset_format
        assert train[0]["solution"] in ("25", "\\boxed{25}"), dataset_format
