"""Models by factory, the way Hydra instantiates any object: ``model._target_`` names a callable
that returns an ``nn.Module`` (perflab's, torchvision's, timm's or the user's own), the keys
added beside it are its arguments, and what the data decides (``num_classes``,
``in_channels``, ``vocab_size``, ``seq_len``) reaches a factory that takes it by that name.
Training, inference and generation build their models here (perflab.train.models until 0.4.0).

perflab's own factories (``lenet``, ``resnet18``, ``mlp``, ``torchvision``, ``timm``, ``gpt2``, ``hf`` ...) are
listed in docs/models-and-data.md, each described at its definition.

Everything a user's factory can get wrong is answered before the timed loop, in one line
(:func:`check`): a target that does not import, an argument it does not take, an output that
does not fit the data (a dry forward on a small batch).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from perflab.config.schema import ModelConfig
from perflab.errors import ConfigError, did_you_mean, first_line, paragraph
from perflab.train.objectives import AUX_WEIGHTS, main_and_aux  # noqa: F401  (perflab.models.main_and_aux too)


def lenet(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(800, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


class Residual(nn.Module):
    """Two 3x3 convs with batch norm and a shortcut (1x1 conv when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm2d(out_channels), nn.BatchNorm2d(out_channels)
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride=stride)
            if stride != 1 or in_channels != out_channels
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


def resnet18(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    def stage(cin: int, cout: int, first: bool) -> nn.Sequential:
        return nn.Sequential(Residual(cin, cout, stride=1 if first else 2), Residual(cout, cout))

    return nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        stage(64, 64, True),
        stage(64, 128, False),
        stage(128, 256, False),
        stage(256, 512, False),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(512, num_classes),
    )


def resnet18_tv(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    import torchvision

    net = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


def mlp(num_classes: int = 2) -> nn.Module:
    """The book's network for hybridization (13.1): 512 -> 256 -> 128 -> 2."""
    return nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, num_classes))


def torchvision(arch: str, num_classes: int = 1000, in_channels: int = 3, **kwargs: Any) -> nn.Module:
    """torchvision's classification or semantic segmentation model ``arch`` (no weights, its
    backbone's neither), its first convolution fitted to ``in_channels`` where the data has
    other than 3."""
    import torchvision as tv

    segmentation = tv.models.list_models(module=tv.models.segmentation)
    known = tv.models.list_models(module=tv.models) + segmentation
    if arch not in known:
        raise ConfigError(
            "model.arch",
            arch,
            "a classification or segmentation model of torchvision.models (torchvision.models.list_models())",
            problem=f"not one of torchvision's{did_you_mean(arch, known)}",
        )
    if arch in segmentation:
        kwargs = {"weights_backbone": None, **kwargs}  # else its backbone's ImageNet weights are downloaded
    net = tv.models.get_model(arch, weights=None, num_classes=num_classes, **kwargs)
    if in_channels != 3:
        _refit_first_conv(net, in_channels)
    return net


def timm(arch: str, num_classes: int = 1000, in_channels: int = 3, **kwargs: Any) -> nn.Module:
    """timm's model ``arch`` (``pip install 'perflab[timm]'``), no pretrained weights."""
    try:
        import timm as timm_lib
    except ImportError:
        raise ConfigError(
            "model", "timm", "pip install 'perflab[timm]' first, or another model", problem="timm is not installed"
        ) from None
    if not timm_lib.is_model(arch):
        raise ConfigError(
            "model.arch",
            arch,
            "a model of timm.list_models()",
            problem=f"not one of timm's{did_you_mean(arch, timm_lib.list_models())}",
        )
    return timm_lib.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_channels, **kwargs)


def hf(name: str | None = None, config: Any = None, task: str = "auto") -> nn.Module:
    """A Hugging Face model as it comes (``pip install 'perflab[hf]'``): ``model.name``, a
    local folder or a hub id, or ``model.config.*``, random weights from a config class;
    its inputs come from its config (perflab.models.huggingface)."""
    from perflab.models import huggingface as hf_models

    return hf_models.build(name, config, task)


