"""Training data: text corpora, tokenizers and token streams (``corpora``), and the synthetic tasks with a known
distance to the evidence (``tasks``). On the core and ``store``."""
