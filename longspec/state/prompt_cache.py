"""Prompts computed once: the keys and values of earlier sequences, by token prefix.

A generation's cache holds, in slot i, the keys and values of position i, and their bits are
a function of the model, its kernel profile and the tokens 0..i alone (the row invariance
exactness rests on: a row is the same in a prompt's chunk, a plain step or a draft tree). So
the slots of any earlier sequence that shares a request's first tokens are the slots its
prefill would write, and a request copies them instead of computing them.

The sequences are kept as a trie of blocks of BLOCK tokens (vLLM's automatic prefix caching
hashes such blocks, each chained to its prefix; SGLang keeps a radix tree): a block's children
continue it, a sequence's last block may be shorter (a partial block, always a leaf), and a
request reuses the longest common prefix to the token, the last block's first tokens
included. Every block is one tensor [layers, 2 (keys, values), kv_heads, tokens, head_dim].

Bounded in bytes: blocks are evicted least recently used first, leaves only (a block is
touched after its children, so the oldest block is a leaf), and a sequence is stored only as
far as the bound allows. Generations on several threads may share it (one lock).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ..cache.full import StaticCache

BLOCK = 16                # tokens a block holds
DEFAULT_SHARE = 8         # by default the cache may take 1/8 of the memory free at load ...
DEFAULT_CAP = 4 * 2**30   # ... and at most this many bytes


@dataclass(eq=False)
class Block:
    tokens: tuple[int, ...]
    kv: torch.Tensor | None                 # [layers, 2, kv_heads, len(tokens), head_dim]
    parent: Block | None
    children: dict[tuple[int, ...], Block] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()


def default_limit(free_bytes: int) -> int:
    """The bound a model's prompt cache gets when none is asked for."""
    return min(free_bytes // DEFAULT_SHARE, DEFAULT_CAP)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """The keys and values of earlier sequences on one model, at most `limit_bytes` of them
    (0: none kept)."""

    def __init__(self, limit_bytes: int = 0):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self.root = Block((), None, None)
        self._lru: OrderedDict[Block, None] = OrderedDict()   # oldest first
        self._lock = threading.Lock()
        self.evicted_blocks = 0     # since the model loaded

    def __len__(self) -> int:
        return len(self._lru)

    def resize(self, limit_bytes: int) -> None:
        """A new bound, evicting what it no longer holds."""
        with self._lock:
            self.limit_bytes = limit_bytes
            self._make_room(0, set())

    def clear(self) -> None:
        with self._lock:
            self.root = Block((), None, None)
            self._lru.clear()
            self.bytes = 0

    # -- a request's prefix ------------------------------------------------------------------------

    def restore(self, tokens: list[int], cache: StaticCache) -> int:
        """Copy the keys and values of the longest cached prefix of `tokens` into an empty
        `cache`'s first slots and commit them; how many."""
        with self._lock:
            pieces = self._match(tokens)
            n = sum(used for _, used in pieces)
            self._touch([block for block, _ in pieces])
            if n == 0:
                return 0
            # a layer at a time: one buffer of all layers (the prefix's size, ~100 MB for 3.5K
            # tokens of a 1.5B model) took 150-190 ms on its fresh pages, a layer's 27 ms in all
            for layer, (k, v) in enumerate(zip(cache.k, cache.v)):
                kv = torch.cat([block.kv[layer, :, :, :used] for block, used in pieces], dim=2)
                k[:, :n].copy_(kv[0])
                v[:, :n].copy_(kv[1])
        cache.commit(n)
        return n

    def _match(self, tokens: list[int]) -> list[tuple[Block, int]]:
        """The blocks along the longest cached prefix of `tokens`, with how many of each one's
        tokens it uses (all but perhaps the last's)."""
        pieces: list[tuple[Block, int]] = []
        node, done = self.root, 0
        while done < len(tokens):
            key = tuple(tokens[done:done + BLOCK])
            child = node.children.get(key) if len(key) == BLOCK else None
            if child is not None:
                pieces.append((child, BLOCK))
                node, done = child, done + BLOCK
                continue
            best, used = None, 0
            for other in node.children.values():
                common = _common(other.tokens, key)
                if common > used:
                    best, used = other, common
            if best is not None:
                pieces.append((best, used))
            break
        return pieces

    # -- a generation's sequence -------------------------------------------------------------------

    def store(self, tokens: list[int], cache: StaticCache) -> None:
        """Keep the keys and values of `cache`'s committed slots, those of `tokens` (as far
        as the bound allows)."""
        if self.limit_bytes <= 0:
            return
        n = min(len(tokens), cache.length)
        with self._lock:
            path: list[Block] = []
            node, done = self.root, 0
            while done < n:
                key = tuple(tokens[done:min(n, done + BLOCK)])
                child = node.children.get(key)
                if child is None and len(key) < BLOCK and any(
                        other.tokens[:len(key)] == key for other in node.children.values()):
                    break          # a longer block holds these already
                if child is None:
                    child = self._add(node, key, cache, done, set(path))
                    if child is None:
                        break      # the bound is reached
                path.append(child)
                node, done = child, done + len(key)
            self._touch(path)

    def _add(self, parent: Block, key: tuple[int, ...], cache: StaticCache, first: int,
             keep: set[Block]) -> Block | None:
        """A new block of `key`'s tokens under `parent`, from the cache's slots at `first`;
        None where the bound leaves no room for it without evicting `keep` (the path to it)."""
        for short in [k for k in parent.children if len(k) < len(key) and key[:len(k)] == k]:
            self._drop(parent.children[short])      # a partial block the new one extends
        need = len(key) * _bytes_per_token(cache)
        if not self._make_room(need, keep | {parent}):
            return None
        end = first + len(key)
        kv = torch.stack([torch.stack((k[:, first:end], v[:, first:end]))
                          for k, v in zip(cache.k, cache.v)])
        block = Block(key, kv, parent)
        parent.children[key] = block
        self._lru[block] = None
        self.bytes += block.nbytes
        return block

    def _make_room(self, need: int, keep: set[Block]) -> bool:
        """Evict the least recently used leaves until `need` more bytes fit; False where only
        blocks of `keep` are left to evict."""
        while self.bytes + need > self.limit_bytes:
            oldest = next((b for b in self._lru if not b.children and b not in keep), None)
            if oldest is None:
                return False
            self._drop(oldest)
            self.evicted_blocks += 1
        return True

    def _drop(self, block: Block) -> None:
        del block.parent.children[block.tokens]
        del self._lru[block]
        self.bytes -= block.nbytes

    def _touch(self, path: list[Block]) -> None:
        """Mark a path as used now, its deepest block first (so a block is always newer than
        its children)."""
        for block in reversed(path):
            self._lru.move_to_end(block)


def _bytes_per_token(cache: StaticCache) -> int:
    k = cache.k[0]
    return 2 * len(cache.k) * k.shape[0] * k.shape[2] * k.element_size()
