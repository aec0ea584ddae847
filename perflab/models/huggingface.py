"""Hugging Face models as they come: by name (a local folder written by ``save_pretrained``, or
a hub id), or with random weights from a config class, and any ``transformers`` model a
``_target_`` builds.

Their outputs are objects (``CausalLMOutputWithPast`` ...), not tensors: :class:`Unwrapped`
holds the model and returns its ``.logits`` (else its first tensor) -- the one place an HF
output becomes the tensor perflab's loops, checks and FLOP counts take. Their inputs come from
their config (:func:`input_spec`): token ids of its vocabulary, images of its size.

transformers is imported inside functions: perflab runs without it (``pip install 'perflab[hf]'``).
"""

from __future__ import annotations

import os
import re
from typing import Any, NoReturn

import torch
from torch import nn

from perflab.errors import ConfigError, did_you_mean, first_line

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "gpt2", "org/name"
TASKS = ("auto", "causal-lm", "seq2seq-lm", "image-classification", "sequence-classification", "base")
NAME_ALLOWED = "a folder written by save_pretrained, or a hub id already in the Hugging Face cache"
CONFIG_ALLOWED = (
    "model.config.model_type=NAME (a transformers model type, e.g. gpt2) with its keys "
    "(+model.config.n_layer=2), or +model.config._target_=transformers.GPT2Config"
)


def is_hf(net: Any) -> bool:
    """A model of the transformers library (its outputs are objects; its config says its inputs)."""
    return type(net).__module__.startswith("transformers.") and hasattr(net, "config")


def unwrap(out: Any) -> Any:
    """An HF output as a tensor: its ``logits`` (scores), else its first tensor (a base model's
    hidden states); anything else as it is."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple"):
        first = next((t for t in (out.to_tuple() if hasattr(out, "to_tuple") else out) if torch.is_tensor(t)), None)
        if first is not None:
            return first
    return out


class Unwrapped(nn.Module):
    """An HF model called as perflab calls every model, ``model(x) -> tensor``: ``x`` goes in
    as its main input (``input_ids`` / ``pixel_values``, its first argument), without a KV
    cache (a training or forward pass keeps none), and its output comes back as a tensor.

    An encoder-decoder (T5, BART) gets ``x`` on both sides: its decoder reads ``x`` shifted
    right behind its ``decoder_start_token_id``, what BART does by itself and T5 refuses to
    guess ("You must specify exactly one of input_ids or inputs_embeds"); one that encodes
    audio features (Whisper) decodes its start token. A two-tower model (CLIP) gets ``x`` as
    its images and text of its config (:func:`text_ids`).

    A training objective's own inputs (``labels``, a two-tower model's ``input_ids`` and
    ``return_loss``: perflab.train.objectives) go in by name beside ``x``, and the model's whole
    output comes back: its loss and every score it made."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        import inspect

        takes = inspect.signature(inner.forward).parameters
        self.kwargs = {"use_cache": False} if "use_cache" in takes else {}
        cfg = getattr(inner, "config", None)
        both = getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in takes
        start = getattr(cfg, "decoder_start_token_id", None) if both else None
        self.decoder_start = start if isinstance(start, int) else None
        self.two_towers = cfg is not None and kind(inner) == "images and text"

    @property
    def config(self) -> Any:
        return self.inner.config  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor, **given: Any) -> Any:
        if given:
            main = "pixel_values" if self.two_towers else getattr(self.inner, "main_input_name", "input_ids")
            return self.inner(**{main: x}, **given, **self.kwargs)
        if self.two_towers:  # the images in x, the text made beside them
            ids = text_ids(self.config, len(x), x.device)
            return unwrap(self.inner(input_ids=ids, pixel_values=x, **self.kwargs))
        if self.decoder_start is None:
            return unwrap(self.inner(x, **self.kwargs))
        start = torch.full((len(x), 1), self.decoder_start, dtype=torch.long, device=x.device)
        if x.is_floating_point():  # audio features in (Whisper): the decoder's first step, its start token
            return unwrap(self.inner(x, decoder_input_ids=start, **self.kwargs))
        shifted = torch.cat([start, x[:, :-1]], dim=1)
        return unwrap(self.inner(x, decoder_input_ids=shifted, **self.kwargs))


