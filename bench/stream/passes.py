"""bench/stream: the table of a run's passes and, with the reference, the ratios.

    passes.py PASSES COUNT RSS_START_KIB REFERENCE_RSS_START_KIB

PASSES has one line per pass (bench/stream/run.sh's `measure`): name (trunk-sync or
reference), round, p50, p90, p99, max (ms), server CPU per commit (ms), RSS with the streams
open (KiB), threads, load, the client's CPU per commit (ms). Prints every pass, then per server the median of the rounds and
their spread (lowest–highest), and trunk-sync / reference per round (its median and spread):
the figures the run's own reference earns on this machine at this load.
"""
import statistics
import sys

passes = [line.split() for line in open(sys.argv[1]) if line.strip()]
count = int(sys.argv[2])
starts = {"trunk-sync": int(sys.argv[3]), "reference": int(sys.argv[4])}

print(f"{'pass':<11} {'round':>5} {'p50':>9} {'p90':>9} {'p99':>9} {'max':>9} {'CPU/commit':>11} "
      f"{'RSS open':>10} {'per stream':>10} {'threads':>7} {'load':>5} {'client CPU/commit':>17}")
for name, round_, p50, p90, p99, high, cpu, rss, threads, load, client in passes:
    # Per stream from the RSS at start: in the first round only (memory freed by a round's
    # streams is kept by the allocator and reused by the next round's).
    each = f"{(int(rss) - starts[name]) / count:>6.1f} KiB" if round_ == "1" else f"{'-':>10}"
    print(f"{name:<11} {round_:>5} {p50:>6} ms {p90:>6} ms {p99:>6} ms {high:>6} ms {cpu:>8} ms "
          f"{int(rss) / 1024:>6.1f} MiB {each} {threads:>7} {load:>5} {client:>14} ms")


def column(name, index):
    return [float(p[index]) for p in passes if p[0] == name]


FIGURES = (("p50", 2), ("p99", 4), ("max", 5), ("CPU/commit", 6), ("client CPU/commit", 10))
if column("reference", 2):
    print()
    for name in ("trunk-sync", "reference"):
        cells = []
        for label, index in FIGURES:
            values = column(name, index)
            cells.append(f"{label} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{name:<11} median (spread) of {len(column(name, 2))} rounds: " + ", ".join(cells))
    for label, index in FIGURES:
        ratios = [a / b for a, b in zip(column("trunk-sync", index), column("reference", index)) if b > 0]
        if ratios:
            print(f"trunk-sync / reference, {label:<17} {statistics.median(ratios):5.2f}x "
                  f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