def gpt2(
    vocab_size: int = 256, n_layer: int = 2, n_embd: int = 128, n_head: int = 4, n_positions: int = 1024
) -> nn.Module:
    """A small GPT-2 of transformers with random weights (``pip install 'perflab[hf]'``), its
    vocabulary the data's: the generate experiment's default model."""
    from perflab.models import huggingface as hf_models

    config = {"model_type": "gpt2", "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head}
    ends = {"bos_token_id": 0, "eos_token_id": 0}  # inside the vocabulary, whatever its size
    return hf_models.build(config={**config, "vocab_size": vocab_size, "n_positions": n_positions, **ends})


def expects(cfg: ModelConfig) -> dict[str, Any]:
    """What a model says of its data before it is built, by the data's keys: the input size
    timm's ``pretrained_cfg`` names, or torchvision's weights' transforms crop to (``shape``);
    what a Hugging Face config says (perflab.models.huggingface.expects). Empty for a model
    that says nothing (perflab's own, a user's): the data's defaults then."""
    name = cfg._target_.rpartition(".")[2] if cfg._target_.rpartition(".")[0] == "perflab.models" else ""
    if name == "hf":
        from perflab.models import huggingface as hf_models

        return hf_models.expects(cfg.name, cfg.config)
    if name == "timm" and cfg.arch:
        try:
            import timm as timm_lib
        except ImportError:
            return {}
        own = timm_lib.get_pretrained_cfg(cfg.arch) if timm_lib.is_model(cfg.arch) else None
        size = cfg.args.get("img_size") or (own.input_size[1:] if own and own.input_size else None)
        return {"shape": [3, *([size] * 2 if isinstance(size, int) else size)]} if size else {}
    if name == "torchvision" and cfg.arch:
        import torchvision as tv

        try:
            weights = list(tv.models.get_model_weights(cfg.arch))
        except (KeyError, ValueError):
            return {}
        said = weights[0].transforms.keywords if weights else {}  # type: ignore[attr-defined]
        crop = said.get("crop_size") or said.get("resize_size")  # a segmentation model's: its resize
        return {"shape": [3, crop, crop]} if crop else {}
    return {}


def fitted_data(cfg: ModelConfig, data_cfg: Any) -> Any:
    """The data config with each key the user left null filled from the model, else by default."""
    from perflab.train import data

    return data.fitted(data_cfg, expects(cfg))


def _refit_first_conv(net: nn.Module, in_channels: int) -> None:
    """Replace the first 3-channel convolution by one that takes ``in_channels``."""
    for parent in net.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3:
                conv = nn.Conv2d(
                    in_channels,
                    child.out_channels,
                    kernel_size=child.kernel_size,  # type: ignore[arg-type]
                    stride=child.stride,  # type: ignore[arg-type]
                    padding=child.padding,  # type: ignore[arg-type]
                    bias=child.bias is not None,
                )
                setattr(parent, name, conv)
                return


# --- any factory, Hydra's way ---------------------------------------------------------------

TARGET_ALLOWED = "a callable's dotted path, pkg.module.Name, that returns an nn.Module"
NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)  # arguments taken by name


def locate(target: str) -> Callable[..., Any]:
    """The callable at a dotted path; one line naming it (with a did-you-mean) if it is not there."""
    key = "model._target_"
    parts = target.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(key, target, TARGET_ALLOWED, problem="not a dotted path")
    module, depth = None, 0
    for depth in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        name = ".".join(parts[:depth])
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as err:
            if err.name and not (name == err.name or name.startswith(err.name + ".")):
                problem = f"importing {name} failed: ModuleNotFoundError: {first_line(err)}"
                raise ConfigError(key, target, TARGET_ALLOWED, problem=problem) from None
        except Exception as err:  # the user's module raised while importing
            problem = f"importing {name} failed: {type(err).__name__}: {first_line(err)}"
            raise ConfigError(key, target, TARGET_ALLOWED, problem=problem) from None
    if module is None:
        problem = f"no module named {parts[0]} (is its package installed in this environment?)"
        raise ConfigError(key, target, TARGET_ALLOWED, problem=problem)
    obj: Any = module
    for i, attr in enumerate(parts[depth:], start=depth):
        if not hasattr(obj, attr):
            where = ".".join(parts[:i])
            names = [n for n in dir(obj) if not n.startswith("_")]
            if hasattr(obj, "__path__"):  # a package: its modules too
                names += [m.name for m in pkgutil.iter_modules(obj.__path__)]
            hint = did_you_mean(attr, names, prefix=f"{where}.")
            raise ConfigError(key, target, TARGET_ALLOWED, problem=f"{where} has no {attr}{hint}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise ConfigError(key, target, TARGET_ALLOWED, problem=f"it is a {type(obj).__name__}, not a callable")
    return obj  # type: ignore[no-any-return]


def arguments(cfg: ModelConfig, data: Any) -> dict[str, Any]:
    """The factory's arguments: ``model.arch`` for torchvision's and timm's, the user's own
    (``+model.width=16``), and what the data decides for each name the factory takes (never
    through its ``**kwargs``). An argument it does not take, or one that the data decides, is
    one line."""
    params = _parameters(locate(cfg._target_))
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in NAMED]
    decided = data.factory_args()
    for key, value in cfg.args.items():
        if key in decided:
            raise ConfigError(
                f"model.{key}",
                value,
                f"leave it out, and set {DATA_KEYS.get(key, 'the data')} instead",
                problem=f"the data decides {key} ({decided[key]} here)",
            )
        if key not in named and not takes_any:
            hint = did_you_mean(key, [*named, "arch", "init", "channels_last"])
            raise ConfigError(
                f"model.{key}",
                value,
                f"the arguments {cfg.label} takes: {', '.join(named) or 'none'}",
                problem=f"{cfg.label} takes no argument {key}{hint}",
            )
    args = {k: v for k, v in decided.items() if k in named}
    if "arch" in named and cfg.arch is not None:  # model=torchvision / model=timm
        args["arch"] = cfg.arch
    given = {"name": cfg.name, "config": {k: v for k, v in cfg.config.items() if v is not None}, "task": cfg.task}
    for key, value in given.items():  # model=hf's keys: for a factory that takes them
        if not value:
            continue
        if key not in named:
            by_arch = key == "name" and "arch" in named  # model=timm model.name=resnet10t: its name is arch
            allowed = "model=hf (a Hugging Face model), or leave it out"
            raise ConfigError(
                f"model.{key}",
                value,
                f"model.arch={value} (its models by name)" if by_arch else allowed,
                problem=f"{cfg._target_.rsplit('.', 1)[-1]} takes no {key}",
            )
        args[key] = value
    return {**args, **cfg.args}


