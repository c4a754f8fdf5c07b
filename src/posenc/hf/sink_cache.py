"""The bounded KV cache of attention sinks for Hugging Face models (StreamingLLM, Xiao et al. 2024,
arXiv:2309.17453, sec. 3.2), and the streaming perplexity it gives.

transformers 5 dropped its ``SinkCache``; :class:`SinkLayer` is a ``DynamicLayer`` that keeps the first
``n_sink`` keys and the last ``window - 1`` after each forward, so the next query sees n_sink + window keys at
most and the evicted ones are gone. The keys are cached unrotated (``posenc.hf.long_context``) and
rotated at their slots in the cache, the paper's "positions inside the cache": a window key's distance stays
i - j and a sink's is its slot's, ``min(i, n_sink + W - 1) - j`` (``posenc.methods``), so decoding through
this cache equals the full forward under the sinks mask (tested against ``generation.greedy_reference``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from posenc import methods
from posenc.errors import PosencError


class SinkLayer(DynamicLayer):
    """One layer's cache: (B, Hkv, <= n_sink + window - 1, D) keys and values between forwards."""

    is_croppable = False  # the evicted positions are gone: no assisted decoding rolls it back

    def __init__(self, n_sink: int, window: int):
        super().__init__()
        self.n_sink, self.window, self.cumulative_length = n_sink, window, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Attend over every cached key and the new ones; keep only what the next query's cache holds."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        self.keys, self.values = self._kept(keys), self._kept(values)
        return keys, values

    def _kept(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[-2]
        if n <= self.n_sink + self.window - 1:
            return t
        return torch.cat([t[..., : self.n_sink, :], t[..., n - (self.window - 1) :, :]], dim=-2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, kv offset) for transformers' mask: causal over the slots (every cached key is earlier)."""
        stored = self.keys.shape[-2] if self.is_initialized else 0
        return stored + query_length, self.cumulative_length - stored

    def get_seq_length(self) -> int:
        """Positions fed so far (more than the cache holds once it evicts)."""
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.n_sink + self.window


def sink_cache(model, method: methods.Method) -> Cache:
    """A fresh bounded cache for ``model`` (``model.config.num_hidden_layers`` layers) under sinks ``method``."""
    if not method.bounded:
        raise PosencError(f"a bounded cache is for attention sinks, not {method.name}")
    n = model.config.num_hidden_layers
    return Cache(layers=[SinkLayer(method.n_sink, method.window) for _ in range(n)])


@torch.inference_mode()
def streaming_nll(model, method: methods.Method, text: torch.Tensor, chunk: int = 256) -> tuple[torch.Tensor, int]:
    """Next-token NLL (nats) of one long text streamed through the bounded cache ``chunk`` tokens at a time.

    ``model``: a Hugging Face causal LM under sinks ``method`` (``Adaptation.set_method("sinks:...")``); text
    (T,) int64, T >= 2. Returns ((T-1,) float32, entry t predicting text[t + 1]; the largest cache held between
    chunks, in bytes: n_sink + window - 1 keys and values per layer, flat however long the text).
    Equals the full forward's NLL under the method (tested). PosencError (``posenc.methods.check_stream``) for a
    chunk that is not an integer >= 1 or a text that is not a (T,) tensor of T >= 2 token ids.
    """
    methods.check_stream(text, chunk)
    cache, out, peak = sink_cache(model, method), [], 0
    for s in range(0, text.shape[0] - 1, chunk):
        ids = text[None, s : min(s + chunk, text.shape[0] - 1)]
        logits = model(ids, past_key_values=cache, use_cache=True).logits[0].float()
        out.append(F.cross_entropy(logits, text[s + 1 : s + 1 + ids.shape[1]], reduction="none"))
        peak = max(
            peak, sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
        )
    return torch.cat(out), peak
