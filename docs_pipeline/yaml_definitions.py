"""The example pipeline declared in YAML (`docs_pipeline/defs/*/defs.yaml`: Functions, the view, the
nightly schedule and the table sensor), plus its source table.

    dagster dev -m docs_pipeline.yaml_definitions
"""

import os
from pathlib import Path

from dagster.components import load_from_defs_folder

from docs_pipeline.udfs import docs
from gpufn_dagster import build_definitions
from gpufn_dagster.class_files import CLASSES_DIR_ENV
from gpufn_dagster.assets.resources import DB_URI_ENV

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault(CLASSES_DIR_ENV, str(ROOT / "classes"))
DB_URI = os.environ.setdefault(DB_URI_ENV, str(ROOT / ".gpufn_data" / "lancedb"))



def _build():
    components = load_from_defs_folder(path_within_project=ROOT)  # [tool.dg] in pyproject.toml
    return build_definitions(assets=[docs, *components.assets], asset_checks=list(components.asset_checks or []),
                             schedules=list(components.schedules or []), sensors=list(components.sensors or []),
                             db_uri=DB_URI)


defs = _build()
