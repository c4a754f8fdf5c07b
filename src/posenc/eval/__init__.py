"""Evaluation of a trained model: perplexity windows of a Hugging Face model (``perplexity``), task accuracy per
test, length and distance (``tasks``), passkey retrieval (``passkey``), and far attention mass, entropy and
spectral gaps (``diagnose``). On the layers below (core, ``store``, ``data``)."""
