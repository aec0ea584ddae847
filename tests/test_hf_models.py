"""Held-out models as a user brings them: Hugging Face architectures other than GPT-2, saved
with save_pretrained to a folder (tiny random configs: 1 layer, 32 wide, 100 tokens), and timm's
by name. Each one runs infer (and generate or training where it can), or is refused in one line
before anything is measured."""

from __future__ import annotations

import pytest

import perflab
from perflab.errors import Refused

from conftest import FAST

transformers = pytest.importorskip("transformers")

SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}
SEQ2SEQ = {"vocab_size": 100, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
MODELS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, num_key_value_heads=1)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, num_key_value_heads=1)),
    "opt": lambda: transformers.OPTForCausalLM(
        transformers.OPTConfig(
            hidden_size=32,
            ffn_dim=64,
            word_embed_proj_dim=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=100,
            max_position_embeddings=64,
        )
    ),
    "gpt-neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)),
    "bert-mlm": lambda: transformers.BertForMaskedLM(transformers.BertConfig(**SMALL)),
    "bert-classifier": lambda: transformers.BertForSequenceClassification(transformers.BertConfig(**SMALL)),
    "t5": lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2, **SEQ2SEQ)
    ),
    "bart": lambda: transformers.BartForConditionalGeneration(
        transformers.BartConfig(
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            **SEQ2SEQ,
        )
    ),
    "vit": lambda: transformers.ViTForImageClassification(
        transformers.ViTConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
            num_labels=10,
        )
    ),
    "resnet-hf": lambda: transformers.ResNetForImageClassification(  # its config says no image size
        transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    ),
}
TOKENS = [
    "data=tokens",
    "data.vocab_size=100",
    "data.seq_len=16",
    "data.train_size=32",
    "data.test_size=16",
    "trainer.batch_size=16",
    "trainer.epochs=1",
    "trainer.optimizer=adamw",
]


@pytest.fixture(scope="session")  # its group's worker builds it once (module: again after another module's test)
def folders(tmp_path_factory):
    """Each model saved once, as a user's save_pretrained leaves it."""
    root = tmp_path_factory.mktemp("held-out")
    transformers.set_seed(0)
    for name, make in MODELS.items():
        make().save_pretrained(root / name)
    return root


def timed_rows_are_right(df, measurements):
    """ok rows with throughput and ordered percentiles, never a zero."""
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    timed = df[df["measurement"].isin(measurements)]
    assert set(timed["measurement"]) == set(measurements)
    assert (timed["items_per_s"] > 0).all()
    assert ((timed["p50_s"] > 0) & (timed["p50_s"] <= timed["p90_s"]) & (timed["p90_s"] <= timed["p99_s"])).all()
    return timed


@pytest.mark.parametrize("name", [n for n in MODELS if n != "bert-classifier"])
@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_a_held_out_folder_runs_infer_with_its_flops(work, folders, name):
    """T5 took no input_ids alone (its decoder needs ids of its own): it gets them as BART
    makes them, the ids shifted right."""
    df = perflab.run(
        "quick/infer",
        ["model=hf", f"model.name={folders / name}", "experiment.batches=[2]", "results.table=false", *FAST],
    )
    forward = timed_rows_are_right(df, ["forward batch 2"]).iloc[0]
    assert forward["tflops"] > 0, "FLOPs counted, not left empty"
    assert forward["items_unit"] == ("images" if name in ("vit", "resnet-hf") else "tokens")
    if name == "resnet-hf":
        assert forward["input"] == "(B, 3, 224, 224) float32", (
            "no size in its config: ImageNet's, not the data's 1x28x28"
        )


@pytest.mark.parametrize("name", ["llama", "t5"])
@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_a_decoder_and_an_encoder_decoder_generate(work, folders, name):
    over = ["experiment.new_tokens=4", "experiment.prompt_len=8", "results.table=false", *FAST]
    df = perflab.run("quick/generate", ["model=hf", f"model.name={folders / name}", *over])
    timed = timed_rows_are_right(df, ["prefill", "decode", "generate"]).set_index("measurement")
    assert (timed["tflops"] > 0).all(), "FLOPs of the calls themselves, KV cache and all"
    per_token = timed["tflops"] * timed["median_s"] * 1e12  # FLOPs of a prefill, a decode step, a whole call
    assert per_token["decode"] < per_token["prefill"] < per_token["generate"], "a step reads 1 token, a prompt 8"


@pytest.mark.parametrize(
    "name, cls, kind",
    [
        ("bert-mlm", "BertForMaskedLM", "token ids for masked LM"),
        ("vit", "ViTForImageClassification", "images for image classification"),
    ],
)
@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_a_model_that_cannot_generate_is_one_line_before_anything_runs(work, folders, name, cls, kind):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", ["model=hf", f"model.name={folders / name}", *FAST])
    line = str(refused.value)
    assert f"{cls} does not generate; it is a model of {kind}" in line and "\n" not in line
    assert not list(work.glob("outputs/runs/*/results.csv")), "nothing measured"


@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_an_encoder_decoder_trains_and_its_row_says_the_objective(work, folders):
    df = perflab.run("quick/train", ["model=hf", f"model.name={folders / 't5'}", *TOKENS, "results.table=false", *FAST])
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["items_per_s"] > 0, df[["measurement", "error"]]
    assert summary["objective"] == "next-token cross-entropy"


@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_a_sequence_classifier_on_token_data_is_one_line(work, folders):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", ["model=hf", f"model.name={folders / 'bert-classifier'}", *TOKENS, *FAST])
    assert "does not fit the data" in str(refused.value) and "\n" not in str(refused.value)


