"""The runs behind a report as a file (``runs.json``), so the report can be rebuilt without the MLflow store.

The tracking store (``outputs/mlflow.db``) is local and git-ignored: a fresh clone, another machine or a cleaned
checkout has none of the runs a committed report was made from. Every report therefore writes the records it used
next to its tables; ``python -m progpo.report --records <dir>/runs.json`` reads them back, alone or beside the
store's runs (a run in both counts once, as the store has it), so new seeds can be added to an archived benchmark.

Credit-fidelity runs (Table 4) are kept under the key ``fidelity`` (their tags and ``fidelity/*`` metrics), written
only when the report has some: a file without it (every archive written before Table 4) holds none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from progpo.report.records import FidelityRecord, RunRecord

ARCHIVE_NAME = "runs.json"
ARCHIVE_VERSION = 1
_REQUIRED = ("run_id", "method", "env", "seed", "final")  # what every table reads; checked by name before use
_FIDELITY_REQUIRED = ("run_id", "status", "tags", "metrics")  # what Table 4 reads


def save_archive(path: Path, experiment: str, records: Sequence[RunRecord],
                 fidelity: Sequence[FidelityRecord] = ()) -> Path:
    """Write ``records`` (final metrics and curve histories) and ``fidelity`` (tags and ``fidelity/*`` metrics) of
    ``experiment`` to ``path`` as JSON."""
    runs = [asdict(record) for record in sorted(records, key=lambda r: (r.env, r.label, r.seed, r.run_id))]
    payload: dict[str, Any] = {"version": ARCHIVE_VERSION, "experiment": experiment, "runs": runs}
    if fidelity:
        payload["fidelity"] = [asdict(record) for record in sorted(
            fidelity, key=lambda r: (r.env, r.iteration if r.iteration is not None else -1, r.seed, r.run_id))]
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def _read(path: str | Path, experiment: str) -> dict[str, Any]:
    """The payload of an archive written by ``save_archive``; a clear error for a missing, foreign or broken file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--records {path}: no such file (a report folder's {ARCHIVE_NAME})")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"--records {path}: not JSON ({error})") from error
    if not isinstance(payload, dict) or payload.get("version") != ARCHIVE_VERSION:
        raise ValueError(f"--records {path}: not a version-{ARCHIVE_VERSION} {ARCHIVE_NAME} written by the report")
    if payload.get("experiment") != experiment:
        raise ValueError(f"--records {path} holds experiment {payload.get('experiment')!r}, not --experiment "
                         f"{experiment!r}; pass the experiment it was written for")
    return payload


def load_archive(path: str | Path, experiment: str) -> list[RunRecord]:
    """The training runs of an archive written by ``save_archive``."""
    payload = _read(path, experiment)
    known = {f.name for f in fields(RunRecord)}
    records = []
    for index, run in enumerate(payload.get("runs", [])):
        missing = [key for key in _REQUIRED if key not in run]
        if missing:
            raise ValueError(f"--records {path}: run #{index} lacks {missing}")
        record = RunRecord(**{key: value for key, value in run.items() if key in known})
        record.history = {key: [(int(step), float(value)) for step, value in points]
                          for key, points in record.history.items()}
        record.final = {key: float(value) for key, value in record.final.items()}
        records.append(record)
    return records


def load_fidelity_archive(path: str | Path, experiment: str) -> list[FidelityRecord]:
    """The credit-fidelity runs of an archive written by ``save_archive`` (none in an archive without them)."""
    payload = _read(path, experiment)
    records = []
    for index, run in enumerate(payload.get("fidelity", [])):
        missing = [key for key in _FIDELITY_REQUIRED if key not in run]
        if missing:
            raise ValueError(f"--records {path}: fidelity run #{index} lacks {missing}")
        records.append(FidelityRecord(
            run_id=str(run["run_id"]), status=str(run["status"]),
            tags={str(k): str(v) for k, v in run["tags"].items()},
            metrics={str(k): float(v) for k, v in run["metrics"].items()},
            start_time=int(run.get("start_time", 0)),
        ))
    return records


class _HasRunId(Protocol):
    run_id: str


R = TypeVar("R", bound=_HasRunId)


def merge_records(from_store: Iterable[R], archived: Iterable[R]) -> list[R]:
    """The store's runs, then every archived run the store does not hold (by run id)."""
    merged = list(from_store)
    seen = {record.run_id for record in merged}
    for record in archived:
        if record.run_id not in seen:
            merged.append(record)
            seen.add(record.run_id)
    return merged
