"""run.toml's settings are declared on their fields (orchestrator/config.py `setting(...)`): the
tables the loader and run.toml's comments use are derived from those declarations."""

from __future__ import annotations

import pytest

from orchestrator.config import BOUNDS, CHOICES, SETTINGS, ConfigError, RunConfig
from orchestrator.run_toml import HELP, commented_toml
from orchestrator.settings_spec import Declared


def test_every_number_declares_its_bounds_and_every_setting_its_help() -> None:
    for dotted, spec in SETTINGS.items():
        assert spec.help.strip(), f"{dotted} has no help"
        if spec.kind in (int, float):
            assert dotted in BOUNDS, f"{dotted} is a number without bounds: give it setting(..., bounds=(low, high))"
    assert set(HELP) == set(SETTINGS)


@pytest.mark.parametrize("dotted", sorted(BOUNDS))
def test_a_declared_bound_is_what_the_loader_refuses_beyond(dotted: str) -> None:
    low, high = BOUNDS[dotted]
    above = high * 2 if high > 0 else high + 1
    with pytest.raises(ConfigError, match=rf"{dotted} = .* is outside"):
        RunConfig().with_overrides({dotted: above})
    assert f"from {int(low) if float(low).is_integer() else f'{low:g}'} to" in commented_toml(RunConfig())


@pytest.mark.parametrize("dotted", sorted(CHOICES))
def test_a_declared_choice_is_what_the_loader_accepts(dotted: str) -> None:
    for word in CHOICES[dotted]:
        section, _, key = dotted.partition(".")
        assert getattr(getattr(RunConfig().with_overrides({dotted: word}), section), key) == word
    with pytest.raises(ConfigError, match="valid"):
        RunConfig().with_overrides({dotted: "no-such-word"})


def test_a_declaration_checks_text_as_it_says() -> None:
    pool = Declared(help="slots", kind=int, low=0, high=8)
    assert pool.check("3") == 3
    for text, message in (("9", r"outside \[0, 8\]"), ("x", "whole number"), ("1.5", "whole number")):
        with pytest.raises(ValueError, match=message):
            pool.check(text)
    with pytest.raises(ValueError, match="one of a, b"):
        Declared(help="word", choices=("a", "b")).check("c")
