"""The example pipeline's code: a source table of documents and the Functions that enrich it.

`definitions.py` (repo root) declares the pipeline in Python; `docs_pipeline/defs/` declares the
same pipeline in YAML (Dagster Components), loaded by `docs_pipeline.yaml_definitions`.
"""
