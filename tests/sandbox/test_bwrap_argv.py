"""The bubblewrap command line: isolation flags per option (the real runs are elsewhere)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.sandbox import bwrap
from orchestrator.sandbox.options import SandboxOptions
from orchestrator.sandbox.spec import LaunchSpec


def _argv(tmp_path: Path, **options: object) -> list[str]:
    spec = LaunchSpec("id1", "j-1", tmp_path / "rt", tmp_path / "rt" / "s", tmp_path / "ws",
                      SandboxOptions.parse(**options), "127.3.4.5", status_fd=7)
    return bwrap.build_argv(spec, bwrap="bwrap")


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_default_isolation_flags(tmp_path: Path) -> None:
    argv = _argv(tmp_path)
    assert argv[:8] == ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
                        "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    assert "--share-net" not in argv and "--uid" not in argv
    assert ("/usr", "/usr") in _pairs(argv, "--ro-bind")
    assert (str(tmp_path / "ws"), "/workspace") in _pairs(argv, "--bind")
    assert argv[argv.index("--size") + 1] == str(512 << 20) and argv[argv.index("--size") + 2] == "--tmpfs"
    assert argv[argv.index("--json-status-fd") + 1] == "7"
    assert argv.index("--clearenv") < argv.index("python3")
    assert "/etc/shadow" not in argv and "/etc" not in [dst for _, dst in _pairs(argv, "--ro-bind")]
    assert argv[argv.index("--remount-ro") + 1] == "/"


def test_network_fakeroot_limits_and_binds(tmp_path: Path) -> None:
    argv = _argv(tmp_path, network=True, fakeroot=True, limits={"tmp_mb": 64},
                 binds=[f"{tmp_path}:/data", f"{tmp_path}:/out:rw"])
    assert "--share-net" in argv
    assert argv[argv.index("--uid") + 1] == "0" and argv[argv.index("--gid") + 1] == "0"
    assert argv[argv.index("--size") + 1] == str(64 << 20)
    assert (str(tmp_path), "/data") in _pairs(argv, "--ro-bind")
    assert (str(tmp_path), "/out") in _pairs(argv, "--bind")


def test_image_directory_entries_are_bound_one_by_one(tmp_path: Path) -> None:
    image = tmp_path / "img"
    for name in ("usr", "etc", "opt", "proc", "tmp", "workspace"):
        (image / name).mkdir(parents=True)
    (image / "bin").symlink_to("usr/bin")
    argv = _argv(tmp_path, image=str(image))
    assert (str(image / "usr"), "/usr") in _pairs(argv, "--ro-bind")
    assert (str(image / "etc"), "/etc") in _pairs(argv, "--ro-bind")
    assert ("usr/bin", "/bin") in _pairs(argv, "--symlink")
    bound = [dst for _, dst in _pairs(argv, "--ro-bind")]
    assert "/proc" not in bound and "/tmp" not in bound and "/workspace" not in bound
