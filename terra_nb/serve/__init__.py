"""Serving Terra: a world-model server that clients drive frame by frame.

`vllm serve` cannot carry Terra's `actions` modality through the OpenAI API, so this is a small
server of its own on vLLM's `AsyncLLM` and the web stack vLLM installs (FastAPI, uvicorn):

    python -m terra_nb.serve --model data/toy/model      # or `make serve`; --help for the options

* `POST /v1/rollouts`: context codes + every frame's actions (open loop) -> the frames' codes,
  one JSON line each as they are made (NDJSON), for batch clients; one rollout per request, and
  vLLM batches concurrent requests;
* `WS /v1/sessions`: the client sends the context once, then the actions of each next frame and
  gets that frame back (codes, and for the toy world the image as a PNG when asked): the policy
  lives in the client. Each connection is one `WorldSession` (`session_rollout`'s streaming-input
  sessions, stepped), with its own sampling settings; any number at once, batched by vLLM;
* `GET /health` (engine, sessions open/running/refused, KV-cache blocks free/total, each rank's load), `GET /metrics` (vLLM's Prometheus
  metrics), `GET /` (the toy world in the browser: arrow keys steer, frames appear as made).

Every message is checked by the port's rules before the engine (`protocol`), unknown fields
included; a bad one gets an error naming its rule, on that connection only. The server admits as
many sessions (from their start) as its engine schedules at once (`max_num_seqs`) and refuses one
more at once (`server_full`); a connection silent for `--idle-timeout` s is closed. A client that
leaves mid-frame has its request aborted (its KV blocks freed); SIGTERM, SIGINT or SIGHUP end every
session with a message, then stop the engine and its processes (while it starts too). The engine
never outlives the server (`kill -9` included), and a dead engine ends every session with a message,
then the server, non-zero. With `--data-parallel-size N` the engine has N ranks (vLLM's data
parallelism): vLLM's load balancer places each session on one, its KV cache stays there, and the
server admits N times one rank's sessions.
docs/serving.md is the protocol's reference for clients in any language.

Modules: `protocol` (messages and their checks), `session` (`WorldSession`), `engine` (building it,
its KV blocks, its metrics), `app` (`build_app`: the routes), `server` (`serve`, `ServerThread`: the engine on uvicorn's loop), `toy` (PNG frames,
a start to drive from), `client` (a copyable sync and async client), `static/index.html` (the page).
"""
from .app import build_app, end_sessions
from .engine import kv_blocks, make_server_engine
from .server import ServerThread, serve
from .session import WorldSession

__all__ = ["ServerThread", "WorldSession", "build_app", "end_sessions", "kv_blocks", "make_server_engine", "serve"]