# Where a user sets what the data decides.
DATA_KEYS = {
    "num_classes": "data.num_classes",
    "in_channels": "data.shape",
    "vocab_size": "data.vocab_size",
    "seq_len": "data.seq_len",
}
# Which data decides it (perflab.train.data.Spec.factory_args).
DECIDED_BY = {
    "num_classes": "image data (data=synthetic, fashion_mnist, torchvision)",
    "in_channels": "image data (data=synthetic, fashion_mnist, torchvision)",
    "vocab_size": "data=tokens",
    "seq_len": "data=tokens",
}


def _needs(label: str, lacking: list[str], decided: dict[str, Any]) -> str:
    """What a factory needs that nothing here gives, beside what this data does give."""
    gives = ", ".join(decided) or "nothing"
    return f"{label} needs {', '.join(lacking)}, which this data does not decide (it decides {gives})"


def _supplied(lacking: list[str]) -> str:
    """Where each argument a factory needs can come from: the data that decides it, or by hand."""
    by_data: dict[str, list[str]] = {}
    for name in lacking:
        if name in DECIDED_BY:
            by_data.setdefault(DECIDED_BY[name], []).append(name)
    ways = [f"{data}, which decides {', '.join(names)}" for data, names in by_data.items()]
    return "; or ".join([*ways, "each given by hand: " + " ".join(f"+model.{n}=..." for n in lacking)])


def _parameters(factory: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # no signature to read: take the arguments as given
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}


