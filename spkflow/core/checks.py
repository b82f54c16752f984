"""Configuration checks shared by every config reader: :class:`ConfigError` and the ``check_*`` helpers.

Each helper raises :class:`ConfigError` with a message that starts with the source (the file) and
names the dotted key, so a mistake in any YAML section is reported where it is, at load time.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ConfigError",
    "check_choice",
    "check_factors",
    "check_keys",
    "check_named_section",
    "check_range",
    "check_value",
]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and the file."""


def check_keys(
    section: str,
    cfg: Mapping[str, Any],
    allowed: Mapping[str, Any] | set[str] | tuple[str, ...],
    source: str = "config",
) -> None:
    """Raise :class:`ConfigError` when ``cfg`` has a key that ``allowed`` lacks."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{source}: '{section}' must be a mapping, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        keys = ", ".join(f"{section}.{k}" if section else k for k in unknown)
        raise ConfigError(f"{source}: unknown key(s) {keys}; accepted: {', '.join(sorted(allowed))}")


def check_choice(source: str, key: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` (``<source>: <key> must be a | b | c, got 'x'``) unless ``value`` is a choice."""
    if value not in choices:
        raise ConfigError(f"{source}: {key} must be {' | '.join(choices)}, got {value!r}")


def check_named_section(
    section: str,
    cfg: Any,
    allowed: Mapping[str, Mapping[str, Any] | set[str] | tuple[str, ...]],
    source: str = "config",
) -> tuple[str, dict[str, Any]]:
    """A registry section such as ``model: {name: resnet, ...}``: its ``name`` (one of ``allowed``)
    and a copy of its other keys, each of them one that ``allowed[name]`` accepts."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{source}: the {section} section must be a mapping with a 'name', got {cfg!r}")
    cfg = dict(cfg)
    name = cfg.pop("name", None)
    check_choice(source, f"{section}.name", name, tuple(sorted(allowed)))
    check_keys(section, cfg, allowed[name], source=source)
    return name, cfg


def check_value(source: str, key: str, value: Any, kind: str, lo: float | None = None, hi: float | None = None) -> None:
    """Raise :class:`ConfigError` (``<source>: <key> must be ...``) unless ``value`` is of ``kind``
    (``bool``, ``int`` or ``number``: int or float, never bool) within the inclusive bounds."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
        return
    ok_type = int if kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type):
        hint = ""
        if isinstance(value, str):
            try:
                float(value)
                hint = " (YAML reads a number like 1e-3 as text: write 1.0e-3)"
            except ValueError:
                pass
        what = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"{source}: {key} must be {what}, got {value!r}{hint}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"{source}: {key} must be {bounds}, got {value!r}")


def check_range(source: str, key: str, value: Any, lo: float | None = None, integer: bool = False) -> list[float]:
    """``value`` as ``[low, high]`` (two numbers, ``low <= high``, both ``>= lo``; whole numbers when
    ``integer``); raises :class:`ConfigError` naming ``source`` and ``key`` otherwise."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{source}: {key} must be [low, high], got {value!r}")
    for i, v in enumerate(value):
        check_value(source, f"{key}[{i}]", v, "int" if integer else "number", lo)
    if value[0] > value[1]:
        raise ConfigError(f"{source}: {key} must be [low, high] with low <= high, got {value!r}")
    return [int(v) for v in value] if integer else [float(v) for v in value]


def check_factors(source: str, key: str, value: Any) -> list[float] | None:
    """Speed factors: ``null`` or a non-empty list of numbers in [0.5, 2]; returns floats."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source}: {key} must be null or a list of factors in [0.5, 2], got {value!r}")
    for i, f in enumerate(value):
        check_value(source, f"{key}[{i}]", f, "number", 0.5, 2.0)
    return [float(f) for f in value]