def build(name: str | None = None, config: Any = None, task: str = "auto") -> nn.Module:
    """``name``: a local folder (``from_pretrained(..., local_files_only=True)``) or a hub id
    (from the cache; downloaded only where the hub can be reached and ``HF_HUB_OFFLINE`` is not
    set); ``config``: random weights from a config (``{"model_type": "gpt2", "n_layer": 2}``
    through ``AutoConfig.for_model``, or a ``PretrainedConfig`` Hydra built from a ``_target_``).
    Every mistake is one line, before anything is timed."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "model", "hf", "pip install 'perflab[hf]' first, or another model", problem="transformers is not installed"
        ) from None
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars: not perflab's output
    if task not in TASKS:
        raise ConfigError("model.task", task, ", ".join(TASKS))
    given = {k: v for k, v in (config or {}).items() if v is not None} if isinstance(config, dict) else config
    if bool(name) == bool(given):
        raise ConfigError(
            "model.name",
            name,
            f"{NAME_ALLOWED}; or, for random weights, leave it out and give {CONFIG_ALLOWED}",
            problem="give model.name or model.config, one of them" if name else "neither model.name nor model.config",
        )
    if name:
        cfg, local = _config_of(str(name))
    else:
        cfg, local = _config_from(given), True
        _refuse_unknown_keys(cfg, given)
    _refuse_sizes(cfg, name)
    model_class = _model_class(transformers, cfg, task, bool(name))
    if not name:
        _check_on_meta(model_class, cfg, given)
    try:
        if name:
            net = model_class.from_pretrained(str(name), local_files_only=local)
        else:
            net = model_class.from_config(cfg)
    except Exception as err:  # a folder without weights, a class that does not fit the config ...
        key, value = ("model.name", name) if name else ("model.config", dict(given) if isinstance(given, dict) else cfg)
        problem = f"building {model_class.__name__} failed: {type(err).__name__}: {first_line(err)}"
        raise ConfigError(key, value, f"{NAME_ALLOWED}" if name else CONFIG_ALLOWED, problem=problem) from None
    return net  # type: ignore[no-any-return]


def _config_of(name: str) -> tuple[Any, bool]:
    """The config of a folder or a hub id, and whether it is read locally only."""
    from transformers import AutoConfig

    path = os.path.expanduser(name)
    folder = is_folder(name)
    looks_like_path = name.startswith(("/", ".", "~")) or not HUB_ID.match(name)
    if not folder and looks_like_path:
        raise ConfigError("model.name", name, NAME_ALLOWED, problem="no such folder")
    if folder and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError("model.name", name, NAME_ALLOWED, problem="the folder has no config.json")
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or folder
    attempts = [True] if offline else [True, False]  # the cache first; then the hub, where allowed
    last: Exception | None = None
    unreachable = ""
    for local in attempts:
        if not local and not hub_reachable():  # else huggingface_hub retries for half a minute
            unreachable = f", and the hub ({_endpoint()}) cannot be reached"
            break
        try:
            return AutoConfig.from_pretrained(path if folder else name, local_files_only=local), local
        except Exception as err:  # not a model folder, not in the cache, no network
            last = err
    where = "its config.json cannot be read" if folder else "not a local folder, and not in the Hugging Face cache"
    if unreachable:
        raise ConfigError("model.name", name, NAME_ALLOWED, problem=where + unreachable)
    problem = f"{where} ({type(last).__name__}: {first_line(last)})" if last else where
    raise ConfigError("model.name", name, NAME_ALLOWED, problem=problem)


def is_folder(name: str) -> bool:
    """Whether ``model.name`` names a local folder (``~`` expanded), not a hub id."""
    return os.path.isdir(os.path.expanduser(name))


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub's host takes a connection now (through a proxy, where one is set: then
    huggingface_hub is left to find out). One try, ``timeout_s`` at most."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlsplit(_endpoint())
    try:
        socket.create_connection(
            (url.hostname or "", url.port or (80 if url.scheme == "http" else 443)), timeout_s
        ).close()
    except OSError:
        return False
    return True


def _config_from(given: Any) -> Any:
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(given, PretrainedConfig):
        return given
    kwargs = dict(given)
    model_type = kwargs.pop("model_type", None)
    if not model_type:
        raise ConfigError("model.config", kwargs, CONFIG_ALLOWED, problem="no model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if str(model_type) not in CONFIG_MAPPING_NAMES:
        hint = did_you_mean(model_type, CONFIG_MAPPING_NAMES)
        raise ConfigError(
            "model.config.model_type",
            model_type,
            "a model type of transformers (transformers.CONFIG_MAPPING)",
            problem=f"not a model type of transformers{hint}",
        )
    try:
        return AutoConfig.for_model(str(model_type), **kwargs)
    except Exception as err:  # a value its config class refuses (n_layer=abc)
        what = f"{CONFIG_MAPPING_NAMES[str(model_type)]} refuses it"
        retry = lambda kw: AutoConfig.for_model(str(model_type), **kw)  # noqa: E731
        _refuse_value({"model_type": model_type, **kwargs}, err, retry, what)


def _refuse_unknown_keys(cfg: Any, given: Any) -> None:
    """A key the config class does not know is one line: HF config classes keep any keyword as a
    bare attribute, so ``hidden_sizee=64`` would build a default-sized model. Unknown: stored as
    given yet no attribute of a default instance (``num_labels``, ``rope_theta`` are used, not kept)."""
    try:
        default = type(cfg)()
    except Exception:  # a composite config (EncoderDecoderConfig) has no default to compare with
        return
    from transformers import GenerationConfig

    generation = GenerationConfig()  # its keys are a model config's too (decoder_start_token_id: T5's generate)
    keys = list(given) if isinstance(given, dict) else [k for k in vars(cfg) if not k.startswith("_")]
    for key in keys:
        if key in vars(cfg) and not hasattr(default, key) and not hasattr(generation, key):
            value = given[key] if isinstance(given, dict) else getattr(cfg, key)
            own = _own_keys(type(cfg))
            known = [*own, *getattr(cfg, "attribute_map", {}), *(k for k in vars(default) if not k.startswith("_"))]
            hint = did_you_mean(key, known, prefix="model.config.")
            raise ConfigError(
                f"model.config.{key}",
                value,
                f"the keys {type(cfg).__name__} takes: {', '.join(own)}, or one of transformers.PretrainedConfig's",
                problem=f"{type(cfg).__name__} has no key {key}{hint}",
            )


# A model's sizes, as configs name them: each at least 1 (n_layer=-1 builds a model of no layers).
SIZES: tuple[str, ...] = (
    *("n_layer", "num_hidden_layers", "n_head", "num_attention_heads", "n_embd", "hidden_size"),
    *("n_positions", "max_position_embeddings", "vocab_size", "intermediate_size"),
)


def _refuse_sizes(cfg: Any, name: str | None) -> None:
    """A size below 1 in the model's config (given, or a folder's config.json) is one line: HF
    builds ``range(n_layer)`` layers, so ``n_layer=-1`` would be measured as a model of none."""
    for key in SIZES:
        value = getattr(cfg, key, None)  # through the config's attribute_map (num_hidden_layers: n_layer)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            if name:
                problem = f"its config.json sets {key}={value}, a size below 1"
                raise ConfigError("model.name", name, NAME_ALLOWED, problem=problem)
            raise ConfigError(f"model.config.{key}", value, "an integer >= 1", problem="a size of the model")


def _own_keys(config_class: Any) -> list[str]:
    """The keys a config class takes beyond those every PretrainedConfig takes."""
    import inspect

    from transformers import PretrainedConfig

    common = set(inspect.signature(PretrainedConfig.__init__).parameters)
    return [k for k in inspect.signature(config_class.__init__).parameters if k not in common and k != "kwargs"]


def _check_on_meta(model_class: Any, cfg: Any, given: Any) -> None:
    """Build the model on the meta device (no memory, no init): a value that cannot make a model
    (``hidden_size=-3``) is one line naming its key, and weights larger than the host's free memory
    are an ``oom`` row predicted before anything is allocated."""

    def on_meta(config: Any) -> nn.Module:
        with torch.device("meta"):
            return model_class.from_config(config)  # type: ignore[no-any-return]

    try:
        net = on_meta(cfg)
    except Exception as err:
        if isinstance(given, dict):
            model_type = given["model_type"]

            def rebuilt(kw: dict[str, Any]) -> Any:
                from transformers import AutoConfig

                return on_meta(AutoConfig.for_model(str(model_type), **kw))

            _refuse_value(given, err, rebuilt, f"building {model_class.__name__} failed")
        problem = f"building {model_class.__name__} failed: {type(err).__name__}: {first_line(err)}"
        raise ConfigError("model.config", cfg.to_diff_dict(), CONFIG_ALLOWED, problem=problem) from None
    from perflab.measure import memory
    from perflab.measure.devices import Device

    size = sum(t.numel() * t.element_size() for t in (*net.parameters(), *net.buffers()))
    memory.require([Device("cpu", "cpu")], size, f"{model_class.__name__}'s weights ({type(cfg).__name__})")


def _refuse_value(given: dict[str, Any], err: Exception, builds: Any, what: str) -> NoReturn:
    """One line naming the key whose value failed (the one without which ``builds`` succeeds), its
    value and its default; or naming all of ``model.config`` where no one key is to blame."""
    kwargs = {k: v for k, v in given.items() if k != "model_type"}
    reason = err.__cause__ if isinstance(err.__cause__, Exception) else err  # a validation error's own words
    problem = f"{what}: {type(reason).__name__}: {first_line(reason)}"
    for key, value in kwargs.items():
        try:
            builds({k: v for k, v in kwargs.items() if k != key})
        except Exception:
            continue
        from transformers import AutoConfig

        default = getattr(AutoConfig.for_model(str(given["model_type"])), key, None)
        allowed = f"a value the config takes for {key} (its default: {default})"
        raise ConfigError(f"model.config.{key}", value, allowed, problem=problem) from None
    raise ConfigError("model.config", given, CONFIG_ALLOWED, problem=problem) from None


def _model_class(transformers: Any, cfg: Any, task: str, named: bool) -> Any:
    """The class to build: the folder's own architecture (``config.architectures``), else the
    task's Auto class for this config: a causal LM where the config has one (an encoder such as
    BERT only when its config says ``is_decoder``), then an image classifier, a sequence
    classifier, the base model. ``seq2seq-lm`` (an encoder-decoder that generates) only when asked."""
    from transformers.models.auto import modeling_auto as auto

    by_task: dict[str, tuple[Any, Any]] = {
        "causal-lm": (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, transformers.AutoModelForCausalLM),
        "seq2seq-lm": (auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, transformers.AutoModelForSeq2SeqLM),
        "image-classification": (
            auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
            transformers.AutoModelForImageClassification,
        ),
        "sequence-classification": (
            auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
            transformers.AutoModelForSequenceClassification,
        ),
        "base": (auto.MODEL_MAPPING_NAMES, transformers.AutoModel),
    }
    if task == "auto":
        own = (getattr(cfg, "architectures", None) or [None])[0] if named else None
        if own and hasattr(transformers, own):
            return getattr(transformers, own)
        encoder = cfg.model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(cfg, "is_decoder", False)
        # seq2seq-lm only when asked: a random T5 or BART was a classifier, and its points keep their hash
        fits = [t for t, (names, _) in by_task.items() if cfg.model_type in names and t != "seq2seq-lm"]
        if encoder and "causal-lm" in fits:  # BERT and kin: a causal head is theirs only as a decoder
            fits.remove("causal-lm")
        task = fits[0] if fits else "base"
    names, auto_class = by_task[task]
    if cfg.model_type not in names:
        has = [t for t, (n, _) in by_task.items() if cfg.model_type in n]
        raise ConfigError(
            "model.task",
            task,
            f"a task {cfg.model_type} has a model for: {', '.join(['auto', *has])}",
            problem=f"{cfg.model_type} has no {task} model",
        )
    return auto_class


# --- what goes in: from the model's config ---------------------------------------------------


def max_positions(cfg: Any) -> int | None:
    """The longest sequence the model's position embeddings hold (None: no limit said)."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


