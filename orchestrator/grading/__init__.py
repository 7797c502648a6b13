"""Verifiable rewards: answers (math-verify), hidden tests (code), test reports (SWE).

    math_answers   math-verify in a child process, bounded by our own timeout
    code_tests     hidden stdin/stdout tests run inside a sandbox by a small runner
    junit          pytest's JUnit XML -> node id statuses -> SWE-bench's "resolved"
"""
