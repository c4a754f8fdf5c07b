"""The JSON and JSONL readers of posenc.store.checkpoint refuse a damaged file in one line naming it (issue 59: a
list line, a folder, bytes that are not UTF-8 and a line mid-file that is not JSON gave tracebacks or were skipped
without a word), and an append after a writer killed mid-line starts a line of its own."""

import pytest

from posenc.errors import PosencError
from posenc.store.checkpoint import append_jsonl, drop_torn_tail, read_json, read_jsonl


@pytest.mark.parametrize(
    "data,message",
    [
        (b"[1, 2]", "is damaged (a JSON array, not an object)"),
        (b"3", "is damaged (a JSON number, not an object)"),
        (b'"x"', "is damaged (a JSON string, not an object)"),
        (b"null", "is damaged (a JSON null, not an object)"),
        (b"{", "is damaged (not valid JSON"),
        (b"\xff\xfe", "is damaged (not valid JSON"),
    ],
)
def test_read_json_takes_an_object_only(tmp_path, data, message):
    path = tmp_path / "f.json"
    path.write_bytes(data)
    with pytest.raises(PosencError, match=rf"^{path} {message.replace('(', '[(]').replace(')', '[)]')}"):
        read_json(path)


def test_read_json_of_a_folder_says_so(tmp_path):
    with pytest.raises(PosencError, match=r"is damaged \(a directory, not a JSON file\)$"):
        read_json(tmp_path)


@pytest.mark.parametrize(
    "data,message",
    [
        (b'{"a": 1}\n[1]\n', "line 2 is a JSON array, not a record (an object); repair or remove it"),
        (b'{"a": 1}\n7\n{"b": 2}\n', "line 2 is a JSON number, not a record (an object); repair or remove it"),
        (b'{"a": 1}\ngarbage\n{"b": 2}\n', "line 2 is not a JSON record; repair or remove that line"),
        (b'{"a": 1}\n\xff\xfe\n', "line 2 is not a JSON record; repair or remove that line"),
        (b'{"a": 1}\n\xff\xfe\n{"b": 2}', "line 2 is not a JSON record; repair or remove that line"),
    ],
)
def test_read_jsonl_refuses_a_damaged_line_naming_it(tmp_path, data, message):
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    with pytest.raises(PosencError) as err:
        read_jsonl(path)
    assert str(err.value) == f"{path} {message}"


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


def test_an_append_after_a_torn_line_starts_its_own_line(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": ')
    append_jsonl(path, {"c": 3})
    assert path.read_bytes() == b'{"a": 1}\n{"c": 3}\n'
    path.write_bytes(b'{"a": 1}')  # a whole record without its newline gets one
    append_jsonl(path, {"c": 3})
    assert read_jsonl(path) == [{"a": 1}, {"c": 3}]
    drop_torn_tail(path)
    assert path.read_bytes() == b'{"a": 1}\n{"c": 3}\n'


def test_an_append_to_a_folder_is_one_line(tmp_path):
    (tmp_path / "f.jsonl").mkdir()
    with pytest.raises(PosencError, match=r"f.jsonl is a directory where a file belongs: move it away$"):
        append_jsonl(tmp_path / "f.jsonl", {"a": 1})
