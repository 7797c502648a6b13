"""Stage workers: one process per node running INIT, RUN and EVAL pools over the spool."""
