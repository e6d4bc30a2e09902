"""`longspec serve MODEL --ray-replicas N`: the server as N Ray Serve replicas behind one
endpoint, on one machine or a Ray cluster (`pip install -e ".[ray]"`).

Each replica is a Ray actor with the model loaded and the server of serve/app.py (its own batch
of up to --max-batch generations, its own queue); Ray Serve's proxy listens on --host:--port and
hands each request to a replica. A response is what the replica's machine writes: the tokens of
one server where the replicas' CPUs have this one's kernel profile.
"""

from __future__ import annotations

import time

LOCAL = "local"     # --ray local: start a Ray instance on this machine


def replica_app(model_args: dict, draft_args: dict | None, config_args: dict, threads: int):
    """One replica's server, built on the replica: the model (and draft model) loaded on a
    thread that then ends, so that the server's worker thread is the only one running it
    (serve/worker.py)."""
    import torch

    from ..models import load_model
    from ..serve import ServeConfig, create_app
    from ..serve.worker import on_own_thread

    torch.set_num_threads(threads)
    model, draft = on_own_thread(lambda: (
        load_model(**model_args), None if draft_args is None else load_model(**draft_args)))
    return create_app(model, ServeConfig(**config_args, draft_model=draft))


def serve_replicas(address: str, replicas: int, host: str, port: int, *, model_args: dict,
                   draft_args: dict | None, config_args: dict) -> None:
    """Run `replicas` replicas of the server behind one endpoint until interrupted."""
    import ray
    from ray import serve

    ray.init(address=None if address == LOCAL else address, include_dashboard=False)
    try:
        cpus = max(1, int(ray.available_resources().get("CPU", 1)) // replicas)

        def build():
            return replica_app(model_args, draft_args, config_args, cpus)

        deployment = serve.deployment(serve.ingress(build)(), name="longspec",
                                      num_replicas=replicas,
                                      ray_actor_options={"num_cpus": cpus})
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment.bind(), name="longspec", route_prefix="/")
        print(f"longspec: serving on http://{host}:{port} with {replicas} Ray Serve replicas "
              f"({cpus} CPU each)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
