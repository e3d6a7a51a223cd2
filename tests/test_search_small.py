"""Small memories and odd words: the Quickstart's question over 10, 30 and 300 episodes, queries without a
word, words inside paths, URLs and dotted names, synonyms, and the text score's scale."""

from __future__ import annotations

import json
import random

import pytest

from memctl import config
from memctl.reading import bm25, fusion, search
from memctl.reading.query import NO_WORD, ONLY_EXCLUDED, Query, synonyms, unsearchable
from memctl.reading.pieces import pieces
from tests.conftest import needs_local_embedder

# The README's Quickstart, as written there: its two episodes and its question.
DEPLOY = "Deploy of api v2.3 failed at 03:10: /var was full; rotating nginx logs freed 4 GB"
REDIS = "Redis evicted keys under memory pressure; raising maxmemory stopped it"
QUESTION = "why did the release break last night?"

# Filler: what an agent's operations log holds besides, short status lines and longer notes. None of it is
# the answer (no release broke), and none of it was chosen to lose: it shares the question's words
# ("last ok", "Paged at night", releases that went fine) as a real log does.
SHORT = [
    "last ok",
    "ok",
    "backup ok",
    "all checks green",
    "nothing to report",
    "restarted the worker",
    "done for tonight",
    "disk usage 61% on db-1",
    "cert renewed",
    "queue empty again",
]
NOTES = [
    "Nightly backup of the billing database finished in 14 minutes; 38 GB uploaded to the object store.",
    "Rotated the API key of the analytics vendor; the old key stops working on Friday.",
    "Release 5.12 of the orders API rolled out to all regions; error rate unchanged.",
    "Kafka consumer group billing-events lagging by 400k messages; lag drained after scaling to 12 consumers.",
    "On-call handover: from Monday Tomas carries the pager, Lena is secondary.",
    "Redis evicted keys under memory pressure; raising maxmemory to 2 GB stopped the evictions.",
    "The primary PostgreSQL listens on 10.8.0.4 port 5432; replicas lag about two seconds.",
    "TLS certificate for shop.example.com expires on 14 March; certbot renews it from a systemd timer.",
    "Customer Globex reported 502 errors on the upload endpoint for files over 100 MB.",
    "nginx client_max_body_size raised to 2g on the new ingress to match the old load balancer.",
    "Meeting with finance: the cloud bill rose 18% in February, mostly CDN egress.",
    "DNS resolution inside the cluster was slow; set ndots to 2 in the pod template.",
    "Kernel upgrade on web2 needed a reboot; the load balancer drained connections first.",
    "The search cluster went yellow after node es-4 lost its disk; green again after 40 minutes.",
    "Staging database refresh from the anonymised production snapshot takes 3 hours.",
    "Weekly sync: the team adopts OpenTofu for new modules from April.",
    "Grafana alert for high error rate fired during a config reload; health check returned 500 for a minute.",
    "Lunch and learn on eBPF tracing moved to Thursday next week.",
    "Change freeze for the quarter-end close runs from 27 March to 2 April.",
    "New hire Priya starts on the platform team next Monday; she needs VPN and read access to Grafana.",
    "Memory on worker-7 grows by about 1 GB an hour until the OOM killer restarts the image resizer.",
    "Paged at night: disk usage at 95% on db-replica-3, WAL piling up behind a stale replication slot.",
    "Someone pushed an AWS access key to a public gist; key revoked, CloudTrail shows no use of it.",
    "The VPN concentrator drops idle sessions after 30 minutes.",
    "Rate limiting on the public API is 100 requests per minute per token.",
    "CI pipeline takes 25 minutes because integration tests run serially.",
    "Webhook deliveries to partner Initech failed with ETIMEDOUT; raised our timeout and added retries.",
    "Heavy traffic from 203.0.113.45 on the login endpoint; blocked the address at the WAF.",
    "Payment provider declined refunds after a currency rounding bug; fixed the rounding.",
    "SSH access to production goes through the bastion host with a hardware key.",
    "The data warehouse refresh finishes around 06:30; dashboards are stale before that.",
    "Last week's postmortem: alerts were too noisy, we removed twelve of them.",
    "Checked the overnight alerts: nothing fired except a flapping ping check on edge-fra-2.",
    "Moved large downloads behind the CDN cache; review again on 1 April.",
    "Upgraded the ingress controller to 1.10; no errors in the last hour.",
    "Log retention is 14 days in Loki; older logs go to cold storage for a year.",
    "The mobile app team asked for a staging API key.",
    "Disabled the old cron host; its jobs now run as Kubernetes CronJobs.",
    "Replaced the RAID controller battery on db-2; write cache enabled again.",
    "Office network switch firmware update on Saturday 07:00, about 15 minutes without wifi.",
]
# The routine lines such a log repeats, with their services, hosts and numbers varying.
SERVICES = [
    "orders-api",
    "billing",
    "checkout",
    "auth",
    "search",
    "image-resizer",
    "gateway",
    "reports",
    "notifications",
    "inventory",
    "payments",
    "etl-orders",
    "cdn-origin",
    "ledger",
    "scheduler",
]
HOSTS = [
    "web1",
    "web2",
    "db-1",
    "db-replica-3",
    "worker-7",
    "edge-fra-2",
    "k8s-node-4",
    "cache-2",
    "es-4",
    "bastion",
]
ROUTINE = [
    "{svc}: health check ok",
    "{svc} scaled from {a} to {b} replicas for the evening peak",
    "{host}: disk usage at {p}%",
    "cron job {svc}-cleanup finished in {a} s",
    "{svc} p99 latency {a} ms, within the objective",
    "Rotated the database password of {svc}; the vault agent rendered the new file",
    "{host} rebooted for a kernel update; back in {b} minutes",
    "Certificate of {svc}.example.com renewed, valid 90 days",
    "{svc} error rate {p}% for ten minutes after a dependency timeout; recovered by itself",
    "Backup of {svc} finished, {a} GB",
    "{host}: memory at {p}%, no swapping",
    "{svc} consumer lag {a}k messages, draining",
    "Updated the {svc} dashboard with the new latency panels",
    "{svc} config reloaded on {host}",
    "Alert silenced for {host} during the provider's maintenance window",
    "{svc} release {b}.{a} deployed to canary; metrics look normal",
    "Ticket for {svc}: flaky integration test retried {b} times in CI",
    "{host} ping check flapped {b} times this morning",
    "{svc} cache hit rate {p}% after the warm-up",
    "Opened the firewall for {svc} to reach {host} on port {a}",
]


