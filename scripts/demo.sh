#!/bin/sh
# `make demo`: build a small store with rmqstore and show the main commands on it.
# Run through make (it sets RMQSTORE, PYTHON and DEMO_DIR and installs everything first).
set -eu
RMQSTORE=${RMQSTORE:-rmqstore}
PYTHON=${PYTHON:-python3}
DEMO_DIR=${DEMO_DIR:-.demo}
STORE="$DEMO_DIR/store"
rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"

step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }

step "Append one message to a new store (64 KiB commit-log files, so they roll quickly)" \
     "rmqstore append $STORE --create --commitlog-file-size 65536 --topic DemoTopic ..."
"$RMQSTORE" append "$STORE" --create --commitlog-file-size 65536 --topic DemoTopic \
    --tags TagA --keys "order-1 order-2" --body "hello RocketMQ"

step "Append 2,000 more from JSON lines on stdin, fsynced in group commits" \
     "... | rmqstore append $STORE --input - --flush sync --jsonl | tail -2"
"$PYTHON" - <<'PY' > "$DEMO_DIR/messages.jsonl"
import json
for i in range(2000):
    print(json.dumps({"topic": "DemoTopic" if i % 3 else "orders", "queueId": i % 4,
                      "tags": ["TagA", "TagB", "标签"][i % 3], "keys": f"order-{i}",
                      "body": f"message {i} " + "x" * (i % 200)}))
PY
"$RMQSTORE" append "$STORE" --input - --flush sync --jsonl < "$DEMO_DIR/messages.jsonl" | tail -2

step "Summarise the store" "rmqstore info $STORE"
"$RMQSTORE" info "$STORE"

step "Read one message by physical offset" "rmqstore read $STORE --offset 0"
"$RMQSTORE" read "$STORE" --offset 0

step "Read sequentially, as JSON lines" \
     "rmqstore read $STORE --from-offset 0 --count 3 --jsonl --body none"
"$RMQSTORE" read "$STORE" --from-offset 0 --count 3 --jsonl --body none

step "Build consume queues and the index, as a broker's dispatcher would" "rmqstore dispatch $STORE"
"$RMQSTORE" dispatch "$STORE"

step "Query like mqadmin, with no broker: by key (every topic), and a queue by offset" \
     "rmqstore read $STORE --key order-42 --body text"
"$RMQSTORE" read "$STORE" --key order-42 --body text
"$RMQSTORE" read "$STORE" --topic orders --queue 1 --from 3 --count 2 --jsonl --body none

step "Verify CRCs and cross-file consistency (exit 0: sound)" "rmqstore verify $STORE"
"$RMQSTORE" verify "$STORE" --no-progress

step "A damaged fixture: a torn tail after a crash is found (exit 1)" \
     "rmqstore fixtures generate torn-tail $DEMO_DIR/torn && rmqstore verify $DEMO_DIR/torn"
"$RMQSTORE" fixtures generate torn-tail "$DEMO_DIR/torn"
if "$RMQSTORE" verify "$DEMO_DIR/torn" --no-progress --max-findings 3; then
    echo "unexpected: no findings" >&2
    exit 1
else
    echo "exit code $?"
fi

step "Recover it as a broker's start-up would: the plan, then cut to quarantine and re-dispatch" \
     "rmqstore recover $DEMO_DIR/torn --dry-run; rmqstore recover $DEMO_DIR/torn --yes"
"$RMQSTORE" recover "$DEMO_DIR/torn" --dry-run --no-progress || echo "exit code $? (work to do)"
"$RMQSTORE" recover "$DEMO_DIR/torn" --yes --no-progress
"$RMQSTORE" verify "$DEMO_DIR/torn" --no-progress

step "Export every message to Parquet with Spark (local[*]; starting the JVM takes a few seconds)" \
     "rmqstore export $STORE --to $DEMO_DIR/export --engine spark"
"$RMQSTORE" export "$STORE" --to "$DEMO_DIR/export" --engine spark

step "Statistics per topic/queue and per commit-log file (a small store: the local engine)" \
     "rmqstore stats $STORE"
"$RMQSTORE" stats "$STORE"

step "Bad input gets one line and an exit code (2 = input error)" \
     "rmqstore append $STORE --topic ../etc --body x"
if "$RMQSTORE" append "$STORE" --topic ../etc --body x; then
    echo "unexpected success" >&2
    exit 1
else
    echo "exit code $?"
fi
printf '\nDemo store left in %s (export in %s)\n' "$STORE" "$DEMO_DIR/export"
