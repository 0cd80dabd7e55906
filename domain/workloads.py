"""The workload families the trainer runs, without importing torch.

Each family is a small version of a model family of the seeds' traces; `for_trace_model` maps a
trace's model name (Muri, ElasticFlow, Gavel) to the family the node agent should launch.
`services/trainer/workloads.py` holds the torch implementations, one per name here.
"""

from __future__ import annotations

FAMILIES: dict[str, str] = {
    "cnn": "2-layer CNN on synthetic 3x16x16 images, 10 classes (ResNet/VGG/ShuffleNet jobs)",
    "transformer": "2-layer causal transformer LM on synthetic Markov-chain tokens (BERT/GPT-2)",
    "lstm": "1-layer LSTM sequence classifier on synthetic token sequences (Gavel LM, DS2)",
    "rl": "actor-critic policy on a synthetic contextual-bandit environment (A2C/DQN/A3C)",
}

# Lower-cased trace model-name prefixes → family; the first matching prefix wins.
_TRACE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("resnet", "cnn"), ("vgg", "cnn"), ("shufflenet", "cnn"), ("inception", "cnn"),
    ("cyclegan", "cnn"), ("bert", "transformer"), ("gpt", "transformer"),
    ("transformer", "transformer"), ("lm", "lstm"), ("lstm", "lstm"), ("deepspeech", "lstm"),
    ("a2c", "rl"), ("a3c", "rl"), ("dqn", "rl"),
)


def for_trace_model(name: str) -> str | None:
    """The family for a trace model name (`vgg16`, `ResNet-50 (batch size 32)`, `a2c`)."""
    key = name.strip().lower()
    for prefix, family in _TRACE_PREFIXES:
        if key.startswith(prefix):
            return family
    return None


def trace_prefixes() -> dict[str, tuple[str, ...]]:
    """Family → the lower-cased model-name prefixes that run as it (`loom models`)."""
    out: dict[str, tuple[str, ...]] = {family: () for family in FAMILIES}
    for prefix, family in _TRACE_PREFIXES:
        out[family] += (prefix,)
    return out
