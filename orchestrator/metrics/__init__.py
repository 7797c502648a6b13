"""Metrics for the tools people already use (optional extras):

    prometheus   a node-exporter textfile per worker (pip install 'hpc-rollout[metrics]')
    live         each worker's scalars at its heartbeats to TensorBoard / W&B (sinks in live_sinks,
                 its last minute of finished jobs in recent)
    hooks        rollout numbers of trainer-side row batches to W&B or TensorBoard
"""
