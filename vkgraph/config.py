"""GraphConfig and TOML config files (ARCHITECTURE.md §5).

Keys are ``group.key``. ``configs/default.toml`` documents every key and is the one place their
defaults are written; this module reads it at import. A numeric key left at 0 means "the
default", as in ET-VK: ``GraphConfig()`` holds 0 there and ``resolved`` gives the values in force.
The other keys (booleans, strings) take the file's value directly. Precedence, highest first:
explicit ``overrides`` > environment (``VKGRAPH_<GROUP>_<KEY>``, plus ``VKGRAPH_DEVICE`` and
``VKGRAPH_VALIDATION``) > config file > defaults.

Sizes (``*_nbytes``) are non-negative integers or strings with a unit: ``"10 MiB"``,
``"512KiB"``, ``"1.5 GiB"`` (binary) or ``"10 MB"`` (decimal).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .paths import DEFAULT_CONFIG

# Kinds of values, for validation and for parsing environment strings (AUTO: true, false or "auto").
NBYTES, COUNT, BOOL, TEXT, AUTO, CHOICE = "nbytes", "count", "bool", "text", "auto", "choice"
NUMERIC = (NBYTES, COUNT)

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_nbytes(value: Any) -> int:
    """An int, or a string such as ``"10 MiB"``; raises ValueError with the reason."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"must be a byte count (an integer or a string like \"10 MiB\"), got {value!r}")
    if isinstance(value, str):
        m = _SIZE.match(value)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"cannot read {value!r} as a size (use bytes, or KiB/MiB/GiB/KB/MB/GB)")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def _coerce(kind: str, value: Any, from_env: bool, choices: tuple[str, ...] = ()) -> Any:
    """Validate (and, for environment strings, parse) one value; ValueError says why not."""
    if kind == NBYTES:
        return parse_nbytes(value)
    if kind == COUNT:
        if from_env and isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value
    if kind in (BOOL, AUTO):
        if from_env and isinstance(value, str):
            v = value.strip().lower()
            if v in ("1", "true", "yes", "on"):
                return True
            if v in ("0", "false", "no", "off", ""):
                return False
        if isinstance(value, bool):
            return value
        if kind == AUTO and value == "auto":
            return "auto"
        allowed = 'true, false or "auto"' if kind == AUTO else "true or false"
        raise ValueError(f"must be {allowed}, got {value!r}")
    if kind == TEXT:
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {value!r}")
        return value
    if kind == CHOICE:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        return value
    raise AssertionError(kind)


