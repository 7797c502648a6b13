"""verifiers (github.com/PrimeIntellect-ai/verifiers, its v1 tasksets) for the `verifiers`
handler's test: installed once into a virtualenv of the system python3 (Debian's 3.11, the
interpreter of the `tasks` image too; verifiers needs >= 3.11) in the cache, then bound read-only
into sandboxes at /verifiers and run with that venv's python.

The install takes ~2 min and ~570 MB (openai, anthropic, mcp, pydantic, numpy, ...); set
VERIFIERS_VENV to reuse one made elsewhere. scripts/test.sh starts it in the background
(`python -m tests.proxy.verifiers_venv`); the test waits for that install before looking.
"""

from __future__ import annotations

from tests.proxy.cached_venv import CachedVenv

VERSION = "0.4.0"
VENV = CachedVenv(f"verifiers=={VERSION}", f"verifiers-{VERSION}", "VERIFIERS_VENV", "python",
                  "HPC_ROLLOUT_VERIFIERS_INSTALL_PID", "HPC_ROLLOUT_VERIFIERS_INSTALL_LOG")

if __name__ == "__main__":
    print(VENV.ensure())
