"""Data at the door (issues 30 and 38): before any model loads, the training command fails (or warns) naming the
file, row or line, the option and the fix: an empty or unreadable data file (not UTF-8, not JSON Lines), a folder of
two kinds of data file, a missing local model folder or column, prompts checked row by row before any conversion
(mixed forms, null or non-string rows, messages without text, all empty), unusable gold answers (counted against
``--max_unusable_answer_fraction``), prompts longer than the model's context (counted against
``--max_overlong_prompt_fraction``) and plain-string prompts for a model whose tokenizer has a chat template. The
README's example rows pass the same door. (The one-line console errors and `--help`: tests/test_cli_help.py; training
on wrapped prompts: tests/e2e/test_cli_door.py.)"""

from __future__ import annotations

import json
import re
import warnings

import pytest

from tests.environment import REPO_ROOT
from trl_groupopt.cli import main as cli
from trl_groupopt.cli import script
from trl_groupopt.data import adapters
from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def no_model_loads(monkeypatch):
    """`cli.train` fails if any model loads or the trainer is reached: the door must have decided before."""
    import transformers

    def model_would_load(*args, **kwargs):
        raise AssertionError("the run reached the trainer (the model would load) without failing at the door")

    monkeypatch.setattr(script, "run", model_would_load)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(model_would_load))


def _datasets(method: str, argv: list[str]):
    """What `cli.train` would hand the trainer: (train, held-out) after the door's checks."""
    script_args, training_args, model_args, _ = cli.parse(method, argv)
    return adapters.load_datasets(script_args, model_args, training_args)


