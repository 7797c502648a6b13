"""`hpc-rollout doctor`: can this filesystem hold a spool, and with which lease?

Two agents (tests of one node run two local processes; `--nodes 2` puts them on two Slurm
nodes; `--agents-via PREFIX` starts them through any command, e.g. ssh) meet through a file in
the run directory, talk over TCP (a channel no filesystem cache delays), and measure side by side
what the spool relies on: atomic claim renames, exclusive creates, the directory-rename lock,
link(), fsync, how late one node sees what the other did (a create, a rename, an unlink, a
changed file), torn reads, and the offset between their clocks. `report.py` turns the figures
into a verdict per property and the lease and heartbeat to use; the measurement is recorded in
control/filesystem.json, which `launch` and the workers hold the run's lease to.

    channel.py   the agents' TCP channel and how they find each other
    probes.py    the measurements, each run by both agents in lockstep
    agent.py     `python -m orchestrator.doctor.agent`: one agent
    report.py    verdicts, recommendations, the record
    run.py       starting the two agents (local, a command prefix, Slurm) and collecting them
"""
