"""Where a MiniLM encode() call spends its CPU before the GPU sees it: the Hugging Face fast
tokenizer alone, and sentence-transformers' preprocess around it, on one process here, over 4,096
rows of 128 tokens (run after bench/prepare_minilm_carry.py):

    .venv/bin/python bench/tokenizer_split_bench.py [model directory, default .carry/minilm]
"""
import os
import sys
import time

import numpy as np
t0=time.perf_counter()
from sentence_transformers import SentenceTransformer
m = SentenceTransformer(sys.argv[1] if len(sys.argv) > 1 else '.carry/minilm', device='cpu')
m.max_seq_length = 128
print(f"load {time.perf_counter()-t0:.1f}s")
tok = m.tokenizer
vocab = tok.get_vocab()
words = np.array(sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3))
rng = np.random.default_rng(0)
texts = [" ".join(r) for r in words[rng.integers(0, len(words), size=(4096, 134))]]
def t(name, fn, reps=3):
    fn(); c0=time.process_time(); w0=time.perf_counter()
    for _ in range(reps): out=fn()
    w=time.perf_counter()-w0; c=time.process_time()-c0
    print(f"{name:55s} {reps*4096/w:8,.0f} rows/s  wall {w:5.2f}s cpu {c:5.2f}s ({c/w:.2f} cores)")
    return out
pre = getattr(m, "preprocess", None) or m.tokenize
f = t("sentence-transformers preprocess (what encode calls)", lambda: pre(texts))
print({k: tuple(v.shape) for k, v in f.items() if hasattr(v, 'shape')})
t("tokenizer(texts, padding, truncation, return_tensors=pt)", lambda: tok(texts, padding=True, truncation=True, max_length=128, return_tensors='pt'))
bt = tok.backend_tokenizer
bt.enable_truncation(128); bt.enable_padding(length=None)
encs = t("Rust backend encode_batch only", lambda: bt.encode_batch(texts))
def both():
    E = bt.encode_batch(texts)
    return np.array([e.ids for e in E]), np.array([e.attention_mask for e in E])
t("Rust encode_batch + np.array(ids, mask)", both)
os.environ  # noqa
print("cpus", os.cpu_count(), "load", os.getloadavg())
