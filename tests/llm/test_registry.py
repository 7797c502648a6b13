"""backends.json: atomic, locked writes; clear errors; no lost entries under concurrency."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.llm.errors import RegistryCorrupt, RegistryError
from orchestrator.llm.registry import BackendRegistry, BackendState, Protocol
from orchestrator.spool.paths import SpoolPaths
from orchestrator.spool.rundir import init_run


def test_add_remove_list_round_trip(tmp_path: Path) -> None:
    registry = BackendRegistry.of(tmp_path)
    registry.add("http://node17:8000/v1/", version=3, model="m", protocol="sglang")
    entry = registry.read().find("http://node17:8000/v1")
    assert entry is not None and entry.node == "node17" and entry.protocol is Protocol.SGLANG
    assert entry.policy_version == 3 and entry.state is BackendState.UP and entry.added_at > 0
    on_disk = json.loads((tmp_path / "backends.json").read_text())  # readable with cat
    assert on_disk["policy_version"] == 3 and on_disk["backends"][0]["url"] == "http://node17:8000/v1"
    registry.add("http://node18:8000/v1")  # defaults to the registry's version
    assert registry.read().find("http://node18:8000/v1").policy_version == 3
    registry.remove("http://node17:8000/v1")
    assert [b.url for b in registry.read().backends] == ["http://node18:8000/v1"]
    with pytest.raises(RegistryError, match="registered: http://node18"):
        registry.remove("http://node17:8000/v1")
    assert registry.clear() == 1 and registry.read().backends == ()
    assert not (tmp_path / "backends.json.lock").exists()


@pytest.mark.parametrize("url", ["node17:8000", "ftp://node17/v1", "http://", "http://h:99999/v1",
                                 "http://h:1/v1?x=1"])
def test_bad_urls_are_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(RegistryError, match="URL"):
        BackendRegistry.of(tmp_path).add(url)


def test_bad_protocol_names_the_options(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="vllm, sglang"):
        BackendRegistry.of(tmp_path).add("http://h:1/v1", protocol="tgi")


def test_swap_replaces_the_set_and_bumps_the_version(tmp_path: Path) -> None:
    registry = BackendRegistry.of(tmp_path)
    registry.add("http://a:1/v1", version=3, model="m1")
    snapshot = registry.swap(["http://a:1/v1", "http://b:1/v1"])
    assert snapshot.policy_version == 4
    assert {b.url: b.policy_version for b in snapshot.backends} == {"http://a:1/v1": 4, "http://b:1/v1": 4}
    assert snapshot.find("http://a:1/v1").model == "m1"  # kept when not given again
    assert registry.swap(["http://c:1/v1"], version=9).policy_version == 9
    assert [b.url for b in registry.read().backends] == ["http://c:1/v1"]


def test_corrupt_registry_is_a_clear_error_and_a_writer_rebuilds_it(tmp_path: Path) -> None:
    init_run(tmp_path)  # the CLI works on run directories only
    (tmp_path / "backends.json").write_text('{"backends": [ {"url": ')
    registry = BackendRegistry.of(tmp_path)
    with pytest.raises(RegistryCorrupt, match="backend add .* writes a new one"):
        registry.read()
    runner = CliRunner()
    result = runner.invoke(cli, ["backend", "list", str(tmp_path)])
    assert result.exit_code != 0 and "corrupt" in result.output
    assert runner.invoke(cli, ["backend", "clear", str(tmp_path)]).exit_code != 0
    assert (tmp_path / "backends.json").exists(), "a reader (list) moved nothing"
    registry.add("http://a:1/v1")   # a writer starts a new registry; the bad one is kept aside
    assert [b.url for b in registry.read().backends] == ["http://a:1/v1"]
    [kept] = [p for p in (tmp_path / "quarantine").iterdir() if p.name.startswith("backends.json.")
              and not p.name.endswith(".reason")]
    assert kept.read_text() == '{"backends": [ {"url": '
    assert "corrupt" in kept.with_name(kept.name + ".reason").read_text()
    (tmp_path / "backends.json").write_text("[]")
    result = runner.invoke(cli, ["backend", "clear", str(tmp_path), "--force"])
    assert result.exit_code == 0, result.output
    assert registry.read().backends == ()


def _writer(run_dir: str, worker: int, count: int) -> None:
    registry = BackendRegistry.of(run_dir)
    for i in range(count):
        registry.add(f"http://w{worker}-{i}:8000/v1")


def test_concurrent_writers_never_lose_an_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 15)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    urls = {b.url for b in BackendRegistry.of(tmp_path).read().backends}
    assert urls == {f"http://w{w}-{i}:8000/v1" for w in range(6) for i in range(15)}


def test_cli_add_swap_list(tmp_path: Path) -> None:
    init_run(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(cli, ["backend", "add", str(tmp_path), "http://node17:8000/v1", "--version", "3"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(cli, ["backend", "add", str(tmp_path), "node17:8000"])
    assert bad.exit_code != 0 and "http://node17:8000/v1" in bad.output
    swap = runner.invoke(cli, ["backend", "swap", str(tmp_path), "--version", "4",
                               "http://node17:8000/v1", "http://node18:8000/v1"])
    assert swap.exit_code == 0 and "policy version 4" in swap.output
    listing = runner.invoke(cli, ["backend", "list", str(tmp_path), "--json"])
    data = json.loads(listing.output)
    assert [b["policy_version"] for b in data["backends"]] == [4, 4]
    assert all(b["inflight"] == 0 for b in data["backends"])
    drain = runner.invoke(cli, ["backend", "state", str(tmp_path), "http://node18:8000/v1", "draining"])
    assert drain.exit_code == 0 and "draining" in drain.output
    assert BackendRegistry.of(tmp_path).read().find("http://node18:8000/v1").state is BackendState.DRAINING
    unknown = runner.invoke(cli, ["backend", "state", str(tmp_path), "http://node19:8000/v1", "up"])
    assert unknown.exit_code != 0 and "no backend" in unknown.output
    table = runner.invoke(cli, ["backend", "list", str(tmp_path)])
    assert "node18" in table.output and "policy version 4" in table.output
    assert SpoolPaths.of(tmp_path).backends.is_file()
