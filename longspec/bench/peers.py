"""The programs a user would pick instead, run on the same model, prompt and settings:
transformers' `generate` (plain, prompt lookup, assisted by a draft model) and, when
llama-cpp-python is installed, llama.cpp on the same GGUF file (plain, and its prompt lookup).
"""

from __future__ import annotations

import importlib.util
import itertools

import torch

from ..sampling.logits import SamplingConfig

HF_PEERS = ("hf", "hf-pld", "hf-assisted")
LLAMACPP_PEERS = ("llamacpp", "llamacpp-lookup")
PEERS = HF_PEERS + LLAMACPP_PEERS
PLD_TOKENS = 10           # transformers' prompt_lookup_num_tokens, llama.cpp's num_pred_tokens


def llamacpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def peer_status(peer: str, model, sampling: SamplingConfig, context: int, has_draft: bool) -> str:
    """'ok', 'approximate: why' (runs, but not the same sampling rule) or 'unsupported: why' /
    'skipped: why' (does not run)."""
    if peer in LLAMACPP_PEERS:
        if not llamacpp_installed():
            return "skipped: llama-cpp-python is not installed (pip install llama-cpp-python)"
        if model.path.suffix != ".gguf":
            return "unsupported: llama.cpp needs a .gguf model"
        return "ok" if sampling.greedy else "approximate: llama.cpp's own sampler"
    if peer == "hf-assisted" and not has_draft:
        return "unsupported: needs --draft-model"
    if sampling.uses_penalty and sampling.penalty_window < context:
        return ("approximate: transformers' repetition_penalty covers the whole sequence, "
                f"not the last {sampling.penalty_window} tokens")
    if sampling.eta and not sampling.greedy:
        return "approximate: eta uses transformers' eta_cutoff warper"
    return "ok"


class Peers:
    """The peers asked for, loaded once."""

    def __init__(self, model, draft_model, names: set[str]):
        self.model = self.draft = self.llama = self.lookup = None
        if names & set(HF_PEERS):
            self.model = self._load_hf(model)
            self.draft = None if draft_model is None else self._load_hf(draft_model)
        if names & set(LLAMACPP_PEERS):
            self.llama, self.lookup = self._load_llama(model, names)

    @staticmethod
    def _load_hf(model):
        """transformers' model of the same checkpoint (a GGUF file is dequantized by
        transformers, a Hub id is the snapshot longspec resolved)."""
        from transformers import AutoModelForCausalLM

        where, extra = model.transformers_location
        hf = AutoModelForCausalLM.from_pretrained(where, dtype=model.dtype, **extra)
        return hf.to(model.device).eval()

    @staticmethod
    def _load_llama(model, names: set[str]):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        def load(draft=None):
            return Llama(model_path=str(model.path), n_ctx=model.config.context_limit,
                         n_threads=torch.get_num_threads(), verbose=False, draft_model=draft)

        plain = load() if "llamacpp" in names else None
        lookup = (load(LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS))
                  if "llamacpp-lookup" in names else None)
        return plain, lookup

    def generate(self, peer: str, prompt: list[int], gen_len: int, sampling: SamplingConfig,
                 seed: int) -> list[int]:
        if peer in LLAMACPP_PEERS:
            return self._llama_generate(self.llama if peer == "llamacpp" else self.lookup,
                                        prompt, gen_len, sampling, seed)
        kwargs = {"max_new_tokens": gen_len, "min_new_tokens": gen_len}
        if sampling.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k or None, min_p=sampling.min_p or None)
            if sampling.eta:
                kwargs["eta_cutoff"] = sampling.eta
        if sampling.uses_penalty:
            kwargs["repetition_penalty"] = sampling.penalty
        if peer == "hf-pld":
            kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
        if peer == "hf-assisted":
            kwargs["assistant_model"] = self.draft
        ids = torch.tensor([prompt], device=self.model.device)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0,
                                      **kwargs)
        return out[0, len(prompt):].tolist()

    @staticmethod
    def _llama_generate(llm, prompt: list[int], gen_len: int, sampling: SamplingConfig,
                        seed: int) -> list[int]:
        """gen_len tokens after the prompt, end-of-sequence ignored (as every run here)."""
        return list(itertools.islice(Peers.llama_stream(llm, prompt, sampling, seed), gen_len))

    @staticmethod
    def llama_stream(llm, prompt: list[int], sampling: SamplingConfig, seed: int):
        """llama.cpp's tokens after the prompt, one at a time as it writes them, without end
        (end-of-sequence ignored): the caller stops it."""
        llm.reset()
        llm.set_seed(seed)
        yield from llm.generate(prompt, temp=sampling.temperature, top_p=sampling.top_p,
                                top_k=int(sampling.top_k), min_p=sampling.min_p,
                                repeat_penalty=sampling.penalty, reset=True)
