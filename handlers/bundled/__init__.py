"""Small task sets made here, no download: math problems, code problems, SWE-style repositories.

`hpc-rollout tasks bundled DIR` (or `write_bundled(DIR)`) writes math.jsonl, code.jsonl,
swe.jsonl (+ the git mirrors of the SWE repositories under DIR/swe-repos) and scripted
policies for `serve-llm --scripted` that solve every task (right.jsonl) or do not (wrong.jsonl).
"""
