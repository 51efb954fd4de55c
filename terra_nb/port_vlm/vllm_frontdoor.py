"""The check vLLM's multimodal path cannot make: `<image>` tokens that no image fills.

vLLM runs the multimodal processor only for requests that carry `multi_modal_data`. A prompt with
`<image>` in its text but no images goes straight to the engine, and the `<image>` token is
embedded as an ordinary word: a plausible answer to the wrong question. Likewise a prompt with more
`<image>` tokens than images: the processor expands one token per image and leaves the rest as
words. (Fewer `<image>` tokens than images is caught by the processor, `_validate_mm_placeholders`.)

`install()` (called by the plugin in every vLLM process) wraps `InputProcessor.process_inputs`,
the method every request passes on its way to the engine core, as Terra's front door does; for
TinyVLM engines it counts the `<image>` tokens of the finished request that lie outside the
images' placeholder ranges. Any is a `RequestValidationError` (a `ValueError`) naming the counts,
raised before the engine core sees the request, so the engine keeps serving.

vLLM runs the plugin in every process of every engine, whatever its model, and does not catch what
it raises; so `install()` wraps through `vllm_patch.wrap`: where a vLLM release renamed or removed
`process_inputs` (or changed its leading parameters) it wraps nothing, raises nothing and logs a
warning naming the method. Other models' engines start; TinyVLM's does not, since its check could
not run: building its processor (vLLM does it in the front end, before the engine core) raises
`require_door`'s `RuntimeError`.
"""
from __future__ import annotations

import numpy as np

from .config import IMAGE_TOKEN, TinyVLMConfig
from .vllm_patch import PROCESS_INPUTS, RequestValidationError, skipped, wrap, wrapped_by

_MARK = "_tiny_vlm_front_door"


def image_token_id_of(model_config) -> int | None:
    """The `<image>` id of a TinyVLM engine's model; None for any other model."""
    cfg = getattr(model_config, "hf_config", None)
    return cfg.image_token_id if isinstance(cfg, TinyVLMConfig) else None


def check_image_tokens(prompt_token_ids, mm_features, image_token_id: int) -> None:
    """Every `<image>` token of the processed prompt must lie in some image's placeholder range."""
    ids = np.asarray(prompt_token_ids if prompt_token_ids is not None else [], dtype=np.int64)
    n_tokens = int((ids == image_token_id).sum())
    ranges = [f.mm_position for f in (mm_features or []) if f.modality == "image"]
    leftover = n_tokens - sum(r.length for r in ranges)
    if leftover <= 0:
        return
    if not ranges:
        raise RequestValidationError(
            f"the prompt has {leftover} {IMAGE_TOKEN} token(s) but the request carries no image; pass "
            f"multi_modal_data={{'image': [...]}} with one image per {IMAGE_TOKEN}, or drop the token(s)",
            parameter="multi_modal_data",
        )
    raise RequestValidationError(
        f"the prompt has {len(ranges) + leftover} {IMAGE_TOKEN} tokens but {len(ranges)} image(s) were "
        f"given; put one {IMAGE_TOKEN} in the text per image",
        parameter="multi_modal_data",
    )


def installed() -> bool:
    return wrapped_by(_MARK) > 0


def require_door() -> None:
    """Refuse (`RuntimeError`) where `install()` found no `process_inputs` to wrap in this process
    (where it never ran, e.g. a processor built by hand, there is nothing to say)."""
    why = skipped(PROCESS_INPUTS)
    if why is not None:
        raise RuntimeError(
            f"no TinyVLM engine on this vLLM: its front door is not installed ({why}), so {IMAGE_TOKEN} tokens "
            f"that no image fills would be served as words. Use vLLM 0.26 or 0.32, or point "
            f"{__package__}.vllm_patch.PROCESS_INPUTS at the method every request passes in this release.")


def _checked(process_inputs):
    def checked_process_inputs(self, *args, **kwargs):
        request = process_inputs(self, *args, **kwargs)
        if _MARK not in self.__dict__:
            self.__dict__[_MARK] = image_token_id_of(self.model_config)
        image_token_id = self.__dict__[_MARK]
        if image_token_id is not None:
            check_image_tokens(request.prompt_token_ids, request.mm_features, image_token_id)
        return request

    return checked_process_inputs


def install() -> None:
    """Wrap `InputProcessor.process_inputs` once per process (idempotent; other models pass).
    Never raises: where this vLLM lacks the method it is logged and skipped (see the docstring)."""
    wrap(PROCESS_INPUTS, _MARK, _checked, f"TinyVLM's {IMAGE_TOKEN}-token check: TinyVLM engines will refuse to start")
