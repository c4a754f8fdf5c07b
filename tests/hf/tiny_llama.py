"""The tiny random Llama the Hugging Face tests build: 2 layers, width 64, 4 heads over 2 key/value heads (head dim
16), 128 ids."""

import torch
import transformers


def tiny_llama(seed: int, context: int, theta: float, **config) -> transformers.LlamaForCausalLM:
    """The model at ``seed`` (torch's global generator), native context ``context`` tokens, RoPE base ``theta``,
    other ``LlamaConfig`` keywords from ``config``; in eval mode."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=context,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        **config,
    )
    return transformers.LlamaForCausalLM(cfg).eval()
