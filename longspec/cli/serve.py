"""`longspec serve`: an OpenAI-compatible server for one model (longspec/serve)."""

from __future__ import annotations

import ipaddress
import os
import sys

from .flags import load_from_args, load_optional, model_args, model_flags

API_KEY_ENV = "LONGSPEC_API_KEY"


def add_parser(sub) -> None:
    from ..outputs.tool_formats import FORMATS
    from ..serve.config import ServeConfig, default_method

    defaults = ServeConfig(model_name="")
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument("model", help="checkpoint directory or bundled name")
    s.add_argument("--method", default=default_method(),
                   help="method of requests that name none (default: %(default)s)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: loopback only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV})")
    s.add_argument("--max-batch", type=int, default=defaults.max_batch,
                   help="generations run together, their drafts verified in one forward "
                   "(default: %(default)s)")
    s.add_argument("--max-queue", type=int, default=defaults.max_queue,
                   help="requests that may wait while a batch runs; more get 503 (default: "
                   "%(default)s)")
    s.add_argument("--request-timeout", type=float, default=defaults.request_timeout,
                   help="seconds from a request's arrival to its last token (default: "
                   "%(default)s)")
    s.add_argument("--default-max-tokens", type=int, default=defaults.default_max_tokens,
                   help="cap on new tokens for chat requests without max_tokens (default: "
                   "%(default)s)")
    s.add_argument("--served-model-name", help="the model id clients send (default: a bundled "
                   "name as given, a path or Hub id by its last part, a GGUF file's without "
                   "'.gguf'; MODEL as given is accepted too)")
    s.add_argument("--tool-call-format", choices=list(FORMATS), help="how the model writes "
                   "tool calls (default: recognised from its chat template)")
    s.add_argument("--draft-model", help="draft model for methods that need one")
    s.add_argument("--heads", metavar="DIR", help="trained drafter directory (heads or "
                   "EAGLE, from 'longspec train-drafter') for the methods that take one")
    s.add_argument("--ray-replicas", type=int, metavar="N", help="serve as N Ray Serve "
                   "replicas behind one endpoint, one loaded model each (pip install -e "
                   "\".[ray]\")")
    s.add_argument("--ray", metavar="ADDRESS", default="local", help="with --ray-replicas: the "
                   "Ray cluster's address (`auto`: the one this machine is part of), or `local` "
                   "to start one here (default)")
    s.add_argument("--log-level", default="info")
    model_flags(s, prompt_cache=True)
    s.set_defaults(run=run)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(args) -> int:
    import uvicorn

    from ..drafters import get_method
    from ..serve import ServeConfig, create_app

    get_method(args.method)
    replicas = 1 if args.ray_replicas is None else args.ray_replicas
    for flag, value, low in (("--ray-replicas", replicas, 1),
                             ("--max-batch", args.max_batch, 1),
                             ("--max-queue", args.max_queue, 1),
                             ("--default-max-tokens", args.default_max_tokens, 1)):
        if value < low:
            raise ValueError(f"{flag} must be at least {low}, got {value}")
    if not args.request_timeout > 0:
        raise ValueError(f"--request-timeout must be > 0 seconds, got {args.request_timeout}")
    if args.api_key is not None and not args.api_key:
        raise ValueError("--api-key is empty: pass a key, or leave the flag out")
    if not _loopback(args.host) and args.api_key is None:
        print(f"longspec: warning: serving on {args.host} with no --api-key: anyone who can "
              "reach it can use it", file=sys.stderr)
    if args.ray_replicas is not None:
        return _serve_on_ray(args)
    model, draft = _load_on_own_thread(args)
    config = ServeConfig(**_names(args), method=args.method, api_key=args.api_key,
                         max_batch=args.max_batch, max_queue=args.max_queue,
                         request_timeout=args.request_timeout,
                         default_max_tokens=args.default_max_tokens,
                         draft_model=draft, heads=args.heads,
                         tool_format=args.tool_call_format)
    # on Ctrl-C, open streams get a few seconds, then are cut (and their generations stopped)
    uvicorn.run(create_app(model, config), host=args.host, port=args.port,
                log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0


def _names(args) -> dict:
    """The served model's id, and the other one a request may name (MODEL as given)."""
    from ..serve.config import served_name

    name = args.served_model_name or served_name(args.model)
    return {"model_name": name, "aliases": () if name == args.model else (args.model,)}


def _load_on_own_thread(args) -> tuple:
    """The model and the draft model, loaded on a thread that then ends (serve/worker.py)."""
    from ..serve.worker import on_own_thread

    return on_own_thread(lambda: (load_from_args(args.model, args),
                                  load_optional(args.draft_model, args)))


def _serve_on_ray(args) -> int:
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("grpc") is None:
        raise ValueError("--ray-replicas needs Ray Serve: pip install -e \".[ray]\"")
    from ..jobs.ray_serve import serve_replicas

    config = {**_names(args), "method": args.method,
              "api_key": args.api_key, "max_batch": args.max_batch, "max_queue": args.max_queue,
              "request_timeout": args.request_timeout,
              "default_max_tokens": args.default_max_tokens, "heads": args.heads,
              "tool_format": args.tool_call_format}
    draft = None if args.draft_model is None else model_args(args.draft_model, args)
    serve_replicas(args.ray, args.ray_replicas, args.host, args.port,
                   model_args=model_args(args.model, args), draft_args=draft, config_args=config)
    return 0
