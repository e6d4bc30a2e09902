"""A fault in one generation ends that generation alone: a batch's other members write what they
write alone, and the server's worker goes on serving (and /health says when it cannot).

Each fault is injected by wrapping one method of the engine (or the prompt cache) so that it
raises for the generation whose tokens begin with the failing prompt's, from a given length on."""

import threading

import pytest
from serving import ServerThread

import longspec
from longspec import api
from longspec.engine.batching import Batch
from longspec.engine.generation import Engine
from longspec.serve import ServeConfig
from longspec.state.prompt_cache import PromptCache

GOOD = ["class Parser:\n", "def main():\n"]
BAD = "import os\nimport sys\n"
SETTINGS = {"max_new_tokens": 24, "seed": 7, "ignore_eos": True}


class Injected(RuntimeError):
    pass


@pytest.fixture(scope="module")
def model():
    return longspec.load_model("demo", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def alone(model):
    """Each good prompt's tokens run alone, by method."""
    return {method: [longspec.generate(model, p, method=method, **SETTINGS).token_ids
                     for p in GOOD] for method in ("ar", "auto")}


def arm(monkeypatch, owner, name: str, bad_ids: list[int], after: int) -> None:
    """owner.name raises Injected for the generation whose tokens begin with bad_ids, once it
    holds at least `after` tokens past them."""
    original = getattr(owner, name)

    def failing(self, *args, **kwargs):
        tokens = args[0] if owner is PromptCache else self.tokens
        if tokens[:len(bad_ids)] == bad_ids and len(tokens) >= len(bad_ids) + after:
            raise Injected(f"injected into {owner.__name__}.{name}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


# (owner, method, tokens past the prompt from which it fails): a step's parts, the finish,
# the prompt cache at the finish, and at the prompt's prefill (0: when the generation joins)
POINTS = [(Engine, "draft", 3), (Engine, "judge", 3), (Engine, "commit", 3),
          (Engine, "finish", 0), (PromptCache, "store", 1), (PromptCache, "store", 0)]


@pytest.mark.parametrize("method", ["ar", pytest.param("auto", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("owner", "name", "after"), POINTS)
def test_a_failing_member_leaves_its_batch_and_the_others_write_what_they_write_alone(
        monkeypatch, model, alone, method, owner, name, after):
    streams = [api.stream(model, p, method=method, **SETTINGS) for p in (GOOD[0], BAD, GOOD[1])]
    arm(monkeypatch, owner, name, streams[1].prompt_ids, after)
    batch, errors = Batch(model), {}
    for s in streams:
        try:
            batch.join(s)
        except Injected as e:
            errors[id(s)] = e
    while batch.members:
        for s, item in batch.step():
            if isinstance(item, Exception):
                errors[id(s)] = item
    assert list(errors) == [id(streams[1])] and isinstance(errors[id(streams[1])], Injected)
    assert [streams[0].result.token_ids, streams[2].result.token_ids] == alone[method]
    batch.leave(streams[1], False)       # gone already: nothing happens
    monkeypatch.undo()
    assert longspec.generate(model, GOOD[0], method=method, **SETTINGS).token_ids == \
        alone[method][0]


def test_generate_many_raises_a_members_failure(monkeypatch, model):
    bad_ids = api.stream(model, BAD, **SETTINGS).prompt_ids
    arm(monkeypatch, Engine, "commit", bad_ids, 2)
    with pytest.raises(Injected):
        longspec.generate_many(model, [GOOD[0], BAD], max_batch=2, **SETTINGS)


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, ServeConfig("demo", max_batch=4)) as s:
        yield s


def _ask(server, prompt: str, answers: dict, **body) -> None:
    answers[prompt] = server.request("POST", "/v1/completions", {
        "model": "demo", "prompt": prompt, "max_tokens": SETTINGS["max_new_tokens"],
        "seed": SETTINGS["seed"], "ignore_eos": True, "return_token_ids": True, **body})


@pytest.mark.parametrize(("owner", "name", "after"), [
    (Engine, "commit", 3), pytest.param(Engine, "finish", 0, marks=pytest.mark.slow)])
def test_the_server_ends_the_failing_request_alone_and_serves_the_next(
        monkeypatch, model, alone, server, owner, name, after):
    arm(monkeypatch, owner, name, api.stream(model, BAD, **SETTINGS).prompt_ids, after)
    answers: dict = {}
    good = threading.Thread(target=_ask, args=(server, GOOD[0], answers),
                            kwargs={"max_tokens": 200, "method": "ar"})
    good.start()
    server.wait_running()
    _ask(server, BAD, answers, method="ar")
    good.join()
    status, _, payload = answers[BAD]
    assert status == 500 and "injected" in payload["error"]["message"]
    status, _, payload = answers[GOOD[0]]
    first = alone["ar"][0]
    assert status == 200 and payload["choices"][0]["token_ids"][:len(first)] == first
    _ask(server, GOOD[1], answers)
    assert answers[GOOD[1]][0] == 200 and server.health()["status"] == "ok"


def test_a_step_failing_outside_any_generation_ends_the_batch_and_the_worker_goes_on(
        monkeypatch, server):
    original, calls = Batch.step, []

    def failing(self):
        calls.append(1)
        if len(calls) == 2:
            raise Injected("injected into Batch.step")
        return original(self)

    monkeypatch.setattr(Batch, "step", failing)
    answers: dict = {}
    _ask(server, GOOD[0], answers)
    status, _, payload = answers[GOOD[0]]
    assert status == 500 and "injected" in payload["error"]["message"]
    monkeypatch.undo()
    _ask(server, GOOD[1], answers)
    assert answers[GOOD[1]][0] == 200 and server.wait_idle() < 3


def test_health_turns_unhealthy_and_requests_are_refused_once_the_worker_stops(model):
    with ServerThread(model, ServeConfig("demo")) as s:
        assert s.request("GET", "/health")[0] == 200
        s.app.state.server.worker.stop()
        status, _, body = s.request("GET", "/health")
        assert status == 503 and body["status"] == "unhealthy" and body["worker"] == "stopped"
        status, _, body = s.request("POST", "/v1/completions",
                                    {"model": "demo", "prompt": "x", "max_tokens": 2})
        assert status == 503 and body["error"]["code"] == "worker_stopped"
