"""The JSON and JSONL readers of posenc.store.checkpoint refuse a damaged file in one line naming it (issue 59: a
list line, a folder, bytes that are not UTF-8 and a line mid-file that is not JSON gave tracebacks or were skipped
without a word), and an append after a writer killed mid-line starts a line of its own."""

import pytest

from posenc.errors import PosencError
from posenc.store.checkpoint import append_jsonl, drop_torn_tail, read_json, read_jsonl


@pytest.mark.parametrize(
    "read,data,message",
    [
        (read_json, b"[1, 2]", "is damaged (a JSON array, not an object)"),
        (read_json, b"3", "is damaged (a JSON number, not an object)"),
        (read_json, b'"x"', "is damaged (a JSON string, not an object)"),
        (read_json, b"null", "is damaged (a JSON null, not an object)"),
        (
            read_json,
            b"{",
            "is damaged (not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
        (read_jsonl, b'{"a": 1}\n[1]\n', "line 2 is a JSON array, not a record (an object); repair or remove it"),
        (
            read_jsonl,
            b'{"a": 1}\n7\n{"b": 2}\n',
            "line 2 is a JSON number, not a record (an object); repair or remove it",
        ),
        (read_jsonl, b'{"a": 1}\ngarbage\n{"b": 2}\n', "line 2 is not a JSON record; repair or remove that line"),
        (read_jsonl, b'{"a": 1}\n\xff\xfe\n', "line 2 is not a JSON record; repair or remove that line"),
        (read_jsonl, b'{"a": 1}\n\xff\xfe\n{"b": 2}', "line 2 is not a JSON record; repair or remove that line"),
    ],
)
def test_a_damaged_json_file_or_line_is_one_line_naming_it(tmp_path, read, data, message):
    path = tmp_path / "f.json"
    path.write_bytes(data)
    with pytest.raises(PosencError) as err:
        read(path)
    assert str(err.value) == f"{path} {message}"


def test_json_that_is_not_utf8_or_a_folder_is_refused(tmp_path):
    (tmp_path / "f.json").write_bytes(b"\xff\xfe")
    with pytest.raises(PosencError, match=r"f.json is damaged \(not valid JSON: 'utf-8' codec can't decode"):
        read_json(tmp_path / "f.json")
    with pytest.raises(PosencError, match=r"is damaged \(a directory, not a JSON file\)$"):
        read_json(tmp_path)


@pytest.mark.parametrize(
    "data,records",
    [
        (b'{"a": 1}\n{"b": 2', [{"a": 1}]),  # killed mid-append: the torn tail is not a record
        (b'{"a": 1}\n\xff', [{"a": 1}]),
        (b'{"a": 1}\n{"b": 2}', [{"a": 1}, {"b": 2}]),  # whole JSON without its newline (written by hand)
        (b'\n{"a": 1}\n\n', [{"a": 1}]),  # blank lines hold nothing
        (b"", []),
    ],
)
def test_read_jsonl_keeps_whole_records(tmp_path, data, records):
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    assert read_jsonl(path) == records


def test_read_jsonl_of_a_folder_or_nothing(tmp_path):
    assert read_jsonl(tmp_path / "missing.jsonl") == []
    with pytest.raises(PosencError, match=r"is damaged \(a directory, not a JSONL file\)$"):
        read_jsonl(tmp_path)


def test_a_torn_line_is_cut_before_a_writer_appends(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": ')
    drop_torn_tail(path)
    append_jsonl(path, {"c": 3})
    assert path.read_bytes() == b'{"a": 1}\n{"c": 3}\n'
    path.write_bytes(b'{"a": 1}')  # a whole record without its newline gets one
    drop_torn_tail(path)
    append_jsonl(path, {"c": 3})
    assert read_jsonl(path) == [{"a": 1}, {"c": 3}]
    drop_torn_tail(path)
    assert path.read_bytes() == b'{"a": 1}\n{"c": 3}\n'


def test_an_append_to_a_folder_is_one_line(tmp_path):
    (tmp_path / "f.jsonl").mkdir()
    with pytest.raises(PosencError, match=r"f.jsonl is a directory where a file belongs: move it away$"):
        append_jsonl(tmp_path / "f.jsonl", {"a": 1})
