"""Build millm-tiny: a tiny Llama with its own byte-level BPE tokenizer.

No model hub is reachable, so the project makes its own model from text it
ships (corpus.txt). The build is deterministic: a fixed seed, one torch thread
and deterministic algorithms, so the same code gives the same weights. The
model is trained for a few hundred steps, enough to learn the ChatML shape and
end its turns with <|im_end|>, which makes the demo answer like a chat model
instead of emitting noise. It takes well under a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import sys
import time

from service.chat_template import CHATML
from service.demo_model import gguf_export
from service.demo_model import sae as demo_sae

MODEL_ID = "millm-tiny"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 768
CONTEXT_WINDOW = 1024
SEED = 1234
TRAIN_STEPS = 150
TRAIN_BATCH = 16
TRAIN_SEQ = 96
# Marker written last: a directory without it is an interrupted build.
METADATA_FILE = "millm_model.json"
# Bumped when the build's output changes, so an older build is rebuilt.
# 2: <|endoftext|> is an end token too (generation_config), as llama.cpp reads it.
BUILD_VERSION = 2

CORPUS = pathlib.Path(__file__).with_name("corpus.txt")

def parse_corpus(text: str) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """Split the corpus into prose paragraphs and conversations."""
    prose, chats = [], []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.strip().splitlines() if not ln.startswith("#")]
        if not lines:
            continue
        turns = []
        for line in lines:
            role, sep, content = line.partition(": ")
            if sep and role in ("system", "user", "assistant"):
                turns.append((role, content))
        if turns and len(turns) == len(lines):
            chats.append(turns)
        else:
            prose.append(" ".join(lines))
    return prose, chats

def render_chatml(turns: list[tuple[str, str]]) -> str:
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)

def training_documents() -> list[str]:
    prose, chats = parse_corpus(CORPUS.read_text(encoding="utf-8"))
    return prose + [render_chatml(turns) for turns in chats]

def build_tokenizer(documents: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train on plain text: the ChatML markers are special tokens, not text to merge.
    plain = [d.replace("<|im_start|>", "").replace("<|im_end|>", "") for d in documents]
    tok.train_from_iterator(plain, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    fast.model_max_length = CONTEXT_WINDOW
    return fast

def build_model(tokenizer, documents: list[str]):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT_WINDOW,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)

    # One long stream of documents, each ended by <|endoftext|>, cut into windows.
    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        ids.append(pad_id)
    stream = torch.tensor(ids, dtype=torch.long)
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(TRAIN_STEPS):
        starts = torch.randint(0, len(stream) - TRAIN_SEQ - 1, (TRAIN_BATCH,), generator=generator)
        batch = torch.stack([stream[s : s + TRAIN_SEQ] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    # Training ends every document with <|endoftext|>, and llama.cpp stops on
    # it by name in any GGUF file, so it ends a generation here too: raw
    # completions stop where the model ends its text, on both engines.
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id],
                                               pad_token_id=pad_id)
    return model, float(loss.detach())

def weights_revision(model_dir: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]

def is_built(models_dir: pathlib.Path) -> bool:
    try:
        meta = json.loads((models_dir / MODEL_ID / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("build") == BUILD_VERSION

def build(models_dir: pathlib.Path) -> pathlib.Path:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    target = models_dir / MODEL_ID
    staging = models_dir / f".{MODEL_ID}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    documents = training_documents()
    tokenizer = build_tokenizer(documents)
    model, final_loss = build_model(tokenizer, documents)
    tokenizer.save_pretrained(staging)
    model.save_pretrained(staging)
    metadata = {
        "id": MODEL_ID,
        "owned_by": "millm",
        "revision": weights_revision(staging),
        "created": int(time.time()),
        "final_training_loss": round(final_loss, 4),
        "build": BUILD_VERSION,
    }
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the millm-tiny demo model.")
    parser.add_argument(
        "--models-dir",
        default=os.environ.get("MILLM_MODELS_DIR")
        or os.path.join(os.environ.get("MILLM_DATA_DIR", ".millm"), "models"),
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    models_dir = pathlib.Path(args.models_dir)
    # The demo SAEs are cheap and independent of the model's build.
    for path in demo_sae.ensure_built(models_dir):
        print(f"built demo SAE {path}", file=sys.stderr)
    rebuilt = False
    if is_built(models_dir) and not args.force:
        print(f"{MODEL_ID} already built in {models_dir}")
    else:
        started = time.monotonic()
        target = build(models_dir)
        rebuilt = True
        meta = json.loads((target / METADATA_FILE).read_text())
        print(
            f"built {MODEL_ID} in {target} ({time.monotonic() - started:.1f}s, "
            f"revision {meta['revision']}, loss {meta['final_training_loss']})",
            file=sys.stderr,
        )
    # The GGUF export follows the checkpoint: a rebuilt checkpoint is exported again.
    if rebuilt or not gguf_export.is_exported(models_dir):
        started = time.monotonic()
        target = gguf_export.export(models_dir / MODEL_ID, models_dir)
        print(f"exported {gguf_export.REPO_ID} ({', '.join(gguf_export.QUANTIZATIONS)}) in "
              f"{target} ({time.monotonic() - started:.1f}s)", file=sys.stderr)
    return 0
