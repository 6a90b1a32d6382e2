#!/usr/bin/env python3
"""bench/auth's summary: per stage, each side's rate per round (median first), the latency
stage's rate, p50 and p99, CPU per request, and the ratio tree/reference per round.

    summary.py RESULTS REFERENCE ROUNDS SIDE...

RESULTS has one line per (side, round, stage): "SIDE ROUND STAGE key value key value …" as
run.sh records them (requests, errors, seconds, rate, p50, p90, p99, max, pg_us, server_us,
sink_busy, mail_lag).
"""
import statistics
import sys

path, reference, rounds, sides = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
raw = {}
with open(path) as file:
    for line in file:
        words = line.split()
        if len(words) >= 3:
            raw[(words[0], int(words[1]), words[2])] = {
                words[i]: float(words[i + 1]) for i in range(3, len(words) - 1, 2)}


def get(side, r, stage):
    return raw.get((side, r, stage), {})


def joined(values, form):
    return "/".join(format(v, form) for v in values)


for stage in ("otp", "verify", "refresh"):
    print(f"\n{stage}  (per round: " + ", ".join(f"round {r}" for r in range(1, rounds + 1)) + ")")
    for side in sides:
        top = [get(side, r, stage) for r in range(1, rounds + 1)]
        low = [get(side, r, stage + "-low") for r in range(1, rounds + 1)]
        rates = [t.get("rate", 0) for t in top]
        text = (f"  {side:9} {statistics.median(rates):7.0f} req/s ({joined(rates, '.0f')});"
                f" at {joined([l.get('rate', 0) for l in low], '.0f')} req/s:"
                f" p50 {joined([l.get('p50', 0) for l in low], '.1f')} ms,"
                f" p99 {joined([l.get('p99', 0) for l in low], '.1f')} ms;"
                f" CPU per request: postgres {joined([t.get('pg_us', 0) for t in top], '.0f')} us")
        if side != "pgbench":
            text += f", server {joined([t.get('server_us', 0) for t in top], '.0f')} us"
            text += f"; sink busy {joined([t.get('sink_busy', 0) for t in top], '.0f')} %"
            if stage == "otp":
                text += f", mails all in {joined([t.get('mail_lag', 0) for t in top], '.1f')} s after the stage"
        print(text)
    ratios = [get("tree", r, stage).get("rate", 0) / max(1e-9, get(reference, r, stage).get("rate", 0))
              for r in range(1, rounds + 1)]
    print(f"  ratio tree/{reference}: median {statistics.median(ratios):.2f}"
          f" (rounds {' '.join(f'{x:.2f}' for x in ratios)}; spread {min(ratios):.2f}-{max(ratios):.2f})")
