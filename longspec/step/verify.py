"""Verification: which draft nodes the target accepts, and the bonus token.

Glossary (the papers' names):
- draft tree: the root (the last committed token, whose keys are not cached yet) and the draft
  tokens below it; one target forward gives logits after every node.
- target token of node i: the token the target chooses after node i (the argmax of its
  processed logits, plus the position's Gumbel noise when sampling).
- accepted: the nodes whose token equals their parent's target token and whose parent is
  accepted (the root always is). In a trie at most one child of a node can match, so the
  accepted nodes form one path; `accept_length` counts its draft tokens.
- bonus token: the target token of the deepest accepted node, which plain decoding would have
  written next; every step commits accept_length + 1 tokens.

Matching gives exactly the tokens plain decoding gives. `verify="rejection"` instead applies
Leviathan et al.'s rule to chains that carry their draft distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .forward import ForwardOutput
from .tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]   # node indices of the accepted path, root first [accept_length + 1]
    tokens: list[int]     # new tokens: the accepted draft tokens, then the bonus token

    @property
    def accept_length(self) -> int:
        """Accepted draft tokens (the bonus not counted)."""
        return len(self.accepted) - 1

    @property
    def bonus_token(self) -> int:
        return self.tokens[-1]


@dataclass
class TargetOutput:
    """What the verify forward produced for each tree node."""

    forward: ForwardOutput          # raw logits [n, vocab] (+ hidden states when asked for)
    processed: torch.Tensor         # processed logits [n, vocab] (penalty, temperature, ...)
    target_tokens: torch.Tensor     # [n] the target's choice after each node
    # seconds of the step outside the drafter's proposal that are this generation's: sizing
    # its tree, the forward (in a batch, its share by rows), choosing after its nodes
    seconds: float = 0.0
    # the tree's size was set to time a step over that many rows (sizing.Plan.timing), not
    # chosen for what it pays: its rate says nothing of the drafter's choices
    timing: bool = False


def accepted_nodes(tree: DraftTree, target_tokens: torch.Tensor) -> torch.Tensor:
    """Bool [n]: node accepted (its whole path matches the target's choices)."""
    shape = tree.shape
    match = tree.tokens == target_tokens[shape.parent]
    match[0] = True
    return ~(shape.ancestors & ~match[None, :]).any(dim=1)


def verify_tree(tree: DraftTree, target_tokens: torch.Tensor) -> Verdict:
    """Accepted path and bonus token, with one host transfer."""
    return verify_trees([tree], [target_tokens])[0]


def verify_trees(trees: list[DraftTree], target_tokens: list[torch.Tensor]) -> list[Verdict]:
    """verify_tree of several trees (a batch's generations'), with one host transfer for all."""
    packed = [_packed(t, tokens) for t, tokens in zip(trees, target_tokens)]
    host = torch.cat(packed).tolist()           # the step's one host sync
    verdicts, at = [], 0
    for tree, part in zip(trees, packed):
        verdicts.append(_verdict(tree, host[at:at + len(part)]))
        at += len(part)
    return verdicts


def _packed(tree: DraftTree, target_tokens: torch.Tensor) -> torch.Tensor:
    """On the device, what the verdict needs: the bonus token, then (for a tree past its root)
    the accepted path's nodes and their tokens, padded to the tree's depth + 1."""
    shape = tree.shape
    if shape.n == 1:
        return target_tokens[:1]
    accepted = accepted_nodes(tree, target_tokens)
    best = (accepted * (shape.depth + 1)).argmax()
    path = shape.paths[best]
    return torch.cat([target_tokens[best].view(1), path, tree.tokens[path.clamp(min=0)]])


def _verdict(tree: DraftTree, host: list[int]) -> Verdict:
    """The verdict from _packed's values on the host."""
    if tree.shape.n == 1:
        return Verdict([0], host)
    width = tree.shape.max_depth + 1
    bonus, nodes, tokens = host[0], host[1:1 + width], host[1 + width:]
    length = next((d for d, node in enumerate(nodes) if node < 0), width)
    return Verdict(nodes[:length], tokens[1:length] + [bonus])


def speculative_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                       drafts: torch.Tensor, sampler) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan et al.'s rule for a chain of m drafts (device tensors, no host sync).

    target_probs [m + 1, vocab] (after the root and after each draft), draft_probs [m, vocab]
    (the distributions the drafts were sampled from), drafts [m]. Draft i is accepted with
    probability min(1, p_i / q_i); at the first rejection a token is drawn from
    norm(max(0, p - q)), and after m acceptances from p. Returns (accepted count, token).
    """
    m = drafts.shape[0]
    idx = torch.arange(m, device=drafts.device)
    p = target_probs[idx, drafts]
    q = draft_probs[idx, drafts]
    accepted = (sampler.uniform(m) * q < p).int().cumprod(0).sum()
    residual = (target_probs[:m] - draft_probs).clamp_min(0)
    total = residual.sum(dim=-1, keepdim=True)
    # where p == q no rejection can happen; the row is never drawn from
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), target_probs[:m])
    dist = torch.cat([residual, target_probs[m:m + 1]])[accepted]
    return accepted, sampler.sample(torch.log(dist)[None])[0]


def verify_chain_rejection(tree: DraftTree, processed: torch.Tensor, sampler) -> Verdict:
    """Rejection-sampling verification of a chain that carries its draft distributions."""
    probs = torch.softmax(processed, dim=-1)
    accepted, token = speculative_sample(probs, tree.draft_probs, tree.tokens[1:], sampler)
    host = torch.cat([accepted.view(1), token.view(1), tree.tokens]).tolist()  # one host sync
    k, bonus, tokens = host[0], host[1], host[2:]
    return Verdict(list(range(k + 1)), tokens[1:k + 1] + [bonus])


def verify(tree: DraftTree, target: TargetOutput, sampler) -> Verdict:
    """The verdict on `tree`: rejection sampling for a sampled chain in rejection mode,
    matching against the target's choices otherwise."""
    if sampler.rejection and tree.draft_probs is not None:
        return verify_chain_rejection(tree, target.processed, sampler)
    return verify_tree(tree, target.target_tokens)
