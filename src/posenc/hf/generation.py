"""Text generation from a Hugging Face causal LM with posenc's adaptation (``posenc generate MODEL``).

:func:`generate` runs transformers' own ``generate`` with its KV cache (a ``DynamicCache``; with a posenc
scheme its layers also hold the scheme's decoding state, ``posenc.hf.scheme``; with attention sinks the bounded
``posenc.hf.sink_cache``), except where the cache would
change the result: a scheme that replaces attention needs every query (``Scheme.full_forward``), and
dynamic NTK and LongRoPE pick their frequencies per forward from the length, so past L0 cached keys keep
their step's (``posenc.hf.adaptation.SWITCHES``); those decode without the cache.
:func:`greedy_reference` is the naive greedy decoding it is tested against: one full forward of the
whole sequence per new token.
"""

from __future__ import annotations

import torch

from posenc.errors import PosencError
from posenc.hf.adaptation import SWITCHES, Adaptation
from posenc.model import check_sampling


def exact_with_cache(adapted: Adaptation, total: int) -> bool:
    """Whether decoding ``adapted.model`` up to ``total`` positions through the KV cache gives the logits of full
    forwards: not for a scheme that replaces attention, nor for dynamic NTK or LongRoPE past L0 (their
    frequencies change with the length after keys are cached). Self-Extend and LM-Infinite (``Adaptation.set_method``)
    decode exactly through it: their keys are cached unrotated, none is evicted, and each step rotates them at the
    method's positions (``posenc.hf.long_context``); attention sinks through their bounded cache
    (``posenc.hf.sink_cache``), equal to the full forward under the sinks mask."""
    switches = adapted.extension.schedule in SWITCHES and total > adapted.l0
    return not (adapted.full_forward or switches)


@torch.inference_mode()
def generate(
    adapted: Adaptation,
    ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    eos_token_id=None,
) -> torch.Tensor:
    """The prompt ``ids`` (T,) int64 followed by up to ``max_new_tokens`` generated tokens: (T + n,) int64,
    n <= max_new_tokens.

    transformers' ``generate`` on ``adapted.model``: greedy at temperature 0, else sampling at ``temperature``
    from the ``top_k`` most likely tokens (None: all; no nucleus cut, no penalty: the model's generation
    defaults are not used), reproducibly with ``seed`` (torch's global generator). Stops after the first
    ``eos_token_id`` (an id or list; None or []: never, not the model's own EOS). KV cache as
    :func:`exact_with_cache` says. Raises PosencError for bad settings (``posenc.model.check_sampling``: the seed
    too, an ``eos_token_id`` that is not ids) or an empty prompt, and as the adaptation's forward does.
    """
    from transformers import GenerationConfig  # optional dependency (posenc[pretrained])

    from posenc.hf.sink_cache import sink_cache  # imports transformers

    check_sampling(max_new_tokens, temperature, top_k, seed, adapted.model.config.vocab_size)
    stop = _stop_ids(eos_token_id)
    if ids.dim() != 1 or ids.numel() == 0:
        raise PosencError(f"the prompt must be one non-empty row of token ids, got shape {tuple(ids.shape)}")
    if max_new_tokens == 0:
        return ids
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": top_k or 0, "top_p": 1.0}
        if temperature
        else {"do_sample": False}
    )
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        eos_token_id=stop,  # a list, never None: transformers replaces None by the model's own EOS
        pad_token_id=stop[0] if stop else 0,
        use_cache=exact_with_cache(adapted, ids.numel() + max_new_tokens),
        **sampling,
    )
    adapted.reset_rotary()  # dynamic NTK's frequencies of an earlier, longer forward
    if seed is not None:
        torch.manual_seed(seed)
    x = ids[None].to(next(adapted.model.parameters()).device)
    bounded = adapted.method is not None and adapted.method.bounded  # sinks: the evicted keys leave the cache
    cache = {_cache_keyword(): sink_cache(adapted.model, adapted.method)} if bounded else {}
    return adapted.model.generate(x, attention_mask=torch.ones_like(x), generation_config=config, **cache)[0].cpu()


CACHE_KEYWORD_SINCE = "5.25"  # the first transformers tested to take generate(cache=...)


def _cache_keyword() -> str:
    """The keyword transformers' ``generate`` takes a cache by: ``cache`` from :data:`CACHE_KEYWORD_SINCE` on (there
    ``past_key_values`` is deprecated: a FutureWarning on every ``posenc generate --method sinks``), else
    ``past_key_values``."""
    import transformers  # optional dependency (posenc[pretrained]), and packaging one of its own
    from packaging.version import Version

    return "cache" if Version(transformers.__version__) >= Version(CACHE_KEYWORD_SINCE) else "past_key_values"


def _stop_ids(eos_token_id) -> list[int]:
    """``eos_token_id`` (None, an id or a list of ids) as the list of ids that stop generation (empty: never);
    PosencError (one line) for anything else."""
    ids = [] if eos_token_id is None else eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise PosencError(f"eos_token_id must be None, a token id >= 0 or a list of them, got {eos_token_id!r}")
    return list(ids)


@torch.inference_mode()
def greedy_reference(model, ids: torch.Tensor, max_new_tokens: int, eos_token_id=None) -> torch.Tensor:
    """Greedy decoding by full recomputation: each new token is the argmax of a forward of the whole sequence
    so far, no cache. ids (T,) int64 -> (T + n,), stopping after an ``eos_token_id`` (an id or list). The
    reference :func:`generate` is tested against; O(n T) forwards, tests only."""
    stop = set(eos_token_id if isinstance(eos_token_id, list) else [] if eos_token_id is None else [eos_token_id])
    out = ids.clone()
    for _ in range(max_new_tokens):
        nxt = model(out[None], use_cache=False).logits[0, -1].argmax()
        out = torch.cat((out, nxt[None]))
        if int(nxt) in stop:
            break
    return out
