"""What a code snapshot leaves out by default, besides what git ignores (launcher/submit/snapshot.py):

- what looks like a credential (:func:`looks_secret`): a file or folder named like one
  (:data:`SECRET_PATTERNS`: dot-env files, SSH, cloud and ML-platform token files), or a file whose first
  :data:`PREFIX_BYTES` hold a private key (``-----BEGIN ... PRIVATE KEY-----``, whatever the file's name) or a
  cloud service account's key (a JSON with ``"type": "service_account"`` and ``"private_key"``). Named at
  submission (launcher/submit/code_plan.py): the snapshot often lies on a shared file system.
- what ELFES itself writes under a workdir, which is not code: run directories, sweep folders and tracker stores'
  folders, recognised by what they hold (:func:`is_output_folder`: a code package named ``wandb`` is code), and
  files (:func:`elfes_output`): an MLflow SQLite store and SQLite's journals (:data:`TRACKER_STORE_FILES`),
  checkpoints (:data:`CHECKPOINTS`). So "the workdir changed" at a resume lists code, and the snapshot's fingerprint
  changes with the code only.

A ``snapshot.include`` pattern brings either back. Torch-free.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ..rundir.paths import RunPaths, SweepPaths

# Names of credential files and folders, matched like snapshot.exclude (a folder's files are all left out).
SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".git-credentials", ".pgpass", ".pypirc", ".npmrc",
    ".ssh", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk",
    ".aws", ".azure", ".kube", ".config/gcloud", "*/.config/gcloud", ".docker/config.json", "*/.docker/config.json",
    ".dockercfg", "application_default_credentials.json", "credentials.json",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.keystore", "*.jks",
    # The ML ecosystem's token files: Kaggle, Hugging Face, MLflow, Databricks, GitHub's CLI, S3 tools, Vault.
    ".kaggle", "kaggle.json", "*huggingface/token", "*huggingface/stored_tokens", "*.mlflow/credentials",
    ".databrickscfg", "*gh/hosts.yml", ".s3cfg", ".boto", ".vault-token", "rclone.conf", ".htpasswd",
    "secrets.yaml", "secrets.yml", "secrets.json", "secrets.toml", ".secrets",
    # Comet, Modal and ClearML keep their keys in a file too; GnuPG's keyring, PuTTY's keys, a Google OAuth client.
    ".comet.config", ".modal.toml", "clearml.conf", ".gnupg", "*.ppk", "client_secret*.json",
)
# A copy of an SSH key under another name (id_rsa.bak, id_ed25519~); its public half (.pub) is no secret.
KEY_COPY = re.compile(r"id_(?:rsa|dsa|ecdsa|ed25519)(?:_sk)?[.~_-].*(?<!\.pub)")
PREFIX_BYTES = 64 * 1024  # what is read of a file to recognise a key in it: a key file is far smaller
PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
SERVICE_ACCOUNT = re.compile(rb'"type"\s*:\s*"service_account"')
# The files trackers write beside the code (MLflow's default SQLite store, SQLite's journals of a store being
# written) and checkpoints (single files, and a sharded checkpoint's shards and metadata).
TRACKER_STORE_FILES = ("mlflow.db", "*.db-journal", "*.db-wal", "*.db-shm", "*.sqlite-journal", "*.sqlite-wal",
                       "*.sqlite-shm")
CHECKPOINTS = ("*.pt", "*.pth", "*.ckpt", "*.safetensors", "*.distcp", ".metadata")


def matches(relative: str, patterns: Iterable[str]) -> bool:
    """Whether ``relative`` (a posix path under workdir) or one of its parent folders matches a pattern."""
    path = PurePosixPath(relative)
    candidates = [str(path), path.name, *(str(parent) for parent in path.parents if str(parent) != "."),
                  *path.parts[:-1]]
    return any(fnmatch.fnmatchcase(candidate, pattern.rstrip("/")) for pattern in patterns for candidate in candidates)


def holds_private_key(path: Path) -> bool:
    """Whether the first :data:`PREFIX_BYTES` of the file ``path`` hold a private key or a service account's key
    (False for what cannot be read: a file that vanished is not copied either)."""
    try:
        if path.is_symlink() or not path.is_file():
            return False  # a link is copied as a link, never what it points to
        with open(path, "rb") as stream:
            head = stream.read(PREFIX_BYTES)
    except OSError:
        return False
    return bool(PRIVATE_KEY.search(head)) or (SERVICE_ACCOUNT.search(head) is not None and b'"private_key"' in head)


def looks_secret(workdir: Path, relative: str) -> bool:
    """Whether ``workdir/relative`` looks like a credential: by its name, or by its content."""
    named = relative.lower()  # .ENV, Secrets.yaml, ID_RSA.bak: a name in other case is the same secret
    return (matches(named, SECRET_PATTERNS) or KEY_COPY.fullmatch(PurePosixPath(named).name) is not None
            or holds_private_key(workdir / relative))


def checkpoint(relative: str) -> bool:
    """Whether ``relative`` is a checkpoint file (or lies in a sharded checkpoint's folder)."""
    return matches(relative, CHECKPOINTS)


def elfes_output(relative: str) -> bool:
    """Whether ``relative`` is a tracker's store (or its journal) or a checkpoint."""
    return matches(relative, TRACKER_STORE_FILES) or checkpoint(relative)


def is_output_folder(folder: Path) -> bool:
    """A run directory (its recorded spec and state), a sweep folder, a virtual environment, or a tracker's store
    (:func:`is_tracker_store`): never copied."""
    run = RunPaths(folder)
    return ((run.spec.is_file() and run.state.is_file()) or SweepPaths(folder).record.is_file()
            or (folder / "pyvenv.cfg").is_file() or is_tracker_store(folder))


def is_tracker_store(folder: Path) -> bool:
    """A W&B folder (its ``latest-run`` link or ``run-*``/``offline-run-*`` folders), an MLflow file store (its
    ``.trash`` or an experiment's ``meta.yaml``) or MLflow's artifact folder, by what it holds: a code package of
    the same name is code."""
    try:
        if folder.name == "wandb":
            return (folder / "latest-run").is_symlink() or any(
                child.name.startswith(("run-", "offline-run-")) and child.is_dir() for child in folder.iterdir())
        if folder.name == "mlruns":
            return (folder / ".trash").is_dir() or any((child / "meta.yaml").is_file() for child in folder.iterdir())
        if folder.name == "mlartifacts":
            return not any(child.suffix == ".py" for child in folder.iterdir())
    except OSError:
        return False
    return False


def in_output_folder(workdir: Path, relative: str, seen: dict[str, bool]) -> bool:
    """Whether a folder above ``relative`` (below ``workdir``) is an output folder; ``seen`` caches each folder's
    answer across the calls of one listing."""
    for parent in reversed(PurePosixPath(relative).parents[:-1]):
        name = parent.as_posix()
        if name not in seen:
            seen[name] = is_output_folder(workdir / name)
        if seen[name]:
            return True
    return False