def test_timm_by_name_and_its_own_input_size_are_said_in_one_line(work):
    pytest.importorskip("timm")
    with pytest.raises(Refused) as named:
        perflab.run("quick/infer", ["model=timm", "model.name=resnet10t", *FAST])
    assert str(named.value).startswith("model.name=resnet10t: timm takes no name; allowed: model.arch=resnet10t")
    with pytest.raises(Refused) as sized:  # a size the user set that it cannot take: the one it takes
        perflab.run("quick/infer", ["model=timm", "model.arch=vit_tiny_patch16_224", "data.shape=[3,28,28]", *FAST])
    assert "(data.shape=[3, 224, 224] for this one)" in str(sized.value) and "\n" not in str(sized.value)


def test_a_model_gets_the_input_it_expects_unless_data_shape_is_set(work):
    """timm's pretrained_cfg says resnet10t takes 176x176: that, not 1x28x28, and on screen."""
    pytest.importorskip("timm")
    from experiments import infer

    df = perflab.run("quick/infer", ["model=timm", "model.arch=resnet10t", "experiment.batches=[1]", *FAST])
    assert set(df["input"]) == {"(B, 3, 176, 176) float32"}
    assert infer.headline(df.to_dict("records"))[0].endswith("; input (B, 3, 176, 176) float32")
    df = perflab.run(
        "quick/infer", ["model=timm", "model.arch=resnet10t", "experiment.batches=[1]", "data.shape=[3,32,32]", *FAST]
    )
    assert set(df["input"]) == {"(B, 3, 32, 32) float32"}, "the user's data.shape stands"


@pytest.mark.parametrize("arch", ["mobilenetv3_small_050", "convnext_atto"])
def test_timm_models_by_name_run_infer(work, arch):
    pytest.importorskip("timm")
    over = ["experiment.batches=[1]", "data.shape=[3,64,64]", "results.table=false", *FAST]
    df = perflab.run("quick/infer", ["model=timm", f"model.arch={arch}", *over])
    assert timed_rows_are_right(df, ["forward batch 1"]).iloc[0]["tflops"] > 0


def test_a_random_encoder_decoder_generates_as_a_seq2seq_lm_when_asked(work):
    t5 = ["model=hf", "model.config.model_type=t5", "+model.config.d_model=32", "+model.config.d_ff=64"]
    t5 += ["+model.config.num_layers=1", "+model.config.num_heads=2", "+model.config.d_kv=16"]
    t5 += ["+model.config.vocab_size=100", "+model.config.decoder_start_token_id=0", "experiment.new_tokens=3"]
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", [*t5, *FAST])
    assert "T5ForSequenceClassification does not generate; model.task=seq2seq-lm builds one" in str(refused.value)
    df = perflab.run("quick/generate", [*t5, "model.task=seq2seq-lm", "results.table=false", *FAST])
    timed_rows_are_right(df, ["prefill", "decode", "generate"])


@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_an_encoder_decoders_prompt_and_new_tokens_each_have_its_positions(work, folders):
    """BART (64 positions a side): a prompt of 40 and 30 new tokens fit, though 70 > 64; a prompt
    of 65 does not, nor 64 new tokens (its start token takes one position)."""
    model = ["model=hf", f"model.name={folders / 'bart'}", "data=tokens", "data.vocab_size=100"]
    df = perflab.run("quick/generate", [*model, "experiment.prompt_len=40", "experiment.new_tokens=30", *FAST])
    timed_rows_are_right(df, ["prefill", "decode", "generate"])
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", [*model, "experiment.prompt_len=65", "experiment.new_tokens=2", *FAST])
    assert str(refused.value).startswith("experiment.prompt_len=65: it outgrows the model's 64 positions")
    with pytest.raises(Refused) as refused:  # the decoder's start token takes one of its 64
        perflab.run("quick/generate", [*model, "experiment.prompt_len=8", "experiment.new_tokens=64", *FAST])
    assert str(refused.value).startswith("experiment.new_tokens=64: it outgrows the model's 64 positions")
    assert "at most 63" in str(refused.value)


@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_an_image_model_of_any_size_trains_on_images_of_its_channels(work, folders):
    """HF's ResNet names its channels, not a size: any size of 3 channels fits; 1 is one line."""
    images = ["data=synthetic", "data.num_classes=10", "data.train_size=32", "data.test_size=16"]
    images += ["trainer.batch_size=16", "trainer.epochs=1", "results.table=false", *FAST]
    model = ["model=hf", f"model.name={folders / 'resnet-hf'}"]
    df = perflab.run("quick/train", [*model, *images, "data.shape=[3,32,32]"])
    assert (df[df["measurement"] == "train"]["status"] == "ok").all(), df[["measurement", "error"]]
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*model, *images, "data.shape=[1,32,32]"])
    assert str(refused.value).startswith("data.shape=[1,32,32]: the model's config decides its channels")
    assert "allowed: [3, H, W]" in str(refused.value)


@pytest.mark.xdist_group("held_out_models")  # one worker saves the models once
def test_an_image_model_trains_on_its_configs_size_and_labels_when_the_data_names_none(work, folders):
    """It was refused (allowed: [3, 32, 32]) though the user had set no shape: ViT's 3x32x32, 10 labels."""
    over = ["data.train_size=16", "data.test_size=8", "trainer.batch_size=8", "trainer.epochs=1", "results.table=false"]
    df = perflab.run("quick/train", ["model=hf", f"model.name={folders / 'vit'}", *over, *FAST])
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["input"] == "(B, 3, 32, 32) float32", df[["measurement", "error"]]
