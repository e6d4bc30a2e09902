"""Every endpoint writes plain decoding's tokens under every method: the same request through
/v1/completions, /v1/chat/completions, /v1/responses and /v1/messages, greedy and sampled, its
token ids equal to `longspec.generate(..., method="ar")` on the same prompt. The speculation
behind the endpoints is the library's (test_lossless.py checks each method's equality in every
dtype); what this checks is that no endpoint's translation of its body changes the tokens."""

from pathlib import Path

import pytest
import tqdm
from serving import TEMPLATE, ServerThread

import longspec
from longspec.serve import ServeConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("costs_that_pay")]
METHODS = sorted(longspec.METHODS)
SAMPLINGS = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.9, "top_p": 0.9}}
NEW_TOKENS = 32
SYSTEM = "Continue the code."
CODE = Path(tqdm.__file__).with_name("std.py").read_text()[:600]
# the fields every body takes alike: longspec's, as each endpoint accepts them
COMMON = {"model": "chat", "seed": 5, "ignore_eos": True, "return_token_ids": True}
# a retrieval cache small enough to be built within these short runs (as test_lossless.py's)
OPTIONS = {"selfspec": {"retrieval_budget": 64, "rebuild_every": 16}}


def bodies(method: str, sampling: dict) -> dict[str, tuple[str, dict]]:
    """Each endpoint's route and body for the same request (the chat endpoints' prompt is the
    system message and the code as the user's)."""
    common = {**COMMON, "method": method, "options": OPTIONS.get(method), **sampling}
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CODE}]
    return {
        "completions": ("/v1/completions", {**common, "prompt": CODE, "max_tokens": NEW_TOKENS}),
        "chat": ("/v1/chat/completions", {**common, "messages": chat,
                                          "max_tokens": NEW_TOKENS}),
        "responses": ("/v1/responses", {**common, "instructions": SYSTEM, "input": CODE,
                                        "max_output_tokens": NEW_TOKENS}),
        "messages": ("/v1/messages", {**common, "system": SYSTEM, "max_tokens": NEW_TOKENS,
                                      "messages": [{"role": "user", "content": CODE}]}),
    }


def token_ids(endpoint: str, body: dict) -> list[int]:
    return body["choices"][0]["token_ids"] if endpoint in ("completions", "chat") else \
        body["token_ids"]


def accepted(body: dict) -> int:
    return body["speculative"]["num_accepted_tokens"]


@pytest.fixture(scope="module")
def model():
    """The demo model (its bundled drafters with it) given a chat template."""
    demo = longspec.load_model("demo", dtype="float32", device="cpu")
    demo.tokenizer.chat_template = TEMPLATE
    return demo


@pytest.fixture(scope="module")
def servers(model, demo_eagle):
    """A server of the bundled drafters and the draft model, and one of a trained EAGLE
    drafter (for `eagle`, which has none bundled)."""
    draft = longspec.load_model("demo-draft", dtype="float32", device="cpu")
    with ServerThread(model, ServeConfig("chat", draft_model=draft)) as bundled, \
            ServerThread(model, ServeConfig("chat", heads=str(demo_eagle))) as eagle:
        yield {"bundled": bundled, "eagle": eagle}


@pytest.mark.parametrize("setting", sorted(SAMPLINGS))
@pytest.mark.parametrize("method", METHODS)
def test_every_endpoint_writes_plain_decodings_tokens(servers, model, method, setting):
    server = servers["eagle" if method == "eagle" else "bundled"]
    sampling = SAMPLINGS[setting]
    settings = {"max_new_tokens": NEW_TOKENS, "seed": COMMON["seed"], "ignore_eos": True,
                "method": "ar", "sampling": longspec.SamplingConfig(**sampling)}
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CODE}]
    expect = {"text": longspec.generate(model, CODE, **settings).token_ids,
              "chat": longspec.generate(model, chat, **settings).token_ids}
    drafted = 0
    for endpoint, (route, body) in bodies(method, sampling).items():
        status, _, answer = server.request("POST", route, body)
        assert status == 200, answer
        assert token_ids(endpoint, answer) == expect[
            "text" if endpoint == "completions" else "chat"], endpoint
        drafted += accepted(answer)
    if method != "ar":
        assert drafted > 0          # drafts were verified, and some kept
