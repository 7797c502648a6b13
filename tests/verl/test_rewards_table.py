"""`answer`'s rules against verl's own gsm8k scorer, on one table of replies (verl in its venv).

`match: gsm8k` must agree with verl on every row; `number` (the default, lenient on purpose)
differs exactly where handlers/answer.py says: no `####` (it takes the last number), `72.0` or
`72.` for 72 (numbers, not strings), `####72` or `#### $72` (no digits right after "#### "), and
an answer more than 300 characters before the end (verl reads only the tail).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from hpc_rollout.handlers.answer import score
from orchestrator.grading.verl_reward import VerlRewardError, check_spec, score_with_verl
from tests.verl.env import verl_python

#        reply                                  truth   number differs from verl
TABLE = [
    ("So 9 + 63 = 72.\n#### 72",                "72",   False),
    ("The answer is 72.",                       "72",   True),
    ("#### 72.0",                               "72",   True),
    ("#### 72.",                                "72",   True),
    ("#### 1,234",                              "1234", False),
    ("#### $72",                                "72",   True),
    ("####72",                                  "72",   True),
    ("#### 71 (not 72)",                        "72",   False),
    ("#### 72 then #### 73",                    "72",   False),
    ("#### 72" + " and so on" * 40,             "72",   True),
    ("#### -5",                                 "-5",   False),
    ("no answer at all",                        "72",   False),
    ("so 9 + 63 = 72",                          "72",   True),
]

VERL_GSM8K = """
import json, sys
from verl.utils.reward_score import default_compute_score, gsm8k
table = json.load(sys.stdin)
print(json.dumps({"gsm8k": [gsm8k.compute_score(r, t) for r, t in table],
                  "default": [default_compute_score("openai/gsm8k", r, t) for r, t in table]}))
"""


@pytest.fixture(scope="module")
def verl_scores() -> dict[str, list[float]]:
    done = subprocess.run([str(verl_python()), "-c", VERL_GSM8K], input=json.dumps([(r, t) for r, t, _ in TABLE]),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_gsm8k_rule_is_verls_and_number_differs_only_where_documented(verl_scores: dict[str, list[float]]) -> None:
    verl = verl_scores["gsm8k"]
    assert verl_scores["default"] == verl              # default_compute_score routes openai/gsm8k there
    for (reply, truth, differs), expected in zip(TABLE, verl):
        assert score(reply, truth, "gsm8k") == expected, reply
        assert (score(reply, truth, "number") != expected) is differs, reply


def test_a_custom_reward_function_is_called_the_way_verl_calls_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    module = tmp_path / "my_reward.py"
    module.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
                      "    return scale * (solution_str.strip() == ground_truth) + extra_info['index']\n")
    instance = {"data_source": "x", "reward_model": {"ground_truth": "42"}, "extra_info": {"index": 2}}
    spec = {"source": "custom", "path": str(module), "name": "compute_score", "reward_kwargs": {"scale": 3.0}}
    assert score_with_verl(spec, instance, " 42 ") == {"reward": 5.0, "reward_extra_info": {"acc": 5.0}}
    with pytest.raises(VerlRewardError, match="no function 'missing'"):
        score_with_verl({**spec, "name": "missing"}, instance, "42")
    with pytest.raises(VerlRewardError, match="must be"):
        check_spec({"source": "elsewhere"})
