#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json and tokenizer_config.json from a GGUF file.

Only for byte-level BPE ("gpt2") GGUF vocabularies, such as SmolLM2's. The GGUF
carries the vocabulary, the merges, the token types and the chat template; the
pre-tokenizer is not stored in it (only its name, `tokenizer.ggml.pre`), so the
one the model uses on the Hugging Face hub is named here: for "smollm" that is
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)],
the same split as llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM regexes.

Usage (needs the PyPI packages `gguf` and `tokenizers`):

    python -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf tokenizers
    eval "$(scripts/llama-server.sh)"    # fetches the SmolLM2 GGUF
    /tmp/gguf-venv/bin/python scripts/gguf_tokenizer.py "$KVGATE_LLAMA_MODEL" fixtures/smollm2
"""

import json
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp's token types (llama_token_type): 3 = control, 4 = user defined.
CONTROL, USER_DEFINED = 3, 4

# Pre-tokenizers by `tokenizer.ggml.pre`, as the hub's tokenizer.json has them.
PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def main(gguf_path, out_dir):
    reader = gguf.GGUFReader(gguf_path)
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit(f"{gguf_path}: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    pre = field(reader, "tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        sys.exit(f"{gguf_path}: no pre-tokenizer known for tokenizer.ggml.pre = {pre!r}")

    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        sys.exit(f"{gguf_path}: duplicate tokens in the vocabulary")

    def token(key):
        i = field(reader, key)
        return None if i is None else tokens[int(i)]

    unk = token("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Control tokens are special added tokens (split out before pre-tokenizing,
    # skipped when decoding); user-defined ones are plain added tokens. Both
    # keep their GGUF ids, as they are already in the vocabulary.
    specials = [tokens[i] for i, t in enumerate(types) if t == CONTROL]
    users = [tokens[i] for i, t in enumerate(types) if t == USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if users:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in users])

    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    bos = token("tokenizer.ggml.bos_token_id")
    eos = token("tokenizer.ggml.eos_token_id")
    if add_bos and bos is not None:
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
                ),
            ]
        )

    config = {
        "add_bos_token": add_bos,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer",
        "chat_template": field(reader, "tokenizer.chat_template"),
    }
    config = {k: v for k, v in config.items() if v is not None}

    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out_dir}/tokenizer.json ({len(tokens)} tokens, {len(merges)} merges, "
          f"{len(specials)} special) and tokenizer_config.json", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} MODEL.gguf OUT_DIR")
    main(sys.argv[1], sys.argv[2])
