"""The shapes people type, both ways: secrets the gate must catch, and information it must leave alone.

One list for tests/test_redact_shapes.py and tests/bench/redact.py. Each secret is (text, the secret in it);
every listed secret must be absent after the gate. Each clean text must come through byte for byte. PIECES, joined
and repeated, are the adversarial texts of both.
"""

from __future__ import annotations

import json
from pathlib import Path

SECRETS = [
    # issue 37's list
    ("mysql root password: changeme", "changeme"),
    ("pw: Hunter2xyz", "Hunter2xyz"),
    ("password: admin", "admin"),
    ("password is hunter2xyz", "hunter2xyz"),
    ("Password: correct horse battery staple", "correct horse battery staple"),
    ("DB_PASSWORD: correct-horse-battery-staple", "correct-horse-battery-staple"),
    ("docker login -p SECRETpw registry.example.com", "SECRETpw"),
    ("export SECRET_KEY_BASE=a1b2c3d4e5f6a7b8c9d0", "a1b2c3d4e5f6a7b8c9d0"),
    (
        "aws secret access key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    ("ran: memctl fact set db.password Hunter2xyz", "Hunter2xyz"),
    # colon and assignment
    ("root password: toor", "toor"),
    ("admin password: letmein", "letmein"),
    ("passwd: qwerty", "qwerty"),
    ("pwd = s3cret", "s3cret"),
    ("db_pass=changeme", "changeme"),
    ("REDIS_PASSWORD=foobared", "foobared"),
    ("api key: 9f8e7d6c5b4a39281706", "9f8e7d6c5b4a39281706"),
    ("client secret: Zx81kQ0pLm3nB7vC", "Zx81kQ0pLm3nB7vC"),
    ("Passphrase: purple monkey dishwasher", "purple monkey dishwasher"),
    # "is"
    ("the root password is changeme", "changeme"),
    ("wifi password is Sunflower42", "Sunflower42"),
    ("the api key is 7c4a8d09ca3762af61e5", "7c4a8d09ca3762af61e5"),
    ("db password was hunter2 before the rotation", "hunter2"),
    # CLI flags
    ("docker login --password S3cr3tPass -u deploy", "S3cr3tPass"),
    ("mysql -u root -pSECRET shop", "SECRET"),
    ("mysqldump -uroot -p'Pa55word' shop > dump.sql", "Pa55word"),
    ("sshpass -p hunter2 ssh deploy@web1", "hunter2"),
    ("redis-cli -a foobared123 ping", "foobared123"),
    ("curl -u admin:S3cretPw https://ci.example.com/api", "S3cretPw"),
    ("psql --password=Hunter2xyz -h db", "Hunter2xyz"),
    ("htpasswd -b .htpasswd admin --password Adm1nPw", "Adm1nPw"),
    ("vault login -token=s3cr3tt0k3nvalue", "s3cr3tt0k3nvalue"),
    # environment variables
    ("PGPASSWORD=Hunter2xyz psql -h db -U app", "Hunter2xyz"),
    ("PGPASSWORD=changeme pg_dump app", "changeme"),
    ("export MYSQL_PWD=rootpw", "rootpw"),
    (
        "export GITHUB_TOKEN=ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt",
        "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt",
    ),
    (
        "set -x; export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    ("env DATABASE_PASSWORD=letmein123 ./migrate", "letmein123"),
    # URLs with user:password@
    ("cloned https://deploy:Hunter2xyz@git.example.com/infra.git", "Hunter2xyz"),
    ("DATABASE_URL=postgres://app:changeme@db:5432/app", "changeme"),
    ("amqp://guest:guestpw@rabbit:5672/", "guestpw"),
    # secret-named facts set on a command line
    ("ran: memctl fact set redis.auth Sup3rS3cret", "Sup3rS3cret"),
    (
        "ran: memctl fact set github.pat ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt",
        "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt",
    ),
    ("memctl fact set db.pw Hunter2xyz", "Hunter2xyz"),
]

# Fact keys that name a secret, and some that do not.
SECRET_KEYS = [
    "db.pw",
    "redis.auth",
    "github.pat",
    "openai.key",
    "db.password",
    "stripe.key",
    "mysql.root_pw",
    "gitlab.pat",
    "slack.webhook_secret",
    "smtp.passwd",
    "anthropic.key",
    "vault.token",
    "redis.requirepass",
]
OTHER_KEYS = [
    "db.host",
    "redis.port",
    "github.org",
    "openai.model",
    "cache.key",
    "primary_key",
    "ssh_key",
    "token_count",
    "db.password_policy",
    "auth.method",
    "pw.length",
]

CLEAN = [
    "password rotation is due Friday",
    "the token bucket allows 100/s",
    "reset your password in the portal",
    "token count: 512 for the prompt",
    "deployed 3f2c1a9e8b7d6c5f4e3a2b1c0d9e8f7a6b5c4d3e to web-1",
    "request 550e8400-e29b-41d4-a716-446655440000 timed out",
    "image sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 pushed",
    "ghcr.io/acme/api@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
    "the password policy requires 12 characters",
    "password reset emails are delayed",
    "forgot password flow is broken on mobile",
    "the password is stored in the vault",
    "the api key is in 1Password",
    "ssh -p 2222 deploy@web1",
    "mkdir -p /var/lib/memctl",
    "primary key: id",
    "auth: oauth2",
    "password: ${DB_PASSWORD}",
    "password is required",
    "the token is expired, log in again",
    "rotate the password every 90 days",
    "password manager migration done",
    "git checkout a1b2c3d",
    "Bearer tokens are validated by the gateway",
    "sshpass is not installed on web-2",
]


# Pieces of adversarial text: repeated, or joined and repeated, they make the inputs of the linear-time property
# (tests/test_redact_shapes.py) and of tests/bench/redact.py's search for the slowest shape.
PIECES = [
    "token:",
    "password=",
    "pw: ",
    "api_key='",
    'secret = "',
    '"',
    "'",
    "`",
    "Bearer ",
    "Bearer abcdef0123456789 ",
    "QUJD",
    "+/",
    "a1",
    "f0",
    "([{",
    ")]}",
    "[",
    "eyJ",
    "eyJhbGciOi.",
    "ghp_",
    "AKIA",
    "glpat-",
    "sk-",
    "xoxb-1-",
    "http://u:",
    "a://b:c@",
    "?token=",
    "&password=",
    "-----BEGIN PRIVATE KEY-----\n",
    "\nA",
    "mysql -p",
    "curl -u a:",
    "--password ",
    "docker login -p x ",
    "fact set db.pw ",
    "password is ",
    "key ",
    "x",
    "1",
    ":",
    "=",
    " ",
    ";",
    "-",
    ".",
    "@",
    "\\",
    # the keyword plugin's patterns and its Cloudant/IBM kin (memctl.redact.keyword, detect.RUN_NEEDED)
    "pwd';",
    "'x'==",
    "=> '",
    "aws key '",
    "contraseña='",
    "a" * 26,
    "0123456789abcdef" * 3,
    # passwords as plain arguments and in prose (issue 50: memctl.redact.commands, shapes._said_findings)
    "htpasswd -b f u ",
    "net user a ",
    "net use \\\\h\\s ",
    "echo x | chpasswd ",
    "echo a:b |",
    "| sudo -S ",
    "rabbitmqctl add_user a ",
    "redis-cli AUTH ",
    "sqlcmd -P ",
    "7z -p",
    "-U a%",
    "mysqladmin password ",
    "the password was set to ",
    "password for the ",
    "with the passphrase '",
    "(password ",
    ", password ",
    "credentials: a / ",
    "changed the password to ",
    "is now ",
]


def clean_corpus() -> list[str]:
    """Clean records: CLEAN, the retrieval test data, and the LoCoMo dev turns when the file is there."""
    data = Path(__file__).parent / "data"
    texts = list(CLEAN)
    for name in ("retrieval.json", "retrieval_log.json"):
        texts += [
            e if isinstance(e, str) else e[1]
            for e in json.loads((data / name).read_text())["episodes"]
        ]
    texts += [
        r["text"]
        for r in map(json.loads, (data / "secrets_labelled.jsonl").open())
        if not r["kinds"]
    ]
    return texts + locomo_turns()


LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "eval" / "locomo-dev.json"


def locomo_turns(path: Path = LOCOMO) -> list[str]:
    """Every dialogue turn of the LoCoMo development set, as locomo_recall.py stores it ([] when absent)."""
    if not path.exists():
        path = Path("/work/shared/eval/locomo-dev.json")
        if not path.exists():
            return []
    texts = []
    for conv in json.loads(path.read_text()):
        for key, turns in conv["conversation"].items():
            if key.startswith("session_") and isinstance(turns, list):
                for t in turns:
                    text = f"{t['speaker']}: {t['text']}"
                    if t.get("blip_caption"):
                        text += f" [shares a photo of {t['blip_caption']}]"
                    texts.append(text)
    return texts
