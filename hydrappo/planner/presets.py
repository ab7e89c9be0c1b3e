"""Model configurations of public models, by name, for benchmarks and memory planning.

Numbers are those published in each model's config.json (hidden size, intermediate
size, layers, attention and key/value heads, head dim, vocabulary, tied embeddings,
RoPE settings); models are built from them with random weights (no download), or on
the meta device to count parameters (`hydrappo memory`). Names are case-insensitive.
"""

from __future__ import annotations

from transformers import AutoConfig

_LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)

# What the models of one family share; each preset below adds its sizes.
_SMOLLM2 = dict(
    model_type="llama",
    head_dim=64,
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
_LLAMA3 = dict(model_type="llama", vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5)
_QWEN25 = dict(
    model_type="qwen2",
    vocab_size=151936,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)


def _sizes(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> dict:
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
    )


PRESETS: dict[str, dict] = {
    # HuggingFaceTB/SmolLM2-*: Llama architecture, tied embeddings, vocabulary 49152.
    "smollm2-135m": dict(_SMOLLM2, **_sizes(576, 1536, 30, 9, 3)),
    "smollm2-360m": dict(_SMOLLM2, **_sizes(960, 2560, 32, 15, 5)),
    "smollm2-1.7b": dict(_SMOLLM2, **_sizes(2048, 8192, 24, 32, 32), rope_theta=130000.0),
    # meta-llama/Llama-3.*: vocabulary 128256, llama3 RoPE scaling.
    "llama-3.2-1b": dict(
        _LLAMA3,
        **_sizes(2048, 8192, 16, 32, 8),
        head_dim=64,
        tie_word_embeddings=True,
        rope_parameters=dict(_LLAMA3_ROPE, factor=32.0),
    ),
    "llama-3.2-3b": dict(
        _LLAMA3,
        **_sizes(3072, 8192, 28, 24, 8),
        head_dim=128,
        tie_word_embeddings=True,
        rope_parameters=dict(_LLAMA3_ROPE, factor=32.0),
    ),
    "llama-3.1-8b": dict(
        _LLAMA3,
        **_sizes(4096, 14336, 32, 32, 8),
        head_dim=128,
        tie_word_embeddings=False,
        rope_parameters=dict(_LLAMA3_ROPE, factor=8.0),
    ),
    # Qwen/Qwen2.5-*: biases on q/k/v, vocabulary 151936 (152064 for 7B).
    "qwen2.5-0.5b": dict(_QWEN25, **_sizes(896, 4864, 24, 14, 2)),
    "qwen2.5-1.5b": dict(_QWEN25, **_sizes(1536, 8960, 28, 12, 2)),
    "qwen2.5-7b": dict(_QWEN25, **_sizes(3584, 18944, 28, 28, 4), vocab_size=152064, tie_word_embeddings=False),
    # mistralai/Mistral-7B-v0.3 (v0.1: vocabulary 32000 and a 4096-token sliding window).
    "mistral-7b": dict(
        model_type="mistral",
        **_sizes(4096, 14336, 32, 32, 8),
        head_dim=128,
        vocab_size=32768,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
}


# Published parameter counts (from the model cards / safetensors metadata), checked by the tests.
PUBLISHED_PARAMETERS = {
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "mistral-7b": 7_248_023_552,
}


def preset_config(name: str, **overrides):
    """A transformers config for a preset name (see PRESETS)."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}.")
    values = dict(PRESETS[key], **overrides)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)