def filler(n: int) -> list[str]:
    """n filler episodes: short lines and notes alternating, then routine lines (seeded)."""
    mixed = [t for pair in zip(SHORT, NOTES) for t in pair] + NOTES[len(SHORT) :]
    out, rng = mixed[:n], random.Random(24)
    while len(out) < n:
        line = rng.choice(ROUTINE).format(
            svc=rng.choice(SERVICES),
            host=rng.choice(HOSTS),
            a=rng.randint(2, 900),
            b=rng.randint(2, 40),
            p=rng.randint(1, 99),
        )
        if line not in out:
            out.append(line)
    return out


def add(cli, text, *args):
    result = cli("episode", "add", text, *args)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


def _import(cli, texts):
    lines = "".join(json.dumps({"content": t, "source": "ops"}) + "\n" for t in texts)
    result = cli("episode", "import", "-", input=lines)
    assert result.exit_code == 0, result.stderr


@pytest.mark.local
@pytest.mark.parametrize("size", [10, 30, 300])
def test_quickstart_question_finds_its_episode_first_among_small_and_large_logs(
    cli, memctl_env, monkeypatch, size
):
    """MiniLM alone ranks the deploy failure 2nd of 10, 7th of 30 and 32nd of 300 for this question (cosine
    0.17 to it, 0.20-0.30 to filler that shares no meaning): the words have to carry it. The question shares
    none of its words, but release/deploy and break/fail are synonyms (query.SYNONYMS); 'last ok' holds one
    word of the question, which no longer makes it a full text match (the text score's scale is the query's)."""
    needs_local_embedder()
    monkeypatch.setenv("MEMCTL_EMBEDDER", "local")
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "all-minilm")
    _import(cli, filler(size - 2))
    deploy = add(cli, DEPLOY, "--kind", "conversation", "--source", "quickstart")
    add(cli, REDIS, "--source", "quickstart")
    assert cli("embed").exit_code == 0
    found = cli("episode", "search", QUESTION, "-f", "json")
    assert found.exit_code == 0, found.stderr
    rows = found.json()
    assert rows[0]["id"] == deploy, [r["content"] for r in rows]
    assert rows[0]["vector_rank"] is not None and rows[0]["text_rank"] == 1
    # first by relevance too: the words decide it, not the conversation kind's default importance (8, not 4)
    assert (
        rows[0]["relevance"] == pytest.approx(1.0) and max(r["relevance"] for r in rows[1:]) < 0.99
    )