IMAGE_SIZE = 224  # an image model whose config says no size (HF's ResNet, RegNet): ImageNet's, as its processor


def _image_size(cfg: Any) -> int | None:
    size = getattr(cfg, "image_size", None)
    return (size if isinstance(size, int) else size[0]) if size else None


SAMPLES = 16_000  # a waveform model's input: one second at 16 kHz, its feature extractors' rate
# What perflab makes for each kind of input (a model's main_input_name), as a refusal names them.
SUPPORTED = (
    "token ids (input_ids), images (pixel_values), audio features (input_features), "
    "waveforms (input_values), images with text (two towers: pixel_values and input_ids)"
)


def kind(inner: Any) -> str:
    """What an HF model takes, by its ``main_input_name`` and config: ``token ids``, ``images``,
    ``audio features``, ``waveforms``, ``images and text`` (two towers, CLIP's), else the name
    of an input perflab cannot make yet."""
    cfg = inner.config
    if _two_towers(cfg):
        return "images and text"
    main = getattr(inner, "main_input_name", "input_ids")
    named = {"input_ids": "token ids", "pixel_values": "images", "input_features": "audio features"}
    return {**named, "input_values": "waveforms"}.get(main, main)


def task(inner: Any) -> str:
    """The task of an HF model's head, from its class name, in words: ``object detection``
    (``YolosForObjectDetection``), ``CTC``, ``masked LM``; "" for a bare model (``CLIPModel``)."""
    head = type(inner).__name__.partition("For")[2]
    return " ".join(w if w.isupper() else w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]*", head))


