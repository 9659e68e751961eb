"""The case registry: every (op, dtype, params) the harness checks, with stable readable ids,
and each op's hypothesis strategy for fuzzing.

Tags: 'smoke' (fast, runs in CI; every smoke case is also 'full'), 'full' (the whole
correctness set), 'perf' (large, for timing), 'stress' (over 2**31 elements: int64 indexing).
Cases also load from a JSON or YAML file: a list of
    {"op": "binary_backward", "dtype": "f32", "params": {...}, "tags": ["full"]}
or a mapping {"cases": [...]} of the same.

Where cases come from: each module of the `cases` package, and the module an op names as its
`cases_module` (an op installed from a package, see harness.registry.load_ops), adds them with
`add(...)` on import and registers its fuzz strategy with `@strategy(op)`.  `all_cases()`
imports them all once.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from harness import dtypes
from harness.registry import get_op, load_ops

TAGS = ("smoke", "full", "perf", "stress")


@dataclass(eq=False)
class Case:
    op: str
    dtype: str
    params: dict[str, Any]
    tags: frozenset[str] = field(default_factory=frozenset)
    source: str = "registry"  # or the file it came from

    @property
    def id(self) -> str:
        return get_op(self.op).case_id(self)

    def seed(self, run_seed: int = 0) -> int:
        """Inputs are a pure function of the case id and the run seed."""
        return (zlib.crc32(f"{self.op}/{self.id}".encode()) ^ (run_seed * 0x9E3779B1)) & 0xFFFFFFFF

    def to_json(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "params": self.params, "tags": sorted(self.tags)}


_CASES: list[Case] = []
_BY_ID: dict[tuple[str, str], Case] = {}


def add(op: str, dtype: str, tags: Iterable[str], **params) -> Case:
    tags = frozenset(tags)
    if "smoke" in tags:
        tags |= {"full"}
    case = Case(op, dtypes.check(dtype), params, tags)
    twin = _BY_ID.get((op, case.id))
    if twin is not None:  # the same case reached by two routes keeps one entry with both tags
        twin.tags = twin.tags | tags
        return twin
    _BY_ID[(op, case.id)] = case
    _CASES.append(case)
    return case


_LOADED = False
# Case modules that failed to import: module -> reason.  Listed by `harness list`; their ops have no cases.
BROKEN: dict[str, str] = {}


def all_cases() -> list[Case]:
    """Every registered case: each module of this package and each op's `cases_module` adds its
    own on import.  A flag, not `if not _CASES`: a test that imports one case module first must not
    hide every other op's cases."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        here = [str(Path(__file__).resolve().parent)]  # the package's own folder: no import of the package
        modules = [f"{__package__}.{m.name}" for m in pkgutil.iter_modules(here)
                   if m.name != "registry" and not m.name.startswith("_")]
        modules += sorted({s.cases_module for s in load_ops().values() if s.cases_module} - set(modules))
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # an installed op's broken cases must not take the others down
                if name.startswith(f"{__package__}."):
                    raise
                BROKEN[name] = f"{type(exc).__name__}: {exc}"
    return list(_CASES)


# ----------------------------------------------------------------------------- fuzz strategies

_STRATEGIES: dict[str, Callable] = {}


def strategy(op: str):
    """Decorator registering `fn(tiny=False) -> hypothesis strategy of valid Cases of op` (harness/fuzz.py
    draws from it).  `tiny=True`: smaller sizes, for slow implementations.  Import hypothesis inside
    `fn`: the harness runs without it."""
    def register(fn):
        if _STRATEGIES.get(op, fn) is not fn:
            raise ValueError(f"a fuzz strategy for op {op!r} is registered twice")
        _STRATEGIES[op] = fn
        return fn

    return register


def strategies() -> dict[str, Callable]:
    """op -> its registered strategy builder, once every case module is loaded."""
    all_cases()
    return dict(_STRATEGIES)


# ----------------------------------------------------------------------------- case files

class CaseFileError(ValueError):
    """A case that cannot be loaded from a file or the command line: the message names the file (or
    'command line'), the entry's index, the parameter, what was expected and what it holds.
    `python -m harness` prints it and exits 2."""


KEYS = ("op", "dtype", "params", "tags")


def from_json(obj: dict, source: str) -> Case:
    """A case from its JSON form, checked against its op so a typo fails loudly."""
    if not isinstance(obj, dict):
        raise ValueError(f"case from {source}: expected a mapping with keys {', '.join(KEYS)}, got {obj!r}")
    missing = {"op", "params"} - set(obj)
    if missing:
        raise ValueError(f"case from {source}: missing {', '.join(sorted(missing))} in {obj}")
    unknown_keys = sorted(set(obj) - set(KEYS))
    if unknown_keys:
        raise ValueError(f"case from {source}: unknown key {unknown_keys[0]!r}: expected one of {', '.join(KEYS)}")
    if not isinstance(obj["params"], dict):
        raise ValueError(f"case from {source}: 'params': expected a mapping of param names to values, "
                         f"got {obj['params']!r}")
    tags = frozenset(obj.get("tags", ["full"]))
    unknown = tags - set(TAGS)
    if unknown:
        raise ValueError(f"case from {source}: unknown tags {sorted(unknown)}: expected {TAGS}")
    case = Case(obj["op"], dtypes.check(obj.get("dtype", "f32")), dict(obj["params"]),
                tags | ({"full"} if "smoke" in tags else set()), source)
    get_op(case.op).validate(case)
    return case


def _entries(data, source: str) -> list[Case]:
    """Every entry of a loaded list as a Case; the first bad one raises CaseFileError naming its index."""
    if isinstance(data, dict):
        data = data.get("cases", [data])
    if not isinstance(data, list):
        raise CaseFileError(f"{source}: expected a list of cases or a mapping with a 'cases' list, got {data!r}")
    cases = []
    for index, obj in enumerate(data):
        op = f" ({obj['op']})" if isinstance(obj, dict) and isinstance(obj.get("op"), str) else ""
        try:
            case = from_json(obj, f"{source} entry {index}")
            case.id  # noqa: B018 - building the id must work too (it reads every shape param)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
            text = text.removeprefix(f"case from {source} entry {index}: ")
            raise CaseFileError(f"{source}: entry {index}{op}: {text}") from None
        cases.append(case)
    return cases


def load_file(path: str | Path) -> list[Case]:
    path = Path(path)
    try:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - unreadable or unparsable: one clear line, not a traceback
        raise CaseFileError(f"{path}: cannot read it as {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: "
                            f"{type(exc).__name__}: {exc}") from None
    return _entries(data, str(path))


def select(spec: str = "smoke", op: str | None = None, dtype: str | None = None) -> list[Case]:
    """Cases by tag ('smoke', 'full', 'perf', 'stress', 'all'), from a file path, or one JSON case."""
    if spec.lstrip().startswith("{") or spec.lstrip().startswith("["):
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise CaseFileError(f"--cases: not a valid JSON case: {exc}") from None
        found = _entries(data if isinstance(data, list) else [data], "command line")
    elif spec in TAGS or spec == "all":
        found = [c for c in all_cases() if spec == "all" or spec in c.tags]
    elif Path(spec).exists():
        found = load_file(spec)
    else:
        raise CaseFileError(f"--cases {spec!r}: expected one of {', '.join(TAGS)}, 'all', a JSON/YAML file or a "
                            "JSON case")
    return [c for c in found if (op is None or c.op == op) and (dtype is None or c.dtype == dtype)]
