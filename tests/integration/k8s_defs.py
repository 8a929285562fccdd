"""A code location for the launcher tests: Functions of several GPU classes and a CPU Function.

The run workers never execute here (KWOK fakes the pods), so the Functions' bodies do not matter.
"""

import dagster as dg
import pyarrow as pa
from dagster_k8s import k8s_job_executor

from gpufn_dagster import LanceDBResource, gpu_classes_executor, gpu_function


@dg.asset
def frames() -> None:
    """The source table."""


@gpu_function(table="frames", column="emb_a100", output_type=pa.list_(pa.float32()), gpu_class="a100-80gb", gpu_count=2)
def embed_a100(text: str) -> list:
    return []


@gpu_function(table="frames", column="emb_l4", output_type=pa.list_(pa.float32()), gpu_class="l4")
def embed_l4(text: str) -> list:
    return []


@gpu_function(table="frames", column="caption", output_type=pa.string(), gpu_class="a100-mig-1g-10gb")
def caption(text: str) -> str:
    return text


@gpu_function(table="frames", column="words", output_type=pa.int64())
def words(text: str) -> int:
    return len(text.split())


@gpu_function(table="frames", column="emb_wide", output_type=pa.list_(pa.float32()), gpu_class="l4", workers=4)
def embed_wide(text: str) -> list:
    """A refresh spread over 4 GPU workers of class l4: one shard step (pod) each."""
    return []


per_step = dg.define_asset_job("per_step", selection=["frames__emb_a100", "frames__emb_l4", "frames__words"],
                               executor_def=k8s_job_executor)
# gpufn's executor (build_definitions' default): step pods only for a run that mixes GPU classes.
auto = dg.define_asset_job("auto", selection=["frames__emb_a100", "frames__emb_l4", "frames__words"],
                           executor_def=gpu_classes_executor)

fanned = dg.define_asset_job("fanned", selection=["frames__emb_wide"], executor_def=gpu_classes_executor)

defs = dg.Definitions(assets=[frames, embed_a100, embed_l4, caption, words, embed_wide], jobs=[per_step, auto, fanned],
                      resources={"lancedb": LanceDBResource(uri="/nonexistent")})