def _read_toml(path: str | Path) -> dict[str, Any]:
    file = str(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(file, "(file)", "no such config file") from None
    except OSError as exc:
        raise ConfigError(file, "(file)", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "(syntax)", str(exc)) from None


_DEFAULT_VALUES: dict[str, Any] = {f"{g}.{k}": v for g, table in _read_toml(DEFAULT_CONFIG).items()
                                   if isinstance(table, dict) for k, v in table.items()}


def _file_default(kind: str, dotted: str, choices: tuple[str, ...] = ()) -> Any:
    """``dotted``'s value in configs/default.toml, which must name every key."""
    if dotted not in _DEFAULT_VALUES:
        raise ConfigError(str(DEFAULT_CONFIG), dotted, "missing: the defaults file must hold every key")
    try:
        return _coerce(kind, _DEFAULT_VALUES[dotted], False, choices)
    except ValueError as exc:
        raise ConfigError(str(DEFAULT_CONFIG), dotted, str(exc)) from None


#: What 0 means for each numeric key (configs/default.toml).
DEFAULTS: dict[str, Any] = {}


def _key(kind: str, dotted: str, choices: tuple[str, ...] = ()) -> Any:
    """A config field: numeric keys default to 0 ("the default", recorded in :data:`DEFAULTS`),
    the others to their value in configs/default.toml."""
    default = _file_default(kind, dotted, choices)
    if kind in NUMERIC:
        DEFAULTS[dotted], default = default, 0
    return field(default=default, metadata={"kind": kind, "choices": choices})


@dataclass(frozen=True)
class PrepackConfig:
    """How ``run_prepack()`` cuts the prepack stream into command buffers."""

    threshold_nbytes: int = _key(NBYTES, "prepack.threshold_nbytes")
    initial_threshold_nbytes: int = _key(NBYTES, "prepack.initial_threshold_nbytes")
    threshold_nodes: int = _key(COUNT, "prepack.threshold_nodes")
    initial_threshold_nodes: int = _key(COUNT, "prepack.initial_threshold_nodes")
    staging_ring_nbytes: int = _key(NBYTES, "prepack.staging_ring_nbytes")
    reduce_peak_memory: bool | str = _key(AUTO, "prepack.reduce_peak_memory")  # True, False or "auto"
    auto_reduce_above_nbytes: int = _key(NBYTES, "prepack.auto_reduce_above_nbytes")
    host_packing: str = _key(CHOICE, "prepack.host_packing", ("auto", "never", "cpu-renderer"))
    populate_destinations: bool | str = _key(AUTO, "prepack.populate_destinations")  # True, False or "auto"


@dataclass(frozen=True)
class ExecuteConfig:
    """How ``execute()`` splits the execute nodes into command buffers, and whether
    intermediates share memory."""

    threshold_node_count: int = _key(COUNT, "execute.threshold_node_count")
    initial_threshold_node_count: int = _key(COUNT, "execute.initial_threshold_node_count")
    max_cmds: int = _key(COUNT, "execute.max_cmds")  # 0: no limit
    memory_planning: bool = _key(BOOL, "execute.memory_planning")


@dataclass(frozen=True)
class GraphOptions:
    """Storage overrides, as ET-VK's GraphConfig has them ("" = each op's default: buffers),
    whether a batch's GGML Q4 linears on CPU renderers multiply int8 activations (ops._q8_pairs),
    and the layout of fp32 linear weights there (ops._rows_weight)."""

    storage: str = _key(CHOICE, "graph.storage", ("", "buffer", "texture3d"))
    memory_layout: str = _key(CHOICE, "graph.memory_layout", ("", "channels_packed", "width_packed", "height_packed"))
    int8_activations: bool = _key(BOOL, "graph.int8_activations")
    fp32_linear_layout: str = _key(CHOICE, "graph.fp32_linear_layout", ("blocks", "rows"))


@dataclass(frozen=True)
class DeviceConfig:
    prefer: str = _key(TEXT, "device.prefer")  # device-name substring or ICD json path; "" = first device
    validation: bool = _key(BOOL, "device.validation")
    max_memory_nbytes: int = _key(NBYTES, "device.max_memory_nbytes")  # 0: no budget
    fence_timeout_ms: int = _key(COUNT, "device.fence_timeout_ms")  # longest wait before FenceTimeoutError


@dataclass(frozen=True)
class CacheConfig:
    packed_weights_path: str = _key(TEXT, "cache.packed_weights_path")  # "" = no packed-weight cache
    pipeline_cache_path: str = _key(TEXT, "cache.pipeline_cache_path")  # "" = one file per device in the cache dir
    shader_cache_dir: str = _key(TEXT, "cache.shader_cache_dir")  # "" = <cache dir>/spirv


@dataclass(frozen=True)
class GraphConfig:
    """Every tunable of a graph. Build one with :func:`load_config` or directly."""

    prepack: PrepackConfig = field(default_factory=PrepackConfig)
    execute: ExecuteConfig = field(default_factory=ExecuteConfig)
    graph: GraphOptions = field(default_factory=GraphOptions)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    source: str | None = field(default=None, compare=False)  # the file it came from

    def replace(self, **dotted: Any) -> GraphConfig:
        """A copy with ``group__key=value`` (or ``**{"group.key": value}``) changed, validated."""
        flat = {k.replace("__", "."): v for k, v in dotted.items()}
        return _apply(self, flat, "argument")

    def get(self, dotted: str) -> Any:
        group, key = dotted.split(".")
        return getattr(getattr(self, group), key)

    @cached_property
    def resolved(self) -> GraphConfig:
        """This config with every numeric key that is 0 ("the default") set to its default:
        the values in force, for typed access (``cfg.resolved.prepack.threshold_nbytes``)."""
        groups = {}
        for g, cls in GROUPS.items():
            group = getattr(self, g)
            unset = {f.name: DEFAULTS[f"{g}.{f.name}"] for f in dataclasses.fields(cls)
                     if f.metadata["kind"] in NUMERIC and getattr(group, f.name) == 0}
            groups[g] = dataclasses.replace(group, **unset)
        return dataclasses.replace(self, **groups)

    def effective(self, dotted: str) -> Any:
        """The value in force of one key: ``resolved.get(dotted)``."""
        return self.resolved.get(dotted)


GROUPS: dict[str, type] = {
    "prepack": PrepackConfig,
    "execute": ExecuteConfig,
    "graph": GraphOptions,
    "device": DeviceConfig,
    "cache": CacheConfig,
}

ENV_ALIASES = {"VKGRAPH_DEVICE": "device.prefer", "VKGRAPH_VALIDATION": "device.validation"}


def schema() -> dict[str, str]:
    """``{"group.key": kind}`` for every key."""
    return {
        f"{g}.{f.name}": f.metadata["kind"] for g, cls in GROUPS.items() for f in dataclasses.fields(cls)
    }


def _choices(dotted: str) -> tuple[str, ...]:
    group, key = dotted.split(".")
    return next(f.metadata["choices"] for f in dataclasses.fields(GROUPS[group]) if f.name == key)


def _apply(cfg: GraphConfig, values: Mapping[str, Any], where: str | None, from_env: bool = False,
           names: Mapping[str, str] | None = None) -> GraphConfig:
    kinds = schema()
    groups = {g: getattr(cfg, g) for g in GROUPS}
    for dotted, value in values.items():
        label = names[dotted] if names else dotted
        if dotted not in kinds:
            group = dotted.split(".")[0]
            known = [k for k in kinds if k.startswith(group + ".")]
            hint = f"; {group} keys are: {', '.join(k.split('.')[1] for k in known)}" if known else (
                f"; groups are: {', '.join(GROUPS)}")
            raise ConfigError(where, label, f"unknown key{hint}")
        try:
            coerced = _coerce(kinds[dotted], value, from_env, _choices(dotted))
        except ValueError as exc:
            raise ConfigError(where, label, str(exc)) from None
        group, key = dotted.split(".")
        groups[group] = dataclasses.replace(groups[group], **{key: coerced})
    return dataclasses.replace(cfg, **groups)


def _flatten_toml(data: Mapping[str, Any], file: str) -> dict[str, Any]:
    flat = {}
    for group, table in data.items():
        if group not in GROUPS:
            raise ConfigError(file, group, f"unknown group; groups are: {', '.join(GROUPS)}")
        if not isinstance(table, dict):
            raise ConfigError(file, group, f"must be a table ([{group}]), got {table!r}")
        for key, value in table.items():
            flat[f"{group}.{key}"] = value
    return flat


def env_values(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(values, variable names) for every ``VKGRAPH_*`` variable that names a config key."""
    values, names = {}, {}
    for dotted in schema():
        var = "VKGRAPH_" + dotted.replace(".", "_").upper()
        if var in env:
            values[dotted], names[dotted] = env[var], var
    for var, dotted in ENV_ALIASES.items():
        if var in env and dotted not in values:
            values[dotted], names[dotted] = env[var], var
    return values, names


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GraphConfig:
    """Defaults, then the TOML file at ``path`` (if any), then ``VKGRAPH_*`` variables from
    ``env`` (default: ``os.environ``), then ``overrides`` (``{"group.key": value}``).

    Raises :class:`ConfigError` naming the file (or variable), the key and the reason.
    """
    cfg = GraphConfig()
    if path is not None:
        file = str(path)
        cfg = dataclasses.replace(_apply(cfg, _flatten_toml(_read_toml(path), file), file), source=file)
    values, names = env_values(os.environ if env is None else env)
    if values:
        cfg = _apply(cfg, values, "environment", from_env=True, names=names)
    if overrides:
        cfg = _apply(cfg, dict(overrides), "argument")
    return cfg
