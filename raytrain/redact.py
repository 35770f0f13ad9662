"""Secrets out of what raytrain shows, stores or logs: one set of rules, used everywhere the plan leaves the
process that needs its real values (``--dry-run``, the trackers' params, Ray Train's view of the run).

- a job argument or a key named like a secret (``--hub_token X``, ``--api-key=X``, ``password=X``, a mapping's
  ``secret_access_key``): its value;
- a URL's user-info (``https://user:pass@host``) and its signature/credential query parameters
  (``X-Amz-Signature``, ``X-Amz-Credential``, ``sig``, ``token``, ``key``, ...);
- a value that looks like a well-known token (``hf_...``, ``ghp_...``, ``sk-...``, ``AKIA...``).

Names are read as words (``hub_token`` -> hub, token; ``AWSAccessKeyId`` -> aws, access, key, id), so
``--tokenizer gpt2`` or ``--max_tokens 5`` keep their values. Pure and stdlib-only (the CLI imports it)."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "<hidden>"

# A name holding one of these words (or ending in one: "apikey", "authtoken") names a secret.
SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "pwd", "passphrase", "credential", "credentials",
                "auth", "authorization", "signature", "sig", "cookie")
_ENDINGS = ("token", "key", "secret", "password", "passwd", "credential", "credentials", "signature")
# Tokens recognisable by their form alone, whatever argument carries them.
_TOKEN_FORMS = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16})\b"
)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"']+")


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def secret_name(name: str) -> bool:
    """``name`` (an option, a key, a query parameter) names a secret."""
    words = _words(name)
    return any(w in SECRET_WORDS or w.endswith(_ENDINGS) for w in words)


def _redact_one_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return MASK
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(secret_name(k) for k, _ in pairs):
            query = urlencode([(k, MASK if secret_name(k) else v) for k, v in pairs], safe="<>")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def text(value: str) -> str:
    """A free text (an argument, a path, a URI) with URLs' secrets and token-like words masked."""
    if not isinstance(value, str):
        return value
    if "://" in value:
        value = _URL.sub(lambda m: _redact_one_url(m.group(0)), value)
    return _TOKEN_FORMS.sub(MASK, value)


def args(argv: list[str]) -> list[str]:
    """A command line with the values of secret-named options masked: ``--hub_token X``, ``--hub-token=X``,
    ``hub_token=X``; every other argument through :func:`text`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg in ("-", "--"):
                out.append(MASK)
                continue
        if arg.startswith("-") and arg != "--":
            name, sep, _ = arg.partition("=")
            if secret_name(name.lstrip("-")):
                if sep:
                    out.append(f"{name}={MASK}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
        elif "=" in arg and not arg.startswith("="):
            name, _, _ = arg.partition("=")
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name) and secret_name(name):
                out.append(f"{name}={MASK}")
                continue
        out.append(text(arg))
    return out


def mapping(data: Any) -> Any:
    """A nested dict/list with the values of secret-named keys masked and every string through :func:`text`."""
    if isinstance(data, dict):
        return {k: (MASK if isinstance(k, str) and secret_name(k) and v not in (None, "")
                    else mapping(v)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [mapping(v) for v in data]
    return text(data) if isinstance(data, str) else data


# The plan's fields that carry what the user typed (the rest is raytrain's arithmetic).
USER_FIELDS = ("job_args", "mlflow_uri", "data", "storage", "resume", "env", "script_defaults")


def plan_dict(d: dict[str, Any]) -> dict[str, Any]:
    """A plan's dict (``Plan.to_dict()``) as it may be shown or stored: job arguments, --mlflow-uri, --data,
    --storage, --resume through the rules above, --env values masked, the DeepSpeed config's secret-named keys
    masked."""
    out = dict(d)
    out["job_args"] = args(list(d.get("job_args") or []))
    for key in ("mlflow_uri", "storage", "resume", "job_file", "job_dir", "job_module"):
        if isinstance(out.get(key), str):
            out[key] = text(out[key])
    out["data"] = [mapping(spec) for spec in d.get("data") or []]
    out["env"] = {k: MASK for k in d.get("env") or {}}
    out["script_defaults"] = mapping(dict(d.get("script_defaults") or {}))
    if isinstance(d.get("deepspeed"), dict):
        out["deepspeed"] = mapping(d["deepspeed"])
    return out


def restore(shown: dict[str, Any], real: dict[str, Any]) -> dict[str, Any]:
    """``shown`` (a :func:`plan_dict`) with the user's fields of ``real`` (the plan as sent) back."""
    out = dict(shown)
    for key in USER_FIELDS + ("deepspeed", "job_file", "job_dir", "job_module"):
        if key in real:
            out[key] = real[key]
    return out
