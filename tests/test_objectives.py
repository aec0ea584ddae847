"""Objectives that fit the model (issue 43): speech encoders train on CTC, Whisper on synthetic
transcripts, two towers on image-caption pairs, masked-LM encoders on masked tokens; each row
says its objective, and loss and accuracy count what the objective scores."""

from __future__ import annotations

import pytest
import torch
from test_models_as_they_come import AUDIO_AND_TOWERS

import perflab
from perflab.errors import Refused
from perflab.train import objectives
from perflab.train.data import Spec

from conftest import FAST

TINY = ["data.train_size=8", "data.test_size=4", "trainer.batch_size=4", "trainer.epochs=1", "results.table=false"]


def test_masked_tokens_hide_what_they_score():
    """~15 % of the positions masked, each scored against the token it hides; the rest scored by nothing."""
    x = torch.randint(0, 50, (64, 32))
    masked, y = objectives.MaskedTokens(mask_id=99).prepare(x, x.roll(-1, 1), seed=0, split=0)
    scored = y != objectives.IGNORE
    assert 0.10 < scored.float().mean() < 0.20 and scored.any(1).all()
    assert (masked[scored] == 99).all() and (y[scored] == x[scored]).all(), "the model never sees a target"
    assert (masked[~scored] == x[~scored]).all()
    assert objectives.MaskedTokens(99).count(y) == scored.sum()


def test_a_target_scored_by_nothing_is_never_right():
    scores = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    assert objectives.correct(scores, torch.tensor([[1, 0, objectives.IGNORE]])) == 2


def test_ctc_counts_an_utterance_right_where_its_greedy_decoding_spells_it():
    """Best frames 1 1 0 2 2 0 0 spell "1 2" (repeats merged, blank 0 dropped); 1 2 2 1 spells "1 2 1"."""
    ctc = objectives.Ctc.__new__(objectives.Ctc)
    ctc.blank = 0
    frames = torch.tensor([[1, 1, 0, 2, 2, 0, 0], [1, 2, 0, 2, 1, 1, 0]])
    scores = torch.nn.functional.one_hot(frames, 3).float()
    assert ctc.spelled(scores, torch.tensor([[1, 2], [1, 2]])) == 1
    assert ctc.spelled(scores, torch.tensor([[2, 1], [1, 2]])) == 0


def test_a_non_hf_model_trains_on_classes_or_next_tokens():
    net = torch.nn.Linear(2, 2)
    assert objectives.of(net, Spec((2,), 2)).name == "cross-entropy over classes"
    assert objectives.of(net, Spec((8,), 50, tokens=True)).name == "next-token cross-entropy"


def test_segmentation_scores_every_pixel_and_adds_torchvisions_aux_head_at_half_weight():
    """torchvision's FCN answers {"out": (B, C, H, W), "aux": ...}; each pixel of an image of class
    c is of class c; the aux head's loss added at 0.5, as torchvision's reference recipe does."""
    out, aux = torch.randn(3, 4, 5, 6), torch.randn(3, 4, 5, 6)
    y = torch.tensor([0, 2, 3])
    loss, right = objectives.SEGMENTS.loss(lambda x: {"out": out, "aux": aux}, torch.empty(3), y)

    def per_image(scores: torch.Tensor) -> torch.Tensor:
        pixels = torch.nn.functional.cross_entropy(scores, y[:, None, None].expand(3, 5, 6), reduction="none")
        return pixels.mean((1, 2)).sum()

    assert loss.item() == pytest.approx((per_image(out) + 0.5 * per_image(aux)).item(), rel=1e-6)
    assert right == (out.mean((2, 3)).argmax(1) == y).sum()
    assert objectives.SEGMENTS.right(lambda x: out, torch.empty(3), y) == right


transformers = pytest.importorskip("transformers")

AUDIO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=32)
AUDIO.update(conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16)
AUDIO.update(num_conv_pos_embedding_groups=2)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
MODELS = {
    "wav2vec2-ctc": lambda t: t.Wav2Vec2ForCTC(t.Wav2Vec2Config(**AUDIO)),
    "hubert-ctc": lambda t: t.HubertForCTC(t.HubertConfig(**AUDIO)),
    "wav2vec2-base": lambda t: t.Wav2Vec2Model(t.Wav2Vec2Config(**AUDIO)),
    "whisper": AUDIO_AND_TOWERS["whisper"][0],  # their own tiny Whisper and CLIP, saved again here
    "clip": AUDIO_AND_TOWERS["clip"][0],
    "bert-mlm": lambda t: t.BertForMaskedLM(t.BertConfig(**TEXT, vocab_size=100, max_position_embeddings=64)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each model saved once, tiny, as a user's save_pretrained leaves it."""
    root = tmp_path_factory.mktemp("objectives")
    transformers.set_seed(0)
    for name, make in MODELS.items():
        make(transformers).save_pretrained(root / name)
    return root


TRAINED = {  # name: (extra overrides, objective, input)
    "wav2vec2-ctc": (["data.shape=[4000]"], "CTC over synthetic transcripts", "(B, 4000) float32"),
    "hubert-ctc": ([], "CTC over synthetic transcripts", "(B, 16000) float32"),
    "whisper": ([], "speech-to-text cross-entropy over synthetic transcripts", "(B, 16, 100) float32"),
    "clip": ([], "contrastive (image-caption pairs)", "(B, 3, 32, 32) float32 + (B, 16) token ids < 99"),
    "bert-mlm": (
        ["data=tokens", "data.seq_len=16"],
        "masked-token cross-entropy (15 % masked)",
        "(B, 16) token ids < 100",
    ),
}


@pytest.mark.parametrize("name", list(TRAINED))
@pytest.mark.xdist_group("objectives")  # one worker saves the models once
def test_a_model_trains_on_the_objective_that_fits_it_and_its_row_says_which(work, folders, name):
    """Whisper and Wav2Vec2 were refused (allowed: data=tokens, then a dtype error), CLIP crashed,
    a BERT on next-token data reached 0.68 test accuracy by seeing the token it predicted."""
    over, objective, shape = TRAINED[name]
    df = perflab.run("quick/train", ["model=hf", f"model.name={folders / name}", *over, *TINY, *FAST])
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["items_per_s"] > 0, df[["measurement", "error"]]
    assert summary["objective"] == objective and summary["input"] == shape
    assert summary["flops_per_item"] > 0, "its FLOPs counted, the objective's forward and backward"
    assert 0 <= summary["test_acc"] <= 1 and summary["train_loss"] > 0


@pytest.mark.xdist_group("objectives")  # one worker saves the models once
def test_a_speech_encoder_without_a_head_to_train_is_one_line(work, folders):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", ["model=hf", f"model.name={folders / 'wav2vec2-base'}", *TINY, *FAST])
    line = str(refused.value)
    assert "Wav2Vec2Model takes waveforms but has no head perflab trains" in line and "\n" not in line
    assert "a speech encoder with a CTC head (*ForCTC)" in line


@pytest.mark.xdist_group("objectives")  # one worker saves the models once
def test_a_speech_model_on_token_data_or_another_feature_size_is_one_line(work, folders):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", ["model=hf", f"model.name={folders / 'whisper'}", "data=tokens", *TINY, *FAST])
    assert "the model takes audio features" in str(refused.value)
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", ["model=hf", f"model.name={folders / 'whisper'}", "data.shape=[16,50]", *TINY])
    assert str(refused.value).startswith("data.shape=[16,50]: the model's config decides its audio features")
    assert "allowed: [16, 100]" in str(refused.value)
