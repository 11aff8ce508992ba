"""``python -m elfes``: the ``elfes`` command line (login-node commands never import torch)."""

from elfes.launcher.cli.main import run

run()