@pytest.mark.parametrize(
    "text", ["!!!", '"', '""', "?!", "-- ...", '"!!!', "…", "-nginx", '-"dry run"']
)
def test_a_query_without_a_word_finds_nothing_and_says_so(cli, text):
    add(cli, "rotating nginx logs freed the disk")
    add(cli, "a dry run of the restore")
    assert cli("embed").exit_code == 0
    why = unsearchable(text)
    assert why == (
        ONLY_EXCLUDED if text.startswith("-") and any(c.isalnum() for c in text) else NO_WORD
    )
    for mode in ("hybrid", "vector", "text"):
        result = cli("episode", "search", "--mode", mode, "-f", "json", "--", text)
        assert result.exit_code == 0, result.stderr
        assert result.json() == []
        assert why in result.stderr
    batch = cli(
        "episode",
        "search",
        "--batch",
        "-",
        input=json.dumps({"query": text}) + "\n" + json.dumps({"query": "nginx"}) + "\n",
    )
    assert batch.exit_code == 0, batch.stderr
    first, second = batch.jsonl()
    assert first["results"] == [] and first["note"] == why
    assert second["results"] and "note" not in second


def test_a_word_with_punctuation_still_searches(cli):
    episode = add(cli, "the unterminated string broke the parser")
    assert unsearchable('"unterminated') is None and unsearchable("nginx?!") is None
    found = cli("episode", "search", '"unterminated', "--mode", "text", "-f", "json")
    assert found.exit_code == 0 and [r["id"] for r in found.json()] == [episode]
    assert found.stderr == ""


PATHS = {
    "path": "/var/log/nginx grew to 40 GB",
    "url": "the health check at https://status.example.com/api/health returned 500",
    "host": "db.host now points at the new primary",
    "ip": "the primary listens on 10.8.0.4:5432",
    "other_ip": "the old primary was 10.8.0.9",
    "email": "mail from alerts@pager.example.org bounced",
    "plain": "disk usage is fine on every host",
}


@pytest.fixture
def path_episodes(cli):
    ids = {name: add(cli, text) for name, text in PATHS.items()}
    assert cli("embed").exit_code == 0
    return ids


@pytest.mark.parametrize("mode", ["text", "hybrid"])
def test_words_inside_paths_urls_and_dotted_names_are_found(cli, path_episodes, mode):
    ids = path_episodes

    def found(query):
        result = cli("episode", "search", query, "--mode", mode, "-k", "20", "-f", "json")
        assert result.exit_code == 0, result.stderr
        return {r["id"] for r in result.json() if mode == "text" or r["text_rank"] is not None}

    assert ids["path"] in found("nginx")
    assert ids["path"] in found("log/nginx") and ids["path"] in found("/var/log/nginx")
    assert ids["url"] in found("health") and ids["url"] in found("status.example.com")
    assert found("db.host") >= {ids["host"]} and ids["host"] in found("db")
    assert ids["email"] in found("pager")
    ip = found("10.8.0.4")
    assert ids["ip"] in ip and ids["other_ip"] not in ip  # the parts in a row, not any of them


