"""What of a reply reasoning-gym grades, and the answers graded as nothing (pure text, no reasoning-gym).

reasoning-gym's convention (its `utils.SYSTEM_PROMPTS` ask for it, `utils.extract_answer` reads it):
the final answer stands between `<answer>` and `</answer>`, the last such pair of the reply
counting. `extract_answer` here reads the same answer in one linear pass: theirs is a lazy regular
expression that scans to the end of the reply once per unclosed `<answer>` (quadratic in a reply
the policy writes), and where tags are nested it returns text holding a tag (`0<answer>24`) that
the default scorer then gives partial credit; here the innermost pair counts (`24`).

Answers that earn nothing whatever the dataset's scorer would say:
- longer than `answer_limit` (the default scorer gives an answer that merely holds the truth
  len(truth)/len(answer): a long list of guesses would earn a little; some scorers parse it);
- an echo: it copies a stretch of the question that the expected answer does not hold
  (`echoed`): the question often holds its answer's digits, and copying it is no answer.
"""

from __future__ import annotations

OPEN, CLOSE = "<answer>", "</answer>"
MIN_LIMIT_CHARS = 2000    # an answer may be this long whatever the truth's length (grids, move lists)
LIMIT_FACTOR = 4          # ... or this many times the expected answer's length
ECHO_CHARS = 48           # a copied stretch of the question this long is an echo


def extract_answer(reply: str) -> str | None:
    """The answer of the last complete `<answer>...</answer>` of `reply`, stripped; None without one."""
    close = reply.rfind(CLOSE)
    if close == -1:
        return None
    start = reply.rfind(OPEN, 0, close)
    if start == -1:
        return None
    end = reply.find(CLOSE, start)   # the first close after that open: the innermost pair
    return reply[start + len(OPEN):end].strip()


def answer_limit(truth: object) -> int:
    """The longest answer graded, in characters, for an expected answer `truth` (None: several are right)."""
    return max(MIN_LIMIT_CHARS, LIMIT_FACTOR * len(truth)) if isinstance(truth, str) else MIN_LIMIT_CHARS


def _squeezed(text: str) -> str:
    return " ".join(text.split()).casefold()


def echoed(answer: str, question: str, truth: object) -> int:
    """How many characters of the question the answer copies that the expected answer does not hold
    (0: no echo). Stretches of ECHO_CHARS, whitespace and case aside: a rotated matrix may equal the
    one in its question, and then the truth holds the same stretches."""
    answer, question = _squeezed(answer), _squeezed(question)
    if len(answer) < ECHO_CHARS or len(question) < ECHO_CHARS:
        return 0
    expected = _squeezed(truth) if isinstance(truth, str) else ""
    copied = {answer[i:i + ECHO_CHARS] for i in range(len(answer) - ECHO_CHARS + 1)}
    copies = [i for i in range(len(question) - ECHO_CHARS + 1)
              if (stretch := question[i:i + ECHO_CHARS]) in copied and stretch not in expected]
    covered: set[int] = set()
    for start in copies:
        covered.update(range(start, start + ECHO_CHARS))
    return len(covered)


def refusal(answer: str, question: str, truth: object) -> str | None:
    """Why `answer` is graded as nothing (None: it is graded by the dataset's scorer)."""
    limit = answer_limit(truth)
    if len(answer) > limit:
        return f"too long: {len(answer)} characters, at most {limit} are graded"
    copied = echoed(answer, question, truth)
    if copied:
        return f"echo: the answer copies {copied} characters of the question"
    return None
