"""Issue 52's data cases at the door, before any model loads: an empty or truncated Parquet file gets a Parquet
message (was "line 1 is not UTF-8"); UTF-16BE without a BOM gets a hint of the encoding (was "Expecting value at
column 1"); `--dataset_streaming true` is refused (was accepted and ignored); a large file prints progress lines
during the data checks (was silent for 900 s; tested on a modest file with the thresholds lowered)."""

from __future__ import annotations

import json
import signal

import pytest
from datasets import Dataset

from tests.test_data_files import _datasets, _jsonl, _refused, _rows, no_model_loads  # noqa: F401  (a fixture)
from trl_groupopt.data import adapters


def _parquet(tmp_path, rows) -> str:
    path = tmp_path / "data.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def test_a_truncated_parquet_file_gets_a_parquet_message(tmp_path, no_model_loads):  # noqa: F811
    path = _parquet(tmp_path, _rows(64))
    with open(path, "r+b") as handle:
        handle.truncate(300)
    said = _refused(path, r"data.parquet: it is not a complete Parquet file \(300 bytes; .*PAR1", tmp_path)
    assert "UTF-8" not in said


def test_a_parquet_file_without_rows_gets_a_parquet_message(tmp_path, no_model_loads):  # noqa: F811
    path = tmp_path / "empty.parquet"
    Dataset.from_dict({"prompt": [], "solution": []}).to_parquet(str(path))
    said = _refused(str(path), r"empty.parquet: the Parquet file has no rows", tmp_path)
    assert "UTF-8" not in said


def test_utf16_without_a_bom_is_named_as_such(tmp_path, no_model_loads):  # noqa: F811
    path = tmp_path / "utf16.jsonl"
    path.write_bytes("".join(json.dumps(r) + "\n" for r in _rows(4)).encode("utf-16-be"))
    _refused(
        str(path), r"utf16.jsonl: line 1 holds NUL bytes: it looks like UTF-16 .* save the file as UTF-8", tmp_path
    )


def test_dataset_streaming_is_refused_not_ignored(tmp_path, no_model_loads):  # noqa: F811
    path = _jsonl(tmp_path / "rows.jsonl", _rows(32))
    with pytest.raises(ValueError, match=r"--dataset_streaming true is not supported: .* Leave it out"):
        _datasets(path, "--dataset_streaming", "true")


def test_a_large_file_says_how_far_the_data_checks_got(tmp_path, capsys, monkeypatch):
    """A modest file, with the size and row thresholds and the progress interval lowered to it."""
    monkeypatch.setattr(adapters, "LARGE_FILE_BYTES", 1)
    monkeypatch.setattr(adapters, "LARGE_ROWS", 1)
    monkeypatch.setattr(adapters, "PROGRESS_EVERY_S", 0.0)
    path = _jsonl(tmp_path / "rows.jsonl", _rows(64))
    train, _ = _datasets(path)
    out = capsys.readouterr().out
    assert "MB of data before the model loads" in out
    assert "checked 1 lines (" in out and "checked 63 lines (" in out and "of the file)" in out
    assert "checking the prompts and answers of 64 rows" in out and "measuring 64 prompts with the tokenizer" in out
    assert len(train) > 0


def test_a_dropped_stop_signal_ends_the_line_check_of_a_large_file(tmp_path, monkeypatch):
    """Broken 2, as the campaign met it: a SIGTERM dropped in a weakref callback during the checks of a 1 GB file,
    and the run went on for 11 minutes. A pending stop ends the line-by-line check within 4,096 lines."""
    from trl_groupopt.runfolder import stop

    path = _jsonl(tmp_path / "rows.jsonl", _rows(5000))
    monkeypatch.setattr(stop, "_pending", [signal.SIGTERM])
    with pytest.raises(stop.Interrupted):
        adapters.load_raw_dataset(path)
