"""Models as they come (issue 43): train-mode outputs with aux heads trained as the model's
recipe trains them, the input a model expects by default (and on screen), data that follows a
model's vocabulary and positions when the user set none, a diverged run that says what lr to try."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import perflab
from perflab import models
from perflab.config.schema import ModelConfig
from perflab.errors import Refused
from perflab.measure.devices import Device
from perflab.train.strategies import Single

from conftest import FAST

TINY = ["data.train_size=8", "data.test_size=4", "trainer.batch_size=4", "trainer.epochs=1", "results.table=false"]


class TwoHeads(nn.Module):
    """Answers as torchvision's Inception-v3 does: its logits alone in eval mode, with its aux
    head's in train mode."""

    def __init__(self, outputs: type) -> None:
        super().__init__()
        self.main, self.aux, self.outputs = nn.Linear(4, 3), nn.Linear(4, 3), outputs

    def forward(self, x: torch.Tensor):
        if not self.training:
            return self.main(x)
        if self.outputs.__name__ == "GoogLeNetOutputs":
            return self.outputs(self.main(x), self.aux(x), 2 * self.aux(x))
        return self.outputs(self.main(x), self.aux(x))


def two_heads(name: str = "InceptionOutputs", num_classes: int = 3) -> nn.Module:
    from torchvision.models.googlenet import GoogLeNetOutputs
    from torchvision.models.inception import InceptionOutputs

    assert num_classes == 3
    return TwoHeads(GoogLeNetOutputs if name == "GoogLeNetOutputs" else InceptionOutputs)


@pytest.mark.parametrize("name", ["GoogLeNetOutputs", "InceptionOutputs"])
def test_aux_heads_add_their_loss_at_the_recipes_weight(name):
    """GoogLeNet: 0.3 for each aux head; Inception-v3: 0.4; the main logits score the accuracy."""
    net = two_heads(name).train()
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    step = Single(net, [Device("cpu", "cpu")], lambda p: torch.optim.SGD(p, lr=0.0))
    loss, right = step.forward_loss(net, x, y, len(y))

    def ce(scores: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(scores, y, reduction="sum")

    main, aux = net.main(x), net.aux(x)
    want = ce(main) + (0.3 * ce(aux) + 0.3 * ce(2 * aux) if name == "GoogLeNetOutputs" else 0.4 * ce(aux))
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert right == (main.argmax(1) == y).sum()
    assert net.aux.weight.grad is not None and net.aux.weight.grad.abs().sum() > 0, "the aux head trains"


@pytest.mark.parametrize("name", ["GoogLeNetOutputs", "InceptionOutputs"])
def test_a_model_with_aux_outputs_in_train_mode_trains(work, name):
    """It crashed on GoogLeNetOutputs.flatten (the check ran it in eval mode only)."""
    model = ["model._target_=test_models_as_they_come.two_heads", f"+model.name={name}"]
    df = perflab.run("quick/train", [*model, "data.shape=[4]", "data.num_classes=3", *TINY, *FAST])
    summary = df[df["measurement"] == "train"]
    assert (summary["status"] == "ok").all() and (summary["items_per_s"] > 0).all(), df[["measurement", "error"]]


@pytest.mark.slow
def test_torchvisions_googlenet_trains_with_its_aux_heads(work):
    fast = ["model=torchvision", "model.arch=googlenet", "+model.init_weights=false", "data.shape=[3,32,32]"]
    df = perflab.run("quick/train", [*fast, *TINY, *FAST])
    summary = df[df["measurement"] == "train"]
    assert (summary["status"] == "ok").all() and (summary["items_per_s"] > 0).all(), df[["measurement", "error"]]


def test_an_aux_head_that_cannot_take_the_size_is_found_in_train_mode(work):
    """inception_v3's aux head needs a larger image than its eval path: one line, before
    anything runs, naming the size it takes."""
    fast = ["model=torchvision", "+model.init_weights=false", *TINY, *FAST]
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*fast, "model.arch=inception_v3", "data.shape=[3,96,96]"])
    line = str(refused.value)
    assert "in train mode: RuntimeError" in line and "(data.shape=[3, 299, 299] for this one)" in line
    assert "\n" not in line


@pytest.mark.parametrize(
    "cfg, said",
    [
        (ModelConfig(_target_="perflab.models.torchvision", arch="inception_v3"), {"shape": [3, 299, 299]}),
        (ModelConfig(_target_="perflab.models.torchvision", arch="efficientnet_b3"), {"shape": [3, 300, 300]}),
        (ModelConfig(_target_="perflab.models.timm", arch="resnet10t"), {"shape": [3, 176, 176]}),
        (ModelConfig(_target_="perflab.models.lenet"), {}),
    ],
)
def test_a_model_says_the_input_it_takes_as_its_library_does(cfg, said):
    """torchvision's from its weights' transforms (crop size), timm's from its pretrained_cfg."""
    if cfg.arch == "resnet10t":
        pytest.importorskip("timm")
    assert models.expects(cfg) == said


