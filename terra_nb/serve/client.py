"""A small client for the world-model server, sync and async: copy this file into your project.

It needs `httpx` and `websockets` (both come with vLLM's server stack) and nothing of terra-nb.

    from client import Client
    client = Client("http://127.0.0.1:8000")
    client.health()                                            # {"status": "ok", "layout": {...}, ...}
    for frame in client.rollout(context, actions, n_frames=6, sampling={"temperature": 0}):
        frame["codes"]                                         # one frame at a time, as the server makes it
    with client.session(context, context_actions, sampling={"temperature": 0}) as s:
        frame = s.first                                        # frame 0 (made from the context)
        for _ in range(10):
            frame = s.step(policy(frame))                      # your actions [6, 3] -> the next frame

    async with AsyncClient(url) as client:                     # the same, for asyncio
        async for frame in client.rollout(...): ...
        async with client.session(...) as s:
            frame = await s.step(actions)

`context` is `[n_ctx, P]` codes, actions `[n, 6, 3]` (lists, numpy arrays or tensors); a refused
request raises `ServerError` with the server's `.rule`, `.param`, message and `.ends_session`.
docs/serving.md is the protocol this client speaks.
"""
from __future__ import annotations

import json

import httpx

__all__ = ["AsyncClient", "AsyncSession", "Client", "ServerError", "Session"]


class ServerError(ValueError):
    """The server refused a request: `.rule` (e.g. "code_out_of_range"), `.param`, the message, and
    `.ends_session` (False: the session stands as it was; True: it is over, start a new one)."""

    def __init__(self, error: dict):
        self.rule, self.param = error.get("rule"), error.get("param")
        self.ends_session = error.get("ends_session")
        super().__init__(error.get("message") or str(error))


def _list(x):
    """Arrays and tensors -> nested lists (JSON); lists pass."""
    return x.tolist() if hasattr(x, "tolist") else x


def _ws_url(url: str) -> str:
    return "ws" + url[len("http"):] + "/v1/sessions" if url.startswith("http") else url + "/v1/sessions"


def _start(context, actions, sampling, image) -> str:
    return json.dumps({"type": "start", "context": _list(context), "actions": _list(actions),
                       "sampling": sampling or {}, "image": image})


def _step(actions) -> str:
    return json.dumps({"type": "step", "actions": _list(actions)})


def _rollout_body(context, actions, n_frames, sampling, image) -> dict:
    return {"context": _list(context), "actions": _list(actions), "n_frames": n_frames, "sampling": sampling or {},
            "image": image}


def _frame(text: str | bytes) -> dict:
    """A server message -> the frame (or the end) message; an error raises `ServerError`."""
    msg = json.loads(text)
    if msg.get("type") == "error":
        raise ServerError(msg)
    return msg


def _refusal(response) -> ServerError:
    try:
        return ServerError(response.json()["error"])
    except (ValueError, KeyError, TypeError):
        return ServerError({"message": f"HTTP {response.status_code}: {response.text[:500]}"})


# ---------------------------------------------------------------------------- sync
class Client:
    """The server at `url` (`http://host:port`)."""

    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 300.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=self.timeout).json()

    def rollout(self, context, actions, n_frames: int, sampling: dict | None = None, image: bool = False):
        """Yield the frames of one open-loop rollout as the server makes them (`actions` covers
        `n_ctx + n_frames - 1` frames)."""
        body = _rollout_body(context, actions, n_frames, sampling, image)
        with httpx.stream("POST", self.url + "/v1/rollouts", json=body, timeout=self.timeout) as response:
            if response.status_code != 200:
                response.read()
                raise _refusal(response)
            for line in response.iter_lines():
                if line:
                    msg = _frame(line)
                    if msg["type"] == "frame":
                        yield msg

    def rollout_codes(self, context, actions, n_frames: int, sampling: dict | None = None) -> list[list[int]]:
        """The rollout's codes `[n_frames, P]`."""
        return [f["codes"] for f in self.rollout(context, actions, n_frames, sampling)]

    def session(self, context, actions, sampling: dict | None = None, image: bool = False) -> "Session":
        """A closed-loop session (use `with`): `actions` covers the context frames."""
        return Session(_ws_url(self.url), context, actions, sampling, image, self.timeout)


class Session:
    """One WebSocket session: `.first` is frame 0; `step(actions)` returns the next frame."""

    def __init__(self, ws_url, context, actions, sampling, image, timeout):
        from websockets.sync.client import connect

        self.ws = connect(ws_url, open_timeout=timeout, max_size=None).__enter__()  # closed by close()
        self.timeout = timeout
        try:
            self.ws.send(_start(context, actions, sampling, image))
            self.first = self._receive()
        except BaseException:
            self.ws.close()
            raise

    def _receive(self) -> dict:
        return _frame(self.ws.recv(timeout=self.timeout))

    def step(self, actions) -> dict:
        self.ws.send(_step(actions))
        return self._receive()

    def close(self) -> dict | None:
        """End the session; returns the server's "end" message (None if the connection is gone)."""
        try:
            self.ws.send(json.dumps({"type": "end"}))
            return _frame(self.ws.recv(timeout=self.timeout))
        except Exception:  # noqa: BLE001 - already closed
            return None
        finally:
            self.ws.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------- async
class AsyncClient:
    """The server at `url`, for asyncio (use `async with`, or call `aclose()`)."""

    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 300.0):
        self.url, self.timeout = url.rstrip("/"), timeout
        self.http = httpx.AsyncClient(timeout=timeout)

    async def health(self) -> dict:
        return (await self.http.get(self.url + "/health")).json()

    async def rollout(self, context, actions, n_frames: int, sampling: dict | None = None, image: bool = False):
        body = _rollout_body(context, actions, n_frames, sampling, image)
        async with self.http.stream("POST", self.url + "/v1/rollouts", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise _refusal(response)
            async for line in response.aiter_lines():
                if line:
                    msg = _frame(line)
                    if msg["type"] == "frame":
                        yield msg

    async def rollout_codes(self, context, actions, n_frames: int, sampling: dict | None = None) -> list[list[int]]:
        return [f["codes"] async for f in self.rollout(context, actions, n_frames, sampling)]

    def session(self, context, actions, sampling: dict | None = None, image: bool = False) -> "AsyncSession":
        return AsyncSession(_ws_url(self.url), context, actions, sampling, image, self.timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class AsyncSession:
    """`async with client.session(...) as s`: `s.first` is frame 0; `await s.step(actions)`."""

    def __init__(self, ws_url, context, actions, sampling, image, timeout):
        self._args = (ws_url, _start(context, actions, sampling, image))
        self.timeout, self.ws, self.first = timeout, None, None

    async def open(self) -> "AsyncSession":
        from websockets.asyncio.client import connect

        ws_url, start = self._args
        self.ws = await connect(ws_url, open_timeout=self.timeout, max_size=None)
        try:
            await self.ws.send(start)
            self.first = await self._receive()
        except BaseException:
            await self.ws.close()
            raise
        return self

    async def _receive(self) -> dict:
        import asyncio

        return _frame(await asyncio.wait_for(self.ws.recv(), self.timeout))

    async def step(self, actions) -> dict:
        await self.ws.send(_step(actions))
        return await self._receive()

    async def close(self) -> dict | None:
        try:
            await self.ws.send(json.dumps({"type": "end"}))
            return _frame(await self.ws.recv())
        except Exception:  # noqa: BLE001 - already closed
            return None
        finally:
            await self.ws.close()

    async def __aenter__(self) -> "AsyncSession":
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        await self.close()