@pytest.mark.parametrize("mode", ["text", "hybrid", "vector"])
def test_words_inside_paths_are_excluded_like_any_other_word(cli, path_episodes, mode):
    ids = path_episodes
    every = cli(
        "episode", "search", "disk grew host primary", "--mode", mode, "-k", "20", "-f", "json"
    ).json()
    assert ids["path"] in {r["id"] for r in every}
    for query, gone in (
        ("disk grew -nginx", "path"),
        ("primary -host", "host"),
        ("check -example", "url"),
        ("primary -10.8.0.4", "ip"),
    ):
        result = cli("episode", "search", query, "--mode", mode, "-k", "20", "-f", "json")
        assert result.exit_code == 0, result.stderr
        assert ids[gone] not in {r["id"] for r in result.json()}, (query, mode)
    kept = {
        r["id"]
        for r in cli(
            "episode", "search", "primary -10.8.0.4", "--mode", mode, "-k", "20", "-f", "json"
        ).json()
    }
    assert ids["other_ip"] in kept


def test_synonyms_widen_the_text_half_but_not_quotes_or_exclusions(cli, conn):
    failed = add(cli, "deploy of the api failed at 03:10")
    shipped = add(cli, "release 4.2 shipped on time")
    add(cli, "lunch at noon")

    def text(query):
        result = cli("episode", "search", query, "--mode", "text", "-f", "json")
        assert result.exit_code == 0, result.stderr
        return [r["id"] for r in result.json()]

    assert text("release break") == [failed, shipped]  # both groups beat one
    assert text('"release"') == [shipped]  # quoted: the word itself
    assert (
        text("crash -deploy") == []
    )  # exclusions stay literal: crash finds the failure, -deploy drops it
    assert text("crash") == [failed]
    assert "deploy" in synonyms("Release?") and synonyms("lunch") == []
    stats = bm25.term_stats(conn)
    wanted = pieces(conn, "release", stats).wanted
    assert wanted == [
        "'releas' | 'deploy' | 'rollout'"
    ]  # the forms of a word are one lexeme already
    assert stats.counted[wanted[0]] == 2  # the group's document frequency: the sum of its words'


def test_text_score_is_scaled_by_the_query_not_by_the_best_candidate(memctl_env):
    """One candidate holding one word of four is not a full text match because nothing holds more."""
    settings = config.load()
    scored = {1: {"distance": 0.5, "text_score": 1.0}, 2: {"distance": 0.45, "text_score": None}}
    relative = fusion.relevances(settings, [], [], scored, {})
    absolute = fusion.relevances(settings, [], [], scored, {}, text_ceiling=4.0)
    # relative: 0.5*0.5 + 0.5*1.0 = 0.75 against 0.275; on the query's scale 0.5*0.5 + 0.5*0.25 = 0.375
    assert relative[2] == pytest.approx(0.275 / 0.75)
    assert absolute[2] == pytest.approx(0.275 / 0.375)


def test_short_episodes_get_no_length_bonus(cli, conn):
    short = add(cli, "nginx ok")
    longer = add(
        cli, "nginx logs rotated on web2 after the disk alert, freeing four gigabytes for the queue"
    )
    add(cli, "lunch at noon")
    hits = search.search(conn.use_settings(config.load()), Query("nginx", mode="text", k=5)).hits
    by_id = {h.id: h.text_score for h in hits}
    assert by_id[short] >= by_id[longer]  # shorter than average: no bonus over an average one ...
    assert by_id[short] == pytest.approx(
        bm25.idf(3, 2)
    )  # ... the term's idf exactly, times (k1+1)/(1+k1)=1