def build(cfg: ModelConfig, data: Any) -> nn.Module:
    """The model on the CPU with its weights initialized (seed the RNG first for repeatability),
    instantiated by ``hydra.utils.instantiate`` as Hydra builds any ``_target_``. A factory
    that fails to build is one line."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from perflab.measure import memory

    args = arguments(cfg, data)
    try:
        net = instantiate({"_target_": cfg._target_, "_convert_": "all", **args})
    except Exception as err:
        cause: BaseException = err
        while cause.__cause__ is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__  # Hydra wraps what the factory raised
        if isinstance(cause, (ConfigError, memory.WillNotFit)):  # a refusal, or an oom row predicted
            raise cause from None
        if isinstance(cause, InstantiationException) and cause.__cause__ is None:  # Hydra refused the target itself
            problem = f"Hydra refuses it: {paragraph(cause).rstrip('.')}"
            raise ConfigError("model._target_", cfg._target_, TARGET_ALLOWED, problem=problem) from None
        params = _parameters(locate(cfg._target_))
        lacking = [n for n, p in params.items() if p.default is p.empty and p.kind in NAMED and n not in args]
        if isinstance(cause, TypeError) and lacking:  # its own words say nothing of where a value comes from
            problem = _needs(cfg.label, lacking, data.factory_args())
            raise ConfigError("model._target_", cfg._target_, _supplied(lacking), problem=problem) from None
        raise ConfigError(
            "model._target_",
            cfg._target_,
            "a factory that builds with " + (", ".join(f"{k}={v}" for k, v in args.items()) or "no arguments"),
            problem=f"building it failed: {type(cause).__name__}: {first_line(cause)}",
        ) from None
    if not isinstance(net, nn.Module):
        raise ConfigError(
            "model._target_",
            cfg._target_,
            "a factory that returns an nn.Module",
            problem=f"it returned {type(net).__name__}",
        )
    from perflab.models import huggingface as hf_models

    if hf_models.is_hf(net):  # its output an object: called through the one place that unwraps it
        net = hf_models.Unwrapped(net)
    _materialize(cfg, net, data)
    if cfg.init != "default":
        net.apply(_book_normal if cfg.init == "book_normal" else _xavier)
    return net


def _materialize(cfg: ModelConfig, net: nn.Module, data: Any) -> None:
    """Shape a model's lazy parameters (``nn.LazyLinear``'s, sized by their first input) with one
    forward of two of the data's inputs (eval mode, no gradients), so that whatever reads them
    next (a parameter count, a copy, an optimizer, an init) finds them made. One line where
    that input does not fit."""
    if not any(nn.parameter.is_lazy(p) for p in net.parameters()):
        return
    x = data.example(2)
    training = net.training
    try:
        with torch.no_grad():
            net.eval()(x)
    except Exception as err:
        raise ConfigError(
            "model",
            cfg.label,
            f"a model that takes {data.describe()}",
            problem=f"its lazy modules are shaped by a first input, and it fails on {tuple(x.shape)}: "
            f"{type(err).__name__}: {first_line(err)}",
        ) from None
    net.train(training)


def check(cfg: ModelConfig, data: Any, batch: int = 2, train: bool = False) -> nn.Module:
    """Build the model and run it once on a small batch of the data's shape (eval mode, no
    gradients, on the CPU; ``train``: in train mode too, where aux heads answer, through the
    objective it trains on: perflab.train.objectives): a model that does not take the data, or
    whose output does not fit it, is one line with both shapes, before anything is timed.
    Returns the model."""
    from perflab.models import huggingface as hf_models
    from perflab.train import objectives

    net = build(cfg, data)
    misfit = hf_models.misfit(net, data)
    if misfit is not None:
        key, value, allowed, problem = misfit
        raise ConfigError(key, value, allowed, problem=f"{problem} ({cfg.label})")
    objective = (
        objectives.of(net, data) if train else objectives.SEGMENTS if objectives.segments(net) else objectives.CLASSES
    )
    x, y = objective.example(data, batch)
    for mode in ("", " in train mode") if train else ("",):  # eval mode first, as inference runs
        try:
            with torch.no_grad():
                net.train(bool(mode))
                if objective.plain:
                    out = net(x)
                elif mode:  # scores not of the data's shape (a CTC head's frames): its loss is formed
                    objective.loss(net, x, y)
                else:
                    objective.right(net, x, y)
        except Exception as err:
            own = expects(cfg).get("shape")  # timm's, torchvision's: the input size it was made for
            shape = f" (data.shape={list(own)} for this one)" if own and list(own) != list(data.shape) else ""
            raise ConfigError(
                "model",
                cfg.label,
                f"a model that takes {data.describe()}, or data of the shape it takes{shape}",
                problem=f"it fails on the data's input {tuple(x.shape)}{mode}: {type(err).__name__}: {first_line(err)}",
            ) from None
        if objective.plain:
            _fits(cfg, data, x, out, mode)
    return net.train()


def _fits(cfg: ModelConfig, data: Any, x: torch.Tensor, out: Any, mode: str = "") -> None:
    """One line where the output (its main scores, and each aux head's) does not fit the data."""
    out, aux = main_and_aux(out)
    want = data.output_shape(len(x))
    for scores in [out, *(a for _, a in aux)]:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else f"a {type(scores).__name__}"
        if got != want:
            kind = "(B, seq_len, vocab_size) logits" if data.tokens else "(B, num_classes) scores"
            raise ConfigError(
                "model",
                cfg.label,
                f"a model whose output is {want}, {kind}, for an input {tuple(x.shape)}",
                problem=f"its output{mode} {got} does not fit the data (input {tuple(x.shape)}, output {want})",
            )


def _book_normal(m: nn.Module) -> None:
    """The book's N(0, 0.01) weights and zero biases for conv and linear layers."""
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.normal_(m.weight, std=0.01)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def _xavier(m: nn.Module) -> None:
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def strip_prefix(key: str) -> str:
    for prefix in ("module.", "_orig_mod."):
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key
