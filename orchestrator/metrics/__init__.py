"""Metrics for the tools people already use (optional extras):

    prometheus   a node-exporter textfile per worker (pip install 'hpc-rollout[metrics]')
    hooks        rollout numbers of trainer-side row batches to W&B or TensorBoard
"""
