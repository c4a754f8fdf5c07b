"""posenc: positional encodings and length extrapolation for decoder-only transformers."""

from posenc import encodings
from posenc.attention import attention
from posenc.errors import PosencError
from posenc.model import LM, ModelConfig, build_model

__all__ = ["LM", "ModelConfig", "PosencError", "attention", "build_model", "encodings"]
__version__ = "0.1.0"
