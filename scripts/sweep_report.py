#!/usr/bin/env python3
"""compare.sh --sweep's report: adds each run's kvroute-bench "sweep" list to compare.sh's JSON,
prints the SLO table (each policy's maximum rate meeting the SLO for 90 % of requests, and its
TTFT p90 at 70 % of round_robin's and at the load where round_robin's TTFT p90 passes the SLO,
with ratios against round_robin) and draws TTFT p90 and goodput against offered load with gnuplot.

usage: sweep_report.py WORK JSON_OUT PNG_OUT|"" BOUND(0|1) TITLE POLICY...
"""
import json
import math
import os
import shutil
import subprocess
import sys

GOAL = 0.9  # the share of requests that must meet the SLO


def points(sweep, key):
    """(rate, value) pairs of a sweep sorted by rate, skipping undefined values."""
    out = []
    for p in sweep or []:
        v = key(p)
        if v is not None and p.get("offered_rate") is not None:
            out.append((p["offered_rate"], v))
    return sorted(out)


def crossing(pts, limit, above):
    """The first rate where the value passes `limit` (goes above it when `above`, else below),
    linearly interpolated from the point before; (rate, flag): flag "<" when the lowest rate
    already passes it, ">=" when no rate does (rate = the highest), "" otherwise."""
    if not pts:
        return None, ""
    passed = (lambda v: v > limit) if above else (lambda v: v < limit)
    if passed(pts[0][1]):
        return pts[0][0], "<"
    for (r0, v0), (r1, v1) in zip(pts, pts[1:]):
        if passed(v1):
            return r0 + (r1 - r0) * (limit - v0) / (v1 - v0), ""
    return pts[-1][0], ">="


def at(pts, rate):
    """The value at `rate`, linearly interpolated; None outside the swept range."""
    if rate is None or not pts or rate < pts[0][0] or rate > pts[-1][0]:
        return None
    for (r0, v0), (r1, v1) in zip(pts, pts[1:]):
        if r0 <= rate <= r1:
            return v0 if r1 == r0 else v0 + (v1 - v0) * (rate - r0) / (r1 - r0)
    return pts[0][1]


def ttft90(p):
    return (p.get("ttft_s") or {}).get("p90")


