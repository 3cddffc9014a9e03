"""Train millm-tiny: a tiny Llama with its own byte-level BPE tokenizer.

No model hub is reachable, so the project makes its own model from text it
ships (corpus.txt). The build is deterministic on one CPU: a fixed seed, one
torch thread and deterministic algorithms, so the same code gives the same
weights there. Another CPU's vector instructions round differently and four
hundred steps carry the difference into other weights, so the repository
ships what this build made (shipped.py): `make model` installs that, and this
training runs only when asked (`python -m service.demo_model --train`). The
model is trained for a few hundred steps, enough to learn the ChatML shape and
end its turns with <|im_end|>, which makes the demo answer like a chat model
instead of emitting noise. A dozen tool conversations, rendered by the same
template with their tools, teach it the shape of a call: offered get_weather
and asked about the weather, it answers with a <tool_call> block that calls
it, and without tools it answers in text (the corpus asks some of the same
questions without tools, and the tools' system turn is read but never
learned as text to write, so it cannot drift into it). It is far too small
to read the arguments from the question: the city it passes is one from its
training conversations, seldom the one asked about.

A second phase teaches it the coding agents' loop (agent_sessions.py): asked
about a file at the end of a prompt of up to 20,000 tokens, with file and
shell tools offered in Claude Code's, Codex's and Qwen Code's shapes, it opens
a call (the engine's grammar then picks among the offered names and fills the
arguments), and after the tool's result it answers in words. The chats stay
in every step of that phase, so what the first learned is kept. A long prompt
learned whole would cost seconds a step; only what follows it is learned,
from the prompt's keys and values (long_prompts.py). The build takes a few
minutes (torch on one thread).

Its window is a real one (32,768 positions) because clients send real
prompts: Open WebUI's default chat request carries some 26,000 characters of
tool definitions and asks for up to 1,000 tokens. So the tokenizer's
vocabulary (up to 8,192 tokens) is learned from more than the model's own
training text: vocabulary.txt, the project's documentation, gives it the
pieces of English and of JSON, about 3.4 characters a token on text it has
not seen where the corpus alone gave 2.5. Rotary positions need no training
to reach far: the model is trained on short windows and reads long prompts
with the same weights, and its answers there are no better than its size.
The training text uses only some 600 of those tokens: the rest share one
output row fitted after training to score low at every state the model
reaches (SharedUnusedLoss), so a sampled answer almost never wanders into
them, and the output embedding is untied from the input one for that.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import time

from service.chat_template import CHATML
from service.demo_model import agent_sessions
from service.demo_model.corpus import VOCABULARY_TEXT, answer_prompts, training_documents
from service.demo_model.unused_tokens import SharedUnusedLoss

MODEL_ID = "millm-tiny"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# A ceiling: the trainer stops earlier when its text has no pair left to
# merge (vocabulary.txt gives about 8,000); the real size is len(tokenizer).
VOCAB_SIZE = 8192
CONTEXT_WINDOW = 32768
SEED = 1234
TRAIN_STEPS = 400
LR = 5e-3
LR_DECAY = 0.8
TRAIN_BATCH = 16
TRAIN_SEQ = 96
# The unused tokens' shared output row is refitted (unused_tokens.py) to the
# states of the training text and of sampled answers this long.
SAMPLED_TOKENS = 48
# Tool conversations in every step: whole ones, and windows (see build_model).
TOOL_BATCH = 4
TOOL_WINDOWS = 2
TOOL_SEQ = 256
# The second phase, coding-agent sessions (agent_sessions.py): a short one
# in every step, learned whole, and a long one every LONG_EVERY steps, learned
# after its prompt (a 16k-token prompt learned whole costs 9 s a step).
AGENT_STEPS = 800
AGENT_LR = 3e-3
AGENT_LOSS_WEIGHT = 1.0
SHORT_PER_STEP = 1
LONG_EVERY = 1
RESTORE_STEPS = 100
RESTORE_LR = 1e-3
# The first tokens of each of its turns are where a session's model decides
# whether to call a tool or answer (`<tool_call>\n` is six tokens); each
# weighs as much as this many others.
DECISION_WEIGHT = 40.0
DECISION_TOKENS = 6
# Marker written last: a directory without it is an interrupted build.
METADATA_FILE = "millm_model.json"
# Bumped when the build's output changes, so an older build is rebuilt.
# 2: <|endoftext|> is an end token too (generation_config), as llama.cpp reads it.
# 3: the template renders tools, and the model is trained to call them.
# 4: a 32,768-token window, and a vocabulary learned from vocabulary.txt too.
# 5: untied output embedding (the unused tokens score low), the tools' system
#    turn masked out of the loss, 400 steps.
# 6: a second phase of coding-agent sessions (agent_sessions.py); a token the
#    model never writes reads as the mean used row in training too.
BUILD_VERSION = 6

def build_tokenizer(documents: list[str]):
    """A byte-level BPE learned from the training documents and from
    vocabulary.txt (the model is trained on the documents only)."""
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
    tok.train_from_iterator(plain + [agent_sessions.core_text(),
                                     VOCABULARY_TEXT.read_text(encoding="utf-8")],
                            trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    fast.model_max_length = CONTEXT_WINDOW
    return fast

def token_stream(tokenizer, documents: list[str], end_id: int):
    import torch

    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        ids.append(end_id)
    return torch.tensor(ids, dtype=torch.long)

def tools_offered_at(ids: list[int], turn_end: int, doc_end: int):
    """For each token of a stream of tool conversations, where its
    conversation starts and where its first turn (the tools' system turn)
    ends."""
    import torch

    starts, ends, doc_start = [], [], 0
    for i, token in enumerate(ids):
        if token == doc_end:
            first = ids.index(turn_end, doc_start, i + 1)
            starts.extend([doc_start] * (i + 1 - doc_start))
            ends.extend([first] * (i + 1 - doc_start))
            doc_start = i + 1
    return torch.tensor(starts), torch.tensor(ends)

def padded(sequences: list[list[int]], pad_id: int, prompts: list[int]) -> dict:
    """A batch padded on the right; the padding is masked out of attention
    and of the loss, and so is each sequence's first `prompts[i]` tokens."""
    import torch

    width = max(map(len, sequences))
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    learned = torch.tensor([[0] * p + [1] * (width - p) for p in prompts]) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(learned == 0, -100)}

