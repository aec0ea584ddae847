"""What a model trains to do, declared once for each kind of model and data: the targets a
split's labels become, the loss, what counts as right, and the name the row's ``objective``
column carries.

- ``cross-entropy over classes``: an image (or any) classifier; aux heads' losses added at
  their recipe's weight (:func:`main_and_aux`).
- ``next-token cross-entropy``: a causal LM, an encoder-decoder, on data=tokens.
- ``masked-token cross-entropy (15 % masked)``: a masked-LM encoder (BERT's kin) on data=tokens: 15 % of its
  tokens masked, scored on those alone (its attention sees every token, so next-token data
  would show it the token it predicts).
- ``CTC over synthetic transcripts``: a speech encoder with a CTC head (Wav2Vec2, HuBERT, WavLM ... ``*ForCTC``): each
  class of the synthetic waveforms is a synthetic transcript of its vocabulary.
- ``speech-to-text cross-entropy over synthetic transcripts``: an encoder-decoder of audio features (Whisper): the
  transcript is its decoder's labels, which it shifts behind its start token itself.
- ``per-pixel cross-entropy``: a semantic segmentation model (SegFormer's, BEiT's ...
  ``*ForSemanticSegmentation``; torchvision's DeepLabV3, FCN, LR-ASPP and their ``aux`` head):
  every pixel of an image of class c is of class c.
- ``contrastive (image-caption pairs)``: a two-tower model (CLIP's kin): each image with the caption of its class,
  the model's own loss (``return_loss=True``) where it has one.

Every loss is a sum over what it scores; ``count`` says how many that is (the mean's divisor),
and the right count is of the same things, so train loss and accuracy mean what they say.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from perflab.errors import ConfigError

IGNORE = -100  # a target scored by nothing (F.cross_entropy's ignore_index, HF's labels' padding)
MASKED = 0.15  # BERT's share of masked tokens
TRANSCRIPT = 16  # tokens of a synthetic transcript, at most


def correct(scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many items' target scores highest (a tie with another class counts as right; a target
    of IGNORE counts for nothing): one max-reduction and a gather, an order of magnitude cheaper
    than ``argmax`` over a language model's vocabulary on a CPU (1 ms of a 30 ms step for 2048
    tokens x 256 ids), the same for a classifier."""
    hit = scores.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1) >= scores.amax(-1)
    return (hit & (y != IGNORE)).sum()


# Train-mode outputs with auxiliary heads (torchvision's GoogLeNet and Inception-v3): the weight
# of each aux head's loss in the model's own recipe (GoogLeNet's paper: 0.3; Inception-v3's: 0.4).
AUX_WEIGHTS = {"GoogLeNetOutputs": 0.3, "InceptionOutputs": 0.4}


def main_and_aux(out: Any) -> tuple[Any, list[tuple[float, torch.Tensor]]]:
    """A model's output as its main scores and its aux heads' (weight, scores): a train-mode
    ``GoogLeNetOutputs(logits, aux_logits2, aux_logits1)`` trains its logits, the aux heads'
    losses added at their weight; any other output is the main one, with no aux heads."""
    weight = AUX_WEIGHTS.get(type(out).__name__)
    if weight is None:
        return out, []
    main, *aux = out  # a named tuple, the logits first
    return main, [(weight, a) for a in aux if isinstance(a, torch.Tensor)]