def test_token_data_follows_the_models_vocabulary_and_positions(work, tmp_path):
    """A 1,000-token GPT-2 of 32 positions, data=tokens and no vocabulary or length set: ids
    below 1,000, 32 tokens a sequence; a vocabulary the user sets that it does not have is one line."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=1000, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2-1000")
    model = ["model=hf", f"model.name={tmp_path / 'gpt2-1000'}", "data=tokens"]
    df = perflab.run("quick/train", [*model, *TINY, *FAST])
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["input"] == "(B, 32) token ids < 1000"
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*model, "data.vocab_size=256", *TINY, *FAST])
    assert str(refused.value).startswith("data.vocab_size=256: the model's config decides its vocabulary")
    with pytest.raises(Refused) as refused:  # images, the preset's data: the way to its tokens, nothing to size
        perflab.run("quick/train", [*model[:2], *TINY, *FAST])
    assert str(refused.value).endswith("allowed: data=tokens (its vocabulary and positions follow the model)")


# --- inputs from the model's config, for every modality -------------------------------------

AUDIO_AND_TOWERS = {
    "whisper": (
        lambda t: t.WhisperForConditionalGeneration(
            t.WhisperConfig(
                d_model=32,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                num_mel_bins=16,
                max_source_positions=50,
                max_target_positions=32,
                vocab_size=100,
                decoder_start_token_id=1,
                pad_token_id=0,
                eos_token_id=2,
                bos_token_id=1,
            )
        ),
        "(B, 16, 100) float32",  # its mel bins x twice its encoder's positions (Whisper's 80 x 3000)
        "audio features",
    ),
    "wav2vec2": (
        lambda t: t.Wav2Vec2ForCTC(
            t.Wav2Vec2Config(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
                conv_dim=(16, 16),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=2,
                vocab_size=32,
            )
        ),
        "(B, 16000) float32",  # a second at 16 kHz
        "waveforms",
    ),
    "clip": (
        lambda t: t.CLIPModel(
            t.CLIPConfig(
                text_config=dict(
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    vocab_size=99,
                    max_position_embeddings=16,
                    bos_token_id=0,
                    eos_token_id=2,
                ),
                vision_config=dict(
                    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32
                ),
                projection_dim=16,
            )
        ),
        "(B, 3, 32, 32) float32 + (B, 16) token ids < 99",  # two towers: its images and its text
        "images and text",
    ),
}


@pytest.fixture(scope="session")  # its group's worker builds it once (module: again after another module's test)
def speech_and_towers(tmp_path_factory):
    """Whisper, Wav2Vec2 and CLIP saved once, tiny, as a user's save_pretrained leaves them."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("speech-and-towers")
    transformers.set_seed(0)
    for name, (make, _, _) in AUDIO_AND_TOWERS.items():
        make(transformers).save_pretrained(root / name)
    return root


@pytest.mark.parametrize("name", list(AUDIO_AND_TOWERS))
@pytest.mark.xdist_group("speech_and_towers")  # one worker saves the models once
def test_speech_and_two_tower_models_infer_on_inputs_their_config_shapes(work, speech_and_towers, name):
    """Whisper refused (2, 32) token ids, CLIP crashed on NoneType.shape: each gets what its
    processor would make, and the row and the screen say it."""
    from experiments import infer

    model = ["model=hf", f"model.name={speech_and_towers / name}"]
    df = perflab.run("quick/infer", [*model, "experiment.batches=[2]", "results.table=false", *FAST])
    forward = df[df["measurement"] == "forward batch 2"].iloc[0]
    assert forward["status"] == "ok" and forward["items_per_s"] > 0, df[["measurement", "error"]]
    assert forward["input"] == AUDIO_AND_TOWERS[name][1]
    assert infer.headline(df.to_dict("records"))[0].endswith(f"; input {AUDIO_AND_TOWERS[name][1]}")