def agent_examples(tokenizer, seed: int, count: int, chars: tuple[int, int]):
    """Agent sessions as (ids, labels, weights, avoid): only the assistant
    turns learned, the first tokens of each weighing DECISION_WEIGHT, and a
    turn that answers in words avoiding the token that opens a call."""
    import torch

    examples = []
    call_opens = tokenizer("<tool_call>", add_special_tokens=False)["input_ids"][0]
    for document in agent_sessions.sessions(count, seed, chars):
        encoded = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
        spans = agent_sessions.learned_spans(document)
        ids = torch.tensor(encoded["input_ids"])
        learned = torch.tensor([any(a <= start and end <= b for a, b in spans)
                                for start, end in encoded["offset_mapping"]])
        opening = torch.zeros_like(learned)
        for i in (learned & ~torch.cat([torch.tensor([False]), learned[:-1]])).nonzero():
            opening[i:i + DECISION_TOKENS] = True
        weights = torch.where(opening & learned, DECISION_WEIGHT, 1.0)
        # Where a turn opens with words, the token that opens a call is avoided.
        avoid = torch.full_like(ids, -100)
        for i in (learned & ~torch.cat([torch.tensor([False]), learned[:-1]])).nonzero():
            if int(ids[i]) != call_opens:
                avoid[i] = call_opens
        examples.append((ids, ids.masked_fill(~learned, -100), weights, avoid))
    return examples

def final_states(model, tokenizer, stream, conversations: list[list[int]], pad_id: int,
                 seed: int = SEED):
    """The model's final hidden states over its training text, and over an
    answer it samples to every question of the corpus (a generator of their
    own: the build stays deterministic)."""
    import torch

    texts = [stream[s : s + TRAIN_SEQ] for s in range(0, len(stream), TRAIN_SEQ)]
    texts += [torch.tensor(ids) for ids in conversations]
    torch.manual_seed(seed + 2)
    with torch.no_grad():
        for prompt in answer_prompts():
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=SAMPLED_TOKENS, pad_token_id=pad_id)
            texts.append(out[0])
        return torch.cat([model.model(input_ids=ids[None]).last_hidden_state[0]
                          for ids in texts])

