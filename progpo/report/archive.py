"""The runs behind a report as a file (``runs.json``), so the report can be rebuilt without the MLflow store.

The tracking store (``outputs/mlflow.db``) is local and git-ignored: a fresh clone, another machine or a cleaned
checkout has none of the runs a committed report was made from. Every report therefore writes the records it used
next to its tables; ``python -m progpo.report --records <dir>/runs.json`` reads them back, alone or beside the
store's runs (a run in both counts once, as the store has it), so new seeds can be added to an archived benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from pathlib import Path

from progpo.report.records import RunRecord

ARCHIVE_NAME = "runs.json"
ARCHIVE_VERSION = 1
_REQUIRED = ("run_id", "method", "env", "seed", "final")  # what every table reads; checked by name before use


def save_archive(path: Path, experiment: str, records: Sequence[RunRecord]) -> Path:
    """Write ``records`` (final metrics and curve histories) of ``experiment`` to ``path`` as JSON."""
    runs = [asdict(record) for record in sorted(records, key=lambda r: (r.env, r.label, r.seed, r.run_id))]
    payload = {"version": ARCHIVE_VERSION, "experiment": experiment, "runs": runs}
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def load_archive(path: str | Path, experiment: str) -> list[RunRecord]:
    """The records of an archive written by ``save_archive``; a clear error for a missing, foreign or broken file."""
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


def merge_records(from_store: Iterable[RunRecord], archived: Iterable[RunRecord]) -> list[RunRecord]:
    """The store's runs, then every archived run the store does not hold (by run id)."""
    merged = list(from_store)
    seen = {record.run_id for record in merged}
    for record in archived:
        if record.run_id not in seen:
            merged.append(record)
            seen.add(record.run_id)
    return merged
