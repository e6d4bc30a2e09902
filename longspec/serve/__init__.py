"""An OpenAI-compatible HTTP server for one model (`longspec serve`): completions and chat
completions, streamed or whole, one generation at a time, with speculative metrics per response
and in Prometheus."""

from .config import ServeConfig, default_method


def __getattr__(name: str):
    # the web framework is imported only by whoever builds an app, not by the CLI's parser
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ServeConfig", "create_app", "default_method"]
