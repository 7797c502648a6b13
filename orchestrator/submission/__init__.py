"""Turning a file of tasks into queued jobs: row shapes, sampling parameters, instance overrides."""
