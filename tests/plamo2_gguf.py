"""A tiny GGUF of a second architecture, PLaMo-2, whose llama.cpp graph never
names a block's residual stream `l_out-<il>`: the GGUF engine cannot reach it
to steer, and must say so (tests/test_gguf_steering_refusals.py).

Why PLaMo-2: in llama.cpp's sources (src/models/*.cpp) almost every
decoder-only architecture calls `cb(cur, "l_out", il)` after each block; of
those that do not, the others are encoders (BERT and kin), draft models that
need a target, or hyper-connection stacks far larger to write. PLaMo-2 is a
Llama-like block (RMSNorm, attention or Mamba, a SwiGLU FFN) whose residual
sums are named `attn_residual` and `ffn_residual` instead. Its memory is
llama.cpp's hybrid one (KV cache plus recurrent state), and llama.cpp aborts
a decode whose recurrent part holds no layer, so block 0 is a Mamba block
(head_count_kv 0) and block 1 an attention block.

The weights are random and small; the vocabulary, merges and chat template
are the demo model's (service/demo_model/gguf_export.py reads them the same
way), so the engine tokenizes and renders chats as it does for millm-tiny.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

REPO = "tiny-plamo2"
MODEL_ID = f"{REPO}:F32"
N_EMBD, N_HEAD, N_KV, HEAD_DIM, N_FF = 64, 4, 2, 16, 128
D_INNER, D_STATE, D_CONV, SSM_HEADS, DT_DIM = 128, 16, 4, 4, 64  # DT_DIM: max(64, n_embd/16)


def _mamba_block(i: int, w) -> list[tuple[str, np.ndarray]]:
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    return [
        (f"blk.{i}.ssm_in.weight", w(2 * D_INNER, N_EMBD)),
        (f"blk.{i}.ssm_conv1d.weight", w(D_INNER, D_CONV)),
        (f"blk.{i}.ssm_x.weight", w(DT_DIM + 2 * D_STATE, D_INNER)),
        (f"blk.{i}.ssm_dt.weight", w(SSM_HEADS, DT_DIM)),
        (f"blk.{i}.ssm_dt.bias", np.zeros(SSM_HEADS, dtype=np.float32)),
        (f"blk.{i}.ssm_a", -ones(SSM_HEADS)),
        (f"blk.{i}.ssm_d", ones(SSM_HEADS)),
        (f"blk.{i}.ssm_out.weight", w(N_EMBD, D_INNER)),
        (f"blk.{i}.ssm_dt_norm", ones(DT_DIM)),
        (f"blk.{i}.ssm_b_norm", ones(D_STATE)),
        (f"blk.{i}.ssm_c_norm", ones(D_STATE)),
    ]


def _attention_block(i: int, w) -> list[tuple[str, np.ndarray]]:
    return [
        (f"blk.{i}.attn_qkv.weight", w((N_HEAD + 2 * N_KV) * HEAD_DIM, N_EMBD)),
        (f"blk.{i}.attn_q_norm.weight", np.ones((N_HEAD, HEAD_DIM), dtype=np.float32)),
        (f"blk.{i}.attn_k_norm.weight", np.ones((N_KV, HEAD_DIM), dtype=np.float32)),
        (f"blk.{i}.attn_output.weight", w(N_EMBD, N_HEAD * HEAD_DIM)),
    ]


def _tensors(n_vocab: int, seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:  # numpy order: rows are llama.cpp's ne[1]
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    out = [("token_embd.weight", w(n_vocab, N_EMBD))]
    for i in range(2):
        out.append((f"blk.{i}.attn_norm.weight", ones(N_EMBD)))
        out += _mamba_block(i, w) if i == 0 else _attention_block(i, w)
        out += [
            (f"blk.{i}.post_attention_norm", ones(N_EMBD)),
            (f"blk.{i}.ffn_norm.weight", ones(N_EMBD)),
            (f"blk.{i}.ffn_up.weight", w(2 * N_FF, N_EMBD)),
            (f"blk.{i}.ffn_down.weight", w(N_EMBD, N_FF)),
            (f"blk.{i}.post_ffw_norm", ones(N_EMBD)),
        ]
    out += [("output_norm.weight", ones(N_EMBD)), ("output.weight", w(n_vocab, N_EMBD))]
    return out


def write(checkpoint: pathlib.Path, models_dir: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """`<models_dir>/tiny-plamo2/tiny-plamo2-F32.gguf`, with the demo
    checkpoint's tokenizer; returns the file's path."""
    import gguf

    from service.demo_model.gguf_export import _vocabulary

    tokens, types, merges, special = _vocabulary(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    directory = models_dir / REPO
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{REPO}-F32.gguf"
    writer = gguf.GGUFWriter(path, "plamo2")
    writer.add_name(REPO)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(2)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv([0, N_KV])  # 0: block 0 is a Mamba block
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(D_INNER)
    writer.add_ssm_state_size(D_STATE)
    writer.add_ssm_time_step_rank(SSM_HEADS)
    writer.add_ssm_group_count(0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special.get("<|endoftext|>", 0))
    writer.add_add_bos_token(False)
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_chat_template((checkpoint / "chat_template.jinja").read_text(encoding="utf-8"))
    for name, array in _tensors(len(tokens), seed):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (directory / "millm_model.json").write_text(json.dumps(
        {"id": REPO, "owned_by": "millm-tests"}) + "\n")
    return path