def fmt(x, digits=3, flag=""):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return ("%s%.*f" % ({"<": "<", ">=": ">="}.get(flag, ""), digits, x))


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    work, out, png, bound, title = sys.argv[1:6]
    policies = sys.argv[6:]
    with open(out) as f:
        result = json.load(f)
    runs = ([("pooled bound", "bound")] if bound == "1" else []) + [(p, p) for p in policies]
    sweeps, slo_ttft = {}, None
    for label, name in runs:
        with open(os.path.join(work, name + ".json")) as f:
            b = json.load(f)
        sweeps[label] = b.get("sweep") or []
        slo_ttft = (b.get("slo") or {}).get("ttft_s", slo_ttft)
        target = result["bound"] if name == "bound" else result["policies"][name]
        target["sweep"] = sweeps[label]
        if b.get("sweep_auto"):
            target["sweep_auto"] = b["sweep_auto"]
    rr = sweeps.get("round_robin")
    rr_max, _ = crossing(points(rr, lambda p: p.get("goodput")), GOAL, above=False) if rr else (None, "")
    rr_ttft_load, _ = crossing(points(rr, ttft90), slo_ttft, above=True) if rr and slo_ttft else (None, "")
    at70 = 0.7 * rr_max if rr_max is not None else None
    summary = {"goal": GOAL, "slo_ttft_s": slo_ttft, "round_robin_max_rate": rr_max,
               "round_robin_ttft_slo_rate": rr_ttft_load, "rate_at_70pct_round_robin": at70,
               "policies": {}}
    rows = []
    for label, _ in runs:
        sw = sweeps[label]
        mx, flag = crossing(points(sw, lambda p: p.get("goodput")), GOAL, above=False)
        if flag == "<":
            mx = None
        t70 = at(points(sw, ttft90), at70)
        tl = at(points(sw, ttft90), rr_ttft_load)
        row = {"max_rate_at_slo": mx, "max_rate_flag": flag, "ttft_p90_at_70pct_rr_s": t70,
               "ttft_p90_at_rr_ttft_slo_load_s": tl}
        summary["policies"][label] = row
        rows.append((label, row))
    rrrow = summary["policies"].get("round_robin", {})
    for label, row in rows:
        row["max_rate_vs_round_robin"] = ratio(row["max_rate_at_slo"], rrrow.get("max_rate_at_slo"))
        row["ttft_at_70pct_vs_round_robin"] = ratio(row["ttft_p90_at_70pct_rr_s"], rrrow.get("ttft_p90_at_70pct_rr_s"))
        row["ttft_at_rr_slo_load_vs_round_robin"] = ratio(row["ttft_p90_at_rr_ttft_slo_load_s"],
                                                          rrrow.get("ttft_p90_at_rr_ttft_slo_load_s"))
    result["sweep_summary"] = summary
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    print()
    print("latency under load: %s (model seconds; SLO TTFT <= %s s and ITL, for %d %% of requests)"
          % (title, fmt(slo_ttft, 1), GOAL * 100))
    key = lambda r: float("%.4g" % r)  # the bound's rates reach the policies printed to 6 digits
    rates = sorted({key(p["offered_rate"]) for sw in sweeps.values() for p in sw})
    print("%-16s %s" % ("TTFT p90 s", " ".join("%8.3g" % r for r in rates)) + "   (sessions/s)")
    for label, _ in runs:
        by = {key(p["offered_rate"]): p for p in sweeps[label]}
        print("%-16s %s" % (label, " ".join("%8s" % fmt(ttft90(by[r]) if r in by else None)
                                             for r in rates)))
    print("%-16s %s" % ("goodput", " ".join("%8.3g" % r for r in rates)))
    for label, _ in runs:
        by = {key(p["offered_rate"]): p for p in sweeps[label]}
        print("%-16s %s" % (label, " ".join(
            "%8s" % (fmt(100 * by[r]["goodput"], 1) + "%" if r in by and by[r].get("goodput") is not None else "-")
            for r in rates)))
    print()
    print("%-16s %14s %7s %16s %7s %16s %7s" % ("policy", "max rate @SLO", "vs RR", "TTFT p90 @70%RR",
                                               "vs RR", "TTFT p90 @RR-SLO", "vs RR"))
    for label, row in rows:
        print("%-16s %14s %7s %16s %7s %16s %7s" % (
            label, fmt(row["max_rate_at_slo"], 3, row["max_rate_flag"]),
            fmt(row["max_rate_vs_round_robin"], 2), fmt(row["ttft_p90_at_70pct_rr_s"]),
            fmt(row["ttft_at_70pct_vs_round_robin"], 2), fmt(row["ttft_p90_at_rr_ttft_slo_load_s"]),
            fmt(row["ttft_at_rr_slo_load_vs_round_robin"], 2)))
    print("(max rate @SLO: sessions per model second where goodput falls below %d %%, interpolated;"
          " >= when it never did; @70%%RR: at 0.7 x round_robin's max rate = %s; @RR-SLO: at the"
          " rate where round_robin's TTFT p90 passes the SLO = %s)"
          % (GOAL * 100, fmt(at70), fmt(rr_ttft_load)))

    if not png:
        return
    if not shutil.which("gnuplot"):
        print("compare.sh: gnuplot not installed; no sweep PNGs", file=sys.stderr)
        return
    base = png[:-4] if png.endswith(".png") else png
    plots = []
    for i, (label, _) in enumerate(runs):
        dat = os.path.join(work, "sweep-%d.dat" % i)
        with open(dat, "w") as f:
            for p in sorted(sweeps[label], key=lambda p: p["offered_rate"]):
                t, g = ttft90(p), p.get("goodput")
                f.write("%s %s %s\n" % (p["offered_rate"], "NaN" if t is None else t,
                                        "NaN" if g is None else 100 * g))
        plots.append((dat, label))
    for kind, col, ylabel, extra in (
            ("ttft", 2, "TTFT p90 (model s)", "set logscale y\n"),
            ("goodput", 3, "goodput (% of requests within the SLO)", "set yrange [0:105]\n")):
        script = ('set terminal pngcairo size 900,520 font "sans,10"\nset output "%s-%s.png"\n'
                  'set title "%s: %s against offered load" noenhanced\nset xlabel "offered load (sessions per'
                  ' model second)"\nset ylabel "%s"\nset grid\nset key top left\n%s'
                  % (base, kind, title.replace('"', "'"), ylabel, ylabel, extra))
        if kind == "ttft" and slo_ttft:
            script += "set arrow from graph 0, first %s to graph 1, first %s nohead dt 2\n" % (slo_ttft, slo_ttft)
        if kind == "goodput":
            script += "set arrow from graph 0, first 90 to graph 1, first 90 nohead dt 2\n"
        script += "plot " + ", ".join('"%s" using 1:%d with linespoints lw 2 title "%s" noenhanced' % (d, col, l)
                                      for d, l in plots) + "\n"
        subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=60)
        print("compare.sh: wrote %s-%s.png" % (base, kind), file=sys.stderr)


if __name__ == "__main__":
    main()
