"""The example pipeline `dagster dev` serves on the embedded default (declared in Python; the same
pipeline in YAML is `docs_pipeline/defs/`, see `docs_pipeline.yaml_definitions`).

A `docs` table of short documents (created on first materialization in a local LanceDB
directory), a GPU Function embedding its text with all-MiniLM-L6-v2 (on CPU where there is no
GPU), a CPU Function counting words, a materialized view of the English documents and a CPU
Function on that view; asset checks on the Functions; a nightly refresh schedule; and a sensor
that refreshes everything reading `docs` when rows are added or changed (`gpufn append-docs`).
"""

import os
from pathlib import Path

import pyarrow as pa

from docs_pipeline.udfs import EMBEDDING_DIM, MiniLMEmbedder, count_words, docs, shout
from gpufn_dagster import build_definitions, gpu_function, materialized_view_asset
from gpufn_dagster.assets.checks import function_checks
from gpufn_dagster.class_files import CLASSES_DIR_ENV
from gpufn_dagster.assets.resources import DB_URI_ENV
from gpufn_dagster.assets.triggers import refresh_schedule, table_sensor

HERE = Path(__file__).parent
os.environ.setdefault(CLASSES_DIR_ENV, str(HERE / "classes"))
DB_URI = os.environ.setdefault(DB_URI_ENV, str(HERE / ".gpufn_data" / "lancedb"))

embedding = gpu_function(table="docs", column="embedding", output_type=pa.list_(pa.float32(), EMBEDDING_DIM),
                         gpu_class="default", gpu_count=1, batch_size=256, group_name="docs")(MiniLMEmbedder)
word_count = gpu_function(table="docs", column="word_count", group_name="docs")(count_words)
docs_en = materialized_view_asset("docs_en", source="docs", select=["id", "text"], where="lang = 'en'",
                                  group_name="docs")
docs_en_shout = gpu_function(table="docs_en", column="shout", source_asset="docs_en", group_name="docs")(shout)

refreshed = [embedding, word_count, docs_en, docs_en_shout]
defs = build_definitions(
    assets=[docs, *refreshed],
    asset_checks=[*function_checks(embedding), *function_checks(word_count)],
    schedules=[refresh_schedule("nightly_docs_refresh", "0 3 * * *", refreshed)],
    # On Kubernetes add gpufn_dagster.capacity_sensor(); embedded GPU steps wait for local slots in their run.
    # minimum_interval_seconds=1: every time the sensor daemon looks (each 5 s at most); with 5 it would miss
    # every third look, the daemon's loop drifting a little past 5 s.
    sensors=[table_sensor("docs", refreshed, minimum_interval_seconds=1, running=True)],
    db_uri=DB_URI,
)
