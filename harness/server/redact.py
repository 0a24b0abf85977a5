"""Secrets out of everything a campaign writes: environment values whose name says they are secret
(HF_TOKEN, OPENAI_API_KEY, PGPASSWORD), the values of secret flags (`--api-key X`), and the password of
any `scheme://user:password@host` inside a value."""

from __future__ import annotations

import re

# a name part (split on _ - .) ending so is a secret: HF_TOKEN, OPENAI_API_KEY, PGPASSWORD, --api-key;
# not --speculative-num-draft-tokens or TOKENIZERS_PARALLELISM
SECRET_PART = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|AUTH|APIKEY)$", re.IGNORECASE)

URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@/\s]+@")


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name (HF_TOKEN, --api-key) names a secret."""
    return any(SECRET_PART.search(part) for part in re.split(r"[_.-]+", name) if part)


def redact_value(value: str) -> str:
    """Hide passwords inside a value (`scheme://user:password@host` -> `scheme://user:***@host`)."""
    return URL_CREDENTIALS.sub(r"\g<head>:***@", value)


def redact(env: dict[str, str]) -> dict[str, str]:
    """Hide the values of variables that look like secrets (tokens, keys, passwords) and the
    credentials inside any other value."""
    return {k: ("***" if is_secret_name(k) else redact_value(str(v))) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """The command with the value of any secret-looking flag (`--api-key X`, `--hf-token=X`) hidden."""
    out: list[str] = []
    for i, token in enumerate(argv):
        flag, eq, _ = token.partition("=")
        if token.startswith("--") and eq and is_secret_name(flag):
            out.append(f"{flag}=***")
        elif i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1] and is_secret_name(argv[i - 1]):
            out.append("***")
        else:
            out.append(redact_value(token))
    return out
