"""Where the packages come from (everything else is in pyproject.toml).

handlers/, images/ and sbatch/ are top-level folders of the repository but install as
hpc_rollout.handlers, hpc_rollout.images and hpc_rollout.sbatch, so site-packages gets no
generic top-level names that another distribution could also claim. `hpc_rollout` is a
namespace package (no __init__.py); orchestrator/ installs as itself.
"""

from setuptools import find_packages, setup

RELOCATED = ("handlers", "images", "sbatch")

relocated = [f"hpc_rollout.{name}" for name in find_packages(include=[f"{top}{tail}" for top in RELOCATED for tail in ("", ".*")])]

setup(
    packages=find_packages(include=["orchestrator", "orchestrator.*"]) + relocated,
    package_dir={f"hpc_rollout.{top}": top for top in RELOCATED},
)
