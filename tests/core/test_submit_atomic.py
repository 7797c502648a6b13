"""Submit is all or nothing: rows that cannot be stored are rejected up front, and a failure while
queueing (a full disk) leaves no job queued, no temporary file, and a one-line error."""

from __future__ import annotations

import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.report.status import pending_count
from tests.core.util import cli, make_run, write_jsonl
from tests.faults.helpers import fill_disk, small_tmpfs


def nested(depth: int) -> str:
    return '{"handler": "echo", "instance": {"deep": ' + '{"a": ' * depth + "1" + "}" * depth + "}}"


def test_a_row_too_deep_to_store_is_rejected_not_half_queued(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"i": 1}}, nested(500),
                                               {"handler": "echo", "instance": {"i": 2}}])
    strict = cli("submit", str(paths.root), str(tasks), "--strict", check=False)
    assert strict.returncode == 1 and "Traceback" not in strict.stderr
    assert ":2:" in strict.stderr and "cannot be stored" in strict.stderr
    assert pending_count(paths) == 0
    lenient = cli("submit", str(paths.root), str(tasks), check=False)
    assert lenient.returncode == 1 and "Traceback" not in lenient.stderr
    assert pending_count(paths) == 2
    assert len(list(paths.submissions.glob("*.json"))) == 2


def test_parquet_values_json_cannot_hold_are_rejected_with_the_reason(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run")
    table = pa.table({
        "handler": ["echo", "echo", "echo"],
        "instance": [{"blob": None, "price": None}, {"blob": b"\x00\x01", "price": None},
                     {"blob": None, "price": decimal.Decimal("1.50")}],
    }, schema=pa.schema([("handler", pa.string()), ("instance", pa.struct(
        [("blob", pa.binary()), ("price", pa.decimal128(5, 2))]))]))
    source = tmp_path / "t.parquet"
    pq.write_table(table, source)
    result = cli("submit", str(paths.root), str(source), check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert ":2:" in result.stderr and "bytes" in result.stderr
    assert ":3:" in result.stderr and "Decimal" in result.stderr
    assert pending_count(paths) == 1


def test_a_full_disk_queues_nothing_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 4) as disk:
        paths = make_run(disk / "run")
        tasks = write_jsonl(tmp_path / "t.jsonl", [{"handler": "echo", "instance": {"pad": "x" * 2000, "i": i}}
                                                   for i in range(400)])
        filler = fill_disk(disk, keep_free=300_000)  # room for some tickets, not all
        result = cli("submit", str(paths.root), str(tasks), check=False)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr and "space" in result.stderr.lower()
        assert len(result.stderr.strip().splitlines()) == 1
        assert pending_count(paths) == 0
        assert list(paths.tmp.iterdir()) == []
        filler.unlink()
        again = cli("submit", str(paths.root), str(tasks))
        assert again.returncode == 0 and pending_count(paths) == 400
