"""The run's data as MLflow dataset inputs: the UI's Dataset column, and what tells two runs'
data apart.

One input per split, all with the data config's name, told apart by MLflow's context tag
(``mlflow.data.context``: training, validation, testing) and by their digest:

    digest  = md5(column names, then each column's `pandas.util.hash_pandas_object`, row count)[:8]
    source  = the table's file (the embedded dataset's path, or data.path), as a local source
    schema  = MLflow column specs of the split's columns (derived columns included)
    profile = rows, columns and the first and last date

Each column is hashed on its own: the digest holds one column's hashes at a time (8 bytes a row).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, List, Mapping

import pandas as pd

CONTEXT_TAG = "mlflow.data.context"
# The run's splits, by the context MLflow's UI shows for them.
CONTEXTS = {"train": "training", "validation": "validation", "test": "testing"}
DIGEST_CHARS = 8


def frame_digest(frame: pd.DataFrame) -> str:
    """A short content hash of ``frame`` (column names, values, row count)."""
    digest = hashlib.md5(usedforsecurity=False)
    for column in frame.columns:
        digest.update(str(column).encode())
        digest.update(pd.util.hash_pandas_object(frame[column], index=False).to_numpy().tobytes())
    digest.update(str(len(frame)).encode())
    return digest.hexdigest()[:DIGEST_CHARS]


def mlflow_type(dtype: Any) -> str:
    """MLflow's column type for a pandas dtype."""
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_integer_dtype(dtype):
        return "long"
    if pd.api.types.is_float_dtype(dtype):
        return "double"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "datetime"
    return "string"


def frame_schema(frame: pd.DataFrame) -> str:
    """The frame's columns as MLflow's column-spec schema (JSON)."""
    specs = [{"type": mlflow_type(dtype), "name": str(name), "required": True} for name, dtype in frame.dtypes.items()]
    return json.dumps({"mlflow_colspec": specs})


def frame_profile(frame: pd.DataFrame, date_column: str) -> str:
    profile = {"num_rows": len(frame), "num_columns": frame.shape[1]}
    if date_column in frame.columns and len(frame):
        profile.update(first_date=str(frame[date_column].min()), last_date=str(frame[date_column].max()))
    return json.dumps(profile)


def dataset_inputs(name: str, source: Path, splits: Mapping[str, pd.DataFrame], date_column: str) -> List[Any]:
    """MLflow `DatasetInput`s of the named splits (``train``, ``validation``, ``test``; None skipped)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for split, frame in splits.items():
        if frame is None:
            continue
        dataset = Dataset(name=name, digest=frame_digest(frame), source_type="local",
                          source=json.dumps({"uri": str(Path(source).resolve())}), schema=frame_schema(frame),
                          profile=frame_profile(frame, date_column))
        inputs.append(DatasetInput(dataset, tags=[InputTag(CONTEXT_TAG, CONTEXTS[split])]))
    return inputs
