"""Find and render the Jinja2 Apptainer definition templates shipped in `images/`."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2

from orchestrator.sandbox.errors import SandboxConfigError

SUFFIX = ".def.j2"
LIST_KEYS = {"apt_packages", "pip_packages", "npm_packages"}
BOOL_KEYS = {"layer_only"}


def packaged_dir() -> Path:
    """images/ from the source tree or from an installed wheel."""
    return Path(str(files("hpc_rollout.images")))


def available() -> list[str]:
    return sorted(p.name[: -len(SUFFIX)] for p in packaged_dir().glob(f"[!_]*{SUFFIX}"))


def find_template(name_or_path: str) -> Path:
    """A path to a template file, or a packaged template's name (`python`, `swe`, `math`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path.absolute()
    candidate = packaged_dir() / (name_or_path if name_or_path.endswith(SUFFIX) else name_or_path + SUFFIX)
    if candidate.is_file():
        return candidate
    candidate = packaged_dir() / path.name
    if candidate.is_file():
        return candidate
    raise SandboxConfigError(
        f"no image template {name_or_path!r}; give a path or one of: {', '.join(available())}"
    )


def template_name(path: Path) -> str:
    return path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem


def _parse_value(key: str, value: str) -> Any:
    if key in LIST_KEYS:
        return [item for item in (v.strip() for v in value.split(",")) if item]
    if key in BOOL_KEYS:
        return value.lower() in ("1", "true", "yes", "on")
    return value


def default_variables(name: str) -> dict[str, Any]:
    """Defaults from images/defaults.txt: `*` lines for all templates, then `name` lines."""
    found: dict[str, Any] = {"from_image": "", "lock_text": "", "layer_only": False,
                             "apt_packages": [], "pip_packages": []}
    specific: dict[str, Any] = {}
    for line in (packaged_dir() / "defaults.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        scope, _, assignment = line.partition(" ")
        key, _, value = assignment.partition("=")
        if scope == "*":
            found[key] = _parse_value(key, value)
        elif scope == name:
            specific[key] = _parse_value(key, value)
    found.update(specific)
    return found


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SandboxConfigError(f"--set {pair!r} must look like key=value")
        out[key] = _parse_value(key, value)
    return out


def _raise(message: str) -> None:
    raise SandboxConfigError(message)


@dataclass(frozen=True)
class Rendered:
    template: Path
    name: str
    variables: dict[str, Any]
    text: str


def render(template: Path, variables: dict[str, Any]) -> Rendered:
    name = template_name(template)
    merged = {**default_variables(name), **variables}
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(template.parent), str(packaged_dir())]),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    )
    env.globals["raise"] = _raise
    try:
        text = env.get_template(template.name).render(**merged)
    except jinja2.UndefinedError as exc:
        raise SandboxConfigError(f"template {template}: {exc}; pass it with --set key=value") from exc
    return Rendered(template, name, merged, text.lstrip("\n"))


def sections(text: str) -> dict[str, str]:
    """The %sections of a definition file (header under the key "header")."""
    out: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in text.splitlines():
        if line.startswith("%"):
            current = line[1:].split()[0]
            out.setdefault(current, [])
            continue
        out[current].append(line)
    return {key: "\n".join(lines).strip("\n") for key, lines in out.items()}


def header_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in sections(text)["header"].splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip().lower()] = value.strip()
    return fields
