"""The demo model's loss over a vocabulary its training text mostly never uses.

The tokenizer learns about 8,000 tokens from the project's docs, and the
model's training text uses some 600 of them. SharedUnusedLoss trains the rest
as one shared output row (exact and cheap), then unties the output embedding
and refits that row after training so the unused tokens score low at every
state the model reaches (build.build_model calls it in that order).
"""

from __future__ import annotations

import math

# The unused tokens' shared output row: fitted for this many steps after
# training, its norm at most this many times a used row's (push_down_unused).
UNUSED_STEPS = 300
UNUSED_NORM = 4.0


class SharedUnusedLoss:
    """The next-token loss over the whole vocabulary, with every token the
    training text never uses sharing one embedding.

    The text uses about 600 of the 8,000 tokens. The others still have to be
    pushed down, or their summed probability crowds into sampled answers; but
    a softmax over all of them at every position would make the build several
    times slower. Tied to one vector, the unused tokens' part of the softmax
    is one logit plus log(count), exact and as cheap as one more token. The
    vector is copied into every unused row when training ends (build_model),
    so the saved model computes the same distribution the loss trained."""

    def __init__(self, vocab_size: int, used: list[int]):
        import torch

        self.used = torch.tensor(sorted(set(used)))
        unused = sorted(set(range(vocab_size)) - set(self.used.tolist()))
        self.unused = torch.tensor(unused)
        self.index = torch.full((vocab_size,), -1, dtype=torch.long)
        self.index[self.used] = torch.arange(len(self.used))
        self.log_unused = math.log(max(1, len(unused)))
        self.is_unused = torch.ones(vocab_size, dtype=torch.bool)
        self.is_unused[self.used] = False

    def embed(self, model, input_ids):
        """A token the model never writes reads as the mean of the used rows,
        as untie() leaves it: the agent sessions' filler is read that way in
        training and in a real prompt alike."""
        import torch

        weight = model.get_input_embeddings().weight
        embeds = weight[input_ids]
        unread = self.is_unused[input_ids]
        if bool(unread.any()):
            embeds = torch.where(unread[..., None], weight[self.used].mean(dim=0), embeds)
        return embeds

    def after_prompt(self, model, ids, labels, weights=None, avoid=None):
        """The loss of one sequence whose first learned token comes after a
        long prompt: the prompt's keys and values are computed without the
        gradient of its inner attention (long_prompts.py), which is what
        would make it costly."""
        from service.demo_model.long_prompts import prefix_cache

        first = int((labels != -100).nonzero()[0]) - 1
        cache = prefix_cache(model, self.embed(model, ids[None, :first]))
        return self(model, ids[None, first:], labels[None, first:], past_key_values=cache,
                    weights=None if weights is None else weights[None, first:],
                    avoid=None if avoid is None else avoid[None, first:])

    def __call__(self, model, input_ids, labels, attention_mask=None, past_key_values=None,
                 weights=None, avoid=None):
        """The mean next-token loss over the labelled tokens, or their
        weighted mean with `weights` (one per label). `avoid` (one per label,
        -100 for none) names a token that position must not write: its
        -log(1 - p) is added with that position's weight (where an agent
        session answers, the token that would open a call)."""
        import torch
        import torch.nn.functional as F

        hidden = model.model(inputs_embeds=self.embed(model, input_ids),
                             attention_mask=attention_mask,
                             past_key_values=past_key_values).last_hidden_state
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        y = labels[:, 1:].reshape(-1)
        w = None if weights is None else weights[:, 1:].reshape(-1)[y != -100]
        a = None if avoid is None else avoid[:, 1:].reshape(-1)[y != -100]
        h, y = h[y != -100], y[y != -100]
        if not len(y):  # a window with nothing to learn (build_model masks)
            return hidden.sum() * 0
        weight = model.lm_head.weight
        logits = h @ weight[self.used].T
        if len(self.unused):
            shared = h @ weight[self.unused[0]] + self.log_unused
            logits = torch.cat([logits, shared[:, None]], dim=1)
        if w is None:
            return F.cross_entropy(logits, self.index[y])
        loss = (F.cross_entropy(logits, self.index[y], reduction="none") * w).sum()
        if a is not None and bool((a != -100).any()):
            at = (a != -100).nonzero()[:, 0]
            p = logits[at].softmax(-1).gather(1, self.index[a[at]][:, None])[:, 0]
            loss = loss - ((1 - p).clamp_min(1e-6).log() * w[at]).sum()
        return loss / w.sum()

    def untie(self, model) -> None:
        """Unties the output embedding from the input one. On the output
        side every unused row becomes the shared one; on the input side, the
        mean of the used rows. Tied, the shared vector would also be what an
        unused token reads as, and a state read from it points along it: one
        unused token sampled would make the next one likely, and an answer
        would drift off into the documentation's words. Read as an average
        token instead, it leads nowhere in particular."""
        import torch

        with torch.no_grad():
            weight = model.get_input_embeddings().weight
            output = weight.detach().clone()
            if len(self.unused):
                output[self.unused] = weight[self.unused[0]]
                weight[self.unused] = weight[self.used].mean(dim=0)
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(output)

    def push_down_unused(self, model, hidden) -> None:
        """Refits the unused tokens' shared output row, the model fixed, to
        keep their summed probability near zero at every final hidden state
        in `hidden` (the model's own, over its training text and over answers
        it samples). Training pushes the shared logit down only as far as the
        cross entropy needs, and states the training text never led to (a
        sampled answer wandering) could still give the ~7,400 unused tokens
        together a few percent of the mass. The row's norm is held to a few
        times a used row's."""
        import torch
        import torch.nn.functional as F

        if not len(self.unused):
            return
        output = model.lm_head.weight
        with torch.no_grad():
            rest = torch.logsumexp(hidden @ output[self.used].T, dim=1)
            limit = UNUSED_NORM * float(output[self.used].norm(dim=1).mean())
        shared = output[self.unused[0]].detach().clone().requires_grad_(True)
        optimizer = torch.optim.Adam([shared], lr=0.05)
        for _ in range(UNUSED_STEPS):
            # -log P(not an unused token), at the worst states most: a soft
            # maximum over the states, not a mean that a few could hide in.
            loss = torch.logsumexp(F.softplus(hidden @ shared + self.log_unused - rest)
                                   * len(hidden), dim=0) / len(hidden)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                shared.mul_(min(1.0, limit / float(shared.norm())))
        with torch.no_grad():
            output[self.unused] = shared.detach()
