#!/usr/bin/env python3
"""CPU seconds (user + system) used so far, for per-request CPU figures in run.sh.

    cpu.py PGDATA PID   prints "<postgres> <process>": the cluster's postmaster with all
                        its children (exited children included), and process PID
"""
import os
import sys


def cpu(stat_line, children=False):
    fields = stat_line[stat_line.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime: backends that exited
    return ticks / os.sysconf("SC_CLK_TCK")


def main():
    pgdata, pid = sys.argv[1], sys.argv[2]
    with open(os.path.join(pgdata, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    postgres = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                line = f.read()
        except OSError:
            continue
        parent = int(line[line.rindex(")") + 2:].split()[1])
        if int(entry) == postmaster:
            postgres += cpu(line, children=True)
        elif parent == postmaster:
            postgres += cpu(line)
    with open(f"/proc/{pid}/stat") as f:
        process = cpu(f.read())
    print(f"{postgres:.2f} {process:.2f}")


main()
