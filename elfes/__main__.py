"""``python -m elfes``: the ``elfes`` command line (login-node commands never import torch)."""

from elfes.launcher.cli.main import run  # type: ignore[import-not-found]  # launcher/, installed as elfes.launcher

run()
