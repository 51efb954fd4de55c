"""`python -m terra_nb.serve --model DIR`: the world-model server (see `terra_nb.serve`)."""
from __future__ import annotations

import argparse
import json
import signal
import sys

from .app import CapacityError
from .server import run, serve


def engine_arg(text: str) -> tuple[str, object]:
    """`KEY=VALUE` -> (KEY, VALUE read as JSON, else the string): `--engine-arg max_num_seqs=64`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def interrupt_on_stop_signals() -> None:
    """SIGTERM and SIGHUP act as Ctrl-C does until the server listens (uvicorn then takes every stop
    signal, `TerraServer.capture_signals`): an engine being built is stopped, not orphaned."""
    def interrupt(sig, frame):
        raise KeyboardInterrupt(signal.Signals(sig).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m terra_nb.serve", description=__doc__)
    p.add_argument("--model", required=True, help="a Terra checkpoint folder (e.g. data/toy/model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=None,
                   help="WebSocket sessions and rollouts at once, at most the engine's max_num_seqs (the default; "
                        "32 on the CPU, raise it with --engine-arg max_num_seqs=N); one more is refused at once "
                        "(server_full; HTTP 503 on POST)")
    p.add_argument("--max-frames", type=int, default=1000,
                   help="new frames of a rollout or a session at most (too_many_frames)")
    p.add_argument("--decoder", choices=("auto", "toy", "none"), default="auto",
                   help="decode frames to PNG for clients that ask (auto: the toy world's model only)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="vLLM's stats off: /metrics then shows no vLLM metrics (a little less work a step)")
    p.add_argument("--engine-arg", type=engine_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="a vLLM engine argument over make_async_engine's defaults (repeatable), e.g. max_num_seqs=64")
    p.add_argument("--log-level", default="info")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    interrupt_on_stop_signals()
    print(f"terra_nb.serve: starting the engine on {args.model}; then http://{args.host}:{args.port}/ "
          "(the page), /health, /metrics, POST /v1/rollouts, WS /v1/sessions", flush=True)
    try:
        run(serve(args.model, args.host, args.port, metrics=not args.disable_log_stats, decoder=args.decoder,
                  max_sessions=args.max_sessions, max_frames=args.max_frames, log_level=args.log_level,
                  engine_args=dict(args.engine_arg)))
    except CapacityError as err:
        sys.exit(f"terra_nb.serve: {err}")
    except KeyboardInterrupt:  # a stop signal before the server listened: the engine is already stopped
        sys.exit(130)


if __name__ == "__main__":
    main()
