"""The model zoo: forward graphs of real architectures, built offline and imported via ONNX.

:data:`ZOO_MODELS` lists the architectures: torchvision classification, video and
segmentation models, a representative of each timm family (convnets, vision
transformers, hybrids, MLP-mixers, metaformers), and HuggingFace transformers built from
their configs (encoders, decoders, encoder-decoders, speech, vision-language). Each
entry has a ``family`` (the architecture family, the group of leave-family-out
evaluation), a ``source`` library, a picklable zero-argument ``builder`` that returns a
``torch.nn.Module`` with random weights, and an :class:`InputSpec`.

:func:`export_graph` builds one model, puts it in training mode (dropout and batch
statistics in the graph, as in a training step), exports it to ONNX in memory and
imports it with :func:`travorder.graph.onnx_import.read_onnx`. :func:`build_zoo` does
that for many models, each in a worker process with a timeout, and stores the graphs in a
corpus (:mod:`travorder.datasets.corpus`) as they finish; a model that fails is recorded
with its reason in ``zoo_failures.json`` next to the manifest.

Nothing is downloaded: weights are random (torchvision ``weights=None``, timm
``pretrained=False``, transformers configs with ``from_config``), and the HuggingFace
hub is switched off (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``). Large language
models use their real widths and vocabularies with fewer layers; the entry's ``note``
says so.

This module imports torch, torchvision, timm and transformers only inside functions, so
the registry can be listed without them. Building needs the ``zoo`` environment
described in ``docs/zoo.md``.

>>> len({m.family for m in ZOO_MODELS}) >= 25
True
>>> [m.name for m in select_models(names=["resnet50"])]
['resnet50']
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import math
import multiprocessing
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from travorder.datasets.corpus import DEFAULT_MAX_NODES, add_to_corpus
from travorder.errors import TravorderError, write_file
from travorder.graph.native import graph_from_dict, graph_to_dict
from travorder.graph.opgraph import OpGraph

ZOO_BUILDER = "travorder.datasets.zoo"
#: Bump when a change here changes the graphs built from the same libraries.
ZOO_BUILDER_VERSION = 1
DEFAULT_BATCH_SIZE = 1
DEFAULT_SEQ_LEN = 128
DEFAULT_TIMEOUT_S = 600.0
FAILURES_NAME = "zoo_failures.json"
#: The exporters tried in turn: the TorchScript exporter is several times faster; the
#: dynamo exporter handles what tracing cannot (transformers' mask construction).
EXPORTERS = ("torchscript", "dynamo")
INPUT_KINDS = ("image", "video", "tokens", "seq2seq", "audio", "speech_seq2seq",
               "image_text", "image_seq2seq")
_SOURCE_MODULES = {"torchvision": ("torchvision",), "timm": ("timm",),
                   "transformers": ("transformers",)}
_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Batch norm in training mode needs two values per channel: at batch size 1 it fails
#: where a model normalises pooled 1x1 features (ASPP, split attention).
_ONE_SAMPLE_BN = "Expected more than 1 value per channel when training"
#: Share of ops of unknown shape that makes an exporter give way to the next one. A
#: traced ViT leaves its class-token ``Expand`` and ``Concat`` unshaped (2 of 474 ops);
#: the importer still lists them in the graph's meta.
_TOLERATED_UNKNOWN = 0.01


class ZooExportError(TravorderError):
    """A zoo model that could not be built, exported or imported."""


@dataclass(frozen=True)
class InputSpec:
    """The example inputs of a model.

    ``kind`` is one of :data:`INPUT_KINDS`. ``image_size`` is the image side (``None``:
    the timm model's own default, else 224); ``frames`` the clip length of video
    models; ``max_len`` caps the sequence length where the model has fewer positions
    (CLIP's 77 tokens); ``samples`` is the audio length (16 kHz).
    """

    kind: str
    image_size: int | None = None
    frames: int = 16
    max_len: int | None = None
    samples: int = 16000

    def __post_init__(self) -> None:
        if self.kind not in INPUT_KINDS:
            raise TravorderError(f"unknown input kind {self.kind!r}; one of {INPUT_KINDS}")


@dataclass(frozen=True)
class ZooModel:
    """One zoo architecture: ``builder()`` returns the ``torch.nn.Module``."""

    name: str
    family: str
    source: str
    arch: str
    builder: Callable[[], Any] = field(repr=False, compare=False)
    inputs: InputSpec
    exporters: tuple[str, ...] = EXPORTERS
    note: str = ""


@dataclass(frozen=True)
class ZooFailure:
    """A zoo model that did not make it into the corpus, and why."""

    name: str
    family: str
    source: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "family": self.family, "source": self.source,
                "reason": self.reason}


# ------------------------------------------------------------------ builders
def _torchvision(arch: str, **kwargs: Any) -> Any:
    import torchvision

    return torchvision.models.get_model(arch, weights=None, **kwargs)


def _torchvision_seg(arch: str) -> Any:
    import torchvision

    return torchvision.models.get_model(arch, weights=None, weights_backbone=None,
                                        aux_loss=False)


def _timm(arch: str) -> Any:
    import timm

    timm.layers.set_fused_attn(False)  # attention as MatMul/Softmax, as in transformers
    return timm.create_model(arch, pretrained=False)


def _transformers(model_cls: str, config_cls: str, config: Mapping[str, Any]) -> Any:
    import transformers

    cfg = getattr(transformers, config_cls)(use_cache=False, **config)
    return getattr(transformers, model_cls)._from_config(cfg, attn_implementation="eager")


def _vit_gpt2() -> Any:
    import transformers as tr

    cfg = tr.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        tr.ViTConfig(), tr.GPT2Config(add_cross_attention=True, use_cache=False))
    cfg.decoder_start_token_id = cfg.pad_token_id = 0
    return tr.VisionEncoderDecoderModel._from_config(cfg, attn_implementation="eager")


def _tv(name: str, family: str, arch: str | None = None, size: int = 224,
        kind: str = "image", **kwargs: Any) -> ZooModel:
    arch = arch or name
    build = (functools.partial(_torchvision_seg, arch) if kind == "segmentation"
             else functools.partial(_torchvision, arch, **kwargs))
    spec = InputSpec("video" if kind == "video" else "image", image_size=size)
    return ZooModel(name, family, "torchvision", arch, build, spec)


def _tm(name: str, family: str) -> ZooModel:
    return ZooModel(name, family, "timm", name, functools.partial(_timm, name),
                    InputSpec("image"))


def _hf(name: str, family: str, model_cls: str, config_cls: str, kind: str = "tokens",
        note: str = "", max_len: int | None = None, **config: Any) -> ZooModel:
    return ZooModel(name, family, "transformers", model_cls,
                    functools.partial(_transformers, model_cls, config_cls, config),
                    InputSpec(kind, image_size=224, max_len=max_len),
                    exporters=("dynamo",), note=note)


_LLAMA_LIKE = dict(hidden_act="silu", tie_word_embeddings=False)
#: SpecAugment masks and LayerDrop draw in training mode which frames and layers to skip:
#: data-dependent control flow that the exporter cannot trace. Off, the graph is the
#: full network.
_NO_RANDOM_SKIPS = dict(apply_spec_augment=False, layerdrop=0.0)

#: The zoo registry (see the module docstring). Families are architecture families.
ZOO_MODELS: tuple[ZooModel, ...] = (
    # -------------------------------------------------------------- torchvision
    *(_tv(n, "resnet") for n in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                                 "wide_resnet50_2", "wide_resnet101_2")),
    *(_tv(n, "resnext") for n in ("resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d")),
    *(_tv(n, "vgg") for n in ("vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn",
                              "vgg16_bn", "vgg19_bn")),
    _tv("alexnet", "alexnet"),
    *(_tv(n, "densenet") for n in ("densenet121", "densenet161", "densenet169",
                                   "densenet201")),
    _tv("inception_v3", "inception", size=299, aux_logits=False, init_weights=False),
    _tv("googlenet", "inception", aux_logits=False, init_weights=False),
    *(_tv(n, "mobilenet") for n in ("mobilenet_v2", "mobilenet_v3_small",
                                    "mobilenet_v3_large")),
    *(_tv(n, "mnasnet") for n in ("mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3")),
    *(_tv(n, "shufflenet") for n in ("shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
                                     "shufflenet_v2_x1_5", "shufflenet_v2_x2_0")),
    *(_tv(n, "squeezenet") for n in ("squeezenet1_0", "squeezenet1_1")),
    *(_tv(n, "efficientnet", size=s) for n, s in (
        ("efficientnet_b0", 224), ("efficientnet_b1", 240), ("efficientnet_b2", 260),
        ("efficientnet_b3", 300), ("efficientnet_b4", 380), ("efficientnet_b5", 456),
        ("efficientnet_v2_s", 384), ("efficientnet_v2_m", 480))),
    *(_tv(n, "regnet") for n in ("regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf",
                                 "regnet_x_3_2gf", "regnet_x_8gf", "regnet_y_400mf",
                                 "regnet_y_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf",
                                 "regnet_y_8gf")),
    *(_tv(n, "convnext") for n in ("convnext_tiny", "convnext_small", "convnext_base",
                                   "convnext_large")),
    *(_tv(n, "vit") for n in ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32")),
    *(_tv(n, "swin") for n in ("swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s",
                               "swin_v2_b")),
    _tv("maxvit_t", "maxvit"),
    *(_tv(n, "video_resnet", size=112, kind="video") for n in ("r3d_18", "mc3_18",
                                                                "r2plus1d_18")),
    _tv("s3d", "s3d", size=224, kind="video"),
    *(_tv(n, "fcn", size=384, kind="segmentation") for n in ("fcn_resnet50",
                                                             "fcn_resnet101")),
    *(_tv(n, "deeplab", size=384, kind="segmentation") for n in (
        "deeplabv3_resnet50", "deeplabv3_resnet101", "deeplabv3_mobilenet_v3_large",
        "lraspp_mobilenet_v3_large")),
    # -------------------------------------------------------------- timm
    *(_tm(n, "resnet") for n in ("resnet26d", "resnet50d", "seresnet50", "resnetv2_50")),
    _tm("seresnext26d_32x4d", "resnext"),
    *(_tm(n, "resnest") for n in ("resnest14d", "resnest26d", "resnest50d")),
    *(_tm(n, "res2net") for n in ("res2net50_26w_4s", "res2next50")),
    *(_tm(n, "repvgg") for n in ("repvgg_a0", "repvgg_b0")),
    *(_tm(n, "inception") for n in ("inception_v4", "inception_resnet_v2")),
    *(_tm(n, "xception") for n in ("xception41", "xception65")),
    *(_tm(n, "mobilenet") for n in ("fbnetc_100", "lcnet_100", "mobilenetv4_conv_small",
                                    "hardcorenas_a")),
    _tm("efficientnet_lite0", "efficientnet"),
    *(_tm(n, "convnext") for n in ("convnext_nano", "convnextv2_atto")),
    *(_tm(n, "vit") for n in ("deit_tiny_patch16_224", "deit_small_patch16_224",
                              "deit_base_distilled_patch16_224")),
    *(_tm(n, "beit") for n in ("beit_base_patch16_224", "beitv2_base_patch16_224")),
    *(_tm(n, "cait") for n in ("cait_xxs24_224", "cait_xxs36_224")),
    _tm("maxvit_nano_rw_256", "maxvit"),
    *(_tm(n, "pvt") for n in ("pvt_v2_b0", "pvt_v2_b1", "pvt_v2_b2")),
    *(_tm(n, "twins") for n in ("twins_svt_small", "twins_pcpvt_small")),
    *(_tm(n, "crossvit") for n in ("crossvit_tiny_240", "crossvit_9_240")),
    *(_tm(n, "xcit") for n in ("xcit_nano_12_p16_224", "xcit_tiny_12_p16_224")),
    _tm("tnt_s_patch16_224", "tnt"),
    *(_tm(n, "coatnet") for n in ("coatnet_nano_rw_224", "coatnet_0_rw_224")),
    *(_tm(n, "levit") for n in ("levit_128s", "levit_128", "levit_256")),
    *(_tm(n, "mobilevit") for n in ("mobilevit_xxs", "mobilevit_xs", "mobilevit_s",
                                    "mobilevitv2_050")),
    *(_tm(n, "efficientformer") for n in ("efficientformer_l1", "efficientformerv2_s0")),
    *(_tm(n, "mlp_mixer") for n in ("mixer_b16_224", "resmlp_12_224", "resmlp_24_224",
                                    "gmlp_ti16_224", "gmlp_s16_224")),
    *(_tm(n, "metaformer") for n in ("poolformer_s12", "poolformer_s24", "poolformerv2_s12",
                                     "convformer_s18", "caformer_s18")),
    *(_tm(n, "convmixer") for n in ("convmixer_768_32", "convmixer_1024_20_ks9_p14")),
    *(_tm(n, "ghostnet") for n in ("ghostnet_100", "ghostnetv2_100")),
    *(_tm(n, "dla") for n in ("dla34", "dla60", "dla46_c")),
    *(_tm(n, "dpn") for n in ("dpn68", "dpn92")),
    *(_tm(n, "hrnet") for n in ("hrnet_w18_small", "hrnet_w18")),
    *(_tm(n, "cspnet") for n in ("cspresnet50", "cspdarknet53", "cspresnext50", "darknet53")),
    *(_tm(n, "rexnet") for n in ("rexnet_100", "rexnet_150")),
    *(_tm(n, "nfnet") for n in ("nf_resnet50", "dm_nfnet_f0", "eca_nfnet_l0")),
    *(_tm(n, "vovnet") for n in ("ese_vovnet19b_dw", "ese_vovnet39b")),
    *(_tm(n, "sknet") for n in ("skresnet18", "skresnet34")),
    *(_tm(n, "attention_resnet") for n in ("botnet26t_256", "halonet26t",
                                           "lambda_resnet26t")),
    *(_tm(n, "edgenext") for n in ("edgenext_xx_small", "edgenext_small")),
    *(_tm(n, "fastvit") for n in ("fastvit_t8", "fastvit_sa12")),
    *(_tm(n, "pit") for n in ("pit_ti_224", "pit_s_224")),
    _tm("focalnet_tiny_srf", "focalnet"),
    _tm("davit_tiny", "davit"),
    _tm("gcvit_xxtiny", "gcvit"),
    _tm("volo_d1_224", "volo"),
    _tm("convit_tiny", "convit"),
    _tm("nest_tiny", "nest"),
    _tm("selecsls42b", "selecsls"),
    _tm("tresnet_m", "tresnet"),
    _tm("sequencer2d_s", "sequencer"),
    _tm("hgnetv2_b0", "hgnet"),
    _tm("repvit_m1", "repvit"),
    _tm("efficientvit_b0", "efficientvit"),
    _tm("inception_next_tiny", "metaformer"),
    *(_tm(n, "nasnet") for n in ("nasnetalarge", "pnasnet5large")),
    *(_tm(n, "mixnet") for n in ("mixnet_s", "mixnet_m")),
    *(_tm(n, "repghost") for n in ("repghostnet_050", "repghostnet_100")),
    *(_tm(n, "visformer") for n in ("visformer_tiny", "visformer_small")),
    *(_tm(n, "coat") for n in ("coat_lite_tiny", "coat_tiny")),
    _tm("mvitv2_tiny", "mvitv2"),
    *(_tm(n, "tiny_vit") for n in ("tiny_vit_5m_224", "tiny_vit_11m_224")),
    _tm("hiera_tiny_224", "hiera"),
    _tm("eva02_tiny_patch14_224", "eva"),
    *(_tm(n, "starnet") for n in ("starnet_s1", "starnet_s2")),
    *(_tm(n, "mobileone") for n in ("mobileone_s0", "mobileone_s1")),
    *(_tm(n, "gernet") for n in ("gernet_s", "gernet_m")),
    _tm("rdnet_tiny", "rdnet"),
    *(_tm(n, "mambaout") for n in ("mambaout_femto", "mambaout_kobe")),
    _tm("nextvit_small", "nextvit"),
    _tm("vitamin_small_224", "vitamin"),
    *(_tm(n, "shvit") for n in ("shvit_s1", "shvit_s2")),
    *(_tm(n, "fasternet") for n in ("fasternet_t0", "fasternet_t1")),
    *(_tm(n, "swiftformer") for n in ("swiftformer_xs", "swiftformer_s")),
    # -------------------------------------------------------------- transformers
    _hf("bert_base", "bert", "BertForMaskedLM", "BertConfig"),
    _hf("bert_large", "bert", "BertForMaskedLM", "BertConfig", hidden_size=1024,
        num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    _hf("roberta_base", "bert", "RobertaForMaskedLM", "RobertaConfig", vocab_size=50265,
        max_position_embeddings=514, type_vocab_size=1, pad_token_id=1),
    _hf("distilbert_base", "bert", "DistilBertForMaskedLM", "DistilBertConfig"),
    _hf("electra_small", "bert", "ElectraForMaskedLM", "ElectraConfig", embedding_size=128,
        hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    _hf("electra_base", "bert", "ElectraForMaskedLM", "ElectraConfig", embedding_size=768,
        hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    _hf("albert_base", "albert", "AlbertForMaskedLM", "AlbertConfig", hidden_size=768,
        num_attention_heads=12, intermediate_size=3072),
    _hf("albert_large", "albert", "AlbertForMaskedLM", "AlbertConfig", hidden_size=1024,
        num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    _hf("deberta_base", "deberta", "DebertaForMaskedLM", "DebertaConfig"),
    _hf("deberta_v3_base", "deberta", "DebertaV2ForMaskedLM", "DebertaV2Config",
        vocab_size=128100, relative_attention=True, position_buckets=256,
        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
        max_relative_positions=-1, position_biased_input=False),
    _hf("convbert_base", "convbert", "ConvBertForMaskedLM", "ConvBertConfig"),
    _hf("gpt2", "gpt", "GPT2LMHeadModel", "GPT2Config"),
    _hf("gpt2_medium", "gpt", "GPT2LMHeadModel", "GPT2Config", n_embd=1024, n_layer=24,
        n_head=16),
    _hf("distilgpt2", "gpt", "GPT2LMHeadModel", "GPT2Config", n_layer=6),
    _hf("gpt_neo_125m", "gpt", "GPTNeoForCausalLM", "GPTNeoConfig", hidden_size=768,
        num_layers=12, num_heads=12, attention_types=[[["global", "local"], 6]]),
    _hf("gptj_6l", "gpt", "GPTJForCausalLM", "GPTJConfig", n_embd=1024, n_layer=6, n_head=16,
        rotary_dim=64, note="GPT-J block, 6 layers of width 1024"),
    _hf("opt_125m", "gpt", "OPTForCausalLM", "OPTConfig"),
    _hf("opt_350m", "gpt", "OPTForCausalLM", "OPTConfig", hidden_size=1024, ffn_dim=4096,
        num_hidden_layers=24, num_attention_heads=16, word_embed_proj_dim=512),
    _hf("bloom_6l", "gpt", "BloomForCausalLM", "BloomConfig", hidden_size=1024, n_layer=6,
        n_head=16, note="bloom-560m width and vocabulary, 6 of 24 layers"),
    _hf("llama_tiny", "llama", "LlamaForCausalLM", "LlamaConfig", hidden_size=512,
        intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=32000, note="4 layers, width 512",
        **_LLAMA_LIKE),
    _hf("llama_1b_4l", "llama", "LlamaForCausalLM", "LlamaConfig", hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256,
        note="Llama-3.2-1B width, heads and vocabulary, 4 of 16 layers", **_LLAMA_LIKE),
    _hf("mistral_4l", "llama", "MistralForCausalLM", "MistralConfig", hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, sliding_window=4096,
        note="Mistral-7B width, heads and vocabulary, 2 of 32 layers", **_LLAMA_LIKE),
    _hf("qwen2_6l", "llama", "Qwen2ForCausalLM", "Qwen2Config", hidden_size=896,
        intermediate_size=4864, num_hidden_layers=6, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936,
        note="Qwen2-0.5B width, heads and vocabulary, 6 of 24 layers", **_LLAMA_LIKE),
    _hf("phi_4l", "llama", "PhiForCausalLM", "PhiConfig", hidden_size=2048,
        intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
        vocab_size=51200, note="phi-1.5 width and vocabulary, 4 of 24 layers"),
    _hf("t5_small", "t5", "T5ForConditionalGeneration", "T5Config", kind="seq2seq"),
    _hf("t5_base", "t5", "T5ForConditionalGeneration", "T5Config", kind="seq2seq",
        d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    _hf("t5_v1_1_small", "t5", "T5ForConditionalGeneration", "T5Config", kind="seq2seq",
        d_ff=1024, num_layers=8, num_heads=6, d_kv=64, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, vocab_size=32128),
    _hf("bart_base", "bart", "BartForConditionalGeneration", "BartConfig", kind="seq2seq",
        d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072),
    _hf("marian_en_de", "bart", "MarianMTModel", "MarianConfig", kind="seq2seq",
        vocab_size=58101, decoder_start_token_id=58100, pad_token_id=58100),
    _hf("pegasus_6l", "bart", "PegasusForConditionalGeneration", "PegasusConfig",
        kind="seq2seq", encoder_layers=6, decoder_layers=6,
        note="pegasus-large width and vocabulary, 6 of 16 layers each side"),
    _hf("blenderbot_small", "bart", "BlenderbotSmallForConditionalGeneration",
        "BlenderbotSmallConfig", kind="seq2seq"),
    _hf("wav2vec2_base", "wav2vec2", "Wav2Vec2ForCTC", "Wav2Vec2Config", kind="audio",
        **_NO_RANDOM_SKIPS),
    _hf("hubert_base", "wav2vec2", "HubertForCTC", "HubertConfig", kind="audio",
        **_NO_RANDOM_SKIPS),
    _hf("wavlm_base", "wav2vec2", "WavLMForCTC", "WavLMConfig", kind="audio",
        **_NO_RANDOM_SKIPS),
    _hf("whisper_tiny", "whisper", "WhisperForConditionalGeneration", "WhisperConfig",
        kind="speech_seq2seq", d_model=384, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
        decoder_ffn_dim=1536),
    _hf("whisper_base", "whisper", "WhisperForConditionalGeneration", "WhisperConfig",
        kind="speech_seq2seq", d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048),
    _hf("clip_vit_b32", "clip", "CLIPModel", "CLIPConfig", kind="image_text", max_len=77),
    _hf("siglip_base", "clip", "SiglipModel", "SiglipConfig", kind="image_text", max_len=64),
    _hf("segformer_b0", "segformer", "SegformerForSemanticSegmentation", "SegformerConfig",
        kind="image", hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=256),
    _hf("dinov2_small", "vit", "Dinov2Model", "Dinov2Config", kind="image", hidden_size=384,
        num_attention_heads=6, image_size=224),
    ZooModel("vit_gpt2", "vision_encoder_decoder", "transformers",
             "VisionEncoderDecoderModel", _vit_gpt2, InputSpec("image_seq2seq", 224),
             exporters=("dynamo",), note="ViT-Base encoder, GPT-2 decoder"),
)


# ------------------------------------------------------------------ selection
def select_models(names: Iterable[str] | None = None, families: Iterable[str] | None = None,
                  models: Sequence[ZooModel] = ZOO_MODELS) -> list[ZooModel]:
    """The models named in ``names`` or belonging to ``families`` (all when both are
    ``None``), in registry order. An unknown name or family is an error."""
    if names is None and families is None:
        return list(models)
    wanted, fams = set(names or ()), set(families or ())
    for label, chosen, have in (("model", wanted, {m.name for m in models}),
                                ("family", fams, {m.family for m in models})):
        if unknown := sorted(chosen - have):
            raise TravorderError(f"no zoo {label} named {unknown[0]!r}")
    return [m for m in models if m.name in wanted or m.family in fams]


# ------------------------------------------------------------------ one model
def _offline() -> None:
    os.environ.update(_OFFLINE_ENV)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line; an exporter's wrapping error names its root cause."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = _ANSI.sub("", " ".join(str(root).split())) or "(no message)"
    text = f"{type(root).__name__}: {text}"
    if root is not exc:
        text = f"{type(exc).__name__} <- {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _first_tensor(out: Any) -> Any:
    """The first tensor of a model's output (a tensor, tuple, dict or ModelOutput)."""
    import torch

    while not isinstance(out, torch.Tensor):
        out = next(iter(out.values())) if isinstance(out, Mapping) else out[0]
    return out


def _example_inputs(model: ZooModel, module: Any, batch_size: int,
                    seq_len: int) -> dict[str, Any]:
    import torch

    spec, b = model.inputs, batch_size
    size = spec.image_size
    if size is None:  # timm models know their own input size
        size = int(getattr(module, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[-1])
    length = min(seq_len, spec.max_len or seq_len)
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> Any:
        return torch.randint(0, 1000, (b, n), generator=gen)  # every vocabulary has 1000

    def image() -> Any:
        return torch.randn(b, 3, size, size, generator=gen)

    return {
        "image": lambda: {"pixel_values": image()},
        "video": lambda: {"video": torch.randn(b, 3, spec.frames, size, size, generator=gen)},
        "tokens": lambda: {"input_ids": ids(length)},
        "seq2seq": lambda: {"input_ids": ids(length), "decoder_input_ids": ids(length)},
        "audio": lambda: {"input_values": torch.randn(b, spec.samples, generator=gen)},
        "speech_seq2seq": lambda: {"input_features": torch.randn(b, 80, 3000, generator=gen),
                                   "decoder_input_ids": ids(length)},
        "image_text": lambda: {"input_ids": ids(length), "pixel_values": image()},
        "image_seq2seq": lambda: {"pixel_values": image(), "decoder_input_ids": ids(length)},
    }[spec.kind]()


def _wrap(module: Any, input_names: list[str], keywords: bool) -> Any:
    """A module taking the inputs positionally and returning one tensor."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = module

        def forward(self, *xs: Any) -> Any:
            out = (self.model(**dict(zip(input_names, xs, strict=True))) if keywords
                   else self.model(*xs))
            return _first_tensor(out)

    return Forward()


def _export(exporter: str, module: Any, args: tuple[Any, ...]) -> Any:
    import torch

    with torch.no_grad():
        if exporter == "dynamo":
            return torch.onnx.export(module, args, dynamo=True, optimize=True,
                                     verbose=False).model_proto
        buf = io.BytesIO()
        torch.onnx.export(module, args, buf, dynamo=False, do_constant_folding=True,
                          training=torch.onnx.TrainingMode.TRAINING)
        return buf.getvalue()


def _versions(source: str) -> dict[str, str]:
    libs = ("torch", *_SOURCE_MODULES.get(source, ()))
    return {lib: importlib.import_module(lib).__version__ for lib in libs}


def export_graph(model: ZooModel, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 seq_len: int = DEFAULT_SEQ_LEN) -> OpGraph:
    """Build ``model`` with random weights, export its training-mode forward pass to ONNX
    and import it, trying ``model.exporters`` in turn; an exporter whose graph keeps
    ops of unknown shape gives way to the next one. At ``batch_size=1``, a model whose
    batch norm needs two samples in training mode is exported at batch size 2.

    The graph's meta has the ``family``, ``source`` (``library:arch``), ``builder``,
    ``batch_size``, ``seq_len`` (token inputs), ``exporter`` (and the reasons earlier
    exporters gave way, ``exporter_fallbacks``), ``input_shapes`` and library versions.
    Raises :class:`ZooExportError` with every exporter's reason.
    """
    _offline()
    try:
        module = model.builder()
        module.train()
    except Exception as exc:  # any library error while building is the model's failure
        raise ZooExportError(f"build: {_one_line(exc)}") from None
    from travorder.graph.onnx_import import read_onnx

    reasons: list[str] = []
    batch = batch_size
    for k, exporter in enumerate(model.exporters):
        try:
            inputs = _example_inputs(model, module, batch, seq_len)
            wrapped = _wrap(module, list(inputs), keywords=model.source == "transformers")
            g = read_onnx(_export(exporter, wrapped, tuple(inputs.values())), name=model.name)
        except Exception as exc:  # exporter and importer errors alike: try the next
            if batch == 1 and _ONE_SAMPLE_BN in str(exc):
                return export_graph(model, batch_size=2, seq_len=seq_len)
            reasons.append(f"{exporter}: {_one_line(exc)}")
            continue
        if (g.meta["n_unknown_shape_ops"] > _TOLERATED_UNKNOWN * g.n_nodes
                and k + 1 < len(model.exporters)):
            reasons.append(f"{exporter}: {g.meta['n_unknown_shape_ops']} ops of unknown shape")
            continue
        tokens = model.inputs.kind not in ("image", "video", "audio")
        return g.replace(meta={
            "family": model.family, "source": f"{model.source}:{model.arch}",
            "builder": ZOO_BUILDER, "builder_version": ZOO_BUILDER_VERSION,
            "batch_size": batch, "seq_len": min(seq_len, model.inputs.max_len or seq_len)
            if tokens else None, "input_shapes": {key: list(x.shape) for key, x in inputs.items()},
            "exporter": exporter, "exporter_fallbacks": reasons, "mode": "train",
            "note": model.note, "versions": _versions(model.source)})
    raise ZooExportError("; ".join(reasons))


# ------------------------------------------------------------------ many models
def _worker(model: ZooModel, batch_size: int, seq_len: int, conn: Any) -> None:
    try:
        g = export_graph(model, batch_size=batch_size, seq_len=seq_len)
        conn.send(("ok", graph_to_dict(g)))
    except ZooExportError as exc:
        conn.send(("error", str(exc)))
    except Exception as exc:  # a bug or library error: report it, the build goes on
        conn.send(("error", _one_line(exc)))
    finally:
        conn.close()


def _context(models: Sequence[ZooModel]) -> Any:
    """A forkserver context that imports torch and the models' libraries once, so each
    worker starts in a fraction of a second."""
    ctx = multiprocessing.get_context("forkserver")
    wanted = {lib for m in models for lib in _SOURCE_MODULES.get(m.source, ())}
    if wanted:
        ctx.set_forkserver_preload(["torch", "onnx", *sorted(wanted),
                                    "travorder.graph.onnx_import", __name__])
    return ctx


def _export_isolated(ctx: Any, model: ZooModel, batch_size: int, seq_len: int,
                     timeout_s: float) -> OpGraph:
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(model, batch_size, seq_len, send), daemon=True)
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout_s):
            raise ZooExportError(f"timed out after {timeout_s:g} s")
        try:
            status, payload = recv.recv()
        except EOFError:
            proc.join()
            killed = " (killed: out of memory?)" if proc.exitcode == -9 else ""
            raise ZooExportError(f"worker exited with code {proc.exitcode} before "
                                 f"reporting{killed}") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()
    if status != "ok":
        raise ZooExportError(payload)
    return graph_from_dict(payload, model.name)


def _write_failures(corpus_dir: Path, done: Iterable[str], failures: list[ZooFailure]) -> None:
    """Merge ``failures`` into the corpus's failure list, dropping models now ``done``."""
    path = corpus_dir / FAILURES_NAME
    old = json.loads(path.read_text()) if path.exists() else []
    rows = {r["name"]: r for r in old}
    for name in done:
        rows.pop(name, None)
    rows.update((f.name, f.to_dict()) for f in failures)
    write_file(path, json.dumps([rows[k] for k in sorted(rows)], indent=1) + "\n",
               "zoo failures")


def read_failures(corpus_dir: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The zoo models that failed the last build into ``corpus_dir``, with reasons."""
    path = Path(corpus_dir) / FAILURES_NAME
    return json.loads(path.read_text()) if path.exists() else []


def build_zoo(
    corpus_dir: str | os.PathLike[str] | None,
    *,
    names: Iterable[str] | None = None,
    families: Iterable[str] | None = None,
    models: Sequence[ZooModel] = ZOO_MODELS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seq_len: int = DEFAULT_SEQ_LEN,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    max_nodes: int = DEFAULT_MAX_NODES,
    progress: Callable[[int, int, ZooModel, OpGraph | ZooFailure], None] | None = None,
) -> tuple[list[OpGraph], list[ZooFailure]]:
    """Export the selected zoo models (see :func:`select_models`) and return the
    imported graphs and the failures.

    Each model runs in its own worker process, killed after ``timeout_s`` seconds
    (``None``: in this process, without a timeout). With ``corpus_dir``, every graph is
    added to that corpus as soon as it is built (coarsened above ``max_nodes`` ops, see
    :func:`travorder.datasets.corpus.add_to_corpus`) and the failures are kept in its
    ``zoo_failures.json``, so an interrupted build keeps what it made. ``progress`` is
    called after each model with its position, the total, the model and the outcome.
    """
    if batch_size < 1 or seq_len < 1:
        raise TravorderError("batch_size and seq_len must be positive")
    if timeout_s is not None and not 0 < timeout_s < math.inf:
        raise TravorderError(f"the timeout must be a positive number of seconds, not "
                             f"{timeout_s!r}")
    chosen = select_models(names, families, models)
    needs = ["torch", *sorted({lib for m in chosen for lib in _SOURCE_MODULES.get(m.source,
                                                                                   ())})]
    if missing := [lib for lib in needs if importlib.util.find_spec(lib) is None]:
        raise TravorderError(f"zoo build of these models needs {', '.join(needs)}; not "
                             f"installed here: {', '.join(missing)} (docs/zoo.md: the zoo "
                             f"environment)")
    root = None if corpus_dir is None else Path(corpus_dir)
    if root is not None:
        if root.exists() and not root.is_dir():
            raise TravorderError(f"corpus {str(root)!r} is not a folder")
        try:  # the corpus folder, not its parents: a typo should not make folders
            root.mkdir(exist_ok=True)
        except OSError as exc:
            raise TravorderError(f"cannot make corpus folder {str(root)!r}: "
                                 f"{exc.strerror or exc}") from None
    _offline()
    ctx = _context(chosen) if timeout_s is not None else None
    graphs: list[OpGraph] = []
    failures: list[ZooFailure] = []
    for i, model in enumerate(chosen):
        outcome: OpGraph | ZooFailure
        try:
            outcome = (export_graph(model, batch_size=batch_size, seq_len=seq_len)
                       if ctx is None else
                       _export_isolated(ctx, model, batch_size, seq_len, timeout_s))
            if root is not None:
                add_to_corpus([outcome], root, max_nodes=max_nodes)
            graphs.append(outcome)
        except TravorderError as exc:  # ZooExportError, or a graph the corpus refuses
            outcome = ZooFailure(model.name, model.family, model.source, str(exc))
            failures.append(outcome)
        if root is not None:
            _write_failures(root, [model.name] if isinstance(outcome, OpGraph) else [],
                            [outcome] if isinstance(outcome, ZooFailure) else [])
        if progress is not None:
            progress(i + 1, len(chosen), model, outcome)
    return graphs, failures


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_SEQ_LEN",
    "DEFAULT_TIMEOUT_S",
    "ZOO_MODELS",
    "InputSpec",
    "ZooExportError",
    "ZooFailure",
    "ZooModel",
    "build_zoo",
    "export_graph",
    "read_failures",
    "select_models",
]
