"""Three small Python packages with a real bug each, as git histories: the SWE-style tasks.

Each repository has two commits (a skeleton, then the feature with its bug and its passing
tests). The task: the issue text, FAIL_TO_PASS tests added by the test patch, PASS_TO_PASS
tests already there, the golden fix, and a `decoy` fix that makes FAIL_TO_PASS pass while
breaking a PASS_TO_PASS test (it must score 0).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class SweRepo:
    name: str
    skeleton: dict[str, str]          # first commit
    feature: dict[str, str]           # second commit (the base): the bug is in here
    problem_statement: str
    test_file: str
    new_tests: str                    # appended to test_file by the test patch
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    fix: Edit
    decoy: Edit


INTERVALS = SweRepo(
    name="intervals",
    skeleton={
        "README.md": "# intervals\n\nSmall helpers for closed integer intervals.\n",
        "intervals/__init__.py": '"""Closed intervals [start, end]."""\n',
    },
    feature={
        "intervals/__init__.py": '"""Closed intervals [start, end]."""\n\nfrom intervals.merge import merge\n\n__all__ = ["merge"]\n',
        "intervals/merge.py": (
            '"""Merging overlapping intervals."""\n\n\n'
            "def merge(intervals):\n"
            '    """Merge closed intervals that overlap or touch; return them sorted."""\n'
            "    result = []\n"
            "    for start, end in sorted(intervals):\n"
            "        if result and start < result[-1][1]:\n"
            "            result[-1][1] = max(result[-1][1], end)\n"
            "        else:\n"
            "            result.append([start, end])\n"
            "    return result\n"
        ),
        "tests/test_merge.py": (
            "from intervals import merge\n\n\n"
            "def test_empty():\n    assert merge([]) == []\n\n\n"
            "def test_disjoint():\n    assert merge([[5, 6], [1, 2]]) == [[1, 2], [5, 6]]\n\n\n"
            "def test_overlapping():\n    assert merge([[1, 4], [2, 6], [8, 9]]) == [[1, 6], [8, 9]]\n\n\n"
            "def test_nested():\n    assert merge([[1, 10], [2, 3]]) == [[1, 10]]\n"
        ),
    },
    problem_statement=(
        "merge() does not merge intervals that touch\n\n"
        "The docstring of intervals.merge.merge says closed intervals that overlap *or touch* are merged, "
        "but merge([[1, 2], [2, 3]]) returns [[1, 2], [2, 3]] instead of [[1, 3]]."
    ),
    test_file="tests/test_merge.py",
    new_tests="\n\ndef test_touching():\n    assert merge([[1, 2], [2, 3]]) == [[1, 3]]\n\n\n"
              "def test_touching_chain():\n    assert merge([[3, 4], [1, 2], [2, 3]]) == [[1, 4]]\n",
    fail_to_pass=("tests/test_merge.py::test_touching", "tests/test_merge.py::test_touching_chain"),
    pass_to_pass=("tests/test_merge.py::test_empty", "tests/test_merge.py::test_disjoint",
                  "tests/test_merge.py::test_overlapping", "tests/test_merge.py::test_nested"),
    fix=Edit("intervals/merge.py", "if result and start < result[-1][1]:", "if result and start <= result[-1][1]:"),
    decoy=Edit("intervals/merge.py", "if result and start < result[-1][1]:", "if result:"),
)

ROMAN = SweRepo(
    name="roman",
    skeleton={
        "README.md": "# roman\n\nRoman numerals.\n",
        "roman/__init__.py": '"""Roman numerals."""\n',
    },
    feature={
        "roman/__init__.py": '"""Roman numerals."""\n\nfrom roman.convert import to_roman\n\n__all__ = ["to_roman"]\n',
        "roman/convert.py": (
            '"""Integers to Roman numerals."""\n\n'
            "SYMBOLS = [\n"
            '    (1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I"),\n'
            "]\n\n\n"
            "def to_roman(number):\n"
            '    """The standard Roman numeral of 1 <= number <= 3999."""\n'
            "    if not 1 <= number <= 3999:\n"
            '        raise ValueError("Roman numerals cover 1..3999")\n'
            '    digits = ""\n'
            "    for value, symbol in SYMBOLS:\n"
            "        count, number = divmod(number, value)\n"
            "        digits += symbol * count\n"
            "    return digits\n"
        ),
        "tests/test_convert.py": (
            "import pytest\n\nfrom roman import to_roman\n\n\n"
            "def test_additive():\n    assert [to_roman(n) for n in (1, 3, 8, 2023)] == [\"I\", \"III\", \"VIII\", \"MMXXIII\"]\n\n\n"
            "def test_out_of_range():\n    with pytest.raises(ValueError):\n        to_roman(0)\n"
        ),
    },
    problem_statement=(
        "to_roman() writes 4 as IIII\n\n"
        "to_roman(4) returns 'IIII' and to_roman(1994) returns 'MDCCCCLXXXXIIII'. Standard numerals use "
        "subtractive pairs: 4 is IV, 9 is IX, 40 is XL, 90 is XC, 400 is CD, 900 is CM."
    ),
    test_file="tests/test_convert.py",
    new_tests="\n\ndef test_subtractive():\n    assert [to_roman(n) for n in (4, 9, 14, 40, 90, 400, 900)] == "
              "[\"IV\", \"IX\", \"XIV\", \"XL\", \"XC\", \"CD\", \"CM\"]\n\n\n"
              "def test_year():\n    assert to_roman(1994) == \"MCMXCIV\"\n",
    fail_to_pass=("tests/test_convert.py::test_subtractive", "tests/test_convert.py::test_year"),
    pass_to_pass=("tests/test_convert.py::test_additive", "tests/test_convert.py::test_out_of_range"),
    fix=Edit("roman/convert.py",
             '    (1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I"),\n',
             '    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),\n'
             '    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),\n'),
    decoy=Edit("roman/convert.py",
               "    if not 1 <= number <= 3999:\n",
               '    if number in (4, 9, 14, 40, 90, 400, 900, 1994):\n'
               '        return {4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 900: "CM", 1994: "MCMXCIV"}[number]\n'
               "    if not 1 <= number <= 3:\n"),
)

TEXTSTATS = SweRepo(
    name="textstats",
    skeleton={
        "README.md": "# textstats\n\nCounting things in text.\n",
        "textstats/__init__.py": '"""Text statistics."""\n',
    },
    feature={
        "textstats/__init__.py": '"""Text statistics."""\n\nfrom textstats.words import average_length, word_count\n\n__all__ = ["average_length", "word_count"]\n',
        "textstats/words.py": (
            '"""Words in a text: runs of characters between whitespace."""\n\n\n'
            "def words(text):\n"
            '    return text.split(" ")\n\n\n'
            "def word_count(text):\n"
            "    return len(words(text))\n\n\n"
            "def average_length(text):\n"
            "    found = words(text)\n"
            "    return sum(len(w) for w in found) / len(found)\n"
        ),
        "tests/test_words.py": (
            "from textstats import average_length, word_count\n\n\n"
            "def test_count_simple():\n    assert word_count(\"hello big world\") == 3\n\n\n"
            "def test_count_single():\n    assert word_count(\"word\") == 1\n\n\n"
            "def test_average():\n    assert average_length(\"ab abcd\") == 3\n"
        ),
    },
    problem_statement=(
        "word_count() miscounts text with newlines or repeated spaces\n\n"
        "Words are runs of characters between whitespace, but word_count('one\\ntwo') returns 1 and "
        "word_count('a  b') returns 3."
    ),
    test_file="tests/test_words.py",
    new_tests="\n\ndef test_count_whitespace():\n    assert word_count(\"one\\ntwo\\tthree\") == 3\n\n\n"
              "def test_count_repeated_spaces():\n    assert word_count(\"a  b   c \") == 3\n",
    fail_to_pass=("tests/test_words.py::test_count_whitespace", "tests/test_words.py::test_count_repeated_spaces"),
    pass_to_pass=("tests/test_words.py::test_count_simple", "tests/test_words.py::test_count_single",
                  "tests/test_words.py::test_average"),
    fix=Edit("textstats/words.py", '    return text.split(" ")\n', "    return text.split()\n"),
    decoy=Edit("textstats/words.py", "def word_count(text):\n    return len(words(text))\n",
               "def word_count(text):\n    return len(text.split()) if text.strip() != \"word\" else 0\n"),
)

REPOS: tuple[SweRepo, ...] = (INTERVALS, ROMAN, TEXTSTATS)
