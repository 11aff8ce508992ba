"""What is never sent to a tracker: the one rule the MLflow and W&B sinks and ``tracking/lifecycle.json`` share.

A value is left out when its **name** ends in a credential word (:func:`credential_name`) or its **text** looks
like a credential (:func:`credential_text`). The name rule looks at the name's last word (split at ``_``, ``-``,
``.``, spaces and camelCase humps, a number after it set aside), so ``api_key``, ``hfToken``, ``DB_PASSWORD``,
``aws_secret``, ``GH_PAT``, ``API_KEY_2`` and ``basic_auth`` are left out while ``author``, ``tokenizer``, ``keyboard``, ``monkey_patch``,
``num_tokens`` (a count: the plural is not a credential word) and ``token_budget`` pass. A tokenizer's special
tokens (``pad_token``, ``eos_token``, ...) pass too: their values are strings such as ``"</s>"``. The text rule
finds a bearer token, an assignment to a credential name (``password=..``, ``password: ..``, ``--hf-token
..``), a URL with a user name or password (``postgres://me:pw@db``), and the known token prefixes (``sk-``,
``ghp_``, ``gho_``, ``github_pat_``, ``hf_``, ``xoxb-``/``xoxp-``, ``AKIA``/``ASIA``, ``glpat-``, a JWT's ``eyJ..``,
Google's ``AIza``/``ya29.``, Stripe's ``sk_live_``, Databricks' ``dapi``, npm's ``npm_``, PyPI's ``pypi-AgE``).
The spec's ``env:`` is never sent at all (:func:`spec_params`): an environment is where credentials belong.

Torch-free, pydantic-free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

# The last word of a name that holds a credential (lower case); "tokens", "keys" are counts and lists of them.
CREDENTIAL_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwords", "passwd", "pwd", "passphrase", "credential", "credentials",
    "key", "apikey", "auth", "authorization", "cookie", "pat"})
# A tokenizer's special tokens: `eos_token: "</s>"` names a string of the vocabulary, not a credential.
SPECIAL_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask"})
# The name of a credential assignment (a key, a command-line option) and where its value starts.
_ASSIGNED = re.compile(r"""(?:^|[^\w.-])([A-Za-z][\w.-]*)["']?\s*[=:]\s*(?=\S)""")
_OPTION = re.compile(r"(?:^|[\s\"'\[,])--?([A-Za-z][\w.-]*)(?==|[\s\"',\]]|$)")
_CREDENTIAL_TEXT = re.compile(
    r"(?i:\bbearer\s+[\w.~+/=-]{8,})"  # an HTTP Authorization header's token
    r"|\b[a-z][\w+.-]*://[^/\s:@]+:[^/\s@]+@"  # a URL with user:password@
    r"|(?<![\w-])(?:sk-(?:proj-|ant-)?[\w-]{16,}|gh[opusr]_[A-Za-z0-9]{16,}|github_pat_\w{16,}|hf_[A-Za-z0-9]{16,}"
    r"|xox[abposr]-[\w-]{10,}|A[KS]IA[0-9A-Z]{16}|glpat-[\w-]{16,}|eyJ[\w-]{8,}\.[\w-]{8,}|AIza[\w-]{30,}"
    r"|[sr]k_live_\w{16,}|dapi[0-9a-f]{32}|npm_[A-Za-z0-9]{36}|pypi-AgE[\w-]{16,}|ya29\.[\w-]{16,})")


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])|([A-Z])([A-Z][a-z])", r"\1\3 \2\4", name)
    return [word for word in re.split(r"[\W_]+", spaced.lower()) if word]


