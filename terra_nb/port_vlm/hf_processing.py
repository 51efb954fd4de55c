"""TinyVLM's tokenizer and HF processor: text with `<image>` + images -> model inputs.

The processor does what every HF vision-language processor does:

* takes PIL images or float tensors / numpy arrays `[3, H, W]`, one or a list, of any size, and
  resizes each to fit the encoder (`ImageGeometry.resized`: at most `max_image_side` a side, each
  side a multiple of the patch size), as real processors resize or tile a photo;
* cuts each image into patches: `pixel_values` is all images' patches, concatenated
  (`[sum of patches, 3 * patch * patch]`), and `image_grid_hw` says how many rows and columns of
  patches each image has (`[n_images, 2]`);
* given text, expands each `<image>` to as many `<image>` tokens as its image has patches, then
  tokenizes (`input_ids` starts with `<s>`).

The tokenizer carries the chat template (`CHAT_TEMPLATE`, saved in `tokenizer_config.json` as
released models ship it), so `LLM.chat` and `vllm serve` need no `chat_template` argument: a
message's image parts become `<image>` where the user put them, its text parts the text.

vLLM calls it too: on 0.32 with the images only (vLLM tokenizes the text and expands `<image>`
itself, from `_get_prompt_updates`). vLLM 0.26 passes a text prompt's text as well (vLLM then finds
the expanded tokens instead of inserting them), and for a prompt of token ids it calls
`processor.image_processor(images=...)` alone, as for HF's processors that hold an image processor:
without that attribute 0.26 gets no image fields at all ("Expected there to be 2 image items ...
but only found 0").
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import BatchFeature, PreTrainedTokenizerFast, ProcessorMixin

from .config import IMAGE_TOKEN, ImageGeometry, check_image

# The rendered text starts with `<s>` (chat front ends, vLLM's and HF's `apply_chat_template`, then
# tokenize it with `add_special_tokens=False`). vLLM sees the template loop over a message's content
# parts, so it passes them OpenAI-style ({"type": "image"}, {"type": "text", "text": ...}), as for
# Qwen2-VL's or LLaVA's templates; a message whose content is a plain string is copied as it is.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}" + IMAGE_TOKEN + " "
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} "
    "{% endfor %}"
)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", IMAGE_TOKEN)  # ids 0..4
WORDS = (
    "a the of and to in is it on with this that what picture image photo describe show see colour "
    "red green blue left right top bottom big small one two car road sky tree house dog cat person "
    "light dark near far here there how many which where why yes no"
).split()


def build_tokenizer(vocab_size: int = 256) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built locally with `tokenizers` (no download): the special tokens,
    a few English words, then `w<i>` fillers up to `vocab_size`. Prompts get a leading `<s>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = list(SPECIAL_TOKENS) + WORDS
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # so "<image>" is one token even glued to a word
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        extra_special_tokens={"image_token": IMAGE_TOKEN}, chat_template=CHAT_TEMPLATE,
    )


def patchify(image: torch.Tensor, patch: int) -> torch.Tensor:
    """`[3, H, W]` -> `[H/p * W/p, 3*p*p]`, patches in row-major order."""
    c, h, w = image.shape
    x = image.reshape(c, h // patch, patch, w // patch, patch)
    return x.permute(1, 3, 0, 2, 4).reshape((h // patch) * (w // patch), c * patch * patch)


class TinyVLMProcessor(ProcessorMixin):
    """Tokenizer + patching; `processor(text=..., images=[...])` like any HF processor."""

    def __init__(self, tokenizer=None, patch_size: int = 8, max_image_side: int = 32, **kwargs):
        self.patch_size = patch_size
        self.max_image_side = max_image_side
        self.image_token = IMAGE_TOKEN
        super().__init__(tokenizer, **kwargs)
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)

    @property
    def geometry(self) -> ImageGeometry:
        return ImageGeometry(self.patch_size, self.max_image_side)

    @property
    def image_processor(self) -> "TinyVLMImageProcessor":
        """The images-only half, under the name HF processors give it."""
        return TinyVLMImageProcessor(self)

    def process_images(self, images: Sequence[object]) -> dict[str, torch.Tensor]:
        checked = [check_image(img, self.geometry, i) for i, img in enumerate(images)]  # resized
        patches = [patchify(img, self.patch_size) for img in checked]
        grids = [self.geometry.grid(img.shape[1], img.shape[2]) for img in checked]
        return {
            "pixel_values": torch.cat(patches) if patches else torch.zeros(0, 3 * self.patch_size**2),
            "image_grid_hw": torch.tensor(grids, dtype=torch.long).reshape(-1, 2),
        }

    def expand_image_tokens(self, text: str, grids: torch.Tensor) -> str:
        """Each `<image>` -> one `<image>` per patch of its image; counts must agree."""
        parts = text.split(IMAGE_TOKEN)
        if len(parts) - 1 != len(grids):
            raise ValueError(
                f"the text has {len(parts) - 1} {IMAGE_TOKEN} tokens but {len(grids)} images were given"
            )
        out = parts[0]
        for (rows, cols), part in zip(grids.tolist(), parts[1:]):
            out += IMAGE_TOKEN * (rows * cols) + part
        return out

    def __call__(self, text: str | Sequence[str] | None = None, images: Sequence[object] | None = None,
                 add_special_tokens: bool = True, **kwargs) -> BatchFeature:
        """`images`: PIL images or float `[3, H, W]`, one or a list, of any size. `add_special_tokens`:
        the tokenizer's (False for text a chat template rendered: it starts with `<s>` already)."""
        images = _as_list(images)
        data: dict[str, object] = self.process_images(images) if images else {}
        if text is not None:
            texts = [text] if isinstance(text, str) else list(text)
            if len(texts) != 1:
                raise ValueError("TinyVLMProcessor takes one text at a time")
            # With images, each `<image>` becomes its patches; text alone is tokenized as written, as
            # HF's LLaVA processor does (vLLM 0.26 asks so for a text prompt whose images all come
            # from its cache, and expands the tokens itself; the HF model refuses `<image>` tokens
            # without pixel_values).
            expanded = self.expand_image_tokens(texts[0], data["image_grid_hw"]) if images else texts[0]
            ids = self.tokenizer(expanded, return_tensors="pt", add_special_tokens=add_special_tokens)
            data.update(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"])
        return BatchFeature(data)


class TinyVLMImageProcessor:
    """`processor.image_processor(images=[...])`: `pixel_values` and `image_grid_hw` alone."""

    def __init__(self, processor: TinyVLMProcessor):
        self.processor = processor

    def __call__(self, images=None, **kwargs) -> BatchFeature:
        return BatchFeature(self.processor.process_images(_as_list(images) or []))


def _as_list(images) -> list | None:
    if images is None or isinstance(images, list):
        return images
    return list(images) if isinstance(images, tuple) else [images]
