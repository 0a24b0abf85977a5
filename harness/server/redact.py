"""Secrets out of everything a campaign writes, by name and by value.

- By name: environment values whose name says they are secret (HF_TOKEN, OPENAI_API_KEY, PGPASSWORD,
  GH_PAT, SENTRY_DSN, SLACK_WEBHOOK_URL) and the values of secret flags (`--api-key X`).
- By shape, inside any value or text: the password of `scheme://user:password@host` and a key-like user of
  `scheme://KEY@host` (Sentry DSNs), `?password=` / `?token=` / `?key=` ... query values, Slack webhook
  paths, and tokens whose form gives them away (GitHub, Slack, Hugging Face, OpenAI and Anthropic keys, AWS
  access key ids, Google API keys, JWTs, `Bearer` credentials).
- By value (`Secrets`): every secret value found by name in a server's environment or argv is masked
  wherever it reappears: the tail of its log copied into an error, the server's log itself, its
  /server_info reply, the manifest, campaign.json.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MASK = "***"
# a name part (split on _ - .) ending so is a secret: HF_TOKEN, OPENAI_API_KEY, PGPASSWORD, --api-key, GH_PAT,
# SENTRY_DSN, SLACK_WEBHOOK_URL; not --speculative-num-draft-tokens or TOKENIZERS_PARALLELISM
SECRET_PART = re.compile(
    r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|AUTH|APIKEY|WEBHOOK|COOKIE)$|^(PAT|DSN)$", re.IGNORECASE
)  # PAT and DSN only as a whole part (COMPAT is no secret), PWD never (a folder)
# values shorter than this are not masked wherever they reappear (a one-letter password would mask every
# such letter); they are still masked where their name or flag says they are secret
MIN_VALUE_LEN = 6

URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@/\s]+@")
URL_KEY_USER = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)[A-Za-z0-9_-]{16,}@")
QUERY_SECRET = re.compile(
    r"(?P<head>[?&;](?:[A-Za-z0-9_.-]*[_.-])?(?:password|passwd|pwd|pass|token|access_token|"
    r"api_key|apikey|key|secret|auth|sig|signature|credential)=)[^&#\s\"']+",
    re.IGNORECASE,
)
SHAPES = (
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"),
    re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    re.compile(r"(?<=hooks\.slack\.com/services/)[A-Za-z0-9/_-]+"),  # Slack webhook path
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),  # Hugging Face
    re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"),  # OpenAI, Anthropic
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),  # Google API keys
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWTs
    re.compile(r"(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
)


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name (HF_TOKEN, --api-key) names a secret."""
    return any(SECRET_PART.search(part) for part in re.split(r"[_.-]+", name) if part)


def redact_value(value: str) -> str:
    """Hide what looks like a secret inside a value or text: URL credentials, secret query values, tokens
    of a known form (see the module's docstring)."""
    value = URL_CREDENTIALS.sub(rf"\g<head>:{MASK}@", value)
    value = URL_KEY_USER.sub(rf"\g<head>{MASK}@", value)
    value = QUERY_SECRET.sub(rf"\g<head>{MASK}", value)
    for shape in SHAPES:
        value = shape.sub(MASK, value)
    return value


def clip(text: str | bytes, limit: int) -> str:
    """`text` cut to `limit` characters for a message, its secret-shaped parts masked first: cut first, a token
    known only by its shape loses the tail that makes it recognisable and its head would stay in clear. Bytes are
    read as UTF-8 (what cannot be decoded replaced)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return redact_value(text)[:limit]


def redact_override(text: str) -> str:
    """A command-line override with the value of a secret environment variable hidden, whatever its length
    (`+experiment.arms.0.env.ARM_TOKEN=***`, `server.env.HF_TOKEN=***`)."""
    key, eq, _ = text.partition("=")
    parts = key.lstrip("+~").split(".")
    if eq and len(parts) >= 2 and parts[-2] == "env" and is_secret_name(parts[-1]):
        return f"{key}={MASK}"
    return text


def redact(env: dict[str, str]) -> dict[str, str]:
    """Hide the values of variables that look like secrets (tokens, keys, passwords) and the
    secret-looking parts of any other value."""
    return {k: (MASK if is_secret_name(k) else redact_value(str(v))) for k, v in env.items()}


def secret_flag_values(argv: list[str]) -> list[str]:
    """The values of the secret-looking flags of a command (`--api-key X`, `--hf-token=X`)."""
    out = []
    for i, token in enumerate(argv):
        flag, eq, value = token.partition("=")
        if token.startswith("--") and eq and is_secret_name(flag):
            out.append(value)
        elif i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1] and is_secret_name(argv[i - 1]):
            out.append(token)
    return out


def redact_argv(argv: list[str]) -> list[str]:
    """The command with the value of any secret-looking flag (`--api-key X`, `--hf-token=X`) hidden."""
    out: list[str] = []
    for i, token in enumerate(argv):
        flag, eq, _ = token.partition("=")
        if token.startswith("--") and eq and is_secret_name(flag):
            out.append(f"{flag}={MASK}")
        elif i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1] and is_secret_name(argv[i - 1]):
            out.append(MASK)
        else:
            out.append(redact_value(token))
    return out


@dataclass(frozen=True)
class Secrets:
    """The secret values of a launch (or a campaign), masked wherever they reappear, with the shapes of
    redact_value on top."""

    values: tuple[str, ...] = ()  # longest first, so that a secret containing another is masked whole

    @classmethod
    def of(cls, env: dict[str, str], argvs: Iterable[list[str]] = ()) -> Secrets:
        found = {str(v) for k, v in env.items() if is_secret_name(k)}
        for argv in argvs:
            found.update(secret_flag_values([str(t) for t in argv]))
        kept = sorted((v for v in found if len(v) >= MIN_VALUE_LEN), key=lambda v: (-len(v), v))
        return cls(tuple(kept))

    @classmethod
    def of_server(cls, env_overrides: dict[str, str], argv: list[str]) -> Secrets:
        """The secrets of a server started with this argv, in the runner's environment plus the overrides."""
        return cls.of({**os.environ, **env_overrides}, [argv])

    def __add__(self, other: Secrets) -> Secrets:
        values = sorted(set(self.values) | set(other.values), key=lambda v: (-len(v), v))
        return Secrets(tuple(values))

    def scrub(self, text: str) -> str:
        """The text with every known secret value and every secret-shaped part masked."""
        for value in self.values:
            text = text.replace(value, MASK)
        return redact_value(text)

    def scrub_json(self, obj: Any) -> Any:
        """A JSON-like document with every string (keys too) scrubbed."""
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, dict):
            return {self.scrub(str(k)): self.scrub_json(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.scrub_json(v) for v in obj]
        return obj

    def scrub_file(self, path: Path) -> None:
        """Rewrite a text file (a server's log, once the server has exited) with its secrets masked; a file
        with none is left untouched. Best effort: a file that cannot be read or rewritten stays as it is."""
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
            clean = self.scrub(text)
            if clean != text:
                tmp = path.with_name(path.name + ".scrub.tmp")
                tmp.write_text(clean, encoding="utf-8", errors="surrogateescape")
                os.replace(tmp, path)