class Objective:
    """Cross-entropy of the model's scores against the data's labels (classes, or next tokens)."""

    name = "cross-entropy over classes"
    plain = True  # the model's output alone is scored: model(x) has the data's output shape
    also = ""  # inputs made beside the data's (a two-tower model's captions), as the row says them

    def prepare(self, x: torch.Tensor, y: torch.Tensor, seed: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A split's inputs and targets, made from the data's inputs and labels: as they are."""
        return x, y

    def count(self, y: torch.Tensor) -> Any:
        """How many targets a batch's loss sums over (an int, or a device tensor)."""
        return (y != IGNORE).sum() if y.dtype == torch.long and y.ndim > 1 else y.numel()

    def loss(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed loss and how many it got right, as device tensors (nothing read back)."""
        out, aux = main_and_aux(model(x))
        loss = F.cross_entropy(out.flatten(0, -2).float(), y.flatten(), reduction="sum")
        for weight, scores in aux:  # GoogLeNet's, Inception-v3's aux heads: added as their recipe does
            loss = loss + weight * F.cross_entropy(scores.flatten(0, -2).float(), y.flatten(), reduction="sum")
        return loss, correct(out.detach(), y)

    def right(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """How many an evaluation batch gets right (eval mode, no gradients)."""
        return correct(model(x), y)

    def example(self, spec: Any, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of the data's shape with its targets, as :meth:`prepare` makes them (on the CPU)."""
        y = torch.randint(0, spec.classes, (batch, *spec.shape) if spec.tokens else (batch,))
        return self.prepare(spec.example(batch), y, 0, 0)


CLASSES = Objective()


class NextToken(Objective):
    name = "next-token cross-entropy"


class MaskedTokens(Objective):
    """BERT's objective, its static form: each sequence's masked positions drawn once per split."""

    name = "masked-token cross-entropy (15 % masked)"

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def prepare(self, x: torch.Tensor, y: torch.Tensor, seed: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1000 + 7 + split)
        mask = torch.rand(x.shape, generator=g) < MASKED
        mask[:, 0] |= ~mask.any(1)  # every sequence scores one token at least
        mask = mask.to(x.device)
        return x.masked_fill(mask, self.mask_id), x.masked_fill(~mask, IGNORE)


def _transcripts(classes: int, length: int, vocab: int, seed: int, skip: int | None = None) -> torch.Tensor:
    """``classes`` random token sequences of ``length``, the same for every split (a class's
    transcript or caption), none holding the id ``skip`` (a CTC blank)."""
    g = torch.Generator().manual_seed(seed * 1000 + 11)
    if skip is None:
        return torch.randint(0, vocab, (classes, length), generator=g)
    ids = torch.randint(0, vocab - 1, (classes, length), generator=g)
    return ids + (ids >= skip).long()


class Captioned(Objective):
    """A class label becomes a token sequence: a transcript (speech), a caption (two towers)."""

    plain = False
    length, vocab = 1, 2
    skip: int | None = None  # an id no sequence holds

    def __init__(self, spec: Any) -> None:
        self.classes = spec.classes  # one transcript or caption for each of the data's classes

    def prepare(self, x: torch.Tensor, y: torch.Tensor, seed: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = _transcripts(self.classes, self.length, self.vocab, seed, self.skip)
        return x, table.to(y.device)[y]


class Ctc(Captioned):
    """CTC of a speech encoder's per-frame scores against the transcript, as its own CTC loss
    computes it (its pad token the blank, its ``ctc_zero_infinity``), each utterance's over its
    frames (a frame's share, as a cross-entropy is a token's: summed over 50 frames a second, the
    default lr 0.1 diverged in 4 steps), summed over utterances; right: an utterance its greedy
    decoding (best frame, repeats merged, blanks dropped) spells."""

    name = "CTC over synthetic transcripts"

    def __init__(self, inner: Any, spec: Any) -> None:
        super().__init__(spec)
        cfg = inner.config
        self.vocab, self.blank = int(cfg.vocab_size), int(getattr(cfg, "pad_token_id", None) or 0)
        self.skip = self.blank
        self.zero_infinity = bool(getattr(cfg, "ctc_zero_infinity", False))
        frames = int(inner._get_feat_extract_output_lengths(torch.tensor(spec.shape[0])))
        self.length = max(1, min(TRANSCRIPT, frames // 4))  # CTC needs frames for the labels and blanks between

    def count(self, y: torch.Tensor) -> Any:
        return len(y)

    def loss(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = model(x)  # (B, frames, vocab)
        log_probs = F.log_softmax(scores.float(), dim=-1).transpose(0, 1)
        frames = torch.full((len(y),), log_probs.shape[0], dtype=torch.long, device=y.device)
        lengths = torch.full((len(y),), y.shape[1], dtype=torch.long, device=y.device)
        loss = F.ctc_loss(log_probs, y, frames, lengths, self.blank, "sum", self.zero_infinity) / len(log_probs)
        return loss, self.spelled(scores.detach(), y)

    def right(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.spelled(model(x), y)

    def spelled(self, scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        best = scores.argmax(-1)  # (B, frames)
        new = torch.ones_like(best, dtype=torch.bool)
        new[:, 1:] = best[:, 1:] != best[:, :-1]
        keep = new & (best != self.blank)
        spare = best.shape[1]  # the slot every dropped frame is written to
        at = torch.where(keep, keep.cumsum(1) - 1, spare)
        spelled = torch.full((len(best), spare + 1), IGNORE, dtype=best.dtype, device=best.device)
        spelled.scatter_(1, at, best)
        return ((keep.sum(1) == y.shape[1]) & (spelled[:, : y.shape[1]] == y).all(1)).sum()


class SpeechToText(Captioned):
    """Cross-entropy of an encoder-decoder's next-token scores against the transcript, its
    decoder fed the transcript shifted behind its start token (the model does it, given ``labels``)."""

    name = "speech-to-text cross-entropy over synthetic transcripts"

    def __init__(self, inner: Any, spec: Any) -> None:
        super().__init__(spec)
        cfg = inner.config
        self.vocab = int(cfg.vocab_size)
        self.length = max(1, min(TRANSCRIPT, (getattr(cfg, "max_target_positions", None) or TRANSCRIPT + 1) - 1))

    def loss(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = model(x, labels=y).logits
        loss = F.cross_entropy(scores.flatten(0, -2).float(), y.flatten(), reduction="sum")
        return loss, correct(scores.detach(), y)

    def right(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return correct(model(x, labels=y).logits, y)


class Contrastive(Captioned):
    """A two-tower model's loss over a batch of image-caption pairs (``return_loss=True``: CLIP's
    symmetric cross-entropy, SigLIP's sigmoid ...; CLIP's from its scores where the model has no
    loss of its own), per pair times pairs; right: an image whose own caption scores highest."""

    name = "contrastive (image-caption pairs)"

    def __init__(self, inner: Any, spec: Any) -> None:
        import inspect

        super().__init__(spec)
        from perflab.models import huggingface as hf

        self.vocab, self.length = int(inner.config.text_config.vocab_size), hf.text_length(inner.config)
        self.own_loss = "return_loss" in inspect.signature(inner.forward).parameters
        self.also = f"(B, {self.length}) token ids < {self.vocab}"

    def count(self, y: torch.Tensor) -> Any:
        return len(y)

    def loss(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(x, input_ids=y, **({"return_loss": True} if self.own_loss else {}))
        scores = out.logits_per_image
        pairs = torch.arange(len(y), device=scores.device)
        if self.own_loss:
            loss = out.loss.float() * len(y)
        else:
            loss = (F.cross_entropy(scores.float(), pairs) + F.cross_entropy(scores.t().float(), pairs)) / 2 * len(y)
        return loss, correct(scores.detach(), pairs)

    def right(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scores = model(x, input_ids=y).logits_per_image
        return correct(scores, torch.arange(len(y), device=scores.device))


class Segmentation(Objective):
    """Cross-entropy of each pixel's scores (at the scores' resolution) against its image's class,
    the mean over an image's pixels summed over images; torchvision's ``aux`` head's loss added at
    0.5, as its reference recipe adds it. Right: an image whose pixels' mean scores pick its class."""

    name = "per-pixel cross-entropy"
    plain = False
    AUX = 0.5  # torchvision's references/segmentation: loss = out + 0.5 * aux

    def loss(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(x)
        scores = out["out"] if isinstance(out, dict) else out
        loss = self.pixels(scores, y)
        if isinstance(out, dict) and out.get("aux") is not None:
            loss = loss + self.AUX * self.pixels(out["aux"], y)
        return loss, correct(scores.detach().float().mean((2, 3)), y)

    @staticmethod
    def pixels(scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        each = F.cross_entropy(scores.float(), y[:, None, None].expand(-1, *scores.shape[2:]), reduction="none")
        return each.mean((1, 2)).sum()

    def right(self, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = model(x)
        scores = out["out"] if isinstance(out, dict) else out
        return correct(scores.float().mean((2, 3)), y)


SEGMENTS = Segmentation()
TRAINS = (
    "a classifier, a semantic segmentation model, a causal LM or encoder-decoder of tokens, a masked-LM "
    "encoder, a speech encoder with a CTC head (*ForCTC), an encoder-decoder of audio features (Whisper), "
    "a two-tower model (CLIP)"
)


def of(net: nn.Module, spec: Any) -> Objective:
    """The objective that fits this model on this data; a speech model without a head to train
    is one line naming its kind and what trains."""
    from perflab.models import huggingface as hf

    inner: Any = getattr(net, "inner", net)
    name = type(inner).__name__
    if segments(net):
        return SEGMENTS
    if not hf.is_hf(inner):
        return NextToken() if spec.tokens else CLASSES
    what = hf.kind(inner)
    if what == "images and text":
        return Contrastive(inner, spec)
    if what == "waveforms" and name.endswith("ForCTC"):
        return Ctc(inner, spec)
    if what == "audio features" and getattr(inner.config, "is_encoder_decoder", False):
        return SpeechToText(inner, spec)
    if what in ("waveforms", "audio features"):
        problem = f"{name} takes {what} but has no head perflab trains (a CTC head, or a decoder)"
        raise ConfigError("model", name, TRAINS, problem=problem)
    head = hf.task(inner)  # object detection, depth estimation ...: a loss of its own kind
    if what == "images" and head and not head.startswith("image classification"):
        problem = f"{name} is a model of {head}, which perflab does not train yet"
        raise ConfigError("model", name, TRAINS, problem=problem)
    if spec.tokens and hf.masked_lm(net):
        mask = getattr(inner.config, "mask_token_id", None)
        return MaskedTokens(mask if isinstance(mask, int) else spec.classes - 1)
    return NextToken() if spec.tokens else CLASSES


def segments(net: nn.Module) -> bool:
    """A semantic segmentation model: HF's ``*ForSemanticSegmentation``, torchvision's."""
    inner: Any = getattr(net, "inner", net)
    own = type(inner)
    return own.__name__.endswith("ForSemanticSegmentation") or own.__module__.startswith(
        "torchvision.models.segmentation"
    )


def prepared(ds: Any, objective: Objective, seed: int, split: int) -> Any:
    """A split as ``objective`` trains on it: its tensors remade, where the objective remakes them."""
    if type(objective).prepare is Objective.prepare:
        return ds
    from torch.utils.data import TensorDataset

    from perflab.train import data

    x, y = data.as_tensors(ds)
    return TensorDataset(*objective.prepare(x, y, seed, split))
