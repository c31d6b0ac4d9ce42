"""The data door: user data read, checked row by row and turned into TRL's prompt format before any model loads
(:func:`load_datasets`; what it checks: docs/getting-started.md, "Your data, checked before the model loads"), and
the row adapters usable with ``Dataset.map``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

from ..runfolder.stop import raise_pending
from . import offline
from .heldout import DEFAULT_MAX_HELDOUT, carve_heldout
from .prompts import check_fraction, check_prompt_lengths, check_prompts, flatten_text_parts
from .rewards import extract_last_boxed

__all__ = [
    "BOXED_SYSTEM_PROMPT",
    "DATASET_FORMATS",
    "gsm8k_to_conversational",
    "load_datasets",
    "load_raw_dataset",
    "math_to_conversational",
    "string_prompt_to_conversational",
]

BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
#: ``--dataset_format`` -> (prompt column, gold-answer column).
FORMAT_COLUMNS = {
    "prompt-answer": ("prompt", "solution"),
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
}
DATASET_FORMATS = tuple(FORMAT_COLUMNS)
ANSWER_MARKERS = {"gsm8k": "a final '#### <answer>'", "math": "a \\boxed{<answer>}"}
#: One row of each ``--dataset_format``, as a line of a .jsonl file (the README and ``--help`` show them).
EXAMPLE_ROWS = {
    "prompt-answer": {"prompt": "Compute 13+14-2", "solution": "25"},
    "gsm8k": {
        "question": "Ann has 13 pens, buys 14 and gives 2 away. How many are left?",
        "answer": "13+14-2=25\n#### 25",
    },
    "math": {"problem": "Compute $13+14-2$.", "solution": "$13+14-2=\\boxed{25}$"},
}
_EXAMPLE_LINE = json.dumps(EXAMPLE_ROWS["prompt-answer"])  # the row error messages show
STRING_PROMPTS = ("user_message", "raw")
LOCAL_DATA_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _messages(question: str, system_prompt: str | None) -> list[dict[str, str]]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": question}]


def _conversational(question: Any, answer: str | None, system_prompt: str | None) -> dict[str, Any]:
    """``{"prompt": [messages], "solution": "\\boxed{answer}"}``; no answer -> ``""`` (the accuracy reward skips it)."""
    return {"prompt": _messages(str(question), system_prompt), "solution": f"\\boxed{{{answer}}}" if answer else ""}


def gsm8k_to_conversational(row: dict[str, Any], system_prompt: str | None = None) -> dict[str, Any]:
    """A GSM8K row (``question``, ``answer`` ending in ``#### 1,000``) with ``\\boxed{1000}`` as solution."""
    answer = str(row["answer"])
    final = answer.split("####")[-1].strip().replace(",", "").replace("$", "").strip() if "####" in answer else ""
    return _conversational(row["question"], final, system_prompt)


def math_to_conversational(row: dict[str, Any], system_prompt: str | None = None) -> dict[str, Any]:
    """A MATH row (``problem``, ``solution``) with its last ``\\boxed{}`` content (nested braces kept) as solution."""
    return _conversational(row["problem"], extract_last_boxed(str(row["solution"])), system_prompt)


def string_prompt_to_conversational(row: dict[str, Any], system_prompt: str | None = None) -> dict[str, Any]:
    """A plain-string ``prompt`` as one user message: the trainer then applies the chat template."""
    return {"prompt": _messages(row["prompt"], system_prompt)}


def format_help() -> str:
    """The script options' heading in ``--help``: one data row per --dataset_format."""
    rows = "\n".join(f"    {name:<13}  {json.dumps(row)}" for name, row in EXAMPLE_ROWS.items())
    return f"  --dataset_name FILE --dataset_format FORMAT, one row per line of a .jsonl file:\n{rows}\n" + (
        '  A prompt may also be a list of messages: [{"role": "user", "content": "Compute 13+14-2"}].'
    )


def _looks_local(name: str) -> bool:
    """A path rather than a Hub id: absolute, ``./``, ``../`` or ``~``, or inside a folder that exists here."""
    if os.path.isabs(name) or name in (".", "..") or name.startswith(("./", "../", ".\\", "..\\", "~")):
        return True
    parent = os.path.dirname(os.path.normpath(name))
    return bool(parent) and os.path.isdir(parent)


def check_model_path(name: str | None, option: str = "--model_name_or_path") -> None:
    """A ``--model_name_or_path`` (`option`: how the caller names it) that looks local must be a folder that exists."""
    if name is None or not _looks_local(name) or os.path.isdir(os.path.expanduser(name)):
        return
    what = "is a file, not a model folder" if os.path.exists(os.path.expanduser(name)) else "no such folder"
    raise FileNotFoundError(
        f"{option} {name}: {what}. Give the folder of a saved model (the one holding config.json) or a "
        "Hub model id such as Qwen/Qwen2.5-0.5B-Instruct."
    )


def _json_kind(value: Any) -> str:
    kinds = {str: "a JSON string", list: "a JSON list", bool: "a JSON boolean", type(None): "null"}
    return kinds.get(type(value), "a JSON number")


#: A data file at least this large prints what the data checks are doing while they run (a 1 GB file takes minutes).
LARGE_FILE_BYTES = 64 << 20
#: A dataset of at least this many rows says so before each of the checks that read every row.
LARGE_ROWS = 200_000
#: How often the line-by-line check of a large file says how far it got, in seconds.
PROGRESS_EVERY_S = 10.0


def _say(text: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(f"[trl-groupopt] {text}", flush=True)


def _unreadable_line(path: str, as_json: bool) -> str | None:
    """The first line of a local text file that is not UTF-8 or (`as_json`, JSON Lines) not one JSON object; a large
    file says how far the check got every `PROGRESS_EVERY_S` seconds."""
    size = os.path.getsize(path)
    large, last = size >= LARGE_FILE_BYTES, time.monotonic()
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not number & 0xFFF:  # a stop signal whose exception was dropped ends the check here, not minutes later
                raise_pending()
            if large and time.monotonic() - last >= PROGRESS_EVERY_S:
                _say(f"--dataset_name {path}: checked {number - 1:,} lines ({handle.tell() / size:.0%} of the file)")
                last = time.monotonic()
            if b"\x00" in line:  # valid UTF-8, but never in text data: UTF-16 or UTF-32 saved without a BOM
                return (
                    f"line {number} holds NUL bytes: it looks like UTF-16 (or UTF-32) text without a byte-order "
                    "mark; save the file as UTF-8."
                )
            try:
                text = line.decode("utf-8").rstrip("\r\n")  # the column of an error is then within this line
                value = json.loads(text) if as_json and text.strip() else {}
            except UnicodeDecodeError as err:
                return f"line {number} is not UTF-8 (byte {line[err.start]:#04x}): save the file as UTF-8."
            except json.JSONDecodeError as err:
                comma = " (remove the trailing comma: one object per line)" if text.rstrip().endswith(",") else ""
                return f"line {number} is not one JSON object: {err.msg.removesuffix(' at')} at column {err.colno}{comma}."
            if not isinstance(value, dict):
                kind = _json_kind(value)
                return f"line {number} is {kind}, not one JSON object: write one row per line, e.g. {_EXAMPLE_LINE}."
    return None


def _as_columns(document: Any) -> dict[str, list] | None:
    """A JSON document laid out as columns (``{"prompt": [...], "solution": [...]}``, equal lengths), else None. A
    list of mappings is one row's messages, not a column."""
    if not isinstance(document, dict) or not document or not all(isinstance(v, list) for v in document.values()):
        return None
    lengths = {len(v) for v in document.values()}
    if len(lengths) != 1 or any(isinstance(x, dict) for v in document.values() for x in v):
        return None
    return document


def _read_json_document(path: str) -> tuple[Any, bool]:
    """(the dataset, or None for datasets to read it; whether the file is one JSON document) of a ``.json`` file: a
    document laid out as columns is read here, a broken list of rows raises naming the line and the column."""
    import datasets

    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        if text.lstrip().startswith("["):
            raise ValueError(f"--dataset_name {path}: line {err.lineno} is not valid JSON: {err.msg.removesuffix(' at')} at column "
                             f"{err.colno}.") from None  # fmt: skip
        return None, False  # JSON Lines in a .json file (or broken ones: the line check names the line)
    columns = _as_columns(document)
    return (None if columns is None else datasets.Dataset.from_dict(columns)), True


def _parquet_problem(path: str) -> str | None:
    """Why the file at `path` is not a readable Parquet file (cut short, not Parquet, no rows), or None."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(4)
        handle.seek(max(size - 4, 0))
        tail = handle.read(4)
    if head != b"PAR1" or tail != b"PAR1" or size < 12:
        return (
            f"it is not a complete Parquet file ({size:,} bytes; a Parquet file starts and ends with 'PAR1'): it "
            "was cut short or is not Parquet; write it again (e.g. Dataset.to_parquet) or give a .jsonl file."
        )
    import pyarrow.parquet

    try:
        rows = pyarrow.parquet.ParquetFile(path).metadata.num_rows
    except Exception as err:  # noqa: BLE001  (pyarrow's errors: a damaged footer, an unknown encoding)
        return f"it is not a readable Parquet file ({str(err).splitlines()[0][:160]}); write it again."
    return None if rows else "the Parquet file has no rows: there is nothing to train on."


@contextlib.contextmanager
def _datasets_quiet() -> Iterator[None]:
    """Within it, the datasets library prints neither its error lines nor progress bars: a file that fails to load is
    said once, by this module's line naming the file's line (datasets' own counts rows from 0, after its bars)."""
    import datasets

    logger, bars = logging.getLogger("datasets"), not datasets.are_progress_bars_disabled()
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def load_raw_dataset(name: str, config: str | None = None, split: str = "train"):
    """One split of a Hub dataset, a local data file or a local folder, checked first (a supported, non-empty file; a
    folder of one kind of data file); errors name the file and the line."""
    import datasets

    if os.path.isfile(name):
        builder = next((b for e, b in LOCAL_DATA_BUILDERS.items() if name.lower().endswith(e)), None)
        if builder is None:
            raise ValueError(
                f"--dataset_name {name!r} is a file with an unsupported extension; use one of "
                f"{sorted(LOCAL_DATA_BUILDERS)} (or a folder, or a Hub dataset name)."
            )
        with open(name, "rb") as handle:
            if not any(block.strip() for block in iter(lambda: handle.read(1 << 16), b"")):
                raise ValueError(
                    f"--dataset_name {name} is empty: there is nothing to train on. Give one row per line, e.g. "
                    f"{_EXAMPLE_LINE}"
                )
        if os.path.getsize(name) >= LARGE_FILE_BYTES:
            _say(
                f"--dataset_name {name}: checking {os.path.getsize(name) / 2**20:,.0f} MB of data before the model loads"
            )
        problem = _parquet_problem(name) if builder == "parquet" else _unreadable_line(name, as_json=False)
        columns, document = (
            _read_json_document(name) if problem is None and name.lower().endswith(".json") else (None, True)
        )
        if columns is not None:
            return columns
        try:
            if problem is None:
                with _datasets_quiet():
                    return datasets.load_dataset(builder, data_files=name, split="train")
        except Exception as err:  # datasets' own errors name neither the file nor the line
            text = builder != "parquet"
            line = text and _unreadable_line(name, as_json=name.lower().endswith(".jsonl") or not document)
            problem = line or f"no rows could be read as {builder} ({err})."
        raise ValueError(f"--dataset_name {name}: {problem}")
    if os.path.isdir(name) and {"dataset_info.json", "dataset_dict.json"} & set(os.listdir(name)):  # save_to_disk
        saved = datasets.load_from_disk(name)
        return saved[split] if isinstance(saved, datasets.DatasetDict) else saved
    if os.path.isdir(name):
        files = sorted(f for f in os.listdir(name) if f.lower().endswith(tuple(LOCAL_DATA_BUILDERS)))
        kinds = {os.path.splitext(f)[1].lower(): f for f in files}
        if len(kinds) > 1:
            raise ValueError(
                f"--dataset_name {name} holds data files of {len(kinds)} kinds ({', '.join(kinds.values())}); only "
                "one kind would be read. Keep one kind in the folder, or name one file."
            )
    elif _looks_local(name) or name.lower().endswith(tuple(LOCAL_DATA_BUILDERS)):
        raise FileNotFoundError(f"--dataset_name {name!r}: no such file or folder.")
    return datasets.load_dataset(name, config, split=split)


def check_columns(columns: list[str], dataset_format: str) -> None:
    """The columns `dataset_format` reads are there; the error names the option (and a format that fits)."""
    need = FORMAT_COLUMNS[dataset_format]
    missing = [c for c in need if c not in columns]
    if missing:
        fits = [f for f in DATASET_FORMATS if f != dataset_format and set(FORMAT_COLUMNS[f]) <= set(columns)]
        hint = f" It looks like --dataset_format {fits[0]}." if fits else ""
        formats = ", ".join(f"{name!r} ({', '.join(names)})" for name, names in FORMAT_COLUMNS.items())
        raise ValueError(
            f"--dataset_format {dataset_format} needs the columns {list(need)}, but the dataset has {columns} "
            f"(missing {missing}).{hint} Formats: {formats}; or rename your columns."
        )


def to_prompt_solution(dataset, dataset_format: str):
    """``dataset`` in TRL's prompt format with a ``solution`` column, read as ``dataset_format`` says."""
    check_columns(dataset.column_names, dataset_format)
    if dataset_format == "prompt-answer":
        return dataset
    adapter = gsm8k_to_conversational if dataset_format == "gsm8k" else math_to_conversational
    return dataset.map(adapter, remove_columns=dataset.column_names)


def readable_gold(value: Any) -> bool:
    """Whether the accuracy reward can read `value` as a gold answer."""
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value).strip():
        return False
    try:
        float(str(value).replace(",", ""))
        return True
    except ValueError:
        from math_verify import parse  # mirrors trl.rewards.accuracy_reward (trl 1.16.0): its gold parsing

        return bool(parse(str(value), extraction_mode="first_match"))


def check_answers(raw, converted, dataset_format: str, name: str, max_fraction: float) -> None:
    """Rows whose gold answer the accuracy reward cannot use, against ``--max_unusable_answer_fraction``."""
    column = FORMAT_COLUMNS[dataset_format][1]
    answers, solutions = raw[column], converted["solution"]
    empty = [i for i, a in enumerate(answers) if a is None or (isinstance(a, str) and not a.strip())]
    if dataset_format == "prompt-answer":
        bad = [i for i, a in enumerate(answers) if not readable_gold(a)]
    else:
        bad = [i for i, s in enumerate(solutions) if not s]
    other = sorted(set(bad) - set(empty))
    marker = ANSWER_MARKERS.get(dataset_format, "a number or formula")
    parts = [f"{len(empty)} empty or null"] if empty else []
    if other:
        parts.append(f"{len(other)} without {marker} (e.g. row {other[0]}: {str(answers[other[0]])[-60:]!r})")
    fix = "fix those rows or drop them" + (", or choose the --dataset_format that matches" if empty != bad else "")
    what = f"have no usable answer in {column!r} ({', '.join(parts)})"
    outcome = "They stay in the training data, and the accuracy reward scores them None (no learning signal)"
    check_fraction(bad, len(answers), what, name, "max_unusable_answer_fraction", max_fraction, fix, outcome)


def prepare_prompts(data, name: str, tokenizer, mode: str):
    """``--string_prompts`` applied to plain strings a chat template would not see (docs/getting-started.md)."""
    sample = data[:100]["prompt"]
    special = [t for t in tokenizer.all_special_tokens if t]
    templated = any(t in p for p in sample for t in special if isinstance(p, str))
    if not isinstance(sample[0], str) or tokenizer.chat_template is None or templated:
        return data
    if mode == "raw":
        warnings.warn(
            f"--dataset_name {name}: 'prompt' holds plain strings that bypass the tokenizer's chat template: the model"
            " continues the raw text (no reward). Use --string_prompts user_message or write prompts as messages.",
            stacklevel=3,
        )
        return data
    if os.environ.get("RANK", "0") == "0":
        print(
            f"[trl-groupopt] --dataset_name {name}: the prompts are plain strings and the tokenizer has a chat "
            "template: each prompt is sent as one user message (--string_prompts raw keeps the text as is)."
        )
    return data.map(string_prompt_to_conversational)


def load_datasets(script_args, model_args, training_args=None):
    """(train, held-out) datasets: the synthetic task's splits, or ``--dataset_name`` checked, its prompts wrapped for
    the chat template and measured (with `training_args`) by the tokenizer, never the model, its over-long rows
    dropped and its held-out rows carved off (`trl_groupopt.data.heldout`)."""
    if getattr(script_args, "dataset_streaming", False):
        raise ValueError(
            "--dataset_streaming true is not supported: the data checks and the held-out split read every row "
            "(datasets memory-maps a local file or a downloaded Hub dataset, so it is not held in RAM). Leave it out."
        )
    if script_args.dataset_name is None:
        train = offline.make_arithmetic_dataset(script_args.num_train_examples, seed=0, split="train")
        size = DEFAULT_MAX_HELDOUT if script_args.num_eval_examples is None else script_args.num_eval_examples
        return train, offline.make_arithmetic_dataset(size, seed=0, split="test")
    name, form = script_args.dataset_name, script_args.dataset_format
    raw = load_raw_dataset(name, script_args.dataset_config, script_args.dataset_train_split)
    if len(raw) == 0:
        raise ValueError(f"--dataset_name {name} has no rows in split {script_args.dataset_train_split!r}.")
    check_columns(raw.column_names, form)
    say = _say if len(raw) >= LARGE_ROWS else lambda text: None
    say(f"--dataset_name {name}: checking the prompts and answers of {len(raw):,} rows")
    column = FORMAT_COLUMNS[form][0]
    check_prompts(raw[column], column, f"--dataset_name {name}", messages_allowed=form == "prompt-answer")
    data = to_prompt_solution(raw, form)
    check_answers(raw, data, form, name, script_args.max_unusable_answer_fraction)
    if any(isinstance(p, list) and any(isinstance(m["content"], list) for m in p) for p in data["prompt"]):
        data = data.map(flatten_text_parts)
    from transformers import AutoConfig, AutoTokenizer

    model, remote = model_args.model_name_or_path, bool(training_args and training_args.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(model, revision=model_args.model_revision, trust_remote_code=remote)
    data = prepare_prompts(data, name, tokenizer, script_args.string_prompts)
    if training_args is None:
        return data, None
    config = AutoConfig.from_pretrained(model, revision=model_args.model_revision, trust_remote_code=remote)
    context = getattr(config.get_text_config(), "max_position_embeddings", None)
    completion, limit = training_args.max_completion_length, script_args.max_overlong_prompt_fraction
    say(f"--dataset_name {name}: measuring {len(data):,} prompts with the tokenizer")
    overlong = set(check_prompt_lengths(data, name, tokenizer, context, completion, limit))
    if overlong:  # the warning says they are dropped: the trainer never sees them
        data = data.select([i for i in range(len(data)) if i not in overlong])
    return carve_heldout(data, name, script_args.num_eval_examples, script_args.evaluate_accuracy)
