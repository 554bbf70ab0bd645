"""read_table's JSONL path without `datasets` gives the rows `datasets` gives, and leaves to it every
file whose rows Arrow's schema would change."""

import json

import pytest

from roll_lite.data import files
from roll_lite.data.files import read_table


def _through_datasets(path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(files, "_plain_json_lines", lambda path: None)
        return read_table(path, "data.train_files")


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")  # a blank last line


def test_flat_rows_of_one_schema_are_read_without_datasets_to_the_same_rows(tmp_path, monkeypatch):
    path = tmp_path / "flat.jsonl"
    _write(
        path,
        [
            {"prompt": "12=", "answer": "21", "weight": 0.5, "n": 3, "ok": True},
            {"answer": "4", "prompt": "4=", "weight": 2.0, "n": -(2**62), "ok": False},  # keys in another order
        ],
    )
    assert files._plain_json_lines(path) is not None
    plain, reference = read_table(path, "data.train_files"), _through_datasets(path, monkeypatch)
    assert plain.columns == reference.columns == ["prompt", "answer", "weight", "n", "ok"]
    assert plain.rows == reference.rows and plain.lines == reference.lines == [1, 2]
    assert [list(row) for row in plain.rows] == [list(row) for row in reference.rows]
    assert [type(v) for row in plain.rows for v in row.values()] == [
        type(v) for row in reference.rows for v in row.values()
    ]


@pytest.mark.parametrize(
    "rows",
    [
        [{"a": 1, "b": "x"}, {"a": 2.5, "b": "y"}],  # int and float in one column: Arrow makes both floats
        [{"a": 1, "b": "x"}, {"a": 2}],  # a key one row lacks: None there
        [{"a": 1, "b": None}, {"a": 2, "b": "y"}],  # a null
        [{"a": 1, "b": {"c": 1}}, {"a": 2, "b": {"d": 2}}],  # nested objects: Arrow's struct fills the keys
        [{"a": [1, 2]}, {"a": [3]}],  # lists
        [{"a": 2**63}],  # past int64
    ],
    ids=["int-and-float", "missing-key", "null", "nested", "list", "big-int"],
)
def test_rows_that_arrow_would_change_are_read_by_datasets(tmp_path, rows):
    path = tmp_path / "mixed.jsonl"
    _write(path, rows)
    assert files._plain_json_lines(path) is None


def test_a_column_of_ints_and_floats_reads_as_floats_as_datasets_reads_it(tmp_path):
    path = tmp_path / "numbers.jsonl"
    _write(path, [{"a": 1}, {"a": 2.5}])
    assert [type(row["a"]) for row in read_table(path, "data.train_files").rows] == [float, float]
