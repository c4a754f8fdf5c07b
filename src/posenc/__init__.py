"""posenc: positional encodings and length extrapolation for decoder-only transformers."""

from posenc import encodings, hf
from posenc.attention import attention
from posenc.errors import PosencError
from posenc.layer import Attention, LayerCache, Prepared, attend, prepare
from posenc.model import LM, ModelConfig, build_model

__all__ = ["LM", "Attention", "LayerCache", "ModelConfig", "PosencError", "Prepared", "attend", "attention", "build_model", "encodings", "hf", "prepare"]
__version__ = "0.1.0"
