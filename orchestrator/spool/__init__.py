"""The spool: the file protocol of a run directory (paths, tickets, claims, shards, leases...). Imports only `core`."""
