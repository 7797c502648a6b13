"""hpc-rollout: rollouts for RL of LLM agents on HPC clusters, with a spool directory as the only service."""

__version__ = "0.1.0"
