"""`hpc-rollout report` and `status` on a real run: echo, sleep (with failures), chat against two
real tiny model servers with a checkpoint swap mid-run, and a cancelled group.

The page must exist with every figure as a valid PNG, its numbers must equal a direct
computation from the shards, and it must render in headless Chromium with no console error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest
from PIL import Image

from orchestrator.llm.identity import tokenizer_hash
from orchestrator.devserver.local_server import start_server
from orchestrator.llm.registry import BackendRegistry
from orchestrator.devserver.tiny_model import tiny_model_dir
from orchestrator.spool.paths import SpoolPaths
from orchestrator.submission.submit import submit_rows
from tests.core.util import cli, make_run, wait_until
from tests.report.browser import check_page
from tests.report.expected import all_rows, direct_numbers

FIGURES = {"timeline.png", "queues.png", "throughput.png", "latency.png", "reward.png", "pass_at_k.png",
           "failures.png", "backends.png"}
SCREENSHOT_DIR = Path(os.environ.get("HPC_ROLLOUT_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "hpc-rollout-test-artifacts"))


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(str(values["src"]))
        if tag == "a":
            self.links.append(str(values["href"]))
        if "id" in values:
            self.ids.add(str(values["id"]))


def _tasks() -> list[tuple[int, dict]]:
    chat = [{"handler": "chat", "data_source": "chat", "instance": {
        "messages": [{"role": "user", "content": f"Question {i}: name a colour."}],
        "user_turns": ["Another one?", "And a third?"], "sampling": {"max_tokens": 6}}} for i in range(6)]
    sleep = [{"handler": "sleep", "instance": {"init": {"uniform": [0.01, 0.05]}, "run": {"uniform": [0.05, 0.3]},
                                               "eval": 0.01, "fail": {"run": 0.5}, "reward": i % 2}} for i in range(10)]
    echo = [{"handler": "echo", "instance": {"i": i}} for i in range(5)]
    return list(enumerate(chat + sleep + echo, 1))


@pytest.mark.llm
def test_report_of_a_real_run(tmp_path: Path) -> None:
    paths = make_run(tmp_path / "run", **{"pools.run": 4})
    record = tmp_path / "served-by-a.jsonl"
    server_a = start_server(threads=1, record=record)
    server_b = start_server(threads=1)
    launch = None
    try:
        registry = BackendRegistry.of(paths)
        registry.add(server_a.url, version=3)
        assert submit_rows(paths, _tasks(), samples=2).jobs == 42
        doomed = submit_rows(paths, [(1, {"handler": "sleep", "instance": {"run": 120}})], samples=2)
        launch = subprocess.Popen(
            [*cli_prefix(), "launch", str(paths.root), "--local", "--workers", "2", "--wait", "--runtime", "local"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        wait_until(lambda: record.exists() and len(record.read_bytes().splitlines()) >= 4, 180, "turns on backend A")
        registry.swap([server_b.url], version=4)  # a new checkpoint: later tasks go to B
        wait_until(lambda: _ran(paths, doomed.first_job), 120, "the doomed group to start")
        cli("cancel", str(paths.root), "--group", doomed.first_job.rsplit("-", 1)[0])
        _, err = launch.communicate(timeout=300)
        assert launch.returncode == 1, err.decode()[-2000:]   # drained, and some sleep jobs failed on purpose
    finally:
        if launch is not None and launch.poll() is None:
            cli("stop", str(paths.root), check=False)
            launch.wait(60)
        server_a.stop()
        server_b.stop()

    rows = all_rows(paths)
    expected = direct_numbers(rows)
    assert expected["jobs"] == 44 and expected["by_status"]["cancelled"] == 2 and expected["by_status"]["failed"] >= 1
    assert expected["tokens"] == expected["turn_tokens"] > 0

    started = time.monotonic()
    made = cli("report", str(paths.root), timeout=300)
    print(f"report of {len(rows)} jobs took {time.monotonic() - started:.1f} s")
    out = paths.root / "report"
    page = out / "report.html"
    parsed = _Links()
    parsed.feed(page.read_text())
    assert set(parsed.images) == FIGURES
    for name in FIGURES:
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.size[0] >= 800 and image.size[1] >= 150
            image.verify()
    job_links = [link for link in parsed.links if link.startswith("jobs/")]
    assert job_links, "failure examples link to their inspect output"
    for link in job_links:
        inspected = orjson.loads((out / link).read_bytes())
        assert inspected["row"]["status"] != "ok" and inspected["timeline"]
    assert "skipped" not in parsed.ids, page.read_text()

    numbers = orjson.loads((out / "numbers.json").read_bytes())
    finished = numbers["finished"]
    assert finished["jobs"] == expected["jobs"] and finished["by_status"] == expected["by_status"]
    assert finished["reward_mean"] == pytest.approx(expected["reward_mean"], rel=1e-12)
    assert finished["pass_rate"] == pytest.approx(expected["pass_rate"], rel=1e-12)
    assert finished["tokens"] == expected["tokens"]
    assert finished["failure_counts"] == expected["failure_counts"]
    for stage, quantiles in expected["latency"].items():
        for name, value in quantiles.items():
            assert finished["latency_s"][stage][name] == pytest.approx(value, rel=1e-12), (stage, name)
    pass_at_1 = {p["data_source"]: p["at_k"]["1"] for p in numbers["pass_at_k"]}
    assert pass_at_1 == pytest.approx(expected["pass_at_1"], rel=1e-12)
    by_version = {g["version"]: g["count"] for g in numbers["reward_by_policy_version"]}
    assert by_version == {("none" if v is None else str(v)): n for v, n in expected["versions"].items()}
    backends = {b["url"]: {"tasks": b["tasks"], "tokens": b["tokens"]} for b in numbers["backends"] if b["turns"]}
    assert backends == expected["backends"]
    changes = {(c["url"], c["change"], c["version"]) for c in numbers["version_changes"]}
    assert {(server_a.url, "removed", 3), (server_b.url, "added", 4)} <= changes
    assert numbers["stage_executions"] >= 3 * (expected["by_status"]["ok"])

    text = made.stdout
    assert f"{expected['jobs']} (" in text and f"{expected['reward_mean']:.4g}" in text
    assert f"{expected['pass_rate']:.4g}" in text and str(expected["tokens"]) in text
    for kind, count in expected["failure_counts"].items():
        assert f"{kind} {count}" in text

    status = json.loads(cli("status", str(paths.root), "--json").stdout)["results"]
    assert status["reward_mean"] == finished["reward_mean"] and status["pass_rate"] == finished["pass_rate"]
    assert status["tokens"] == finished["tokens"] and status["failure_counts"] == finished["failure_counts"]
    assert status["latency_s"] == finished["latency_s"]

    chat_row = next(r for r in rows if r["handler"] == "chat" and r["status"] == "ok")
    identity = tokenizer_hash(str(tiny_model_dir()))
    assert chat_row["model"] == str(tiny_model_dir()) and chat_row["tokenizer_hash"] == identity
    assert all(t["model"] == chat_row["model"] and t["tokenizer_hash"] == identity and t["latency_s"] > 0
               for t in chat_row["turns"])
    inspected = json.loads(cli("inspect", str(paths.root), chat_row["job_id"], "--json").stdout)
    assert (inspected["row"]["model"], inspected["row"]["tokenizer_hash"]) == (chat_row["model"], identity)

    screenshot = tmp_path / "report.png"
    checked = check_page(page, screenshot)
    assert checked.errors == [], checked.errors
    assert set(checked.images) == FIGURES and all(checked.images.values()), checked.images
    with Image.open(screenshot) as shot:
        assert shot.size[0] >= 1000 and shot.size[1] >= 2000
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    kept = SCREENSHOT_DIR / "report-screenshot.png"
    shutil.copy(screenshot, kept)
    print(f"screenshot of the report page: {kept}")


def _ran(paths: SpoolPaths, job_id: str) -> bool:
    return any(b'"run_started"' in line and job_id.encode() in line
               for path in paths.events.glob("*.jsonl") for line in path.read_bytes().splitlines())


def cli_prefix() -> list[str]:
    return [sys.executable, "-c", "from orchestrator.cli import main; main()"]
