"""Math answers checked with math-verify, in a child process we can time out and replace.

math-verify's own timeouts use signal.alarm, which works only in a main thread (a worker's
EVAL runs in its event loop, tests in threads), so it runs here with its timeouts off
(`parsing_timeout=None`, `timeout_seconds=None`) inside a persistent child process; a check
that takes longer than `timeout_s` kills that process (a fresh one serves the next check).
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from orchestrator.errors import HpcRolloutError

MISSING = ("the math handler needs the math-verify package: pip install 'hpc-rollout[agents]' "
           "(in verl's environment: pip install 'hpc-rollout[verl]'; or pip install math-verify)")


class MathVerifyMissing(HpcRolloutError, ImportError):
    """math-verify is not installed (an ImportError: a missing package, the same for every answer)."""


@dataclass(frozen=True)
class AnswerCheck:
    correct: bool
    gold: str            # what math-verify parsed the ground truth as
    answer: str          # ... and the answer
    error: str | None = None


def gold_text(gold: str) -> str:
    """Ground truths are bare LaTeX ("2\\sqrt{2}"); math-verify finds LaTeX inside $...$."""
    gold = gold.strip()
    return gold if "$" in gold or "\\boxed" in gold else f"${gold}$"


def _check(gold: str, answer: str) -> tuple[bool, str, str]:
    from math_verify import parse, verify

    parsed_gold = parse(gold_text(gold), parsing_timeout=None)
    parsed_answer = parse(answer, parsing_timeout=None)
    correct = bool(parsed_gold and parsed_answer and verify(parsed_gold, parsed_answer, timeout_seconds=None))
    return correct, str(parsed_gold[-1]) if parsed_gold else "", str(parsed_answer[-1]) if parsed_answer else ""


def _serve(conn: Connection) -> None:  # the child process
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # "timeout is disabled" on every call
    while True:
        try:
            gold, answer = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok",) + _check(gold, answer))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class MathVerifier:
    """One child process per verifier; checks are serialised (each takes a few ms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None
        self._warm = False          # the first check of a process pays its start and imports

    def _start(self) -> Connection:
        if importlib.util.find_spec("math_verify") is None:
            raise MathVerifyMissing(MISSING)
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True, name="math-verify")
        self._process.start()
        child.close()
        self._conn = parent
        return parent

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None
        self._warm = False

    def check(self, gold: str, answer: str, timeout_s: float = 10.0) -> AnswerCheck:
        """Blocking; call it through asyncio.to_thread from async code."""
        with self._lock:
            conn = self._conn if self._process is not None and self._process.is_alive() else None
            if conn is None:
                self._stop()
                conn = self._start()
            conn.send((gold, answer))
            if not conn.poll(timeout_s + (0.0 if self._warm else 10.0)):
                self._stop()
                return AnswerCheck(False, gold, answer, f"math-verify took longer than {timeout_s:g} s")
            self._warm = True
            reply = conn.recv()
        if reply[0] == "error":
            return AnswerCheck(False, gold, answer, reply[1])
        _, correct, parsed_gold, parsed_answer = reply
        return AnswerCheck(bool(correct), parsed_gold, parsed_answer)

    def close(self) -> None:
        with self._lock:
            self._stop()


_shared: MathVerifier | None = None


def shared_verifier() -> MathVerifier:
    global _shared
    if _shared is None:
        _shared = MathVerifier()
    return _shared
