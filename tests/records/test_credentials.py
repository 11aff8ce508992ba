"""The rule of what is never sent to a tracker (elfes/records/credentials.py): names that end in a credential
word, not names that merely contain one; values that look like credentials; the spec's ``env`` never. The real
trackers' side: tests/records/test_tracker_lifecycle.py."""

from __future__ import annotations

import pytest

from elfes.records.credentials import (
    credential_name,
    credential_text,
    sendable_params,
    spec_params,
    without_credentials,
)


@pytest.mark.parametrize("name", [
    "OPENAI_KEY", "WANDB_KEY", "HF_HUB_KEY", "GH_PAT", "api_key", "apiKey", "APIKey", "hfToken", "hf-token",
    "token", "DB_PASSWORD", "db.passwd", "aws_secret", "client_secrets", "credentials", "gcp_credential",
    "basic_auth", "session_cookie", "ssh_passphrase", "openai_apikey", "passwords"])
def test_a_name_that_ends_in_a_credential_word_is_left_out(name: str) -> None:
    assert credential_name(name)


@pytest.mark.parametrize("name", [
    "author", "tokenizer", "keyboard", "monkey_patch", "num_tokens", "max_tokens", "token_budget", "keys_per_shard",
    "secretary", "passwords_checked_at", "authority", "pad_token", "eos_token", "lr", "DB_DSN", "key_frames"])
def test_a_name_that_merely_contains_a_credential_word_is_sent(name: str) -> None:
    assert not credential_name(name)


@pytest.mark.parametrize("text", [
    "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyIn0.c2ln", "authorization: bearer abcdefgh12345678",
    "host=db user=me password:Hunter2", "password=hunter2", "password: hunter2", "export WANDB_API_KEY=abc",
    '["python", "train.py", "--hf-token", "x"]', "--api-key=x", "postgres://me:pw@db/x", "see https://me:pw@h/",
    "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a", "sk-4f9a8b7c6d5e4f3a2b1c", "ghp_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa",
    "gho_Zx9Yw8Vu7Ts6Rq5Po4Nm", "github_pat_11ABCDEFG0123456789_abcdef", "hf_QwErTyUiOpAsDfGhJkLzXcVbNm01234567",
    "xoxb-1234567890-abcdefghij", "xoxp-1234567890-abcdefghij", "AKIAIOSFODNN7EXAMPLE", "glpat-abcdefghij0123456789",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0", '{"client_secret": "x"}'])
def test_a_value_that_looks_like_a_credential_is_left_out(text: str) -> None:
    assert credential_text(text)


@pytest.mark.parametrize("text", [
    "Ada Lovelace", "gpt2", "python train.py --max-tokens 5 --lr=0.1", "job:main", "2025-01-01T00:00:00",
    "/data/hf_cache/sklearn", "https://mlflow.example:5000/", "sqlite:///runs/mlflow.db", "module load cuda",
    "the secret of a good init is its scale", "task-0123456789abcdefghij", "num_tokens: 4096", "</s>"])
def test_an_ordinary_value_is_sent(text: str) -> None:
    assert not credential_text(text)


def test_nested_values_lists_and_the_env_section() -> None:
    config = {"author": "Ada", "optimizer": {"lr": 0.1, "secretKey": "x"}, "hosts": ["a", "https://u:p@b"],
              "tokenizer": {"name": "gpt2", "pad_token": "<pad>", "auth_token": "x"}}
    assert without_credentials(config) == {"author": "Ada", "optimizer": {"lr": 0.1},
                                            "tokenizer": {"name": "gpt2", "pad_token": "<pad>"}}
    params = spec_params({"name": "a", "env": {"OMP_NUM_THREADS": "1", "OPENAI_KEY": "sk-x"}, "config": config,
                          "command": ["python", "t.py", "--max-tokens", "5"], "slurm": {"setup": ["export TOKEN=x"]}})
    assert params == {"spec.name": "a", "spec.config.author": "Ada", "spec.config.optimizer.lr": "0.1",
                      "spec.config.tokenizer.name": "gpt2", "spec.config.tokenizer.pad_token": "<pad>",
                      "spec.command": '["python", "t.py", "--max-tokens", "5"]'}


@pytest.mark.parametrize("name", ["API_KEY_2", "openai_key2", "token2", "Authorization", "ODBC_PWD"])
def test_a_numbered_credential_name_and_an_authorization_are_left_out(name: str) -> None:
    assert credential_name(name)


@pytest.mark.parametrize("text", [
    "Authorization: Basic dXNlcjpodW50ZXIy", "Server=db;Uid=me;Pwd=hunter2;", "ASIAIOSFODNN7EXAMPLE",
    "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "dapi0123456789abcdef0123456789abcdef",
    "npm_abcdefghijklmnopqrstuvwxyz0123456789", "pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAw", "ya29.a0AfH6SMBx1y2z3w4v5u6t"])
def test_more_credential_values_are_left_out(text: str) -> None:
    assert credential_text(text)


def test_a_lifecycle_written_before_the_rule_is_sent_without_env_nor_credentials(tmp_path) -> None:
    """``elfes sync`` sends a run's ``tracking/lifecycle.json`` at any time: one an earlier ELFES wrote, with the
    spec's ``env`` in it, is read without it."""
    import json

    from elfes.records.tracker_lifecycle import read_lifecycle
    from elfes.records.tracking import lifecycle_path

    path = lifecycle_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"status": "FINISHED", "attempt_ends": {"1": "finished"}, "provenance": {}, "params": {
        "spec.name": "a", "spec.env.OPENAI_KEY": "sk-x", "spec.env.OMP_NUM_THREADS": "1", "spec.env": "{}",
        "spec.config.note": "Bearer abcdefgh12345678", "spec.config.author": "Ada", "spec.config.db.HF_HUB_KEY": "x"}}))
    lifecycle = read_lifecycle(tmp_path)
    assert lifecycle is not None
    assert lifecycle.params == {"spec.name": "a", "spec.config.author": "Ada"}


def test_a_dotted_key_under_a_credential_name_is_left_out_as_the_sender_would() -> None:
    """What ``tracking/lifecycle.json`` records is what ``elfes sync`` may send: one rule for both."""
    spec = {"name": "a", "config": {"api_key.id": "x", "lr.api_key": "y", "search": {"key.path": "z"}, "width": 8}}
    params = spec_params(spec)
    assert params == {"spec.name": "a", "spec.config.width": "8"}
    assert sendable_params(params) == params
