"""An NFS-like rig for the suite: every emulated node sees the spool through a caching view of its own.

On a cluster each node's filesystem client caches what it saw: attributes, "does not exist"
answers, name lookups. Here each emulated node runs in a mount namespace of its own
(`unshare -m`) in which a FUSE view of the one real directory (bindfs, with the kernel's FUSE
cache timeouts as the client's cache times) is mounted at the same path as on every other node.
See tests/fsrig/node.py (one node's view) and tests/fsrig/rig.py (the settings and launching).
"""
