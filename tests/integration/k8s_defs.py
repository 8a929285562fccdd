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


@gpu_function(table="frames", column="emb_any", output_type=pa.list_(pa.float32()),
              gpu_class=["a100-80gb", "h100-80gb"], gpu_count=2)
def embed_any(text: str) -> list:
    """Two GPUs of an A100 node, else of an H100 node: never a CPU."""
    return []


@gpu_function(table="frames", column="emb_either", output_type=pa.list_(pa.float32()), gpu_class=["l4", "default"])
def embed_either(text: str) -> list:
    """One GPU of an L4 node, else of a default (T4) node."""
    return []


@gpu_function(table="frames", column="emb_wide_any", output_type=pa.list_(pa.float32()),
              gpu_class=["a100-80gb", "h100-80gb"], gpu_count=8, workers=4)
def embed_wide_any(text: str) -> list:
    """4 shards of a whole 8-GPU node each: the A100 pool's two nodes, then H100 nodes."""
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
fanned_any = dg.define_asset_job("fanned_any", selection=["frames__emb_wide_any"], executor_def=gpu_classes_executor)

defs = dg.Definitions(assets=[frames, embed_a100, embed_any, embed_either, embed_wide_any, embed_l4, caption, words,
                              embed_wide], jobs=[per_step, auto, fanned, fanned_any],
                      resources={"lancedb": LanceDBResource(uri="/nonexistent")})
