"""The GGUF engine reading its model without generating: prompt logits for
scoring and echo, and mean-pooled embeddings. Runs on the engine's model
thread only (llama.cpp contexts are not thread-safe).

Each read has a context of its own, made on first use and sharing the
memory-mapped weights with the generation context:

- the *scoring* context keeps every position's logits (logits_all) and an f32
  KV cache, so log-probabilities are not moved by f16 rounding; every scored
  prompt is evaluated from an empty cache. It has the steering callback
  (engines/gguf/steering.py): scoring reads activations unsteered, and an
  echo's prompt log-probabilities are read under its completion's steering,
  as on the transformers engine;
- the *embedding* context mean-pools the last layer (as the transformers
  engine does), also with an f32 KV cache; one input per pass, so a vector
  never depends on its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# llama.cpp's GGML_TYPE_F32: the reading contexts' KV cache type.
GGML_TYPE_F32 = 0


class Readers:
    def __init__(self, open_context: Callable, context_window: int, embedding_window: int,
                 steerer=None, token_bytes: list[bytes] | None = None):
        self._open, self._window = open_context, context_window
        self._token_bytes = token_bytes or []
        self._steerer, self._steer = steerer, None
        self._embed_window = embedding_window  # capped: its scratch grows with its square
        self._scorer = None
        self._embedder = None

    def prompt_logits(self, ids: list[int], plan=None, recorder=None,
                      generated_from: int | None = None) -> np.ndarray:
        """Logits after each prompt position ([len(ids), vocab]): row p is the
        prediction of token p + 1, made before seeing it. Steered by `plan`
        when given, its conditions holding where they held as ids from
        `generated_from` on were generated (steering/conditions.py Replayed);
        `recorder` reads activations on the way."""
        if self._scorer is None:
            # llama.cpp's default f16 cache moves log-probabilities by up to ~5e-3.
            self._scorer = self._open(n_ctx=self._window, n_batch=min(512, self._window),
                                      logits_all=True, type_k=GGML_TYPE_F32,
                                      type_v=GGML_TYPE_F32)
            if self._steerer is not None:
                self._hook_scorer()
        scorer = self._scorer
        scorer.reset()
        scorer._ctx.kv_cache_clear()
        if self._steer is None or (plan is None and recorder is None):
            scorer.eval(ids)
        else:
            from service.engines.gguf.steering import BatchPart, RowSteering
            from service.steering.conditions import Replayed

            row = RowSteering(plan, recorder, None, len(ids), self._steerer.num_layers - 1)
            if plan is not None and plan.conditional:
                row.conditions = Replayed(plan.conditions, [self._token_bytes[t] for t in ids],
                                          len(ids) if generated_from is None
                                          else generated_from)
            for start in range(0, len(ids), scorer.n_batch):  # one decode per chunk
                chunk = ids[start:start + scorer.n_batch]
                self._steer.prepare([BatchPart(row, 0, len(chunk), start, chunk)], len(chunk),
                                    [True] * len(chunk))
                try:
                    scorer.eval(chunk)
                finally:
                    errors = self._steer.collect()
                if errors:
                    raise RuntimeError("the steering callback met an unexpected tensor layout")
        return np.array(scorer.scores[: len(ids)], dtype=np.float32)

    def _hook_scorer(self) -> None:
        """Reopen the scoring context with the steering callback (llama-cpp-
        python opens its own without one)."""
        from llama_cpp import llama_cpp as lib
        from llama_cpp._internals import LlamaContext

        scorer = self._scorer
        params = lib.llama_context_params.from_buffer_copy(scorer.context_params)
        self._steer = self._steerer.hook(params, scorer.n_batch)
        scorer._ctx.close()
        scorer._ctx = LlamaContext(model=scorer._model, params=params, verbose=False)

    def embed_chunks(self, inputs: list[list[int]]):
        """One mean-pooled last-layer vector per tokenized input; a generator
        that yields after each input (a chunk, engines/model_thread.py) and
        returns the vectors."""
        from llama_cpp import llama_cpp as lib

        if self._embedder is None:
            # A whole input fits one micro-batch; f16 KV would move the vectors by ~3e-4.
            window = self._embed_window
            self._embedder = self._open(n_ctx=window, n_batch=window, n_ubatch=window,
                                        embedding=True, type_k=GGML_TYPE_F32,
                                        type_v=GGML_TYPE_F32,
                                        pooling_type=lib.LLAMA_POOLING_TYPE_MEAN)
        embedder = self._embedder
        width = embedder.n_embd()
        vectors = []
        for ids in inputs:
            embedder._batch.reset()
            embedder._ctx.kv_cache_clear()
            embedder._batch.add_sequence(ids, 0, True)
            embedder._ctx.decode(embedder._batch)
            pooled = lib.llama_get_embeddings_seq(embedder._ctx.ctx, 0)
            vectors.append([float(x) for x in pooled[:width]])
            yield
        embedder._batch.reset()
        embedder._ctx.kv_cache_clear()
        return vectors

    def close(self) -> None:
        for llm in (self._scorer, self._embedder):
            if llm is not None:
                llm.close()
        self._scorer = self._embedder = None
