"""Export millm-tiny to GGUF (millm-tiny-gguf), the file format llama.cpp reads.

The same weights and tokenizer as the transformers checkpoint, written with
the `gguf` package in two quantizations so that the `repo:QUANT` naming rules
have something to choose between: F32 (unquantized, so its log-probabilities
can be compared with the transformers engine's) and Q8_0.

Layout: one directory per GGUF repository, one file per quantization,
`<models dir>/millm-tiny-gguf/millm-tiny-gguf-<QUANT>.gguf`. The registry reads
each file's quantization from its own metadata (general.file_type), not from
its name. The export only reads the checkpoint's files and writes tensors in
a fixed order, so the same checkpoint always gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil

import numpy as np

REPO_ID = "millm-tiny-gguf"
QUANTIZATIONS = ("F32", "Q8_0")
METADATA_FILE = "millm_model.json"


def permute_for_rope(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF Llama checkpoints rotate the two halves of each head (rotate_half);
    llama.cpp's RoPE rotates adjacent pairs. llama.cpp's own converter
    reorders the rows of the Q and K projections so that both compute the
    same thing; so must we, or every position past the first goes wrong."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def _tensors(weights: dict, config: dict) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) in llama.cpp's naming, in a fixed order."""
    n_head = config["num_attention_heads"]
    n_kv = config["num_key_value_heads"]
    embed = weights["model.embed_tokens.weight"]
    out = [("token_embd.weight", embed)]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", weights[p + "input_layernorm.weight"]),
            (f"blk.{i}.attn_q.weight",
             permute_for_rope(weights[p + "self_attn.q_proj.weight"], n_head)),
            (f"blk.{i}.attn_k.weight",
             permute_for_rope(weights[p + "self_attn.k_proj.weight"], n_kv)),
            (f"blk.{i}.attn_v.weight", weights[p + "self_attn.v_proj.weight"]),
            (f"blk.{i}.attn_output.weight", weights[p + "self_attn.o_proj.weight"]),
            (f"blk.{i}.ffn_norm.weight", weights[p + "post_attention_layernorm.weight"]),
            (f"blk.{i}.ffn_gate.weight", weights[p + "mlp.gate_proj.weight"]),
            (f"blk.{i}.ffn_up.weight", weights[p + "mlp.up_proj.weight"]),
            (f"blk.{i}.ffn_down.weight", weights[p + "mlp.down_proj.weight"]),
        ]
    out.append(("output_norm.weight", weights["model.norm.weight"]))
    # Tied embeddings: the output head is the embedding matrix.
    out.append(("output.weight", weights.get("lm_head.weight", embed)))
    return [(name, np.ascontiguousarray(array, dtype=np.float32)) for name, array in out]


def _vocabulary(checkpoint: pathlib.Path) -> tuple[list[str], list[int], list[str], dict]:
    """Tokens (byte-level strings, by id), their types, merges as "a b", and
    the special tokens' ids, from the checkpoint's tokenizer.json."""
    import gguf

    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(tokenizer["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", []) if t["special"]}
    vocab.update(special)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("the tokenizer's ids are not contiguous")
    tokens = [t for t, _ in by_id]
    types = [int(gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL)
             for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    return tokens, types, merges, special


def write_file(checkpoint: pathlib.Path, path: pathlib.Path, quant: str,
               name: str = REPO_ID) -> None:
    """One GGUF file of a Llama-architecture checkpoint in `quant` (F32, F16
    or Q8_0; matrices only, norms stay F32 as llama.cpp keeps them)."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    weights = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(shard))
    tokens, types, merges, special = _vocabulary(checkpoint)
    template = (checkpoint / "chat_template.jinja")
    chat_template = template.read_text(encoding="utf-8") if template.is_file() else None
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[quant]
    rope = config.get("rope_parameters") or {}

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_file_type(int(file_type))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(len(tokens))
    # A byte-level BPE with GPT-2's pre-tokenizer regex, as the HF tokenizer has.
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    # The HF tokenizer adds no BOS; llama.cpp still wants an id for it.
    writer.add_bos_token_id(special.get("<|endoftext|>", 0))
    writer.add_add_bos_token(False)
    writer.add_eos_token_id(config["eos_token_id"])
    if config.get("pad_token_id") is not None:
        writer.add_pad_token_id(config["pad_token_id"])
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for tensor, array in _tensors(weights, config):
        if quant == "Q8_0" and array.ndim == 2:
            # llama.cpp keeps norms (1-D) in F32 and quantizes the matrices.
            data = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(tensor, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif quant == "F16" and array.ndim == 2:
            writer.add_tensor(tensor, array.astype(np.float16))
        else:
            writer.add_tensor(tensor, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def file_name(quant: str) -> str:
    return f"{REPO_ID}-{quant}.gguf"


def export(checkpoint: pathlib.Path, models_dir: pathlib.Path) -> pathlib.Path:
    """Write every quantization into a staging directory, then move it in
    whole, so a reader never sees half a repository."""
    target = models_dir / REPO_ID
    staging = models_dir / f".{REPO_ID}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    revisions = {}
    for quant in QUANTIZATIONS:
        path = staging / file_name(quant)
        write_file(checkpoint, path, quant)
        revisions[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    source = json.loads((checkpoint / METADATA_FILE).read_text())
    metadata = {
        "id": REPO_ID,
        "owned_by": "millm",
        "created": source.get("created"),
        "exported_from": {"id": source.get("id"), "revision": source.get("revision")},
        # Each file's own content revision, for system_fingerprint.
        "revisions": revisions,
    }
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target
