"""TinyAV's tokenizer and HF processor, which needs the text.

`TinyAVProcessor(text=..., images=[...], audio=[...])`. The tokenizer carries the chat template
(`CHAT_TEMPLATE`, in `tokenizer_config.json`), so `LLM.chat` and `vllm serve` need no argument.

* **text is required**: the processor is where each `<image>` and `<audio>` of the text becomes its
  run of placeholders (4 per image; one per frame of each clip), so called without text it raises,
  as many HF processors of audio and video models do;
* for each modality it is given data for, the text must hold one placeholder per item (else a
  `ValueError` naming both counts); the placeholders of a modality it is given no data for are left
  as they are (vLLM calls it that way when the items of that modality come already processed);
* takes what vLLM's users send: PIL images or float `[3, H, W]` of any size (resized to the fixed
  input), audio as 1-D float clips or `(samples, sampling_rate)` tuples at 16 kHz, one or in a list;
* outputs `input_ids`, `pixel_values` `[n_images, 4, 3*p*p]`, `audio_frames` (all clips' frames,
  concatenated, `[sum of frames, frame_size]`) and `audio_num_frames` `[n_clips]`.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import BatchFeature, PreTrainedTokenizerFast, ProcessorMixin

from .config import AUDIO_TOKEN, IMAGE_TOKEN, ItemSizes, audio_list, check_audio, check_image, image_list

# The rendered text starts with `<s>` (chat front ends, vLLM's and HF's `apply_chat_template`, then
# tokenize it with `add_special_tokens=False`). vLLM sees the template loop over a message's content
# parts and passes them OpenAI-style ({"type": "image"}, {"type": "audio"}, {"type": "text", ...});
# a plain string is copied.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}" + IMAGE_TOKEN + " "
    "{% elif part['type'] in ('audio', 'audio_url', 'input_audio') %}" + AUDIO_TOKEN + " "
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} "
    "{% endfor %}"
)

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", IMAGE_TOKEN, AUDIO_TOKEN)  # ids 0..5
WORDS = (
    "a the of and to in is it on with this that what picture image sound clip listen describe show "
    "see hear red green blue loud quiet music voice bird car dog cat one two yes no how which where"
).split()


def build_tokenizer(vocab_size: int = 256) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built locally (no download): the special tokens, a few words, then
    `w<i>` fillers up to `vocab_size`. Prompts get a leading `<s>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = list(SPECIAL_TOKENS) + WORDS
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        extra_special_tokens={"image_token": IMAGE_TOKEN, "audio_token": AUDIO_TOKEN}, chat_template=CHAT_TEMPLATE,
    )


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """`[n, 3, S, S]` -> `[n, (S/p)**2, 3*p*p]`, patches in row-major order."""
    n, c, s, _ = images.shape
    x = images.reshape(n, c, s // patch, patch, s // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(n, (s // patch) ** 2, c * patch * patch)


def frames(clip: torch.Tensor, frame_size: int) -> torch.Tensor:
    """`[samples]` -> `[ceil(samples / frame_size), frame_size]`, the last frame padded with zeros."""
    pad = (-clip.numel()) % frame_size
    return torch.nn.functional.pad(clip, (0, pad)).reshape(-1, frame_size)


class TinyAVProcessor(ProcessorMixin):
    """Tokenizer + patching + framing; `processor(text=..., images=[...], audio=[...])`."""

    def __init__(self, tokenizer=None, image_size: int = 16, patch_size: int = 8, frame_size: int = 16,
                 sampling_rate: int = 16000, **kwargs):
        self.image_size, self.patch_size, self.frame_size = image_size, patch_size, frame_size
        self.sampling_rate = sampling_rate
        super().__init__(tokenizer, **kwargs)

    @property
    def sizes(self) -> ItemSizes:
        return ItemSizes(self.image_size, self.patch_size, self.frame_size, self.sampling_rate)

    def process_images(self, images: Sequence[object]) -> dict[str, torch.Tensor]:
        checked = torch.stack([check_image(img, self.sizes, i) for i, img in enumerate(images)])
        return {"pixel_values": patchify(checked, self.patch_size)}

    def process_audio(self, clips: Sequence[object]) -> dict[str, torch.Tensor]:
        framed = [frames(check_audio(c, self.sizes, i), self.frame_size) for i, c in enumerate(clips)]
        return {"audio_frames": torch.cat(framed),
                "audio_num_frames": torch.tensor([f.shape[0] for f in framed], dtype=torch.long)}

    @staticmethod
    def expand(text: str, token: str, counts: Sequence[int], what: str) -> str:
        """Each `token` of `text` -> `counts[k]` copies, for its k-th item; one token per item."""
        parts = text.split(token)
        if len(parts) - 1 != len(counts):
            raise ValueError(f"the text has {len(parts) - 1} {token} token(s) but {len(counts)} {what} were given")
        out = parts[0]
        for n, part in zip(counts, parts[1:]):
            out += token * n + part
        return out

    def __call__(self, text: str | Sequence[str] | None = None, images: Sequence[object] | None = None,
                 audio: Sequence[object] | None = None, sampling_rate: int | None = None,
                 add_special_tokens: bool = True, **kwargs) -> BatchFeature:
        """`images`: PIL images or float `[3, H, W]`, one or a list; `audio`: 1-D float clips or
        `(samples, sampling_rate)` tuples, one or a list. `sampling_rate` (HF's keyword for audio
        processors): the rate of the clips given without one; refused unless the model's.
        `add_special_tokens`: the tokenizer's (False for text a chat template rendered)."""
        if sampling_rate is not None and int(sampling_rate) != self.sampling_rate:
            raise ValueError(f"audio sampled at {sampling_rate} Hz; TinyAV takes {self.sampling_rate} Hz audio "
                             f"(resample it to {self.sampling_rate} Hz first)")
        if text is None:
            raise ValueError(
                f"TinyAVProcessor needs the text: it expands each {IMAGE_TOKEN} and {AUDIO_TOKEN} of the text "
                "into the item's placeholders, and checks one placeholder per item")
        texts = [text] if isinstance(text, str) else list(text)
        if len(texts) != 1:
            raise ValueError("TinyAVProcessor takes one text at a time")
        text, data = texts[0], {}
        images = None if images is None else image_list(images)
        audio = None if audio is None else audio_list(audio)
        if images:
            data.update(self.process_images(images))
            text = self.expand(text, IMAGE_TOKEN, [self.sizes.image_tokens] * len(images), "image(s)")
        if audio:
            data.update(self.process_audio(audio))
            text = self.expand(text, AUDIO_TOKEN, data["audio_num_frames"].tolist(), "audio clip(s)")
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=add_special_tokens)
        data.update(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"])
        return BatchFeature(data)

