"""A code location for the DRA tests: Functions of GPU classes that claim DRA devices.

The run workers never execute here (KWOK fakes the pods), so the Functions' bodies do not matter.
"""

import dagster as dg
import pyarrow as pa

from gpufn_dagster import LanceDBResource, gpu_classes_executor, gpu_function


@dg.asset
def frames() -> None:
    """The source table."""


@gpu_function(table="frames", column="emb_h100", output_type=pa.list_(pa.float32()), gpu_class="dra-h100", gpu_count=2)
def embed_h100(text: str) -> list:
    """Two H100 devices of one node, claimed through DRA."""
    return []


@gpu_function(table="frames", column="emb_any", output_type=pa.list_(pa.float32()),
              gpu_class=["dra-h100", "dra-a100"], gpu_count=2)
def embed_any(text: str) -> list:
    """Two H100 devices, else two A100 devices: one claim whose firstAvailable tries them in order."""
    return []


@gpu_function(table="frames", column="emb_queued", output_type=pa.list_(pa.float32()), gpu_class="dra-queued",
              gpu_count=2)
def embed_queued(text: str) -> list:
    """Two H100 devices of a class that Kueue admits (when its class file puts it in Kueue mode)."""
    return []


@gpu_function(table="frames", column="emb_wide", output_type=pa.list_(pa.float32()), gpu_class="dra-h100", workers=2)
def embed_wide(text: str) -> list:
    """A refresh spread over 2 workers of one H100 device each: one shard pod (and claim) each."""
    return []


@gpu_function(table="frames", column="emb_real", output_type=pa.list_(pa.float32()), gpu_class="dra-real", workers=2)
def embed_real(text: str) -> list:
    """A refresh spread over 2 workers, each one device of the real node's DRA driver."""
    return []


fanned_real = dg.define_asset_job("fanned_real", selection=["frames__emb_real"], executor_def=gpu_classes_executor)
fanned = dg.define_asset_job("fanned", selection=["frames__emb_wide"], executor_def=gpu_classes_executor)

defs = dg.Definitions(assets=[frames, embed_h100, embed_any, embed_queued, embed_wide, embed_real],
                      jobs=[fanned, fanned_real],
                      resources={"lancedb": LanceDBResource(uri="/nonexistent")})
