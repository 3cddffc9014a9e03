"""The GGUF engine's vocabulary and chat template: what a request's text
becomes in tokens and what tokens become in text.

A mixin of GgufEngine (engines/gguf/engine.py), which opens the model and
calls read_vocab once at load. Text is made from llama.cpp's own token pieces
(token_piece), with control tokens left out of generated text but named by
their text in log-probabilities, as the transformers engine does. Chats are
rendered with the file's Jinja template through llama-cpp-python's formatter,
as its own server renders them (ChatML when the file has none).
"""

from __future__ import annotations

from service import formats
from service.chat_template import CHATML, render_folding_system
from service.engines.scores import TokenTable
from service.errors import invalid_parameter
from service.text_output import control_char_ids


def token_piece(vocab, token: int, special: bool) -> bytes:
    """A token's bytes. (llama-cpp-python's own token_to_piece returns its
    whole 32-byte buffer, NUL padding included.)"""
    import ctypes

    from llama_cpp import llama_cpp as lib

    size = 64
    while True:
        buffer = ctypes.create_string_buffer(size)
        n = lib.llama_token_to_piece(vocab, token, buffer, size, 0, special)
        if n >= 0:
            return buffer.raw[:n]
        size = -n  # too small: llama.cpp says how much it needs


class GgufVocab:
    """Tokenization and templates over the opened llama.cpp model (self.llm)."""

    def read_vocab(self, llm) -> int:
        """The vocabulary's pieces, end-of-generation and control tokens, the
        chat template and its formatters, from the opened model; its size."""
        from llama_cpp import llama_cpp as lib
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        vocab = llm._model.vocab
        n_vocab = llm.n_vocab()
        self._token_bytes = [token_piece(vocab, i, special=False) for i in range(n_vocab)]
        self._control_char_ids = control_char_ids(self._token_bytes)
        self._eog = frozenset(i for i in range(n_vocab) if lib.llama_vocab_is_eog(vocab, i))
        self._control = frozenset(i for i in range(n_vocab)
                                  if lib.llama_vocab_is_control(vocab, i))
        # Log-probabilities name a special token by its text, as the
        # transformers engine does (its table is decode(skip_special_tokens=
        # False)'s); generated text leaves it out (_token_bytes).
        self._tokens = TokenTable(n_vocab, [
            token_piece(vocab, i, special=True) if i in self._control else piece
            for i, piece in enumerate(self._token_bytes)])
        self._special_tokens = tuple(sorted({
            token_piece(vocab, i, special=True).decode("utf-8", errors="replace")
            for i in self._control} - {""}))
        template = llm.metadata.get("tokenizer.chat_template")
        self._template_from_file = bool(template)
        self._template = template or CHATML
        self._allow_markup(vocab)
        # A file may have no BOS (or EOS): llama.cpp says -1, and the template gets "".
        eos, bos = (token_piece(vocab, i, special=True).decode("utf-8", "replace")
                    if 0 <= i < n_vocab else "" for i in (llm.token_eos(), llm.token_bos()))
        # llama-cpp-python's Jinja formatter, as its own server uses it.
        self._formatter = Jinja2ChatFormatter(template or CHATML, eos_token=eos, bos_token=bos,
                                              add_generation_prompt=True)
        # POST /tokenize with add_generation_prompt false.
        self._closed_formatter = Jinja2ChatFormatter(template or CHATML, eos_token=eos,
                                                     bos_token=bos, add_generation_prompt=False)
        return n_vocab

    def _allow_markup(self, vocab) -> None:
        """Control tokens of the model's own call and reasoning markup
        (service/formats: its `[TOOL_CALLS]`, `<|channel|>`) are generated and
        shown as their text, for the grammar and the parsers; every other
        control token stays banned and unseen."""
        fmt = formats.resolve(self._template, self._special_tokens,
                              dict(self.entry.format_settings))
        for i in sorted(self._control):
            piece = token_piece(vocab, i, special=True)
            if fmt.writes(piece.decode("utf-8", errors="replace")):
                self._token_bytes[i] = piece
                self._control = self._control - {i}

    @property
    def special_tokens(self) -> tuple[str, ...]:
        return self._special_tokens

    @property
    def has_chat_template(self) -> bool:
        return self._template_from_file

    @property
    def chat_template(self) -> str:
        return self._template

    def encode_chat(self, messages: list[dict], partial: str | None = None,
                    tools: list[dict] | None = None, template_kwargs: dict | None = None,
                    *, generation_prompt: bool = True, add_special: bool = False) -> list[int]:
        from jinja2 import TemplateError

        formatter = self._formatter if generation_prompt else self._closed_formatter
        try:
            rendered = render_folding_system(
                lambda turns: formatter(messages=turns, tools=tools,
                                        **(template_kwargs or {})).prompt, messages)
        except TemplateError as exc:
            raise invalid_parameter("messages", f"The chat template refused the "
                                    f"conversation: {exc}") from None
        # The rendered template holds any BOS it wants; its markers are special
        # tokens (message text cannot spell them: check_no_special_tokens).
        add_bos = add_special and self.llm._model.add_bos_token()
        return self.llm.tokenize((rendered + (partial or "")).encode(), add_bos=add_bos,
                                 special=True)

    def encode_text(self, text: str, parse_special: bool = False,
                    add_special: bool = True) -> list[int]:
        add_bos = add_special and self.llm._model.add_bos_token()
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=parse_special)

    def decode(self, ids: list[int]) -> str:
        return b"".join(self._token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def detokenize(self, ids: list[int]) -> str:
        # The log-probabilities' table: control tokens by their text.
        return b"".join(self._tokens.bytes_of(i) for i in ids).decode("utf-8", errors="replace")

    def token_strings(self, ids: list[int]) -> list[str]:
        from llama_cpp import llama_cpp as lib

        vocab = self.llm._model.vocab
        return [(lib.llama_vocab_get_text(vocab, i) or b"").decode("utf-8", errors="replace")
                for i in ids]