def _two_towers(cfg: Any) -> bool:
    return hasattr(cfg, "text_config") and hasattr(cfg, "vision_config")


def _config_kind(cfg: Any) -> str:
    """What a model of this config takes, from the config alone (before a model is built, when
    its class is not known): :func:`kind`'s words, by the keys each kind's config has."""
    if _two_towers(cfg):
        return "images and text"
    if _audio_features(cfg) is not None:
        return "audio features"
    if getattr(cfg, "conv_dim", None) and getattr(cfg, "feat_extract_norm", None):  # Wav2Vec2's feature encoder
        return "waveforms"
    return "token ids or images"


def _audio_features(cfg: Any) -> tuple[int, int] | None:
    """The (mel bins, frames) Whisper's feature extractor makes (30 s: twice its encoder's
    positions), or Speech2Text's (frames, features); None where the config says neither."""
    if getattr(cfg, "num_mel_bins", None) and getattr(cfg, "max_source_positions", None):
        return cfg.num_mel_bins, 2 * cfg.max_source_positions
    if getattr(cfg, "input_feat_per_channel", None) and getattr(cfg, "max_source_positions", None):
        return cfg.max_source_positions, cfg.input_feat_per_channel * getattr(cfg, "input_channels", 1)
    return None


CAPTION = 77  # CLIP's text length: its positions, what its processor pads to