def build_model(tokenizer, documents: list[str], tool_documents: list[str], seed: int = SEED):
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
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)

    # One long stream of the prose and chats, each ended by <|endoftext|>, cut
    # into windows (drawn by a generator of their own).
    stream = token_stream(tokenizer, documents, pad_id)
    generator = torch.Generator().manual_seed(seed)
    # The tool conversations: whole ones, from their start as a prompt is,
    # so that a call is learned with the tools' system turn at the start of
    # the context; and windows cut anywhere from a stream of them, so that it
    # does not depend on where the call falls. A window only trains on the
    # conversations whose system turn ends inside it: a call learned without
    # the tools in view would be made whether or not any tool is offered.
    conversations = [tokenizer(doc, add_special_tokens=False)["input_ids"] + [pad_id]
                     for doc in tool_documents]
    tool_stream = torch.tensor([token for ids in conversations for token in ids])
    conversation_at, offered = tools_offered_at(tool_stream.tolist(), eos_id, pad_id)
    prompts = [ids.index(eos_id) + 1 for ids in conversations]
    positions = torch.arange(len(tool_stream))
    agents = agent_examples(tokenizer, seed + 3, AGENT_STEPS * SHORT_PER_STEP,
                            agent_sessions.SHORT_FILLER_CHARS)
    long_agents = agent_examples(tokenizer, seed + 4, AGENT_STEPS // LONG_EVERY,
                                 agent_sessions.LONG_FILLER_CHARS)
    written = [int(t) for _, labels, *_ in agents + long_agents for t in labels[labels != -100]]
    lm_loss = SharedUnusedLoss(len(tokenizer), stream.tolist() + tool_stream.tolist() + written)
    tool_generator = torch.Generator().manual_seed(seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    # The rate falls linearly to 20% by the last step: the last steps settle
    # the weights instead of leaving them wherever the last batches pushed.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1 - step / TRAIN_STEPS * LR_DECAY)
    def chat_loss():
        starts = torch.randint(0, len(stream) - TRAIN_SEQ - 1, (TRAIN_BATCH,), generator=generator)
        batch = torch.stack([stream[s : s + TRAIN_SEQ] for s in starts.tolist()])
        loss = lm_loss(model, batch, batch)
        starts = torch.randint(0, len(tool_stream) - TOOL_SEQ - 1, (TOOL_WINDOWS,),
                               generator=tool_generator).tolist()
        batch = torch.stack([tool_stream[s : s + TOOL_SEQ] for s in starts])
        seen = torch.stack([(conversation_at[s : s + TOOL_SEQ] >= s)
                            & (positions[s : s + TOOL_SEQ] > offered[s : s + TOOL_SEQ])
                            for s in starts])
        loss = loss + lm_loss(model, batch, batch.masked_fill(~seen, -100))
        picks = torch.randint(0, len(conversations), (TOOL_BATCH,), generator=tool_generator)
        return loss + lm_loss(model, **padded([conversations[i] for i in picks.tolist()], pad_id,
                                              [prompts[i] for i in picks.tolist()]))

    def agent_loss(step):
        loss = 0
        for ids, labels, weights, avoid in agents[step * SHORT_PER_STEP:
                                                  (step + 1) * SHORT_PER_STEP]:
            loss = loss + lm_loss(model, ids[None], labels[None], weights=weights[None],
                                  avoid=avoid[None])
        if step % LONG_EVERY == 0:
            ids, labels, weights, avoid = long_agents[step // LONG_EVERY % len(long_agents)]
            loss = loss + lm_loss.after_prompt(model, ids, labels, weights, avoid)
        return loss * AGENT_LOSS_WEIGHT

    def train(steps, optimizer, schedule, with_agents):
        for step in range(steps):
            loss = chat_loss() + (agent_loss(step) if with_agents else 0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        return loss

    model.train()
    train(TRAIN_STEPS, optimizer, schedule, False)
    # Then the agent sessions, with the chats still in every step so that
    # what the first phase learned is kept.
    optimizer = torch.optim.AdamW(model.parameters(), lr=AGENT_LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1 - step / AGENT_STEPS * LR_DECAY)
    loss = train(AGENT_STEPS, optimizer, schedule, True)
    if RESTORE_STEPS:
        # A few steps of chats alone at a low rate settle what the sessions
        # moved in the chats' answers.
        optimizer = torch.optim.AdamW(model.parameters(), lr=RESTORE_LR, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        loss = train(RESTORE_STEPS, optimizer, schedule, False)
    model.eval()
    lm_loss.untie(model)
    lm_loss.push_down_unused(model, final_states(model, tokenizer, stream, conversations, pad_id,
                                                            seed))
    # Training ends every document with <|endoftext|>, and llama.cpp stops on
    # it by name in any GGUF file, so it ends a generation here too: raw
    # completions stop where the model ends its text, on both engines.
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id],
                                               pad_token_id=pad_id)
    # The last step's loss, prose and chats plus tool conversations.
    return model, float(loss.detach())

def weights_revision(model_dir: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]

def build(models_dir: pathlib.Path, seed: int = SEED) -> pathlib.Path:
    """Train millm-tiny under models_dir (a staging directory moved in
    whole). Another seed gives another model, for checking that the tests
    hold for more than one build."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    target = models_dir / MODEL_ID
    staging = models_dir / f".{MODEL_ID}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    documents, tool_documents = training_documents()
    tokenizer = build_tokenizer(documents + tool_documents)
    model, final_loss = build_model(tokenizer, documents, tool_documents, seed)
    tokenizer.save_pretrained(staging)
    model.save_pretrained(staging)
    metadata = {
        "id": MODEL_ID,
        "owned_by": "millm",
        "revision": weights_revision(staging),
        "created": int(time.time()),
        "final_training_loss": round(final_loss, 4),
        "build": BUILD_VERSION,
        "seed": seed,
    }
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target
