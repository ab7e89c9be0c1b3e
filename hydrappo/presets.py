"""Model configurations of public models, by name, for benchmarks and memory planning.

Numbers are those published in each model's config.json; models are built from them
with random weights (no download).
"""

from __future__ import annotations

from transformers import AutoConfig

PRESETS: dict[str, dict] = {
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
    ),
}


def preset_config(name: str, **overrides):
    """A transformers config for a preset name (see PRESETS)."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}.")
    values = dict(PRESETS[key], **overrides)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)
