"""`LLM.chat` tokenizes the rendered conversation without special tokens, on every vLLM release.

The checkpoint's chat template writes the `<s>` (as released Llama-style templates do, and as HF
expects: `apply_chat_template` text is tokenized with `add_special_tokens=False`). vLLM's server
tokenizes a chat that way on every release (`ChatCompletionRequest.add_special_tokens` defaults to
False). `LLM.chat` does from vLLM 0.32 on; vLLM 0.26's `LLM._preprocess_chat` tokenizes it with the
multimodal processor's defaults (`info.get_default_tok_params()`: `add_special_tokens=True`), so the
tokenizer adds a second `<s>` to the template's: prompt ids `[1, 1, ...]`, where HF has `[1, ...]`.

`install()` (called by the plugin in every vLLM process) wraps `LLM._preprocess_chat` so that for
this port's models the default is vLLM 0.32's: `tokenization_kwargs` gets `add_special_tokens=False`
unless the caller passes its own. On 0.32 that is what vLLM does already. Other models pass
untouched. A model's own `get_default_tok_params` cannot do it: on 0.26 the same parameters
tokenize plain text prompts, which need the tokenizer's `<s>`.

Like every wrapper of the ports, it goes through `vllm_patch.wrap`: where a release renamed the
method (or changed its parameters) nothing is wrapped or raised, and a warning names it.
"""
from __future__ import annotations

import inspect

from .vllm_patch import CHAT_RENDERING, wrap

_MARK = f"_{__package__.replace('.', '_')}_chat_tokenization"


def is_this_ports_model(model_config) -> bool:
    """Whether the engine's model is this port's (its HF config class comes from this package)."""
    module = type(getattr(model_config, "hf_config", None)).__module__
    return module == __package__ or module.startswith(__package__ + ".")


def _chat_without_special_tokens(preprocess_chat):
    signature = inspect.signature(preprocess_chat)

    def preprocess_chat_as_served(self, *args, **kwargs):
        if not is_this_ports_model(self.model_config):
            return preprocess_chat(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments.get("tokenization_kwargs") or {}
        bound.arguments["tokenization_kwargs"] = {"add_special_tokens": False, **given}
        return preprocess_chat(*bound.args, **bound.kwargs)

    return preprocess_chat_as_served


def install() -> None:
    """Wrap `LLM._preprocess_chat` once per process (idempotent). Never raises (see the docstring)."""
    wrap(CHAT_RENDERING, _MARK, _chat_without_special_tokens,
         f"{__package__}'s chat tokenization: LLM.chat on vLLM before 0.32 gives a chat prompt a second <s>")
