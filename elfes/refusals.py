"""The engine's refusals of a run's own settings, as types both sides know (torch-free).

The engine raises :class:`ConfigurationError` where it refuses what it was given before it trains on it: a
``TrainConfig`` value, loader settings under which ranks would not train exact, equal shards, an unusable
checkpoint folder, an unknown weights choice. Such a refusal is deterministic: the same settings are refused
again on any node, so the launcher ends the attempt at once instead of retrying it (launcher/job/failures.py
recognises the type, never the message). It is a ``ValueError`` (:class:`ConfigurationTypeError`, for a value
of the wrong type, also a ``TypeError``), so code that caught those before still does.

>>> try:  # doctest: +SKIP
...     trainer.train(TrainConfig(epochs=0))
... except ConfigurationError as error:
...     print(error)                          # what is refused, and what to do
"""

from __future__ import annotations


class ConfigurationError(ValueError):
    """A setting the engine refuses before training on it; a retry with the same settings is refused again."""


class ConfigurationTypeError(ConfigurationError, TypeError):
    """A setting of the wrong type, refused like :class:`ConfigurationError`."""
