"""Synthetic token data: sequences of token ids (float32 values, exact integers below 2^24, so
the data pipeline carries one dtype) for networks that read tokens through an embedding.

* :func:`synthetic_tokens`: sequence classification, one class per sequence (a transformer
  that pools its tokens, as the ``transformer`` preset does).
* :func:`synthetic_next_tokens`: language modelling, a label per token (the next token), for
  a network that ends in ``token_cross_entropy``.
"""

from __future__ import annotations

import numpy as np

from pdlsim.train.dataset import DataError, Dataset, check_counts

__all__ = ["check_tokens", "synthetic_next_tokens", "synthetic_tokens"]

# Classification: the share of a sample's tokens drawn from its class's topic, and the size of
# a topic (or an eighth of the vocabulary, if larger).
_TOPIC_SHARE = 0.25
_TOPIC_TOKENS = 32
# Language modelling: each token's successors, and the share of steps that follow them.
_SUCCESSORS = 4
_FOLLOW_SHARE = 0.8


def check_tokens(tokens: int, vocabulary: int) -> None:
    """A DataError where synthetic token sequences of this length and vocabulary cannot be drawn."""
    if tokens < 1 or vocabulary < 2:
        raise DataError(
            "synthetic tokens need tokens >= 1 and a vocabulary >= 2, got "
            f"{tokens} and {vocabulary}"
        )


def synthetic_tokens(
    tokens: int,
    vocabulary: int,
    num_classes: int,
    n_samples: int,
    seed: int = 0,
    *,
    train: bool = True,
) -> Dataset:
    """A learnable sequence-classification set of token ids (float32 values, exact integers):
    each class has a topic, a few dozen tokens with random weights; a token of a sample comes
    from its class's topic with probability :data:`_TOPIC_SHARE`, else uniformly from the
    vocabulary. Topics overlap, so a sequence must be read as a whole (one token rarely
    decides the class). ``seed`` and ``train`` as for :func:`synthetic`."""
    check_tokens(tokens, vocabulary)
    check_counts(num_classes, n_samples)
    topic_seed, train_seed, test_seed = np.random.SeedSequence(seed).spawn(3)
    prng = np.random.default_rng(topic_seed)
    size = min(vocabulary, max(2, vocabulary // 8, _TOPIC_TOKENS))
    topics = np.stack([prng.choice(vocabulary, size, replace=False) for _ in range(num_classes)])
    weights = prng.dirichlet(np.ones(size), size=num_classes)
    rng = np.random.default_rng(train_seed if train else test_seed)
    y = rng.permutation(np.arange(n_samples, dtype=np.int64) % num_classes)
    pick = (weights[y].cumsum(axis=1)[:, None, :] < rng.random((n_samples, tokens, 1))).sum(-1)
    topical = np.take_along_axis(topics[y], np.minimum(pick, size - 1), axis=1)
    background = rng.integers(0, vocabulary, (n_samples, tokens))
    x = np.where(rng.random((n_samples, tokens)) < _TOPIC_SHARE, topical, background)
    return Dataset(x.astype(np.float32), y, "synthetic tokens", num_classes)


def synthetic_next_tokens(
    tokens: int, vocabulary: int, n_samples: int, seed: int = 0, *, train: bool = True
) -> Dataset:
    """A learnable next-token task: sequences of a Markov chain in which each token has
    :data:`_SUCCESSORS` likely successors (drawn from ``seed``), followed with probability
    :data:`_FOLLOW_SHARE`, else any token; the label of each position is the token after it.
    A model that learns the successor table predicts up to about 80% / 4 + 20% / vocabulary
    of the labels. ``seed`` and ``train`` as for :func:`pdlsim.train.data.synthetic`."""
    check_tokens(tokens, vocabulary)
    check_counts(vocabulary, n_samples)
    table_seed, train_seed, test_seed = np.random.SeedSequence(seed).spawn(3)
    successors = np.random.default_rng(table_seed).integers(
        0, vocabulary, (vocabulary, _SUCCESSORS)
    )
    rng = np.random.default_rng(train_seed if train else test_seed)
    chain = np.empty((n_samples, tokens + 1), dtype=np.int64)
    chain[:, 0] = rng.integers(0, vocabulary, n_samples)
    for t in range(tokens):
        follow = successors[chain[:, t], rng.integers(0, _SUCCESSORS, n_samples)]
        jump = rng.integers(0, vocabulary, n_samples)
        chain[:, t + 1] = np.where(rng.random(n_samples) < _FOLLOW_SHARE, follow, jump)
    x = np.ascontiguousarray(chain[:, :-1], dtype=np.float32)
    return Dataset(x, np.ascontiguousarray(chain[:, 1:]), "synthetic next tokens", vocabulary)
