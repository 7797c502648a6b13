"""Ten small programming problems: statement, hidden tests, a golden solution (one with a checker)."""

from __future__ import annotations

from typing import Any


def _t(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"input": i, "output": o} for i, o in pairs]


PROBLEMS: list[dict[str, Any]] = [
    {"name": "a-plus-b", "statement": "Read two integers a and b on one line and print a + b.",
     "tests": _t([("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("1000000000 1000000000\n", "2000000000\n"), ("7 -9\n", "-2\n")]),
     "solution": "a, b = map(int, input().split())\nprint(a + b)\n"},
    {"name": "reverse", "statement": "Read a line of text and print it reversed.",
     "tests": _t([("abc\n", "cba\n"), ("racecar\n", "racecar\n"), ("hello world\n", "dlrow olleh\n"), ("x\n", "x\n")]),
     "solution": "print(input()[::-1])\n"},
    {"name": "vowels", "statement": "Read a line of lowercase text and print how many vowels (a, e, i, o, u) it has.",
     "tests": _t([("hello\n", "2\n"), ("rhythm\n", "0\n"), ("aeiou\n", "5\n"), ("the quick brown fox\n", "5\n")]),
     "solution": "print(sum(c in 'aeiou' for c in input()))\n"},
    {"name": "maximum", "statement": "The first line holds n, the second n integers. Print the largest.",
     "tests": _t([("3\n1 5 2\n", "5\n"), ("1\n-7\n", "-7\n"), ("5\n-1 -2 -3 -4 -5\n", "-1\n"), ("4\n9 9 1 9\n", "9\n")]),
     "solution": "input()\nprint(max(map(int, input().split())))\n"},
    {"name": "fibonacci", "statement": "Read n (0 <= n <= 90) and print the n-th Fibonacci number (F0 = 0, F1 = 1).",
     "tests": _t([("0\n", "0\n"), ("1\n", "1\n"), ("10\n", "55\n"), ("90\n", "2880067194370816120\n")]),
     "solution": "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n"},
    {"name": "prime", "statement": "Read n (1 <= n <= 10^12) and print YES if it is prime, else NO.",
     "tests": _t([("2\n", "YES\n"), ("1\n", "NO\n"), ("97\n", "YES\n"), ("100\n", "NO\n"), ("999999000001\n", "YES\n"), ("1000000000000\n", "NO\n"), ("1000000007\n", "YES\n")]),
     # Miller-Rabin with the first 12 primes as bases (exact below 3.3e24): milliseconds, where
     # trial division up to 10^6 took 1-2.5 s of the 2 s limit on a loaded machine.
     "solution": ("n = int(input())\n"
                  "def is_prime(n):\n"
                  "    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)\n"
                  "    if n < 2:\n        return False\n"
                  "    for p in bases:\n        if n % p == 0:\n            return n == p\n"
                  "    d, s = n - 1, 0\n"
                  "    while d % 2 == 0:\n        d, s = d // 2, s + 1\n"
                  "    for a in bases:\n"
                  "        x = pow(a, d, n)\n"
                  "        if x in (1, n - 1):\n            continue\n"
                  "        for _ in range(s - 1):\n"
                  "            x = x * x % n\n"
                  "            if x == n - 1:\n                break\n"
                  "        else:\n            return False\n"
                  "    return True\n"
                  "print('YES' if is_prime(n) else 'NO')\n")},
    {"name": "sort", "statement": "The first line holds n, the second n integers. Print them in increasing order, separated by spaces.",
     "tests": _t([("3\n3 1 2\n", "1 2 3\n"), ("1\n5\n", "5\n"), ("5\n5 -1 3 3 0\n", "-1 0 3 3 5\n")]),
     "solution": "input()\nprint(*sorted(map(int, input().split())))\n"},
    {"name": "distinct-words", "statement": "Read a line of words separated by spaces and print how many different words it has.",
     "tests": _t([("a b a\n", "2\n"), ("one\n", "1\n"), ("x y z x y z w\n", "4\n")]),
     "solution": "print(len(set(input().split())))\n"},
    {"name": "digit-sum", "statement": "Read a non-negative integer with up to 1000 digits and print the sum of its digits.",
     "tests": _t([("0\n", "0\n"), ("12345\n", "15\n"), ("9" * 1000 + "\n", "9000\n")]),
     "solution": "print(sum(map(int, input().strip())))\n"},
    {"name": "two-summands", "statement": "Read n (2 <= n <= 10^9) and print two positive integers a and b with a + b = n. Any such pair is accepted.",
     "tests": _t([("2\n", "1 1\n"), ("10\n", "5 5\n"), ("999999999\n", "1 999999998\n")]),
     "checker": ("import sys\nn = int(open(sys.argv[1]).read())\ntry:\n    a, b = map(int, open(sys.argv[3]).read().split())\n"
                 "except ValueError:\n    sys.exit(1)\nsys.exit(0 if a >= 1 and b >= 1 and a + b == n else 1)\n"),
     "solution": "n = int(input())\nprint(1, n - 1)\n"},
]
