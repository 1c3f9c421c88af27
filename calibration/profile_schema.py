"""Where a damaged profile is damaged: field paths for values of the wrong kind and for fields
the model builders need but cannot find.

Each modeler reads its own section (``from_dict``), so no central schema lists every field. Two
generic checks stand in for one, so that a hand-edited or truncated profile fails with
``<file>: <field path>: <problem>`` instead of a ``KeyError`` deep in a modeler:

* by example: a field that is a number in every packaged reference profile that has it must be
  a number (or null) in any profile, and one that is a string there a string (or null)
  (:func:`reference_fields`, walked by :func:`calibration.profile_checks.check_tree`), which
  catches ``"abc"`` where a latency goes, or ``[]`` where a method's name goes, even when the
  value is only read much later, by the simulator;
* by tracing: when a modeler's ``from_dict`` fails, it is run once more on a copy of its
  section that records every field it reads, and the last field read (or the one it missed)
  is named (:func:`explain_build_failure`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from importlib import resources
from typing import Any

from .profile_checks import (
    ITEM,
    NUMBER,
    OTHER,
    TEXT,
    FieldError,
    ProfileError,
    _join,
    _numbers_only,
    is_number,
    number_rows,
    shown,
)

__all__ = ["BUILD_ERRORS", "explain_build_failure", "reference_fields"]

# What a modeler's from_dict raises on a section with a field missing or of the wrong kind.
BUILD_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def _grow(trie: dict, node: Any) -> None:
    """Add ``node``'s fields to ``trie``: one level per key (list elements share ``ITEM``),
    each level marked with what was seen there (``NUMBER``, ``TEXT``, ``OTHER``)."""
    if isinstance(node, Mapping):
        trie[OTHER] = True
        for key, item in node.items():
            _grow(trie.setdefault(key, {}), item)
    elif isinstance(node, list):
        trie[OTHER] = True
        child = trie.setdefault(ITEM, {})
        if number_rows(node):  # a table's points: what each row would mark, marked once
            child[OTHER] = True
            child.setdefault(ITEM, {})[NUMBER] = True
            return
        if _numbers_only(node):  # a table's or a sample's values: one mark, not one call each
            if node:
                child[NUMBER] = True
            return
        for item in node:
            _grow(child, item)
    elif type(node) in (int, float):  # not bool: JSON's true and false are no numbers
        trie[NUMBER] = True
    elif isinstance(node, str):
        trie[TEXT] = True
    elif node is not None:
        trie[OTHER] = True


@lru_cache(maxsize=1)
def reference_fields() -> dict:
    """The trie of every field of the packaged reference profiles' ``models`` sections, for
    :func:`calibration.profile_checks.check_tree`'s ``example`` (read once per process)."""
    trie: dict = {}
    folder = resources.files("calibration") / "profiles"
    if folder.is_dir():
        for item in folder.iterdir():
            if item.name.endswith(".json"):
                _grow(trie, json.loads(item.read_text(encoding="utf-8")).get("models"))
    return trie


def _missing_by_example(section: Any, path: str, key: str) -> str | None:
    """The path in ``section`` of an object without ``key`` where the reference profiles have
    it (for a field read from a copy of the section, which the trail does not see)."""
    name = path.rpartition(".")[2]
    stack: list[tuple[Any, Any, str]] = [(section, reference_fields().get(name), path)]
    while stack:
        node, example, where = stack.pop()
        if example is None:
            continue
        if isinstance(node, Mapping):
            if key not in node and key in example:
                return _join(where, key)
            for k, item in node.items():
                stack.append((item, example.get(k), _join(where, str(k))))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                stack.append((item, example.get(ITEM), _join(where, i)))
    return None


class _Trail:
    """The last field read, and the last one asked for but missing."""

    def __init__(self) -> None:
        self.read: tuple[str, Any] | None = None
        self.missing: str | None = None


class _TracedDict(dict):
    """A section's object that notes each field read in its :class:`_Trail`."""

    def __init__(self, data: Mapping[str, Any], path: str, trail: _Trail) -> None:
        super().__init__(data)
        self._path, self._trail = path, trail

    def __getitem__(self, key: Any) -> Any:
        field = _join(self._path, str(key))
        if not dict.__contains__(self, key):
            self._trail.missing = field
            raise KeyError(key)
        value = dict.__getitem__(self, key)
        self._trail.read = (field, value)
        return _traced(value, field, self._trail)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if dict.__contains__(self, key) else default


class _TracedList(list):
    """A section's list that notes each element read in its :class:`_Trail`."""

    def __init__(self, data: list[Any], path: str, trail: _Trail) -> None:
        super().__init__(data)
        self._path, self._trail = path, trail

    def __getitem__(self, index: Any) -> Any:
        value = list.__getitem__(self, index)
        if isinstance(index, int):
            field = _join(self._path, index)
            self._trail.read = (field, value)
            return _traced(value, field, self._trail)
        return value

    def __iter__(self) -> Any:
        for i, value in enumerate(list.__iter__(self)):
            field = _join(self._path, i)
            self._trail.read = (field, value)
            yield _traced(value, field, self._trail)


def _traced(value: Any, path: str, trail: _Trail) -> Any:
    if isinstance(value, Mapping):
        return _TracedDict({k: v for k, v in value.items()}, path, trail)
    if isinstance(value, list):
        return _TracedList(value, path, trail)
    return value


def _first_null(node: Any, path: str) -> str | None:
    """The path of the first null inside ``node`` (depth first), or None."""
    if node is None:
        return path
    items = node.items() if isinstance(node, Mapping) else enumerate(node) if isinstance(
        node, list) else ()  # fmt: skip
    for key, item in items:
        found = _first_null(item, _join(path, key if isinstance(key, int) else str(key)))
        if found is not None:
            return found
    return None


def explain_build_failure(
    source: str, name: str, build: Callable[[Any], Any], section: Mapping[str, Any], exc: Exception
) -> ProfileError:
    """The :class:`ProfileError` for ``build(section)`` (a modeler's ``from_dict``) having
    raised ``exc``: ``build`` runs again on a traced copy to find the field at fault, unless
    ``exc`` names it (:class:`~calibration.profile_checks.FieldError`)."""
    path = _join("models", name)
    if isinstance(exc, FieldError):
        return ProfileError(source, _join(path, exc.field) if exc.field else path, exc.problem)
    trail = _Trail()
    try:
        build(_traced(section, path, trail))
    except BUILD_ERRORS:  # the same failure again, now with its trail
        pass
    if isinstance(exc, KeyError):
        missing = trail.missing or _missing_by_example(section, path, str(exc.args[0]))
        if missing is not None:
            return ProfileError(source, missing, "missing field")
    if trail.read is not None:
        field, value = trail.read
        null = _first_null(value, field) if "NoneType" in str(exc) else None
        if null is not None:  # read whole (a ** or a copy), so the trail stopped above it
            return ProfileError(source, null, "null where a value belongs")
        if not is_number(value) and isinstance(exc, (TypeError, ValueError)):
            return ProfileError(source, field, f"unusable value {shown(value)} ({exc})")
        return ProfileError(source, field, f"unusable ({type(exc).__name__}: {exc})")
    return ProfileError(source, path, f"unusable ({type(exc).__name__}: {exc})")
