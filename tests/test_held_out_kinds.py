"""A held-out set of model kinds nobody here had run (issue 43's goal), random weights, run as a
user would: infer, generate and train each, every one ok or refused in one line naming its kind;
nothing else (no traceback), the input shape in every row. Slow: 40-odd jobs."""

from __future__ import annotations

import pytest

import perflab
from perflab.errors import Refused

from conftest import FAST

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("held_out_kinds")]

V = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
AUDIO = dict(**V, vocab_size=32, conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 4))
AUDIO.update(num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
TEXT = dict(**V, vocab_size=99, max_position_embeddings=16)
VISION = dict(**V, image_size=32, patch_size=8)
SEQ2SEQ = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
SEQ2SEQ.update(encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100)


CTC = "CTC over synthetic transcripts"
PAIRS = "contrastive (image-caption pairs)"
NO_GENERATE = "does not generate"
# name: (model factory, extra overrides for training, {experiment: an objective, "ok", or a refusal's words})
KINDS = {
    "data2vec-audio": (lambda t: t.Data2VecAudioForCTC(t.Data2VecAudioConfig(**AUDIO)), ["data.shape=[4000]"], CTC),
    "sew": (lambda t: t.SEWForCTC(t.SEWConfig(**AUDIO, squeeze_factor=2)), ["data.shape=[4000]"], CTC),
    "unispeech": (lambda t: t.UniSpeechForCTC(t.UniSpeechConfig(**AUDIO)), ["data.shape=[4000]"], CTC),
    "wavlm": (lambda t: t.WavLMForCTC(t.WavLMConfig(**AUDIO)), ["data.shape=[4000]"], CTC),
    "speech2text": (
        lambda t: t.Speech2TextForConditionalGeneration(
            t.Speech2TextConfig(
                **SEQ2SEQ,
                max_source_positions=64,
                max_target_positions=32,
                input_feat_per_channel=16,
                conv_channels=16,
                num_conv_layers=2,
                decoder_start_token_id=2,
            )
        ),
        [],
        "speech-to-text cross-entropy over synthetic transcripts",
    ),
    "siglip": (lambda t: t.SiglipModel(t.SiglipConfig(text_config=TEXT, vision_config=VISION)), [], PAIRS),
    "blip": (lambda t: t.BlipModel(t.BlipConfig(text_config=TEXT, vision_config=VISION, projection_dim=16)), [], PAIRS),
    "owlvit": (
        lambda t: t.OwlViTModel(t.OwlViTConfig(text_config=TEXT, vision_config=VISION, projection_dim=16)),
        [],
        PAIRS,
    ),
    "segformer": (
        lambda t: t.SegformerForSemanticSegmentation(
            t.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                num_attention_heads=[1, 2],
                decoder_hidden_size=32,
                num_labels=5,
                image_size=32,
            )
        ),
        [],
        "per-pixel cross-entropy",
    ),
    "yolos": (
        lambda t: t.YolosForObjectDetection(
            t.YolosConfig(**{**VISION, "image_size": [32, 32]}, num_detection_tokens=5, num_labels=5)
        ),
        [],
        "YolosForObjectDetection is a model of object detection, which perflab does not train yet",
    ),
    "marian": (
        lambda t: t.MarianMTModel(
            t.MarianConfig(
                **SEQ2SEQ, max_position_embeddings=64, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1
            )
        ),
        ["data=tokens", "data.seq_len=16"],
        "next-token cross-entropy",
    ),
    "deberta-v2": (
        lambda t: t.DebertaV2ForMaskedLM(t.DebertaV2Config(**V, vocab_size=100, max_position_embeddings=64)),
        ["data=tokens", "data.seq_len=16"],
        "masked-token cross-entropy (15 % masked)",
    ),
}
GENERATES = {"speech2text", "marian"}
BY_NAME = {  # torchvision's and timm's, by name: (model overrides, objective)
    "lraspp": (["model=torchvision", "model.arch=lraspp_mobilenet_v3_large"], "per-pixel cross-entropy"),
    "fcn-aux": (["model=torchvision", "model.arch=fcn_resnet50", "+model.aux_loss=true"], "per-pixel cross-entropy"),
    "regnet": (["model=timm", "model.arch=regnetx_002"], "cross-entropy over classes"),
    "convnextv2": (["model=timm", "model.arch=convnextv2_atto"], "cross-entropy over classes"),
}
TRAIN = ["data.train_size=8", "data.test_size=4", "trainer.batch_size=4", "trainer.epochs=1", "results.table=false"]


@pytest.fixture(scope="session")  # its group's worker builds it once (module: again after another module's test)
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("held-out-kinds")
    transformers.set_seed(0)
    for name, (make, _, _) in KINDS.items():
        make(transformers).save_pretrained(root / name)
    return root


def outcome(experiment: str, overrides: list[str]):
    """The job's rows, or its one-line refusal; anything else raised is a failure of the test."""
    try:
        return perflab.run(experiment, [*overrides, *FAST])
    except Refused as refused:
        assert "\n" not in str(refused)
        return str(refused)


@pytest.mark.parametrize("name", list(KINDS))
def test_a_held_out_kind_infers_generates_and_trains_or_says_why_not(work, folders, name):
    _, extra, trains = KINDS[name]
    model = ["model=hf", f"model.name={folders / name}"]
    infer = outcome("quick/infer", [*model, "experiment.batches=[1]", "results.table=false"])
    assert not isinstance(infer, str), infer
    assert (infer["status"] == "ok").all() and infer["input"].notna().all(), infer[["measurement", "error"]]
    generate = outcome("quick/generate", [*model, "experiment.new_tokens=3", "experiment.prompt_len=4"])
    if name in GENERATES:
        assert not isinstance(generate, str) and (generate["status"] == "ok").all(), generate
    else:
        assert isinstance(generate, str) and NO_GENERATE in generate and "; it is a model of " in generate
    train = outcome("quick/train", [*model, *extra, *TRAIN])
    if "does not train" in trains:  # refused, naming its kind
        assert isinstance(train, str) and trains in train, train
        return
    assert not isinstance(train, str), train
    summary = train[train["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["objective"] == trains and summary["input"], summary


@pytest.mark.parametrize("name", list(BY_NAME))
def test_a_held_out_model_by_name_infers_and_trains(work, name):
    model, objective = BY_NAME[name]
    small = [*model, "data.shape=[3,64,64]"]
    infer = outcome("quick/infer", [*small, "experiment.batches=[1]", "results.table=false"])
    assert not isinstance(infer, str) and (infer["status"] == "ok").all(), infer
    train = outcome("quick/train", [*small, *TRAIN])
    assert not isinstance(train, str), train
    summary = train[train["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["objective"] == objective, summary