def text_length(cfg: Any) -> int:
    """A two-tower model's text length: its text config's positions (CLIP's processor pads to
    them), at most CLIP's 77 (a BERT or XLM-R text tower holds 512, the latter's last two
    positions taken by its padding offset)."""
    return min(max_positions(cfg.text_config) or 16, CAPTION)


def text_ids(cfg: Any, batch: int, device: Any) -> torch.Tensor:
    """A two-tower model's text: ``text_length`` token ids of its text config's vocabulary."""
    length = text_length(cfg)
    return torch.arange(length, device=device).remainder(cfg.text_config.vocab_size).expand(batch, length)


def input_spec(net: nn.Module, seq_len: int = 128) -> Any:
    """The inputs an HF model takes, from its config, as perflab's data ``Spec``: token ids of
    its vocabulary (``seq_len`` of them, at most its positions), images of its ``num_channels``
    x ``image_size`` with ``num_labels`` scores, audio features or a waveform, or a two-tower
    model's images (its text made beside them: ``text_ids``). None for a model that is not HF;
    a kind of input perflab cannot make is one line naming it."""

    inner: Any = getattr(net, "inner", net)
    if not is_hf(inner):
        return None
    return _spec(inner.config, kind(inner), seq_len, type(inner).__name__)


def _spec(cfg: Any, what: str, seq_len: int, name: str) -> Any:
    """The inputs a model of this config and kind takes (:func:`input_spec`)."""
    from perflab.train.data import Spec

    if what == "images and text":
        vision = cfg.vision_config
        size = _image_size(vision) or IMAGE_SIZE
        also = f"(B, {text_length(cfg)}) token ids < {cfg.text_config.vocab_size}"
        return Spec((getattr(vision, "num_channels", 3), size, size), 2, also=also)
    if what == "waveforms":
        return Spec((SAMPLES,), getattr(cfg, "vocab_size", None) or 2)
    if what == "audio features":
        features = _audio_features(cfg)
        if features is None:
            raise ConfigError("model", name, SUPPORTED, problem="its config says no feature size")
        return Spec(features, getattr(cfg, "vocab_size", None) or 2)
    if what not in ("token ids", "images", "token ids or images"):
        problem = f"{name} takes {what}, a kind of input perflab cannot make yet"
        raise ConfigError("model", name, SUPPORTED, problem=problem)
    return _tokens_or_images(cfg, seq_len)


def _tokens_or_images(cfg: Any, seq_len: int) -> Any:
    """Token ids of a config's vocabulary (``seq_len``, at most its positions), or images of its
    channels and size with its labels' scores; None where it says neither."""
    from perflab.train.data import Spec

    vocab = getattr(cfg, "vocab_size", None)
    if hasattr(cfg, "num_channels") and (getattr(cfg, "image_size", None) or not vocab):
        size = _image_size(cfg) or IMAGE_SIZE
        return Spec((cfg.num_channels, size, size), getattr(cfg, "num_labels", 2))
    if vocab:
        longest = max_positions(cfg)
        return Spec((min(seq_len, longest) if longest else seq_len,), vocab, tokens=True)
    return None


