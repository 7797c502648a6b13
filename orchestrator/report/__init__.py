"""`hpc-rollout report`: pictures and numbers of a run, from its spool alone.

    shard_read   columns of the committed shards (one bad shard costs only itself)
    event_read   job events of every worker as one table
    spool_read   heartbeats, submissions, backend registry and its history
    finished     numbers about finished jobs (shared with `status`)
    outcomes     reward by policy version / data source, pass@k
    activity     stage intervals per worker slot, jobs per queue and stage over time
    llm_stats    LLM turns, backends, tools
    model        all of the above for one report
    figures      matplotlib (Agg) PNGs;  page: the HTML;  summary: text and numbers.json
    build        writes RUN/report/
"""