# ------------------------------------------------------------------------------------------------ empty file
@pytest.mark.parametrize("content", ["", "\n  \n"], ids=["0 bytes", "blank lines"])
def test_an_empty_data_file_is_named(tmp_path, content, no_model_loads):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    says = rf"--dataset_name {re.escape(str(empty))} is empty.*e\.g\. \{{\"prompt\""
    with pytest.raises(ValueError, match=says):
        adapters.load_raw_dataset(str(empty))  # was datasets' bare StopIteration
    with pytest.raises(ValueError, match=says):
        cli.train("echo", ["--dataset_name", str(empty), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_data_file_without_rows_is_named(tmp_path):
    header_only = tmp_path / "header.csv"
    header_only.write_text("prompt,solution\n")
    with pytest.raises(ValueError, match=rf"--dataset_name {re.escape(str(header_only))}: no rows could be read"):
        adapters.load_raw_dataset(str(header_only))


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
            rows.append({"question": f"what is {i}+1?", "answer": f"{i}+1={i + 1}" + (f"\n#### {i + 1}" * usable)})
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
    with pytest.warns(UserWarning, match=r"1 of 10 rows \(10\.0%\) have no usable answer.*They stay in the "
                      r"training data, and the accuracy reward scores them None"):  # fmt: skip
        train, _ = _datasets("echo", argv)
    assert len(train) == 10  # the rows stay, as the warning says: the reward skips them (None)
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
        train, _ = adapters.load_datasets(script_args, model_args)
    assert train[0]["prompt"] == "Compute 13+14-2"

    chat = AutoTokenizer.from_pretrained(EMBEDDED_POLICY_PATH)
    text = chat.apply_chat_template([{"role": "user", "content": "Compute 2+3"}], tokenize=False,
                                    add_generation_prompt=True)  # fmt: skip
    data = _jsonl(tmp_path / "templated.jsonl", [{"prompt": text, "solution": "5"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, _ = _datasets("echo", ["--dataset_name", data])
    assert train[0]["prompt"] == text  # already in the chat format: never wrapped twice


def test_conversational_prompts_are_kept_and_the_synthetic_task_needs_no_tokenizer(tmp_path, monkeypatch):
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "solution": r["solution"]} for r in STRING_ROWS]
    train, _ = _datasets("echo", ["--dataset_name", _jsonl(tmp_path / "chat.jsonl", rows)])
    assert train[0]["prompt"] == rows[0]["prompt"]
    import transformers

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("the synthetic task needs no tokenizer at the door")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
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
    assert list(rows) == list(adapters.DATASET_FORMATS) and rows == adapters.EXAMPLE_ROWS
    for dataset_format, row in rows.items():
        data = _jsonl(tmp_path / f"{dataset_format}.jsonl", [row])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # but the tiny policy's tokenizer: no capitals (tests/test_data_files.py)
            warnings.filterwarnings("ignore", message=r".*the model's tokenizer cannot encode 'A', 'H' ")
            train, _ = _datasets("echo", ["--dataset_name", data, "--dataset_format", dataset_format])
        assert train[0]["prompt"][-1] == {"role": "user", "content": next(iter(row.values()))}, dataset_format
        assert train[0]["solution"] in ("25", "\\boxed{25}"), dataset_format


# ------------------------------------------------------------------------------------------------ issue 38: row by row
def _train_refuses(tmp_path, rows_or_text, says: str, *extra: str, name: str = "data.jsonl") -> str:
    """`cli.train` on the file refuses at the door (no model loads) with a message matching `says`."""
    path = tmp_path / name
    if isinstance(rows_or_text, bytes):
        path.write_bytes(rows_or_text)
    else:
        _jsonl(path, rows_or_text)
    with pytest.raises(ValueError) as refused:
        cli.train("echo", ["--dataset_name", str(path), *extra, "--output_dir", str(tmp_path / "out")])
    assert re.search(says, str(refused.value)), str(refused.value)
    assert not (tmp_path / "out").exists()
    return str(refused.value)


def _rows(n: int, **override) -> list[dict]:
    rows = [{"prompt": f"Compute {i}+1", "solution": str(i + 1)} for i in range(n)]
    for row, value in override.items():
        rows[int(row[1:])]["prompt"] = value
    return rows


def test_mixed_string_and_message_prompts_are_refused_naming_a_row_of_each(tmp_path, no_model_loads):
    """Was: row 1 trained as the message "[{'role': 'user', 'content': ...}]" (issue 38, broken 2)."""
    rows = _rows(4, r1=[{"role": "user", "content": "Compute 1+2"}])
    message = _train_refuses(tmp_path, rows, r"'prompt' mixes forms \(row 0 holds a string and row 1 holds a list")
    assert "as a string or as [{'role': 'user'" in message


@pytest.mark.parametrize("row,value", [(10, None), (150, None), (150, 7), (3, ["Compute"])])
def test_a_null_or_non_string_prompt_anywhere_is_refused_with_its_row(tmp_path, no_model_loads, row, value):
    """Was: a TypeError at row 10, or the literal prompt "None" / "7" after row 100 (issue 38)."""
    _train_refuses(tmp_path, _rows(160, **{f"r{row}": value}), rf"row {row}: 'prompt' (is {re.escape(repr(value))}"
                   r", not a string|message 0 is not)")  # fmt: skip


def test_message_content_null_is_refused_at_the_door(tmp_path, no_model_loads):
    """Was: a jinja2 UndefinedError at the first generation."""
    rows = [{"prompt": [{"role": "user", "content": "Compute 1+1"}], "solution": "2"},
            {"prompt": [{"role": "user", "content": None}], "solution": "3"}]  # fmt: skip
    _train_refuses(tmp_path, rows, r"row 1: 'prompt' message 0 has content None, not text")


def test_all_empty_prompts_are_refused(tmp_path, no_model_loads):
    """Was: 64 empty prompts trained, saved and exited 0."""
    _train_refuses(tmp_path, [{"prompt": "", "solution": "3"}] * 64, r"every 'prompt' is empty")


def test_gsm8k_questions_are_checked_before_the_adapter_stringifies_them(tmp_path, no_model_loads):
    rows = [EXAMPLE_GSM8K, {**EXAMPLE_GSM8K, "question": None}]
    _train_refuses(tmp_path, rows, r"row 1: 'question' is None, not a string", "--dataset_format", "gsm8k")


EXAMPLE_GSM8K = {"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}


@pytest.mark.parametrize("bad", [["2"], "two", {"x": 1}], ids=["list", "word", "mapping"])
def test_prompt_answer_answers_that_are_no_number_count_as_unusable(tmp_path, no_model_loads, bad):
    """Was: they passed the door, then stopped the run after two generation batches with a traceback."""
    rows = [{"prompt": f"Compute {i}+1", "solution": bad if i < 5 else str(i + 1)} for i in range(10)]
    _train_refuses(tmp_path, rows, r"5 of 10 rows \(50.0%\) have no usable answer in 'solution' \(5 without a "
                   r"number or formula")  # fmt: skip
    assert adapters.readable_gold("\\frac{1}{2}") and adapters.readable_gold(25) and adapters.readable_gold("1,000")


def test_a_file_that_is_not_utf8_names_the_line(tmp_path, no_model_loads):
    text = (json.dumps({"prompt": "Compute 1+1", "solution": "2"}) + "\n").encode() * 3
    _train_refuses(tmp_path, text + b'{"prompt": "\xff", "solution": "2"}\n', r"data.jsonl: line 4 is not UTF-8 "
                   r"\(byte 0xff\): save the file as UTF-8")  # fmt: skip


def test_a_trailing_comma_on_every_jsonl_line_names_the_line_and_the_fix(tmp_path, no_model_loads):
    text = "".join(json.dumps(r) + ",\n" for r in _rows(4)).encode()
    _train_refuses(
        tmp_path, text, r"line 1 is not one JSON object: Extra data at column \d+ \(remove the trailing comma"
    )


def test_a_folder_of_two_kinds_of_data_file_is_refused_naming_both(tmp_path, no_model_loads):
    folder = tmp_path / "data"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", _rows(4))
    (folder / "b.csv").write_text("prompt,solution\nCompute 1+1,2\n")
    with pytest.raises(ValueError, match=r"holds data files of 2 kinds \(b.csv, a.jsonl\|a.jsonl, b.csv\)|2 kinds"):
        cli.train("echo", ["--dataset_name", str(folder), "--output_dir", str(tmp_path / "out")])


def test_a_missing_column_is_reported_before_the_model_loads(tmp_path, no_model_loads):
    _train_refuses(tmp_path, [{"text": "Compute 1+1"}], r"--dataset_format prompt-answer needs the columns")


def test_overlong_prompts_are_counted_against_the_context_before_the_model_loads(tmp_path, no_model_loads):
    """Was: prompts 23 times the context trained at 131 s a step. The embedded policy has 256 positions; with 48 for
    the completion, 208 are left for the prompt."""
    rows = _rows(10)
    for i in range(3):
        rows[i]["prompt"] = "Compute " + "1+" * 400 + "1"
    message = _train_refuses(tmp_path, rows, r"3 of 10 rows \(30.0%\) have prompts longer than the 208 tokens")
    assert "more than --max_overlong_prompt_fraction 0.1" in message and "e.g. row 0: " in message
    path = _jsonl(tmp_path / "long.jsonl", rows)
    with pytest.warns(UserWarning, match="have prompts longer than the 208 tokens.*They are dropped: training goes on"
                      " without them"):  # fmt: skip
        train, held_out = _datasets("echo", ["--dataset_name", path, "--max_overlong_prompt_fraction", "0.5"])
    # Was: announced as dropped, yet trained on (issue 46, broken 4: a 6,005-token prompt reached the policy)
    assert len(train) == 7 and held_out is None and all("1+1+1+" not in str(p) for p in train["prompt"])
