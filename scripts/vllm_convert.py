"""Turns a GGUF model into the folder that vLLM serves, for scripts/vllm.sh.

    python vllm_convert.py GGUF_FILE OUT_DIR

vLLM 0.32 has no GGUF loader on CPU, so transformers (with its `gguf` and
`accelerate` dependencies) dequantises the file once: the weights go to
OUT_DIR/model.safetensors, next to config.json, generation_config.json and the
tokenizer files. Transformers 5 writes the chat template to its own file,
chat_template.jinja, not into tokenizer_config.json; that is kept as it is,
since it is what a Hugging Face checkout of a recent model looks like too.

OUT_DIR must not exist yet: the folder is written under a temporary name
beside it and renamed at the end, so a reader never sees half a model.
Runs offline (HF_HUB_OFFLINE=1): everything comes from the GGUF file.
"""

import os
import shutil
import sys
import tempfile
import time


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} GGUF_FILE OUT_DIR")
    gguf_path, out_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if os.path.exists(out_dir):
        sys.exit(f"{out_dir} exists already")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    src_dir, name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    # bfloat16 halves the file and is what vLLM would compute in anyway on a
    # CPU with avx512_bf16; the Q4_1 weights lose nothing by it (4-bit values
    # times a 16-bit scale).
    kwargs = {}
    try:  # transformers >= 5.19 keeps GGUF weights packed unless asked not to
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, dtype=torch.bfloat16, **kwargs
    )
    # Every weight is a plain tensor now; transformers still marks the model
    # as "quantized with GGUF" and would refuse to save it. Drop the mark, so
    # that config.json carries no quantization_config either.
    for pname, param in model.state_dict().items():
        if param.dtype != torch.bfloat16:
            raise SystemExit(f"{pname} is still {param.dtype} after dequantising")
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp-", dir=os.path.dirname(out_dir))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = sorted(os.listdir(tmp))
        for needed in ("config.json", "model.safetensors", "chat_template.jinja"):
            if needed not in files:
                raise SystemExit(f"conversion wrote no {needed} (wrote {files})")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other users
        for f in files:
            os.chmod(os.path.join(tmp, f), 0o644)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(
        f"converted {name} to {out_dir} in {time.monotonic() - start:.1f} s: {', '.join(files)}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