@pytest.mark.xdist_group("speech_and_towers")  # one worker saves the models once
def test_whisper_generates_from_audio_features_within_its_decoders_positions(work, speech_and_towers):
    """Its prompt is its features, whole; its decoder holds 32 positions, one its start token's."""
    from experiments import generate

    model = ["model=hf", f"model.name={speech_and_towers / 'whisper'}"]
    df = perflab.run("quick/generate", [*model, "experiment.new_tokens=3", "results.table=false", *FAST])
    timed = df[df["measurement"].isin(["prefill", "decode", "generate"])]
    assert (timed["status"] == "ok").all() and len(timed) == 3, df[["measurement", "error"]]
    prefill = timed[timed["measurement"] == "prefill"].iloc[0]
    assert prefill["input"] == "(B, 16, 100) float32" and prefill["items_unit"] == "samples"
    assert "for 1 prompt; input (B, 16, 100) float32" in generate.headline(df.to_dict("records"))[0]
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", [*model, "experiment.new_tokens=32", *FAST])
    assert str(refused.value).startswith("experiment.new_tokens=32: it outgrows the model's 32 positions")


@pytest.mark.xdist_group("speech_and_towers")  # one worker saves the models once
def test_a_two_tower_model_asked_to_generate_is_one_line(work, speech_and_towers):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/generate", ["model=hf", f"model.name={speech_and_towers / 'clip'}", *FAST])
    assert "CLIPModel does not generate" in str(refused.value)


def test_a_kind_of_input_perflab_cannot_make_is_one_line_naming_it_and_what_it_can():
    transformers = pytest.importorskip("transformers")
    from perflab.errors import ConfigError
    from perflab.models import huggingface as hf

    config = transformers.PatchTSTConfig(
        num_input_channels=2, context_length=16, patch_length=4, patch_stride=4, d_model=16, num_hidden_layers=1
    )
    with pytest.raises(ConfigError) as refused:
        hf.input_spec(transformers.PatchTSTForPrediction(config))
    line = refused.value.line()
    assert "PatchTSTForPrediction takes past_values, a kind of input perflab cannot make yet" in line
    assert "audio features (input_features), waveforms (input_values)" in line


def test_a_recurrent_models_cache_is_called_its_state():
    """Mamba keeps a state, not keys and values; GPT-2 a KV cache: the decode line names each."""
    transformers = pytest.importorskip("transformers")
    from experiments import generate

    mamba = transformers.MambaConfig(hidden_size=32, num_hidden_layers=1, vocab_size=100, state_size=4)
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)
    ids = torch.zeros(1, 4, dtype=torch.long)
    for net, name in [
        (transformers.MambaForCausalLM(mamba), "state"),
        (transformers.GPT2LMHeadModel(gpt2), "KV cache"),
    ]:
        out = net.generate(ids, max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
        assert generate.cache_name(generate.kv_cache(out)) == name
    row = {"measurement": "decode", "status": "ok", "mean_s": 0.01, "batch": 1, "kv_cache_mb": 0.5, "cache": "state"}
    (line,) = generate.headline([row])
    assert line.endswith("; state 0.5 MB")


@pytest.mark.slow
def test_a_recurrent_models_rows_say_state(work):
    pytest.importorskip("transformers")
    mamba = ["model=hf", "model.config.model_type=mamba", "+model.config.hidden_size=32"]
    mamba += ["+model.config.num_hidden_layers=1", "+model.config.vocab_size=100", "+model.config.state_size=4"]
    over = ["experiment.prompt_len=4", "experiment.new_tokens=3", "results.table=false", *FAST]
    df = perflab.run("quick/generate", [*mamba, *over])
    assert set(df[df["measurement"].isin(["generate", "decode"])]["cache"]) == {"state"}


def test_flops_are_counted_where_a_module_is_handed_its_parameters_without_gradients():
    """weight_norm's parametrization (Wav2Vec2's, HuBERT's, WavLM's positional convolution) crashed
    torch's module tracker under inference_mode: their inference rows had no FLOPs."""
    from perflab.measure import flops

    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 8, 3), dim=2)
    x = torch.randn(2, 4, 16)
    with_grad = flops.count(lambda: conv(x))
    with torch.inference_mode():
        assert flops.count(lambda: conv(x)) == with_grad == 2 * 2 * 8 * 14 * 4 * 3


def lazy_mlp(num_classes: int = 10) -> nn.Module:
    """A user's model whose first layer is sized by its first input (nn.LazyLinear)."""
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, num_classes))


@pytest.mark.parametrize("experiment", ["quick/infer", "quick/train"])
def test_a_model_with_lazy_modules_is_shaped_by_its_input_before_anything_counts_it(work, experiment):
    """infer counted its parameters before any forward: ValueError on an uninitialized parameter."""
    over = ["model._target_=test_models_as_they_come.lazy_mlp", "data.shape=[1,8,8]", "experiment.batches=[2]"]
    over = over if experiment == "quick/infer" else [*over[:2], *TINY]
    df = perflab.run(experiment, [*over, "results.table=false", *FAST])
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    if experiment == "quick/infer":
        load = df[df["measurement"] == "load"].iloc[0]
        assert load["params"] == 64 * 16 + 16 + 16 * 10 + 10
