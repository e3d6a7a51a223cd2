"""Provider keys by prefix (memctl.redact's docstring): OpenAI `sk-`, Anthropic `sk-ant-`, GitHub `github_pat_`,
Google `AIza`, Hugging Face `hf_`, npm, Groq, Vault, ..., each with the length of a real key."""

from __future__ import annotations

import re

from memctl.redact.names import Finding

# Provider keys by prefix: (kind, literal prefix for the gate, pattern). The body must hold a digit and a letter.
_PROVIDER_KEYS = tuple(
    (kind, prefix, re.compile(r"(?<![\w-])" + pattern + r"(?![\w-])"))
    for kind, prefix, pattern in (
        ("anthropic-api-key", "sk-ant-", r"sk-ant-[A-Za-z0-9_-]{32,}"),
        ("openai-token", "sk-", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        ("github-token", "github_pat_", r"github_pat_[A-Za-z0-9_]{30,}"),
        ("google-api-key", "AIza", r"AIza[0-9A-Za-z_-]{35}"),
        ("huggingface-token", "hf_", r"hf_[A-Za-z0-9]{30,}"),
        ("npm-tokens", "npm_", r"npm_[A-Za-z0-9]{36}"),
        ("groq-api-key", "gsk_", r"gsk_[A-Za-z0-9]{40,}"),
        ("xai-api-key", "xai-", r"xai-[A-Za-z0-9]{60,}"),
        ("perplexity-api-key", "pplx-", r"pplx-[A-Za-z0-9]{40,}"),
        ("replicate-token", "r8_", r"r8_[A-Za-z0-9]{37}"),
        ("vault-token", "hv", r"hv[sbr]\.[A-Za-z0-9_-]{24,}"),
        ("digitalocean-token", "_v1_", r"do[opr]_v1_[a-f0-9]{64}"),
        ("databricks-token", "dapi", r"dapi[a-f0-9]{32}(?:-\d)?"),
        ("shopify-token", "shp", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
        ("linear-api-key", "lin_api_", r"lin_api_[A-Za-z0-9]{40}"),
        ("postman-api-key", "PMAK-", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"),
        ("stripe-access-key", "_test_", r"(?:sk|rk)_test_[A-Za-z0-9]{24,}"),
        ("stripe-access-key", "whsec_", r"whsec_[A-Za-z0-9]{32,}"),
    )
)
_DIGIT, _LETTER = re.compile(r"\d"), re.compile(r"[A-Za-z]")


def provider_findings(text: str) -> list[Finding]:
    found = []
    for kind, prefix, pattern in _PROVIDER_KEYS:
        if prefix in text:
            for m in pattern.finditer(text):
                body = m.group()[len(prefix) :] if m.group().startswith(prefix) else m.group()
                if _DIGIT.search(body) and _LETTER.search(body):
                    found.append(Finding(kind, *m.span()))
    return found
