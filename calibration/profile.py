"""The profile: one versioned JSON document with every fitted model, which the simulator reads.

Format (schema ``pdlsim.profile``, version 1)::

    {"schema": "pdlsim.profile", "schema_version": 1, "created_utc": "...Z",
     "pdlsim_version": "0.1.0", "machine": {...records' machine metadata...},
     "sources": [{"path", "benchmark", "records", "sha256"}],
     "models": {"collectives": {...}, "compute": {...}, "transfer": {...} | null,
                "jitter": {...}, "overlap": {...}},
     "fit_quality": {"<model>": {...}}}

Each model section is its model's ``to_dict()``; :meth:`Profile.model` turns it back into the
fitted object through the name registry :data:`MODELERS` (names resolved lazily, so this module
imports no modeler and no modeler needs to import it). Loading checks the whole document
(:mod:`calibration.profile_checks`) and fails with a :class:`ProfileError` of one line naming
the file, the field and the problem. Saving is atomic (temporary file and rename).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from microbench.argtypes import check_text
from microbench.fileio import (
    TRAILING_SLASH,
    DuplicateKeyError,
    atomic_write_text,
    json_problem,
    loads_strict,
    special_kind,
)
from microbench.machine import utc_now
from microbench.records import RecordsError, is_records_file, read_records

from .profile_checks import (
    REQUIRED_MODEL_KEYS,
    ProfileError,
    check_machine,
    check_models,
    check_tree,
    shown,
)
from .profile_schema import BUILD_ERRORS, explain_build_failure, reference_fields

__all__ = [
    "MODELERS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "Profile",
    "ProfileError",
    "Source",
    "load_profile",
    "packaged_profile_names",
    "read_sources",
]

SCHEMA = "pdlsim.profile"
SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)
# The document's top-level fields (Profile.to_dict), in its order.
_FIELDS = ("schema", "schema_version", "created_utc", "pdlsim_version", "machine", "sources",
           "models", "fit_quality")  # fmt: skip
MODEL_NAMES = tuple(REQUIRED_MODEL_KEYS)

# Sections earlier versions wrote that this one reads past (in-place step measurements, the
# per-workload jitter models): a profile holding them still loads, and they change nothing.
RETIRED_MODELS = ("insitu", "jitter_models")

# Extra-P style name registry: model section -> "module:Class" with from_dict (and fit).
MODELERS: dict[str, str] = {
    "collectives": "calibration.communication:CollectiveModels",
    "compute": "calibration.compute:ComputeModel",
    "transfer": "calibration.transfer:TransferModel",
    "jitter": "calibration.jitter:JitterModel",
    "overlap": "calibration.overlap:OverlapModel",
    "colocation": "calibration.colocation:ColocationModel",
    "drift": "calibration.drift:DriftModel",
    "compression": "calibration.compression:CompressionModel",
    "storage": "calibration.storage:StorageModel",
    "kernels": "calibration.kernels:KernelModel",
}


def modeler(name: str) -> type:
    """The modeler class registered under ``name`` (imported on first use)."""
    if name not in MODELERS:
        raise KeyError(f"no modeler named {name!r}; known: {', '.join(MODELERS)}")
    module, _, cls = MODELERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def _pdlsim_version() -> str | None:
    try:
        return version("pdlsim")
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Source:
    """One records file a profile was fitted from; ``sha256`` pins its exact content."""

    path: str
    benchmark: str
    records: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "benchmark": self.benchmark,
            "records": self.records,
            "sha256": self.sha256,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Source:
        return cls(str(doc["path"]), str(doc["benchmark"]), int(doc["records"]), str(doc["sha256"]))


def read_sources(
    paths: Iterable[str | os.PathLike[str]],
) -> tuple[dict[str, Any], tuple[Source, ...]]:
    """``(machine, sources)`` of records files (or directories of ``*.jsonl``).

    ``machine`` is the first file's header metadata (rank 0's, in natural order); ``benchmark``
    names the benchmarks a file holds, comma-separated when it holds several. Each header's
    machine counts are checked as a profile's are (:func:`check_machine`), naming the file: a
    core count edited to 0 there would else be named only as the new profile's.
    """
    files: list[Path] = []
    for item in paths:
        path = Path(item)
        found = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        files.extend(f for f in found if not path.is_dir() or is_records_file(f))
    machine: dict[str, Any] = {}
    sources = []
    for path in files:
        try:
            header, records = read_records(path)
        except (OSError, RecordsError) as exc:
            raise ProfileError(str(path), "", f"cannot read records ({exc})") from None
        check_machine(str(path), header["machine"])
        machine = machine or dict(header["machine"])
        names = sorted({str(r.get("benchmark")) for r in records if r.get("benchmark")})
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        sources.append(Source(str(path), ",".join(names), len(records), digest))
    return machine, tuple(sources)


@dataclass(frozen=True)
class Profile:
    """A loaded or freshly fitted profile; ``models`` holds each model's ``to_dict()``."""

    machine: dict[str, Any]
    models: dict[str, dict[str, Any] | None]
    fit_quality: dict[str, Any] = field(default_factory=dict)
    sources: tuple[Source, ...] = ()
    created_utc: str = field(default_factory=utc_now)
    pdlsim_version: str | None = field(default_factory=_pdlsim_version)
    schema_version: int = SCHEMA_VERSION
    source: str = field(default="profile", compare=False, repr=False)  # for error messages
    # each section's model object, built once: a kernel model's tables take about a second
    # to build, and a prediction (or a validation's hundreds) asks for them many times
    _built: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)
    # whether the document passed _check_document: from_dict's profiles did; one made directly
    # from sections (a script's Profile(machine, models)) has not, until checked()
    _checked: bool = field(default=False, init=False, compare=False, repr=False)

    @classmethod
    def from_models(
        cls,
        models: Mapping[str, Any],
        machine: Mapping[str, Any] | None = None,
        sources: Iterable[Source] = (),
        fit_quality: Mapping[str, Any] | None = None,
    ) -> Profile:
        """A profile from fitted model objects (anything with ``to_dict``), dicts or None.

        Fit quality not given explicitly is taken from each model's ``quality_dict()`` when it
        has one. The result is checked as a loaded profile would be.
        """
        sections: dict[str, dict[str, Any] | None] = {}
        quality = dict(fit_quality or {})
        for name, model in models.items():
            sections[name] = model.to_dict() if hasattr(model, "to_dict") else model
            if name not in quality and hasattr(model, "quality_dict"):
                quality[name] = model.quality_dict()
        profile = cls(dict(machine or {}), sections, quality, tuple(sources))
        return cls.from_dict(json.loads(profile.to_json()), "new profile")

    @property
    def measured_on(self) -> str:
        """When and where the profile's benchmarks ran, for a reader of a prediction: the
        creation date and the machine's CPU model and cores, as far as recorded."""
        cpu = self.machine.get("cpu_model") or "an unknown CPU"
        cores = self.machine.get("cores_available") or self.machine.get("logical_cores")
        where = f"{cpu}, {cores} cores" if cores else cpu
        return f"{self.created_utc[:10]} on {where}"

    def to_dict(self) -> dict[str, Any]:
        """The document, a copy: a caller that edits it (a test making a variant of a packaged
        profile, say) must not change this profile, which its loader may share."""
        return copy.deepcopy(self._document())

    def to_json(self, indent: int | None = None) -> str:
        """The document as JSON text, without the copy: a profile of kernel tables is
        megabytes of nested lists, which a deep copy walks for seconds."""
        return json.dumps(self._document(), indent=indent, allow_nan=False)

    def _document(self) -> dict[str, Any]:
        """The document, sharing this profile's own sections: never hand it out to edit."""
        return {
            "schema": SCHEMA,
            "schema_version": self.schema_version,
            "created_utc": self.created_utc,
            "pdlsim_version": self.pdlsim_version,
            "machine": self.machine,
            "sources": [s.to_dict() for s in self.sources],
            "models": self.models,
            "fit_quality": self.fit_quality,
        }

    @classmethod
    def from_dict(cls, doc: Any, source: str = "profile", *, by_example: bool = True) -> Profile:
        """Check ``doc`` and build the profile; :class:`ProfileError` names the bad field.
        ``by_example=False`` skips the check against the packaged profiles' fields, which a
        packaged profile passes by construction (the examples are the packaged profiles)."""
        _check_document(source, doc, by_example)
        profile = cls(
            machine=doc["machine"],
            models=doc["models"],
            fit_quality=doc.get("fit_quality") or {},
            sources=tuple(Source.from_dict(s) for s in doc.get("sources") or ()),
            created_utc=doc["created_utc"],
            pdlsim_version=doc.get("pdlsim_version"),
            schema_version=doc["schema_version"],
            source=source,
        )
        object.__setattr__(profile, "_checked", True)  # frozen: set once, here
        return profile

    def checked(self) -> Profile:
        """This profile, after the checks a loaded one passes (:class:`ProfileError` naming the
        field): what a prediction is given must not reach the simulator unchecked, and one
        built directly from its sections has not been."""
        if not self._checked:
            _check_document(self.source, self._document())
            object.__setattr__(self, "_checked", True)
        return self

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically as indented JSON (checked first, so nothing invalid is written)."""
        text = self.to_json(indent=1)
        _check_document(str(path), json.loads(text))
        atomic_write_text(path, text + "\n")
        return Path(path)

    def model(self, name: str) -> Any:
        """The fitted model object of section ``name`` (None for a null section), built on the
        first call and shared by later ones: callers read it and never change it (a drawn
        variant is a copy, :mod:`pdlsim.costmodel.uncertainty`)."""
        section = self.models.get(name)
        if section is None:
            return None
        if name not in self._built:
            build = modeler(name).from_dict
            try:
                self._built[name] = build(section)
            except BUILD_ERRORS as exc:  # a field missing or of the wrong kind: name it
                raise explain_build_failure(self.source, name, build, section, exc) from None
        return self._built[name]


def _check_document(source: str, doc: Any, by_example: bool = True) -> None:
    if not isinstance(doc, Mapping):
        raise ProfileError(source, "", f"a profile is a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise ProfileError(
            source, "schema", f"expected {SCHEMA!r}, got {doc.get('schema')!r}: not a profile; "
            "give one pdlsim calibrate wrote, or a packaged profile"
        )  # fmt: skip
    ver = doc.get("schema_version")
    if type(ver) is not int or ver not in SUPPORTED_SCHEMA_VERSIONS:
        known = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
        raise ProfileError(
            source, "schema_version", f"unknown version {ver!r} (this pdlsim reads {known}); "
            "calibrate again with this pdlsim (pdlsim calibrate --from RUN), or use the pdlsim "
            "that wrote it"
        )  # fmt: skip
    unknown = sorted(str(k) for k in doc if k not in _FIELDS)
    if unknown:  # a typo ("fit_qualty") would be dropped at the next save without a word
        raise ProfileError(
            source, unknown[0], f"unknown field; a profile holds {', '.join(_FIELDS)} "
            "(is it misspelt?)"
        )  # fmt: skip
    for key, kind in (("created_utc", str), ("machine", Mapping), ("models", Mapping)):
        if key not in doc:
            raise ProfileError(source, key, "missing field")
        if not isinstance(doc[key], kind):
            raise ProfileError(source, key, f"has the wrong type {type(doc[key]).__name__}")
    _check_created(source, doc["created_utc"])
    sources = doc.get("sources")
    sources = [] if sources is None else sources  # not `or`: {} or "" is no list either
    if not isinstance(sources, list):
        raise ProfileError(source, "sources", f"must be a list, got {shown(sources)}")
    for i, item in enumerate(sources):
        keys = ("path", "benchmark", "records", "sha256")
        if not isinstance(item, Mapping) or any(k not in item for k in keys):
            raise ProfileError(source, f"sources[{i}]", f"needs {', '.join(keys)}")
        _check_source(source, f"sources[{i}]", item)
    version = doc.get("pdlsim_version")
    if version is not None and not isinstance(version, str):
        raise ProfileError(
            source, "pdlsim_version", f"must be a string or null, got {shown(version)}"
        )
    check_tree(source, version, "pdlsim_version")  # printable, as every text here
    check_tree(source, sources, "sources")
    check_tree(source, doc["machine"], "machine")
    check_machine(source, doc["machine"])
    check_models(source, doc["models"], reference_fields() if by_example else None)
    unknown = [m for m in doc["models"] if m not in MODELERS and m not in RETIRED_MODELS]
    if unknown:  # a typo ("colocaton") would leave the model out of every prediction
        raise ProfileError(
            source, f"models.{unknown[0]}", f"unknown model section; this pdlsim reads "
            f"{', '.join(MODELERS)} (is it misspelt?)"
        )  # fmt: skip
    empty = [m for m, section in doc["models"].items() if section == {}]
    if empty:  # no fitted model writes one, and the cost model reads it as a model not measured
        raise ProfileError(
            source, f"models.{empty[0]}", "is an empty object; a model not measured is null: "
            "give null, or calibrate again (pdlsim calibrate)"
        )  # fmt: skip
    quality = doc.get("fit_quality")
    quality = {} if quality is None else quality  # not `or`: [] or 0 is no object either
    if not isinstance(quality, Mapping):
        raise ProfileError(source, "fit_quality", f"must be an object, got {shown(quality)}")
    check_tree(source, quality, "fit_quality")


def _check_created(source: str, created: str) -> None:
    """``created_utc`` an ISO 8601 time, as :func:`~microbench.machine.utc_now` writes it:
    every prediction prints its date as when the profile was measured."""
    try:
        datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        raise ProfileError(
            source, "created_utc", f"expected an ISO 8601 time like 2026-01-31T12:00:00Z, got "
            f"{shown(created)}"
        ) from None  # fmt: skip


def _check_source(source: str, field: str, item: Mapping[str, Any]) -> None:
    """A ``sources`` entry as :meth:`Source.from_dict` reads it: text fields and a count of
    records (a null, a string or 1e999 there was a TypeError or OverflowError traceback)."""
    for key in ("path", "benchmark", "sha256"):
        if not isinstance(item[key], str):
            raise ProfileError(
                source, f"{field}.{key}", f"must be a string, got {shown(item[key])}"
            )
    count = item["records"]
    if type(count) is not int or count < 0:
        raise ProfileError(
            source, f"{field}.records", f"must be a whole number >= 0, got {shown(count)}"
        )


def _profiles_dir() -> Any:
    return resources.files("calibration") / "profiles"


def packaged_profile_names() -> list[str]:
    """Names of the reference profiles shipped in the package (``calibration/profiles``)."""
    folder = _profiles_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """A profile by path, or by the name of a packaged reference profile: that name is the
    packaged profile whatever the working directory holds (a folder named ``xeon-2core`` there
    must not stand in for the default), as a workload preset's name is the preset; a file so
    named is read by a path (``./xeon-2core``)."""
    key = check_text("profile", name_or_path, "'xeon-2core' or a profile file's path")
    if not key:
        names = ", ".join(packaged_profile_names()) or "none are installed"
        raise ProfileError(
            "", "", f"the profile name is empty; give a packaged profile ({names}) or a path"
        )
    path = Path(key)
    bare = os.sep not in key and not key.endswith(".json")  # a name, not a path
    if bare and key in packaged_profile_names():
        return _load_file(_profiles_dir() / f"{key}.json", f"profile '{key}'")
    if not path.exists() and bare:
        names = ", ".join(packaged_profile_names()) or "none are installed"
        raise ProfileError(key, "", f"no such profile file or packaged profile (packaged: {names})")
    if path.is_file() and key.endswith(os.sep):  # Path drops a slash the system keeps
        raise ProfileError(key, "", TRAILING_SLASH)
    if not path.is_file():
        kind = special_kind(path)
        broken = path.is_symlink() and not path.exists()  # to nowhere, or a loop of links
        problem = "a link that leads to no file" if broken else "no such file"
        fix = (
            "; give a profile.json in it, or a packaged profile"
            if kind == "a directory"
            else "; give a profile file or a packaged profile"
        )
        raise ProfileError(key, "", f"is {kind}, not a profile file{fix}" if kind else problem)
    try:
        return _load_file(path, key)
    except UnicodeDecodeError as exc:
        raise ProfileError(key, "", json_problem(exc)) from None
    except OSError as exc:
        raise ProfileError(key, "", f"cannot read it ({exc})") from None


def _load_file(path: Path, source: str) -> Profile:
    """The profile in ``path``, parsed and checked once per process for each version of the
    file (its size and modification time): a command that prices several configurations asks
    for its profile more than once, and checking a profile of kernel tables takes a second."""
    stat = path.stat()
    return _parsed(path.resolve(), stat.st_size, stat.st_mtime_ns, source)


@lru_cache(maxsize=8)
def _parsed(path: Path, size: int, mtime_ns: int, source: str) -> Profile:
    packaged = path.parent == Path(str(_profiles_dir())).resolve()  # an example itself
    return _parse(source, path.read_text(encoding="utf-8"), by_example=not packaged)


def _parse(source: str, text: str, by_example: bool = True) -> Profile:
    try:
        doc = loads_strict(text)
    except DuplicateKeyError as exc:
        raise ProfileError(
            source, "", f"the key '{exc.key}' is given twice in one object; keep one"
        ) from None
    except json.JSONDecodeError as exc:
        problem = json_problem(exc).replace("not valid JSON", "not JSON")  # its old wording
        raise ProfileError(source, "", problem) from None
    return Profile.from_dict(doc, source, by_example=by_example)