def credential_name(name: str) -> bool:
    """Whether ``name`` ends in a credential word.

    Example:
        >>> [credential_name(name) for name in ("OPENAI_KEY", "apiKey", "hf-token", "DB_PASSWORD", "GH_PAT")]
        [True, True, True, True, True]
        >>> [credential_name(name) for name in ("author", "tokenizer", "keyboard", "num_tokens", "eos_token")]
        [False, False, False, False, False]
    """
    words = _words(name)
    while words and words[-1].isdigit():  # API_KEY_2: a numbered credential is one
        words.pop()
    if words:
        words[-1] = words[-1].rstrip("0123456789")  # openai_key2, token2
    if not words or words[-1] not in CREDENTIAL_WORDS:
        return False
    return not (words[-1] == "token" and len(words) > 1 and words[-2] in SPECIAL_TOKENS)


def credential_in_uri(uri: str) -> bool:
    """Whether a URI carries a user name or password (``https://user:secret@host``).

    Example:
        >>> credential_in_uri("https://me:secret@mlflow.example"), credential_in_uri("sqlite:///m.db")
        (True, False)
    """
    try:
        parts = urlsplit(uri)
    except ValueError:
        return False
    return bool(parts.username or parts.password)


def credential_text(text: str) -> bool:
    """Whether ``text`` holds what looks like a credential: a bearer token, a known token prefix, a URL with a
    password, or an assignment to (an option named by) a credential name.

    Example:
        >>> credential_text("Authorization: Bearer abcdefgh12345"), credential_text("host=db password: hunter2")
        (True, True)
        >>> credential_text("python train.py --hf-token x"), credential_text("python train.py --max-tokens 5")
        (True, False)
    """
    if _CREDENTIAL_TEXT.search(text):
        return True
    names = [match.group(1) for pattern in (_ASSIGNED, _OPTION) for match in pattern.finditer(text)]
    return any(credential_name(name) for name in names)


def without_credentials(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without each entry, at any depth, whose name or text looks like a credential (a W&B config,
    MLflow's ``config.<field>`` parameters).

    Example:
        >>> without_credentials({"lr": 0.1, "author": "ana", "api_key": "k", "opt": {"hfToken": "x", "m": 0.9}})
        {'lr': 0.1, 'author': 'ana', 'opt': {'m': 0.9}}
    """
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if credential_name(str(key)):
            continue
        if isinstance(value, Mapping):
            inner = without_credentials(value)
            if inner or not value:  # a section emptied here is left out, not sent as "{}"
                kept[str(key)] = inner
        elif not credential_text(value if isinstance(value, str) else json.dumps(value, default=str)):
            kept[str(key)] = value
    return kept


def spec_params(spec: Mapping[str, Any]) -> dict[str, str]:
    """A job spec (its JSON form) as flat parameters ``spec.<field>``: every field but ``env`` (never sent),
    without those whose name or text looks like a credential (:func:`sendable_params`: one rule for what is
    written and what is sent).

    Example:
        >>> spec_params({"name": "a", "resources": {"nodes": 1}, "env": {"OMP_NUM_THREADS": "1"}})
        {'spec.name': 'a', 'spec.resources.nodes': '1'}
    """
    params: dict[str, str] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                add(f"{prefix}.{key}", item)
            return
        params[prefix] = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)

    add("spec", {key: value for key, value in spec.items() if key != "env"})
    return sendable_params(params)


def sendable_params(params: Mapping[str, str]) -> dict[str, str]:
    """Flat ``spec.<field>`` parameters as they may be sent, whoever wrote them (a ``tracking/lifecycle.json`` of an
    earlier ELFES held ``spec.env.*`` and names this rule leaves out, and ``elfes sync`` sends it at any time):
    without ``spec.env`` and each whose name or text looks like a credential.

    Example:
        >>> sendable_params({"spec.name": "a", "spec.env.OMP_NUM_THREADS": "1", "spec.config.api_key.id": "x"})
        {'spec.name': 'a'}
    """
    return {name: value for name, value in params.items()
            if name != "spec.env" and not name.startswith("spec.env.")
            and not any(credential_name(part) for part in name.split(".")) and not credential_text(value)}