def expects(name: str | None = None, config: Any = None) -> dict[str, Any]:
    """What the model's config says of its data, before the model is built (perflab.train.data.fitted
    fills the keys the user left null from it): an image model's ``shape`` and ``num_classes``, a
    language model's ``vocab_size`` and ``positions``, a speech or two-tower model's ``shape``
    (its waveform, features or images; the classes of its synthetic transcripts or captions are
    the data's). Nothing where the config cannot be read (building the model says why, in one line)."""
    try:
        given = {k: v for k, v in (config or {}).items() if v is not None} if isinstance(config, dict) else config
        cfg = _config_of(str(name))[0] if name else _config_from(given) if given else None
        what = _config_kind(cfg) if cfg is not None else ""
        spec = _spec(cfg, what, 1, type(cfg).__name__) if cfg is not None else None
    except (ConfigError, ImportError):
        return {}
    if spec is None:
        return {}
    if spec.tokens:
        return {"vocab_size": spec.classes, "positions": max_positions(cfg)}
    if what != "token ids or images":
        return {"shape": list(spec.shape)}
    return {"shape": list(spec.shape), "num_classes": spec.classes}


def masked_lm(net: nn.Module) -> str | None:
    """The class of a masked-LM encoder (BERT's, DeBERTa's, ELECTRA's ... ``*ForMaskedLM``), else
    None: its attention is bidirectional, so on next-token data it sees the token it predicts."""
    from transformers.models.auto import modeling_auto as auto

    inner: Any = getattr(net, "inner", net)
    if not is_hf(inner) or any(getattr(inner.config, k, False) for k in ("is_encoder_decoder", "is_decoder")):
        return None
    name = type(inner).__name__
    return name if name in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.values() else None


def misfit(net: nn.Module, spec: Any) -> tuple[str, Any, str, str] | None:
    """Why the data cannot feed this HF model (key, value, allowed, problem), or None: its
    vocabulary, its positions, its image size and labels come from its config, not the data; a
    speech or two-tower model's input shape too (its targets are the data's classes, made into
    transcripts or captions: perflab.train.objectives)."""
    inner: Any = getattr(net, "inner", net)
    what = kind(inner) if is_hf(inner) else "token ids"
    want = input_spec(net, spec.shape[0] if spec.tokens else 128)
    if what in ("waveforms", "audio features", "images and text"):
        if spec.tokens:
            return "data", spec.describe(), "data=synthetic (its shape follows the model)", f"the model takes {what}"
        any_length = what == "waveforms" and len(spec.shape) == 1
        if tuple(spec.shape) != tuple(want.shape) and not any_length:
            return "data.shape", list(spec.shape), str(list(want.shape)), f"the model's config decides its {what}"
        return None
    if want is None:
        return None
    if want.tokens != spec.tokens:
        model = "a language model" if want.tokens else "an image model"
        allowed = "data=tokens (its vocabulary and positions follow the model)" if want.tokens else "data=synthetic"
        return "data", spec.describe(), allowed, f"the model is {model}"
    if spec.tokens:
        if spec.classes != want.classes:
            return (
                "data.vocab_size",
                spec.classes,
                f"{want.classes}, the model's vocabulary",
                "the model's config decides its vocabulary",
            )
        if want.shape[0] < spec.shape[0]:
            return "data.seq_len", spec.shape[0], f"at most {want.shape[0]}", "the model holds no more positions"
        return None
    sized = _image_size(getattr(net, "inner", net).config) is not None  # else any size, its channels only
    unsized_fits = len(spec.shape) == len(want.shape) and spec.shape[0] == want.shape[0]  # its channels, any H, W
    if tuple(spec.shape) != tuple(want.shape) and (sized or not unsized_fits):
        allowed = str(list(want.shape)) if sized else f"[{want.shape[0]}, H, W]"
        return (
            "data.shape",
            list(spec.shape),
            allowed,
            f"the model's config decides its {'image size' if sized else 'channels'}",
        )
    if spec.classes != want.classes:
        return "data.num_classes", spec.classes, f"{want.classes}, the model's num_labels", "its config decides them"
    return None
